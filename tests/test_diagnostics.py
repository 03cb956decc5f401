"""Kernel Stein discrepancy (:mod:`ppl_sgmcmc.diagnostics`).

The reference Stein kernel is built from its definition, not from the closed form the module uses:
``k0(x, y) = Σ_k a_k² (∂x_k + s_k(x)) (∂y_k + s_k(y)) k̃(x, y)`` with the derivatives of the kernel
``k̃(x, y) = (c² + |(x - y)/sqrt(Γ)|²)^β`` taken by JAX autodiff in float64 (``a = sqrt(Γ)``;
``Γ = 1`` is the plain IMQ Langevin Stein kernel), summed in a double loop over the draws. Statistical
checks use fixed seeds and tolerances of ``K_SIGMA`` Monte Carlo standard errors (``tests/helpers.py``).
"""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from ppl_sgmcmc.diagnostics import LinearKSD, flatten_draws, imq_ksd, imq_ksd_linear
from tests.helpers import K_SIGMA


# --- the reference: k0 from its definition, by autodiff, in float64 -----------------------------
def _reference_k0(c, beta, gamma):
    """A jitted float64 ``k0(x, y, s(x), s(y))`` for one pair, from derivatives of the kernel."""

    def kernel(x, y):
        r = (x - y) / jnp.sqrt(gamma)
        return (c**2 + jnp.sum(r * r)) ** beta

    grad_x = jax.grad(kernel, argnums=0)
    grad_y = jax.grad(kernel, argnums=1)
    hess_xy = jax.jacfwd(grad_x, argnums=1)  # [k, l] = ∂²k / ∂x_k ∂y_l

    def k0(x, y, sx, sy):
        terms = jnp.diag(hess_xy(x, y)) + grad_x(x, y) * sy + grad_y(x, y) * sx + kernel(x, y) * sx * sy
        return jnp.sum(gamma * terms)

    return jax.jit(k0)


def reference_k0_matrix(x, s, c=1.0, beta=-0.5, gamma=None):
    """The ``(m, m)`` matrix ``k0(x_i, x_j)``, by a double loop over the draws."""
    x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
    m, d = x.shape
    with jax.enable_x64(True):
        g = jnp.ones(d) if gamma is None else jnp.asarray(gamma, jnp.float64)
        k0 = _reference_k0(c, beta, g)
        xs, ss = jnp.asarray(x), jnp.asarray(s)
        return np.array([[float(k0(xs[i], xs[j], ss[i], ss[j])) for j in range(m)] for i in range(m)])


def small_case(seed=0, m=7, d=3):
    """Draws spread around a non-zero centre with unrelated scores: no term of k0 is negligible."""
    rng = np.random.default_rng(seed)
    x = 2.0 + rng.normal(size=(m, d))
    s = rng.normal(size=(m, d)) - 0.5 * x
    return x, s


# --- (1) the closed form against the definition ----------------------------------------------------
@pytest.mark.parametrize(("c", "beta"), [(1.0, -0.5), (0.7, -0.8), (2.0, -0.2)])
def test_ksd2_matches_brute_force(c, beta):
    x, s = small_case()
    want = reference_k0_matrix(x, s, c, beta).mean()
    assert imq_ksd(x, s, c=c, beta=beta, squared=True) == pytest.approx(want, rel=1e-5)  # float32
    assert imq_ksd(x, s, c=c, beta=beta) == pytest.approx(np.sqrt(want), rel=1e-5)
    with jax.enable_x64(True):
        assert imq_ksd(x, s, c=c, beta=beta, squared=True) == pytest.approx(want, rel=1e-12)


def test_preconditioned_ksd_matches_its_definition():
    """``preconditioner=Γ``: kernel ``k(x/√Γ, y/√Γ)`` with the Stein operator ``g ↦ ∇·(√Γ g) + (√Γ g)ᵀs``."""
    x, s = small_case(seed=1)
    gamma = np.array([0.3, 1.0, 4.0])
    want = reference_k0_matrix(x, s, gamma=gamma).mean()
    assert imq_ksd(x, s, preconditioner=gamma, squared=True) == pytest.approx(want, rel=1e-5)
    with jax.enable_x64(True):
        assert imq_ksd(x, s, preconditioner=gamma, squared=True) == pytest.approx(want, rel=1e-12)
    # Γ = 1 is no preconditioning; Γ is scale-aware: rescaling the coordinates (and Γ with them) is a no-op
    assert imq_ksd(x, s, preconditioner=np.ones(3)) == pytest.approx(imq_ksd(x, s), rel=1e-6)
    scale = np.array([10.0, 0.1, 3.0])
    rescaled = imq_ksd(x * scale, s / scale, preconditioner=gamma * scale**2)
    assert rescaled == pytest.approx(imq_ksd(x, s, preconditioner=gamma), rel=1e-5)


