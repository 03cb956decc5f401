"""The SG-MCMC algorithms as Pyro kernels: each names its update rule and validates its
hyper-parameters; :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel` does the rest.

The names, arguments, defaults and update rules are those of :mod:`ppl_sgmcmc.numpyro.kernels`:
both backends call the same functions of :mod:`ppl_sgmcmc.rules`, here on torch tensors."""

from ppl_sgmcmc import _checks
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel
from ppl_sgmcmc.rules import psgld, sghmc, sgld, sgnht

INTEGRATORS = ("splitting", "euler")


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
    """

    rule = sghmc

    def __init__(self, model=None, potential_fn=None, *, step_size, friction=1.0, integrator="splitting", **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._friction = _checks.positive("friction", friction, type(self).__name__)
        self._integrator = _checks.choice("integrator", integrator, INTEGRATORS, type(self).__name__)

    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size``."""
        return dict(super().hyperparameters(), friction=self._friction, integrator=self._integrator)


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
        name = type(self).__name__
        self._diffusion = _checks.positive("diffusion", diffusion, name)
        self._multivariate = _checks.choice("thermostat", thermostat, ("multivariate", "scalar"), name) == "multivariate"
        self._integrator = _checks.choice("integrator", integrator, INTEGRATORS, name)

    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size``."""
        return dict(
            super().hyperparameters(),
            diffusion=self._diffusion,
            multivariate=self._multivariate,
            integrator=self._integrator,
        )

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
    """

    rule = psgld
    needs_score = True

    def __init__(self, model=None, potential_fn=None, *, step_size, alpha=0.99, eps=1e-5, **kwargs):
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        name = type(self).__name__
        self._alpha = _checks.in_unit_interval("alpha", alpha, name)
        self._eps = _checks.positive("eps", eps, name)

    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size``."""
        return dict(super().hyperparameters(), alpha=self._alpha, eps=self._eps)
