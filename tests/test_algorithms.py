"""The algorithm layer (:mod:`ppl_sgmcmc.algorithms`): one definition serves both backends.

The worked example of the developer guide ("Adding an algorithm": Langevin dynamics with a fixed
diagonal preconditioner) is built here exactly as the page shows it, one rule, one algorithm class and
one line per backend, and must sample a known Gaussian on both backends within Monte Carlo error.
The layer's own mechanics are tested too: rules receive only the arguments they declare, schedules of
any schedulable option, the named Gibbs options, and SGFS's hyper-parameters before ``init``.
"""

from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pyro
import pytest
import torch
from array_api_compat import array_namespace
from numpyro.infer import MCMC

from ppl_sgmcmc import _checks, algorithms, noise
from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from ppl_sgmcmc.algorithms import call_kwargs
from tests.helpers import K_SIGMA, mean_and_mcse, walled

# --- the developer guide's worked example ------------------------------------------------------------


class DiagonalSGLDState(NamedTuple):
    """No auxiliary state."""


def _init(position, noise):
    return DiagonalSGLDState()


def _step(position, state, grad_fn, noise, step_size, mass, temperature=1.0):
    xp = array_namespace(position)
    gradient = grad_fn(position)
    m = xp.asarray(mass, dtype=position.dtype)
    position = position - step_size * m * gradient.grad + xp.sqrt(2 * step_size * temperature * m) * noise
    return position, state, gradient


diagonal_sgld_rule = SimpleNamespace(NEEDS="gradient", init=_init, step=_step)


class DiagonalSGLD(algorithms.Algorithm):
    rule = diagonal_sgld_rule

    def __init__(self, model=None, potential_fn=None, *, step_size, mass=1.0, **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = {"mass": _checks.positive_definite("mass", mass, self.name)}


class NumPyroDiagonalSGLD(DiagonalSGLD, np_backend.SGMCMCKernel):
    pass


class PyroDiagonalSGLD(DiagonalSGLD, pyro_backend.SGMCMCKernel):
    pass


# the Pyro chains here run their potential eagerly: with `compile_potential` a kernel compiles its noise estimate's
# update and summary (seconds of Inductor compiling), which these tests are not about; the eager step draws the same
# values (`tests/pyro/test_compile.py` checks the compiled graphs against the eager ones)
PYRO_EAGER = dict(compile_potential=False)
VARIANCES = np.array([4.0, 0.25])  # a diagonal Gaussian whose scales differ by 4x
STEP = 0.01  # with m = Σ each coordinate moves by h m λ = 0.01 per step


def _predicted_variance():
    """Euler-Maruyama's stationary variance of ``x ← x - a x + sqrt(2 h m) ζ`` with ``a = h m/σ²``:
    ``σ² / (1 - a/2)``."""
    a = STEP * VARIANCES / VARIANCES
    return VARIANCES / (1 - a / 2)


def _check_moments(draws):
    """``draws`` (chains, samples, 2): the mean is 0 and the variance the predicted one, within MC error."""
    mean, mcse = mean_and_mcse(draws)
    assert np.all(np.abs(mean) < K_SIGMA * mcse), (mean, mcse)
    var, var_mcse = mean_and_mcse(draws**2)
    predicted = _predicted_variance()
    assert np.all(np.abs(var - predicted) < K_SIGMA * var_mcse), (var, predicted, var_mcse)


def test_worked_example_numpyro():
    kernel = NumPyroDiagonalSGLD(
        potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2 / VARIANCES), step_size=STEP, mass=VARIANCES,
        steps_per_sample=10,
    )  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=200, num_samples=4000, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros((4, 2))})
    _check_moments(np.asarray(mcmc.get_samples(group_by_chain=True)["x"]))


def test_worked_example_pyro():
    pyro.set_rng_seed(0)
    variances = torch.as_tensor(VARIANCES, dtype=torch.float32)
    kernel = PyroDiagonalSGLD(
        potential_fn=lambda z: 0.5 * (z["x"] ** 2 / variances).sum(), step_size=STEP, mass=VARIANCES,
        steps_per_sample=10, **PYRO_EAGER,
    )  # fmt: skip
    mcmc = pyro.infer.MCMC(
        kernel, warmup_steps=100, num_samples=3000, initial_params={"x": torch.zeros(2)}, disable_progbar=True
    )
    mcmc.run()
    _check_moments(mcmc.get_samples(group_by_chain=True)["x"].numpy())


