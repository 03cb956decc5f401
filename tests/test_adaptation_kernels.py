"""The warm-up's adaptation in the kernels, on both backends: the step size tuned when none is given (and not
otherwise), the Laplace preconditioner, the optimiser's start, frozen after the warm-up, the tuned chain
sampling the exact conjugate posterior within Monte Carlo error, and bad options refused with a message."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pyro
import pyro.distributions as pdist
import pytest
import torch
from numpyro.infer import MCMC

from ppl_sgmcmc import adaptation, algorithms
from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from tests.helpers import K_SIGMA, conjugate_posterior, linear_regression_data, sd_and_mcse, walled

N, D, BATCH, NOISE, PRIOR = 2000, 4, 50, 1.0, 1.0
X, Y, _ = linear_regression_data(N, D, NOISE, seed=11)
MEAN, COV = conjugate_posterior(X, Y, NOISE, PRIOR)


def numpyro_model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, NOISE), obs=numpyro.subsample(y, 0))


def pyro_model(X, y):
    w = pyro.sample("w", pdist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        pyro.sample("y", pdist.Normal(pyro.subsample(X, event_dim=1) @ w, NOISE), obs=pyro.subsample(y, event_dim=0))


def assert_sd_ratio_within(draws, low, high):
    """Each coordinate's sd over the exact posterior's lies in [low, high], widened by K_SIGMA MCSEs."""
    sd, mcse = sd_and_mcse(draws)
    exact = np.sqrt(np.diag(COV))
    ratio, ratio_mcse = sd / exact, mcse / exact
    assert np.all((ratio + K_SIGMA * ratio_mcse > low) & (ratio - K_SIGMA * ratio_mcse < high)), (ratio, ratio_mcse)
    return ratio


def assert_noise_ratio_on_target(ratio, step, kernel):
    """The kept draws' median noise ratio is SGNHT's target (1) within a factor of 2 (the estimate's spread), or
    below it for chains whose tuned step is the discretisation's cap (``max_step_size``), which a small noise lets
    the tuning reach before the target."""
    capped = np.asarray(step == kernel.max_step_size)[..., 0]  # per chain
    median = np.median(np.asarray(ratio), axis=-1)
    assert np.all(median < 2) and np.all(capped | (median > 0.5)), (median, capped)


def test_numpyro_tuned_sgnht_samples_the_posterior_and_freezes():
    chains = 4
    kernel = np_backend.SGNHT(numpyro_model, steps_per_sample=10)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, num_chains=chains, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.warmup(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(Y))
    warm = mcmc.post_warmup_state.adapt_state
    mcmc.run(jax.random.PRNGKey(1), jnp.asarray(X), jnp.asarray(Y),
             extra_fields=("adapt_state.preconditioner.scale",))  # fmt: skip
    extra = mcmc.get_extra_fields(group_by_chain=True)
    frozen = np.asarray(extra["adapt_state.preconditioner.scale"])
    np.testing.assert_array_equal(frozen, np.broadcast_to(np.asarray(warm.preconditioner.scale)[:, None], frozen.shape))
    step = np.asarray(extra["step_size"])
    np.testing.assert_array_equal(step, np.broadcast_to(np.asarray(warm.step_size)[:, None], step.shape))
    # the tuned noise ratio is the target (1 for SGNHT), up to the estimate's spread, where the step did not reach
    # the discretisation's cap first (as SVRG's noise, the default gradient here, lets it)
    assert_noise_ratio_on_target(np.asarray(extra["noise_ratio"]), step, kernel)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    assert_sd_ratio_within(draws, 0.9, 1.1)
    mean = draws.reshape(-1, D).mean(0)
    assert np.all(np.abs(mean - MEAN) < 0.2 * np.sqrt(np.diag(COV))), (mean - MEAN) / np.sqrt(np.diag(COV))


@pytest.mark.parametrize("kernel_class, options", [("SGLD", {}), ("SGHMC", {}), ("PSGLD", {}),
                                                   ("SGNHT", {"gradient": "minibatch"})])  # fmt: skip
def test_numpyro_tuned_kernels_hit_their_noise_target(kernel_class, options):
    """The tuned step sizes reach the kernels' noise ratio (0.1; SGNHT's 1 with the minibatch gradient, whose noise
    holds its step below the cap that SVRG's lets it reach), so the variance of the Langevin and SGHMC draws is
    inflated by about that much at most; short runs (their mixing is slow at that ratio) check the sd within
    [0.8, 1.25]."""
    kernel = getattr(np_backend, kernel_class)(numpyro_model, steps_per_sample=20, **options)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, num_chains=4, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(2), jnp.asarray(X), jnp.asarray(Y))
    ratio = np.asarray(mcmc.get_extra_fields()["noise_ratio"])
    target = kernel.default_noise_ratio
    assert 0.5 * target < np.median(ratio) < 2 * target, np.median(ratio)
    assert_sd_ratio_within(np.asarray(mcmc.get_samples(group_by_chain=True)["w"]), 0.8, 1.25)


def test_pyro_tuned_sgnht_samples_the_posterior():
    """Pyro's warm-up steps run eagerly (about 3.5 ms each, the compiled steps after it 0.2 ms): 5 steps a draw (a
    1000-step warm-up) and 4000 draws leave each sd's Monte Carlo error at most what 10 steps a draw and 3000 draws
    left (ESS 2700-2900 against 2100-3000: sd MCSE 1.1-1.2 % of the exact sd against 1.2-2.2 %), in two thirds of
    the steps."""
    pyro.set_rng_seed(0)
    kernel = pyro_backend.SGNHT(pyro_model, steps_per_sample=5)
    mcmc = pyro.infer.MCMC(kernel, warmup_steps=200, num_samples=4000, disable_progbar=True)
    mcmc.run(torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32))
    draws = mcmc.get_samples(group_by_chain=True)["w"].numpy()
    assert_sd_ratio_within(draws, 0.9, 1.1)
    stats = pyro_backend.sample_stats(mcmc)
    step = stats["step_size"]
    assert np.all(step == step[0, 0])  # frozen after the warm-up
    assert_noise_ratio_on_target(stats["noise_ratio"], step, kernel)


def correlated_gaussian(backend):
    cov = np.array([[4.0, 1.9], [1.9, 1.0]])  # correlation 0.95
    precision = np.linalg.inv(cov)
    if backend is np_backend:
        P = jnp.asarray(precision, jnp.float32)
        return cov, lambda z: 0.5 * z["x"] @ P @ z["x"]
    P = torch.tensor(precision, dtype=torch.float32)
    return cov, lambda z: 0.5 * z["x"] @ P @ z["x"]


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_dense_laplace_preconditioner_is_the_covariance(backend):
    """The Hessian of a Gaussian target is its precision, so the dense Laplace preconditioner at the start is
    the covariance exactly; the windows' rescaling keeps it within its Monte Carlo error."""
    cov, energy = correlated_gaussian(backend)
    kernel = backend.SGLD(potential_fn=energy, dense_mass=True, find_mode=False)
    if backend is np_backend:
        state = kernel.init(jax.random.PRNGKey(0), 0, {"x": jnp.array([1.0, -1.0])})
        L = np.asarray(state.adapt_state.preconditioner.scale, np.float64)
    else:
        kernel.initial_params = {"x": torch.tensor([1.0, -1.0])}
        kernel.setup(0)
        kernel.sample(kernel.initial_params)
        L = kernel.state.adapt_state.preconditioner.scale.double().numpy()
    np.testing.assert_allclose(L @ L.T, cov, rtol=1e-4)
    # no gradient noise: the step size is the discretisation's cap at unit curvature
    step = kernel.state.step_size if backend is pyro_backend else float(state.step_size)
    assert step == pytest.approx(kernel.max_step_size, rel=1e-4)


