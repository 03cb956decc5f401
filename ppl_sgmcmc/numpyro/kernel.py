"""The base class of the NumPyro SG-MCMC kernels: state, step, divergence handling, diagnostics.

An algorithm subclass names its update rule (a module of :mod:`ppl_sgmcmc.rules`) and its
validated hyper-parameters; everything else is here.
"""

import contextlib
import os
import threading
import warnings
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax, random, vmap
from jax.flatten_util import ravel_pytree
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from ppl_sgmcmc import _checks, _model_checks, adaptation, health, noise
from ppl_sgmcmc.algorithms import Algorithm
from ppl_sgmcmc.numpyro import gibbs, prng, sharding, warmup
from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.numpyro.potential import (
    ModelTarget,
    PotentialTarget,
    ProgramCache,
    as_jax_arrays,
    model_errors,
    ravel_into,
    split_arrays,
)
from ppl_sgmcmc.rules import has_momentum, refresh_momentum


class SGMCMCState(NamedTuple):
    """State of an SG-MCMC chain.

    - **i**: the number of steps taken (warm-up included); the step-size schedule is ``h_i``.
    - **z**: the latent values in unconstrained space (the kernel's ``sample_field``).
    - **rule_state**: the update rule's auxiliary state, e.g. ``momentum`` and ``thermostat``
      (collect them with ``extra_fields=("rule_state.thermostat",)``).
    - **potential_energy**: the *minibatch estimate* ``Ũ_t`` at the point where the step took its
      gradient; noisy and scaled to the full data, not the exact potential ``U``.
    - **step_size**: the step size ``h_i`` this step used (the tuned one when ``step_size`` was not given), in
      the coordinates of the preconditioner when one is adapted: a new kernel takes it back with its
      preconditioner (:meth:`~ppl_sgmcmc.algorithms.Algorithm.tuned_options`), not alone.
    - **diverging**: whether this step's gradient, its new state or its step size was non-finite (or the
      step size not positive); the step was then rejected: the chain kept its rule state, except that a
      momentum is redrawn (:func:`ppl_sgmcmc.rules.refresh_momentum`), and its position, except that a rule
      that takes its gradient at the position returns to ``finite_position``.
    - **num_diverging**: the number of rejected steps so far.
    - **batch_state**: where the minibatch sampler is (see :mod:`~ppl_sgmcmc.numpyro.minibatch`).
    - **gradient_state**: the gradient estimator's state (see :mod:`ppl_sgmcmc.gradients`).
    - **finite_position**: where the last accepted step started (flat; its stochastic gradient was finite):
      where a rejected step of SGLD, pSGLD, SGFS or SGRLD returns.
    - **adapt_state**: the warm-up's adaptation (:class:`ppl_sgmcmc.adaptation.AdaptState`: the
      ``preconditioner`` and the tuned ``step_size``, frozen after the warm-up), or, when nothing adapts,
      an empty :class:`~ppl_sgmcmc.adaptation.NoAdaptation`.
    - **noise**: the running estimate of the gradient noise (:class:`ppl_sgmcmc.noise.NoiseState`).
    - **noise_ratio**: the noise ratio of the draw's last step, ``h max_k c_k V_kk / (2τ)`` (:mod:`ppl_sgmcmc.noise`):
      about the relative variance the gradient noise adds; collected by default (ArviZ ``sample_stats``).
    - **noise_variance** (a property, not a field): the trace of the running noise estimate,
      ``Σ_k c_k V_kk`` (:func:`ppl_sgmcmc.noise.trace`), which a variance-reduced gradient lowers whatever the
      step size; collected by default.
    - **health**: the known failures the chain's checks found (:class:`ppl_sgmcmc.health.HealthState`),
      reported by :meth:`SGMCMCKernel.report_health`.
    - **rng_key**: the random key for the next step.

    **Example** (the state :meth:`SGMCMCKernel.init` returns)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
        >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(2)})
        >>> int(state.i), state.z["x"].tolist(), float(state.potential_energy), bool(state.diverging)
        (0, [1.0, 1.0], 1.0, False)
    """

    i: jax.Array
    z: dict
    rule_state: NamedTuple
    potential_energy: jax.Array
    step_size: jax.Array
    diverging: jax.Array
    num_diverging: jax.Array
    batch_state: NamedTuple
    gradient_state: Any
    finite_position: jax.Array
    adapt_state: Any
    noise: noise.NoiseState
    noise_ratio: jax.Array
    health: health.HealthState
    rng_key: jax.Array

    @property
    def noise_variance(self):
        """The trace of the running gradient-noise estimate (:func:`ppl_sgmcmc.noise.trace`)."""
        return noise.trace(self.noise)

    def __getitem__(self, key):
        # numpyro's `extra_fields` falls back to `state[name]` for a name that is not an attribute
        if isinstance(key, str):
            raise KeyError(_unknown_field(self, key))
        return tuple.__getitem__(self, key)


def _unknown_field(state, name):
    """The message for an ``extra_fields`` entry that names no field of an SG-MCMC state."""
    rule_fields = ", ".join(f"rule_state.{field}" for field in getattr(state.rule_state, "_fields", ()))
    hmc = " It is HMC's: an SG-MCMC step has no Metropolis test." if name in _HMC_FIELDS else ""
    return (
        f"{type(state).__name__} has no field {name!r}.{hmc} Collectable fields: {', '.join(state._fields)}"
        + (f", {rule_fields}" if rule_fields else "")
        + "."
    )


_HMC_FIELDS = ("accept_prob", "mean_accept_prob", "num_steps", "adapt_state", "energy", "trajectory_length")


def _draw_keys(rng_key, size):
    """The keys with which the ``size`` steps from a state with key ``rng_key`` draw their minibatches (each
    step splits its key into the next step's key, its draw's key and its noise's key: see ``_step``)."""

    def body(key, _):
        key, key_draw, _ = prng.split(key, 3)
        return key, key_draw

    return lax.scan(body, rng_key, None, length=size)[1]


def _check_host_platform(kernel):
    """Refuse to start without JAX's CPU platform (``JAX_PLATFORMS=cuda``): the chain's health report, the
    in-loop progress bar and streamed rows are host callbacks, which JAX runs through it; without it the run
    fails inside the compiled loop with an error that names no setting."""
    try:
        jax.devices("cpu")
    except RuntimeError:
        raise RuntimeError(
            f"{kernel}: JAX runs without its CPU platform (JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}), "
            "but the kernel reports the chain's health from inside the compiled loop through host callbacks, "
            "which need it. Add it: JAX_PLATFORMS=cuda,cpu (or leave JAX_PLATFORMS unset; "
            "`numpyro.set_platform('gpu')` keeps it)."
        ) from None