# --- the layer's mechanics -----------------------------------------------------------------------------


def test_rules_receive_only_what_they_declare():
    def init(position, noise, diffusion):
        return ()

    assert call_kwargs(init, {"diffusion": 1.0, "friction": 2.0, "step_index": 0}) == {"diffusion": 1.0}
    assert call_kwargs(lambda **kw: kw, {"a": 1}) == {"a": 1}  # **kwargs takes everything


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_schedulable_options(backend):
    kernel = backend.SGHMC(potential_fn=lambda z: 0.0, step_size=0.1, friction=lambda t: 1.0 + t, temperature=2.0)
    hyper = kernel.hyperparameters_at(3)
    assert hyper["friction"] == 4.0 and hyper["temperature"] == 2.0 and hyper["step_index"] == 3
    with pytest.raises(ValueError, match="`diffusion` must be a number"):
        backend.SGNHT(potential_fn=lambda z: 0.0, step_size=0.1, diffusion=lambda t: 1.0)
    with pytest.raises(ValueError, match="`friction` must be a finite positive number"):
        backend.SGHMC(potential_fn=lambda z: 0.0, step_size=0.1, friction=-1.0)


def test_scheduled_temperature_moves_the_chain():
    """A temperature schedule reaches the rule: at τ = 4 the stationary variance of a standard normal is 4."""
    kernel = np_backend.SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.01,
                             temperature=lambda t: jnp.where(t < 10**9, 4.0, 1.0), steps_per_sample=10)  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=200, num_samples=4000, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), init_params={"x": jnp.zeros((4, 3))})
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    var, mcse = mean_and_mcse(draws**2)
    predicted = 4.0 / (1 - 0.01 / 2)
    assert np.all(np.abs(var - predicted) < K_SIGMA * mcse), (var, mcse)


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_gibbs_options_are_named(backend):
    kernel = backend.SGLD(lambda: None, step_size=0.1, gibbs_sites=["z"], gibbs_fn=lambda *a: {})
    assert isinstance(kernel._gibbs, algorithms.GibbsOptions)
    assert kernel._gibbs.sites == ("z",) and kernel._gibbs.sweeps == (5, 5) and kernel._gibbs.init is None


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_sgfs_hyperparameters_before_init(backend):
    hyper = backend.SGFS(lambda: None, alpha=0.0, fisher="diagonal").hyperparameters()
    assert hyper["fisher"] == "diagonal" and hyper["data_size"] is None and hyper["num_warmup"] == 0