def start_of(backend, kernel, start):
    """The position, step size and kernel state of a new chain at ``start`` after the kernel's start."""
    if backend is np_backend:
        state = kernel.init(jax.random.PRNGKey(0), 0, {"x": jnp.array(start)})
        return np.asarray(state.z["x"]), float(state.step_size)
    pyro.set_rng_seed(0)  # the step after the start draws noise: the same draws whatever ran before in the process
    kernel.initial_params = {"x": torch.tensor(start)}
    kernel.setup(0)
    kernel.sample(kernel.initial_params)
    return kernel.state.z["x"].numpy(), kernel.state.step_size


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_find_mode_moves_a_far_start(backend):
    cov, energy = correlated_gaussian(backend)
    start = [40.0, -30.0]  # 70 posterior sds from the mode 0
    # Adam alone, with a given step size (no Hessian): most of the way down the correlated valley
    x, step = start_of(backend, backend.SGLD(potential_fn=energy, step_size=0.01, find_mode=2000), start)
    assert step == pytest.approx(0.01)  # a given step size is used as given
    whitened = np.sqrt(x @ np.linalg.inv(cov) @ x)
    assert whitened < 10, whitened
    # tuned (the default): Adam, then the Newton steps of the Laplace approximation, at the mode; then one step
    x, _ = start_of(backend, backend.SGLD(potential_fn=energy), start)
    assert np.sqrt(x @ np.linalg.inv(cov) @ x) < 1.5, x
    # 10x farther than Adam's 1000 steps can travel (about 50 in each coordinate), 700 sds away: the Newton
    # steps' trust region widens until a full step reaches the mode
    x, _ = start_of(backend, backend.SGLD(potential_fn=energy), [400.0, -300.0])
    assert np.sqrt(x @ np.linalg.inv(cov) @ x) < 1.5, x


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_the_start_is_the_mode_of_every_row_when_the_hessian_reads_fewer(backend, monkeypatch):
    """On a data set larger than the Hessian's rows (``adaptation.HESSIAN_ROWS``, lowered here to 200 of 2000), the
    Newton steps are line-searched on every row and take the Hessian again at each end point: the start is the
    full-data mode, not the mode of the Hessian's rows (about 3 whitened units away here: sqrt(N / rows) times a
    posterior sd in each of the 4 directions)."""
    monkeypatch.setattr(adaptation, "HESSIAN_ROWS", 200)

    # models of their own: a kernel of `numpyro_model` compiled in this process keeps its start's programs
    def numpyro_own(X, y):
        numpyro_model(X, y)

    def pyro_own(X, y):
        pyro_model(X, y)

    if backend is np_backend:
        state = np_backend.SGLD(numpyro_own).init(
            jax.random.PRNGKey(0), 1000, None, (jnp.asarray(X), jnp.asarray(Y)), {}
        )
        start = np.asarray(state.finite_position, np.float64)
    else:
        kernel = pyro_backend.SGLD(pyro_own)
        kernel.setup(1000, torch.as_tensor(X), torch.as_tensor(Y))
        kernel._start(None)  # the chain's start, before its first step
        start = kernel._flat.double().numpy()
    offset = start - MEAN  # the Gaussian posterior's mode is its mean
    assert np.sqrt(offset @ np.linalg.solve(COV, offset)) < 0.05, offset


