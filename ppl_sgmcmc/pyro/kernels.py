"""The SG-MCMC algorithms as Pyro kernels: each names its update rule and validates its
hyper-parameters; :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel` does the rest.

The names, arguments, defaults and update rules are those of :mod:`ppl_sgmcmc.numpyro.kernels`:
both backends call the same functions of :mod:`ppl_sgmcmc.rules`, here on torch tensors."""

import math

import torch

from ppl_sgmcmc import _checks, _hyperparameters
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel, SGMCMCState
from ppl_sgmcmc.rules import csgld, psgld, sgfs, sghmc, sgld, sgnht, sgrld

INTEGRATORS = _hyperparameters.INTEGRATORS


class SGLD(SGMCMCKernel):
    """Stochastic gradient Langevin dynamics (Welling & Teh, ICML 2011)::

        θ ← θ - h ∇Ũ_t(θ) + sqrt(2 h τ) ζ

    :param step_size: ``h`` (Welling & Teh's ``ε/2``), a float or a schedule; typically 1e-6 to 1e-3
        for a potential scaled to N data points.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`.

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

    rule = sgld


class SGHMC(SGMCMCKernel):
    """Stochastic gradient HMC (Chen, Fox & Guestrin, ICML 2014) with identity mass, integrated by
    Euler or by the second-order symmetric splitting of Chen, Ding & Carin (NeurIPS 2015).

    Euler::

        θ ← θ + h p
        p ← p - h ∇Ũ_t(θ) - h A p + sqrt(2 A h τ) ζ

    Splitting (A-B-O-B-A)::

        θ ← θ + (h/2) p;  p ← exp(-A h/2) p;  p ← p - h ∇Ũ_t(θ) + sqrt(2 A h τ) ζ;
        p ← exp(-A h/2) p;  θ ← θ + (h/2) p

    :param step_size: ``h``, a float or a schedule. In SGD-with-momentum terms, learning rate ``h²``
        and momentum decay ``1 - A h``.
    :param friction: ``A > 0`` (default 1.0), which is also the injected noise's diffusion.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`.

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

    rule = sghmc

    def __init__(self, model=None, potential_fn=None, *, step_size, friction=1.0, integrator="splitting", **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _hyperparameters.sghmc(friction, integrator, type(self).__name__)


class SGNHT(SGMCMCKernel):
    """Stochastic gradient Nosé-Hoover thermostat: the multivariate mSGNHT of Li, Chen, Fan & Carin
    (AAAI 2016) with the symmetric-splitting (mSGNHT-S, default) or Euler (mSGNHT-E) integrator, or
    the scalar-thermostat SGNHT of Ding et al. (NeurIPS 2014).

    mSGNHT-S, with ``k(p) = p⊙p`` (multivariate) or ``pᵀp/d`` (scalar)::

        θ ← θ + (h/2) p;  ξ ← ξ + (h/2)(k(p) - τ);  p ← exp(-ξ h/2) ⊙ p
        p ← p - h ∇Ũ_t(θ) + sqrt(2 D h τ) ζ
        p ← exp(-ξ h/2) ⊙ p;  θ ← θ + (h/2) p;  ξ ← ξ + (h/2)(k(p) - τ)

    mSGNHT-E::

        θ ← θ + h p;  p ← p - h ∇Ũ_t(θ) - h ξ ⊙ p + sqrt(2 D h τ) ζ;  ξ ← ξ + h (k(p) - τ)

    The thermostat ``ξ`` starts at ``D`` and adapts the friction so that ``k(p)`` matches ``τ``,
    absorbing the unknown gradient-noise variance: at equilibrium ``ξ ≈ D + B`` where ``B`` is the
    gradient noise's diffusion. Collect it with ``extra_fields=("rule_state.thermostat",)``.

    Two things to watch. The thermostat learns at rate ``h``, so on a stiff posterior (curvature
    ``≫ 1/h``) it takes ``O(1/h)`` steps or more to settle: make the warm-up long enough that the
    collected ``ξ`` has stopped drifting. The Euler integrator is stable only while ``h ξ < 2``: past
    that the momentum grows geometrically, every step is rejected as divergent and the chain stays
    where it was (the splitting integrator damps by ``exp(-ξ h)`` and has no such limit).

    :param step_size: ``h``, a float or a schedule.
    :param diffusion: ``D > 0`` (default 1.0), the injected noise's diffusion.
    :param thermostat: ``"multivariate"`` (default, ``ξ ∈ R^d``) or ``"scalar"``.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`.

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

    rule = sgnht

    def __init__(
        self,
        model=None,
        potential_fn=None,
        *,
        step_size,
        diffusion=1.0,
        thermostat="multivariate",
        integrator="splitting",
        **kwargs,
    ):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _hyperparameters.sgnht(diffusion, thermostat, integrator, type(self).__name__)

    def _logging_items(self, state):
        items = super()._logging_items(state)
        items["ξ̄"] = f"{float(state.rule_state.thermostat.mean()):.3g}"
        return items


class PSGLD(SGMCMCKernel):
    """Preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson & Carin, AAAI 2016)::

        V ← α V + (1 - α) ḡ_t ⊙ ḡ_t;   G = 1 ⊘ (λ + sqrt(V))
        θ ← θ - h G ⊙ ∇Ũ_t(θ) + sqrt(2 h τ G) ⊙ ζ

    ``ḡ_t`` is the mean per-datum log-likelihood gradient of the minibatch. The ``Γ(θ)`` term is
    dropped, as in the paper.

    A latent that the likelihood does not inform (its mean score is 0) gets ``G = 1/λ``: choose
    ``step_size`` with ``h/λ`` in mind, or raise ``eps``, for models with such latents.

    ``V`` averages over about ``1/(1-α)`` minibatches, so at the default ``α = 0.99`` the
    preconditioner still follows the minibatch noise of ``ḡ_t``, and, with ``Γ`` dropped, the chain
    is biased by an amount that does not vanish as ``h → 0``: on a conjugate Gaussian regression the
    posterior came out about 5% too wide (in ``E[(θ-μ)ᵀΣ⁻¹(θ-μ)]/d``); ``α = 0.999`` removed it.

    :param step_size: ``h``, a float or a schedule.
    :param alpha: the RMSprop decay ``α ∈ (0, 1)`` (default 0.99).
    :param eps: the regulariser ``λ > 0`` (default 1e-5).
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`.

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

    rule = psgld
    needs_score = True

    def __init__(self, model=None, potential_fn=None, *, step_size, alpha=0.99, eps=1e-5, **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _hyperparameters.psgld(alpha, eps, type(self).__name__)


# --- contour SG-MCMC (CSGLD / CSGHMC) ---------------------------------------------------------------
class ContourState(SGMCMCState):
    """:class:`~ppl_sgmcmc.pyro.kernel.SGMCMCState` of :class:`CSGLD`/:class:`CSGHMC`, with the contour
    quantities of the rule state (:class:`ppl_sgmcmc.rules.csgld.CSGLDState`) readable as top-level
    attributes: ``log_weight``, ``partition``, ``multiplier``, ``theta`` (the partition weights, ``(m,)``),
    ``energy_min``, ``energy_gap``. It is the kernel's :attr:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel.state`
    during a run; after ``MCMC.run``, :meth:`CSGLD.diagnostics` holds what was recorded.

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

    log_weight = property(lambda self: self.rule_state.log_weight, doc="log importance weight of the sample")
    partition = property(lambda self: self.rule_state.partition, doc="0-based energy bin of the sample")
    multiplier = property(lambda self: self.rule_state.multiplier, doc="gradient multiplier used at the sample")
    theta = property(lambda self: self.rule_state.theta, doc="the learned partition weights θ")
    energy_min = property(lambda self: self.rule_state.energy_min, doc="the grid's u_min")
    energy_gap = property(lambda self: self.rule_state.energy_gap, doc="the grid's Δu")


