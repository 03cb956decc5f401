"""The base class of the Pyro SG-MCMC kernels: state, step, divergence handling, diagnostics.

An algorithm subclass names its update rule (a module of :mod:`ppl_sgmcmc.rules`) and its
validated hyper-parameters; everything else is here. It mirrors
:class:`ppl_sgmcmc.numpyro.kernel.SGMCMCKernel` under Pyro's stateful kernel protocol:
``setup(warmup_steps, *args)``, ``initial_params``, ``sample(params) -> params``, ``logging()``,
``diagnostics()`` and ``cleanup()``.
"""

import sys
import warnings
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.func
import torch.utils._pytree as pytree
from pyro.distributions import constraints
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ppl_sgmcmc import _checks, _model_checks, adaptation, health, noise, verdict
from ppl_sgmcmc.algorithms import Algorithm
from ppl_sgmcmc.pyro import compile as compile_
from ppl_sgmcmc.pyro import warmup
from ppl_sgmcmc.pyro.gibbs import GibbsTarget
from ppl_sgmcmc.pyro.handlers import FullDataModel, as_tensors
from ppl_sgmcmc.pyro.potential import ModelTarget, PotentialTarget
from ppl_sgmcmc.rules import StochasticGradient, has_momentum, refresh_momentum

__all__ = ["SGMCMCKernel", "SGMCMCState"]


def _check_one_process(kernel: str) -> None:
    """Refuse a run inside a ``torch.distributed`` group of several processes: the Pyro kernels compute every
    gradient in one process, so each process would silently run a chain of its own on its own data."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        size = torch.distributed.get_world_size()
        if size > 1:
            raise NotImplementedError(
                f"{kernel}: torch.distributed is initialised with {size} processes, but the Pyro kernels do not "
                "split a gradient over processes: each process would run a chain of its own on the data it "
                "holds, not one data-parallel chain. For minibatch gradients over several devices or hosts use "
                "the NumPyro kernels with `ppl_sgmcmc.numpyro.sharding.shard_rows`; for several chains, Pyro's "
                "`MCMC(num_chains=...)` in one process group of size 1 (see the user guide, 'Large data and "
                "many devices')."
            )

def _check_finite_initial(params, kernel: str) -> None:
    """Refuse initial values that hold NaN or inf (the model would fail at them with an unrelated error)."""
    bad = [
        k for k, v in params.items()
        if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())
        or not torch.is_tensor(v) and not np.all(np.isfinite(np.asarray(v, dtype=float)))
    ]  # fmt: skip
    if bad:
        raise _model_checks.nonfinite_initial(bad, "initial_params", kernel)


def _check_num_samples(kernel: str) -> None:
    """Refuse ``num_samples < 1`` of the Pyro ``MCMC`` that sets up the chain (read from its generator's frame):
    Pyro runs the whole warm-up and then fails stacking no samples."""
    frame: Any = sys._getframe(1)
    for _ in range(8):  # setup's callers, up to Pyro's `_gen_samples`
        frame = frame.f_back
        if frame is None:
            return
        if frame.f_code.co_name == "_gen_samples" and frame.f_globals.get("__name__") == "pyro.infer.mcmc.api":
            num_samples = frame.f_locals.get("num_samples")
            if isinstance(num_samples, int) and num_samples < 1:
                raise ValueError(
                    f"{kernel}: MCMC(num_samples={num_samples}): Pyro's MCMC keeps no draw and fails after the "
                    "warm-up, stacking none. Pass num_samples >= 1."
                )
            return


def _accepted_noise_update(previous, variance, count, gradient, scale):
    """:func:`ppl_sgmcmc.noise.update` of an accepted step, on the estimate's tensors: ``(*new estimate, term)``."""
    state, term = noise.update(noise.NoiseState(previous, variance, count), gradient, scale, True)
    return (*state, term)


def _noise_ratio_and_variance(variance, count, step_size, temperature):
    """:func:`ppl_sgmcmc.noise.ratio` and :func:`ppl_sgmcmc.noise.trace` of the estimate ``(variance, count)``."""
    estimate = noise.NoiseState(variance, variance, count)
    return noise.ratio(estimate, step_size, temperature), noise.trace(estimate)


def _tensor_leaves(tree: Any) -> tuple[list[torch.Tensor], Any] | None:
    """``(tensors, rebuild)``: the tensor leaves of a pytree and ``rebuild(tensors)``, the tree with them replaced;
    ``None`` if a leaf is neither a tensor nor ``None`` (a value a traced graph would freeze)."""
    leaves, spec = pytree.tree_flatten(tree)
    if not all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves):
        return None
    where = [k for k, leaf in enumerate(leaves) if leaf is not None]

    def rebuild(tensors: Any) -> Any:
        filled = list(leaves)
        for k, tensor in zip(where, tensors):
            filled[k] = tensor
        return pytree.tree_unflatten(filled, spec)

    return [leaves[k] for k in where], rebuild


def _finiteness_sum(energy, flat, rule_state):
    """One reduction whose finiteness accepts a step: a sum is finite only if its terms are (a non-finite gradient
    reaches the new state)."""
    total = energy + flat.sum()
    for leaf in rule_state:
        if leaf is not None:  # e.g. CSGLD's momentum
            total = total + leaf.sum()
    return total


def _floating(flat: torch.Tensor) -> torch.Tensor:
    """``flat``, or, if its values are integers (``initial_params`` given as integers), as torch's default float
    dtype: a float64 model keeps its float64 values."""
    return flat if flat.is_floating_point() else flat.to(torch.get_default_dtype())


#: How the step after the warm-up runs. ``"accelerator"``: with no host synchronisation between two draws (on a
#: GPU, ``bool(tensor)``, ``float(tensor)``, ``.item()`` and a copy from pageable host memory each make the host wait
#: for the device): a non-finite step is rejected by selects (``torch.where``) inside the compiled step, whose
#: counters stay on the device until the draw ends; a rejected step's momentum is the one drawn at every step from a
#: stream of its own (the chain's other draws are those of the ``"cpu"`` step); the minibatch indices and the
#: normal draws come from a ``torch.Generator`` on the data's device (on a GPU, another stream than the CPU's: the
#: same chain in distribution, not draw for draw). ``"cpu"``: the step branches on a rejection, which costs nothing
#: there, and redraws the momentum from the chain's generator only then. ``None`` (the default): ``"accelerator"``
#: when the chain's position is not on the CPU; decided at :meth:`SGMCMCKernel.setup`. Only the compiled step (after
#: the warm-up, see ``compile_potential``) is free of host synchronisation; the warm-up's steps are not.
STEP_PATH: str | None = None


def _accelerator_step(device: torch.device) -> bool:
    """Whether a chain whose position lives on ``device`` takes the accelerator step (see :data:`STEP_PATH`)."""
    if STEP_PATH is not None:
        if STEP_PATH not in ("accelerator", "cpu"):
            raise ValueError(f"ppl_sgmcmc.pyro.kernel.STEP_PATH is {STEP_PATH!r}; set it to 'accelerator', 'cpu' "
                             "or None (by the device of the chain's position).")  # fmt: skip
        return STEP_PATH == "accelerator"
    return device.type != "cpu"


def _select(keep: torch.Tensor, new: Any, old: Any) -> list[torch.Tensor]:
    """Leaf by leaf, ``new`` where ``keep`` and ``old`` elsewhere (``keep`` a boolean scalar tensor)."""
    return [torch.where(keep, a, b) for a, b in zip(new, old)]