def test_one_definition_per_algorithm():
    """Both backends' kernels are their algorithm mixed into the backend's base class, and nothing more."""
    for name in ("SGLD", "SGHMC", "SGNHT", "PSGLD", "SGFS", "CSGLD", "CSGHMC", "SGRLD"):
        algorithm = getattr(algorithms, name)
        for backend in (np_backend, pyro_backend):
            kernel = getattr(backend, name)
            assert issubclass(kernel, algorithm) and issubclass(kernel, backend.SGMCMCKernel)
            own = {k for k in vars(kernel) if not k.startswith("__")} - {"state_type", "_abc_impl"}
            assert not own, f"{backend.__name__}.{name} defines {own}: put it in the algorithm or the base class"


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_array_scalars_and_booleans(backend):
    """0-d arrays are numbers (a step size computed with NumPy, JAX or torch); ``replace`` must be a bool."""
    for h in (np.float32(0.1), jnp.array(0.1), torch.tensor(0.1), np.array(0.1)):
        assert backend.SGLD(potential_fn=lambda z: 0.0, step_size=h)._step_size == pytest.approx(0.1)
    with pytest.raises(ValueError, match="`step_size` must be a finite positive number"):
        backend.SGLD(potential_fn=lambda z: 0.0, step_size=jnp.array([0.1, 0.2]))
    with pytest.raises(TypeError, match="`replace` must be True or False, got 'no'"):
        backend.SGLD(potential_fn=lambda z: 0.0, step_size=0.1, replace="no")


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_a_preconditioned_step_moves_the_position_by_its_increment(backend):
    """A preconditioner's stored ``L`` and ``L⁻¹`` are inverses only to float32's precision. Here they are off by
    1e-3 (``L L⁻¹ = 1.001 I``) and the step is negligible: a chain mapped back as ``θ = L u'`` would grow by 1.001 a step
    (2.7-fold in 1000 steps; a 1e-6 error does the same over millions of steps, the chains' divergence at N = 1e6), one
    moved by ``L (u' - u)`` stays put."""
    from ppl_sgmcmc.adaptation import Preconditioner

    L = np.array([[2.0, 0.0], [1.0, 0.5]], np.float32)
    pre = Preconditioner(L, np.linalg.inv(L) * np.float32(1.001))
    kernel = backend.SGNHT(potential_fn=(lambda z: 0.5 * (z["x"] ** 2).sum()), step_size=1e-9, inverse_mass_matrix=pre,
                           **({} if backend is np_backend else PYRO_EAGER))  # fmt: skip
    if backend is np_backend:
        mcmc = MCMC(kernel, num_warmup=0, num_samples=1000, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.array([1.0, -1.0])})
        last = np.asarray(mcmc.get_samples()["x"][-1])
    else:
        pyro.set_rng_seed(0)
        mcmc = pyro.infer.MCMC(kernel, warmup_steps=0, num_samples=1000, initial_params={"x": torch.tensor([1.0, -1.0])},
                               disable_progbar=True)  # fmt: skip
        mcmc.run()
        last = mcmc.get_samples()["x"][-1].numpy()
    np.testing.assert_allclose(last, [1.0, -1.0], atol=1e-4)


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
@pytest.mark.parametrize("thermostat", ["multivariate", "scalar", "matrix"])
def test_sgnht_restarts_its_thermostat_at_the_diffusion(backend, thermostat):
    """A chain restarted in the warm-up (a run-off) gets a fresh momentum ``sqrt(τ) ζ`` and its thermostat back at its
    start, ``D`` (``D I`` for the matrix thermostat, not a matrix of ``D``s), whatever it had become."""
    kernel = backend.SGNHT(potential_fn=lambda z: 0.0, step_size=0.1, diffusion=1.5, thermostat=thermostat,
                           temperature=4.0)  # fmt: skip
    to_array = jnp.asarray if backend is np_backend else torch.as_tensor
    u, noise = to_array(np.zeros(3, np.float32)), to_array(np.array([0.5, -1.0, 2.0], np.float32))
    heated = {"multivariate": np.full(3, 9.0), "scalar": np.float64(9.0), "matrix": np.full((3, 3), 9.0)}[thermostat]
    state = kernel.rule.SGNHTState(to_array(np.full(3, 30.0, np.float32)), to_array(heated.astype(np.float32)))
    restarted = kernel._restart_rule_state(state, u, noise, 0)
    np.testing.assert_allclose(np.asarray(restarted.momentum), [1.0, -2.0, 4.0])
    expected = {"multivariate": np.full(3, 1.5), "scalar": 1.5, "matrix": 1.5 * np.eye(3)}[thermostat]
    np.testing.assert_allclose(np.asarray(restarted.thermostat), expected)


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_sghmc_absorbs_the_measured_noise_with_a_tuned_step(backend):
    """``absorb_noise=None``: SGHMC's friction absorbs the measured gradient noise where the step size is tuned, not
    where it is given (the algorithm as most users run it), and either way when asked; its warning then takes the
    limit and the diagnosis of a rule that absorbs the noise's variances. A move adds
    ``B̂ = h (A (c ⊙ diag V̂) - h²τ/2)₊/(2τ)`` (``c = 1/A``) to the friction: the rule's own step given that ``B̂``
    (the motion's share ``h²τ/2`` taken off, none left where it is all of the estimate), and the plain step before
    anything was measured (``count ≤ 0``)."""
    potential = lambda z: 0.0  # noqa: E731
    tuned, given = backend.SGHMC(potential_fn=potential), backend.SGHMC(potential_fn=potential, step_size=0.1)
    assert (tuned._absorb_noise, given._absorb_noise) == (True, False)
    assert backend.SGHMC(potential_fn=potential, step_size=0.1, absorb_noise=True)._absorb_noise
    assert not backend.SGHMC(potential_fn=potential, absorb_noise=False)._absorb_noise
    assert (tuned.noise_ratio_limit, given.noise_ratio_limit) == (algorithms.ABSORBED_NOISE_LIMIT, 0.5)
    assert tuned.default_noise_ratio == given.default_noise_ratio == 0.1
    assert "friction absorbs" in tuned.noise_bias and given.noise_bias is None
    with pytest.raises(TypeError, match="absorb_noise"):
        backend.SGHMC(potential_fn=potential, absorb_noise="yes")

    kernel = backend.SGHMC(potential_fn=potential, step_size=0.1, friction=1.5, temperature=2.0, absorb_noise=True)
    to_array = jnp.asarray if backend is np_backend else torch.as_tensor
    x, p, zeta = (to_array(np.array(v, np.float32)) for v in ([0.5, -1.0], [1.0, 0.3], [0.2, -0.4]))
    variance = to_array(np.array([0.002, 40.0], np.float32))  # A c V = 0.003 < h²τ/2 = 0.01: no B̂
    grad_fn = lambda u: algorithms.StochasticGradient(energy=(u * u).sum() / 2, grad=u, score=-u)  # noqa: E731
    state = kernel.rule.SGHMCState(p)
    for count, b_hat in ((5, 0.1 * np.array([0.0, 1.5 * 40.0 - 0.01]) / 4), (0, np.zeros(2))):
        measured = noise.NoiseState(x, variance, to_array(np.array(count, np.int32)))
        moved, moved_state, _ = kernel.rule_step(x, state, grad_fn, zeta, 0.1, 0, measured)
        expected, expected_state, _ = kernel.rule.step(x, state, grad_fn, zeta, 0.1, friction=1.5, temperature=2.0,
                                                      gradient_noise=to_array(b_hat.astype(np.float32)))  # fmt: skip
        np.testing.assert_allclose(np.asarray(moved), np.asarray(expected), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(moved_state.momentum), np.asarray(expected_state.momentum), rtol=1e-6)
    plain = kernel.rule.step(x, state, grad_fn, zeta, 0.1, friction=1.5, temperature=2.0)[1].momentum
    assert np.abs(np.asarray(moved_state.momentum) - np.asarray(plain)).max() < 1e-7
    absorbed = kernel.rule_step(x, state, grad_fn, zeta, 0.1, 0, noise.NoiseState(x, variance, to_array(np.array(5))))
    change = np.abs(np.asarray(absorbed[1].momentum) - np.asarray(plain))
    assert change[0] < 1e-7 and change[1] > 1e-3  # the friction grew where the noise exceeds the motion's share


