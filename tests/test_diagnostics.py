"""Kernel Stein discrepancy and the run-level checks (:mod:`ppl_sgmcmc.diagnostics`), on NumPyro runs (the
Pyro backend's runs: ``tests/pyro/test_scores.py``).

The minibatch-energy noise of CSGLD (:func:`~ppl_sgmcmc.diagnostics.energy_noise`) is checked against
``σ² = (N²/n) Var_i[log p(y_i | θ)]`` computed by hand in float64 at the same draws, and that formula against
the standard deviation of simulated minibatch energies.

The reference Stein kernel is built from its definition, not from the closed form the module uses:
``k0(x, y) = Σ_k a_k² (∂x_k + s_k(x)) (∂y_k + s_k(y)) k̃(x, y)`` with the derivatives of the kernel
``k̃(x, y) = (c² + |(x - y)/sqrt(Γ)|²)^β`` taken by JAX autodiff in float64 (``a = sqrt(Γ)``;
``Γ = 1`` is the plain IMQ Langevin Stein kernel), evaluated at every pair of draws. Statistical
checks use fixed seeds and tolerances of ``K_SIGMA`` Monte Carlo standard errors (``tests/helpers.py``).
"""

import functools
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.stats
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC, NUTS

from ppl_sgmcmc._run_view import Pointwise, site_plates
from ppl_sgmcmc.diagnostics import (
    NOISE_TEMPERATURE_RATIO,
    EnergyNoiseResult,
    KSDResult,
    LinearKSD,
    StepHalvingResult,
    _HalvedSchedule,
    _noise_report,
    _noise_sd,
    energy_noise,
    flatten_draws,
    imq_ksd,
    imq_ksd_linear,
    ksd,
    step_halving_check,
)
from ppl_sgmcmc.numpyro import CSGLD, SGFS, SGLD
from tests.helpers import K_SIGMA, conjugate_posterior, linear_regression_data


# --- the reference: k0 from its definition, by autodiff, in float64 -----------------------------
@functools.cache
def _reference_k0(c, beta):
    """A jitted float64 ``k0(x_i, x_j)`` of every pair of draws, ``(x, s, Γ) -> (m, m)``, from derivatives of the
    kernel: the one-pair ``k0(x, y, s(x), s(y))`` mapped over both draws (``vmap``), one program per ``(c, β)``
    (a Python double loop of jitted one-pair calls took 1.4 s for the 41 draws of the linear-estimate test)."""

    def kernel(x, y, gamma):
        r = (x - y) / jnp.sqrt(gamma)
        return (c**2 + jnp.sum(r * r)) ** beta

    grad_x = jax.grad(kernel, argnums=0)
    grad_y = jax.grad(kernel, argnums=1)
    hess_xy = jax.jacfwd(grad_x, argnums=1)  # [k, l] = ∂²k / ∂x_k ∂y_l

    def k0(x, y, sx, sy, gamma):
        terms = jnp.diag(hess_xy(x, y, gamma)) + grad_x(x, y, gamma) * sy + grad_y(x, y, gamma) * sx
        terms = terms + kernel(x, y, gamma) * sx * sy
        return jnp.sum(gamma * terms)

    row = jax.vmap(k0, in_axes=(None, 0, None, 0, None))  # k0(x_i, x_j) for every j
    return jax.jit(lambda x, s, gamma: jax.vmap(row, in_axes=(0, None, 0, None, None))(x, x, s, s, gamma))


def reference_k0_matrix(x, s, c=1.0, beta=-0.5, gamma=None):
    """The ``(m, m)`` matrix ``k0(x_i, x_j)``, pair by pair."""
    x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
    m, d = x.shape
    with jax.enable_x64(True):
        g = jnp.ones(d) if gamma is None else jnp.asarray(gamma, jnp.float64)
        return np.asarray(_reference_k0(float(c), float(beta))(jnp.asarray(x), jnp.asarray(s), g), np.float64)


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