NET_RNG = np.random.default_rng(1)  # benchmarks/multimodal.py's network target
NET_X = NET_RNG.normal(size=200).astype(np.float32)
NET_Y = (np.tanh(np.outer(NET_X, [1.5, -1.0])) @ np.ones(2) + NET_RNG.normal(size=200)).astype(np.float32)


def two_unit_network(x, y):
    """``y = Σ_j v_j tanh(w_j x) + ε`` with two tanh units: from the teacher's weights the mode finder stops at a local
    mode with one unit switched off (``v_j = w_j = 0``), where that unit's weights have almost no minibatch noise."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=20):
        xb = numpyro.subsample(x, event_dim=0)
        numpyro.sample("y", dist.Normal(jnp.tanh(xb[:, None] * w) @ v, 1.0), obs=numpyro.subsample(y, event_dim=0))


def test_nearly_noiseless_coordinates_do_not_collapse_the_start_metric():
    """The start's noise equalisation (``adaptation.equalize_noise``) shrinks no coordinate below the noise at which the
    tuned step size reaches its cap: at a network's local mode with a unit switched off, the dead unit's nearly
    noiseless coordinates made the median, and the metric of the live unit's weights shrank about 500-fold (a chain
    that then hardly moved). The start metric's narrowest direction stays within 10x of the Laplace approximation's
    (the inverse Hessian of the full-data potential at the start)."""
    x, y = jnp.asarray(NET_X, jnp.float32), jnp.asarray(NET_Y)
    kernel = np_backend.SGLD(two_unit_network)
    state = kernel.init(jax.random.PRNGKey(1), 9000, {"v": jnp.ones(2), "w": jnp.array([1.5, -1.0])}, (x, y), {})
    start = np.concatenate([np.asarray(state.z["v"]), np.asarray(state.z["w"])]).astype(np.float64)

    def potential(z):  # flat in sorted site order: v, then w
        return 0.5 * jnp.sum(z**2) + 0.5 * jnp.sum((y - jnp.tanh(x[:, None] * z[2:]) @ z[:2]) ** 2)

    # one compiled program (run eagerly, the Hessian's operations compile one by one: about 3 s of CPU time)
    hessian = np.asarray(jax.jit(jax.hessian(potential))(jnp.asarray(start, jnp.float32)), np.float64)
    scale = np.asarray(state.adapt_state.preconditioner.scale, np.float64)
    assert np.min(np.abs(start[[0, 2]])) < 1e-2 or np.min(np.abs(start[[1, 3]])) < 1e-2  # a unit switched off
    assert np.min(np.linalg.eigvalsh(scale @ scale.T)) > 0.01 / np.max(np.linalg.eigvalsh(hessian))


LOGIT_N, LOGIT_BATCH = 2000, 100
LOGIT_X = np.random.default_rng(5).normal(size=LOGIT_N).astype(np.float32)
LOGIT_Y = (np.random.default_rng(6).uniform(size=LOGIT_N) < 1 / (1 + np.exp(-LOGIT_X))).astype(np.float32)
DOLLARS = (6e4 + 2e4 * np.random.default_rng(7).normal(size=1000)).astype(np.float32)  # an outcome in dollars


def numpyro_logistic(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", x.shape[0], subsample_size=LOGIT_BATCH):
        numpyro.sample("y", dist.Bernoulli(logits=numpyro.subsample(x, 0) * w), obs=numpyro.subsample(y, 0))


def pyro_logistic(x, y):
    w = pyro.sample("w", pdist.Normal(0.0, 10.0))
    with pyro.plate("data", x.shape[0], subsample_size=LOGIT_BATCH):
        pyro.sample("y", pdist.Bernoulli(logits=pyro.subsample(x, event_dim=0) * w), obs=pyro.subsample(y, event_dim=0))


def numpyro_dollars(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1e6))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1e6))
    with numpyro.plate("data", y.shape[0], subsample_size=LOGIT_BATCH):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=numpyro.subsample(y, 0))


def pyro_dollars(y):
    mu = pyro.sample("mu", pdist.Normal(0.0, 1e6))
    sigma = pyro.sample("sigma", pdist.HalfNormal(1e6))
    with pyro.plate("data", y.shape[0], subsample_size=LOGIT_BATCH):
        pyro.sample("y", pdist.Normal(mu, sigma), obs=pyro.subsample(y, event_dim=0))


def model_start(backend, model, args, init_params=None):
    """A new tuned SGLD chain's position (constrained) after the kernel's start on ``model(*args)``: the start itself,
    before any step, on both backends (NumPyro's ``init`` takes none; Pyro's ``_start`` is the start of its first
    ``sample``, whose step would compile the whole step's graph)."""
    if backend is np_backend:
        kernel = backend.SGLD(model)
        init = None if init_params is None else {k: jnp.asarray(v, jnp.float32) for k, v in init_params.items()}
        state = kernel.init(jax.random.PRNGKey(0), 0, init, tuple(jnp.asarray(a) for a in args))
        constrained = kernel.postprocess_fn(tuple(jnp.asarray(a) for a in args), {})(state.z)
        return {k: np.asarray(v) for k, v in constrained.items()}
    pyro.set_rng_seed(0)
    kernel = backend.SGLD(model)
    if init_params is not None:
        kernel.initial_params = {k: torch.tensor(v, dtype=torch.float32) for k, v in init_params.items()}
    kernel.setup(0, *(torch.tensor(a) for a in args))
    kernel._start(None)
    return {k: kernel.transforms[k].inv(v).detach().numpy() for k, v in kernel.state.z.items()}


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_find_mode_reaches_modes_and_starts_far_out_of_adams_reach(backend):
    """Adam's steps scale with each coordinate's magnitude: a start at 10⁴ on a logistic regression (a saturated
    gradient of the same size at any distance) and a mode at 6·10⁴ (an outcome in dollars, its scale started
    at about 1) are reached, within a fraction of a posterior sd, by the default tuned start."""
    # the logistic regression's mode and posterior sd, by Newton's method on the full data
    w = 0.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-LOGIT_X * w))
        grad, hess = np.sum((LOGIT_Y - p) * LOGIT_X) - w / 100, np.sum(p * (1 - p) * LOGIT_X**2) + 1 / 100
        w += grad / hess
    model = numpyro_logistic if backend is np_backend else pyro_logistic
    far = model_start(backend, model, (LOGIT_X, LOGIT_Y), {"w": np.float32(1e4)})["w"]
    assert abs(float(far) - w) < 0.5 / np.sqrt(hess), (far, w)
    model = numpyro_dollars if backend is np_backend else pyro_dollars
    start = model_start(backend, model, (DOLLARS,))
    mean, sd = DOLLARS.mean(), DOLLARS.std()
    assert abs(float(start["mu"]) - mean) < 0.5 * sd / np.sqrt(DOLLARS.size), start
    assert abs(float(start["sigma"]) / sd - 1) < 0.5 / np.sqrt(2 * DOLLARS.size), start


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_given_step_size_switches_tuning_off(backend):
    kernel = backend.SGNHT(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.05)
    assert not kernel.adapts and kernel.find_mode_steps == 0
    tuned = backend.SGNHT(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum())
    assert tuned.adapts and tuned.find_mode_steps > 0


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_psgld_regulariser_on_the_scale_of_the_scores(backend):
    """pSGLD's λ defaults to 1/sqrt(n N) with the warm-up's preconditioner (the RMS of a mean score of n rows
    in coordinates of unit posterior scale), so that G stays within a factor 2 of its typical value; 1e-5
    with a given step size (no preconditioner), and as given when given. λ is set when the kernel starts, from the
    plate's sizes and whether a preconditioner is in force, before the mode search: the tuned kernels start without
    it (``find_mode=False``), which leaves λ as it is and compiles no optimiser."""

    def started(**options):
        kernel = backend.PSGLD(numpyro_model if backend is np_backend else pyro_model, **options)
        if backend is np_backend:
            kernel.init(jax.random.PRNGKey(0), 200, None, (jnp.asarray(X), jnp.asarray(Y)))
        else:
            kernel.setup(200, torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32))
        return kernel.hyperparameters()["eps"]

    assert started(find_mode=False) == pytest.approx(1 / np.sqrt(BATCH * N))
    assert started(step_size=1e-4) == 1e-5
    assert started(eps=1e-3, find_mode=False) == 1e-3


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_bad_adaptation_options(backend):
    with pytest.raises(ValueError, match="SGRLD: `adapt_mass_matrix`/`dense_mass` are not available"):
        backend.SGRLD(potential_fn=lambda z: 0.0, step_size=0.1, adapt_mass_matrix=True)
    with pytest.raises(ValueError, match="SGRLD: give a `step_size`"):
        backend.SGRLD(potential_fn=lambda z: 0.0)
    with pytest.raises(ValueError, match="SGFS: `adapt_mass_matrix`/`dense_mass` are not available"):
        backend.SGFS(lambda: None, alpha=0.0, adapt_mass_matrix=True)
    with pytest.raises(ValueError, match="set adapt_mass_matrix=True"):
        backend.SGLD(potential_fn=lambda z: 0.0, step_size=0.1, dense_mass=True)
    with pytest.raises(ValueError, match="leave adapt_mass_matrix on, or give a `step_size`"):
        backend.SGLD(potential_fn=lambda z: 0.0, adapt_mass_matrix=False)
    with pytest.raises(ValueError, match="`target_noise_ratio` sets the tuned step size"):
        backend.SGLD(potential_fn=lambda z: 0.0, step_size=0.1, target_noise_ratio=0.05)
    with pytest.raises(ValueError, match="`find_mode` must be True, False or a number"):
        backend.SGLD(potential_fn=lambda z: 0.0, find_mode=-3)
    with pytest.raises(TypeError, match="`dense_mass` must be True or False"):
        backend.SGLD(potential_fn=lambda z: 0.0, dense_mass="yes")
    minimum = adaptation.minimum_warmup_steps()
    kernel = backend.SGLD(potential_fn=correlated_gaussian(backend)[1])
    with pytest.raises(ValueError, match=f"at least {minimum} warm-up steps"):
        if backend is np_backend:
            kernel.init(jax.random.PRNGKey(0), minimum - 1, {"x": jnp.zeros(2)})
        else:
            kernel.initial_params = {"x": torch.zeros(2)}
            kernel.setup(minimum - 1)


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_warmup_restarts_a_chain_that_runs_off(backend):
    """The chain reaches the wall early in the warm-up: 1000 warm-up steps see the same restarts as 3000 did (1 on
    Pyro, 2 on NumPyro) and end on the same step sizes, 1/4 and 1/16 of the cap (Pyro's warm-up steps on a
    ``potential_fn`` run eagerly, about 4 ms each)."""
    kernel = backend.SGLD(potential_fn=walled(backend), find_mode=False)
    if backend is np_backend:
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=500, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(4)}, extra_fields=("adapt_state.restarts",))
        state = mcmc.last_state
        restarts, x = int(state.adapt_state.restarts), np.asarray(mcmc.get_samples()["x"])
        step = float(state.step_size)
    else:
        pyro.set_rng_seed(0)
        mcmc = pyro.infer.MCMC(kernel, warmup_steps=1000, num_samples=500, initial_params={"x": torch.zeros(4)},
                               disable_progbar=True)  # fmt: skip
        mcmc.run()
        state = kernel.last_state.state
        restarts, x, step = int(state.adapt_state.restarts), mcmc.get_samples()["x"].numpy(), state.step_size
    assert restarts >= 1  # the cap (0.2 at the start's curvature) is unstable on the wall: each run-off shrinks it
    assert step < kernel.max_step_size
    assert np.all(np.isfinite(x)) and np.abs(x).max() < 4  # and the chain samples inside the wall afterwards


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_many_coordinates_use_the_hessian_diagonal(backend, monkeypatch):
    """Past EXACT_HESSIAN_MAX coordinates a diagonal preconditioner comes from Hutchinson's estimate of the Hessian's
    diagonal and the curvature from power iteration: on the conjugate regression (4 coordinates, the limit lowered
    to 2) they agree with the exact Hessian's within the estimates' spread."""
    exact = {}
    for limit in (1000, 2):
        monkeypatch.setattr(adaptation, "EXACT_HESSIAN_MAX", limit)
        kernel = backend.SGLD(numpyro_model if backend is np_backend else pyro_model, find_mode=False, dense_mass=False)
        if backend is np_backend:
            state = kernel.init(jax.random.PRNGKey(0), 0, {"w": jnp.asarray(MEAN, jnp.float32)},
                                (jnp.asarray(X), jnp.asarray(Y)))  # fmt: skip
            scale, curvature = np.asarray(state.adapt_state.preconditioner.scale), float(state.adapt_state.curvature)
        else:
            pyro.set_rng_seed(0)
            kernel.initial_params = {"w": torch.tensor(MEAN, dtype=torch.float32)}
            kernel.setup(0, torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32))
            kernel._start(None)  # the chain's start, before its first step (which would compile the whole step)
            adapt = kernel.state.adapt_state
            scale, curvature = adapt.preconditioner.scale.numpy(), float(adapt.curvature)
        exact[limit] = scale, curvature
    (scale, curvature), (estimated_scale, estimated_curvature) = exact[1000], exact[2]
    # Hutchinson with 40 probes: each diagonal entry within ~3 of its own relative errors (off-diagonal mass 0.3)
    np.testing.assert_allclose(estimated_scale, scale, rtol=0.25)
    assert estimated_curvature == pytest.approx(curvature, rel=0.25)


