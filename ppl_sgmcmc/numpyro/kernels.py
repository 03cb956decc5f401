"""The SG-MCMC algorithms as NumPyro kernels: each is its backend-neutral definition
(:mod:`ppl_sgmcmc.algorithms`) mixed into :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`. The
update rules, arguments and defaults are documented on the algorithm classes; the examples here are
NumPyro's."""

from ppl_sgmcmc import algorithms
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel, SGMCMCState

__all__ = [
    "CSGHMC", "CSGLD", "PSGLD", "SGFS", "SGHMC", "SGLD", "SGNHT", "SGRLD", "ContourState", "ReSGHMC", "ReSGLD", "Recipe",
    "ReplicaState", "Santa",
]  # fmt: skip


class SGLD(algorithms.SGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGLD` (Welling & Teh, ICML 2011) as a NumPyro kernel.

    **Example**::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.ones(100))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2)
        True
    """


class SGHMC(algorithms.SGHMC, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGHMC` (Chen, Fox & Guestrin, ICML 2014) as a NumPyro kernel.

    **Example** (an energy instead of a model: a 2-d normal with correlation 0.8)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> precision = jnp.linalg.inv(jnp.array([[1.0, 0.8], [0.8, 1.0]]))
        >>> kernel = SGHMC(potential_fn=lambda z: 0.5 * z["x"] @ precision @ z["x"], step_size=0.2, steps_per_sample=2)
        >>> mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> bool(abs(jnp.corrcoef(mcmc.get_samples()["x"].T)[0, 1] - 0.8) < 0.1)
        True
    """


class SGNHT(algorithms.SGNHT, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGNHT` (mSGNHT-S by default; Li, Chen, Fan & Carin, AAAI 2016) as a
    NumPyro kernel.

    **Example** (collect the thermostat ``ξ`` with the draws)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGNHT(model, step_size=0.02), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.ones(100), extra_fields=("rule_state.thermostat",))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2)
        True
        >>> mcmc.get_extra_fields()["rule_state.thermostat"].shape
        (500, 1)
    """


class PSGLD(algorithms.PSGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.PSGLD` (Li, Chen, Carlson & Carin, AAAI 2016) as a NumPyro kernel.

    **Example** (the RMSprop average ``V`` is the rule state)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(PSGLD(model, step_size=1e-3), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.ones(100))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2), mcmc.last_state.rule_state.square_avg.shape
        (True, (1,))
    """


class SGRLD(algorithms.SGRLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGRLD` (Patterson & Teh, NeurIPS 2013) as a NumPyro kernel.

    **Example** (an exponential rate with prior ``Exponential(1)``; 200 waiting times of 0.5 give the
    posterior ``Gamma(201, 101)``, mean 1.99)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(t):
        ...     rate = numpyro.sample("rate", dist.Exponential(1.0))
        ...     with numpyro.plate("data", t.shape[0], subsample_size=20):
        ...         numpyro.sample("t", dist.Exponential(rate), obs=numpyro.subsample(t, event_dim=0))
        >>> mcmc = MCMC(SGRLD(model, step_size=1e-3), num_warmup=100, num_samples=400, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.full(200, 0.5), init_params={"rate": jnp.array(1.0)})  # positive
        >>> rate = mcmc.get_samples()["rate"]
        >>> bool(jnp.all(rate > 0)), bool(abs(rate.mean() - 201 / 101) < 0.2)
        (True, True)
    """


class ContourState(algorithms.ContourFields, SGMCMCState):
    """:class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCState` of :class:`CSGLD`/:class:`CSGHMC`, with the contour
    quantities readable as top-level attributes (:class:`ppl_sgmcmc.algorithms.ContourFields`).

    **Example** (any of them can be collected by name with ``extra_fields``; the grid here is explicit)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> kernel = CSGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.1, num_partitions=10,
        ...                energy_min=0.0, energy_gap=0.5)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=200, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(1), init_params={"x": jnp.zeros(2)}, extra_fields=("multiplier", "theta"))
        >>> {name: value.shape for name, value in sorted(mcmc.get_extra_fields().items())}
        {'diverging': (200,), 'log_weight': (200,), 'multiplier': (200,), 'noise_ratio': (200,),
         'noise_variance': (200,), 'partition': (200,), 'step_size': (200,), 'theta': (200, 10)}
        >>> state = mcmc.last_state
        >>> type(state).__name__, float(state.energy_min), float(state.energy_gap), round(float(state.theta.sum()), 3)
        ('ContourState', 0.0, 0.5, 1.0)
    """

    __slots__ = ()


class CSGLD(algorithms.CSGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.CSGLD` (Deng, Lin & Liang, NeurIPS 2020) as a NumPyro kernel. Its
    state is a :class:`ContourState`; ``log_weight`` and ``partition`` are collected by default and
    ``arviz.from_numpyro`` puts them in ``sample_stats``.

    **Example** (the two-mode target ``0.4 N(-6, 1) + 0.6 N(4, 1)`` of the paper)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.importance import weighted_mean
        >>> def energy(z):
        ...     x = z["x"]
        ...     return -jnp.logaddexp(jnp.log(0.4) - (x + 6) ** 2 / 2, jnp.log(0.6) - (x - 4) ** 2 / 2)
        >>> kernel = CSGLD(potential_fn=energy, step_size=0.1, num_partitions=50, energy_gap=1.0,
        ...                steps_per_sample=10)
        >>> mcmc = MCMC(kernel, num_warmup=500, num_samples=2000, num_chains=4, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.full(4, 4.0)})
        >>> import arviz as az
        >>> idata = az.from_numpyro(mcmc)
        >>> sorted(idata.sample_stats.data_vars)
        ['diverging', 'log_weight', 'noise_ratio', 'noise_variance', 'partition', 'step_size']
        >>> bool(abs(float(weighted_mean(idata)["x"])) < 1.5)  # the true mean is 0; SGLD stays near 4
        True
    """

    state_type = ContourState


class CSGHMC(algorithms.CSGHMC, CSGLD):
    """:class:`ppl_sgmcmc.algorithms.CSGHMC` (Deng, Lin & Liang, NeurIPS 2020, §4.2) as a NumPyro kernel.

    **Example**::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> kernel = CSGHMC(potential_fn=lambda z: (z["x"] ** 2 - 4) ** 2 / 2, step_size=0.1, num_partitions=20)
        >>> mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.array(2.0)})
        >>> mcmc.get_extra_fields()["log_weight"].shape, mcmc.last_state.theta.shape
        ((1000,), (20,))
    """


class SGFS(algorithms.SGFS, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGFS` (Ahn, Korattikara & Welling, ICML 2012) as a NumPyro kernel:
    the per-datum scores are ``jax.vmap`` of ``jax.grad`` over the minibatch, each datum traced alone.

    **Example** (Bayesian logistic regression, ``α = 0``)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(X, y):
        ...     w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        ...     with numpyro.plate("data", X.shape[0], subsample_size=100):
        ...         logits = numpyro.subsample(X, event_dim=1) @ w
        ...         numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))
        >>> X = jax.random.normal(jax.random.PRNGKey(1), (2000, 2))
        >>> y = (X @ jnp.array([1.0, -1.0]) > jax.random.logistic(jax.random.PRNGKey(2), (2000,))).astype(float)
        >>> mcmc = MCMC(SGFS(model, alpha=0.0), num_warmup=300, num_samples=1000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), X, y)
        >>> w = mcmc.get_samples()["w"]
        >>> bool(jnp.all(jnp.abs(w.mean(0) - jnp.array([1.0, -1.0])) < 0.2))
        True
        >>> mcmc.last_state.rule_state.fisher.shape  # Î, the per-datum Fisher estimate
        (2, 2)
    """