class _CompiledStep:
    """The arithmetic of one step after the warm-up as one compiled graph: the minibatch gradient's traced graph,
    the rule's move (in the preconditioned coordinates, if any), the sum whose finiteness accepts the step, and
    the step's outcome chosen by selects on that finiteness (no branch, no host synchronisation): the new position,
    rule state, ``Ũ_t`` and gradient-noise estimate of an accepted step, or, for a rejected one, the chain's last
    finite position and rule state with the momentum redrawn from ``refresh`` (:func:`ppl_sgmcmc.rules.
    refresh_momentum`). Eager torch runs each of the rule's elementwise operations as its own call and pass over
    memory; Inductor fuses them with the gradient into one call. The minibatch's indices and the step's normal
    draws come from the chain's generators outside the graph, so the chain draws what the eager step draws.

    ``graph(flat, noise, step size, finite flat, Ũ, refresh, *rule state, *adapt state, *noise state, *gradient
    estimator's state, *gradient inputs)`` (the estimator's state: a variance-reduced estimator's centre, which the
    eager step moves every epoch; none for minibatch gradients) returns ``(new flat, new finite flat, Ũ_t, rejected,
    *new noise state, noise ratio, noise variance, *new rule state)`` (the ratio and variance of the kept estimate,
    which a draw records; ``rejected`` a boolean tensor); ``at_start``: whether the rule took its gradient at the
    chain's position (a rejected step then returns to the last accepted step's start, the finite flat). The tensors of
    the rule state it returned, of the adaptation's state and of the estimator's are kept, so that the next step does
    not take the trees apart again, and so is the step size's tensor."""

    def __init__(self, graph: compile_.CompiledFunction, at_start: bool, rebuild_rule: Any) -> None:
        self.graph, self.at_start, self.rebuild_rule = graph, at_start, rebuild_rule
        self._rule: tuple[Any, list[torch.Tensor]] = (None, [])
        self._adapt: tuple[Any, list[torch.Tensor]] = (None, [])
        self._estimator: tuple[Any, list[torch.Tensor]] = (None, [])
        self._step_size: tuple[float | None, torch.Tensor | None] = (None, None)

    @staticmethod
    def _tensors(tree, kept):
        return kept[1] if tree is kept[0] else _tensor_leaves(tree)[0]

    def __call__(self, flat, noise_draw, step_size, finite_flat, energy, refresh, rule_state, adapt_state, noise_state,
                 gradient_state, gradient_inputs):  # fmt: skip
        """``(new flat, new finite flat, new rule state, Ũ_t, rejected (a boolean tensor), new noise state, its
        (noise ratio, noise variance))``."""
        rule, adapt = self._tensors(rule_state, self._rule), self._tensors(adapt_state, self._adapt)
        estimator = self._tensors(gradient_state, self._estimator)  # a new centre once an epoch
        if self._step_size[0] != step_size:
            self._step_size = (step_size, torch.as_tensor(step_size, dtype=flat.dtype, device=flat.device))
        new_flat, new_finite, energy, rejected, *rest = self.graph(
            flat, noise_draw, self._step_size[1], finite_flat, energy, refresh, *rule, *adapt, *noise_state,
            *estimator, *gradient_inputs,
        )  # fmt: skip
        new_rule = self.rebuild_rule(rest[5:])
        self._rule, self._adapt = (new_rule, rest[5:]), (adapt_state, adapt)
        self._estimator = (gradient_state, estimator)
        return new_flat, new_finite, new_rule, energy, rejected, noise.NoiseState(*rest[:3]), tuple(rest[3:5])


class SGMCMCState(NamedTuple):
    """State of an SG-MCMC chain after a step (the kernel's :attr:`~SGMCMCKernel.state`).

    - **i**: the number of steps taken (warm-up included); the step-size schedule is ``h_i``.
    - **z**: the latent values in unconstrained space, ``{site: tensor}``.
    - **rule_state**: the update rule's auxiliary state, e.g. ``momentum`` and ``thermostat``.
    - **potential_energy**: the *minibatch estimate* ``Ũ_t`` at the point where the step took its
      gradient; noisy and scaled to the full data, not the exact potential ``U``.
    - **step_size**: the step size ``h`` the last step used, in the coordinates of the preconditioner when one
      is adapted: a new kernel takes it back with its preconditioner
      (:meth:`~ppl_sgmcmc.algorithms.Algorithm.tuned_options`), not alone.
    - **diverging**: whether the last step's gradient or new state was non-finite; the step was then
      rejected: the chain kept its last finite position and rule state, except that a momentum is
      redrawn (:func:`ppl_sgmcmc.rules.refresh_momentum`).
    - **num_diverging**: the number of rejected steps so far (warm-up included). On the accelerator step
      (:data:`STEP_PATH`) this and ``diverging`` are tensors on the device until the draw ends.
    - **batch_state**: where the minibatch sampler is (see :mod:`~ppl_sgmcmc.pyro.minibatch`).
    - **gradient_state**: the gradient estimator's state (see :mod:`ppl_sgmcmc.gradients`).
    - **adapt_state**: the warm-up's adaptation (:class:`ppl_sgmcmc.adaptation.AdaptState`: the
      ``preconditioner`` and the tuned ``step_size``, frozen after the warm-up), or, when nothing adapts,
      an empty :class:`~ppl_sgmcmc.adaptation.NoAdaptation`.
    - **noise**: the running estimate of the gradient noise (:class:`ppl_sgmcmc.noise.NoiseState`).
    - **noise_ratio**: the noise ratio of the draw's last step (:mod:`ppl_sgmcmc.noise`), a float.
    - **noise_variance**: the trace of the running noise estimate after the draw's last step,
      ``Σ_k c_k V_kk`` (:func:`ppl_sgmcmc.noise.trace`), which a variance-reduced gradient lowers whatever the
      step size; recorded with every draw, a float.

    **Example** (the state after the first step)::

        >>> import torch
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
        >>> kernel.initial_params = {"x": torch.ones(2)}
        >>> kernel.setup(warmup_steps=0)
        >>> _ = kernel.sample(kernel.initial_params)
        >>> state = kernel.state
        >>> state.i, float(state.potential_energy), state.step_size, state.diverging  # U at the start (1, 1)
        (1, 1.0, 0.1, False)
    """

    i: int
    z: dict
    rule_state: NamedTuple
    potential_energy: torch.Tensor
    step_size: float
    diverging: bool
    num_diverging: int
    batch_state: NamedTuple
    gradient_state: Any
    adapt_state: Any
    noise: noise.NoiseState
    noise_ratio: float
    noise_variance: float