def preconditioner_scale(backend, kernel):
    """The preconditioner's ``L`` at the start of a chain of ``kernel`` on the conjugate regression (d = 4), before its
    first step (Pyro's ``_start``: its first step after no warm-up would compile the whole step's graph)."""
    if backend is np_backend:
        state = kernel.init(jax.random.PRNGKey(0), 0, {"w": jnp.asarray(MEAN, jnp.float32)},
                            (jnp.asarray(X), jnp.asarray(Y)))  # fmt: skip
        return np.asarray(state.adapt_state.preconditioner.scale)
    pyro.set_rng_seed(0)
    kernel.initial_params = {"w": torch.tensor(MEAN, dtype=torch.float32)}
    kernel.setup(0, torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32))
    kernel._start(None)
    return kernel.state.adapt_state.preconditioner.scale.numpy()


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_default_metric_is_dense_up_to_auto_dense_max(backend, monkeypatch):
    """``dense_mass=None`` (the default): a dense Laplace preconditioner for at most AUTO_DENSE_MAX coordinates (its
    ``L Lᵀ`` the inverse Hessian, correlations included), a diagonal one beyond; True and False force either."""
    model = numpyro_model if backend is np_backend else pyro_model
    dense = preconditioner_scale(backend, backend.SGLD(model, find_mode=False))
    assert dense.shape == (D, D)
    hessian = X.T @ X / NOISE**2 + np.eye(D) / PRIOR**2  # the conjugate regression's exact Hessian
    np.testing.assert_allclose(dense @ dense.T, np.linalg.inv(hessian), rtol=1e-3, atol=1e-9)
    assert preconditioner_scale(backend, backend.SGLD(model, find_mode=False, dense_mass=False)).shape == (D,)
    monkeypatch.setattr(algorithms, "AUTO_DENSE_MAX", D - 1)
    assert preconditioner_scale(backend, backend.SGLD(model, find_mode=False)).shape == (D,)
    assert preconditioner_scale(backend, backend.SGLD(model, find_mode=False, dense_mass=True)).shape == (D, D)
    assert backend.SGLD(model, step_size=0.1)._dense_mass is False  # no adaptation: nothing to make dense