def test_ksd_is_translation_invariant_far_from_the_origin():
    """k0 depends on the draws only through x - y: draws far from the origin lose no precision."""
    x, s = small_case(seed=2)
    far = (x + 1e4).astype(np.float32)  # what float32 can hold: the reference uses the same draws
    want = reference_k0_matrix(far.astype(np.float64) - 1e4, s).mean()
    assert imq_ksd(far, s, squared=True) == pytest.approx(want, rel=1e-5)


# --- (2) blocks ------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [1, 2, 3, 6, 7, 100])
def test_chunked_equals_unchunked(chunk_size):
    x, s = small_case()
    whole = imq_ksd(x, s, squared=True, chunk_size=7)
    assert imq_ksd(x, s, squared=True, chunk_size=chunk_size) == pytest.approx(whole, rel=1e-6)
    assert imq_ksd(x, s, squared=True) == pytest.approx(whole, rel=1e-6)  # chunk_size=None


# --- (3) it tells good draws from bad ones ---------------------------------------------------------
def test_ksd_separates_exact_from_shifted_and_scaled_draws():
    """Standard normal target in d = 2, 2000 draws: exact < shifted by 0.5, exact < scaled by 2, and
    the gaps dwarf each KSD's spread over 5 independent samples (so no seed passes by luck)."""
    results = {"exact": [], "shifted": [], "scaled": []}
    for seed in range(5):
        z = np.random.default_rng(seed).normal(size=(2000, 2))
        for name, x in (("exact", z), ("shifted", z + 0.5), ("scaled", 2.0 * z)):
            results[name].append(imq_ksd(x, -x))  # the score of N(0, I) at the draws
    ksd = {name: np.array(v) for name, v in results.items()}
    for bad in ("shifted", "scaled"):
        assert np.all(ksd["exact"] < ksd[bad])
        gap = ksd[bad].mean() - ksd["exact"].mean()
        spread = max(ksd["exact"].std(ddof=1), ksd[bad].std(ddof=1))
        assert gap > 10 * spread, (bad, gap, spread)
        assert ksd["exact"].max() < ksd[bad].min()
    # exact draws: the V-statistic's KSD² is O(1/m); its mean is E k0(x, x) / m = (E|x|² + d) / m = 4 / m
    assert np.all(ksd["exact"] ** 2 < 4 * 4 / 2000), ksd["exact"] ** 2


# --- (4) the linear-time estimate ------------------------------------------------------------------
def test_linear_estimate_consecutive_pairs():
    x, s = small_case()  # m = 7: the last draw is left out
    k0 = reference_k0_matrix(x, s)
    h = np.array([k0[0, 1], k0[2, 3], k0[4, 5]])
    est = imq_ksd_linear(x, s)
    assert isinstance(est, LinearKSD) and est.n_pairs == 3
    assert est.ksd2 == pytest.approx(h.mean(), rel=1e-5)
    assert est.stderr == pytest.approx(h.std(ddof=1) / np.sqrt(3), rel=1e-4)
    single = imq_ksd_linear(x[:3], s[:3])
    assert single.n_pairs == 1 and single.ksd2 == pytest.approx(k0[0, 1], rel=1e-5) and np.isnan(single.stderr)


def test_linear_estimate_is_unbiased_for_the_u_statistic():
    """Over random pairings of a fixed sample, E[KSD²_lin] = (1/(m(m-1))) Σ_{i≠j} k0(x_i, x_j):
    every ordered pair i ≠ j is equally likely to be paired. Checked within K_SIGMA standard errors
    of the mean of 200 independent pairings; with its own seed the pairing is reproducible."""
    rng = np.random.default_rng(3)
    m = 41  # odd: one draw sits out each pairing
    x = 0.3 + 1.5 * rng.normal(size=(m, 2))  # off-target draws of N(0, I): KSD² well away from 0
    s = -x
    k0 = reference_k0_matrix(x, s)
    u_stat = (k0.sum() - np.trace(k0)) / (m * (m - 1))
    reps = np.array([imq_ksd_linear(x, s, key=seed).ksd2 for seed in range(200)])
    se = reps.std(ddof=1) / np.sqrt(len(reps))
    assert abs(reps.mean() - u_stat) < K_SIGMA * se, (reps.mean(), u_stat, se)
    assert np.ptp(reps) > 0  # the pairings differ
    assert imq_ksd_linear(x, s, key=7) == imq_ksd_linear(x, s, key=jax.random.key(7))
    # the U- and V-statistics differ by the diagonal only
    assert imq_ksd(x, s, squared=True) == pytest.approx((u_stat * m * (m - 1) + np.trace(k0)) / m**2, rel=1e-5)