#: Which step the kernels compile. ``"accelerator"``: the step after the warm-up has no branch on device data and no
#: host call (on a GPU, XLA copies a conditional's predicate to the host and the device waits for it at every step):
#: the health checks are evaluated at every step and kept where due (selects), a rejected step's momentum is redrawn
#: by a select, and :class:`ppl_sgmcmc.numpyro.MCMC` compiles the steps after the warm-up without the warm-up's
#: adaptation and draws its progress bar once per chunk of draws. ``"cpu"``: rarely taken branches, which cost
#: less than the work they skip on the CPU. ``None`` (the default): ``"accelerator"`` when the model's data (else
#: JAX's default backend) is not on the CPU; decided when a chain starts (:meth:`SGMCMCKernel.init`).
STEP_PATH: str | None = None


def _accelerator_step(arrays: Any) -> bool:
    """Whether a chain started with the model arguments ``arrays`` compiles the accelerator step (see
    :data:`STEP_PATH`)."""
    if STEP_PATH is not None:
        if STEP_PATH not in ("accelerator", "cpu"):
            raise ValueError(f"ppl_sgmcmc.numpyro.kernel.STEP_PATH is {STEP_PATH!r}; set it to 'accelerator', 'cpu' "
                             "or None (by the data's device).")  # fmt: skip
        return STEP_PATH == "accelerator"
    for leaf in jax.tree.leaves(arrays):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            return next(iter(leaf.devices())).platform != "cpu"
    return jax.default_backend() != "cpu"


def _all_finite(tree):
    """Whether every entry of every leaf is finite, by one reduction: a sum is finite only if its terms are."""
    return jnp.isfinite(sum(jnp.sum(x) for x in jax.tree.leaves(tree)))


def _refresh_noise(key_noise, like):
    """The standard normal draw that redraws the momentum of a rejected step: a key folded from the step's
    noise key, so the draws of accepted steps are those of a kernel without the redraw."""
    return random.normal(random.fold_in(prng.unrolled(key_noise), 1), like.shape, like.dtype)


#: Held while a kernel runs a model through NumPyro's handlers (``init``, the traced step, ``postprocess_fn``):
#: NumPyro keeps one handler stack per process, so two threads tracing models at once would see each other's
#: handlers (a wrong site's value, a plate of the other model). Runs of these kernels in several threads then
#: take turns to trace; the compiled steps run concurrently. Other NumPyro code run meanwhile in another thread
#: (NUTS, Predictive, SVI) does not take it (see the user guide, "Multiple chains": "Threads").
_TRACING = threading.RLock()

_VERDICT_NOTED = False  # whether this process was told that `numpyro.infer.MCMC` runs get no verdict


def _start_keys(rng_key):
    """A chain's start splits its key into: the minibatch sampler's, the rule's first noise, the first minibatch's,
    the chain's own, and the mode search's, the Hessian's and the noise probe's."""
    key_batch, key_noise, key_draw, rng_key = random.split(rng_key, 4)
    key_mode, key_hessian, key_probe = random.split(random.fold_in(key_draw, 1), 3)
    return key_batch, key_noise, key_draw, rng_key, key_mode, key_hessian, key_probe


def _jitted_gradient(target, unravel, merge):
    """``(flat, batch, data) -> target.gradient(flat, unravel, batch, *merge(data))``, jitted. JAX traces a jitted
    function once per argument shapes and reuses its jaxpr, also inside other traces, so the model is traced once
    for all the places that take a minibatch gradient (the stages of the start, the step); XLA inlines the call, so
    a compiled program computes what it would without it."""
    return jax.jit(lambda flat, batch, data: target.gradient(flat, unravel, batch, *merge(data)))


# the compiled start stages of the last models started (`SGMCMCKernel._start_stage`)
_START_STAGES = ProgramCache(size=16)


def _note_no_verdict(kernel):
    """Say once per process that a run driven by anything but a driver that judges it (``numpyro.infer.MCMC``,
    which tells a kernel nothing when its run ends) gets no end-of-run verdict, and how to get one."""
    global _VERDICT_NOTED
    if _VERDICT_NOTED or kernel._judged_after_run or not kernel.samples_posterior:
        return
    _VERDICT_NOTED = True
    warnings.warn(
        f"{kernel.name}: `numpyro.infer.MCMC` does not tell a kernel when its run ends, so its runs get no end-of-run "
        "verdict (whether the chains agree, hold enough effective draws and left no burn-in in the draws: "
        "ppl_sgmcmc.verdict). Run with `ppl_sgmcmc.numpyro.MCMC` (the same class and arguments, with the verdict), "
        "or call `ppl_sgmcmc.diagnostics.verdict(mcmc)` after the run. (Said once per process.)",
        UserWarning, stacklevel=3,
    )  # fmt: skip


