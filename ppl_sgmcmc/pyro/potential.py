"""The stochastic potential ``Ũ_t`` of a target, its gradient, and the minibatches it is built on.

Two kinds of target share one interface, used by :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel`:

* :class:`ModelTarget`: a Pyro model. Its subsampled plates, latent sites, their supports and shapes
  are read once from a prototype trace. Each step the kernel draws the plates' indices
  (:mod:`~ppl_sgmcmc.pyro.minibatch`) and the target runs the model under one light handler that
  fixes the plates' indices, substitutes the latent values (``biject_to(support)`` of the
  unconstrained ones) and sums the scaled log-densities, so the model's own ``N/n`` plate scale makes
  ``Ũ_t(θ) = -log p(θ) - (N/n) Σ_{i∈S_t} log p(x_i | θ)``, in unconstrained space with the
  log-Jacobian of the transforms. By default that evaluation and its gradient are traced once into a
  graph of tensor operations and compiled by TorchInductor (:mod:`~ppl_sgmcmc.pyro.compile`);
  later steps call the compiled graph without running the model's Python code.
* :class:`PotentialTarget`: a user-written energy ``potential_fn(z)``, or ``potential_fn(z, generator)``
  returning a stochastic estimate ``Ũ_t(z)`` whose gradient is the stochastic gradient.

``draw(generator, batch_state) -> (batch, batch_state)`` picks one step's data;
``gradient(flat, batch) -> StochasticGradient`` evaluates it.
"""

import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.distributions.transforms import biject_to
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.subsample_messenger import SubsampleMessenger

from ppl_sgmcmc import _model_checks
from ppl_sgmcmc.pyro import compile as compile_
from ppl_sgmcmc.pyro import minibatch
from ppl_sgmcmc.pyro.handlers import full_data, is_subsample_site, subsample_plates
from ppl_sgmcmc.rules import StochasticGradient

MAX_INIT_ATTEMPTS = 100


@contextmanager
def model_errors(
    kernel_name: str,
    doing: str,
    plates: Mapping[str, tuple[int, int]] | None = None,
    data: tuple[tuple[Any, ...], Mapping[str, Any]] | None = None,
) -> Iterator[None]:
    """Re-raise the errors a model commonly hits under a kernel with what is wrong and how to fix it.

    ``plates`` (``{name: (N, n)}``, read when an error is raised) and ``data`` (the model's ``(args,
    kwargs)``) sharpen the hint (:func:`ppl_sgmcmc._model_checks.error_hint`); a
    :class:`~ppl_sgmcmc._model_checks.ModelError` passes unchanged."""
    try:
        yield
    except _model_checks.ModelError as err:
        if isinstance(err.__cause__, _model_checks.ModelError):  # Pyro's trace appended its shapes: drop them
            raise err.__cause__ from None
        raise
    except NotImplementedError:  # a RuntimeError, raised with its own explanation (discrete or local latents)
        raise
    except (ValueError, TypeError, IndexError, RuntimeError) as err:
        dtypes = None if data is None else _model_checks.data_dtypes(*data, torch.is_tensor)
        hint = _model_checks.error_hint(str(err), plates, dtypes, "pyro")
        raise ValueError(f"{kernel_name}: {doing} failed: {err}\n{hint}") from err


_Subsampled = _model_checks.Subsampled


class _ModelRecorder(Messenger):
    """Watches the prototype trace: refuses a bad ``subsample_size``, or a plate name declared again,
    before the plate draws its indices; records the plates (:attr:`plates`, ``{name: (N, n)}``) and the
    whole tensors passed to ``pyro.subsample`` (:attr:`subsampled`), for :meth:`ModelTarget._check_data`.
    It keeps references only: no copy, no computation."""

    def __init__(self, kernel_name: str) -> None:
        super().__init__()
        self.kernel_name = kernel_name
        self.plates: dict[str, tuple[int, int]] = {}
        self.subsampled: list[_Subsampled] = []
        # the latent sample sites met inside plates, with the plates' names: (site, [plate, ...])
        self.plated_latents: list[tuple[str, list[str]]] = []

    def _pyro_param(self, msg: dict[str, Any]) -> None:
        raise _model_checks.fixed_parameter(msg["name"], self.kernel_name, "pyro")

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        fn = msg["fn"]
        if type(fn).__name__ != "_Subsample" and not msg["is_observed"] and msg["cond_indep_stack"]:
            self.plated_latents.append((msg["name"], [frame.name for frame in msg["cond_indep_stack"]]))
        if type(fn).__name__ != "_Subsample" or msg["value"] is not None:  # not a plate, or given its indices
            return
        name, size, n = msg["name"], fn.size, fn.subsample_size
        if n is not None:
            _model_checks.subsample_size(name, size, n, self.kernel_name, "pyro")
        if name in self.plates and self.plates[name] == (size, size if n is None else n):
            raise _model_checks.plate_constructed_twice(name, size, size if n is None else n, self.kernel_name)
        _model_checks.plate_declared_again(self.plates, name, size, n, self.kernel_name, "pyro")

    def _pyro_subsample(self, msg: dict[str, Any]) -> None:
        if not msg["args"] or not torch.is_tensor(msg["args"][0]):
            return
        value, event_dim = msg["args"][0], msg["kwargs"].get("event_dim")
        frames = [
            _model_checks.Frame(handler.name, handler.dim, handler.size, handler.subsample_size)
            for handler in reversed(_PYRO_STACK)
            if isinstance(handler, SubsampleMessenger)
            and handler.dim is not None
            and isinstance(handler.subsample_size, int)
            and handler.subsample_size < handler.size
        ]
        frame = _model_checks.rows_frame(frames, value.shape, event_dim)
        self.subsampled.append(_Subsampled(msg, value, event_dim, frame))


