"""The base class of the Pyro SG-MCMC kernels: state, step, divergence handling, diagnostics.

An algorithm subclass names its update rule (a module of :mod:`ppl_sgmcmc.rules`) and its
validated hyper-parameters; everything else is here. It mirrors
:class:`ppl_sgmcmc.numpyro.kernel.SGMCMCKernel` under Pyro's stateful kernel protocol:
``setup(warmup_steps, *args)``, ``initial_params``, ``sample(params) -> params``, ``logging()``,
``diagnostics()`` and ``cleanup()``.
"""

from collections import OrderedDict
from typing import NamedTuple

import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from ppl_sgmcmc import _hyperparameters
from ppl_sgmcmc.pyro.gibbs import GibbsTarget
from ppl_sgmcmc.pyro.handlers import FullDataModel, as_tensors
from ppl_sgmcmc.pyro.potential import ModelTarget, PotentialTarget
from ppl_sgmcmc.rules import has_momentum, refresh_momentum

__all__ = ["SGMCMCKernel", "SGMCMCState"]


class SGMCMCState(NamedTuple):
    """State of an SG-MCMC chain after a step (the kernel's :attr:`~SGMCMCKernel.state`).

    - **i**: the number of steps taken (warm-up included); the step-size schedule is ``h_i``.
    - **z**: the latent values in unconstrained space, ``{site: tensor}``.
    - **rule_state**: the update rule's auxiliary state, e.g. ``momentum`` and ``thermostat``.
    - **potential_energy**: the *minibatch estimate* ``Ũ_t`` at the point where the step took its
      gradient; noisy and scaled to the full data, not the exact potential ``U``.
    - **step_size**: the step size ``h`` the last step used.
    - **diverging**: whether the last step's gradient or new state was non-finite; the step was then
      rejected: the chain kept its last finite position and rule state, except that a momentum is
      redrawn (:func:`ppl_sgmcmc.rules.refresh_momentum`).
    - **num_diverging**: the number of rejected steps so far (warm-up included).
    - **batch_state**: where the minibatch sampler is (see :mod:`~ppl_sgmcmc.pyro.minibatch`).

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


class SGMCMCKernel(MCMCKernel):
    """Base class: an SG-MCMC algorithm as a :class:`pyro.infer.mcmc.mcmc_kernel.MCMCKernel`.

    Each call of :meth:`sample` draws a fresh minibatch for every subsampled plate of the model from
    the chain's own ``torch.Generator`` (seeded from Pyro's global RNG at :meth:`setup`, so
    ``pyro.set_rng_seed`` makes runs reproducible) and applies the subclass's update rule once,
    with one stochastic gradient ``∇Ũ_t``. Warm-up steps are burn-in: Pyro's ``MCMC`` discards them;
    nothing adapts (the step-size schedule runs on through them). A step whose gradient or new state
    is not finite is rejected: the chain keeps its last state (with a fresh momentum, for rules that have
    one) and the step is counted as a divergence.

    :param model: a Pyro model; its plates with ``subsample_size`` set are subsampled.
    :param potential_fn: instead of a model, an energy ``potential_fn(z)``, or ``potential_fn(z, generator)``
        returning a stochastic estimate (``generator``: the chain's ``torch.Generator``); needs
        ``initial_params`` in :class:`~pyro.infer.mcmc.api.MCMC`.
    :param step_size: ``h``: a positive float, or a schedule ``t -> h_t`` (see :mod:`ppl_sgmcmc.schedules`).
    :param temperature: ``τ``; the target is ``exp(-U/τ)``.
    :param replace: draw minibatch indices with replacement (default), or reshuffle each epoch.
    :param steps_per_sample: SG-MCMC steps per call of :meth:`sample` (default 1), i.e. per draw that
        Pyro's ``MCMC`` counts and keeps: with ``k`` here, ``MCMC(warmup_steps=W, num_samples=S)`` takes
        ``k (W + S)`` steps and keeps every ``k``-th state. Pyro's ``MCMC`` has no thinning, and per
        draw it logs the progress-bar string and copies the sample (about 0.1 ms, comparable to a small
        model's step); ``k > 1`` amortises that and thins.
    :param init_strategy: a Pyro init strategy (default ``init_to_uniform``, values uniform in (-2, 2)
        in unconstrained space).
    :param compile_potential: trace the potential and its gradient once into a graph of tensor
        operations and replay it every step (default; see :mod:`~ppl_sgmcmc.pyro.compile`); falls back
        to running the model eagerly, with a warning, if the model cannot be traced. ``False`` runs
        the model through Pyro's handlers every step.
    :param gibbs_sites: names of local latent sites inside the subsampled plate (e.g. discrete topic
        assignments) that ``gibbs_fn`` updates for each minibatch; the stochastic gradient then averages
        the log joint's gradient over their sweeps (Fisher identity). See :mod:`ppl_sgmcmc.pyro.gibbs`
        for the contract.
    :param gibbs_fn: ``gibbs_fn(generator, gibbs_sites, hmc_sites, subsample_indices) -> gibbs_sites``,
        one conditional sweep of the local sites of the minibatch (data by closure).
    :param gibbs_sweeps: ``(burn_in, kept)`` sweeps per gradient (default ``(5, 5)``).
    :param gibbs_init: optional ``gibbs_init(generator, gibbs_sites, hmc_sites, subsample_indices) -> gibbs_sites``
        giving the sweeps' starting point from the local sites' prior draw (default: start at the prior draw).

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

    rule = None  # a module of ppl_sgmcmc.rules, set by subclasses
    needs_score = False  # whether the rule reads the mean per-datum score ḡ_t (costs a second backward pass)
    constrained = False  # True: the chain moves the latents in their own support (no transforms; SGRLD)

    @property
    def _score_kind(self):
        """What the target's gradient must also return: ``"per_example"`` scores (rules with
        ``PER_EXAMPLE_SCORES``, SGFS), the mean score (``True``) or nothing (``False``)."""
        if getattr(self.rule, "PER_EXAMPLE_SCORES", False):
            return "per_example"
        return self.needs_score
    diagnostics_every = 100  # steps between refreshes of the progress-bar string

    def __init__(
        self,
        model=None,
        potential_fn=None,
        *,
        step_size,
        temperature=1.0,
        replace=True,
        steps_per_sample=1,
        init_strategy=init_to_uniform,
        compile_potential=True,
        gibbs_sites=None,
        gibbs_fn=None,
        gibbs_sweeps=(5, 5),
        gibbs_init=None,
    ):
        gibbs = (gibbs_sites, gibbs_fn, gibbs_sweeps, gibbs_init)
        self._step_size, self._temperature, self._steps_per_sample, self._gibbs = _hyperparameters.sampler(
            model, potential_fn, step_size, temperature, steps_per_sample, gibbs, type(self).__name__
        )
        self._options = {}  # the algorithm's own rule keyword arguments (`_hyperparameters`), set by subclasses
        self._model = model
        self._full_data_model = None if model is None else FullDataModel(model)
        self._potential_fn = potential_fn
        self._replace = bool(replace)
        self._init_strategy = init_strategy
        self._compile = bool(compile_potential)
        self.transforms = None  # {site: constrained -> unconstrained}, set by `setup`; read by MCMC
        self._initial_params = None
        self._warned_no_plate = False
        self._release()
        self._divergences = []
        self._num_diverging = 0

    # --- what subclasses provide -------------------------------------------------------------
    def hyperparameters(self):
        """The rule's keyword arguments besides ``step_size`` (``temperature`` included).

        **Example**::

            >>> from ppl_sgmcmc.pyro import SGLD
            >>> SGLD(potential_fn=lambda z: 0.0, step_size=0.1, temperature=2.0).hyperparameters()
            {'temperature': 2.0}
        """
        return {"temperature": self._temperature, **self._options}

    def _logging_items(self, state):
        return OrderedDict(
            [
                ("Ũ_t", f"{float(state.potential_energy):.4g}"),
                ("h", f"{state.step_size:.2e}"),
                ("div", state.num_diverging),
            ]
        )

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
        chain's generator from Pyro's global RNG. ``warmup_steps`` draws are burn-in.

        :param warmup_steps: the number of warm-up draws (burn-in; nothing adapts).
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
        name = type(self).__name__
        self._warmup_steps = warmup_steps
        args, kwargs = as_tensors(args), as_tensors(kwargs)
        if self._model is not None:
            target = self._make_target(args, kwargs)
            self._warned_no_plate = self._warned_no_plate or not target.plate_sizes
            if self._initial_params is None:
                self._initial_params = target.initial_params()
            else:
                missing = [k for k in target.layout.names if k not in self._initial_params]
                if missing:
                    raise ValueError(
                        f"{name}: `initial_params` lacks the latent site(s) {', '.join(map(repr, missing))}; give "
                        "unconstrained values for every latent site."
                    )
                self._initial_params = {k: v for k, v in self._initial_params.items() if k in target.layout.shapes}
        else:
            target = PotentialTarget(self._potential_fn, name)
            if self._initial_params is None:
                target.initial_params()  # raises: a potential_fn needs initial parameters
            self._initial_params = {k: torch.as_tensor(v) for k, v in self._initial_params.items()}
            target.set_layout(self._initial_params)
        self._target = target
        self.transforms = target.transforms
        self._initial_deterministic = target.check_full_data(target.layout.ravel(self._initial_params))
        self._generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))
        self._hyper = self.hyperparameters()
        self._state = None
        self._draws = 0
        self._divergences = []
        self._num_diverging = 0
        self._logging = None

    def _make_target(self, args, kwargs):
        """The model's stochastic potential (:class:`~ppl_sgmcmc.pyro.potential.ModelTarget`, or a
        :class:`~ppl_sgmcmc.pyro.gibbs.GibbsTarget` with local Gibbs sites), in the latents' own space
        if :attr:`constrained`."""
        target_args = (self._model, args, kwargs, self._replace, type(self).__name__, self._init_strategy, self._compile)
        options = dict(warn_no_plate=not self._warned_no_plate, constrained=self.constrained)
        if self._gibbs is None:
            return ModelTarget(*target_args, **options)
        sites, fn, sweeps, init = self._gibbs
        return GibbsTarget(
            *target_args, **options, gibbs_sites=sites, gibbs_fn=fn, gibbs_sweeps=sweeps, gibbs_init=init
        )

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
        draw, self._draws = self._draws, self._draws + 1
        z = self._target.layout.unravel(self._flat)
        self._state = self._state._replace(z=z, diverging=diverging)
        if diverging and draw >= self._warmup_steps:
            self._divergences.append(draw - self._warmup_steps)
        if draw >= self._warmup_steps and self._target.deterministic_sites:
            return {**z, **self._target.deterministic(self._flat)}
        return dict(z)

    def _step(self):
        """One SG-MCMC step: draw a minibatch, apply the rule, reject the move if anything is non-finite.
        Returns whether the step was rejected."""
        state, flat = self._state, self._flat
        batch, batch_state = self._target.draw(self._generator, state.batch_state)
        step_size = self.step_size_at(state.i)
        new_flat, rule_state, gradient = self.rule.step(
            flat,
            state.rule_state,
            lambda x: self._target.gradient(x, batch, self._score_kind),
            self._normal(flat),
            step_size,
            **self._hyper,
        )
        # one reduction: a sum is finite only if its terms are (a non-finite gradient reaches the new state)
        total = gradient.energy + new_flat.sum()
        for leaf in rule_state:
            if leaf is not None:  # e.g. CSGLD's momentum
                total = total + leaf.sum()
        if bool(torch.isfinite(total)):
            self._flat = new_flat
            energy, diverging = gradient.energy, False
        else:
            rule_state, energy, diverging = state.rule_state, state.potential_energy, True
            if has_momentum(rule_state):  # redraw the momentum that made the step diverge
                rule_state = refresh_momentum(rule_state, self._normal(flat), self._hyper.get("temperature", 1.0))
            self._num_diverging += 1
        # z is filled in once per draw, by `sample`
        self._state = SGMCMCState(
            state.i + 1, None, rule_state, energy, step_size, diverging, self._num_diverging, batch_state
        )
        return diverging

    def _start(self, params):
        params = self._initial_params if params is None else params
        flat = self._target.layout.ravel({name: params[name] for name in self._target.layout.names})
        flat = flat.to(torch.get_default_dtype()) if not flat.is_floating_point() else flat
        self._flat = flat
        self._state = SGMCMCState(
            i=0,
            z=self._target.layout.unravel(flat),
            rule_state=self.rule.init(flat, self._normal(flat), **self._hyper),
            potential_energy=torch.full((), float("nan"), dtype=flat.dtype),
            step_size=self.step_size_at(0),
            diverging=False,
            num_diverging=0,
            batch_state=self._target.init_batch(self._generator),
        )

    def _normal(self, like):
        """Standard normal noise of the shape of ``like``, from the chain's generator."""
        return torch.randn(like.shape, generator=self._generator, dtype=like.dtype).to(like.device)

    def logging(self):
        """The progress bar's postfix: ``Ũ_t``, the step size and the number of rejected steps,
        refreshed every ``diagnostics_every`` steps (Pyro asks for it after every step); ``None``
        before the first step.

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
            self._logging = self._logging_items(state)
        return self._logging

    def diagnostics(self):
        """``divergences``: the draws (post-warm-up indices) with a step rejected as non-finite,
        as ``arviz.from_pyro`` and ``MCMC.summary`` expect; ``num_diverging``: all rejected steps,
        warm-up included.

        **Example** (a step to an infinite energy is rejected: the chain stays where it was)::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: (z["x"] ** 2).sum() / 0.0, step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> kernel.sample(kernel.initial_params)["x"], kernel.diagnostics()
            (tensor([1., 1.]), {'divergences': [0], 'num_diverging': 1})
        """
        return {"divergences": list(self._divergences), "num_diverging": self._num_diverging}

    def cleanup(self):
        """End of a chain: the next :meth:`setup` starts a new chain from new initial values.

        **Example**::

            >>> import torch
            >>> from ppl_sgmcmc.pyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
            >>> kernel.initial_params = {"x": torch.ones(2)}
            >>> kernel.setup(warmup_steps=0)
            >>> _ = kernel.sample(kernel.initial_params)
            >>> kernel.cleanup()
            >>> kernel.state is None, kernel.initial_params is None
            (True, True)
        """
        self._initial_params = None
        self._release()

    def _release(self):
        self._target = None
        self._generator = None
        self._state = None
        self._flat = None
        self._logging = None
        self._initial_deterministic = {}
        self._warmup_steps = 0
        self._draws = 0

    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ("_target", "_generator", "_state", "_flat", "_logging"):
            state[key] = None
        return state