class SGMCMCKernel(Algorithm, MCMCKernel):
    """Base class: an SG-MCMC algorithm (:mod:`ppl_sgmcmc.algorithms`) as a :class:`numpyro.infer.MCMCKernel`.

    Each call of :meth:`sample` draws a fresh minibatch for every subsampled plate of the model and
    applies the algorithm's update rule once per step, with one stochastic gradient ``∇Ũ_t``. Warm-up
    draws are discarded; without a given ``step_size`` the warm-up adapts the step size and the
    preconditioner (:mod:`ppl_sgmcmc.adaptation`), otherwise it is burn-in (a schedule runs on through it).
    The arguments are those of :class:`~ppl_sgmcmc.algorithms.Algorithm` (``init_strategy`` defaults
    to NumPyro's ``init_to_uniform``); ``potential_fn(z, rng_key)`` receives a JAX key, and
    ``gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices)`` too (see
    :mod:`ppl_sgmcmc.numpyro.gibbs`).

    **Example** (a kernel on an energy instead of a model: ``potential_fn`` and ``init_params``; five
    steps per kept draw)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def potential(z):  # U(x) = |x|²/2, a standard normal
        ...     return 0.5 * jnp.sum(z["x"] ** 2)
        >>> kernel = SGLD(potential_fn=potential, step_size=0.05, steps_per_sample=5)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=500, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)}, extra_fields=("potential_energy",))
        >>> mcmc.get_samples()["x"].shape, mcmc.get_extra_fields()["potential_energy"].shape
        ((500, 2), (500,))
        >>> int(mcmc.last_state.i), int(mcmc.last_state.num_diverging)  # 5 × (100 + 500) steps
        (3000, 0)
    """

    sample_field = "z"
    warmup_arg = "num_warmup"
    # the low-rank metric's estimate at a slow window's end: a branch, kept one under vmap (`warmup.when`)
    _branch = staticmethod(lambda pred, fn, operand: warmup.when(pred, lambda o, _: fn(o), operand))
    state_type: type  # set below: SGMCMCState, or a subclass (ContourState)
    _target = None
    _sample_fn = None
    # the progress bar of `ppl_sgmcmc.numpyro.MCMC` while it runs (updated from the compiled step), else None
    _progress: Any = None
    # set by `ppl_sgmcmc.numpyro.MCMC`, which reports the health after the run: the loop needs no callback for it
    _reports_after_run = False
    #: Whether the warm-up may run again (:meth:`_replayed`), set for its run by a driver whose loop counts the chain's
    #: own steps (:class:`ppl_sgmcmc.numpyro.MCMC`): ``numpyro.infer.MCMC`` counts its calls.
    _replays_allowed = False
    _last_step: int | None = None  # set by `ppl_sgmcmc.numpyro.MCMC`: the step count at the end of its run
    # steps whose streamed rows are read ahead at once (a model under `streaming.streamed`), else None
    _stream_block = None
    _accelerated = False  # whether the chain compiles the accelerator step (`STEP_PATH`), set by `init`
    _after_warmup = False  # set while a step is traced for steps after the warm-up only (`_traced_after_warmup`)

    # --- numpyro.infer.MCMCKernel ------------------------------------------------------------
    @property
    def model(self):
        """The model on its full data (see :class:`~ppl_sgmcmc.numpyro.handlers.full_data`): what ArviZ,
        ``Predictive`` and deterministic sites should see. The subsampled model is :attr:`subsampled_model`.
        ``None`` for a kernel built from ``potential_fn``.

        **Example** (the plate of 5 data points runs on all 5, not on a minibatch of 2)::

            >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> from numpyro.handlers import seed, trace
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> def model(y):
            ...     mu = numpyro.sample("mu", dist.Normal(0, 1))
            ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
            ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
            >>> kernel = SGLD(model, step_size=1e-3)
            >>> trace(seed(kernel.model, 0)).get_trace(jnp.zeros(5))["y"]["value"].shape
            (5,)
        """
        return None if self._model is None else full_data(self._model)

    @property
    def subsampled_model(self):
        """The model as declared, with its subsampled plates.

        **Example** (a minibatch of 2 of the 5 data points)::

            >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> from numpyro.handlers import seed, trace
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> def model(y):
            ...     mu = numpyro.sample("mu", dist.Normal(0, 1))
            ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
            ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
            >>> kernel = SGLD(model, step_size=1e-3)
            >>> kernel.subsampled_model is model, trace(seed(model, 0)).get_trace(jnp.zeros(5))["y"]["value"].shape
            (True, (2,))
        """
        return self._model

    @property
    def default_fields(self):
        """The state fields ``MCMC`` collects unless told otherwise (``extra_fields`` adds more):
        the latents ``z``, ``diverging``, ``step_size``, ``noise_ratio``, ``noise_variance`` and the algorithm's
        ``sample_stats_fields`` (CSGLD's ``log_weight`` and ``partition``).

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> SGLD(potential_fn=lambda z: 0.0, step_size=0.1).default_fields
            ('z', 'diverging', 'step_size', 'noise_ratio', 'noise_variance')
        """
        return ("z", "diverging", "step_size", "noise_ratio", "noise_variance", *self.sample_stats_fields)

    def get_diagnostics_str(self, state):
        """The progress bar's postfix: ``Ũ_t``, the step size and the number of rejected steps.

        NumPyro asks for it after every step; reading the state forces the host to wait for the device,
        so the string is refreshed only every ``diagnostics_every`` calls and reused in between. The failures
        the chain's health checks recorded (:meth:`report_health`) are read at those calls and at calls 1, 2, 4, 8, ...

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(2)})
            >>> kernel.get_diagnostics_str(state)
            'Ũ_t 1, h 1.00e-01, div 0'
        """
        self._diagnostics_calls = getattr(self, "_diagnostics_calls", -1) + 1
        calls = self._diagnostics_calls
        if calls % self.diagnostics_every == 0:
            self._diagnostics = self.diagnostics(state)
        if calls % self.diagnostics_every == 0 or calls & (calls - 1) == 0:  # and at calls 1, 2, 4, 8, ...
            self._health.report(state.health.flags, state.health.values)
        return self._diagnostics

    diagnostics_every = 100

    def diagnostics(self, state):
        """The diagnostics string of one state (read from the device): the items of :meth:`progress`
        (the minibatch energy ``Ũ_t``, the step size, the number of rejected steps, the algorithm's own).

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(2)})
            >>> kernel.diagnostics(state)
            'Ũ_t 1, h 1.00e-01, div 0'
        """
        return ", ".join(f"{key} {value}" for key, value in self.progress(state).items())

    def postprocess_fn(self, model_args, model_kwargs):
        """The map from the chain's unconstrained latents ``z`` to the model's constrained values, with
        the deterministic sites evaluated on the full data; the identity for a ``potential_fn`` kernel
        (and before :meth:`init`). ``MCMC.get_samples`` applies it.

        **Example** (a positive scale: ``log`` is its transform, so ``z = 0`` is ``scale = 1``)::

            >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> def model(y):
            ...     scale = numpyro.sample("scale", dist.HalfNormal(1.0))
            ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
            ...         numpyro.sample("y", dist.Normal(0.0, scale), obs=numpyro.subsample(y, event_dim=0))
            >>> kernel, y = SGLD(model, step_size=1e-3), jnp.ones(10)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, model_args=(y,))
            >>> float(kernel.postprocess_fn((y,), {})({"scale": jnp.array(0.0)})["scale"])
            1.0
        """
        if self._target is None:
            return lambda z: z
        fn = self._target.postprocess_fn(as_jax_arrays(model_args), as_jax_arrays(model_kwargs or {}))

        def postprocess(z):
            with _TRACING:
                return fn(z)

        return postprocess

    def get_constrain_fn(self, model_args, model_kwargs):
        """The same map as :meth:`postprocess_fn` (NumPyro's older name for it).

        **Example** (a ``potential_fn`` kernel: its latents are the energy's own, so the map is the identity)::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(2)})
            >>> kernel.get_constrain_fn((), {})({"x": 1.0})
            {'x': 1.0}
        """
        return self.postprocess_fn(model_args, model_kwargs)

    def step_size_at(self, i):
        """The step size ``h_i`` of step ``i`` (0-based, warm-up included): the schedule at ``i``, or the
        constant ``h`` as an array.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> from ppl_sgmcmc.schedules import polynomial
            >>> kernel = SGLD(potential_fn=lambda z: 0.0, step_size=polynomial(a=1.0, b=1.0, gamma=1.0))
            >>> kernel.step_size_at(0), kernel.step_size_at(9)
            (1.0, 0.1)
            >>> round(float(SGLD(potential_fn=lambda z: 0.0, step_size=1e-3).step_size_at(9)), 6)
            0.001
        """
        return self._step_size(i) if callable(self._step_size) else jnp.asarray(self._step_size)

    def _make_target(self, model_args, model_kwargs, rng_key):
        """The model's stochastic potential: a :class:`ModelTarget`, or a :class:`~ppl_sgmcmc.numpyro.gibbs.GibbsTarget`
        with local Gibbs sites; in the latents' own space if :attr:`constrained`."""
        args = (self._model, model_args, model_kwargs, rng_key, self._replace, self.name)
        if self._gibbs is None:
            return ModelTarget(*args, constrained=self.constrained)
        return gibbs.GibbsTarget(*args, self._gibbs, constrained=self.constrained)

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        """Start the chain: build the model's stochastic potential, find initial values (unless
        ``init_params`` are given), draw the first minibatch and its gradient, and the rule's state.

        :param rng_key: a PRNG key, or an array of keys for chains vectorised with ``vmap`` (then
            ``init_params`` have a leading chain axis).
        :param num_warmup: the number of warm-up draws.
        :param init_params: unconstrained initial values ``{site: array}``; needed with ``potential_fn``.
        :param model_args: the model's positional arguments (the data).
        :param model_kwargs: the model's keyword arguments.
        :return: the :class:`SGMCMCState` at step 0.

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(2)})
            >>> int(state.i), state.z["x"].tolist(), float(state.potential_energy)  # U(1, 1) = 1
            (0, [1.0, 1.0], 1.0)
        """
        with _TRACING:  # NumPyro's handler stack is one list for the whole process: one thread at a time
            return self._start(rng_key, num_warmup, init_params, model_args, model_kwargs)

    def _start(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        name = self.name
        _check_host_platform(name)
        self._set_warmup(num_warmup)
        # NumPyro traces `init` under `pmap` for parallel chains: the checks below are then evaluated, not traced
        traced = isinstance(rng_key, jax.core.Tracer)
        concrete = jax.ensure_compile_time_eval if traced else contextlib.nullcontext
        if not self._tune:
            with concrete():
                _checks.first_step_size(self.step_size_at(0), name)
        if self._start_warning:
            warnings.warn(self._start_warning, UserWarning, stacklevel=2)
        _note_no_verdict(self)
        model_args, model_kwargs = as_jax_arrays(model_args), as_jax_arrays(model_kwargs or {})
        vectorized = not is_prng_key(rng_key)
        if vectorized:
            rng_key, key_init = jnp.swapaxes(vmap(random.split)(rng_key), 0, 1)
        else:
            rng_key, key_init = random.split(rng_key)
        if self._model is not None:
            with concrete():
                self._target = self._make_target(model_args, model_kwargs, key_init if not vectorized else key_init[0])
                self._check_target(self._target)
        else:
            self._target = PotentialTarget(self._potential_fn, name)
        if init_params is None:
            init_params = self._target.initial_params(
                key_init, self._init_strategy or init_to_uniform, model_args, model_kwargs
            )
        else:
            init_params = self._checked_init_params(init_params, vectorized)
        start = jax.tree.map(lambda x: x[0], init_params) if vectorized else init_params
        flat, self._unravel = ravel_pytree(start)
        self._gradient_fns = {}  # the jitted minibatch gradients of this start (`_gradient`)
        if flat.shape[0] == 0:  # a model without latents is refused with its target
            raise ValueError(f"{name}: `init_params` holds no values; give the latent values `{{name: array}}` the "
                             "potential_fn takes.")
        self._check_dimension(self._target, flat.shape[0])
        self._epoch_steps = None if self._model is None else self._epoch_length(self._target)
        self._anchor_steps = None if self._model is None else self._anchor_length(self._target)
        self._stream_block = getattr(self._target, "stream_block", None)
        if self.rule.NEEDS == "per_example":  # one eager minibatch near the start (SGFS's Fisher)
            if traced:
                raise ValueError(
                    f"{name}: its start checks the per-datum scores of a minibatch on the host, which NumPyro's "
                    "chain_method='parallel' does not allow (it traces the kernel's `init`). Run the chains with "
                    "chain_method='vectorized' or 'sequential'."
                )
            key = key_init if not vectorized else key_init[0]
            batch, _ = self._target.draw(key, self._target.init_batch(key))
            near = flat + 0.01 * random.normal(random.fold_in(key, 2), flat.shape, flat.dtype)  # not a special point
            with model_errors(name, "computing the per-datum scores"):
                rows = self._gradient(near, batch, model_args, model_kwargs).per_example  # jitted: one program
            self._check_scores(rows, [name for name in sorted(start) for _ in range(jnp.size(start[name]))])
        # the data arrays are arguments of the compiled function, not constants baked into it (large N);
        # other leaves (a `batch_size` used as `subsample_size`) stay static
        data, merge = split_arrays((model_args, model_kwargs))
        self._static_leaves = merge.static_paths

        def init_one(params, found, key, data):
            return self._init_state(params, found, key, *merge(data))

        init_one = vmap(init_one, in_axes=(0, 0, 0, None)) if vectorized else init_one
        with model_errors(name, "computing the first stochastic gradient"):
            found = self._start_stages(start, init_params, rng_key, data, merge, vectorized)
            state = jax.jit(init_one)(init_params, found, rng_key, data)
        self._vectorized = vectorized
        self._accelerated = _accelerator_step((model_args, model_kwargs, init_params))
        self._sample_fn = vmap(self._sample_one, in_axes=(0, None, None)) if vectorized else self._sample_one
        self._health = health.Reporter(name, tuned=self._tune, reducible=self.variance_reducible,
                                       step_fix=self.step_fix, noise_bias=self.noise_bias)
        self.__dict__.setdefault("_final_checks", {})  # report_health's checks, compiled per warm-up length
        return state

    def _checked_init_params(self, init_params, vectorized):
        """Given ``init_params`` checked before anything runs at them: a model's latent sites, each of its
        unconstrained shape (sites of the model that are not latent, such as deterministic ones, are dropped), and
        finite values (unless traced, under ``chain_method="parallel"``)."""
        name, target = self.name, self._target
        if not isinstance(init_params, dict):
            return init_params
        if self._model is not None:
            latents = target.latent_supports
            init_params = {k: v for k, v in init_params.items() if k in latents or k not in target.site_names}
            _model_checks.initial_sites(list(init_params), list(latents), "init_params", name)
            given = {k: jnp.shape(v)[1:] if vectorized else jnp.shape(v) for k, v in init_params.items()}
            expected = {k: shape for k, shape in target.latent_shapes.items() if shape is not None}
            chains = "with vectorized chains one leading axis of num_chains"
            _model_checks.initial_shapes(given, expected, "init_params", chains, name)
        leaves = {k: v for k, v in init_params.items() if not isinstance(v, jax.core.Tracer)}
        bad = [k for k, v in leaves.items() if jnp.issubdtype(jnp.result_type(v), jnp.inexact)
               and not bool(jnp.all(jnp.isfinite(jnp.asarray(v))))]  # fmt: skip
        if bad:
            raise _model_checks.nonfinite_initial(bad, "init_params", name)
        return init_params

    def sample(self, state, model_args, model_kwargs):
        """``steps_per_sample`` steps of the chain from ``state`` (a pure function of its arguments, which
        ``MCMC`` compiles); a step whose gradient or new state is not finite is rejected and counted.

        :param state: the :class:`SGMCMCState` of :meth:`init` or of the last call.
        :param model_args: the model's positional arguments (the data), as given to :meth:`init`.
        :param model_kwargs: the model's keyword arguments.
        :return: the new :class:`SGMCMCState`.

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(2)})
            >>> step = jax.jit(kernel.sample)
            >>> for _ in range(3):
            ...     state = step(state, (), {})
            >>> int(state.i), state.z["x"].shape, int(state.num_diverging)
            (3, (2,), 0)
        """
        if self._sample_fn is None:
            raise RuntimeError(f"{type(self).__name__}: call `init` before `sample`.")
        model_args, model_kwargs = as_jax_arrays(model_args), as_jax_arrays(model_kwargs or {})
        self._check_static(model_args, model_kwargs)
        sharding.check_arguments(state.i, model_args, model_kwargs, self.name)  # data on several hosts
        before = state.i
        with _TRACING:  # the model runs here only while the step is traced: one thread at a time
            state = self._sample_fn(state, model_args, model_kwargs)
        state = self._update_health(state, before)
        if self._replays_allowed and self.warmup_replays() and not self._after_warmup:
            state = self._replayed(state)
        return state

    def _replayed(self, state):
        """``state``, or, when it ended the warm-up unsettled (:func:`ppl_sgmcmc.adaptation.settled`, any chain) with
        replays left (:meth:`~ppl_sgmcmc.algorithms.Algorithm.warmup_replays`), its step count back to 0, so that the
        warm-up runs again from where it ended, its windows from the first, every chain together. Only a driver whose
        loop counts the chain's own steps allows it (``_replays_allowed``: :class:`ppl_sgmcmc.numpyro.MCMC`)."""
        adapt_state = state.adapt_state
        again = (state.i == self._num_warmup_steps) & ~adaptation.settled(adapt_state)
        again = again & (adapt_state.rounds < self.warmup_replays())
        if self._vectorized:
            again = jnp.broadcast_to(jnp.any(again), again.shape)
        zero = jnp.zeros_like(state.i)
        adapt_state = adapt_state._replace(window_index=jnp.where(again, zero, adapt_state.window_index),
                                           rounds=adapt_state.rounds + again.astype(adapt_state.rounds.dtype))
        return state._replace(i=jnp.where(again, zero, state.i), adapt_state=adapt_state)

    @contextlib.contextmanager
    def _traced_after_warmup(self):
        """While open, :meth:`sample` is traced for steps after the warm-up only: without the warm-up's adaptation
        (and its branch on the step count). :class:`ppl_sgmcmc.numpyro.MCMC` traces its draws after the warm-up so
        on the accelerator step (:data:`STEP_PATH`)."""
        self._after_warmup = True
        try:
            yield
        finally:
            self._after_warmup = False

    def _check_static(self, model_args, model_kwargs):
        """A model argument that was a Python number at :meth:`init` (it may be a shape, e.g. a plate's
        ``subsample_size``) must not arrive traced, as ``MCMC(jit_model_args=True)`` passes it."""
        leaves = jax.tree_util.tree_flatten_with_path((model_args, model_kwargs))[0]
        for path, leaf in leaves:
            if path in self._static_leaves and isinstance(leaf, jax.core.Tracer):
                which = path[1]
                where = f"positional argument {which.idx}" if path[0].idx == 0 else f"keyword argument {which.key!r}"
                raise ValueError(
                    f"{self.name}: MCMC(jit_model_args=True) traces every model argument, but the model's "
                    f"{where} is a Python number it may use as a shape (a plate's "
                    "`subsample_size`, say). Pass it by closure instead, e.g. `functools.partial(model, "
                    "batch_size=100)`, or run with jit_model_args=False."
                )

    def report_health(self, state):
        """Warn, once per run and kind, about the known failures the chain's checks recorded in ``state`` and
        those the checks find in ``state`` itself (:mod:`ppl_sgmcmc.health`: the last steps of a run come after
        its last check); with several chains, each kind with the values of the first chain in which it failed.
        Under ``numpyro.infer.MCMC`` the compiled step reports while it runs (a host callback when a check finds a
        new failure; under :class:`ppl_sgmcmc.numpyro.MCMC`, after the run);
        :func:`~ppl_sgmcmc.numpyro.to_inference_data` and :func:`ppl_sgmcmc.checkpoint.run` call this too, and a
        warning the run could not raise (one that a warnings filter turns into an error) is raised here.

        **Example** (a schedule that turns negative at step 10)::

            >>> import warnings, jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=lambda t: 0.1 - 0.01 * t)
            >>> state = kernel.init(jax.random.PRNGKey(0), 0, {"x": jnp.ones(2)})
            >>> step = jax.jit(kernel.sample)
            >>> with warnings.catch_warnings(record=True) as caught:
            ...     warnings.simplefilter("always")
            ...     for _ in range(20):
            ...         state = step(state, (), {})
            ...     _ = jax.block_until_ready(state)  # reported from the compiled step, at its check after step 10
            ...     kernel.report_health(state)  # once per run and kind
            >>> len(caught), "Fix the `step_size` schedule" in str(caught[0].message)
            (1, True)
        """
        # compiled once per warm-up length (which the checks read); eager JAX would compile each operation
        if self._num_warmup_steps not in self._final_checks:
            self._final_checks[self._num_warmup_steps] = jax.jit(self._checked_health)
        checked = self._final_checks[self._num_warmup_steps](state)
        self._health.report(checked.flags, checked.values)

    def _report_in_run(self, flags, values):
        """:meth:`report_health` from the compiled step's host callback; returns ``flags`` unchanged.

        The step keeps the returned flags, so that the call, a :func:`jax.pure_callback` to JAX, is neither
        dropped nor an effect: a compiled program with an effect (an ``io_callback``) loses JAX's fast
        dispatch, which made every call of a jitted step from Python (NumPyro's progress bar) several times
        slower. Reporting is idempotent (once per run and kind), so it does not matter how often JAX calls it.
        A warning that a filter turns into an exception would abort the run from inside the callback: it is
        left to :meth:`report_health`, which raises it on the host after the run
        (:class:`ppl_sgmcmc.health.Reporter` marks a kind reported only once its warning is out)."""
        try:
            self._health.report(flags, values)
        except Warning:  # a warning filtered into an error: raised again by report_health, outside the run
            pass
        return flags

    def _checked_health(self, state, new_window=False):
        """``state.health`` after :func:`ppl_sgmcmc.health.update` at the state's step (of each chain, over a
        leading chain axis); the checks' window moves to this step where ``new_window``."""

        def update(state):
            return health.update(
                state.health, state.i, state.num_diverging, state.step_size, ravel_pytree(state.z)[0],
                self._watched_state(state.rule_state), self._measured_ratio(state), self.noise_ratio_limit,
                state.adapt_state.restarts if self.adapts else 0, self._measured_change(state.health), new_window,
                self._exploring(state.i),
            )  # fmt: skip

        return (vmap(update) if jnp.ndim(state.i) else update)(state)

    def _update_health(self, state, before):
        """``state`` with its health checks run if the step count passed one of the steps of
        :func:`ppl_sgmcmc.health.passed_check` since ``before`` (16 in each doubling of the step count), in the
        compiled step, the checks' window moving at powers of two; under ``numpyro.infer.MCMC``, with a host call
        that reports a failure when a check first finds it, and at the checks at powers of two after (a healthy
        run never calls the host); and, under :class:`ppl_sgmcmc.numpyro.MCMC` with a progress bar, the bar's
        host callback when it is due. Both sit in one branch, taken when either is due, so that a step pays for
        one rarely taken branch. The branch is taken for all chains at once (they count steps together), so that
        vectorised chains do not pay for the checks at every step. On the accelerator step (:data:`STEP_PATH`) under
        :class:`ppl_sgmcmc.numpyro.MCMC` there is no branch: the checks run at every step and are kept where due
        (a select); that driver reports after the run and draws its bar between chunks of draws."""
        first = (lambda x: x[0]) if self._vectorized else (lambda x: x)
        new_window = health.passed_power_of_two(first(before), first(state.i))

        def report(flags, values):
            return jax.pure_callback(
                self._report_in_run, jax.ShapeDtypeStruct(flags.shape, flags.dtype), flags, values,
                vmap_method="sequential",
            )  # fmt: skip

        def checked(state):
            recorded = state.health.flags
            state = state._replace(health=self._checked_health(state, new_window))
            if not self._reports_after_run:  # `numpyro.infer.MCMC` reads nothing after the run: report now
                flags, values = state.health.flags, state.health.values
                # a new failure at once; failures already recorded at powers of two (a new run warns again)
                due = jnp.any(flags & ~recorded) | (new_window & jnp.any(flags))
                flags = lax.cond(due, report, lambda flags, _: flags, flags, values)
                state = state._replace(health=state.health._replace(flags=flags))
            return state

        health_due = health.passed_check(first(before), first(state.i))
        if self._last_step is not None:  # `ppl_sgmcmc.numpyro.MCMC`'s run: its last step is checked too
            health_due = health_due | (first(state.i) == self._last_step)
        if self._accelerated and self._reports_after_run:  # no branch: checked at every step, kept where due
            # (`ppl_sgmcmc.numpyro.MCMC` reports after the run and draws its bar per chunk of draws)
            checked_health = self._checked_health(state, new_window)
            return state._replace(health=jax.tree.map(partial(jnp.where, health_due), checked_health, state.health))
        if self._progress is None:
            return lax.cond(health_due, checked, lambda s: s, state)
        bar_due = self._progress.due(state)

        def rare(state):
            state = lax.cond(health_due, checked, lambda s: s, state)
            self._progress.show_if(bar_due, state)
            return state

        return lax.cond(health_due | bar_due, rare, lambda s: s, state)

    def _measured_ratio(self, state):
        """The noise ratio once the warm-up is over and the estimate averages :data:`ppl_sgmcmc.noise.HORIZON`
        steps, else NaN: during the warm-up the chain is still moving towards the typical set, and the
        gradient's change along the way inflates the estimate (:mod:`ppl_sgmcmc.noise`)."""
        measured = (state.noise.count >= noise.HORIZON) & (state.i >= self._num_warmup_steps)
        return jnp.where(measured, state.noise_ratio, jnp.nan)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_sample_fn"], state["_final_checks"], state["_gradient_fns"] = None, {}, {}
        return state

    @staticmethod
    def _is_positive_support(support):
        """Whether ``support`` is ``constraints.positive``, possibly made independent over event dimensions."""
        while isinstance(support, constraints._IndependentConstraint):
            support = support.base_constraint
        return support is constraints.positive

    @staticmethod
    def _jacobian(fn):
        """``z -> ∂fn(z)/∂z`` by forward-mode autodiff, ``jax.jacfwd`` (the output's axes, then the input's): the
        derivatives of the complete recipe's ``D(z)`` and ``Q(z)`` (:class:`~ppl_sgmcmc.algorithms.Recipe`)."""
        return jax.jacfwd(fn)

    # --- the chain ---------------------------------------------------------------------------
    def _start_stages(self, start, init_params, rng_key, data, merge, vectorized):
        """The chain's start before its state: the approximate mode (``find_mode`` steps of Adam, then Newton steps
        with the exact Hessian, evaluated again at each step's end, line-searched on every row), the curvature there
        (the exact Hessian, or its diagonal and the largest curvature it leaves) and the noise probe's minibatch
        gradients, as ``(flat, curvature, largest, probe)`` (``None`` for what the kernel does not use; a leading
        chain axis for vectorised chains).

        These stages depend on the model, its arguments and a few options, not on the kernel's rule: each runs as its
        own compiled program, kept for the next kernel of the same model (see :data:`_START_STAGES`), so that
        kernels compared on one model trace and compile their mode search, Hessian and probe once."""
        target = self._target
        dim = sum(jnp.size(x) for x in jax.tree.leaves(start))
        steps = self._find_mode_steps
        curvature = None
        if self._adapt_mass:
            curvature = "exact" if self._exact_hessian(dim, adaptation.EXACT_HESSIAN_MAX) else "diagonal"
        probe_rows = 0
        if self._tune:
            n = max((n for _, n in getattr(target, "plate_sizes", {}).values()), default=1)
            probe_rows = self._probe_batches(dim) * n
        flat = vmap(lambda p: ravel_pytree(p)[0])(init_params) if vectorized else ravel_pytree(init_params)[0]
        found = (flat, None, None)
        if steps or curvature:

            def curvature_stage(flat, key, data, gradient):
                key_batch, *_, key_mode, key_hessian, _ = _start_keys(key)
                if steps:
                    flat = warmup.find_mode(gradient, target.draw, target.init_batch(key_batch), flat, key_mode, steps)
                if curvature == "exact":
                    rows = adaptation.hessian_rows(target.data_size, dim)
                    batches = target.epoch(key_hessian, rows)
                    if not steps:
                        return flat, warmup.hessian(gradient, batches, flat)[0], None
                    # Newton steps from the optimiser's end, line-searched on every row (the Hessian's may be fewer)
                    every_row = batches if rows >= target.data_size else target.epoch(key_hessian, target.data_size)
                    return (*warmup.newton(gradient, every_row, flat, batches), None)
                if curvature == "diagonal":  # many coordinates: the Hessian's diagonal, and the curvature it leaves
                    batches = target.epoch(key_hessian, adaptation.hessian_rows(target.data_size, 1))
                    key_diagonal, key_power = random.split(key_hessian)
                    diagonal = warmup.hessian_diagonal(gradient, batches, flat, key_diagonal)[0]
                    scale = adaptation.from_hessian(diagonal, False)[0].scale
                    return flat, diagonal, warmup.largest_curvature(gradient, batches, flat, scale, key_power)
                return flat, None, None

            stage = self._start_stage(("curvature", steps, curvature, dim), curvature_stage, start, merge, vectorized)
            found = stage(flat, rng_key, data)
        probe = None
        if probe_rows:

            def probe_stage(flat, key, data, gradient):
                return warmup.probe(gradient, target.epoch(_start_keys(key)[-1], probe_rows), flat)

            stage = self._start_stage(("probe", probe_rows), probe_stage, start, merge, vectorized)
            probe = stage(found[0], rng_key, data)
        return (*found, probe)

    def _start_stage(self, options, stage, start, merge, vectorized):
        """``stage(flat, key, data, gradient)`` compiled as ``(flat, key, data) -> ...`` (over a chain axis if
        ``vectorized``), from :data:`_START_STAGES` where a kernel of the same model, plates, latent shapes, static
        arguments and ``options`` compiled it (``gradient`` is the target's, :func:`_jitted_gradient`)."""
        target, unravel = self._target, self._unravel

        def run(flat, key, data):
            jitted = _jitted_gradient(target, unravel, merge)
            return stage(flat, key, data, lambda x, batch: jitted(x, batch, data))

        model_key = target._search_key() if isinstance(target, ModelTarget) and self._stream_block is None else None
        shapes = tuple((jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(start))
        key = model_key and (
            options, model_key, target.constrained, target.per_example_scores, jax.tree.structure(start), shapes,
            merge.treedef, tuple(merge.static), vectorized,
        )  # fmt: skip
        return _START_STAGES.get(key, lambda: jax.jit(vmap(run, in_axes=(0, 0, None)) if vectorized else run))

    def _init_state(self, init_params, found, rng_key, model_args, model_kwargs):
        key_batch, key_noise, key_draw, rng_key, *_ = _start_keys(rng_key)
        target = self._target

        def gradient(x, batch):
            return self._gradient(x, batch, model_args, model_kwargs)

        flat, curvature, largest, probe = found
        if self._find_mode_steps:
            init_params = self._unravel(flat)
        laplace = None
        if curvature is not None:
            laplace = self._laplace(curvature) if largest is None else (self._laplace(curvature)[0], largest)
        batch_state = target.init_batch(key_batch)
        batch, batch_state = target.draw(key_draw, batch_state)
        first = gradient(flat, batch)
        if self._stream_block is not None:
            batch_state = target.init_block(batch_state)
        rule_state = self.rule_init(flat, random.normal(key_noise, self.noise_shape(flat.shape[0]), flat.dtype))
        adapt_state, rule_state = self._initial_adaptation(flat, laplace, probe, rule_state, first.energy)
        step_size = jnp.asarray(self.step_size_in(adapt_state, 0), flat.dtype)
        return self.state_type(
            i=jnp.zeros((), jnp.int32),
            z=init_params,
            rule_state=rule_state,
            potential_energy=first.energy,
            step_size=step_size,
            diverging=jnp.zeros((), bool),
            num_diverging=jnp.zeros((), jnp.int32),
            batch_state=batch_state,
            gradient_state=self._estimator.init(flat, self._full_gradient_fn(model_args, model_kwargs)),
            finite_position=flat,
            adapt_state=adapt_state,
            noise=noise.init(flat),
            noise_ratio=jnp.full((), jnp.nan, flat.dtype),
            health=health.init(flat, self._changing_preconditioner(rule_state)),
            rng_key=rng_key,
        )

    def _sample_one(self, state, model_args, model_kwargs):
        """``steps_per_sample`` steps; the draw's noise ratio is that of its last step, computed once. After the
        warm-up on the accelerator step (:data:`STEP_PATH`), an SVRG epoch shorter than a draw (a divisor of it:
        ``Algorithm._epoch_length``) is a loop of epochs, each from a new centre: no branch per step."""
        steps, epoch = self._steps_per_sample, self._epoch_steps
        if steps == 1:
            state = self._step(state, model_args, model_kwargs)
        else:

            def body(_, carry):
                state, diverging = carry
                state = self._step(state, model_args, model_kwargs)
                return state, diverging | state.diverging

            def one_epoch(_, carry):
                state, diverging = carry
                return lax.fori_loop(0, epoch, body, (self._centred(state, model_args, model_kwargs), diverging))

            carry = (state, jnp.zeros((), bool))
            if self._after_warmup and epoch is not None and epoch < steps:
                state, diverging = lax.fori_loop(0, steps // epoch, one_epoch, carry)
            else:
                state, diverging = lax.fori_loop(0, steps, body, carry)
            state = state._replace(diverging=diverging)
        ratio = noise.ratio(state.noise, state.step_size, self.temperature_at(state.i - 1))
        return state._replace(noise_ratio=ratio)

    def _gradient(self, flat, batch, model_args, model_kwargs):
        """The target's minibatch gradient (a ``StochasticGradient``) at ``flat`` on ``batch``, through one jitted
        function per start and static model arguments (:func:`_jitted_gradient`: the model traced once for the
        chain's first gradient and its step); an unhashable static argument gets it traced in place."""
        data, merge = split_arrays((model_args, model_kwargs))
        key = (merge.treedef, tuple(merge.static))
        try:
            fn = self._gradient_fns.get(key)
        except TypeError:  # an unhashable static argument
            return self._target.gradient(flat, self._unravel, batch, model_args, model_kwargs)
        if fn is None:
            fn = self._gradient_fns[key] = _jitted_gradient(self._target, self._unravel, merge)
        return fn(flat, batch, data)

    def _full_gradient_fn(self, model_args, model_kwargs):
        """``x -> StochasticGradient`` of the full-data potential, for an estimator that needs it (else ``None``)."""
        if not self._estimator.needs_full_gradient:
            return None
        return lambda x: self._target.full_gradient(x, self._unravel, model_args, model_kwargs)

    def _centre(self, flat, model_args, model_kwargs):
        """The gradient estimator's state at a new centre ``flat`` (its full-data gradient there)."""
        return self._estimator.init(flat, self._full_gradient_fn(model_args, model_kwargs))

    def _recentre(self, state, model_args, model_kwargs):
        """``state`` with the gradient estimator's centre moved to the chain's position, every chain at once: what
        :meth:`_step` does at the first step of each epoch of a refreshing estimator (SVRG). On the accelerator step
        (:data:`STEP_PATH`) the steps after the warm-up leave it to :class:`ppl_sgmcmc.numpyro.MCMC`'s loop, which
        calls this between loops of whole epochs of draws (an epoch of one draw or more; a shorter one:
        :meth:`_sample_one`): no branch per step."""
        model_args, model_kwargs = as_jax_arrays(model_args), as_jax_arrays(model_kwargs or {})
        with _TRACING:  # the model runs here only while traced
            if self._vectorized:
                return vmap(lambda one: self._centred(one, model_args, model_kwargs))(state)
            return self._centred(state, model_args, model_kwargs)

    def _centred(self, state, model_args, model_kwargs):
        """One chain's ``state`` with the gradient estimator's centre at its position."""
        return state._replace(gradient_state=self._centre(ravel_into(state.z, state.finite_position), model_args,
                                                          model_kwargs))  # fmt: skip

    def _step(self, state, model_args, model_kwargs):
        """One SG-MCMC step: draw a minibatch, apply the rule, reject the move if anything is non-finite,
        measure the gradient noise and, during the warm-up, adapt."""
        # the step's draws are JAX's numbers through an unrolled hash (`prng`): no rolled loop per draw on XLA:CPU
        rng_key, key_draw, key_noise = prng.split(state.rng_key, 3)
        if self._stream_block is None:
            batch, batch_state = self._target.draw(key_draw, state.batch_state)
        else:  # the rows of the next steps, read ahead at the indices those steps draw
            batch, batch_state = self._target.draw_block(state.rng_key, state.batch_state, _draw_keys)
        # any d-vector of the state serves as the buffer (every entry is overwritten): no concatenate per step
        flat = ravel_into(state.z, state.finite_position)
        gradient_state = state.gradient_state
        # a new centre every epoch (SVRG), all chains at once; after the warm-up on the accelerator step, loops of
        # whole epochs move it instead (`_sample_one`, and MCMC's loop through `_recentre`)
        if self._epoch_steps is not None and not self._after_warmup:
            data, merge = split_arrays((model_args, model_kwargs))

            def recentre(gradient_state, args):
                x, data = args
                return self._centre(x, *merge(data))

            due = (state.i > 0) & (state.i % self._epoch_steps == 0)
            gradient_state = warmup.when(due, recentre, gradient_state, (flat, data))
        grad_fn, gradient_state = self._estimator.estimate(
            gradient_state,
            flat,
            lambda x: self._gradient(x, batch, model_args, model_kwargs),
            state.i,
        )
        start_rule_state = state.rule_state
        if self._anchor_steps is not None:  # the rule's anchors at full-data energies (replica exchange)
            data, merge = split_arrays((model_args, model_kwargs))

            def anchor(rule_state, args):
                x, adapt_state, data = args
                return self._anchor(
                    rule_state, x, adapt_state, lambda z: self._target.full_gradient(z, self._unravel, *merge(data)).energy
                )

            due = state.i % self._anchor_steps == 0
            start_rule_state = warmup.when(due, anchor, start_rule_state, (flat, state.adapt_state, data))
        noise_draw = random.normal(prng.unrolled(key_noise), self.noise_shape(flat.shape[0]), flat.dtype)
        step_size = jnp.asarray(self.step_size_in(state.adapt_state, state.i), flat.dtype)
        new_flat, rule_state, gradient, at_start = self._move(
            flat, start_rule_state, grad_fn, noise_draw, step_size, state.i, state.adapt_state, state.noise
        )
        # a non-finite gradient reaches the new position through every rule
        finite = _all_finite((gradient.energy, new_flat, rule_state)) & (step_size > 0)
        # A rejected step of a rule that takes its gradient at the chain's position (SGLD, pSGLD, SGFS, SGRLD)
        # returns to where the last accepted step started, whose gradient was finite: a step that landed where
        # the model is undefined is undone. Other rules keep the position.
        safe_flat, finite_position = flat, state.finite_position
        if at_start:
            safe_flat = finite_position
            finite_position = jnp.where(finite, flat, finite_position)
        keep = partial(jnp.where, finite)
        kept_rule_state = start_rule_state
        like = jax.ShapeDtypeStruct(flat.shape, flat.dtype)  # of a normal draw made in a branch only
        if has_momentum(kept_rule_state) and self._accelerated:  # the redraw, kept where the step was rejected
            refreshed = refresh_momentum(kept_rule_state, _refresh_noise(key_noise, like), self.temperature_at(state.i))
            kept_rule_state = jax.tree.map(keep, kept_rule_state, refreshed)
        elif has_momentum(kept_rule_state):  # a rejected step redraws the momentum that made it diverge
            kept_rule_state = warmup.when(
                ~finite,
                lambda rule_state, args: refresh_momentum(
                    rule_state, _refresh_noise(args[0], like), self.temperature_at(args[1])
                ),
                kept_rule_state,
                (key_noise, state.i),
            )
        new_flat = keep(new_flat, safe_flat)
        rule_state = jax.tree.map(keep, rule_state, kept_rule_state)
        noise_state, term, valid = self._measure_noise(state.noise, gradient, rule_state, finite, state.i, flat)
        adapt_state = state.adapt_state
        if self.adapts and not self._after_warmup:
            adapt_state, noise_state, rule_state, new_flat = warmup.when(
                state.i < self._num_warmup_steps,
                # the restart's momentum is drawn in the branch: a d-vector of normals per step otherwise
                lambda ops, args: self._adapt(*ops, *args[:-1], _refresh_noise(args[-1], like)),
                (adapt_state, noise_state, rule_state, new_flat),
                (keep(gradient.energy, state.potential_energy), term, valid, state.i, key_noise),
            )
        health_state, tracked = state.health, self._changing_preconditioner(rule_state)
        if tracked is not None:  # a preconditioner that changes along the chain: its range since the last check
            health_state = health.track(health_state, tracked)
        return self.state_type(
            i=state.i + 1,
            z=self._unravel(new_flat),
            rule_state=rule_state,
            potential_energy=keep(gradient.energy, state.potential_energy),
            step_size=step_size,
            diverging=~finite,
            num_diverging=state.num_diverging + (~finite).astype(jnp.int32),
            batch_state=batch_state,
            gradient_state=jax.tree.map(keep, gradient_state, state.gradient_state) if self._epoch_steps is None
            else gradient_state,  # a new centre stays, whatever the step did
            finite_position=finite_position,
            adapt_state=adapt_state,
            noise=noise_state,
            noise_ratio=state.noise_ratio,  # brought up to date once per draw, by `_sample_one`
            health=health_state,
            rng_key=rng_key,
        )


SGMCMCKernel.state_type = SGMCMCState