def test_sghmc_tuned_options_keep_the_absorbed_noise():
    """The options a tuned SGHMC run gives back name ``absorb_noise=True``: its tuned step passed alone would run
    without the correction it was tuned with."""
    mcmc = MCMC(np_backend.SGHMC(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2)), num_warmup=300, num_samples=10,
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
    options = mcmc.sampler.tuned_options(mcmc.last_state)
    assert options["absorb_noise"] is True and np_backend.SGHMC(potential_fn=lambda z: 0.0, **options)._absorb_noise


# --- the warm-up's run-offs ------------------------------------------------------------------------------------
def test_a_run_off_caps_the_later_step_sizes_and_drops_its_noise():
    """A chain that runs off during the warm-up (``adaptation.ran_off``) restarts with its step size divided by
    ``RESTART_SHRINK``; the run-off showed more curvature than the start did, so no later re-tuning returns above that
    step, and the noise measured during the run-off (a chain far out, where a network's noise is huge) does not set
    the next step. On a standard normal walled off at |x| = 1.5 by a quartic (curvature ~1e4 beyond), the start's
    cap (0.2) is unstable on the wall, which the chain reaches within the first re-tuning period: before, each
    re-tuning went back to it, and the chain ran off again at every window (on the MLP of the hands-off table,
    SVRG's tiny noise sent SGHMC to the cap at each window, and the noise of each run-off collapsed its next step to
    1e-6)."""

    kernel = np_backend.SGLD(potential_fn=walled(np_backend), find_mode=False)
    mcmc = MCMC(kernel, num_warmup=3000, num_samples=10, progress_bar=False)
    fields = ("adapt_state.step_size", "adapt_state.restarts", "adapt_state.noise_count")
    mcmc.warmup(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(4)}, collect_warmup=True, extra_fields=fields)
    extra = mcmc.get_extra_fields()
    step, restarts = np.asarray(extra["adapt_state.step_size"]), np.asarray(extra["adapt_state.restarts"])
    assert restarts[-1] >= 1
    for i in np.flatnonzero(np.diff(restarts) > 0) + 1:  # the draw at which a run-off restarted the chain
        assert step[i] <= step[i - 1] / 4 * (1 + 1e-6) and np.asarray(extra["adapt_state.noise_count"])[i] == 0
        assert step[i:].max() <= step[i] * (1 + 1e-6), (i, step[i], step[i:].max())
    assert restarts[-1] <= 3, restarts[-1]  # one run-off per stable step found, not one per window