def _bad_mask(value: Any) -> np.ndarray | None:
    """``None`` if the data ``value`` is finite (one ``isfinite`` reduction), else its mask of NaN and inf."""
    if not torch.is_tensor(value) or not (value.is_floating_point() or value.is_complex()):
        return None
    with torch.no_grad():
        finite = torch.isfinite(value)
        return None if bool(finite.all()) else (~finite).cpu().numpy()


# the shared data checks (:mod:`ppl_sgmcmc._model_checks`) with this backend's arrays
_check_finite = partial(_model_checks.check_finite, bad_mask=_bad_mask)
_check_subsampled = partial(_model_checks.check_subsampled, bad_mask=_bad_mask, ppl="pyro")
_explain_failure = partial(_model_checks.explain_failure, is_array=torch.is_tensor, bad_mask=_bad_mask, ppl="pyro")



def _discrete_latent_error(kernel_name, name, fn):
    return NotImplementedError(
        f"{kernel_name}: latent site {name!r} is discrete ({type(fn).__name__}); SG-MCMC kernels move "
        "continuous latents only. Marginalise it out of the model, or observe it; a local discrete site inside "
        "a subsampled plate can be updated by a Gibbs step instead (`gibbs_sites=[name], gibbs_fn=...`; see "
        "ppl_sgmcmc.pyro.gibbs)."
    )


def _support_check(support, value):
    """``support.check(value)`` as a NumPy boolean array, or ``None`` if the constraint cannot check it."""
    try:
        with torch.no_grad():
            return support.check(value).cpu().numpy().astype(bool)
    except (TypeError, ValueError, RuntimeError, IndexError, NotImplementedError):
        return None


class _Init(InitMessenger):
    """The init strategy on continuous latents; a discrete latent is refused before the strategy
    (which cannot handle it) fails with a less helpful message. With ``local`` (local Gibbs) sites
    named, discrete sites are left to the model's own prior draw: the target's site checks then say
    which sites are wrong.

    ``given``: the initial values the chain will start from (``initial_params``, in the chain's space:
    unconstrained unless ``constrained``); a site gets its own, so that a model undefined at the strategy's
    draw (``log(mu)`` of a ``mu`` drawn negative) traces at the values the chain starts from. A prior the
    strategy cannot draw from (``ImproperUniform``) gets a uniform point in ``(-2, 2)`` of its unconstrained
    space, the point ``init_to_uniform`` would draw."""

    def __init__(self, init_fn, kernel_name, local=(), given=None, constrained=False):
        super().__init__(init_fn)
        self.kernel_name = kernel_name
        self.local = frozenset(local)
        self.given = {} if given is None else given
        self.constrained = constrained

    def _pyro_sample(self, msg):
        if msg["name"] in self.local:
            return
        if msg["value"] is not None or type(msg["fn"]).__name__ == "_Subsample":
            return
        if msg["fn"].support.is_discrete:
            if self.local:
                return
            raise _discrete_latent_error(self.kernel_name, msg["name"], msg["fn"])
        value = self._given(msg)
        if value is not None:
            msg["value"] = value
            return
        try:
            super()._pyro_sample(msg)
        except NotImplementedError:  # the strategy draws from the prior, which has no sampler
            fn = msg["fn"]
            value = _uniform_point(fn)
            if value is None:
                name = _model_checks.distribution_name(fn)
                raise _model_checks.no_bijection(msg["name"], name, fn.support, self.kernel_name, "pyro") from None
            msg["value"] = value

    def _given(self, msg):
        """The site's given initial value in its support, or ``None`` (none given, or not of the site's shape: the
        kernel's check of ``initial_params`` then says so)."""
        if msg["name"] not in self.given:
            return None
        fn, value = msg["fn"], torch.as_tensor(self.given[msg["name"]])
        with torch.no_grad():
            try:
                value = value if self.constrained else biject_to(fn.support)(value)
            except (NotImplementedError, RuntimeError, ValueError):
                return None
        return value if value.shape == fn.shape() else None


def _uniform_point(fn):
    """A uniform draw in ``(-2, 2)`` of the unconstrained space of ``fn``'s support, mapped to the support
    (``init_to_uniform`` without its prior draw, which only gives it the shape); ``None`` if the support has no
    bijection."""
    try:
        transform = biject_to(fn.support)
        u = torch.rand(transform.inverse_shape(fn.shape()), dtype=torch.get_default_dtype()) * 4 - 2
        return transform(u)
    except (NotImplementedError, RuntimeError, ValueError):
        return None


