"""Unit tests of the contour rule :mod:`ppl_sgmcmc.rules.csgld` (CSGLD / CSGHMC, paper 002).

The rule is restated below in plain NumPy (float64) from ``ALGORITHMS.md`` (section CSGLD, written
0-based), independently of the library, and checked on hand-computable steps, against that
restatement over trajectories, and between ``jax.numpy`` and ``torch`` inputs (float32 agreement).
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ppl_sgmcmc.algorithms import call_kwargs
from ppl_sgmcmc.rules import StochasticGradient, csgld, sghmc, sgld
from tests.rules.test_rules import P0, X0, as_np, close, f32, gradient_np, make_grad_fn, noise_sequence


def energy_np(x):
    a, c = np.array([1.5, 0.5, 2.0]), np.array([0.3, -0.2, 0.1])
    return float(np.sum(a * x * x / 2 + x**4 / 16 + c * x))


# --- the rule of ALGORITHMS.md, restated in NumPy ----------------------------------------------------------
class Ref:
    """CSGLD/CSGHMC in float64: ``state`` = dict(position, momentum, theta, u_min, gap, energies, count)."""

    def __init__(self, m, u_min=None, gap=None, zeta=0.75, omega=0.05, calibration=0, adaptation=None,
                 weight="interpolated", integrator="langevin", friction=None, tau=1.0):  # fmt: skip
        self.__dict__.update(locals())
        del self.__dict__["self"]

    def init(self, x, noise):
        p = None if self.integrator == "langevin" else math.sqrt(self.tau) * noise
        return dict(position=x, momentum=p, theta=np.full(self.m, 1 / self.m), u_min=self.u_min or 0.0,
                    gap=self.gap or 1.0, energies=[], count=0)  # fmt: skip

    def contour(self, s, U):
        c, C = s["count"], self.calibration
        if c < C:
            s["energies"].append(U)
            if self.u_min is None:
                s["u_min"] = min(s["energies"])
            window = s["energies"][C // 2 :]
            if self.gap is None and len(window) >= 2:
                s["gap"] = float(np.std(window, ddof=1))
        u_min, gap, theta, m = s["u_min"], s["gap"], s["theta"].copy(), self.m
        raw = math.ceil((U - u_min) / gap) - 1
        j = min(max(raw, 0), m - 1)
        jm = max(j - 1, 0)
        k = c - C + 1  # 1-based update count
        if k >= 1 and (self.adaptation is None or c < self.adaptation):
            omega = self.omega(k) if callable(self.omega) else self.omega
            indicator = np.arange(m) == j
            theta = theta + omega * theta[j] ** self.zeta * (indicator - theta)
        s["theta"] = theta
        slope = 0.0 if raw > m - 1 else math.log(theta[j]) - math.log(theta[jm])
        mult = 1 + self.zeta * self.tau / gap * slope
        if self.weight == "bin":
            log_w = self.zeta * math.log(theta[j])
        else:
            frac = min((U - (u_min + j * gap)) / gap, 1.0)
            log_w = self.zeta * (math.log(theta[jm]) + (math.log(theta[j]) - math.log(theta[jm])) * frac)
        return j, mult, log_w

    def step(self, s, noise, h):
        """Returns ``(sample, j, mult, log_w)`` and advances ``s``."""
        x, p, A, tau = s["position"], s["momentum"], self.friction, self.tau
        if self.integrator == "euler":
            x = x + h * p
        elif self.integrator == "splitting":
            x = x + h / 2 * p
            p = math.exp(-A * h / 2) * p
        sample = x
        j, mult, log_w = self.contour(s, energy_np(x))
        g = mult * gradient_np(x)
        if self.integrator == "langevin":
            x = x - h * g + math.sqrt(2 * h * tau) * noise
        elif self.integrator == "euler":
            p = p - h * g - h * A * p + math.sqrt(2 * A * h * tau) * noise
        else:
            p = p - h * g + math.sqrt(2 * A * h * tau) * noise
            p = math.exp(-A * h / 2) * p
            x = x + h / 2 * p
        s.update(position=x, momentum=p, count=s["count"] + 1)
        return sample, j, mult, log_w


def hyper_of(ref):
    return dict(num_partitions=ref.m, energy_min=ref.u_min, energy_gap=ref.gap, zeta=ref.zeta,
                sa_step_size=ref.omega, calibration_steps=ref.calibration, adaptation_steps=ref.adaptation,
                weight=ref.weight, integrator=ref.integrator, friction=ref.friction, temperature=ref.tau)  # fmt: skip


# --- hand-computed numbers ---------------------------------------------------------------------------------
def test_literal_step():
    """m = 4, grid 0 + k·1, θ = (0.4, 0.3, 0.2, 0.1), ζ = 0.5, ω = 0.1, h = 0.1, noise 0.5, U(x) = x², x = 1.5.

    U = 2.25 → j = ceil(2.25) - 1 = 2, j⁻ = 1.  θ(2)^ζ = sqrt(0.2).  θ' = θ + 0.1 sqrt(0.2) (e₂ - θ).
    mult = 1 + 0.5 (log θ'(2) - log θ'(1)).  x' = 1.5 - 0.1 mult 3 + sqrt(0.2) 0.5.
    log w = 0.5 (log θ'(1) + 0.25 (log θ'(2) - log θ'(1))).
    """
    grad_fn = lambda x: StochasticGradient(jnp.sum(x * x), 2 * x, -2 * x)  # noqa: E731
    hyper = dict(num_partitions=4, energy_min=0.0, energy_gap=1.0, zeta=0.5, sa_step_size=0.1)
    state = csgld.init(jnp.array([1.5]), jnp.array([0.0]), **call_kwargs(csgld.init, hyper))
    state = state._replace(theta=jnp.array([0.4, 0.3, 0.2, 0.1]))
    sample, new, gradient = csgld.step(jnp.array([9.0]), state, grad_fn, jnp.array([0.5]), 0.1, **hyper)
    theta = np.array([0.4, 0.3, 0.2, 0.1]) + 0.1 * math.sqrt(0.2) * (np.array([0, 0, 1, 0]) - [0.4, 0.3, 0.2, 0.1])
    mult = 1 + 0.5 * math.log(theta[2] / theta[1])
    close(sample, [1.5])  # the sample is the point of the gradient, not the ignored `position` argument
    close(gradient.grad, [3.0])  # the unmodified gradient is returned
    close(new.theta, theta)
    assert int(new.partition) == 2 and int(new.count) == 1
    close(new.multiplier, mult)
    close(new.position, [1.5 - 0.1 * mult * 3 + math.sqrt(0.2) * 0.5])
    close(new.log_weight, 0.5 * (math.log(theta[1]) + 0.25 * math.log(theta[2] / theta[1])))
    # the paper's weight θ(j)^ζ
    _, new, _ = csgld.step(jnp.array([9.0]), state, grad_fn, jnp.array([0.5]), 0.1, **hyper, weight="bin")
    close(new.log_weight, 0.5 * math.log(theta[2]))
    # τ = 2 doubles the flattening term and scales the noise
    _, new, _ = csgld.step(jnp.array([9.0]), state, grad_fn, jnp.array([0.5]), 0.1, **hyper, temperature=2.0)
    close(new.multiplier, 1 + 2 * 0.5 * math.log(theta[2] / theta[1]))
    close(new.position, [1.5 - 0.1 * float(new.multiplier) * 3 + math.sqrt(0.4) * 0.5])


def test_lowest_bin_and_above_the_grid():
    """Bin 0 has no slope (θ(0) := θ(1) in the paper's 1-based terms): mult = 1, log w = ζ log θ(0).
    Above u_min + m Δu: Ψ is flat at θ(m-1), mult = 1, log w = ζ log θ(m-1) (no extrapolation)."""
    hyper = dict(num_partitions=3, energy_min=1.0, energy_gap=0.5, zeta=0.75, sa_step_size=1e-30)
    theta = jnp.array([0.7, 0.2, 0.1])
    state = csgld.init(jnp.zeros(1), jnp.zeros(1), **call_kwargs(csgld.init, hyper))._replace(theta=theta)
    for energy, j in [(-5.0, 0), (1.3, 0), (2.4, 2), (40.0, 2)]:
        grad_fn = lambda x: StochasticGradient(jnp.asarray(energy), jnp.ones(1), -jnp.ones(1))  # noqa: B023, E731
        _, new, _ = csgld.step(jnp.zeros(1), state, grad_fn, jnp.zeros(1), 0.1, **hyper)
        assert int(new.partition) == j
        if energy != 2.4:
            close(new.multiplier, 1.0)
            close(new.log_weight, 0.75 * math.log(float(theta[j])))
        else:  # inside the last bin (2, 2.5]: the slope applies, the weight interpolates (fraction 0.8)
            close(new.multiplier, 1 + 0.75 / 0.5 * math.log(0.1 / 0.2), rtol=1e-5)
            close(new.log_weight, 0.75 * (math.log(0.2) + 0.8 * math.log(0.1 / 0.2)), rtol=1e-5)


def test_theta_stays_positive():
    """A zero θ(j) could never grow again (its update is ∝ θ(j)^ζ): θ is floored at the smallest normal."""
    hyper = dict(num_partitions=3, energy_min=0.0, energy_gap=1.0, zeta=0.0, sa_step_size=0.999)
    grad_fn = lambda x: StochasticGradient(jnp.asarray(0.5), x, -x)  # noqa: E731
    x, state = jnp.zeros(1), csgld.init(jnp.zeros(1), jnp.zeros(1), **call_kwargs(csgld.init, hyper))
    for _ in range(30):  # θ(1), θ(2) shrink by 1e-3 per step, past float32's range
        x, state, _ = csgld.step(x, state, grad_fn, jnp.zeros(1), 0.1, **hyper)
    assert float(state.theta[1]) == np.finfo(np.float32).tiny
    assert np.all(np.isfinite(np.log(np.asarray(state.theta))))


# --- where the gradient is taken; the sample is that point ---------------------------------------------------
@pytest.mark.parametrize(
    "integrator, where", [("langevin", lambda h: X0), ("euler", lambda h: X0 + h * P0), ("splitting", lambda h: X0 + h / 2 * P0)]
)
def test_one_gradient_per_step_and_the_sample_is_its_point(integrator, where):
    calls = []
    hyper = dict(num_partitions=5, energy_min=0.0, energy_gap=1.0, integrator=integrator, friction=1.0)
    state = csgld.init(*f32(X0, P0), **call_kwargs(csgld.init, hyper))
    if integrator == "langevin":
        assert state.momentum is None
    else:
        close(state.momentum, P0)
    sample, _, gradient = csgld.step(*f32(-X0), state, make_grad_fn(jnp.zeros(3), calls), *f32(X0), 0.2, **hyper)
    assert len(calls) == 1
    close(calls[0], where(0.2))
    close(sample, where(0.2))
    close(gradient.energy, energy_np(where(0.2)), rtol=1e-5)


# --- ζ = 0 is SGLD / SGHMC ---------------------------------------------------------------------------------
@pytest.mark.parametrize("integrator", ["langevin", "euler", "splitting"])
def test_zeta_zero_is_sgld_or_sghmc_exactly(integrator):
    """With ζ = 0 the multiplier is exactly 1: the integrator's path is SGLD's (SGHMC's) bit for bit."""
    hyper = dict(num_partitions=6, energy_min=0.0, energy_gap=0.5, zeta=0.0, integrator=integrator, friction=1.3)
    grad_fn = make_grad_fn(jnp.zeros(3))
    noises = noise_sequence(21, seed=5).astype(np.float32)
    x = jnp.asarray(X0, jnp.float32)
    state = csgld.init(x, jnp.asarray(noises[0]), **call_kwargs(csgld.init, hyper))
    y, plain = x, (sgld.SGLDState() if integrator == "langevin" else sghmc.init(x, jnp.asarray(noises[0])))
    for noise in noises[1:]:
        _, state, _ = csgld.step(x, state, grad_fn, jnp.asarray(noise), 0.05, **hyper)
        if integrator == "langevin":
            y, plain, _ = sgld.step(y, plain, grad_fn, jnp.asarray(noise), 0.05)
        else:
            y, plain, _ = sghmc.step(y, plain, grad_fn, jnp.asarray(noise), 0.05, friction=1.3, integrator=integrator)
            np.testing.assert_array_equal(np.asarray(state.momentum), np.asarray(plain.momentum))
        np.testing.assert_array_equal(np.asarray(state.position), np.asarray(y))
        assert float(state.multiplier) == 1.0


# --- the energy grid from the first steps ---------------------------------------------------------------------
def test_calibration_sets_the_grid_and_freezes_theta():
    """u_min = the least energy of the first C steps, Δu = the sd of those of steps C/2..C-1; θ uniform and
    mult = 1 until then; the first update then uses ω(1)."""
    C = 10
    schedule_args = []

    def omega(k):
        schedule_args.append(float(k))
        return 0.01 * k

    hyper = dict(num_partitions=8, energy_min=None, energy_gap=None, calibration_steps=C, sa_step_size=omega)
    grad_fn = make_grad_fn(jnp.zeros(3))
    noises = noise_sequence(C + 2, seed=6).astype(np.float32)
    x, state = f32(X0)[0], csgld.init(*f32(X0, noises[0]), **call_kwargs(csgld.init, hyper))
    energies = []
    for noise in noises[1 : C + 1]:
        x, state, gradient = csgld.step(x, state, grad_fn, jnp.asarray(noise), 0.3, **hyper)
        energies.append(float(gradient.energy))
        close(state.theta, np.full(8, 1 / 8))
        assert float(state.multiplier) == 1.0
    close(state.energy_min, min(energies))
    close(state.energy_gap, np.std(energies[C // 2 :], ddof=1), rtol=1e-4)
    schedule_args.clear()
    _, state, gradient = csgld.step(x, state, grad_fn, jnp.asarray(noises[-1]), 0.3, **hyper)
    assert schedule_args == [1.0]
    j = int(state.partition)
    expected = np.full(8, 1 / 8) + 0.01 * (1 / 8) ** 0.75 * ((np.arange(8) == j) - 1 / 8)
    close(state.theta, expected)
    close(state.energy_min, min(energies))  # the grid no longer moves
    with pytest.raises(ValueError, match="calibration_steps >= 2"):
        csgld.init(*f32(X0, X0), num_partitions=8, energy_min=None, energy_gap=1.0, calibration_steps=1)


# --- trajectories: NumPy restatement, and jax.numpy against torch ------------------------------------------------
CASES = {
    "csgld": Ref(12, u_min=-0.5, gap=0.25),
    "csgld-bin-tempered": Ref(12, u_min=-0.5, gap=0.25, weight="bin", tau=0.5),
    "csgld-auto-grid": Ref(10, calibration=8, omega=lambda k: 0.2 / (k**0.6 + 2)),
    "csgld-auto-min-adapt-warmup": Ref(10, gap=0.3, calibration=6, adaptation=25),
    "csghmc-euler": Ref(12, u_min=-0.5, gap=0.25, integrator="euler", friction=1.5),
    "csghmc-splitting": Ref(12, u_min=-0.5, gap=0.25, integrator="splitting", friction=1.5, tau=2.0),
    "csghmc-splitting-auto": Ref(10, calibration=8, integrator="splitting", friction=0.8),
}
STEP_SIZES = {"langevin": 0.05, "euler": 0.1, "splitting": 0.1}


def run_trajectory(ref, to_array, num_steps=30):
    hyper = hyper_of(ref)
    noises = noise_sequence(num_steps + 1, seed=7).astype(np.float32)
    x = to_array(X0.astype(np.float32))
    state = csgld.init(x, to_array(noises[0]), **call_kwargs(csgld.init, hyper))
    grad_fn = make_grad_fn(x)
    out = []
    for noise in noises[1:]:
        x, state, gradient = csgld.step(x, state, grad_fn, to_array(noise), STEP_SIZES[ref.integrator], **hyper)
        out.append([x, gradient.grad, *(leaf for leaf in state if leaf is not None)])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_trajectory_matches_reference(case):
    ref = CASES[case]
    traj = run_trajectory(ref, jnp.asarray)
    noises = noise_sequence(31, seed=7).astype(np.float32).astype(np.float64)
    s = ref.init(X0, noises[0])
    partitions = set()
    for noise, row in zip(noises[1:], traj):
        sample, j, mult, log_w = ref.step(s, noise, STEP_SIZES[ref.integrator])
        close(row[0], sample, rtol=1e-4, atol=1e-5)
        close(row[2], s["position"], rtol=1e-4, atol=1e-5)
        offset = 3 if ref.integrator != "langevin" else 2
        if ref.integrator != "langevin":
            close(row[3], s["momentum"], rtol=1e-4, atol=1e-5)
        theta, u_min, gap, _, _, count, lw, part, m = row[offset + 1 :]
        close(theta, s["theta"], rtol=1e-4, atol=1e-7)
        close(u_min, s["u_min"], rtol=1e-5, atol=1e-6)
        close(gap, s["gap"], rtol=1e-4, atol=1e-6)
        assert int(count) == s["count"] and int(part) == j
        close(m, mult, rtol=1e-4, atol=1e-5)
        close(lw, log_w, rtol=1e-4, atol=1e-5)
        partitions.add(j)
    assert len(partitions) >= 3, "the trajectory should visit several energy bins"
    assert np.ptp(np.asarray(traj[-1][0]) - X0) > 0 and not np.allclose(s["theta"], 1 / ref.m)


@pytest.mark.parametrize("case", list(CASES))
def test_jax_and_torch_trajectories_agree(case):
    traj_jax = run_trajectory(CASES[case], jnp.asarray)
    traj_torch = run_trajectory(CASES[case], torch.from_numpy)
    for step, (row_jax, row_torch) in enumerate(zip(traj_jax, traj_torch)):
        assert len(row_jax) == len(row_torch)
        for a_jax, a_torch in zip(row_jax, row_torch):
            assert isinstance(a_torch, torch.Tensor), f"{case}: torch inputs gave {type(a_torch).__name__}"
            assert str(a_torch.dtype).split(".")[-1] == str(a_jax.dtype), f"{case}: dtypes differ"
            np.testing.assert_allclose(as_np(a_torch), as_np(a_jax), rtol=2e-5, atol=2e-6, err_msg=f"{case}: step {step}")