def test_linear_estimate_separates_good_from_bad_draws():
    z = np.random.default_rng(4).normal(size=(20_000, 2))
    good = imq_ksd_linear(z, -z, key=0)
    bad = imq_ksd_linear(z + 0.5, -(z + 0.5), key=0)
    assert abs(good.ksd2) < K_SIGMA * good.stderr
    assert bad.ksd2 - good.ksd2 > 10 * np.hypot(good.stderr, bad.stderr)


# --- (5) bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [imq_ksd, imq_ksd_linear])
def test_bad_input_names_the_argument(fn):
    x, s = small_case()
    with pytest.raises(ValueError, match="`scores` must have the shape"):
        fn(x, s[:, :2])
    with pytest.raises(ValueError, match="`scores` must have the shape"):
        fn(x, s[:6])
    with pytest.raises(ValueError, match="`samples` must be a 2-D array"):
        fn(x[:, 0], s[:, 0])
    for bad in (np.nan, np.inf, -np.inf):
        s_bad = s.copy()
        s_bad[3, 1] = bad
        with pytest.raises(ValueError, match="`scores` has non-finite"):
            fn(x, s_bad)
    x_bad = x.copy()
    x_bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="`samples` has non-finite"):
        fn(x_bad, s)
    with pytest.raises(ValueError, match="`samples` must hold at least 2 draws"):
        fn(x[:1], s[:1])
    with pytest.raises(ValueError, match="`preconditioner` must be a vector of shape"):
        fn(x, s, preconditioner=np.ones(2))
    with pytest.raises(ValueError, match="`preconditioner` must have finite, strictly positive"):
        fn(x, s, preconditioner=np.array([1.0, 0.0, 1.0]))
    for c in (0.0, -1.0, np.inf, True):
        with pytest.raises(ValueError, match="`c` must be"):
            fn(x, s, c=c)
    for beta in (0.0, -1.0, 0.5, -1.5):
        with pytest.raises(ValueError, match="`beta` must lie"):
            fn(x, s, beta=beta)


def test_bad_chunk_size():
    x, s = small_case()
    for chunk_size in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="`chunk_size`"):
            imq_ksd(x, s, chunk_size=chunk_size)


# --- flatten_draws ---------------------------------------------------------------------------------
def test_flatten_draws_matches_ravel_pytree_per_draw():
    rng = np.random.default_rng(5)
    chains, draws = 3, 4
    samples = {
        "sigma": rng.normal(size=(chains, draws)),  # a scalar site
        "beta": rng.normal(size=(chains, draws, 2, 3)),
        "alpha": rng.normal(size=(chains, draws, 1)).astype(np.float32),
    }
    flat = flatten_draws(samples)
    assert flat.shape == (chains * draws, 1 + 6 + 1)
    unravel = ravel_pytree({k: v[0, 0] for k, v in samples.items()})[1]
    for c in range(chains):
        for t in range(draws):
            draw = {k: v[c, t] for k, v in samples.items()}
            row, _ = ravel_pytree(draw)
            np.testing.assert_allclose(flat[c * draws + t], row, rtol=1e-6)
            back = unravel(flat[c * draws + t])
            for k in samples:
                np.testing.assert_allclose(back[k], draw[k], rtol=1e-6)
    # (draws, ...) as mcmc.get_samples() returns them, and an ArviZ posterior
    pooled = {k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in samples.items()}
    np.testing.assert_array_equal(flatten_draws(pooled, batch_ndim=1), flat)
    posterior = az.from_dict(posterior=samples).posterior
    np.testing.assert_allclose(flatten_draws(dict(posterior.data_vars)), flat, rtol=1e-6)


def test_flatten_draws_bad_input():
    with pytest.raises(ValueError, match="`draws` is empty"):
        flatten_draws({})
    with pytest.raises(ValueError, match="share their leading 2 sample axes"):
        flatten_draws({"a": np.zeros((2, 5)), "b": np.zeros((2, 4, 3))})
    with pytest.raises(ValueError, match="fewer than the 2 leading"):
        flatten_draws({"a": np.zeros(5)})
    with pytest.raises(ValueError, match="`batch_ndim`"):
        flatten_draws({"a": np.zeros((2, 5))}, batch_ndim=0)