def test_a_new_tuned_chain_without_warmup_warns():
    """A kernel that tunes its step size, given no warm-up, ran a new chain on the warm-up's first guess in silence
    (a warm-up of 1 to 199 steps raises). It is right for a chain continued from its state, so it is a warning."""
    kernel = np_backend.SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2))
    with pytest.warns(UserWarning, match=r"num_warmup=0 leaves no warm-up to tune the step size .*give `step_size`\."):
        kernel.init(jax.random.PRNGKey(0), 0, {"x": jnp.ones(2)})
    kernel = pyro_backend.SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum())
    kernel.initial_params = {"x": torch.ones(2)}
    kernel.setup(warmup_steps=0)
    with pytest.warns(UserWarning, match="warmup_steps=0 leaves no warm-up to tune the step size and adapt the"):
        kernel.sample(kernel.initial_params)


# --- a dense metric's coordinates turned to the noise's axes (SGNHT) -------------------------------------------
GROUPS, PER_GROUP, GROUP_SD = 4, 250, 0.5
_g = np.repeat(np.arange(GROUPS), PER_GROUP)
_y = (1.0 + GROUP_SD * np.random.default_rng(12).normal(size=GROUPS))[_g] + np.random.default_rng(13).normal(
    size=_g.size
)


def hierarchical_model(y, g):
    """Group means around a population mean ``mu`` that no datum's score moves (it has no gradient noise)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("groups", GROUPS):
        beta = numpyro.sample("beta", dist.Normal(mu, GROUP_SD))
    with numpyro.plate("data", y.shape[0], subsample_size=50):
        numpyro.sample("y", dist.Normal(beta[numpyro.subsample(g, 0)], 1.0), obs=numpyro.subsample(y, 0))


def hierarchical_posterior():
    """The exact Gaussian posterior of ``(beta, mu)``: its mean and sds."""
    precision, b = np.zeros((GROUPS + 1, GROUPS + 1)), np.zeros(GROUPS + 1)
    for k in range(GROUPS):
        precision[k, k] = PER_GROUP + 1 / GROUP_SD**2
        precision[k, GROUPS] = precision[GROUPS, k] = -1 / GROUP_SD**2
        b[k] = _y[_g == k].sum()
    precision[GROUPS, GROUPS] = GROUPS / GROUP_SD**2 + 1 / 25
    cov = np.linalg.inv(precision)
    return cov @ b, np.sqrt(np.diag(cov))


@pytest.mark.slow
def test_sgnht_dense_metric_absorbs_noise_a_hyperparameter_lacks():
    """With the dense metric's coordinates at the Laplace axes, the noise of the group means is correlated between
    coordinates, which mSGNHT's per-coordinate thermostat does not absorb: the population mean came out about 0.88
    of its sd. Turned to the noise's axes at the start (adaptation.align_noise), every sd is right within its
    Monte Carlo error."""
    mcmc = MCMC(np_backend.SGNHT(hierarchical_model, steps_per_sample=10), num_warmup=300, num_samples=1500,
                num_chains=4, chain_method="vectorized", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(_y, jnp.float32), jnp.asarray(_g))
    samples = mcmc.get_samples(group_by_chain=True)
    draws = np.concatenate([np.asarray(samples["beta"]), np.asarray(samples["mu"])[..., None]], axis=-1)
    mean, sd = hierarchical_posterior()
    got, mcse = sd_and_mcse(draws)
    assert np.all(np.abs(got / sd - 1) < K_SIGMA * mcse / sd), (got / sd, mcse / sd)
    assert np.all(np.abs(draws.mean(axis=(0, 1)) - mean) < 0.2 * sd)