def test_dense_preconditioner_is_the_whitened_ksd():
    """A ``(d, d)`` ``Γ = L Lᵀ``: the KSD of ``L⁻¹ x`` with scores ``Lᵀ s``, whatever factor of ``Γ``; a
    diagonal matrix is its vector."""
    x, s = small_case(seed=6)
    A = np.array([[2.0, 0.0, 0.0], [0.7, 0.5, 0.0], [-0.3, 0.2, 1.5]])
    gamma = A @ A.T
    want = imq_ksd(np.linalg.solve(A, x.T).T, s @ A, squared=True)  # A is not gamma's Cholesky factor: a rotation
    assert imq_ksd(x, s, preconditioner=gamma, squared=True) == pytest.approx(want, rel=1e-4)
    assert imq_ksd_linear(x, s, preconditioner=gamma).ksd2 == pytest.approx(
        imq_ksd_linear(np.linalg.solve(A, x.T).T, s @ A).ksd2, rel=1e-4
    )
    variances = np.array([0.3, 1.0, 4.0])
    assert imq_ksd(x, s, preconditioner=np.diag(variances)) == pytest.approx(
        imq_ksd(x, s, preconditioner=variances), rel=1e-6
    )
    for bad in (np.array([[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), -np.eye(3), np.full((3, 3), np.nan)):
        with pytest.raises(ValueError, match="symmetric, positive definite"):
            imq_ksd(x, s, preconditioner=bad)
    with pytest.raises(ValueError, match=r"or a \(3, 3\) matrix"):
        imq_ksd(x, s, preconditioner=np.eye(2))


# --- (6) ksd of a run ------------------------------------------------------------------------------
def regression_model(X, y):
    """The conjugate linear regression of ``tests/helpers.py``: ``w ~ N(0, I)``, ``y ~ N(X w, 1)``."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=20):
        X_batch = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(X_batch @ w, 1.0), obs=numpyro.subsample(y, event_dim=0))


def regression_run(step_size, seed, X, y, start):
    """Two chains of 500 draws, 5 steps apart, from the posterior mean: no warm-up (a start in the posterior's bulk
    needs no burn-in; a warm-up phase would compile a second loop for each run)."""
    mcmc = MCMC(
        SGLD(regression_model, step_size=step_size, steps_per_sample=5),
        num_warmup=0, num_samples=500, num_chains=2, chain_method="vectorized", progress_bar=False,
    )  # fmt: skip
    mcmc.run(jax.random.PRNGKey(seed), X, y, init_params={"w": jnp.tile(jnp.asarray(start, jnp.float32), (2, 1))})
    return mcmc


def test_ksd_ranks_a_ten_times_too_large_step_size_and_a_shifted_sample_worse():
    """Conjugate regression (N = 100, n = 20): SGLD with ``h λ_max = 0.1`` against ``10 h`` (whose draws are
    about twice too wide), in the coordinates of the exact posterior variances; and the good run's draws
    shifted by one posterior sd, which the linear-time estimate sees by many standard errors."""
    X, y, _ = linear_regression_data(100, 2, 1.0, seed=0)
    mean, cov = conjugate_posterior(X, y, 1.0, 1.0)
    h = 0.1 / np.linalg.eigvalsh(np.linalg.inv(cov)).max()
    good, bad = regression_run(h, 0, X, y, mean), regression_run(10 * h, 1, X, y, mean)
    gamma = np.diag(cov)
    result, too_large = ksd(good, preconditioner=gamma), ksd(bad, preconditioner=gamma)
    print(f"KSD: h {result.ksd:.3f}, 10 h {too_large.ksd:.3f}")
    assert isinstance(result, KSDResult) and result.num_draws == 1000 and np.isnan(result.stderr)
    assert result.ksd == pytest.approx(np.sqrt(result.ksd2))
    np.testing.assert_array_equal(result.preconditioner, gamma)
    assert 3 * result.ksd < too_large.ksd
    shifted = {"w": good.get_samples(group_by_chain=True)["w"] + np.sqrt(gamma)}
    linear = ksd(good, preconditioner=gamma, linear=True, seed=1)
    moved = ksd(good, preconditioner=gamma, linear=True, seed=1, samples=shifted)
    print(f"linear KSD²: {linear.ksd2:.3f} ± {linear.stderr:.3f}, shifted {moved.ksd2:.3f} ± {moved.stderr:.3f}")
    assert linear.num_draws == 1000 and linear.stderr > 0
    assert moved.ksd2 - linear.ksd2 > K_SIGMA * np.hypot(linear.stderr, moved.stderr)


def gaussian_potential(z):
    """``U(x) = xᵀ P x / 2`` with ``P = [[1, 0.5], [0.5, 2]]``: the score is ``-P x``."""
    return 0.5 * z["x"] @ PRECISION @ z["x"]


PRECISION = jnp.array([[1.0, 0.5], [0.5, 2.0]])


# the tests of the shared runs `tuned_run` and `two_mode_run`: on one pytest-xdist worker (`--dist loadgroup`), which
# runs each once
on_shared_runs = pytest.mark.xdist_group("diagnostics_shared_runs")


@pytest.fixture(scope="module")
def tuned_run():
    """SGLD with the warm-up's step size and a dense adapted preconditioner, two chains; also the finished run of an
    SGLD kernel on which the bad-input tests check the arguments (a run of its own would compile two more loops)."""
    kernel = SGLD(potential_fn=gaussian_potential, find_mode=False, dense_mass=True, steps_per_sample=2)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=300, num_chains=2, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(3), init_params={"x": jnp.zeros((2, 2))})
    return mcmc


@on_shared_runs
def test_ksd_of_a_run_is_imq_ksd_of_its_thinned_draws_in_the_adapted_coordinates(tuned_run):
    """Evenly spaced draws of the pooled chains, the exact scores ``-P x``, and ``Γ`` the chains' ``L Lᵀ``
    averaged."""
    scale = np.asarray(tuned_run.last_state.adapt_state.preconditioner.scale, np.float64)
    assert scale.shape == (2, 2, 2)
    gamma = np.mean(scale @ np.swapaxes(scale, 1, 2), axis=0)
    draws = np.asarray(tuned_run.get_samples(group_by_chain=True)["x"]).reshape(600, 2)
    rows = draws[np.arange(250) * 600 // 250]
    result = ksd(tuned_run, num_draws=250)
    np.testing.assert_allclose(result.preconditioner, gamma, rtol=1e-12)
    assert result.num_draws == 250
    want = imq_ksd(rows, -rows @ np.asarray(PRECISION), preconditioner=gamma)
    assert result.ksd == pytest.approx(want, rel=1e-4)
    assert ksd(tuned_run, num_draws=5000).num_draws == 600  # never more than the run's draws
    unpreconditioned = ksd(tuned_run, num_draws=250, preconditioner=None)
    assert unpreconditioned.preconditioner is None
    assert unpreconditioned.ksd == pytest.approx(imq_ksd(rows, -rows @ np.asarray(PRECISION)), rel=1e-4)


# --- (7) the step-halving check --------------------------------------------------------------------
DIAGONAL = jnp.array([1.0, 0.25])


def diagonal_potential(z):
    """``U(x) = Σ_k λ_k x_k² / 2`` with ``λ = (1, 1/4)``."""
    return 0.5 * jnp.sum(DIAGONAL * z["x"] ** 2)


def sgld_run(step_size, steps_per_sample, num_samples, seed=0):
    kernel = SGLD(potential_fn=diagonal_potential, step_size=step_size, steps_per_sample=steps_per_sample)
    mcmc = MCMC(kernel, num_warmup=100, num_samples=num_samples, num_chains=2, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(seed), init_params={"x": jnp.zeros((2, 2))})
    return mcmc


def test_step_halving_flags_a_far_too_large_step_size():
    """SGLD at ``h = 1`` samples ``Var x_k = 1 / (λ_k (1 - h λ_k / 2))``: sd 1.41 instead of 1 for ``λ = 1``,
    1.15 at ``h = 1/2``; the means stay at 0. The kernel is left as it was: the run continues with its own
    step size and steps per draw."""
    mcmc = sgld_run(1.0, 1, 2000)
    kernel = mcmc.sampler
    with pytest.warns(RuntimeWarning, match=r"moved beyond their Monte Carlo error .*sd of x\[0\]"):
        result = step_halving_check(mcmc)
    assert isinstance(result, StepHalvingResult)
    print(result.table.to_string())
    assert "sd of x[0]" in result.flagged and not any(name.startswith("mean") for name in result.flagged)
    table = result.table
    assert list(table.index) == ["x[0]", "x[1]"]
    assert abs(table.loc["x[0]", "sd_halved"] - 1 / np.sqrt(1 - 0.25)) < K_SIGMA * table.loc["x[0]", "sd_mcse"]
    assert result.threshold == pytest.approx(2.4977, abs=1e-4)  # Φ⁻¹(1 - 0.05 / 8)
    np.testing.assert_array_equal(result.step_size, [1.0, 1.0])
    np.testing.assert_array_equal(result.halved_step_size, [0.5, 0.5])
    assert kernel._step_size == 1.0 and kernel._steps_per_sample == 1
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.last_state.rng_key, init_params=mcmc.last_state.z)
    assert int(mcmc.last_state.i[0]) == 2100 + 2000 and float(mcmc.last_state.step_size[0]) == 1.0


def test_step_halving_is_silent_on_a_healthy_run():
    """``h = 0.05``: the sds differ from the posterior's by at most 1.3 % at ``h`` and 0.6 % at ``h/2``, well
    within the Monte Carlo error of 1000 draws per chain."""
    mcmc = sgld_run(0.05, 10, 1000, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = step_halving_check(mcmc, num_samples=500)
    print(result.table.to_string())
    assert result.flagged == [] and not caught, [str(w.message) for w in caught]
    assert (result.table[["mean_z", "sd_z"]].abs() < result.threshold).all(axis=None)


@on_shared_runs
def test_step_halving_halves_a_tuned_step_size(tuned_run):
    """A tuned step size is the chains' state's: the continuation runs at half of it."""
    tuned = np.asarray(tuned_run.last_state.adapt_state.step_size)
    result = step_halving_check(tuned_run, num_samples=50, burn_in=0)
    np.testing.assert_allclose(result.halved_step_size, tuned / 2, rtol=1e-6)
    np.testing.assert_allclose(tuned_run.last_state.adapt_state.step_size, tuned)  # the run's state is untouched


def test_step_halving_halves_a_schedule_and_slows_its_clock():
    def schedule(t):
        return 0.1 / (1.0 + t / 100.0)

    halved = _HalvedSchedule(schedule, 600)
    assert [halved(t) for t in (600, 601, 602, 700)] == [schedule(600) / 2, schedule(600) / 2, schedule(601) / 2,
                                                          schedule(650) / 2]  # fmt: skip
    kernel = SGLD(potential_fn=diagonal_potential, step_size=schedule)
    mcmc = MCMC(kernel, num_warmup=100, num_samples=500, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2), init_params={"x": jnp.zeros(2)})
    with warnings.catch_warnings():  # 500 draws, and 40 more, of a slow chain: only the step sizes are checked
        warnings.simplefilter("ignore", RuntimeWarning)
        result = step_halving_check(mcmc, num_samples=40, burn_in=10)
    # the continuation's last step is 600 + 2 · 50 - 1: the schedule at 600 + 49
    assert result.halved_step_size[0] == pytest.approx(schedule(649) / 2, rel=1e-6)
    assert result.step_size[0] == pytest.approx(schedule(599), rel=1e-6) and kernel._step_size is schedule


# --- (8) bad input to the run-level functions -------------------------------------------------------
@on_shared_runs
def test_run_level_bad_input(tuned_run):
    with pytest.raises(TypeError, match="`mcmc` must be a numpyro.infer.MCMC or pyro.infer.MCMC"):
        ksd({"x": np.zeros((1, 10))})
    nuts = MCMC(NUTS(potential_fn=gaussian_potential), num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(TypeError, match="the run's kernel is NUTS, not a ppl_sgmcmc kernel"):
        step_halving_check(nuts)
    idle = MCMC(SGLD(potential_fn=gaussian_potential, step_size=0.1), num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(ValueError, match=r"holds no draws: call `mcmc.run\(...\)` first"):
        ksd(idle)
    mcmc = tuned_run
    with pytest.raises(ValueError, match="`num_draws` must be an integer >= 2"):
        ksd(mcmc, num_draws=1)
    with pytest.raises(ValueError, match="`preconditioner` must be \"adapted\", None or an array"):
        ksd(mcmc, preconditioner="identity")
    with pytest.raises(ValueError, match=r"`samples` lack the latent site\(s\) \['x'\]"):
        ksd(mcmc, samples={"y": np.zeros((1, 5, 2))})
    with pytest.raises(ValueError, match="`alpha` must lie strictly between 0 and 1"):
        step_halving_check(mcmc, alpha=1.0)
    with pytest.raises(ValueError, match="`num_samples` must be an integer >= 2"):
        step_halving_check(mcmc, num_samples=1)
    with pytest.raises(ValueError, match="`burn_in` must be an integer >= 0"):
        step_halving_check(mcmc, burn_in=-1)


def test_step_halving_refuses_an_infinite_step_size():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=10):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))

    mcmc = MCMC(SGFS(model, alpha=0.0, fisher="diagonal", find_mode=False), num_warmup=0, num_samples=5,
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), jnp.zeros(50), init_params={"mu": jnp.zeros(())})  # no search for a start
    with pytest.raises(ValueError, match="SGFS's step size is inf: there is no discretisation to halve"):
        step_halving_check(mcmc)


# --- (9) the minibatch-energy noise of CSGLD ---------------------------------------------------------------------
def two_mode_model(y, n=5):
    """``θ ~ N(0.8, 1)``, ``y_i ~ N(θ², 1)`` (``N = 20``, minibatches of ``n``): modes near ``θ = ±1.05`` with a
    barrier of about 12.4 at ``θ = 0`` and ``P(θ < 0) ≈ 0.16``, the kind of posterior on which CSGLD's weights
    were found biased by the minibatch energies' noise."""
    theta = numpyro.sample("theta", dist.Normal(0.8, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=n):
        numpyro.sample("y", dist.Normal(theta**2, 1.0), obs=numpyro.subsample(y, event_dim=0))


def two_mode_data():
    """20 observations with mean 1.1 and sd 1 exactly."""
    e = np.random.default_rng(0).normal(size=20)
    return (1.1 + (e - e.mean()) / e.std()).astype(np.float32)


def noise_by_hand(theta, y, n, replace):
    """``σ(θ)`` of :func:`two_mode_model`'s minibatch energy, in float64: ``(N/sqrt(n)) sd_i[log N(y_i; θ², 1)]``,
    times ``sqrt((N - n)/(N - 1))`` without replacement."""
    log_lik = scipy.stats.norm.logpdf(np.asarray(y, np.float64), np.asarray(theta, np.float64)[..., None] ** 2, 1.0)
    size = len(y)
    factor = 1.0 if replace else (size - n) / (size - 1)
    return size / np.sqrt(n) * log_lik.std(axis=-1) * np.sqrt(factor)


def csgld_run(n, num_chains=1, **kwargs):
    """CSGLD with its automatic energy grid, short; the run's own warnings (noise ratio, no subsampled plate
    when ``n = N``) are not what is tested."""
    mcmc = MCMC(CSGLD(two_mode_model, step_size=1e-3, **kwargs), num_warmup=200, num_samples=200,
                num_chains=num_chains, chain_method="vectorized", progress_bar=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(0), jnp.asarray(two_mode_data()), n)
    return mcmc


@pytest.fixture(scope="module")
def two_mode_run():
    return csgld_run(5, num_chains=2)


@on_shared_runs
def test_energy_noise_is_the_sd_of_the_minibatch_energy_and_flags_the_two_mode_case(two_mode_run):
    """N = 20, n = 5 with replacement: σ ≈ 6.5 at the modes, against Δu ≈ σ (the automatic grid measures the
    noise) and τ = 1: every chain is flagged, with a warning. σ at 50 evenly spaced draws per chain matches the
    hand-computed value, whatever the chunks the draws are evaluated in."""
    mcmc = two_mode_run
    with pytest.warns(RuntimeWarning, match=r"CSGLD: the minibatch energies are too noisy .*chain 0: σ/Δu = .* >= 0\.5, "
                      r"σ/τ = .* > 0\.3.*larger minibatches"):  # fmt: skip
        result = energy_noise(mcmc, num_draws=50)
    print(result)
    assert isinstance(result, EnergyNoiseResult)
    theta = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"])[:, np.arange(50) * 200 // 50]
    np.testing.assert_allclose(result.sigma, noise_by_hand(theta, two_mode_data(), 5, True), rtol=1e-4)
    assert result.plates == {"data": (20, 5)} and result.replace and result.temperature == 1.0
    table = result.table
    assert list(table.index) == [0, 1] and table["biased"].all()
    np.testing.assert_allclose(table["energy_gap"], np.asarray(mcmc.last_state.energy_gap), rtol=1e-6)
    np.testing.assert_allclose(table["sigma_median"], np.median(result.sigma, axis=1))
    np.testing.assert_allclose(table["gap_ratio"], table["sigma_median"] / table["energy_gap"])
    np.testing.assert_allclose(table["temperature_ratio"], table["sigma_median"])
    assert (table["temperature_ratio"] > 10 * NOISE_TEMPERATURE_RATIO).all() and (table["gap_ratio"] > 0.5).all()
    assert [item.split(":")[0] for item in result.flagged] == ["chain 0", "chain 1"]
    assert "plate 'data': N = 20, n = 5, with replacement" in str(result) and "flagged:" in str(result)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        chunked = energy_noise(mcmc, num_draws=50, chunk_size=7)
        all_draws = energy_noise(mcmc, num_draws=1000)
    np.testing.assert_allclose(chunked.sigma, result.sigma, rtol=1e-6)
    assert all_draws.sigma.shape == (2, 200)  # never more than the run's draws


def test_energy_noise_is_zero_and_silent_with_full_batches():
    """n = N without replacement: every step sees all the data, the minibatch energy is the energy."""
    mcmc = csgld_run(20, replace=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = energy_noise(mcmc, num_draws=20)
    print(result)
    assert not caught, [str(w.message) for w in caught]
    assert result.plates == {} and result.flagged == [] and not result.table["biased"].any()
    np.testing.assert_array_equal(result.sigma, np.zeros((1, 20)))
    assert "full batches: no noise" in str(result) and "nothing flagged" in str(result)


@pytest.mark.parametrize("replace", [True, False])
def test_the_formula_is_the_sd_of_simulated_minibatch_energies(replace):
    """``(N²/n) Var_i[ℓ_i]`` (times ``(N - n)/(N - 1)`` without replacement) against the variance of
    ``(N/n) Σ_{i in S} ℓ_i`` over 20000 random minibatches ``S`` of 5 of 20 rows (its relative standard error
    is about 1 %); two observed sites in the plate add per row, a site outside it adds nothing."""
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 3, 20))  # (draws, rows) of two sites
    pointwise = Pointwise({"data": (20, 5)}, {"a": ("data", -1), "b": ("data", -1)}, replace, (1, 3),
                           [(0, {"a": a, "b": b, "global": np.zeros((3,))})])  # fmt: skip
    sigma = _noise_sd(pointwise, "test")[0]
    rows = a + b
    if replace:
        index = rng.integers(0, 20, size=(20_000, 5))
    else:
        index = np.argsort(rng.random((20_000, 20)), axis=1)[:, :5]
    energies = -(20 / 5) * rows[:, index].sum(axis=-1)  # (draws, minibatches)
    np.testing.assert_allclose(sigma, energies.std(axis=1), rtol=0.05)


def test_the_thresholds():
    """A chain is flagged at σ/Δu >= 0.5 or σ/τ > 0.3 (median over its draws); draws whose σ differ by a factor
    2 (q90/q10) are flagged when the larger σ exceeds 0.3 τ, not when all are small."""
    sigma = np.full((3, 10), 0.2)
    sigma[1], sigma[2] = 0.5, 0.31  # chain 1: σ/Δu = 0.5; chain 2: σ/τ = 0.31
    table, spread, flagged = _noise_report(sigma, np.array([1.0, 1.0, 1.0]), 1.0)
    assert table["biased"].tolist() == [False, True, True] and spread == pytest.approx(2.5)
    assert flagged == ["chain 1: σ/Δu = 0.5 >= 0.5, σ/τ = 0.5 > 0.3", "chain 2: σ/τ = 0.31 > 0.3",
                       "σ differs between draws by a factor 2.5 (10th-90th percentile 0.2-0.5): the weights of "
                       "different regions are inflated differently"]  # fmt: skip
    quiet = np.concatenate([np.full((1, 10), 0.01), np.full((1, 10), 0.1)])  # 10 times apart, but small
    table, spread, flagged = _noise_report(quiet, np.array([1.0, 1.0]), 1.0)
    assert spread == pytest.approx(10.0) and flagged == [] and not table["biased"].any()
    assert _noise_report(np.zeros((1, 5)), np.ones(1), 1.0)[1:] == (1.0, [])


@on_shared_runs
def test_energy_noise_bad_input(two_mode_run, tuned_run):
    with pytest.raises(TypeError, match="`mcmc` must be a numpyro.infer.MCMC or pyro.infer.MCMC"):
        energy_noise({"theta": np.zeros((1, 10))})
    idle = MCMC(CSGLD(two_mode_model, step_size=1e-3), num_warmup=10, num_samples=10, progress_bar=False)
    with pytest.raises(ValueError, match=r"holds no draws: call `mcmc.run\(...\)` first"):
        energy_noise(idle)
    with pytest.raises(TypeError, match="the run's kernel is SGLD, not CSGLD or CSGHMC"):
        energy_noise(tuned_run)
    kernel = CSGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.1, energy_min=0.0, energy_gap=1.0)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=10, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"built from a `potential_fn`, which has no per-datum .*Evaluate the "
                       r"stochastic potential `potential_fn\(z, rng\)` at a point"):  # fmt: skip
        energy_noise(mcmc)
    with pytest.raises(ValueError, match="`num_draws` must be an integer >= 1"):
        energy_noise(two_mode_run, num_draws=0)
    with pytest.raises(ValueError, match="`chunk_size` must be an integer >= 1"):
        energy_noise(two_mode_run, chunk_size=0)
    plate_sizes = {"users": (100, 10), "items": (50, 5)}
    assert site_plates({"y": [("items", -1)], "z": [("other", -1)]}, plate_sizes, "f") == {"y": ("items", -1)}
    with pytest.raises(ValueError, match=r"site 'y' lies in the subsampled plates \['users', 'items'\]"):
        site_plates({"y": [("users", -2), ("items", -1)]}, plate_sizes, "energy_noise")

