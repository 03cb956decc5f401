"""The SG-MCMC algorithms as Pyro kernels: each is its backend-neutral definition
(:mod:`ppl_sgmcmc.algorithms`) mixed into :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`, with the
names, arguments, defaults and update rules of :mod:`ppl_sgmcmc.numpyro`; the examples here are
Pyro's."""

from ppl_sgmcmc import algorithms
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel, SGMCMCState

__all__ = [
    "CSGHMC", "CSGLD", "PSGLD", "SGFS", "SGHMC", "SGLD", "SGNHT", "SGRLD", "ContourState", "ReSGHMC", "ReSGLD", "Recipe",
    "ReplicaState", "Santa",
]  # fmt: skip


class SGLD(algorithms.SGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGLD` (Welling & Teh, ICML 2011) as a Pyro kernel.

    **Example**::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=10):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> pyro.set_rng_seed(0)
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), warmup_steps=500, num_samples=500, disable_progbar=True)
        >>> mcmc.run(torch.ones(100))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2)
        True
    """


class SGHMC(algorithms.SGHMC, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGHMC` (Chen, Fox & Guestrin, ICML 2014) as a Pyro kernel.

    **Example** (an energy instead of a model: a 2-d normal with correlation 0.8)::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> precision = torch.tensor([[1.0, 0.8], [0.8, 1.0]]).inverse()
        >>> def energy(z):
        ...     return 0.5 * z["x"] @ precision @ z["x"]
        >>> pyro.set_rng_seed(0)
        >>> kernel = SGHMC(potential_fn=energy, step_size=0.2, steps_per_sample=2)
        >>> mcmc = MCMC(kernel, warmup_steps=100, num_samples=500, initial_params={"x": torch.zeros(2)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> x = mcmc.get_samples()["x"]
        >>> bool(torch.corrcoef(x.T)[0, 1] > 0.5), bool(x.mean(0).abs().max() < 0.5)
        (True, True)
    """


class SGNHT(algorithms.SGNHT, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGNHT` (mSGNHT-S by default; Li, Chen, Fan & Carin, AAAI 2016) as a
    Pyro kernel.

    **Example** (a Poisson rate on the log scale; the counts' mean is 5)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> def model(counts):
        ...     log_rate = pyro.sample("log_rate", dist.Normal(0.0, 2.0))
        ...     rate = log_rate.exp()
        ...     with pyro.plate("days", counts.shape[0], subsample_size=25):
        ...         pyro.sample("counts", dist.Poisson(rate), obs=pyro.subsample(counts, event_dim=0))
        >>> pyro.set_rng_seed(0)
        >>> mcmc = MCMC(SGNHT(model, step_size=0.01), warmup_steps=200, num_samples=300, disable_progbar=True)
        >>> mcmc.run(torch.full((500,), 5.0))
        >>> bool(abs(mcmc.get_samples()["log_rate"].exp().mean() - 5) < 0.3)
        True

    The thermostat is in the kernel's state between steps (here the scalar one, which starts at ``D``)::

        >>> kernel = SGNHT(potential_fn=lambda z: (z["x"] ** 2).sum(), step_size=0.05, thermostat="scalar",
        ...                diffusion=0.5)
        >>> kernel.initial_params = {"x": torch.zeros(4)}
        >>> kernel.setup(warmup_steps=0)
        >>> _ = kernel.sample(kernel.initial_params)
        >>> kernel.state.rule_state.thermostat.shape, sorted(kernel.logging())
        (torch.Size([]), ['div', 'h', 'Ũ_t', 'ξ̄'])
    """


class PSGLD(algorithms.PSGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.PSGLD` (Li, Chen, Carlson & Carin, AAAI 2016) as a Pyro kernel.

    **Example** (a straight-line regression, ``y = 1 - 2x`` plus unit noise)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> def model(x, y):
        ...     a = pyro.sample("a", dist.Normal(0.0, 10.0))
        ...     b = pyro.sample("b", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", x.shape[0], subsample_size=20):
        ...         mean = a + b * pyro.subsample(x, event_dim=0)
        ...         pyro.sample("y", dist.Normal(mean, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> pyro.set_rng_seed(0)
        >>> x = torch.linspace(-1, 1, 200)
        >>> y = 1.0 - 2.0 * x + torch.randn(200)
        >>> mcmc = MCMC(PSGLD(model, step_size=1e-3), warmup_steps=100, num_samples=150, disable_progbar=True)
        >>> mcmc.run(x, y)
        >>> samples = mcmc.get_samples()
        >>> bool(abs(samples["a"].mean() - 1) < 0.5), bool(abs(samples["b"].mean() + 2) < 0.5)
        (True, True)
    """


class SGRLD(algorithms.SGRLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGRLD` (Patterson & Teh, NeurIPS 2013) as a Pyro kernel. Pyro's ``MCMC``
    gets no transforms: the samples are the positive values themselves.

    **Example** (a Gamma-Poisson model; the posterior of ``rate`` is ``Gamma(2 + Σy, 1 + N)``)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> def model(y):
        ...     rate = pyro.sample("rate", dist.Gamma(2.0, 1.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=20):
        ...         pyro.sample("y", dist.Poisson(rate), obs=pyro.subsample(y, event_dim=0))
        >>> pyro.set_rng_seed(0)
        >>> mcmc = MCMC(SGRLD(model, step_size=1e-3), warmup_steps=300, num_samples=1000, disable_progbar=True)
        >>> mcmc.run(torch.full((200,), 3.0))
        >>> bool(abs(mcmc.get_samples()["rate"].mean() - 602 / 201) < 0.2)
        True
    """


class ContourState(algorithms.ContourFields, SGMCMCState):
    """:class:`~ppl_sgmcmc.pyro.kernel.SGMCMCState` of :class:`CSGLD`/:class:`CSGHMC`, with the contour
    quantities readable as top-level attributes (:class:`ppl_sgmcmc.algorithms.ContourFields`).

    **Example** (an explicit grid of 8 bins of width 0.5 on ``U(x) = |x|²/2`` in 3 dimensions)::

        >>> import torch, pyro
        >>> pyro.set_rng_seed(0)
        >>> kernel = CSGLD(potential_fn=lambda z: (z["x"] ** 2).sum() / 2, step_size=0.1, num_partitions=8,
        ...                energy_min=0.0, energy_gap=0.5)
        >>> kernel.initial_params = {"x": torch.zeros(3)}
        >>> kernel.setup(warmup_steps=0)
        >>> z = kernel.initial_params
        >>> for _ in range(20):
        ...     z = kernel.sample(z)
        >>> state = kernel.state
        >>> type(state).__name__, float(state.energy_min), float(state.energy_gap), state.theta.shape
        ('ContourState', 0.0, 0.5, torch.Size([8]))
        >>> 0 <= int(state.partition) < 8, bool(torch.isfinite(state.log_weight + state.multiplier))
        (True, True)
    """

    __slots__ = ()


class CSGLD(algorithms.CSGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.CSGLD` (Deng, Lin & Liang, NeurIPS 2020) as a Pyro kernel. Each kept
    draw's ``log_weight`` and ``partition`` are returned by :meth:`diagnostics` (one list per chain, so
    they come back from Pyro's worker processes too), with the chain's final ``theta``, ``energy_min`` and
    ``energy_gap``; :func:`ppl_sgmcmc.pyro.to_inference_data` puts them in ``sample_stats``
    (``arviz.from_pyro`` keeps only ``diverging``), and :func:`ppl_sgmcmc.pyro.sample_stats` returns
    them as arrays.

    **Example** (the two-mode target of the paper, ``0.4 N(-6, 1) + 0.6 N(4, 1)``)::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.importance import weighted_mean
        >>> from ppl_sgmcmc.pyro import to_inference_data
        >>> def energy(z):
        ...     x = z["x"]
        ...     return -torch.logaddexp(torch.log(torch.tensor(0.4)) - (x + 6) ** 2 / 2,
        ...                             torch.log(torch.tensor(0.6)) - (x - 4) ** 2 / 2)
        >>> pyro.set_rng_seed(0)
        >>> kernel = CSGLD(potential_fn=energy, step_size=0.1, num_partitions=50, energy_gap=1.0,
        ...                steps_per_sample=5)
        >>> mcmc = MCMC(kernel, warmup_steps=100, num_samples=200, initial_params={"x": torch.tensor(4.0)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> idata = to_inference_data(mcmc)
        >>> sorted(idata.sample_stats.data_vars), idata.sample_stats["log_weight"].shape
        (['diverging', 'log_weight', 'noise_ratio', 'noise_variance', 'partition', 'step_size'], (1, 200))
        >>> estimate = weighted_mean(idata)["x"]  # Σ w x / Σ w, the estimate of π's mean
    """

    state_type = ContourState


class CSGHMC(algorithms.CSGHMC, CSGLD):
    """:class:`ppl_sgmcmc.algorithms.CSGHMC` (Deng, Lin & Liang, NeurIPS 2020, §4.2) as a Pyro kernel.

    **Example**::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> kernel = CSGHMC(potential_fn=lambda z: (z["x"] ** 2 - 4) ** 2 / 2, step_size=0.1, num_partitions=20)
        >>> mcmc = MCMC(kernel, warmup_steps=200, num_samples=100, initial_params={"x": torch.tensor(2.0)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> diagnostics = mcmc.diagnostics()
        >>> len(diagnostics["log_weight"]["chain 0"]), len(diagnostics["theta"]["chain 0"])
        (100, 20)
    """


class SGFS(algorithms.SGFS, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.SGFS` (Ahn, Korattikara & Welling, ICML 2012) as a Pyro kernel: one
    run on the minibatch keeps each datum's log-likelihood apart, and one batched backward pass
    (``torch.autograd.grad(..., is_grads_batched=True)``) gives the ``n×d`` per-datum scores, traced into
    the potential's graph like the gradient.

    **Example** (Bayesian logistic regression, ``α = 0``)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> def model(X, y):
        ...     w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        ...     with pyro.plate("data", X.shape[0], subsample_size=100):
        ...         logits = pyro.subsample(X, event_dim=1) @ w
        ...         pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))
        >>> pyro.set_rng_seed(1)
        >>> X = torch.randn(2000, 2)
        >>> u = torch.rand(2000)
        >>> y = (X @ torch.tensor([1.0, -1.0]) > torch.log(u / (1 - u))).float()  # logistic noise
        >>> mcmc = MCMC(SGFS(model, alpha=0.0), warmup_steps=100, num_samples=300, disable_progbar=True)
        >>> mcmc.run(X, y)
        >>> w = mcmc.get_samples()["w"]
        >>> bool(torch.all((w.mean(0) - torch.tensor([1.0, -1.0])).abs() < 0.2))
        True
    """


class Santa(algorithms.Santa, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.Santa` (Chen, Carlson, Gan, Li & Carin, AISTATS 2016) as a Pyro kernel:
    the warm-up explores, the kept draws refine, and the last draw is the estimate of the global mode.

    **Example** (the double-well ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5`` from its local mode near 2.2; the global
    one is near -2.9; 3000 steps explore, 1000 refine)::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.rules.santa import annealing
        >>> def U(z):
        ...     x = z["x"]
        ...     return ((x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5).sum()
        >>> pyro.set_rng_seed(0)
        >>> kernel = Santa(potential_fn=U, step_size=0.1, inverse_temperature=annealing(scale=300.0))
        >>> mcmc = MCMC(kernel, warmup_steps=3000, num_samples=1000, initial_params={"x": torch.tensor([2.2])},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> round(float(mcmc.get_samples()["x"][-1, 0]), 2)
        -2.94
    """


class Recipe(algorithms.Recipe, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.Recipe` (Ma, Chen & Fox, NeurIPS 2015) as a Pyro kernel: ``Γ`` by
    ``torch.func.jacfwd`` of ``D`` and ``Q``, which must be written in operations ``torch.func`` transforms.

    **Example** (Langevin dynamics preconditioned by a constant dense ``D = Σ``, the target's covariance)::

        >>> import torch, pyro, numpy as np
        >>> from pyro.infer import MCMC
        >>> cov = np.array([[1.0, 0.8], [0.8, 1.0]])
        >>> precision = torch.as_tensor(np.linalg.inv(cov), dtype=torch.float32)
        >>> pyro.set_rng_seed(0)
        >>> kernel = Recipe(potential_fn=lambda z: 0.5 * z["x"] @ precision @ z["x"], step_size=0.05, D=cov)
        >>> mcmc = MCMC(kernel, warmup_steps=100, num_samples=1000, initial_params={"x": torch.zeros(2)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> bool(abs(torch.corrcoef(mcmc.get_samples()["x"].T)[0, 1] - 0.8) < 0.1)
        True
    """


class ReplicaState(algorithms.ReplicaFields, SGMCMCState):
    """:class:`~ppl_sgmcmc.pyro.kernel.SGMCMCState` of :class:`ReSGLD`/:class:`ReSGHMC`, with the replica-exchange
    quantities readable as top-level attributes (:class:`ppl_sgmcmc.algorithms.ReplicaFields`).

    **Example**::

        >>> import torch, pyro
        >>> pyro.set_rng_seed(0)
        >>> kernel = ReSGLD(potential_fn=lambda z: (z["x"] ** 2).sum() / 2, step_size=0.1, temperatures=(1, 2, 4))
        >>> kernel.initial_params = {"x": torch.zeros(2)}
        >>> kernel.setup(warmup_steps=0)
        >>> z = kernel.initial_params
        >>> for _ in range(20):
        ...     z = kernel.sample(z)
        >>> state = kernel.state
        >>> type(state).__name__, state.ladder.tolist(), state.swaps.shape, int(state.cold_replica) in (0, 1, 2)
        ('ReplicaState', [1.0, 2.0, 4.0], torch.Size([2]), True)
    """

    __slots__ = ()


class ReSGLD(algorithms.ReSGLD, SGMCMCKernel):
    """:class:`ppl_sgmcmc.algorithms.ReSGLD` (Deng, Feng, Gao, Liang & Lin, ICML 2020) as a Pyro kernel. Each kept
    draw's ``swap_probability``, ``num_swaps`` and ``cold_replica`` are returned by :meth:`diagnostics`, with the
    chain's final ``ladder``, ``swaps`` and ``energy_variance``; :func:`ppl_sgmcmc.pyro.to_inference_data` puts them
    in ``sample_stats``.

    **Example** (the two-mode target ``0.3 N(-4, 1) + 0.7 N(4, 1)`` from its right mode)::

        >>> import math, torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import to_inference_data
        >>> def energy(z):
        ...     x = z["x"]
        ...     return -torch.logaddexp(math.log(0.3) - (x + 4) ** 2 / 2, math.log(0.7) - (x - 4) ** 2 / 2)
        >>> pyro.set_rng_seed(0)
        >>> kernel = ReSGLD(potential_fn=energy, step_size=0.1, temperatures=(1, 10), steps_per_sample=5)
        >>> mcmc = MCMC(kernel, warmup_steps=50, num_samples=300, initial_params={"x": torch.tensor(4.0)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> idata = to_inference_data(mcmc)
        >>> sorted(idata.sample_stats.data_vars)
        ['cold_replica', 'diverging', 'noise_ratio', 'noise_variance', 'num_swaps', 'step_size', 'swap_probability']
        >>> int(idata.sample_stats["num_swaps"][0, -1]) > 0
        True
    """

    state_type = ReplicaState


class ReSGHMC(algorithms.ReSGHMC, ReSGLD):
    """:class:`ppl_sgmcmc.algorithms.ReSGHMC` (Deng, Feng, Gao, Liang & Lin, ICML 2020) as a Pyro kernel.

    **Example**::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> pyro.set_rng_seed(0)
        >>> kernel = ReSGHMC(potential_fn=lambda z: (z["x"] ** 2).sum() / 2, step_size=0.2, steps_per_sample=2)
        >>> mcmc = MCMC(kernel, warmup_steps=50, num_samples=100, initial_params={"x": torch.zeros(2)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> from ppl_sgmcmc.pyro import sample_stats
        >>> mcmc.get_samples()["x"].shape, sample_stats(mcmc)["cold_replica"].shape
        (torch.Size([100, 2]), (1, 100))
    """