class _LogDensity(Messenger):
    """Runs a model once as a log-density: fixes the subsampled plates' indices, substitutes latent
    values, and sums each site's scaled and masked ``log_prob``, split into the sites in subsampled
    plates (``data``) and the others (``prior``); records the deterministic sites' values. With
    ``log_density=False`` it only substitutes and records. Sites stop here: no outer handler sees them.

    ``local`` gives the values of local Gibbs sites (:mod:`~ppl_sgmcmc.pyro.gibbs`): a tensor, or a
    function of the site's distribution returning the value (a prior draw, a placeholder)."""

    def __init__(self, values, indices, data_sites, log_density=True, per_datum=None, local=None):
        super().__init__()
        self.values = values
        self.local = {} if local is None else local
        self.indices = indices
        self.data_sites = data_sites
        self.log_density = log_density
        self.per_datum_plate = per_datum  # (plate name, N/n): also record each datum's log-likelihood
        self.prior = []
        self.data = []
        self.per_datum = []
        self.deterministic = {}

    def _pyro_sample(self, msg):
        name = msg["name"]
        if type(msg["fn"]).__name__ == "_Subsample":
            if msg["value"] is None and name in self.indices:
                msg["value"] = self.indices[name]
            return
        msg["stop"] = True
        if msg["infer"].get("_deterministic"):
            self.deterministic[name] = msg["value"]
            return
        if not msg["is_observed"] and name in self.local:
            value = self.local[name]
            msg["value"] = value(msg["fn"]) if callable(value) else value
            msg["done"] = True
        elif not msg["is_observed"]:
            if name not in self.values:
                raise KeyError(
                    f"latent site {name!r} was not in the model's prototype trace: the kernels need a fixed set "
                    "of latent sites."
                )
            msg["value"] = self.values[name]
            msg["done"] = True
        if self.log_density:
            log_prob = scale_and_mask(msg["fn"].log_prob(msg["value"]), msg["scale"], msg["mask"])
            if self.per_datum_plate is not None and name in self.data_sites:
                self.per_datum.append(self._per_datum(msg, log_prob))
            (self.data if name in self.data_sites else self.prior).append(log_prob.sum())

    def _per_datum(self, msg, log_prob):
        """The ``(n,)`` log-likelihoods of the minibatch's data at this site, without the plate's ``N/n``
        (any other scale kept)."""
        plate, plate_scale = self.per_datum_plate
        (frame,) = [f for f in msg["cond_indep_stack"] if f.name == plate]
        n = frame.size
        dim = frame.dim
        if log_prob.dim() < -dim:
            log_prob = log_prob.reshape((1,) * (-dim - log_prob.dim()) + log_prob.shape)
        log_prob = log_prob.movedim(dim, 0)
        log_prob = log_prob.expand((n,) + log_prob.shape[1:]).reshape(n, -1).sum(1)
        return log_prob / plate_scale


def _total(terms, like):
    return sum(terms[1:], terms[0]) if terms else like.new_zeros(())


def _is_real(support):
    return support is constraints.real or (
        isinstance(support, constraints.independent) and support.base_constraint is constraints.real
    )


class _Layout:
    """Where each latent site lives in the flat unconstrained vector (sites sorted by name, as
    ``jax.flatten_util.ravel_pytree`` orders a dict), with its unconstrained shape, and the bijection
    to its support. With ``constrained`` the flat vector holds the latents' own values: no bijection,
    no log-Jacobian (SGRLD)."""

    def __init__(self, shapes, supports, constrained=False):
        self.names = sorted(shapes)
        self.shapes = {name: torch.Size(shapes[name]) for name in self.names}
        self.slices, start = {}, 0
        for name in self.names:
            size = self.shapes[name].numel()
            self.slices[name] = (start, start + size)
            start += size
        self.size = start
        self.bijections = {name: biject_to(supports[name]) for name in self.names}
        self.real = set(self.names) if constrained else {name for name in self.names if _is_real(supports[name])}

    def unravel(self, flat):
        return {name: flat[a:b].view(self.shapes[name]) for name, (a, b) in self.slices.items()}

    def ravel(self, params):
        if not self.names:
            return torch.zeros(0)
        return torch.cat([torch.as_tensor(params[name]).reshape(-1) for name in self.names])

    def constrain(self, flat):
        """Constrained values and the summed log-Jacobian of the unconstrained ``flat``."""
        values, log_det = {}, []
        for name, u in self.unravel(flat).items():
            if name in self.real:
                values[name] = u
            else:
                bijection = self.bijections[name]
                values[name] = x = bijection(u)
                log_det.append(bijection.log_abs_det_jacobian(u, x).sum())
        return values, _total(log_det, flat)