class Santa(algorithms.Santa, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.Santa` (Chen, Carlson, Gan, Li & Carin, AISTATS 2016) as a NumPyro kernel:
    the warm-up explores, the kept draws refine, and the last draw is the estimate of the global mode.

    **Example** (the double-well ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5`` from its local mode near 2.2; the global
    one is near -2.9; a slow annealing for the small step)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.rules.santa import annealing
        >>> def U(z):
        ...     x = z["x"]
        ...     return jnp.sum((x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5)
        >>> kernel = Santa(potential_fn=U, step_size=0.1, inverse_temperature=annealing(scale=1000.0))
        >>> mcmc = MCMC(kernel, num_warmup=6000, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.array([2.2])})
        >>> round(float(mcmc.get_samples()["x"][-1, 0]), 2)
        -2.94
    """


class Recipe(algorithms.Recipe, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.Recipe` (Ma, Chen & Fox, NeurIPS 2015) as a NumPyro kernel: ``Γ`` by
    ``jax.jacfwd`` of ``D`` and ``Q`` (functions of ``jax.numpy`` arrays).

    **Example** (SGHMC from its ``D`` and ``Q`` on a 2-d standard normal; ``z = (θ, r)``)::

        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from numpyro.infer import MCMC
        >>> Q = np.block([[np.zeros((2, 2)), -np.eye(2)], [np.eye(2), np.zeros((2, 2))]])
        >>> kernel = Recipe(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1, D=1.0, Q=Q,
        ...                 momentum=True)
        >>> mcmc = MCMC(kernel, num_warmup=200, num_samples=4000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> bool(jnp.all(jnp.abs(mcmc.get_samples()["x"].var(0) - 1) < 0.2))
        True

    A state-dependent diffusion, ``D(θ) = 1 + θ⊙θ``, whose ``Γ(θ) = 2θ`` keeps the target (a Riemannian
    Langevin dynamics)::

        >>> kernel = Recipe(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.01, D=lambda z: 1 + z * z,
        ...                 steps_per_sample=10)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> bool(jnp.all(jnp.abs(mcmc.get_samples()["x"].var(0) - 1) < 0.2))
        True
    """


class ReplicaState(algorithms.ReplicaFields, SGMCMCState):
    """:class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCState` of :class:`ReSGLD`/:class:`ReSGHMC`, with the replica-exchange
    quantities readable as top-level attributes (:class:`ppl_sgmcmc.algorithms.ReplicaFields`).

    **Example** (the ladder and the swaps of each pair are in the last state)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> kernel = ReSGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.1, temperatures=(1, 2, 4))
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=200, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> state = mcmc.last_state
        >>> type(state).__name__, state.ladder.tolist(), state.swaps.shape, mcmc.get_extra_fields()["cold_replica"].shape
        ('ReplicaState', [1.0, 2.0, 4.0], (2,), (200,))
    """

    __slots__ = ()


class ReSGLD(algorithms.ReSGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.ReSGLD` (Deng, Feng, Gao, Liang & Lin, ICML 2020) as a NumPyro kernel. Its state
    is a :class:`ReplicaState`; ``swap_probability``, ``num_swaps`` and ``cold_replica`` are collected by default and
    ``arviz.from_numpyro`` puts them in ``sample_stats``.

    **Example** (the two-mode target ``0.3 N(-4, 1) + 0.7 N(4, 1)`` from its right mode: one chain crosses)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> def energy(z):
        ...     x = z["x"]
        ...     return -jnp.logaddexp(jnp.log(0.3) - (x + 4) ** 2 / 2, jnp.log(0.7) - (x - 4) ** 2 / 2)
        >>> kernel = ReSGLD(potential_fn=energy, step_size=0.1, temperatures=(1, 10), steps_per_sample=10)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.array(4.0)})
        >>> x = mcmc.get_samples()["x"]
        >>> bool(0.15 < (x < 0).mean() < 0.45), int(mcmc.get_extra_fields()["num_swaps"][-1]) > 10
        (True, True)
    """

    state_type = ReplicaState


class ReSGHMC(algorithms.ReSGHMC, ReSGLD):
    """:class:`ppl_sgmcmc.algorithms.ReSGHMC` (Deng, Feng, Gao, Liang & Lin, ICML 2020) as a NumPyro kernel.

    **Example** (a standard normal: the cold chain's draws have its variance)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> kernel = ReSGHMC(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.2, steps_per_sample=5)
        >>> mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> bool(jnp.all(jnp.abs(mcmc.get_samples()["x"].var(0) - 1) < 0.25))
        True
    """
