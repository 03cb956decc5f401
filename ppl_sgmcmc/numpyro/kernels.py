"""The SG-MCMC algorithms as NumPyro kernels: each names its update rule and validates its
hyper-parameters; :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel` does the rest."""

import math

import jax.numpy as jnp

from ppl_sgmcmc import _checks, _hyperparameters
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel
from ppl_sgmcmc.rules import psgld, sghmc, sgld, sgnht
from ppl_sgmcmc.rules import sgfs
from ppl_sgmcmc.numpyro.kernel import SGMCMCState
from ppl_sgmcmc.rules import csgld
from ppl_sgmcmc.rules import sgrld

INTEGRATORS = _hyperparameters.INTEGRATORS


class SGLD(SGMCMCKernel):
    """Stochastic gradient Langevin dynamics (Welling & Teh, ICML 2011)::

        θ ← θ - h ∇Ũ_t(θ) + sqrt(2 h τ) ζ

    :param step_size: ``h`` (Welling & Teh's ``ε/2``), a float or a schedule; typically 1e-6 to 1e-3
        for a potential scaled to N data points.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`.

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

    **Example**::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGHMC(model, step_size=0.02), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.ones(100))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2)
        True
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

    **Example**::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGNHT(model, step_size=0.02), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.ones(100))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2)
        True
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

    def diagnostics(self, state):
        """The diagnostics string of one state: the base class's (``Ũ_t``, ``h``, rejected steps) and the
        mean thermostat ``ξ̄``.

        **Example** (the thermostat starts at ``D``)::

            >>> import jax, jax.numpy as jnp
            >>> kernel = SGNHT(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1, diffusion=2.0)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(3)})
            >>> kernel.diagnostics(state)
            'Ũ_t 1.5, h 1.00e-01, div 0, ξ̄ 2'
        """
        return f"{super().diagnostics(state)}, ξ̄ {float(state.rule_state.thermostat.mean()):.3g}"


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

    **Example**::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(PSGLD(model, step_size=1e-3), num_warmup=500, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.ones(100))
        >>> bool(abs(mcmc.get_samples()["mu"].mean() - 1) < 0.2)
        True
    """

    rule = psgld

    def __init__(self, model=None, potential_fn=None, *, step_size, alpha=0.99, eps=1e-5, **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _hyperparameters.psgld(alpha, eps, type(self).__name__)


# --- contour SG-MCMC (CSGLD / CSGHMC) ---------------------------------------------------------------
class ContourState(SGMCMCState):
    """:class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCState` of :class:`CSGLD`/:class:`CSGHMC`, with the
    contour quantities of the rule state (:class:`ppl_sgmcmc.rules.csgld.CSGLDState`) readable as
    top-level attributes, so that ``MCMC`` collects them under clean names and ArviZ puts them in
    ``sample_stats``: ``log_weight`` and ``partition`` (collected by default), ``multiplier``,
    ``theta`` (the partition weights, ``(m,)`` per chain), ``energy_min``, ``energy_gap``.

    **Example** (any of them can be collected by name with ``extra_fields``; the grid here is explicit)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> kernel = CSGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.1, num_partitions=10,
        ...                energy_min=0.0, energy_gap=0.5)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=200, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(1), init_params={"x": jnp.zeros(2)}, extra_fields=("multiplier", "theta"))
        >>> {name: value.shape for name, value in sorted(mcmc.get_extra_fields().items())}
        {'diverging': (200,), 'log_weight': (200,), 'multiplier': (200,), 'partition': (200,), 'theta': (200, 10)}
        >>> state = mcmc.last_state
        >>> type(state).__name__, float(state.energy_min), float(state.energy_gap), round(float(state.theta.sum()), 3)
        ('ContourState', 0.0, 0.5, 1.0)
        >>> 0 <= int(state.partition) < 10, bool(jnp.isfinite(state.log_weight) & jnp.isfinite(state.multiplier))
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

    With the energy grid ``u_min + k Δu`` (``m`` bins, 0-based bin ``j`` of the minibatch energy
    ``Ũ_t(x)``, ``j⁻ = max(j-1, 0)``), at each step::

        θ(i) ← θ(i) + ω_k θ(j)^ζ (1[i = j] - θ(i))                        (stochastic approximation)
        x ← x - h [1 + (ζ τ / Δu)(log θ(j) - log θ(j⁻))] ∇Ũ_t(x) + sqrt(2 h τ) ξ

    and the sample ``x`` gets the log weight ``ζ log Ψ_θ(Ũ_t(x))`` (eq. (5) of the paper, log ``θ``
    interpolated linearly across the bin) or, with ``weight="bin"``, the paper's ``ζ log θ(j)``.
    The full rule, and why each sample is the point of its own gradient, are in
    :mod:`ppl_sgmcmc.rules.csgld`. Only the minibatch energy that comes with the gradient is used.

    **Output.** Every draw carries ``log_weight`` and ``partition`` (the 0-based bin) as extra fields
    (collected by default), which ``arviz.from_numpyro`` and
    :func:`~ppl_sgmcmc.numpyro.to_inference_data` put in ``sample_stats``. Weighted expectations and
    importance resampling into ordinary draws: :mod:`ppl_sgmcmc.importance`. The learned ``θ`` is
    in the state, ``mcmc.last_state.theta`` (with ``energy_min`` and ``energy_gap``); a run resumed from
    ``mcmc.post_warmup_state = mcmc.last_state`` continues with it.

    **Energy grid.** ``energy_min="auto"`` (default) sets ``u_min`` to the smallest minibatch energy of
    the first ``calibration_steps`` steps (default: the first half of the warm-up); ``energy_gap="auto"``
    (default) sets ``Δu`` to the standard deviation of the minibatch energies over the second half of
    those steps (the energy's per-step fluctuation). While the grid is calibrated ``θ`` stays uniform,
    so the chain is plain SGLD. Both need ``num_warmup > 0``; the warm-up should be long enough that
    the chain has reached its typical set within its first quarter. A ``u_min`` below every energy
    the chain visits leaves the lowest bin empty: its ``θ`` decays to 0 and the multiplier explodes
    in the first occupied bin; a ``Δu`` much finer than the energy's fluctuation amplifies the noise
    of ``log θ`` (see ``ALGORITHMS.md``). The grid, ``m Δu`` above ``u_min``, should reach well over the
    energy barriers between modes and over the energies the flattened chain climbs to: the last bin
    collects every higher energy, its ``θ`` exceeds its neighbour's, and the multiplier there throws
    the chain back down (on a 2-d normal with ``m Δu = 6`` that distorted the learned ``θ`` of the upper
    bins by factors of 2-5; with ``m Δu = 20`` they matched). Each chain calibrates its own grid.

    :param step_size: ``h`` (the paper's ``ε``), a float or a schedule. The flattened drift's multiplier
        (up to ``1 + ζτ/Δu·|Δ log θ|``) amplifies SGLD's discretisation bias, and the weights do not correct
        it: on N(0, 1) with 20 bins the weighted ``E[x²]`` was 0.92 at ``h = 0.1`` and 0.96-1.04 at
        ``h = 0.02``; check that importance-weighted results are stable when ``h`` is halved.
    :param int num_partitions: ``m >= 2`` energy bins (default 100).
    :param energy_gap: ``Δu > 0``, or ``"auto"`` (default).
    :param energy_min: ``u_min``, or ``"auto"`` (default).
    :param float zeta: the flattening strength ``ζ >= 0`` (default 0.75, the paper's); ``ζ = 0`` is SGLD.
    :param sa_step_size: ``ω_k``, a float in (0, 1) or a schedule of the 1-based update count ``k``;
        default ``1 / (k^0.6 + 100)``.
    :param str weight: ``"interpolated"`` (default; the exact weight of the density sampled) or ``"bin"``
        (the paper's ``θ(j)^ζ``; at coarse grids it was measured to bias mode masses).
    :param calibration_steps: the steps that calibrate an ``"auto"`` grid (default: half the warm-up steps,
        ``num_warmup × steps_per_sample / 2``); at least 2 and at most the warm-up.
    :param str adapt_theta: ``"always"`` (default, the paper's algorithm: ``θ`` keeps learning while
        sampling) or ``"warmup"`` (``θ`` is frozen after the warm-up). Adapting ``θ`` while sampling
        biases the weighted estimates by ``O(ω_k)``: on the paper's mixture (``h = 0.1``, ``Δu = 1``),
        the mass of the left mode (truth 0.40) came out 0.420 ± 0.008 after 1.5e5 steps and
        0.411 ± 0.003 after 6e5. With ``θ`` frozen the draws are an ordinary Markov chain on the
        flattened density and the weights are exact for it (0.407 ± 0.017 and 0.397 ± 0.014 on two seeds
        after 1.5e5 steps), at the
        price of a ``θ`` learned from the warm-up only. ``"never"``: ``θ`` stays at ``initial_theta``
        (required) for the whole run: the paper's KSGLD, with ``θ`` known.
    :param initial_theta: ``θ``'s starting value instead of the uniform one: ``m`` positive finite weights
        of the bins of the given grid (normalised to sum to 1). Needs explicit ``energy_min`` and
        ``energy_gap`` (a weight vector means nothing on a grid chosen later).
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`.

    **Example** (the two-mode target of the paper, ``0.4 N(-6, 1) + 0.6 N(4, 1)``)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.importance import weighted_mean
        >>> def energy(z):
        ...     x = z["x"]
        ...     return -jnp.logaddexp(jnp.log(0.4) - (x + 6) ** 2 / 2, jnp.log(0.6) - (x - 4) ** 2 / 2)
        >>> kernel = CSGLD(potential_fn=energy, step_size=0.1, num_partitions=50, energy_gap=1.0,
        ...                steps_per_sample=10)
        >>> mcmc = MCMC(kernel, num_warmup=500, num_samples=5000, num_chains=4, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.full(4, 4.0)})
        >>> import arviz as az
        >>> idata = az.from_numpyro(mcmc)
        >>> sorted(idata.sample_stats.data_vars)
        ['diverging', 'log_weight', 'partition']
        >>> bool(abs(float(weighted_mean(idata)["x"])) < 1.5)  # the true mean is 0; SGLD stays near 4
        True
    """

    rule = csgld
    integrator = "langevin"

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
        self._calibration_steps, self._adaptation_steps = 0, None  # set from the warm-up by `init`

    @property
    def auto_grid(self):
        """Whether the energy grid is chosen from the warm-up: ``True`` unless both ``energy_min`` and
        ``energy_gap`` are given.

        **Example**::

            >>> CSGLD(potential_fn=lambda z: 0.0, step_size=0.1, energy_min=0.0).auto_grid  # Δu is still "auto"
            True
            >>> CSGLD(potential_fn=lambda z: 0.0, step_size=0.1, energy_min=0.0, energy_gap=1.0).auto_grid
            False
        """
        return self._contour.auto_grid

    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size``: ``temperature``; the contour arguments
        ``num_partitions``, ``energy_min``, ``energy_gap`` (``None`` while ``"auto"``), ``zeta``,
        ``sa_step_size`` and ``weight``; the windows ``calibration_steps`` and ``adaptation_steps``
        (``None``: ``θ`` never stops learning), which :meth:`init` fixes from the warm-up; and the
        ``integrator`` (``"langevin"``, or :class:`CSGHMC`'s).

        **Example** (an ``"auto"`` grid, calibrated over half the warm-up: 50 draws × 4 steps / 2)::

            >>> import jax, jax.numpy as jnp
            >>> kernel = CSGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.1, steps_per_sample=4)
            >>> _ = kernel.init(jax.random.PRNGKey(0), num_warmup=50, init_params={"x": jnp.zeros(2)})
            >>> hp = kernel.hyperparameters()
            >>> hp["energy_min"], hp["calibration_steps"], hp["adaptation_steps"], hp["integrator"]
            (None, 100, None, 'langevin')
        """
        contour = self._contour.rule_kwargs(self._calibration_steps, self._adaptation_steps)
        return dict(super().hyperparameters(), **contour, integrator=self.integrator)

    @property
    def default_fields(self):
        """The state fields ``MCMC`` collects unless told otherwise: the base class's ``z`` and
        ``diverging``, and each draw's ``log_weight`` and ``partition`` (see :class:`ContourState`).

        **Example**::

            >>> CSGLD(potential_fn=lambda z: 0.0, step_size=0.1).default_fields
            ('z', 'diverging', 'log_weight', 'partition')
        """
        return ("z", "diverging", "log_weight", "partition")

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        """As :meth:`SGMCMCKernel.init <ppl_sgmcmc.numpyro.kernel.SGMCMCKernel.init>`, after fixing the
        grid's calibration window and ``θ``'s adaptation window from ``num_warmup × steps_per_sample``.

        :return: the :class:`ContourState` at step 0, with ``θ`` uniform or ``initial_theta``.
        :raises ValueError: if the warm-up is too short for an ``"auto"`` grid, for ``calibration_steps``
            or for ``adapt_theta="warmup"``.

        **Example** (a given ``initial_theta`` is normalised; an ``"auto"`` grid needs a warm-up)::

            >>> import jax, jax.numpy as jnp
            >>> def energy(z):
            ...     return jnp.sum(jnp.abs(z["x"]))
            >>> kernel = CSGLD(potential_fn=energy, step_size=0.1, num_partitions=4, energy_min=0.0,
            ...                energy_gap=1.0, initial_theta=[1.0, 1.0, 2.0, 4.0])
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.zeros(2)})
            >>> type(state).__name__, state.theta.tolist()
            ('ContourState', [0.125, 0.125, 0.25, 0.5])
            >>> CSGLD(potential_fn=energy, step_size=0.1).init(jax.random.PRNGKey(0), num_warmup=0,
            ...                                                  init_params={"x": jnp.zeros(2)})
            Traceback (most recent call last):
                ...
            ValueError: CSGLD: `energy_min`/`energy_gap` "auto" choose the energy grid during the warm-up, but ...
        """
        self._calibration_steps, self._adaptation_steps = self._contour.windows(
            num_warmup, self._steps_per_sample, "num_warmup", type(self).__name__
        )
        return super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)

    def _init_state(self, init_params, rng_key, model_args, model_kwargs):
        state = ContourState(*super()._init_state(init_params, rng_key, model_args, model_kwargs))
        initial_theta = self._contour.initial_theta
        if initial_theta is None:
            return state
        theta = state.rule_state.theta
        return state._replace(rule_state=state.rule_state._replace(theta=jnp.asarray(initial_theta, theta.dtype)))

    def _step(self, state, model_args, model_kwargs):
        return ContourState(*super()._step(state, model_args, model_kwargs))

    def diagnostics(self, state):
        """The diagnostics string of one state: the base class's (``Ũ_t``, ``h``, rejected steps), the
        sample's 0-based energy bin and its gradient multiplier.

        **Example** (the first draw is the starting point, ``Ũ = 0.7``: bin 1 of ``Δu = 0.5``)::

            >>> import jax, jax.numpy as jnp
            >>> kernel = CSGLD(potential_fn=lambda z: jnp.sum(jnp.abs(z["x"])), step_size=0.1, num_partitions=10,
            ...                energy_min=0.0, energy_gap=0.5)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.array([0.3, -0.4])})
            >>> kernel.diagnostics(jax.jit(kernel.sample)(state, (), {}))
            'Ũ_t 0.7, h 1.00e-01, div 0, bin 1, mult 1.03'
        """
        rule = state.rule_state
        return f"{super().diagnostics(state)}, bin {int(rule.partition)}, mult {float(rule.multiplier):.3g}"


class CSGHMC(CSGLD):
    """Contour SGHMC (Deng, Lin & Liang, NeurIPS 2020, §4.2): the energy flattening and importance
    weights of :class:`CSGLD` inside the SGHMC momentum integrator of :class:`SGHMC` (identity mass),
    the gradient ``∇Ũ_t`` replaced by ``[1 + (ζ τ / Δu)(log θ(j) - log θ(j⁻))] ∇Ũ_t``.

    With the splitting integrator the gradient, and so the energy and the weight, is taken at the
    midpoint ``θ + (h/2) p``: the draws are those midpoints (see :mod:`ppl_sgmcmc.rules.csgld`).

    :param step_size: ``h``, a float or a schedule. In the paper's SGD-with-momentum terms, learning
        rate ``h²`` and momentum ``1 - A h`` (the paper uses momentum 0.9).
    :param friction: ``A > 0`` (default 1.0), also the injected noise's diffusion.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.

    The contour arguments (``num_partitions``, ``energy_gap``, ``energy_min``, ``zeta``, ``sa_step_size``,
    ``weight``, ``calibration_steps``, ``adapt_theta``, ``initial_theta``) are those of :class:`CSGLD`.

    **Example**::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> kernel = CSGHMC(potential_fn=lambda z: (z["x"] ** 2 - 4) ** 2 / 2, step_size=0.1, num_partitions=20)
        >>> mcmc = MCMC(kernel, num_warmup=1000, num_samples=1000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.array(2.0)})
        >>> mcmc.get_extra_fields()["log_weight"].shape, mcmc.last_state.theta.shape
        ((1000,), (20,))
    """

    def __init__(self, model=None, potential_fn=None, *, step_size, friction=1.0, integrator="splitting", **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _hyperparameters.sghmc(friction, integrator, type(self).__name__)
        self.integrator = self._options["integrator"]


class SGFS(SGMCMCKernel):
    """Stochastic gradient Fisher scoring (Ahn, Korattikara & Welling, ICML 2012), Algorithm 1.

    With the minibatch's per-datum scores ``g_i = ∇ log p(x_i | θ)`` (``n`` of them, mean ``ḡ``), ``N`` the
    subsampled plate's size, ``γ = (n + N)/n`` and step size ``ε``::

        V_t = (1/(n-1)) Σ_i (g_i - ḡ)(g_i - ḡ)ᵀ
        Î_t = (1 - κ_t) Î_{t-1} + κ_t V_t,      κ_t = 1/t
        θ ← θ + 2 (γ N Î_t + 4B/ε)⁻¹ (∇ log p(θ) + N ḡ + η),      η ~ N(0, 4B/ε)

    ``∇ log p(θ) + N ḡ = -∇Ũ_t(θ)``, in unconstrained space. The paper reports ``α = 2/sqrt(ε)``:
    ``α = 0`` (``ε = ∞``) adds no noise beyond the minibatch's and samples the Bernstein–von Mises
    Gaussian ``N(θ₀, I_N⁻¹)`` at the fastest mixing (one step moves ``2/γ ≈ 2n/N`` of a Fisher-scoring
    step towards the mode); larger ``α`` takes smaller steps and, as ``ε → 0``, becomes SGLD
    preconditioned by ``B⁻¹`` (exact for non-Gaussian posteriors, slow). Give ``step_size=ε`` or
    ``alpha=α``.

    The per-datum scores come from the model: each datum of the minibatch is traced alone (its plate
    holding one index) and ``jax.vmap`` of ``jax.grad`` runs over the minibatch. The model needs exactly one
    plate with ``subsample_size = n ≥ 2`` around its observed sites (the paper recommends ``n ≥ 100`` so
    that the minibatch gradient is Gaussian).

    **Fisher state.** ``Î_t`` is part of the kernel state, ``state.rule_state`` (a
    :class:`~ppl_sgmcmc.rules.sgfs.SGFSState`: ``fisher``, ``count = 1/κ_t``, ``t``), so a run resumed from
    ``mcmc.last_state`` continues the same average, and ``mcmc.last_state.rule_state.fisher`` holds the
    estimate after a run (``(d, d)``, or ``(d,)`` for the diagonal form; one per chain with several
    chains): ``γ N Î`` approximates the posterior precision of the unconstrained, flattened latents.

    **Warm-up.** ``κ_t = 1/t`` averages over the whole run, and scores far from the mode are much larger
    than at the mode, so a chain started far away would keep an inflated ``Î`` and nearly freeze. During
    warm-up (``num_warmup × steps_per_sample`` steps) the average therefore forgets,
    ``κ_t = 1/min(t, fisher_window)``; after
    warm-up the paper's ``1/t`` averaging takes over, counting the warm-up estimate as
    ``min(num_warmup, fisher_window)`` minibatches. ``fisher_window=None`` (or ``num_warmup=0``) is
    the paper's ``κ_t = 1/t`` throughout. Warm-up should span several relaxation times, ``≫ N/n`` steps.

    :param step_size: ``ε > 0``, a float, ``float("inf")`` (``α = 0``) or a schedule ``t -> ε_t``.
    :param alpha: instead of ``step_size``, the paper's ``α = 2/sqrt(ε) ≥ 0``.
    :param fisher: ``"full"`` (SGFS-f, default): a ``d×d`` ``Î`` and a Cholesky solve, O(n d² + d³) per
        step and d² memory, allowed up to ``max_full_dim`` parameters; or ``"diagonal"`` (SGFS-d): only
        ``diag Î``, O(n d). SGFS-d mixes fast but, at large ``ε``, samples a too narrow Gaussian where the
        posterior is correlated (its means are fine); at small ``ε`` it is preconditioned SGLD.
    :param B: the noise matrix, any symmetric positive-definite ``B``: ``"fisher"`` (default, the paper's
        ``B = γ N Î_t``), ``"identity"``, a positive scalar, a vector of ``d`` positive diagonal entries,
        or (full form) a ``d×d`` matrix; ``d`` counts the unconstrained latents, flattened in the order of
        :func:`jax.flatten_util.ravel_pytree` (site names sorted).
    :param ridge: the preconditioner uses ``Î + ridge·Diag(Î)`` (default ``1e-4``; 0 for Algorithm 1
        literally): keeps the Cholesky factor defined. If ``n ≤ d``, ``Î`` is singular for the first
        ``~d/n`` steps: raise it to 1e-2 or more (initialisation warns) or use ``fisher="diagonal"``. Every latent
        must enter the likelihood (its Fisher must be positive) unless ``B`` is fixed and ``ε`` finite.
    :param fisher_window: the warm-up averaging window (default 100), or ``None``.
    :param max_full_dim: the largest ``d`` for ``fisher="full"`` (default
        :data:`~ppl_sgmcmc.rules.sgfs.MAX_FULL_DIM` = 2000); above it, initialisation raises and points
        to ``fisher="diagonal"``. Measured on a busy 2-core CPU, logistic regression, n = 500: d = 1000
        ~60 ms a step, d = 2000 ~0.4 s (SGFS-d: ~3 ms; SGLD: 0.4 ms).

    **CPU note.** JAX computes the Cholesky factor with the LAPACK of SciPy's OpenBLAS, whose threads
    compete with XLA's: on a loaded machine, d = 1000 steps took 0.2-1 s instead of ~60 ms until
    ``OPENBLAS_NUM_THREADS=1`` was set in the environment (before Python starts).

    ``temperature`` must stay 1: Algorithm 1 has none. Other arguments: see
    :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`.

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
        and ``max_full_dim`` as validated, ``data_size`` (``N``, the subsampled plate's size) and
        ``num_warmup`` (in steps); no ``temperature``. The last two come from :meth:`init`.

        **Example** (``num_warmup`` counts steps: 50 draws × 2)::

            >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> def model(x):
            ...     loc = numpyro.sample("loc", dist.Normal(0, 10))
            ...     scale = numpyro.sample("scale", dist.HalfNormal(5))
            ...     with numpyro.plate("data", x.shape[0], subsample_size=50):
            ...         numpyro.sample("x", dist.Normal(loc, scale), obs=numpyro.subsample(x, event_dim=0))
            >>> kernel = SGFS(model, step_size=1.0, fisher="diagonal", steps_per_sample=2)
            >>> init_params = {"loc": jnp.array(0.0), "scale": jnp.array(0.0)}  # unconstrained: scale = 1
            >>> _ = kernel.init(jax.random.PRNGKey(0), 50, init_params, model_args=(jnp.ones(500),))
            >>> hp = kernel.hyperparameters()
            >>> hp["fisher"], hp["data_size"], hp["num_warmup"], "temperature" in hp
            ('diagonal', 500, 100, False)
        """
        num_warmup = self._num_warmup * self._steps_per_sample  # in steps
        return dict(self._options, data_size=self._target.data_size, num_warmup=num_warmup)

    def _make_target(self, model_args, model_kwargs, rng_key):
        target = super()._make_target(model_args, model_kwargs, rng_key)
        if getattr(self.rule, "PER_EXAMPLE_SCORES", False):
            target.enable_per_example_scores()  # checks the plate before anything is compiled
        return target

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        """As :meth:`SGMCMCKernel.init <ppl_sgmcmc.numpyro.kernel.SGMCMCKernel.init>`, after recording
        ``num_warmup`` (the Fisher average's warm-up window); checks the model's plate, and ``fisher``,
        ``B`` and ``max_full_dim`` against its dimension ``d``, and warns when a full Fisher estimate
        starts singular (``n ≤ d`` with a small ``ridge``).

        :return: the :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCState` at step 0; its ``rule_state`` is an
            :class:`~ppl_sgmcmc.rules.sgfs.SGFSState` with ``Î = 0``.
        :raises ValueError: naming the fix, if the model or the options do not fit.

        **Example** (a ``B`` for three parameters, on a model with two)::

            >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> def model(X, counts):
            ...     w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
            ...     with numpyro.plate("rows", X.shape[0], subsample_size=10):
            ...         rate = jnp.exp(numpyro.subsample(X, event_dim=1) @ w)
            ...         numpyro.sample("counts", dist.Poisson(rate), obs=numpyro.subsample(counts, event_dim=0))
            >>> kernel = SGFS(model, alpha=0.0, B=[1.0, 2.0, 3.0])
            >>> data = (jnp.ones((40, 2)), jnp.ones(40))
            >>> kernel.init(jax.random.PRNGKey(0), num_warmup=10, init_params={"w": jnp.zeros(2)}, model_args=data)
            Traceback (most recent call last):
                ...
            ValueError: SGFS: B of shape (3,) does not fit the 2 parameters: give a scalar, a vector of 2 ...
        """
        self._num_warmup = int(num_warmup)
        try:
            state = super().init(rng_key, num_warmup, init_params, model_args, model_kwargs)
        except ValueError as err:  # the base class rewords errors of the first step; these are ours
            cause = err if isinstance(err, sgfs.SGFSConfigError) else err.__cause__
            if isinstance(cause, sgfs.SGFSConfigError):
                raise ValueError(f"{type(self).__name__}: {cause}") from None
            raise
        d = state.rule_state.fisher.shape[-1]
        _hyperparameters.sgfs_warn_singular(self._target.plate_sizes, d, self._options, type(self).__name__)
        return state


def _is_positive(support):
    """Whether ``support`` is ``constraints.positive``, possibly made independent over event dimensions."""
    from numpyro.distributions import constraints

    while isinstance(support, constraints._IndependentConstraint):
        support = support.base_constraint
    return support is constraints.positive


class SGRLD(SGMCMCKernel):
    """Stochastic gradient Riemannian Langevin dynamics (Patterson & Teh, NeurIPS 2013) with the
    expanded-mean preconditioner ``G(θ) = diag(θ)`` (the inverse metric) and mirroring, for positive latents::

        θ ← | θ - h (θ ⊙ ∇Ũ_t(θ) - τ) + sqrt(2 h τ θ) ⊙ ζ |

    The chain moves the latents in their own positive space: ``θ`` and ``∇Ũ_t`` are those of the model
    as declared, without a log transform or its Jacobian. Every latent must have support
    ``constraints.positive`` (``Gamma``, ``Exponential``, ``HalfNormal``, ``LogNormal``, ...); a model
    with another latent gets a ``ValueError`` naming it.

    This is the sampler of Patterson & Teh for LDA in the expanded-mean parametrisation: topics
    ``θ_kw ~ Gamma(β, 1)``, ``π_k = θ_k / Σ_w θ_kw``, the topic assignments as local Gibbs sites
    (``gibbs_sites=["z"]``), where the update is ``θ_kw ← |θ_kw + h (β - θ_kw + (D/|S_t|) Σ_d
    E[n_dkw - π_kw n_dk·]) + sqrt(2hθ_kw) ζ|`` (``models/lda.py``).

    With ``potential_fn`` the energy is taken as a function of the positive values themselves, and
    ``init_params`` must be positive.

    :param step_size: ``h``, a float or a schedule.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`.

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

    rule = sgrld
    constrained = True

    def _make_target(self, model_args, model_kwargs, rng_key):
        target = super()._make_target(model_args, model_kwargs, rng_key)
        _checks.positive_latents(target.latent_supports, _is_positive, type(self).__name__)
        return target