class CSGLD(SGMCMCKernel):
    """Contour stochastic gradient Langevin dynamics (Deng, Lin & Liang, NeurIPS 2020): SGLD on the
    flattened density ``ϖ ∝ π / Ψ_θ(U)^ζ``, with importance weights that restore ``π``.

    The arguments, defaults, validation and rule (:mod:`ppl_sgmcmc.rules.csgld`) are those of
    :class:`ppl_sgmcmc.numpyro.CSGLD`, whose docstring explains them. With the energy grid
    ``u_min + k Δu`` (``m`` bins, 0-based bin ``j`` of the minibatch energy ``Ũ_t(x)``,
    ``j⁻ = max(j-1, 0)``), at each step::

        θ(i) ← θ(i) + ω_k θ(j)^ζ (1[i = j] - θ(i))
        x ← x - h [1 + (ζ τ / Δu)(log θ(j) - log θ(j⁻))] ∇Ũ_t(x) + sqrt(2 h τ) ξ

    and the sample ``x`` (the point of its own gradient) gets the log weight ``ζ log Ψ_θ(Ũ_t(x))``.

    **Output.** Each kept draw's ``log_weight`` and ``partition`` are returned by :meth:`diagnostics`
    (one list per chain, so they come back from Pyro's worker processes too), with the chain's final
    ``theta``, ``energy_min`` and ``energy_gap``. :func:`ppl_sgmcmc.pyro.to_inference_data` puts
    ``log_weight`` and ``partition`` in ``sample_stats`` (``arviz.from_pyro`` keeps only
    ``diverging`` there), so :mod:`ppl_sgmcmc.importance` applies unchanged;
    :func:`ppl_sgmcmc.pyro.sample_stats` returns them as arrays.

    **Energy grid.** ``energy_min="auto"``/``energy_gap="auto"`` (default) calibrate the grid during the
    first ``calibration_steps`` steps (default: half of ``warmup_steps × steps_per_sample``); they need
    ``warmup_steps > 0``. Each chain calibrates its own grid.

    :param step_size: ``h``, a float or a schedule.
    :param int num_partitions: ``m >= 2`` energy bins (default 100).
    :param energy_gap: ``Δu > 0``, or ``"auto"`` (default).
    :param energy_min: ``u_min``, or ``"auto"`` (default).
    :param float zeta: the flattening strength ``ζ >= 0`` (default 0.75); ``ζ = 0`` is SGLD.
    :param sa_step_size: ``ω_k``, a float in (0, 1) or a schedule; default ``1 / (k^0.6 + 100)``.
    :param str weight: ``"interpolated"`` (default) or ``"bin"``.
    :param calibration_steps: the steps that calibrate an ``"auto"`` grid (default: half the warm-up steps).
    :param str adapt_theta: ``"always"`` (default), ``"warmup"`` (``θ`` frozen after the warm-up) or
        ``"never"`` (``θ`` stays at ``initial_theta``: the paper's KSGLD).
    :param initial_theta: ``θ``'s starting value: ``m`` positive finite weights of the bins of an explicit
        grid (normalised to sum to 1); default uniform.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`.

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
        (['diverging', 'log_weight', 'partition'], (1, 200))
        >>> estimate = weighted_mean(idata)["x"]  # Σ w x / Σ w, the estimate of π's mean
    """

    rule = csgld
    integrator = "langevin"
    #: per-draw statistics returned by :meth:`diagnostics` and put in ArviZ's ``sample_stats``
    sample_stats_fields = ("log_weight", "partition")

    def __init__(
        self,
        model=None,
        potential_fn=None,
        *,
        step_size,
        num_partitions=100,
        energy_gap="auto",
        energy_min="auto",
        zeta=0.75,
        sa_step_size=csgld.default_sa_step_size,
        weight="interpolated",
        calibration_steps=None,
        adapt_theta="always",
        initial_theta=None,
        **kwargs,
    ):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._contour = _hyperparameters.csgld(
            num_partitions, energy_gap, energy_min, zeta, sa_step_size, weight, calibration_steps, adapt_theta,
            initial_theta, type(self).__name__,
        )
        self._calibration_steps, self._adaptation_steps = 0, None  # set from the warm-up by `setup`
        self._records = {field: [] for field in self.sample_stats_fields}

    @property
    def auto_grid(self):
        """Whether the energy grid is chosen from the warm-up: ``True`` unless both ``energy_min`` and
        ``energy_gap`` are given.

        **Example**::

            >>> CSGLD(potential_fn=lambda z: z["x"] ** 2, step_size=0.05).auto_grid
            True
            >>> CSGLD(potential_fn=lambda z: z["x"] ** 2, step_size=0.05, energy_gap=2.0).auto_grid  # u_min is "auto"
            True
        """
        return self._contour.auto_grid

    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size``: ``temperature``, the contour arguments
        (``None`` for an ``"auto"`` ``energy_min``/``energy_gap``), the windows ``calibration_steps`` and
        ``adaptation_steps`` that :meth:`setup` fixes, and the ``integrator``.

        **Example** (CSGHMC's integrator is the SGHMC one)::

            >>> hp = CSGHMC(potential_fn=lambda z: z["x"] ** 2, step_size=0.05, num_partitions=30,
            ...             energy_min=-1.0, energy_gap=0.2).hyperparameters()
            >>> hp["num_partitions"], hp["energy_min"], hp["energy_gap"], hp["zeta"], hp["integrator"]
            (30, -1.0, 0.2, 0.75, 'splitting')
        """
        contour = self._contour.rule_kwargs(self._calibration_steps, self._adaptation_steps)
        return dict(super().hyperparameters(), **contour, integrator=self.integrator)

    def setup(self, warmup_steps, *args, **kwargs):
        """As :meth:`SGMCMCKernel.setup <ppl_sgmcmc.pyro.kernel.SGMCMCKernel.setup>`, after fixing the
        calibration and adaptation windows from ``warmup_steps × steps_per_sample``; clears the records
        of :meth:`diagnostics`. Raises a ``ValueError`` if the warm-up is too short for an ``"auto"`` grid,
        for ``calibration_steps`` or for ``adapt_theta="warmup"``.

        **Example** (``θ`` frozen after the warm-up: the grid is calibrated over the first 10 steps and ``θ``
        learns until step 60, the end of the warm-up of 30 draws × 2 steps)::

            >>> import torch
            >>> kernel = CSGLD(potential_fn=lambda z: z["x"].abs().sum(), step_size=0.05, steps_per_sample=2,
            ...                calibration_steps=10, adapt_theta="warmup")
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=30)
            >>> kernel.hyperparameters()["calibration_steps"], kernel.hyperparameters()["adaptation_steps"]
            (10, 60)
        """
        self._calibration_steps, self._adaptation_steps = self._contour.windows(
            warmup_steps, self._steps_per_sample, "warmup_steps", type(self).__name__
        )
        super().setup(warmup_steps, *args, **kwargs)
        self._records = {field: [] for field in self.sample_stats_fields}

    def _start(self, params):
        super()._start(params)
        self._state = ContourState(*self._state)
        initial_theta = self._contour.initial_theta
        if initial_theta is not None:
            theta = self._state.rule_state.theta
            rule_state = self._state.rule_state._replace(theta=torch.as_tensor(initial_theta, dtype=theta.dtype))
            self._state = self._state._replace(rule_state=rule_state)

    def _step(self):
        diverging = super()._step()
        self._state = ContourState(*self._state)
        return diverging

    def sample(self, params):
        """As :meth:`SGMCMCKernel.sample <ppl_sgmcmc.pyro.kernel.SGMCMCKernel.sample>`; after the warm-up,
        also records the draw's ``log_weight`` and ``partition`` for :meth:`diagnostics` (whose example
        shows that only the kept draws are recorded).
        """
        params = super().sample(params)
        if self._draws > self._warmup_steps:
            rule_state = self._state.rule_state
            self._records["log_weight"].append(float(rule_state.log_weight))
            self._records["partition"].append(int(rule_state.partition))
        return params

    def diagnostics(self):
        """The base class's (``divergences``, ``num_diverging``), plus ``log_weight`` and ``partition`` of
        every kept draw (lists) and the chain's final ``theta`` (a list of ``m`` floats), ``energy_min`` and
        ``energy_gap``. ``MCMC.diagnostics()`` gathers them per chain.

        **Example** (the grid an ``"auto"`` calibration chose)::

            >>> import torch, pyro
            >>> pyro.set_rng_seed(0)
            >>> kernel = CSGLD(potential_fn=lambda z: (z["x"] - 1).abs().sum(), step_size=0.05, num_partitions=6)
            >>> kernel.initial_params = {"x": torch.zeros(2)}
            >>> kernel.setup(warmup_steps=20)
            >>> z = kernel.initial_params
            >>> for _ in range(25):
            ...     z = kernel.sample(z)
            >>> out = kernel.diagnostics()
            >>> sorted(out)
            ['divergences', 'energy_gap', 'energy_min', 'log_weight', 'num_diverging', 'partition', 'theta']
            >>> len(out["log_weight"]), len(out["theta"]), out["energy_gap"] > 0  # 25 draws - 20 warm-up; 6 bins
            (5, 6, True)
        """
        out = super().diagnostics()
        out.update({field: list(values) for field, values in self._records.items()})
        if self._state is not None:
            rule_state = self._state.rule_state
            out["theta"] = rule_state.theta.tolist()
            out["energy_min"] = float(rule_state.energy_min)
            out["energy_gap"] = float(rule_state.energy_gap)
        return out

    def _logging_items(self, state):
        items = super()._logging_items(state)
        items["bin"] = int(state.rule_state.partition)
        items["mult"] = f"{float(state.rule_state.multiplier):.3g}"
        return items


class CSGHMC(CSGLD):
    """Contour SGHMC (Deng, Lin & Liang, NeurIPS 2020, §4.2): the energy flattening and importance
    weights of :class:`CSGLD` inside the SGHMC momentum integrator of :class:`SGHMC` (identity mass),
    the gradient ``∇Ũ_t`` replaced by ``[1 + (ζ τ / Δu)(log θ(j) - log θ(j⁻))] ∇Ũ_t``; as
    :class:`ppl_sgmcmc.numpyro.CSGHMC`.

    With the splitting integrator the gradient, and so the energy and the weight, is taken at the
    midpoint ``θ + (h/2) p``: the draws are those midpoints (see :mod:`ppl_sgmcmc.rules.csgld`).

    :param step_size: ``h``, a float or a schedule.
    :param friction: ``A > 0`` (default 1.0), also the injected noise's diffusion.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.

    The contour arguments are those of :class:`CSGLD`.

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

    def __init__(self, model=None, potential_fn=None, *, step_size, friction=1.0, integrator="splitting", **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _hyperparameters.sghmc(friction, integrator, type(self).__name__)
        self.integrator = self._options["integrator"]


# --- SGFS -------------------------------------------------------------------------------------------------
class SGFS(SGMCMCKernel):
    """Stochastic gradient Fisher scoring (Ahn, Korattikara & Welling, ICML 2012), Algorithm 1, with the
    arguments, defaults, validation and rule (:mod:`ppl_sgmcmc.rules.sgfs`) of
    :class:`ppl_sgmcmc.numpyro.SGFS`, whose docstring explains them.

    With the minibatch's per-datum scores ``g_i = ∇ log p(x_i | θ)`` (``n`` of them), ``N`` the subsampled
    plate's size, ``γ = (n + N)/n`` and step size ``ε``::

        V_t = (1/(n-1)) Σ_i (g_i - ḡ)(g_i - ḡ)ᵀ
        Î_t = (1 - κ_t) Î_{t-1} + κ_t V_t,      κ_t = 1/t   (1/min(t, fisher_window) during warm-up)
        θ ← θ + 2 (γ N Î_t + 4B/ε)⁻¹ (∇ log p(θ) + N ḡ + η),      η ~ N(0, 4B/ε)

    The per-datum scores come from the declared model: one run on the minibatch keeps each datum's
    log-likelihood apart (the subsampled plate's dimension of every observed site's ``log_prob``), and
    one batched backward pass (``torch.autograd.grad(..., is_grads_batched=True)``) gives the ``n×d``
    matrix; this is traced into the potential's graph like the gradient. The model needs exactly one
    plate with ``subsample_size = n ≥ 2`` around its observed sites.

    :param step_size: ``ε > 0``, a float, ``float("inf")`` (``α = 0``) or a schedule.
    :param alpha: instead of ``step_size``, the paper's ``α = 2/sqrt(ε) ≥ 0``.
    :param fisher: ``"full"`` (SGFS-f, default) or ``"diagonal"`` (SGFS-d).
    :param B: ``"fisher"`` (default, ``B = γ N Î_t``), ``"identity"``, a positive scalar, a vector of ``d``
        positive entries, or (full form) a ``d×d`` matrix (latents flattened in sorted site order).
    :param ridge: the preconditioner uses ``Î + ridge·Diag(Î)`` (default ``1e-4``).
    :param fisher_window: the warm-up averaging window (default 100), or ``None``.
    :param max_full_dim: the largest ``d`` for ``fisher="full"`` (default 2000).

    The Fisher estimate is ``kernel.state.rule_state.fisher`` during a run. ``temperature`` must stay 1.
    Other arguments: see :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`.

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

    rule = sgfs

    def __init__(
        self,
        model=None,
        potential_fn=None,
        *,
        step_size=None,
        alpha=None,
        fisher="full",
        B="fisher",
        ridge=1e-4,
        fisher_window=100,
        max_full_dim=sgfs.MAX_FULL_DIM,
        **kwargs,
    ):
        name = type(self).__name__
        step_size, infinite = _hyperparameters.sgfs_step_size(potential_fn, step_size, alpha, kwargs, name)
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        if infinite:
            self._step_size = math.inf
        self._options = _hyperparameters.sgfs(fisher, B, ridge, fisher_window, max_full_dim, name)
        self._num_warmup = 0

    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size``: ``fisher``, ``B``, ``ridge``, ``fisher_window``
        and ``max_full_dim`` as validated, ``data_size`` (the subsampled plate's ``N``) and ``num_warmup``
        (in steps); no ``temperature``. The last two come from :meth:`setup`.

        **Example** (a Poisson rate; 300 counts, 30 a minibatch)::

            >>> import torch, pyro, pyro.distributions as dist
            >>> def model(counts):
            ...     rate = pyro.sample("rate", dist.Gamma(2.0, 1.0))
            ...     with pyro.plate("hours", counts.shape[0], subsample_size=30):
            ...         pyro.sample("counts", dist.Poisson(rate), obs=pyro.subsample(counts, event_dim=0))
            >>> kernel = SGFS(model, step_size=0.5, B="identity")
            >>> kernel.setup(40, torch.full((300,), 3.0))
            >>> hp = kernel.hyperparameters()
            >>> hp["B"], hp["data_size"], hp["num_warmup"], hp["fisher_window"]
            ('identity', 300, 40, 100)
        """
        num_warmup = self._num_warmup * self._steps_per_sample  # in steps
        return dict(self._options, data_size=self._target.data_size, num_warmup=num_warmup)

    def _make_target(self, args, kwargs):
        target = super()._make_target(args, kwargs)
        target.enable_per_example_scores()  # checks the plate before anything is traced
        return target

    def setup(self, warmup_steps, *args, **kwargs):
        """As :meth:`SGMCMCKernel.setup <ppl_sgmcmc.pyro.kernel.SGMCMCKernel.setup>`, after recording
        ``warmup_steps`` (the Fisher average's warm-up window); checks the model's plate, and ``fisher``,
        ``B`` and ``max_full_dim`` against its dimension ``d`` (a ``ValueError`` naming the fix), and warns
        when a full Fisher estimate starts singular (``n ≤ d`` with a small ``ridge``).

        **Example** (three latents are too many for a full Fisher capped at two)::

            >>> import torch, pyro, pyro.distributions as dist
            >>> def model(X, y):
            ...     w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
            ...     with pyro.plate("rows", X.shape[0], subsample_size=16):
            ...         pyro.sample("y", dist.Normal(pyro.subsample(X, event_dim=1) @ w, 1.0),
            ...                     obs=pyro.subsample(y, event_dim=0))
            >>> SGFS(model, alpha=0.0, max_full_dim=2).setup(10, torch.ones(64, 3), torch.zeros(64))
            Traceback (most recent call last):
                ...
            ValueError: SGFS: a full Fisher for d = 3 parameters (3×3 matrix, an O(d³) Cholesky solve per step) ...
        """
        name = type(self).__name__
        self._num_warmup = int(warmup_steps)
        super().setup(warmup_steps, *args, **kwargs)
        d = self._target.layout.size
        options = self._options
        try:
            sgfs._check(d, options["fisher"], options["B"], options["max_full_dim"])
        except sgfs.SGFSConfigError as err:
            raise ValueError(f"{name}: {err}") from None
        _hyperparameters.sgfs_warn_singular(self._target.plate_sizes, d, options, name)


# --- SGRLD ------------------------------------------------------------------------------------------------
def _is_positive(support):
    """Whether ``support`` is ``constraints.positive`` (or ``nonnegative``, torch's support of ``Gamma``,
    ``Exponential``, ``HalfNormal``), possibly made independent over event dimensions."""
    from pyro.distributions import constraints

    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.positive or support is constraints.nonnegative


class SGRLD(SGMCMCKernel):
    """Stochastic gradient Riemannian Langevin dynamics (Patterson & Teh, NeurIPS 2013) with the
    expanded-mean preconditioner ``G(θ) = diag(θ)`` (the inverse metric) and mirroring, for positive latents; as
    :class:`ppl_sgmcmc.numpyro.SGRLD` (rule :mod:`ppl_sgmcmc.rules.sgrld`)::

        θ ← | θ - h (θ ⊙ ∇Ũ_t(θ) - τ) + sqrt(2 h τ θ) ⊙ ζ |

    The chain moves the latents in their own positive space: ``θ`` and ``∇Ũ_t`` are those of the model
    as declared, without a log transform or its Jacobian (Pyro's ``MCMC`` gets no transforms, so the
    samples are the values themselves). Every latent must have a positive support (``Gamma``,
    ``Exponential``, ``HalfNormal``, ``LogNormal``, ...); a model with another latent gets a
    ``ValueError`` naming it. With ``potential_fn`` the energy is a function of the positive values,
    and ``initial_params`` must be positive.

    :param step_size: ``h``, a float or a schedule.
    :param temperature: ``τ`` (default 1).

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

    rule = sgrld
    constrained = True

    def _make_target(self, args, kwargs):
        target = super()._make_target(args, kwargs)
        _checks.positive_latents(target.latent_supports, _is_positive, type(self).__name__)
        return target