class SGMCMCKernel(Algorithm, MCMCKernel):
    """Base class: an SG-MCMC algorithm (:mod:`ppl_sgmcmc.algorithms`) as a
    :class:`pyro.infer.mcmc.mcmc_kernel.MCMCKernel`.

    Each call of :meth:`sample` draws a fresh minibatch for every subsampled plate of the model from
    the chain's own ``torch.Generator`` (seeded from Pyro's global RNG at :meth:`setup`, so
    ``pyro.set_rng_seed`` makes runs reproducible) and applies the algorithm's update rule once per
    step, with one stochastic gradient ``∇Ũ_t``. Warm-up steps are burn-in: Pyro's ``MCMC`` discards
    them. A step whose gradient or new state is not finite is rejected: the chain keeps its last state
    (with a fresh momentum, for rules that have one) and the step is counted as a divergence.

    The arguments are those of :class:`~ppl_sgmcmc.algorithms.Algorithm` (``init_strategy`` defaults to
    Pyro's ``init_to_uniform``; ``potential_fn(z, generator)`` and ``gibbs_fn(generator, ...)`` receive
    the chain's ``torch.Generator``, see :mod:`ppl_sgmcmc.pyro.gibbs`), and:

    :param compile_potential: trace the potential and its gradient once into a graph of tensor
        operations and replay it every step (default; see :mod:`~ppl_sgmcmc.pyro.compile`); falls back
        to running the model eagerly, with a warning, if the model cannot be traced. Once every step is the
        same function of the chain's tensors (after an adapting warm-up, with no schedule), the whole step
        (the gradient, the rule's move, the check that accepts it and the noise estimate) runs as one
        compiled graph, checked against the eager step before use. ``False`` runs the model through Pyro's
        handlers every step.

    Deterministic sites are evaluated on the full data at every collected (post-warm-up) step and
    returned with the samples.

    **Example** (a kernel on an energy instead of a model: ``potential_fn`` and ``initial_params``; five
    steps per kept draw)::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> def potential(z):  # U(x) = |x|²/2, a standard normal
        ...     return 0.5 * (z["x"] ** 2).sum()
        >>> pyro.set_rng_seed(0)
        >>> kernel = SGLD(potential_fn=potential, step_size=0.05, steps_per_sample=5)
        >>> mcmc = MCMC(kernel, warmup_steps=50, num_samples=200, initial_params={"x": torch.ones(2)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> mcmc.get_samples()["x"].shape
        torch.Size([200, 2])
    """

    warmup_arg = "warmup_steps"
    # the low-rank metric's estimate at a slow window's end: the warm-up's steps run eagerly
    _branch = staticmethod(lambda pred, fn, operand: fn(operand) if bool(pred) else operand)
    state_type: type  # set below: SGMCMCState, or a subclass (ContourState)
    diagnostics_every = 100  # steps between refreshes of the progress-bar string

    def __init__(self, model=None, potential_fn=None, *, compile_potential=True, **kwargs):
        super().__init__(model, potential_fn, **kwargs)
        self._full_data_model = None if model is None else FullDataModel(model)
        self._compile = bool(compile_potential)
        self.transforms = None  # {site: constrained -> unconstrained}, set by `setup`; read by MCMC
        self._initial_params = None
        self._warned_no_plate = False
        self._release()
        self._divergences = []
        self._num_diverging = 0
        self._records = {field: [] for field in self.recorded_fields}
        self._kept = verdict.KeptDraws()

    @property
    def recorded_fields(self):
        """The per-draw statistics the kernel records after the warm-up (ArviZ ``sample_stats``, through
        :meth:`diagnostics`): ``step_size``, ``noise_ratio``, ``noise_variance`` and the algorithm's
        ``sample_stats_fields``.

        **Example**::

            >>> from ppl_sgmcmc.pyro import CSGLD
            >>> CSGLD(potential_fn=lambda z: 0.0, step_size=0.1).recorded_fields
            ('step_size', 'noise_ratio', 'noise_variance', 'log_weight', 'partition')
        """
        return ("step_size", "noise_ratio", "noise_variance", *self.sample_stats_fields)

    @property
    def _score_kind(self):
        """What the target's gradient must also return, by ``rule.NEEDS``: ``"per_example"`` scores, the
        mean score (``True``) or nothing (``False``)."""
        needs = self.rule.NEEDS
        return "per_example" if needs == "per_example" else needs == "score"

    # --- models ------------------------------------------------------------------------------
    @property
    def model(self):
        """The model on its full data (see :func:`~ppl_sgmcmc.pyro.handlers.full_data`): what ArviZ,
        ``Predictive`` and deterministic sites should see. The subsampled model is :attr:`subsampled_model`.
        ``None`` for a kernel built from ``potential_fn``.

        **Example** (the plate of 5 data points runs on all 5, not on a minibatch of 2)::

            >>> import torch, pyro, pyro.distributions as dist
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> def model(y):
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
            ...     with pyro.plate("data", y.shape[0], subsample_size=2):
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
            >>> kernel = SGLD(model, step_size=1e-3)
            >>> pyro.poutine.trace(kernel.model).get_trace(torch.zeros(5)).nodes["y"]["value"].shape
            torch.Size([5])
        """
        return self._full_data_model

    @property
    def subsampled_model(self):
        """The model as declared, with its subsampled plates.

        **Example** (a minibatch of 2 of the 5 data points)::

            >>> import torch, pyro, pyro.distributions as dist
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> def model(y):
            ...     mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
            ...     with pyro.plate("data", y.shape[0], subsample_size=2):
            ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
            >>> kernel = SGLD(model, step_size=1e-3)
            >>> kernel.subsampled_model is model
            True
            >>> pyro.poutine.trace(kernel.subsampled_model).get_trace(torch.zeros(5)).nodes["y"]["value"].shape
            torch.Size([2])
        """
        return self._model

    @property
    def potential_fn(self):
        """The energy ``potential_fn`` the kernel was built from, or ``None`` for a kernel built from a model.

        **Example**::

            >>> from ppl_sgmcmc.pyro import SGLD
            >>> def energy(z):
            ...     return 0.5 * (z["x"] ** 2).sum()
            >>> SGLD(potential_fn=energy, step_size=0.1).potential_fn is energy
            True
        """
        return self._potential_fn

    def step_size_at(self, i):
        """The step size ``h_i`` of step ``i`` (0-based, warm-up included), a float.

        **Example** (a schedule is any callable ``t -> h_t``)::

            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.0, step_size=lambda t: 1.0 / (1 + t))
            >>> kernel.step_size_at(0), kernel.step_size_at(9)
            (1.0, 0.1)
        """
        return float(self._step_size(i)) if callable(self._step_size) else self._step_size

    @property
    def state(self):
        """The chain's :class:`SGMCMCState` after the last step (``None`` before the first); read it
        from a ``hook_fn`` to follow e.g. the thermostat.

        **Example**::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> kernel.state is None
            True
            >>> _ = kernel.sample(kernel.initial_params)
            >>> kernel.state.i, kernel.state.z["x"].shape
            (1, torch.Size([2]))
        """
        return self._state

    # --- pyro.infer.mcmc.mcmc_kernel.MCMCKernel ----------------------------------------------
    @property
    def initial_params(self):
        """Unconstrained initial values (and the deterministic sites there, which Pyro's ``MCMC`` uses
        to know what each sample holds). Set them before :meth:`setup` to choose the chain's start
        (required for a ``potential_fn`` kernel), or let :meth:`setup` draw them from ``init_strategy``.

        **Example**::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.initial_params
            {'x': tensor([1., 1.])}
        """
        if self._initial_params is None or self._target is None:
            return self._initial_params
        return {**self._initial_params, **self._initial_deterministic}

    @initial_params.setter
    def initial_params(self, params):
        self._initial_params = None if params is None else dict(params)

    def setup(self, warmup_steps, *args, **kwargs):
        """Start a chain on the model's arguments: read the model's structure from a prototype trace,
        find initial values (unless ``initial_params`` were set), check the full-data view, and seed the
        chain's generator from Pyro's global RNG. The seed is drawn first, from the CPU generator, before the
        model runs: its draws use the generator of the device they run on, so the seed, and with it the chain
        from a given start, is the same whether the model lives on the CPU or a GPU. ``warmup_steps`` draws
        are burn-in.

        :param warmup_steps: the number of warm-up draws (discarded; they adapt the step size and the
            preconditioner when ``step_size`` was not given).
        :param args: the model's positional arguments (the data); NumPy arrays become tensors.
        :param kwargs: the model's keyword arguments.

        **Example** (Pyro's ``MCMC`` calls it; a positive ``scale`` gets the transform ``log``)::

            >>> import torch, pyro, pyro.distributions as dist
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> def model(y):
            ...     scale = pyro.sample("scale", dist.HalfNormal(1.0))
            ...     with pyro.plate("data", y.shape[0], subsample_size=2):
            ...         pyro.sample("y", dist.Normal(0.0, scale), obs=pyro.subsample(y, event_dim=0))
            >>> kernel = SGLD(model, step_size=1e-3)
            >>> kernel.setup(100, torch.ones(10))
            >>> sorted(kernel.initial_params), float(kernel.transforms["scale"].inv(torch.tensor(0.0)))
            (['scale'], 1.0)
        """
        name = self.name
        _check_one_process(name)
        seed = int(torch.randint(0, 2**62, ()))
        resume = self._resume_from  # a chain to continue (`resume_from`), consumed once set up
        self._warmup_steps = warmup_steps
        # the algorithm's warm-up windows are the chain's own (in steps), also when it continues without a warm-up
        if resume is None:
            self._set_warmup(warmup_steps)
        else:
            self._set_warmup(resume.num_warmup // self._steps_per_sample, steps=resume.num_warmup)
        if resume is not None:
            self._initial_params = dict(resume.state.z)
        args, kwargs = as_tensors(args), as_tensors(kwargs)
        _check_num_samples(name)
        if self._initial_params is not None:
            _check_finite_initial(self._initial_params, name)
        if self._model is not None:
            target = self._make_target(args, kwargs)
            self._check_target(target)
            self._warned_no_plate = self._warned_no_plate or not target.plate_sizes
            if self._initial_params is None:
                self._initial_params = target.initial_params()
            else:
                # the values of other sites of the model (deterministic ones, from a previous run) are dropped
                latents, sites = target.layout.names, target.site_names
                given = {k: v for k, v in self._initial_params.items() if k in latents or k not in sites}
                _model_checks.initial_sites(list(given), latents, "initial_params", name)
                self._initial_params = given
                shapes = {k: tuple(torch.as_tensor(v).shape) for k, v in given.items()}
                chains = "with several chains, Pyro's `MCMC` takes one leading axis of `num_chains`"
                _model_checks.initial_shapes(shapes, target.layout.shapes, "initial_params", chains, name)
        else:
            target = PotentialTarget(self._potential_fn, name)
            if self._initial_params is None:
                target.initial_params()  # raises: a potential_fn needs initial parameters
            self._initial_params = {k: torch.as_tensor(v) for k, v in self._initial_params.items()}
            target.set_layout(self._initial_params)
        self._check_dimension(target, target.layout.size)
        self._epoch_steps = None if self._model is None else self._epoch_length(target)
        self._anchor_steps = None if self._model is None else self._anchor_length(target)
        if self.rule.NEEDS == "per_example":  # one minibatch near the start (SGFS's Fisher)
            flat = _floating(target.layout.ravel(self._initial_params))
            generator = torch.Generator().manual_seed(0)
            batch, _ = target.draw(generator, target.init_batch(generator))
            offset = torch.randn(flat.shape, generator=generator, dtype=flat.dtype).to(flat.device)
            near = flat + 0.01 * offset  # not a special point
            rows = target._eager_gradient(near, batch, "per_example").per_example  # once: not worth compiling
            layout = target.layout
            self._check_scores(rows.detach().cpu(), [name for name in layout.names for _ in range(layout.shapes[name].numel())])
        self._target = target
        self.transforms = target.transforms
        self._initial_deterministic = target.check_full_data(target.layout.ravel(self._initial_params))
        self._generator = torch.Generator().manual_seed(seed)
        self._fixed_step_size = None
        self._step_generator, self._refresh_generator = self._step_generators(target, seed)
        self._state = None
        self._draws = 0
        self._health = health.Reporter(name, tuned=self._tune, reducible=self.variance_reducible,
                                       step_fix=self.step_fix, noise_bias=self.noise_bias)
        self._health_state = None  # the checks' state (ppl_sgmcmc.health.HealthState), from the first check
        if not self._tune:
            _checks.first_step_size(self.step_size_at(0), name)
        self._divergences = []
        self._num_diverging = 0
        self._records = {field: [] for field in self.recorded_fields}
        self._kept = verdict.KeptDraws()  # what the chain's end-of-run verdict reads
        self._logging = None
        if resume is not None:
            self._continue_chain(resume)
            self._resume_from = None

    def _step_generators(self, target, seed):
        """``(the generator of the steps' minibatches and normal draws, the generator of a rejected step's momentum
        or None)``. On the CPU step (:data:`STEP_PATH`), the chain's generator and ``None``. On the accelerator
        step, generators on the device of the chain's position (the chain's own generator on the CPU), the second
        one drawn from at every step; a stochastic ``potential_fn`` and a Gibbs step keep drawing their minibatch
        from the chain's CPU generator, which they are given."""
        device = target.layout.ravel(self._initial_params).device
        if not _accelerator_step(device):
            return self._generator, None
        same = device.type == "cpu" or not isinstance(target, ModelTarget) or isinstance(target, GibbsTarget)
        step = self._generator if same else torch.Generator(device).manual_seed(seed)
        return step, torch.Generator(device).manual_seed(seed // 2 + 1)

    def _make_target(self, args, kwargs):
        """The model's stochastic potential (:class:`~ppl_sgmcmc.pyro.potential.ModelTarget`, or a
        :class:`~ppl_sgmcmc.pyro.gibbs.GibbsTarget` with local Gibbs sites), in the latents' own space
        if :attr:`constrained`."""
        init_strategy = self._init_strategy or init_to_uniform
        target_args = (self._model, args, kwargs, self._replace, self.name, init_strategy, self._compile)
        options = dict(
            warn_no_plate=not self._warned_no_plate, constrained=self.constrained, initial_values=self._initial_params
        )
        if self._gibbs is None:
            return ModelTarget(*target_args, **options)
        return GibbsTarget(*target_args, **options, gibbs=self._gibbs)

    def sample(self, params):
        """``steps_per_sample`` steps of the chain; returns the new unconstrained latent values (and,
        after warm-up, the deterministic sites). ``params`` is used only by the first call after
        :meth:`setup` (it is the chain's start); later calls continue from the kernel's own state.

        **Example**::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> z = kernel.sample(kernel.initial_params)
            >>> for _ in range(2):
            ...     z = kernel.sample(z)
            >>> kernel.state.i, z["x"].shape, kernel.diagnostics()["num_diverging"]
            (3, torch.Size([2]), 0)
        """
        if self._target is None:
            raise RuntimeError(f"{type(self).__name__}: call `setup` before `sample`.")
        if self._state is None:
            self._start(params)
        diverging = False
        for _ in range(self._steps_per_sample):
            diverging |= self._step()
        if self._draws == self._warmup_steps - 1:
            self._replay_warmup()
        draw, self._draws = self._draws, self._draws + 1
        z = self._target.layout.unravel(self._flat)
        summary = self._summary
        if torch.is_tensor(diverging):  # the accelerator step's outcome (STEP_PATH), copied to the host once a draw
            like = self._flat
            values = [diverging, self._num_diverging, *(summary or ())]
            host = torch.stack([torch.as_tensor(v, device=like.device).to(like.dtype) for v in values]).tolist()
            diverging, self._num_diverging, summary = bool(host[0]), int(host[1]), host[2:] or None
        ratio, variance = self._noise_summary(self._state) if summary is None else map(float, summary)
        self._state = self._state._replace(z=z, diverging=diverging, num_diverging=self._num_diverging,
                                           noise_ratio=ratio, noise_variance=variance)  # fmt: skip
        if health.passed_power_of_two(self._state.i - self._steps_per_sample, self._state.i):  # log2 times a run
            self._report_health()
        if draw >= self._warmup_steps:
            if diverging:
                self._divergences.append(draw - self._warmup_steps)
            for field, values in self._records.items():
                values.append(float(getattr(self._state, field)))
            self._kept.add(self._flat)
        if draw >= self._warmup_steps and self._target.deterministic_sites:
            return {**z, **self._target.deterministic(self._flat)}
        return dict(z)

    def _replay_warmup(self):
        """At the end of the warm-up: while it has not settled (:func:`ppl_sgmcmc.adaptation.settled`) and
        ``max_warmup`` leaves replays (:meth:`~ppl_sgmcmc.algorithms.Algorithm.warmup_replays`), run it again from
        where it ended, its windows from the first, within this draw (Pyro's ``MCMC`` counts draws: the next one is
        its first sampling draw)."""
        replays = self.warmup_replays()
        while replays and self._state.i == self._num_warmup_steps:
            adapt_state = self._state.adapt_state
            if bool(adaptation.settled(adapt_state)) or int(adapt_state.rounds) >= replays:
                return
            adapt_state = adapt_state._replace(window_index=torch.zeros_like(adapt_state.window_index),
                                               rounds=adapt_state.rounds + 1)
            self._state = self._state._replace(i=0, adapt_state=adapt_state)
            for _ in range(self._num_warmup_steps):
                self._step()

    def _step(self):
        """One SG-MCMC step: draw a minibatch, apply the rule, reject the move if anything is non-finite,
        measure the gradient noise and, during the warm-up, adapt. Returns whether the step was rejected."""
        state, flat = self._state, self._flat
        self._summary = None
        batch, batch_state = self._target.draw(self._step_generator, state.batch_state)
        gradient_state = state.gradient_state
        if self._epoch_steps is not None and state.i > 0 and state.i % self._epoch_steps == 0:  # a new centre (SVRG)
            gradient_state = self._estimator.init(flat, self._target.full_gradient)
        grad_fn, gradient_state = self._estimator.estimate(
            gradient_state, flat, lambda x: self._target.gradient(x, batch, self._score_kind), state.i
        )
        if self._anchor_steps is not None and state.i % self._anchor_steps == 0:  # the rule's anchors (replica exchange)
            state = state._replace(
                rule_state=self._anchor(state.rule_state, flat, state.adapt_state, self._target.full_energy)
            )
            self._state = state
        step_size = self._fixed_step_size
        if step_size is None:
            step_size = float(self.step_size_in(state.adapt_state, state.i))
        noise_draw = self._normal(flat, self.noise_shape(flat.shape[0]), self._step_generator)
        finite, at_start, gradient = False, False, None
        compiled = self._compiled_step(state, flat, batch, step_size, noise_draw, gradient_state) if step_size > 0 else None
        if compiled is not None:
            return self._take_compiled_step(compiled, batch, batch_state, gradient_state, step_size, noise_draw)
        if step_size > 0:  # a schedule gone non-positive or NaN: the step is rejected (and reported)
            new_flat, rule_state, gradient, at_start = self._move(
                flat, state.rule_state, grad_fn, noise_draw, step_size, state.i, state.adapt_state, state.noise
            )
            new_energy = gradient.energy
            finite = bool(torch.isfinite(_finiteness_sum(new_energy, new_flat, rule_state)))
        # A rejected step of a rule that takes its gradient at the chain's position (SGLD, pSGLD, SGFS, SGRLD)
        # returns to where the last accepted step started, whose gradient was finite: a step that landed where
        # the model is undefined is undone. Other rules keep the position.
        if at_start:
            flat, self._finite_flat = (flat, flat) if finite else (self._finite_flat, self._finite_flat)
        noise_state, adapt_state = state.noise, state.adapt_state
        if finite:
            self._flat = new_flat
            energy, diverging = new_energy, False
            noise_state, term, valid = self._measure_noise(noise_state, gradient, rule_state, True, state.i, flat)
        else:
            self._flat = flat
            rule_state, energy, diverging = state.rule_state, state.potential_energy, True
            if self._epoch_steps is None:  # a new centre (SVRG) stays, whatever the step did
                gradient_state = state.gradient_state
            if has_momentum(rule_state):  # redraw the momentum that made the step diverge
                rule_state = refresh_momentum(rule_state, self._normal(flat), self.temperature_at(state.i))
            self._num_diverging += 1
            term, valid = torch.zeros_like(flat), False
        if self.adapts and state.i < self._num_warmup_steps:
            adapt_state, noise_state, rule_state, self._flat = self._adapt(
                adapt_state, noise_state, rule_state, self._flat, energy, term, valid, state.i, self._normal(flat)
            )
        self._end_step(rule_state, energy, step_size, diverging, batch_state, gradient_state, adapt_state, noise_state)
        return diverging

    def _take_compiled_step(self, compiled, batch, batch_state, gradient_state, step_size, noise_draw):
        """The step after the warm-up through the compiled graph (:class:`_CompiledStep`), which rejects a non-finite
        step by selects. On the accelerator step (:data:`STEP_PATH`) nothing here waits for the device: the
        rejected step's fresh momentum is drawn at every step from the chain's refresh generator, and whether the
        step was rejected (a boolean tensor, returned) and the count of rejected steps stay tensors until the draw
        ends (:meth:`sample`). On the CPU step, a rejection is read at once and its momentum drawn from the chain's
        generator, as the eager step does."""
        state, flat = self._state, self._flat
        self._fixed_step_size = step_size  # frozen after the warm-up (`_same_step_after_warmup`)
        accelerated = self._refresh_generator is not None
        redraw = accelerated and has_momentum(state.rule_state)
        refresh = self._normal(flat, generator=self._refresh_generator) if redraw else flat  # flat: not read
        energy = torch.as_tensor(state.potential_energy, dtype=flat.dtype, device=flat.device)
        gradient_inputs = self._target.traced_gradient(flat, batch, self._score_kind)[1]
        self._flat, finite_flat, rule_state, energy, rejected, noise_state, self._summary = compiled(
            flat, noise_draw, step_size, self._finite_flat, energy, refresh, state.rule_state, state.adapt_state,
            state.noise, gradient_state, gradient_inputs,
        )  # fmt: skip
        if compiled.at_start:
            self._finite_flat = finite_flat
        if not accelerated:
            rejected = bool(rejected)
            if rejected and has_momentum(rule_state):  # the momentum that made the step diverge, redrawn
                rule_state = refresh_momentum(state.rule_state, self._normal(flat), self.temperature_at(state.i))
        self._num_diverging = self._num_diverging + rejected
        self._end_step(rule_state, energy, step_size, rejected, batch_state, gradient_state, state.adapt_state,
                       noise_state)  # fmt: skip
        return rejected

    def _end_step(
        self, rule_state, energy, step_size, diverging, batch_state, gradient_state, adapt_state, noise_state
    ):
        """Track a changing preconditioner's range (:func:`ppl_sgmcmc.health.track`) and set the state after a step."""
        state = self._state
        tracked = self._changing_preconditioner(rule_state)
        if tracked is not None:  # a preconditioner that changes along the chain: its range since the last check
            checks = self._health_state if self._health_state is not None else health.init(self._flat, tracked)
            self._health_state = health.track(checks, tracked)
        # z is filled in once per draw, by `sample`
        self._state = self.state_type(
            state.i + 1,
            None,
            rule_state,
            energy,
            step_size,
            diverging,
            self._num_diverging,
            batch_state,
            gradient_state,
            adapt_state,
            noise_state,
            state.noise_ratio,  # these two are brought up to date once per draw, by `sample`
            state.noise_variance,
        )

    def _compiled_step(self, state, flat, batch, step_size, noise_draw, gradient_state):
        """The step as one compiled graph (:class:`_CompiledStep`), or ``None``: the step runs eagerly. Compiled
        once (the step size is an input), with ``compile_potential``, once the step is the same at every step
        (:meth:`~ppl_sgmcmc.algorithms.Algorithm._same_step_after_warmup`, and past an adapting warm-up), for a
        model whose gradient is a traced graph (not a ``potential_fn``, not a Gibbs step). The first compiled
        graph is checked against the eager step on this step's inputs; one that disagrees is not used."""
        if not self._compile or (self.adapts and state.i < self._num_warmup_steps):
            return None
        if self._same_step is None:
            self._same_step = self._same_step_after_warmup()
        if not self._same_step:
            return None
        key = ("step", self._score_kind)
        if key not in self._graphs:
            self._graphs[key] = self._trace_step(state, flat, batch, step_size, noise_draw, gradient_state)
        return self._graphs[key]

    def _trace_step(self, state, flat, batch, step_size, noise_draw, gradient_state):
        traced = self._target.traced_gradient(flat, batch, self._score_kind)
        rule, adapt = _tensor_leaves(state.rule_state), _tensor_leaves(state.adapt_state)
        estimator = _tensor_leaves(gradient_state)  # a variance-reduced estimator's centre: inputs, moved eagerly
        if traced is None or rule is None or adapt is None or estimator is None:
            return None
        gradient_graph, gradient_inputs = traced
        (rule_tensors, rebuild_rule), (adapt_tensors, rebuild_adapt) = rule, adapt
        estimator_tensors, rebuild_estimator = estimator
        sizes = [len(rule_tensors), len(adapt_tensors), len(state.noise), len(estimator_tensors)]
        i, found = state.i, {}
        temperature = torch.as_tensor(self.temperature_at(i), dtype=flat.dtype, device=flat.device)

        def step(flat, noise_draw, step_size, finite_flat, energy, refresh, *tensors):
            rule_tensors, adapt_tensors = tensors[: sizes[0]], tensors[sizes[0] : sizes[0] + sizes[1]]
            noise_state = noise.NoiseState(*tensors[sizes[0] + sizes[1] : sum(sizes[:3])])
            estimator_state = rebuild_estimator(tensors[sum(sizes[:3]) : sum(sizes)])

            def minibatch_grad_fn(x):
                energy, grad, *score = gradient_graph(x, *tensors[sum(sizes) :])
                return StochasticGradient(energy, grad, *(score or [None]))

            grad_fn = self._estimator.estimate(estimator_state, flat, minibatch_grad_fn, i)[0]
            old_rule = rebuild_rule(rule_tensors)
            new_flat, rule_state, gradient, at_start = self._move(
                flat, old_rule, grad_fn, noise_draw, step_size, i, rebuild_adapt(adapt_tensors), noise_state
            )
            new_rule = _tensor_leaves(rule_state)
            if has_momentum(old_rule):  # what a rejected step keeps: a fresh momentum
                old_rule = refresh_momentum(old_rule, refresh, temperature)
            old_leaves = _tensor_leaves(old_rule)[0]
            if len(old_leaves) != len(new_rule[0]):
                raise ValueError("the rule's state changes its structure in a step")  # not compiled: runs eagerly
            found["at_start"], found["rebuild"] = at_start, new_rule[1]
            scale = torch.as_tensor(self.noise_scale(rule_state, i, flat), dtype=flat.dtype, device=flat.device)
            measured, _ = noise.update(noise_state, gradient.grad, scale, True)
            finite = torch.isfinite(_finiteness_sum(gradient.energy, new_flat, rule_state))
            kept = noise.NoiseState(*_select(finite, measured, noise_state))
            summary = _noise_ratio_and_variance(kept.variance, kept.count, step_size, temperature)
            back = finite_flat if at_start else flat  # where a rejected step returns
            return (torch.where(finite, new_flat, back), torch.where(finite, flat, finite_flat),
                    torch.where(finite, gradient.energy, energy), ~finite, *kept, *summary,
                    *_select(finite, new_rule[0], old_leaves))  # fmt: skip

        step_size = torch.as_tensor(step_size, dtype=flat.dtype, device=flat.device)
        energy = torch.as_tensor(state.potential_energy, dtype=flat.dtype, device=flat.device)
        inputs = (flat, noise_draw, step_size, self._finite_flat, energy, torch.zeros_like(flat), *rule_tensors,
                  *adapt_tensors, *state.noise, *estimator_tensors, *gradient_inputs)  # fmt: skip
        graph = compile_.compile_tensors(step, inputs)
        if graph is None:
            return None
        if not all(compile_.close(a, b) for a, b in zip(graph(*inputs), step(*inputs))):
            return None
        return _CompiledStep(graph, found["at_start"], found["rebuild"])

    def _measure_noise(self, noise_state, gradient, rule_state, accepted, i, position):
        """:meth:`Algorithm._measure_noise <ppl_sgmcmc.algorithms.Algorithm._measure_noise>`; for an accepted
        step with ``compile_potential``, through one compiled graph (:meth:`_compiled`): eager torch makes about
        ten passes over the gradient for it, a cost of the order of the whole step for a large network."""
        grad = gradient.grad
        scale = torch.as_tensor(self.noise_scale(rule_state, i, position), dtype=grad.dtype, device=grad.device)
        inputs = (*noise_state, grad, scale)
        update = self._compiled("noise update", _accepted_noise_update, inputs) if accepted is True else None
        if update is None:
            return super()._measure_noise(noise_state, gradient, rule_state, accepted, i, position)
        *new_state, term = update(*inputs)
        return noise.NoiseState(*new_state), term, noise_state.count >= 0

    def _noise_summary(self, state):
        """``(noise ratio, noise variance)`` after the last step, floats (:func:`_noise_ratio_and_variance`),
        through one compiled graph with ``compile_potential``."""
        dtype = state.noise.variance.dtype
        inputs = (state.noise.variance, state.noise.count, torch.as_tensor(state.step_size, dtype=dtype),
                  torch.as_tensor(self.temperature_at(state.i - 1), dtype=dtype))  # fmt: skip
        compiled = self._compiled("noise summary", _noise_ratio_and_variance, inputs)
        return tuple(float(value) for value in (compiled or _noise_ratio_and_variance)(*inputs))

    def _compiled(self, name, fn, inputs):
        """``fn`` compiled for inputs shaped like ``inputs`` (:func:`~ppl_sgmcmc.pyro.compile.compile_tensors`,
        once per shapes, dtypes and devices), or ``None`` without ``compile_potential`` or if it cannot be
        compiled: the caller then runs ``fn`` eagerly."""
        if not self._compile:
            return None
        key = (name, *((t.shape, t.dtype, t.device) for t in inputs))
        if key not in self._graphs:
            self._graphs[key] = compile_.compile_tensors(fn, inputs)
        return self._graphs[key]

    def _start(self, params):
        params = self._initial_params if params is None else params
        flat = self._target.layout.ravel({name: params[name] for name in self._target.layout.names})
        flat = _floating(flat)
        if self._start_warning:
            warnings.warn(self._start_warning, UserWarning, stacklevel=3)
        target, score_kind = self._target, self._score_kind
        if self._find_mode_steps:
            flat = warmup.find_mode(target, flat, self._generator, self._find_mode_steps, score_kind)
        laplace = probe = None
        if self._adapt_mass and not self._exact_hessian(flat.shape[0], adaptation.EXACT_HESSIAN_MAX):
            # many coordinates: the Hessian's diagonal, and the curvature it leaves
            batches = target.epoch(self._generator, adaptation.hessian_rows(target.data_size, 1))
            pre, _ = self._laplace(warmup.hessian_diagonal(target, flat, batches, self._generator)[0])
            laplace = pre, warmup.largest_curvature(target, flat, batches, pre.scale, self._generator)
        elif self._adapt_mass:
            rows = adaptation.hessian_rows(target.data_size, flat.shape[0])
            batches = target.epoch(self._generator, rows)
            if self._find_mode_steps:  # Newton steps from the optimiser's end, line-searched on every row
                every_row = batches if rows >= target.data_size else target.epoch(self._generator, target.data_size)
                flat, hessian = warmup.newton(target, flat, every_row, score_kind, batches)
            else:
                hessian = warmup.hessian(target, flat, batches)[0]
            laplace = self._laplace(hessian)
        if self._tune:
            n = max((n for _, n in target.plate_sizes.values()), default=1)
            batches = target.epoch(self._generator, self._probe_batches(flat.shape[0]) * n)
            probe = warmup.probe(target, flat, batches, score_kind)
        self._flat = self._finite_flat = flat
        rule_state = self.rule_init(flat, self._normal(flat, self.noise_shape(flat.shape[0])))
        energy = None
        if probe is not None:  # the start's minibatch energy, the first best of the warm-up (see adaptation.ran_off)
            energy = probe.energy.mean()
        elif laplace is not None:
            energy = target.gradient(flat, batches[0], score_kind).energy
        adapt_state, rule_state = self._initial_adaptation(flat, laplace, probe, rule_state, energy)
        self._state = self.state_type(
            i=0,
            z=self._target.layout.unravel(flat),
            rule_state=rule_state,
            potential_energy=torch.full((), float("nan"), dtype=flat.dtype, device=flat.device),
            step_size=float(self.step_size_in(adapt_state, 0)),
            diverging=False,
            num_diverging=0,
            batch_state=self._target.init_batch(self._step_generator),
            gradient_state=self._estimator.init(flat, target.full_gradient if self._estimator.needs_full_gradient else None),
            adapt_state=adapt_state,
            noise=noise.init(flat),
            noise_ratio=float("nan"),
            noise_variance=float("nan"),
        )

    def _report_health(self):
        """Warn, once per run and kind, when the chain shows a known failure (:mod:`ppl_sgmcmc.health`)."""
        state = self._state
        if state is not None:
            checks = self._health_state if self._health_state is not None else health.init(self._flat)
            measured = int(state.noise.count) >= noise.HORIZON and state.i >= self._num_warmup_steps
            ratio = state.noise_ratio if measured else float("nan")  # as NumPyro's `_measured_ratio`
            restarts = state.adapt_state.restarts if self.adapts else 0
            checks = health.update(
                checks, state.i, state.num_diverging, state.step_size, self._flat, self._watched_state(state.rule_state), ratio,
                self.noise_ratio_limit, restarts, self._measured_change(checks), exploring=self._exploring(state.i),
            )
            self._health_state = checks
            self._health.report(checks.flags.tolist(), checks.values.tolist())

    def _report_verdict(self):
        """The chain's end-of-run verdict (:mod:`ppl_sgmcmc.verdict`, the chain judged alone: Pyro runs chains in
        separate processes or one after another; :func:`ppl_sgmcmc.diagnostics.verdict` judges a run's chains
        together), with one warning if it failed."""
        if not self.samples_posterior or self._judged_after_run or len(self._kept.rows) < verdict.MIN_DRAWS:
            return
        ratios = self._records.get("noise_ratio")
        result = verdict.assess(self._kept.draws(), noise_ratio=None if ratios is None else [ratios],
                                noise_limit=self.noise_ratio_limit,
                                advice=self.verdict_advice(self._state.rule_state))  # fmt: skip
        if not self._health.named_failure:  # a failed health check already named the chain's failure
            verdict.report(result, self.name, stacklevel=3)

    def _normal(self, like, shape=None, generator=None):
        """Standard normal noise of the shape of ``like`` (or ``shape``) and its dtype on its device, from the chain's
        generator (or ``generator``), drawn on the generator's device."""
        generator = self._generator if generator is None else generator
        shape = like.shape if shape is None else shape
        return torch.randn(shape, generator=generator, dtype=like.dtype, device=generator.device).to(like.device)

    def logging(self):
        """The progress bar's postfix, the items of :meth:`progress` (``Ũ_t``, the step size, the number of
        rejected steps, the algorithm's own), refreshed every ``diagnostics_every`` steps (Pyro asks for it
        after every step); ``None`` before the first step.

        **Example**::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> _ = kernel.sample(kernel.initial_params)
            >>> dict(kernel.logging())  # U at the start (1, 1), h, rejected steps
            {'Ũ_t': '1', 'h': '1.00e-01', 'div': 0}
        """
        state = self._state
        if state is None:
            return None
        if self._logging is None or self._draws % self.diagnostics_every == 1 or self.diagnostics_every == 1:
            self._logging = OrderedDict(self.progress(state))
        return self._logging

    def diagnostics(self):
        """``divergences``: the draws (post-warm-up indices) with a step rejected as non-finite,
        as ``arviz.from_pyro`` and ``MCMC.summary`` expect; ``num_diverging``: all rejected steps,
        warm-up included; and the algorithm's per-draw ``sample_stats_fields`` (lists over the kept
        draws) and ``final_state_fields`` (CSGLD: ``log_weight``, ``partition``; ``theta``,
        ``energy_min``, ``energy_gap``), one entry per chain in ``MCMC.diagnostics()``.

        **Example** (a step to an infinite energy is rejected: the chain stays where it was)::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: (z["x"] ** 2).sum() / 0.0, step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> kernel.sample(kernel.initial_params)["x"], kernel.diagnostics()
            (tensor([1., 1.]), {'divergences': [0], 'num_diverging': 1, 'step_size': [0.1], 'noise_ratio': [nan],
             'noise_variance': [nan]})
        """
        out = {"divergences": list(self._divergences), "num_diverging": self._num_diverging}
        out.update({field: list(values) for field, values in self._records.items()})
        if self._state is not None:
            out.update({field: getattr(self._state.rule_state, field).tolist() for field in self.final_state_fields})
        return out

    def cleanup(self):
        """End of a chain: the next :meth:`setup` starts a new chain from new initial values (or continues
        :attr:`resume_from`). The chain's final state, with its generator's, is kept as :attr:`last_state`
        (Pyro's ``MCMC`` calls this at the end of every chain, and again after it: the second call keeps it).

        **Example**::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> _ = kernel.sample(kernel.initial_params)
            >>> kernel.cleanup()
            >>> kernel.state is None, kernel.initial_params is None, kernel.last_state.state.i
            (True, True, 1)
        """
        state = self._state
        if state is not None and state.z is not None and self._generator is not None:
            from ppl_sgmcmc.checkpoint import ChainState

            self._report_health()  # the end of the run: its last check
            self._report_verdict()

            self._last_state = ChainState(state, self._generator.get_state(), self._num_warmup_steps)
        self._initial_params = None
        self._release()

    def _release(self):
        self._target = None
        self._generator = None
        self._state = None
        self._flat = None
        self._logging = None
        self._graphs = {}
        self._same_step = None  # whether a step after the warm-up compiles (_compiled_step), once known
        self._fixed_step_size = None  # the step size after the warm-up, once a step is compiled
        self._step_generator = self._refresh_generator = None  # see `setup`
        self._initial_deterministic = {}
        self._warmup_steps = 0
        self._draws = 0

    @staticmethod
    def _is_positive_support(support):
        """Whether ``support`` is ``constraints.positive`` (or ``nonnegative``, torch's support of ``Gamma``,
        ``Exponential``, ``HalfNormal``), possibly made independent over event dimensions."""
        while isinstance(support, constraints.independent):
            support = support.base_constraint
        return support is constraints.positive or support is constraints.nonnegative

    @staticmethod
    def _jacobian(fn):
        """``z -> ∂fn(z)/∂z`` by forward-mode autodiff, ``torch.func.jacfwd`` (the output's axes, then the input's):
        the derivatives of the complete recipe's ``D(z)`` and ``Q(z)`` (:class:`~ppl_sgmcmc.algorithms.Recipe`),
        which must then be written in operations ``torch.func`` transforms."""
        return torch.func.jacfwd(fn)

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ("_target", "_generator", "_step_generator", "_refresh_generator", "_state", "_flat", "_logging"):
            state[key] = None
        state["_graphs"] = {}
        return state

    # --- continuing a chain ------------------------------------------------------------------
    _last_state = None  # the ChainState kept by `cleanup`
    _resume_from = None  # the ChainState the next `setup` continues

    @property
    def last_state(self) -> Any:
        """The chain's :class:`~ppl_sgmcmc.checkpoint.ChainState` at the end of its last run: its
        :class:`SGMCMCState` (position, rule state, step counter, minibatch sampler), its generator's state
        and its warm-up; ``None`` before the first run ends. :meth:`cleanup` keeps it (``MCMC.run`` ends
        each chain with it; with chains drawn in sequence, it is the last chain's). It pickles, and so
        does the kernel with it. Continue the chain with :attr:`resume_from`.

        **Example**::

            >>> import torch, pyro
            >>> from pyro.infer import MCMC
            >>> from ppl_sgmcmc.pyro import SGNHT
            >>> kernel = SGNHT(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.last_state is None
            True
            >>> MCMC(kernel, warmup_steps=10, num_samples=20, initial_params={"x": torch.ones(2)},
            ...      disable_progbar=True).run()
            >>> state = kernel.last_state
            >>> state.state.i, state.state.rule_state.thermostat.shape, state.num_warmup
            (30, torch.Size([2]), 10)
        """
        return self._last_state

    @property
    def resume_from(self) -> Any:
        """A :class:`~ppl_sgmcmc.checkpoint.ChainState` (e.g. :attr:`last_state`, possibly unpickled in
        another process) for the next :meth:`setup` to continue instead of starting a new chain: the
        position, the rule's state, the step counter (and so the schedules), the minibatch sampler, the
        number of rejected steps and the generator are the state's, and the algorithm keeps the chain's
        first warm-up for its warm-up windows. ``MCMC(kernel, warmup_steps=0, num_samples=S2).run(...)``
        after ``MCMC(kernel, warmup_steps=W, num_samples=S1)`` then gives exactly the draws ``S1 ...
        S1 + S2`` of one run of ``W + S1 + S2`` steps, whatever Pyro's global seed. A nonzero
        ``warmup_steps`` discards that many more draws of the continued chain. The first :meth:`setup`
        consumes it (a later chain starts anew): one chain per ``MCMC`` (``num_chains=1``). Any
        ``initial_params`` are ignored. ``None`` (default): start a new chain.

        **Example** (30 draws, then 20 more: the last 20 draws of one run of 50)::

            >>> import torch, pyro
            >>> from pyro.infer import MCMC
            >>> from ppl_sgmcmc.pyro import SGNHT
            >>> def kernel():
            ...     return SGNHT(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> def run(kernel, warmup_steps, num_samples):
            ...     mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples,
            ...                 initial_params={"x": torch.ones(2)}, disable_progbar=True)
            ...     mcmc.run()
            ...     return mcmc.get_samples()["x"]
            >>> pyro.set_rng_seed(0)
            >>> whole = run(kernel(), 10, 50)
            >>> pyro.set_rng_seed(0)
            >>> first = kernel()
            >>> _ = run(first, 10, 30)
            >>> second = kernel()
            >>> second.resume_from = first.last_state
            >>> torch.equal(run(second, 0, 20), whole[30:]), second.last_state.state.i
            (True, 60)
        """
        return self._resume_from

    @resume_from.setter
    def resume_from(self, state: Any) -> None:
        # by its fields, not its class: a state unpickled elsewhere is one too
        if state is not None and not all(hasattr(state, f) for f in ("state", "generator_state", "num_warmup")):
            raise TypeError(
                f"{self.name}: `resume_from` takes a ppl_sgmcmc.checkpoint.ChainState (a kernel's `last_state`), "
                f"got {type(state).__name__}."
            )
        self._resume_from = state

    def _continue_chain(self, resume: Any) -> None:
        """Make the chain that :meth:`setup` has just set up the continuation of ``resume``."""
        state, layout = resume.state, self._target.layout
        if type(state).__name__ != self.state_type.__name__:
            raise TypeError(
                f"{self.name}: `resume_from` holds a {type(state).__name__}, not a {self.state_type.__name__}: "
                "continue a chain with a kernel of its own kind."
            )
        own = type(self.rule_init(self._target.layout.ravel(state.z), self._target.layout.ravel(state.z))).__name__
        if type(state.rule_state).__name__ != own:  # another algorithm's chain: its rule state has other fields
            raise TypeError(
                f"{self.name}: `resume_from` holds the state of another algorithm's chain (its rule state is a "
                f"{type(state.rule_state).__name__}, {self.name}'s a {own}): continue a chain with a kernel of its "
                f"own kind, or start a new {self.name} chain where it ended: `kernel.initial_params = state.state.z`."
            )
        shapes = {name: tuple(state.z[name].shape) for name in layout.names}
        expected = {name: tuple(layout.shapes[name]) for name in layout.names}
        if shapes != expected:
            raise ValueError(f"{self.name}: `resume_from` holds latents of shapes {shapes}; the model's are {expected}.")
        self._flat = self._finite_flat = layout.ravel(state.z)
        self._generator.set_state(resume.generator_state)
        self._num_diverging = int(state.num_diverging)
        self._state = state
        # the frozen-chain check compares with the continued chain's own position and step
        anchor = health.init(self._flat, self._changing_preconditioner(state.rule_state))
        self._health_state = anchor._replace(anchor_step=torch.full_like(anchor.anchor_step, float(state.i)))


SGMCMCKernel.state_type = SGMCMCState