def _split_tensors(tree):
    """``(tensors, rebuild)``: the tensor leaves of nested tuples, lists and dicts, and a function
    putting new tensors in their places."""
    tensors = []

    def strip(node):
        if isinstance(node, torch.Tensor):
            tensors.append(node)
            return _Slot(len(tensors) - 1)
        if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
            return type(node)(strip(x) for x in node)
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()}
        return node

    skeleton = strip(tree)

    def rebuild(new, node=skeleton):
        if isinstance(node, _Slot):
            return new[node.index]
        if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
            return type(node)(rebuild(new, x) for x in node)
        if isinstance(node, dict):
            return {k: rebuild(new, v) for k, v in node.items()}
        return node

    return tensors, rebuild


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class ModelTarget:
    """The subsampled potential of a Pyro model (see the module docstring)."""

    local_sites: tuple[str, ...] = ()  # local Gibbs sites (see ppl_sgmcmc.pyro.gibbs.GibbsTarget)

    def __init__(
        self,
        model,
        model_args,
        model_kwargs,
        replace,
        kernel_name,
        init_strategy,
        compile=True,
        warn_no_plate=True,
        constrained=False,
        initial_values=None,
    ):
        self.model = model
        # the chain's given start (`initial_params`): the prototype trace runs there (see `_Init`)
        self.initial_values = initial_values
        # position in the latents' own (constrained) space: no transforms, no log-Jacobian (SGRLD)
        self.constrained = constrained
        self.model_args = model_args
        self.model_kwargs = model_kwargs
        self.replace = replace
        self.kernel_name = kernel_name
        self.init_strategy = init_strategy
        recorder = _ModelRecorder(kernel_name)
        model_trace, self.plate_sizes = self._prototype_trace(recorder)
        self.data_sites = frozenset(
            name
            for name, site in model_trace.nodes.items()
            if site["type"] == "sample"
            and not is_subsample_site(site)
            and any(f.name in self.plate_sizes for f in site["cond_indep_stack"])
        )
        latents = self._check_sites(model_trace)
        if not latents:
            raise _model_checks.no_latent_sites(kernel_name, "pyro")
        self._check_data(model_trace, recorder.subsampled)
        self.site_names = frozenset(model_trace.nodes)
        self.deterministic_sites = [
            name
            for name, site in model_trace.nodes.items()
            if site["type"] == "sample" and site["infer"].get("_deterministic")
        ]
        if not self.plate_sizes and warn_no_plate:
            warnings.warn(
                f"{kernel_name}: the model has no plate with `subsample_size` smaller than its size, so every "
                "step uses the full-data gradient. Declare `pyro.plate(name, N, subsample_size=n)` around the "
                "likelihood to use minibatches.",
                stacklevel=5,
            )
        # the mean-score scale N (pSGLD, SGFS); with several subsampled plates the largest one
        self.data_size = max((size for size, _ in self.plate_sizes.values()), default=1)
        self.streamed = False  # Pyro's data is on its device
        supports = {name: model_trace.nodes[name]["fn"].support for name in latents}
        self.latent_supports = supports
        shapes = {  # unconstrained shapes: a simplex of size k has k - 1 free coordinates
            name: (model_trace.nodes[name]["value"] if constrained else biject_to(supports[name]).inv(
                model_trace.nodes[name]["value"])).shape
            for name in latents
        }  # fmt: skip
        self.layout = _Layout(shapes, supports, constrained)
        if constrained:
            self.transforms = {}
            self._to_position = {name: (lambda value: value) for name in latents}
        else:
            self.transforms = {name: bijection.inv for name, bijection in self.layout.bijections.items()}
            self._to_position = self.transforms
        self._prototype_values = {name: model_trace.nodes[name]["value"].detach() for name in latents}
        self.first_batch = {
            name: torch.arange(n) for name, (_, n) in self.plate_sizes.items()
        }  # what the prototype trace used
        self.compile = compile
        self._compiled = {}  # ("gradient", with_score) or ("deterministic",) -> traced graph, or None

    # --- structure -----------------------------------------------------------------------------
    def _prototype_trace(self, recorder: "_ModelRecorder | None" = None) -> tuple[Any, dict[str, tuple[int, int]]]:
        """A trace at the init strategy's values, plates on their first ``n`` indices (no O(N) draw);
        with a ``recorder``, the plates' sizes are checked and the subsampled tensors recorded (at init).
        Returns ``(trace, {plate name: (N, n)})``."""
        plates = subsample_plates(None)
        init = _Init(self.init_strategy, self.kernel_name, self.local_sites, self.initial_values, self.constrained)
        model = init(self.model)
        traced = poutine.trace(plates(model if recorder is None else recorder(model)))
        data = (self.model_args, self.model_kwargs)
        try:
            with model_errors(self.kernel_name, "tracing the model", plates.fixed, data), pyro.validation_enabled(True):
                model_trace = traced.get_trace(*self.model_args, **self.model_kwargs)
        except _model_checks.ModelError:
            raise
        except ValueError as err:  # NaN or inf in the data can make a distribution refuse its parameters: say so
            if recorder is not None:
                for site, names in recorder.plated_latents:  # a weight sampled in the plate: its shape broke
                    subsampled = [name for name in names if name in plates.fixed and site not in self.local_sites
                                  and plates.fixed[name][1] < plates.fixed[name][0]]  # fmt: skip
                    if subsampled:
                        raise _model_checks.local_latent(site, subsampled[0], self.kernel_name, "pyro") from err
                _explain_failure(recorder.subsampled, *data, recorder.plates, self.kernel_name)
            raise
        return model_trace, plates.fixed

    def _check_sites(self, model_trace):
        latents = []
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or site["is_observed"] or type(site["fn"]).__name__ == "_Subsample":
                continue
            if site["fn"].support.is_discrete:
                raise _discrete_latent_error(self.kernel_name, name, site["fn"])
            if name in self.data_sites:
                plates = [f.name for f in site["cond_indep_stack"] if f.name in self.plate_sizes]
                raise _model_checks.local_latent(name, plates[0], self.kernel_name, "pyro")
            if not self.constrained:
                try:
                    biject_to(site["fn"].support)
                except NotImplementedError:
                    fn = _model_checks.distribution_name(site["fn"])
                    raise _model_checks.no_bijection(name, fn, site["fn"].support, self.kernel_name, "pyro") from None
            latents.append(name)
        return latents

    def _frames(self, site: Mapping[str, Any]) -> list[_model_checks.Frame]:
        """The subsampled plates around a site."""
        return [
            _model_checks.Frame(f.name, f.dim, *self.plate_sizes[f.name])
            for f in site["cond_indep_stack"]
            if f.name in self.plate_sizes
        ]

    def _check_data(self, model_trace: Any, subsampled: list[_Subsampled]) -> None:
        """Check, once at init, the observed sites in subsampled plates and their data: each site's shape
        against its plates and distribution (:func:`ppl_sgmcmc._model_checks.site_shape`), each tensor
        passed to ``pyro.subsample`` for NaN and inf (one ``isfinite`` reduction per tensor), and, if some
        observed sites index their data themselves, their full data (one run of the full-data view)."""
        observed = {}
        for name in sorted(self.data_sites):
            site = model_trace.nodes[name]
            if site["type"] != "sample" or not site["is_observed"] or site["infer"].get("_deterministic"):
                continue
            fn = site["fn"]
            _model_checks.site_shape(
                name, site["value"].shape, fn.batch_shape, fn.event_shape, self._frames(site), self.kernel_name, "pyro"
            )
            observed[id(site["value"])] = name
        unchecked = set(observed.values()) - _check_subsampled(subsampled, observed, self.kernel_name)
        self._check_support(model_trace, subsampled)
        if not unchecked:
            return
        plates = ", ".join(f"{name!r} of size {size}" for name, (size, _) in self.plate_sizes.items())
        data = (self.model_args, self.model_kwargs)
        try:
            with model_errors(self.kernel_name, f"running the model on its full data (plates {plates})",
                              self.plate_sizes, data), pyro.validation_enabled(True), torch.no_grad():  # fmt: skip
                full_trace = poutine.trace(full_data(self.model)).get_trace(*self.model_args, **self.model_kwargs)
        except ValueError:
            _explain_failure([], *data, self.plate_sizes, self.kernel_name)
            raise
        for name in sorted(unchecked):
            site = full_trace.nodes[name]
            event_dim = len(site["fn"].event_shape)
            frame = _model_checks.rows_frame(self._frames(site), site["value"].shape, event_dim)
            _check_finite(site["value"], f"observed site {name!r}", frame, event_dim, self.kernel_name)

    def _check_support(self, model_trace: Any, subsampled: list[_Subsampled]) -> None:
        """Refuse observed data outside their distribution's support (labels ±1 for a ``Bernoulli``) with a
        message naming the site: the whole tensor an observed site subsamples when the support has no tensor
        parameter and the site no mask, else the prototype trace's minibatch (the plates' first rows), its masked
        entries left out. (The full-data check's validation would refuse them too, naming no site.)"""
        whole = {id(record.msg["value"]): record for record in subsampled}
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or not site["is_observed"] or is_subsample_site(site):
                continue
            if site["infer"].get("_deterministic") or not torch.is_tensor(site["value"]):
                continue
            fn, mask, value = site["fn"], site["mask"], site["value"]
            support, what, kind = fn.support, f"observed site {name!r}", _model_checks.distribution_name(fn)
            record = whole.get(id(value))
            if record is not None and mask is None and _model_checks.scalar_parameters(support, torch.is_tensor):
                array = record.array
                ok = _support_check(support, array)
                if ok is not None and ok.shape == tuple(array.shape[: array.dim() - support.event_dim]):
                    frame = record.frame if record.event_dim == support.event_dim else None
                    _model_checks.check_support(array.detach().cpu(), ok, what, kind, support, frame, self.kernel_name)
                    continue
            ok = _support_check(support, value)
            try:
                if ok is not None and mask is not None:
                    ok = ok | ~np.broadcast_to(torch.as_tensor(mask).cpu().numpy().astype(bool), ok.shape)
            except ValueError:  # a mask that does not broadcast: the model fails on its own
                ok = None
            if ok is None:
                continue
            frames = self._frames(site)
            frame = frames[-1] if frames else None
            _model_checks.check_support(value.detach().cpu(), ok, what, kind, support, frame, self.kernel_name)

    def check_full_data(self, flat):
        """Evaluate the full-data view once at ``flat`` (with Pyro's validation on) to catch shape errors
        early; return the deterministic sites' values there."""
        plates = ", ".join(f"{name!r} of size {size}" for name, (size, _) in self.plate_sizes.items())
        doing = "running the model on its full data" + (f" (plates {plates})" if plates else "")
        data = (self.model_args, self.model_kwargs)
        try:
            with model_errors(self.kernel_name, doing, self.plate_sizes, data), pyro.validation_enabled(True), \
                    torch.no_grad():  # fmt: skip
                density = self._run(flat.detach(), {}, self.model_args, self.model_kwargs, full=True)
        except ValueError:
            _explain_failure([], *data, self.plate_sizes, self.kernel_name)
            raise
        return {name: density.deterministic[name] for name in self.deterministic_sites}

    def _run(self, flat, batch, model_args, model_kwargs, full=False, log_density=True, per_datum=False, local=None):
        """Run the model once at the unconstrained ``flat`` under :class:`_LogDensity` (on its full data
        if ``full``; ``local``: values of local Gibbs sites); returns the handler, and its ``log_det`` of
        the transforms."""
        values, log_det = self.layout.constrain(flat)
        per_datum = self._per_datum_plate() if per_datum else None
        density = _LogDensity(values, batch, self.data_sites, log_density, per_datum, local)
        density.log_det = log_det
        with density:
            if full:
                with full_data():
                    self.model(*model_args, **model_kwargs)
            else:
                self.model(*model_args, **model_kwargs)
        return density

    # --- initial values ------------------------------------------------------------------------
    def initial_params(self):
        """Valid unconstrained initial values: the prototype trace's, or fresh draws of the init
        strategy until the potential and its gradient are finite."""
        values = self._prototype_values
        for _ in range(MAX_INIT_ATTEMPTS):
            params = {name: self._to_position[name](value).detach() for name, value in values.items()}
            flat = self.layout.ravel(params) if params else torch.zeros(0)
            with model_errors(self.kernel_name, "computing the first stochastic gradient", self.plate_sizes,
                              (self.model_args, self.model_kwargs)):  # fmt: skip
                gradient = self._eager_gradient(flat, self.first_batch, False)
            if torch.isfinite(gradient.energy) and torch.all(torch.isfinite(gradient.grad)):
                return params
            values = {
                name: site["value"].detach()
                for name, site in self._prototype_trace()[0].nodes.items()
                if name in self._prototype_values
            }
        # NaN or inf in data the model indexes itself (not checked at init) would explain it
        _explain_failure([], self.model_args, self.model_kwargs, self.plate_sizes, self.kernel_name)
        raise ValueError(
            f"{self.kernel_name}: found no initial values with a finite potential and gradient in "
            f"{MAX_INIT_ATTEMPTS} draws of the init strategy; pass `initial_params` to `MCMC`."
        )

    # --- minibatches ---------------------------------------------------------------------------
    def init_batch(self, generator):
        """The minibatch sampler's state at the start of a chain (see :mod:`~ppl_sgmcmc.pyro.minibatch`), on the
        generator's device."""
        return minibatch.init(generator, self.plate_sizes, self.replace, generator.device)

    def draw(self, generator, batch_state, replace=None):
        """One step's indices ``{plate: (n,) tensor}`` and the advanced batch state (``replace`` overrides
        the kernel's choice), drawn on the generator's device."""
        replace = self.replace if replace is None else replace
        return minibatch.draw(generator, batch_state, self.plate_sizes, replace, generator.device)

    def epoch(self, generator, rows):
        """Minibatches covering ``rows`` distinct rows of the largest subsampled plate (drawn without
        replacement), a list: what the warm-up's Hessian and noise probe average over (see
        :meth:`ppl_sgmcmc.numpyro.potential.ModelTarget.epoch`). One full-data batch without plates."""
        if not self.plate_sizes:
            return [self.draw(generator, self.init_batch(generator))[0]]
        size, n = max(self.plate_sizes.values())
        state = minibatch.init(generator, self.plate_sizes, replace=False)
        batches = []
        for _ in range(max(1, min(size, rows) // n)):
            batch, state = self.draw(generator, state, replace=False)
            batches.append(batch)
        return batches

    def differentiable_energy(self, x, batch):
        """``Ũ_t(x)`` on ``batch`` as a differentiable function of ``x`` (run eagerly: the Hessian)."""
        return sum(self.energies(x, batch, self.model_args, self.model_kwargs))

    # --- the potential -------------------------------------------------------------------------
    def energies(self, flat, batch, model_args, model_kwargs, per_datum=False, local=None):
        """``(prior part, data part)`` of ``Ũ_t`` at the unconstrained ``flat``; the data part holds
        the sites in subsampled plates, the prior part the others and the log-Jacobian. With
        ``per_datum``, also the ``(n,)`` log-likelihoods of the minibatch's data (see :meth:`per_example`);
        ``local``: the values of local Gibbs sites."""
        density = self._run(flat, batch, model_args, model_kwargs, per_datum=per_datum, local=local)
        energies = -(_total(density.prior, flat) + density.log_det), -_total(density.data, flat)
        if per_datum:
            return energies + (_total(density.per_datum, flat),)
        return energies

    def _value_and_grad(self, flat, batch, model_args, model_kwargs, with_score):
        with torch.enable_grad():
            x = flat.detach().requires_grad_()
            if with_score == "per_example":
                prior, data, per_datum = self.energies(x, batch, model_args, model_kwargs, per_datum=True)
                energy = prior + data
                grad_data = _grad(data, x, retain_graph=True)
                grad = _grad(prior, x, retain_graph=True) + grad_data
                eye = torch.eye(per_datum.shape[0], dtype=per_datum.dtype, device=per_datum.device)
                (rows,) = torch.autograd.grad(per_datum, x, grad_outputs=eye, is_grads_batched=True, allow_unused=True)
                rows = torch.zeros(per_datum.shape + x.shape, dtype=x.dtype, device=x.device) if rows is None else rows
                return energy.detach(), grad, -grad_data / self.data_size, rows
            prior, data = self.energies(x, batch, model_args, model_kwargs)
            energy = prior + data
            if with_score:
                grad_data = _grad(data, x, retain_graph=True)
                grad = _grad(prior, x) + grad_data
                return energy.detach(), grad, -grad_data / self.data_size
            return energy.detach(), _grad(energy, x), None

    def full_gradient(self, flat):
        """``U``, ``∇U`` and the mean per-datum score at ``flat`` on the *full* data (the full-data view: every
        subsampled plate on all its rows, scale 1), in one pass run eagerly: what variance-reduced gradient
        estimators need at their centre (:mod:`ppl_sgmcmc.gradients`)."""
        with torch.enable_grad():
            x = flat.detach().requires_grad_()
            density = self._run(x, {}, self.model_args, self.model_kwargs, full=True)
            prior = -(_total(density.prior, x) + density.log_det)
            data = -_total(density.data, x)
            grad_data = _grad(data, x, retain_graph=True)
            grad = _grad(prior, x) + grad_data
        return StochasticGradient((prior + data).detach(), grad, -grad_data / self.data_size)

    def full_energy(self, flat):
        """``U`` at ``flat`` on the *full* data (as :meth:`full_gradient`, without the gradient)."""
        with torch.no_grad():
            density = self._run(flat, {}, self.model_args, self.model_kwargs, full=True)
            return -(_total(density.prior, flat) + density.log_det) - _total(density.data, flat)

    def _eager_gradient(self, flat, batch, with_score):
        return StochasticGradient(*self._value_and_grad(flat, batch, self.model_args, self.model_kwargs, with_score))

    def gradient(self, flat, batch, with_score=False):
        """``StochasticGradient(Ũ_t, ∇Ũ_t, ḡ_t)`` at ``flat`` on the minibatch ``batch``
        (``ḡ_t`` is ``None`` unless ``with_score``). With ``with_score="per_example"`` also the ``n×d``
        per-datum scores ``∇ log p(x_i | θ)`` of the minibatch (``per_example``): row ``i`` is the
        gradient of datum ``i``'s log-likelihood terms, with any user ``scale`` kept and the plate's
        ``N/n`` not, so the rows average to ``ḡ_t``. They come from one batched backward pass
        (``torch.autograd.grad(..., is_grads_batched=True)``) over the ``n`` per-datum log-likelihoods
        of one model run, and are traced into the graph like the gradient."""
        compiled = self._compiled_fn(("gradient", with_score), flat, batch)
        if compiled is None:
            return self._eager_gradient(flat, batch, with_score)
        energy, grad, *score = compiled(flat, *self._batch_tensors(batch), *self._arg_tensors)
        return StochasticGradient(energy, grad, *(score or [None]))

    def traced_gradient(self, flat, batch, with_score=False):
        """:meth:`gradient` as ``(graph, inputs)`` for tracing into a larger graph (the kernel's compiled step):
        the traced, uncompiled graph of ``(flat, *inputs) -> (Ũ_t, ∇Ũ_t[, scores])`` and its tensor inputs
        besides ``flat`` (the minibatch's and the model's); ``None`` when the potential runs eagerly."""
        compiled = self._compiled_fn(("gradient", with_score), flat, batch)
        if compiled is None or compiled.traced is None:
            return None
        return compiled.traced, (*self._batch_tensors(batch), *self._arg_tensors)

    # --- per-datum scores (SGFS) ---------------------------------------------------------------
    def enable_per_example_scores(self):
        """Check that per-datum scores are defined for this model, for rules with ``PER_EXAMPLE_SCORES``
        (SGFS): one subsampled plate of at least 2 elements; anything else raises (the NumPyro
        backend's messages). The kernel then asks :meth:`gradient` for ``with_score="per_example"``."""
        if len(self.plate_sizes) != 1:
            found = ", ".join(map(repr, self.plate_sizes)) or "none"
            raise ValueError(
                f"{self.kernel_name}: per-datum scores need exactly one plate with `subsample_size` around the "
                f"likelihood (found: {found}). Declare `pyro.plate(name, N, subsample_size=n)` with n >= 2 "
                "around all observed sites."
            )
        ((name, (_, n)),) = self.plate_sizes.items()
        if n < 2:
            raise ValueError(
                f"{self.kernel_name}: plate {name!r} has subsample_size {n}; the empirical Fisher needs n >= 2 "
                "(the paper recommends n >= 100)."
            )
        self.per_example_scores = True

    per_example_scores = False

    def _per_datum_plate(self):
        ((name, (size, n)),) = self.plate_sizes.items()
        return name, size / n

    def _compiled_fn(self, key: tuple, flat: torch.Tensor, batch: object) -> compile_.CompiledFunction | None:
        """The compiled graph of the gradient (``key = ("gradient", with_score)``) or of the deterministic
        sites (``key = ("deterministic",)``), traced and compiled at its first use (at ``flat`` and
        ``batch``) and kept; ``None`` if ``compile_potential=False`` or it could not be traced, compiled
        or checked (:func:`ppl_sgmcmc.pyro.compile.trace` warned): then the model runs eagerly."""
        if key not in self._compiled:
            traced = (
                compile_.trace(*self.traceable(key, flat, batch), self.kernel_name)
                if self.compile
                else None
            )
            self._compiled[key] = traced
        return self._compiled[key]

    def traceable(
        self, key: tuple, flat: torch.Tensor, batch: object
    ) -> tuple[Callable[..., tuple], tuple[torch.Tensor, ...], Callable[[Callable[..., tuple]], bool]]:
        """``(fn, example_inputs, check)`` for :func:`ppl_sgmcmc.pyro.compile.trace`: the gradient or the
        deterministic sites as a function of tensors only, ``(flat, *batch tensors, *model tensors)``,
        and a check of a compiled version against the eager model at ``flat`` and at a perturbed point."""
        self._arg_tensors, rebuild = _split_tensors((self.model_args, self.model_kwargs))
        batch_tensors = self._batch_tensors(batch) if key[0] == "gradient" else []

        def fn(flat, *tensors):
            args, kwargs = rebuild(tensors[len(batch_tensors) :])
            if key[0] == "gradient":
                step_batch = self._batch_from_tensors(tensors[: len(batch_tensors)])
                out = self._value_and_grad(flat, step_batch, args, kwargs, key[1])
                return out if key[1] else out[:2]
            return self._deterministic(flat, args, kwargs)

        def check(compiled):
            generator = torch.Generator().manual_seed(0)
            noise = torch.randn(flat.shape, generator=generator, dtype=flat.dtype).to(flat.device)
            for point in (flat, flat + 0.1 * noise):
                got = compiled(point, *batch_tensors, *self._arg_tensors)
                if key[0] == "gradient":
                    expected = self._eager_gradient(point, batch, key[1])
                else:
                    expected = self._deterministic(point, self.model_args, self.model_kwargs)
                if not all(b is None or compile_.close(a, b) for a, b in zip(got, expected)):
                    return False
            return True

        return fn, (flat, *batch_tensors, *self._arg_tensors), check

    def _batch_tensors(self, batch):
        """The tensors of a step's ``batch`` (the plates' indices) that the traced gradient takes as inputs."""
        return [batch[name] for name in self.plate_sizes]

    def _batch_from_tensors(self, tensors):
        """The inverse of :meth:`_batch_tensors`."""
        return dict(zip(self.plate_sizes, tensors))

    # --- evaluation ----------------------------------------------------------------------------
    def _deterministic(self, flat, model_args, model_kwargs):
        with torch.no_grad():
            density = self._run(flat, {}, model_args, model_kwargs, full=True, log_density=False)
        return tuple(density.deterministic[name] for name in self.deterministic_sites)

    def deterministic(self, flat):
        """The deterministic sites' values at ``flat``, on the full data (``{}`` if there are none)."""
        if not self.deterministic_sites:
            return {}
        flat = flat.detach()
        compiled = self._compiled_fn(("deterministic",), flat, {})
        if compiled is None:
            values = self._deterministic(flat, self.model_args, self.model_kwargs)
        else:
            values = compiled(flat, *self._arg_tensors)
        return dict(zip(self.deterministic_sites, values))


def _grad(output, x, retain_graph=False):
    (grad,) = torch.autograd.grad(output, x, retain_graph=retain_graph, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad


class PotentialTarget:
    """A target given as an energy ``potential_fn(z)`` or a stochastic energy ``potential_fn(z, generator)``."""

    def __init__(self, potential_fn, kernel_name):
        self.potential_fn = potential_fn
        self.kernel_name = kernel_name
        # stochastic if the second positional parameter has no default: `f(z, scale=1.0)` is an energy of z
        self.stochastic = _model_checks.is_stochastic_potential(potential_fn, kernel_name, "generator")
        self.data_size = 1
        self.streamed = False
        self.plate_sizes = {}
        self.deterministic_sites = []
        self.transforms = {}
        self.layout = None

    def set_layout(self, params):
        """The flat layout of the user's initial values ``{name: tensor}`` (all unconstrained)."""
        shapes = {k: torch.as_tensor(v).shape for k, v in params.items()}
        self.layout = _Layout(shapes, dict.fromkeys(params, constraints.real))

    def initial_params(self):
        """A ``potential_fn`` has no prior to draw from: raises, asking for ``initial_params``."""
        raise ValueError(
            f"{self.kernel_name}: a kernel built from `potential_fn` needs `init_params`: pass them as "
            "`MCMC(kernel, ..., initial_params=...)` (one leading entry per chain when num_chains > 1)."
        )

    def check_full_data(self, flat):
        """Nothing to check; no deterministic sites."""
        return {}

    def init_batch(self, generator):
        """No minibatches."""
        return minibatch.BatchState({}, {})

    def draw(self, generator, batch_state):
        """The "batch" of a stochastic ``potential_fn`` is the chain's generator."""
        return generator, batch_state

    #: The generators :meth:`epoch` gives a stochastic ``potential_fn``.
    EPOCH_DRAWS = 16

    def epoch(self, generator, rows):
        """Batches to average over: :data:`EPOCH_DRAWS` generators forked from the chain's for a stochastic
        ``potential_fn``, one ``None`` otherwise."""
        if not self.stochastic:
            return [None]
        return [torch.Generator().manual_seed(int(torch.randint(0, 2**62, (), generator=generator)))
                for _ in range(self.EPOCH_DRAWS)]

    def differentiable_energy(self, x, batch):
        """``Ũ(x)`` as a differentiable function of ``x``."""
        z = self.layout.unravel(x)
        return self.potential_fn(z, batch) if self.stochastic else self.potential_fn(z)

    def gradient(self, flat, batch, with_score=False):
        """``Ũ`` and its gradient by autograd; the score is ``-∇Ũ`` (no data to separate from a prior)."""
        with torch.enable_grad():
            x = flat.detach().requires_grad_()
            z = self.layout.unravel(x)
            energy = self.potential_fn(z, batch) if self.stochastic else self.potential_fn(z)
            grad = _grad(energy, x)
        return StochasticGradient(energy.detach(), grad, -grad if with_score else None)

    def traced_gradient(self, flat, batch, with_score=False):
        """``None``: a ``potential_fn`` runs eagerly."""
        return None

    def deterministic(self, flat):
        """No deterministic sites."""
        return {}
