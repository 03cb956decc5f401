"""The stochastic potential ``Ũ_t`` of a target, its gradient, and the minibatches it is built on.

Two kinds of target share one interface, used by :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`:

* :class:`ModelTarget`: a NumPyro model. Its subsampled plates are found from a prototype trace;
  each step the kernel draws the plates' indices (:mod:`~ppl_sgmcmc.numpyro.minibatch`) and
  substitutes them, so the model's own ``N/n`` plate scale makes its potential energy
  ``Ũ_t(θ) = -log p(θ) - (N/n) Σ_{i∈S_t} log p(x_i | θ)``, in unconstrained space with the
  log-Jacobian of the transforms.
* :class:`PotentialTarget`: a user-written energy ``potential_fn(z)``, or ``potential_fn(z, rng_key)``
  returning a stochastic estimate ``Ũ_t(z)`` whose gradient is the stochastic gradient.

The interface, :class:`Target`, is what :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel` calls:
``draw(rng_key, batch_state) -> (batch, batch_state)`` picks one step's data;
``gradient(flat, unravel, batch, model_args, model_kwargs) -> StochasticGradient`` evaluates ``Ũ_t``
and its gradient there.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Set
from contextlib import contextmanager
from functools import partial
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random, vmap
from numpyro.contrib.module import ParamShape
from numpyro.distributions.distribution import MaskedDistribution
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.gibbs import subsample_plate_sizes
from numpyro.infer.util import (
    _unconstrain_reparam,
    compute_log_probs,
    constrain_fn,
    initialize_model,
)
from numpyro.primitives import _PYRO_STACK, Messenger
from numpyro.primitives import plate as numpyro_plate
from numpyro.util import is_prng_key

from ppl_sgmcmc import _model_checks
from ppl_sgmcmc.numpyro import minibatch
from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.numpyro.streaming import STREAMED, Block, StreamedBatch, streamed
from ppl_sgmcmc.numpyro.warmup import when
from ppl_sgmcmc.rules import StochasticGradient

#: A pytree of latent values: ``{site name: array}``.
Params = dict[str, jax.Array]
#: One step's data as :meth:`Target.draw` returns it and :meth:`Target.gradient` reads it: for a model,
#: ``{plate name: minibatch indices}`` (a Gibbs target adds its local sites); for a ``potential_fn``, the
#: step's PRNG key.
Batch = Any


class Target(Protocol):
    """The interface between a kernel and its stochastic potential (:class:`ModelTarget`,
    :class:`PotentialTarget`, :class:`~ppl_sgmcmc.numpyro.gibbs.GibbsTarget`).

    ``flat`` is the chain's position as one flat vector and ``unravel`` maps it back to :data:`Params`.
    """

    #: ``N`` of the mean per-datum score (1 for a ``potential_fn``).
    data_size: int

    def initial_params(
        self,
        rng_key: jax.Array,
        init_strategy: Callable[..., Any],
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> Params:
        """Valid initial latent values in the chain's space (a batch of them for a batch of keys)."""
        ...

    def init_batch(self, rng_key: jax.Array) -> minibatch.BatchState:
        """The minibatch state at the start of the chain."""
        ...

    def draw(self, rng_key: jax.Array, batch_state: minibatch.BatchState) -> tuple[Batch, minibatch.BatchState]:
        """One step's data and the advanced minibatch state."""
        ...

    def gradient(
        self,
        flat: jax.Array,
        unravel: Callable[[jax.Array], Params],
        batch: Batch,
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> StochasticGradient:
        """``Ũ_t``, its gradient and the mean per-datum score at ``flat`` on the step's ``batch``."""
        ...

    def epoch(self, rng_key: jax.Array, rows: int) -> Batch:
        """Stacked batches covering up to ``rows`` distinct data rows, for the warm-up's averages."""
        ...

    def postprocess_fn(
        self, model_args: tuple[Any, ...], model_kwargs: Mapping[str, Any]
    ) -> Callable[[Params], Params]:
        """The map from the chain's position to the values a draw reports."""
        ...


class _Merge:
    """Rebuilds a pytree from its array leaves (see :func:`split_arrays`)."""

    def __init__(self, treedef, static, static_paths):
        self.treedef, self.static, self.static_paths = treedef, static, static_paths

    def __call__(self, arrays):
        arrays = iter(arrays)
        return self.treedef.unflatten([next(arrays) if leaf is _ARRAY else leaf for leaf in self.static])


_ARRAY = object()


def split_arrays(tree):
    """``(array leaves, merge)``: the array leaves of ``tree`` (to pass to a compiled function) and
    ``merge(arrays)``, which rebuilds ``tree`` with its other leaves (Python numbers, strings) in place."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    arrays = [leaf for _, leaf in with_paths if isinstance(leaf, jax.Array)]
    static = [_ARRAY if isinstance(leaf, jax.Array) else leaf for _, leaf in with_paths]
    static_paths = {path for path, leaf in with_paths if not isinstance(leaf, jax.Array)}
    return arrays, _Merge(treedef, static, static_paths)


class ProgramCache:
    """The compiled programs of the last ``size`` keys used: what the next kernel or run of the same model, arguments
    and options loads instead of tracing and compiling it again.

    **Example**::

        >>> from ppl_sgmcmc.numpyro.potential import ProgramCache
        >>> cache = ProgramCache(size=1)
        >>> cache.get("a", lambda: "program a"), cache.get("a", lambda: "again"), cache.get("b", lambda: "program b")
        ('program a', 'program a', 'program b')
        >>> cache.get("a", lambda: "new a"), cache.get(None, lambda: "not kept"), cache.get(["unhashable"], lambda: "x")
        ('new a', 'not kept', 'x')
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._programs: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any, compile: Callable[[], Any]) -> Any:
        """The program kept under ``key``, else ``compile()``, kept under it (``key=None`` or an unhashable key:
        not kept)."""
        if key is None:
            return compile()
        try:
            program = self._programs.pop(key) if key in self._programs else compile()
        except TypeError:  # an unhashable static argument in the key
            return compile()
        self._programs[key] = program
        while len(self._programs) > self.size:
            self._programs.popitem(last=False)
        return program

    def clear(self) -> None:
        """Drop every kept program."""
        self._programs.clear()

    def values(self) -> list[Any]:
        """The kept programs, the least recently used first."""
        return list(self._programs.values())

    def __len__(self) -> int:
        return len(self._programs)


# the compiled initial-value searches of the last models initialised (ModelTarget._initialize)
_SEARCHES = ProgramCache(size=16)


def as_jax_arrays(tree: Any) -> Any:
    """Turn NumPy array leaves into JAX arrays so that traced minibatch indices can index them.

    Python scalars stay as they are: they may be static (a plate's ``subsample_size``)."""
    return jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


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
    except _model_checks.ModelError:
        raise
    except jax.errors.TracerArrayConversionError as err:
        raise TypeError(
            f"{kernel_name}: {doing}: the model indexes a NumPy array with traced minibatch indices. Pass the "
            "data as model arguments (the kernel converts them), or wrap global arrays in `jax.numpy.asarray`."
        ) from err
    except (ValueError, TypeError, IndexError) as err:
        dtypes = None if data is None else _model_checks.data_dtypes(*data, _is_array)
        hint = _model_checks.error_hint(str(err), plates, dtypes, "numpyro")
        raise ValueError(f"{kernel_name}: {doing} failed: {err}\n{hint}") from err


def _first_rows(msg: dict[str, Any]) -> jax.Array | None:
    """Indices ``0..n-1`` for a subsampled plate of the prototype trace (the plate's own draw would
    shuffle all ``N`` rows, and compile that shuffle, on every ``MCMC.run``)."""
    if msg["type"] == "plate" and msg["args"][1] is not None and msg["args"][1] < msg["args"][0]:
        return jnp.arange(msg["args"][1])
    return None


def feasible_latent(msg: dict[str, Any]) -> jax.Array | None:
    """A point in the support of a continuous latent site, drawn from nothing: the image of 0 in its
    unconstrained space (``init_to_feasible``'s point, without its draw); ``None`` for other sites.

    The kernel's own traces of a model (the prototype, the full-data check) substitute it for the prior draw,
    as NumPyro's ``initialize_model`` traces at the init strategy's values: a prior without a sampler
    (``ImproperUniform``) or whose sampler needs an optional package (a ``TruncatedDistribution`` of a
    ``StudentT``, whose inverse CDF needs TensorFlow Probability) then runs as under NUTS.

    **Example**::

        >>> import numpyro, numpyro.distributions as dist
        >>> from numpyro.handlers import substitute, trace
        >>> def model():
        ...     numpyro.sample("s", dist.ImproperUniform(dist.constraints.positive, (), (2,)))
        >>> trace(substitute(model, substitute_fn=feasible_latent)).get_trace()["s"]["value"].tolist()
        [1.0, 1.0]
    """
    if msg["type"] != "sample" or msg.get("is_observed") or msg["value"] is not None:
        return None
    fn = msg["fn"]
    try:
        if fn.support.is_discrete:
            return None
        transform = biject_to(fn.support)
        shape = tuple(msg["kwargs"].get("sample_shape") or ()) + tuple(transform.inverse_shape(fn.shape()))
        return transform(jnp.zeros(shape, jnp.result_type(float)))
    except (NotImplementedError, TypeError, ValueError):  # a support without a bijection: the prior draw
        return None


def _prototype_value(msg: dict[str, Any]) -> jax.Array | None:
    """The prototype trace's value of a message: a subsampled plate's first rows (:func:`_first_rows`), a
    continuous latent's feasible point (:func:`feasible_latent`)."""
    rows = _first_rows(msg)
    return rows if rows is not None else feasible_latent(msg)


_Subsampled = _model_checks.Subsampled


def _rows_frame(value: Any, event_dim: int | None) -> _model_checks.Frame | None:
    """The innermost active subsampled plate whose dim (left of ``event_dim``) has the plate's size in
    ``value``: the plate that subsamples its rows."""
    frames = [
        _model_checks.Frame(handler.name, handler.dim, handler.size, handler.subsample_size)
        for handler in reversed(_PYRO_STACK)
        if isinstance(handler, numpyro_plate) and handler.subsample_size < handler.size
    ]
    return _model_checks.rows_frame(frames, jnp.shape(value), event_dim)


class _ModelRecorder(Messenger):
    """Watches the prototype trace: refuses a bad ``subsample_size``, or a plate name declared again with
    another size, before the plate draws its indices; records the plates (:attr:`plates`, ``{name: (N,
    n)}``) and the whole arrays passed to ``numpyro.subsample`` (:attr:`subsampled`), for
    :meth:`ModelTarget._check_data`. It keeps references only: no copy, no computation."""

    def __init__(self, fn: Callable[..., Any], kernel_name: str) -> None:
        self.kernel_name = kernel_name
        self.plates: dict[str, tuple[int, int]] = {}
        self.subsampled: list[_Subsampled] = []
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "mutable":
            raise _model_checks.mutable_state(msg["name"], self.kernel_name)
        if msg["type"] == "plate":
            size, n = msg["args"]
            if n is not None:
                _model_checks.subsample_size(msg["name"], size, n, self.kernel_name, "numpyro")
            _model_checks.plate_declared_again(self.plates, msg["name"], size, n, self.kernel_name, "numpyro")
        elif msg["type"] in ("subsample", STREAMED):  # a streamed array: the rows read, not the whole file
            event_dim = msg["kwargs"].get("event_dim")
            self.subsampled.append(_Subsampled(msg, msg["value"], event_dim, _rows_frame(msg["value"], event_dim)))


def _bad_mask(value: Any) -> np.ndarray | None:
    """``None`` if the data ``value`` is finite (one ``isfinite`` reduction), else its mask of NaN and inf."""
    if isinstance(value, jax.core.Tracer) or not jnp.issubdtype(jnp.result_type(value), jnp.inexact):
        return None
    finite = jnp.isfinite(value)
    return None if bool(jnp.all(finite)) else ~np.asarray(finite)


# the shared data checks (:mod:`ppl_sgmcmc._model_checks`) with this backend's arrays
_check_finite = partial(_model_checks.check_finite, bad_mask=_bad_mask)
_check_subsampled = partial(_model_checks.check_subsampled, bad_mask=_bad_mask, ppl="numpyro")
_explain_failure = partial(_model_checks.explain_failure, is_array=_is_array, bad_mask=_bad_mask, ppl="numpyro")



def _support_check(support: Any, value: Any) -> np.ndarray | None:
    """``support(value)`` as a NumPy boolean array, or ``None`` if the constraint cannot check it here (a shape it
    does not broadcast with, a tracer, rows sharded over other hosts' devices)."""
    try:
        ok = support(value)
        if isinstance(ok, jax.core.Tracer) or (isinstance(ok, jax.Array) and not ok.is_fully_addressable):
            return None
        return np.asarray(ok, dtype=bool)
    except (TypeError, ValueError, IndexError):
        return None


def _position_shape(site: Mapping[str, Any], constrained: bool) -> tuple[int, ...] | None:
    """The shape of a latent site's value in the chain's space (unconstrained unless ``constrained``), or ``None``
    if its support has no bijection to tell it."""
    shape = tuple(jnp.shape(site["value"]))
    if constrained:
        return shape
    try:
        return tuple(biject_to(site["fn"].support).inverse_shape(shape))
    except (NotImplementedError, TypeError, ValueError):
        return None


def _values_and_deterministic(
    model: Callable[..., Any], model_args: tuple[Any, ...], model_kwargs: Mapping[str, Any], values: Params
) -> Params:
    """The latent ``values`` (already in their supports) and the deterministic sites they imply."""
    model_trace = trace(substitute(model, data=values)).get_trace(*model_args, **model_kwargs)
    return {
        name: site["value"]
        for name, site in model_trace.items()
        if name in values or site["type"] == "deterministic"
    }


def ravel_into(tree: Any, like: jax.Array) -> jax.Array:
    """The leaves of ``tree`` as one vector of the shape and dtype of ``like``, in ``ravel_pytree``'s order: each
    leaf written into a copy of ``like`` with ``lax.dynamic_update_slice``, so every entry of ``like`` must be
    covered.

    ``jax.flatten_util.ravel_pytree`` concatenates the leaves. XLA:CPU fuses the leaves' producers into a
    concatenate and then evaluates that fusion one element at a time, without vectorising: for a gradient
    whose leaves come out of a backward pass, that loop costs many times the gradient itself
    (``benchmarks/bnn_step_cost.py``). An in-place update slice loops over its leaf only.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.potential import ravel_into
        >>> ravel_into({"a": jnp.array([1.0, 2.0]), "b": jnp.array(3.0)}, jnp.zeros(3)).tolist()
        [1.0, 2.0, 3.0]
    """
    leaves = jax.tree.leaves(tree)
    if len(leaves) == 1:
        return jnp.reshape(leaves[0], like.shape).astype(like.dtype)
    offset = 0
    for leaf in leaves:
        like = lax.dynamic_update_slice(like, jnp.ravel(leaf).astype(like.dtype), (offset,))
        offset += leaf.size
    return like


def value_and_flat_grad(
    fun: Callable[[Params], jax.Array], flat: jax.Array, unravel: Callable[[jax.Array], Params]
) -> tuple[jax.Array, jax.Array]:
    """``fun(unravel(flat))`` and its gradient with respect to ``flat``: differentiated with respect to the
    leaves and flattened by :func:`ravel_into`, not through ``unravel`` (whose transpose is a concatenate)."""
    value, grads = jax.value_and_grad(fun)(unravel(flat))
    return value, ravel_into(grads, flat)


class _one_index(Messenger):
    """Runs the model on one datum of a subsampled plate: the plate's indices become ``index[None]``
    (so the plate scales its sites by ``N/1``)."""

    def __init__(self, fn: Callable[..., Any] | None, plate: str, index: jax.Array) -> None:
        self.plate = plate
        self.index = index
        super().__init__(fn)

    def process_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "plate" and msg["name"] == self.plate:
            msg["value"] = self.index[None]
            msg["args"] = (msg["args"][0], 1)



def _fixed_parameters(name: str, value: Any, sites: Mapping[str, Any]) -> bool:
    """Whether the ``param`` site ``name`` holds parameters no sample site draws: a plain ``numpyro.param``, the
    parameters of ``numpyro.contrib.module``'s ``flax_module``/``nnx_module``/``eqx_module``, or those a
    ``random_flax_module``/``random_nnx_module`` prior leaves out. The ``random_*_module`` helpers keep the
    module's parameters in a ``"{module}$params"`` site: flax's and nnx's replace each parameter they sample by
    a ``ParamShape``; equinox's keep the arrays and sample every parameter into ``"{module}/..."`` sites."""
    leaves = jax.tree.leaves(value, is_leaf=lambda x: isinstance(x, ParamShape))
    arrays = [leaf for leaf in leaves if not isinstance(leaf, ParamShape)]
    if not arrays:
        return False
    if len(arrays) < len(leaves):  # random_flax_module / random_nnx_module with a prior for some parameters
        return True
    module = name.removesuffix("$params")
    return module == name or not any(
        other.startswith(module + "/") and site["type"] == "sample" for other, site in sites.items()
    )


class ModelTarget:
    """The subsampled potential of a NumPyro model (see the module docstring).

    With :attr:`per_example_scores` set (see :meth:`enable_per_example_scores`), :meth:`gradient` also
    returns the ``n×d`` per-datum scores of the minibatch (``StochasticGradient.per_example``)."""

    per_example_scores: bool = False

    def __init__(
        self,
        model: Callable[..., Any],
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
        rng_key: jax.Array,
        replace: bool,
        kernel_name: str,
        constrained: bool = False,
    ) -> None:
        self.model = model
        self.replace = replace
        self.kernel_name = kernel_name
        # position in the latents' own (constrained) space: no transforms, no log-Jacobian (SGRLD)
        self.constrained = constrained
        if isinstance(model, streamed):  # its streamed arrays, in the order this trace meets them
            model.arrays.clear()
        recorder = _ModelRecorder(model, kernel_name)
        try:
            with model_errors(kernel_name, "tracing the model", recorder.plates, (model_args, model_kwargs)):
                model_trace = trace(seed(substitute(recorder, substitute_fn=_prototype_value), rng_key)).get_trace(
                    *model_args, **model_kwargs
                )
        except _model_checks.ModelError:
            raise
        except ValueError:  # NaN or inf in the data can make a distribution refuse its parameters: say so
            _explain_failure(recorder.subsampled, model_args, model_kwargs, recorder.plates, kernel_name)
            raise
        self.plate_sizes: dict[str, tuple[int, int]] = subsample_plate_sizes(model_trace)
        self.data_sites: frozenset[str] = frozenset(
            name
            for name, site in model_trace.items()
            if site["type"] == "sample" and any(f.name in self.plate_sizes for f in site["cond_indep_stack"])
        )
        self._check_sites(model_trace)
        unchecked = self._check_data(model_trace, recorder.subsampled)
        self._check_support(model_trace, recorder.subsampled)
        # the supports of the latents the chain moves (the global sample sites)
        self.latent_supports: dict[str, Any] = {
            name: site["fn"].support
            for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"] and name not in self.data_sites
        }
        if not self.latent_supports:
            raise _model_checks.no_latent_sites(kernel_name, "numpyro")
        self.site_names: frozenset[str] = frozenset(model_trace)
        # the shapes of the chain's values of the latents (unconstrained: a simplex of size k has k - 1)
        self.latent_shapes: dict[str, tuple[int, ...] | None] = {
            name: _position_shape(model_trace[name], constrained) for name in self.latent_supports
        }
        if not self.plate_sizes:
            warnings.warn(
                f"{kernel_name}: the model has no plate with `subsample_size` smaller than its size, so every "
                "step uses the full-data gradient. Declare `numpyro.plate(name, N, subsample_size=n)` around the "
                "likelihood to use minibatches.",
                stacklevel=4,
            )
        # the mean-score scale N (pSGLD, SGFS); with several subsampled plates the largest one
        self.data_size: int = max((size for size, _ in self.plate_sizes.values()), default=1)
        self.streamed: bool = isinstance(model, streamed)
        self._check_full_data(model_args, model_kwargs, unchecked)

    def _check_sites(self, model_trace: Mapping[str, dict[str, Any]]) -> None:
        for name, site in model_trace.items():
            if site["type"] == "param" and _fixed_parameters(name, site["value"], model_trace):
                raise _model_checks.fixed_parameter(name, self.kernel_name, "numpyro")
            if site["type"] != "sample" or site["is_observed"]:
                continue
            if site["fn"].support.is_discrete:
                raise NotImplementedError(
                    f"{self.kernel_name}: latent site {name!r} is discrete ({type(site['fn']).__name__}); "
                    "SG-MCMC kernels move continuous latents only. Marginalise it out of the model, or observe "
                    "it; a local discrete site inside a subsampled plate can be updated by a Gibbs step instead "
                    "(`gibbs_sites=[name], gibbs_fn=...`; see ppl_sgmcmc.numpyro.gibbs)."
                )
            if name in self.data_sites:
                plates = [f.name for f in site["cond_indep_stack"] if f.name in self.plate_sizes]
                raise _model_checks.local_latent(name, plates[0], self.kernel_name, "numpyro")

    def _frames(self, site: Mapping[str, Any]) -> list[_model_checks.Frame]:
        """The subsampled plates around a site, outermost first."""
        return [
            _model_checks.Frame(f.name, f.dim, *self.plate_sizes[f.name])
            for f in site["cond_indep_stack"]
            if f.name in self.plate_sizes
        ]

    def _check_data(self, model_trace: Mapping[str, dict[str, Any]], subsampled: list[_Subsampled]) -> set[str]:
        """Check, once at init, the observed sites in subsampled plates and the data they subsample:
        each site's shape against its plates and distribution (:func:`ppl_sgmcmc._model_checks.site_shape`),
        then each array passed to ``numpyro.subsample`` for NaN and inf, one ``isfinite`` reduction per
        array. Returns the observed sites whose values did not come from ``numpyro.subsample`` as they are
        (their full data are checked on the full-data view)."""
        observed = {}
        for name in sorted(self.data_sites):
            site = model_trace[name]
            if site["type"] != "sample" or not site["is_observed"]:
                continue
            fn = site["fn"]
            shape = jnp.shape(site["value"])
            _model_checks.site_shape(
                name, shape, fn.batch_shape, fn.event_shape, self._frames(site), self.kernel_name, "numpyro"
            )
            observed[id(site["value"])] = name
        return set(observed.values()) - _check_subsampled(subsampled, observed, self.kernel_name)

    def _check_support(self, model_trace: Mapping[str, dict[str, Any]], subsampled: list[_Subsampled]) -> None:
        """Refuse observed data outside their distribution's support (labels ±1 for a ``Bernoulli``), which NumPyro
        does not validate: its log-density would be a number of no meaning. The whole array an observed site
        subsamples is checked when the support has no array parameter and the site no mask (one reduction, as for
        NaN); the minibatch of the prototype trace (the plates' first rows) otherwise, its masked entries left out."""
        whole = {id(record.msg["value"]): record for record in subsampled}
        for name, site in model_trace.items():
            if site["type"] != "sample" or not site["is_observed"]:
                continue
            fn, mask = site["fn"], True  # type: Any, Any
            while isinstance(fn, MaskedDistribution):
                mask = jnp.logical_and(mask, fn._mask)
                fn = fn.base_dist
            value, support = site["value"], fn.support
            if isinstance(value, jax.core.Tracer) or isinstance(mask, jax.core.Tracer):
                continue
            what, kind = f"observed site {name!r}", _model_checks.distribution_name(fn)
            record = whole.get(id(value))
            if record is not None and mask is True and _model_checks.scalar_parameters(support, _is_array):
                array = record.array
                ok = _support_check(support, array)
                if ok is not None and ok.shape == jnp.shape(array)[: jnp.ndim(array) - support.event_dim]:
                    frame = record.frame if record.event_dim == support.event_dim else None
                    _model_checks.check_support(array, ok, what, kind, support, frame, self.kernel_name)
                    continue
            ok = _support_check(support, value)
            try:
                ok = None if ok is None else ok | ~np.broadcast_to(np.asarray(mask, bool), ok.shape)
            except ValueError:  # a mask that does not broadcast: the model fails on its own
                ok = None
            if ok is not None:
                frames = self._frames(site)
                frame = frames[-1] if frames else None
                _model_checks.check_support(value, ok, what, kind, support, frame, self.kernel_name)

    def _check_full_data(
        self, model_args: tuple[Any, ...], model_kwargs: Mapping[str, Any], unchecked: Set[str] = frozenset()
    ) -> None:
        """Trace the full-data view abstractly (no arithmetic) to catch shape errors early; if some observed
        sites in subsampled plates (``unchecked``) index their data themselves, run it once to check their
        full data for NaN and inf."""

        view = seed(substitute(full_data(self.model), substitute_fn=feasible_latent), 0)

        def run():
            tr = trace(view).get_trace(*model_args, **model_kwargs)
            return {name: site["fn"].log_prob(site["value"]) for name, site in tr.items() if name in self.data_sites}

        plates = ", ".join(f"{name!r} of size {size}" for name, (size, _) in self.plate_sizes.items())
        try:
            with model_errors(
                self.kernel_name, f"running the model on its full data (plates {plates})", self.plate_sizes,
                (model_args, model_kwargs),
            ):  # fmt: skip
                jax.eval_shape(run)
                if unchecked:
                    full_trace = trace(view).get_trace(*model_args, **model_kwargs)
        except ValueError:
            _explain_failure([], model_args, model_kwargs, self.plate_sizes, self.kernel_name)
            raise
        for name in sorted(unchecked):
            site = full_trace[name]
            event_dim = len(site["fn"].event_shape)
            frame = _model_checks.rows_frame(self._frames(site), jnp.shape(site["value"]), event_dim)
            _check_finite(site["value"], f"observed site {name!r}", frame, event_dim, self.kernel_name)

    def initial_params(
        self,
        rng_key: jax.Array,
        init_strategy: Callable[..., Any],
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> Params:
        """Valid unconstrained initial values (a batch of them for a batch of keys)."""

        def minibatch_model(rng_key, model_args, model_kwargs):
            batch, _ = self.draw(rng_key if is_prng_key(rng_key) else rng_key[0], self.init_batch(rng_key))
            return substitute(self.model, data=batch)

        return self._initialize(rng_key, minibatch_model, init_strategy, model_args, model_kwargs)

    def _initialize(
        self,
        rng_key: jax.Array,
        minibatch_model: Callable[..., Callable[..., Any]],
        init_strategy: Callable[..., Any],
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> Params:
        """NumPyro's ``initialize_model`` search for values with a finite potential and gradient on the model of
        the first minibatch, ``minibatch_model(rng_key, model_args, model_kwargs)``, run as one compiled program
        with the data arrays as its arguments. (For one chain NumPyro evaluates its first try op by op, compiling
        each small operation on its own: seconds, whatever the data's size.) The program is kept for the next
        kernels of the same model, strategy and arguments (:meth:`_search_key`). If the search fails, it runs
        again as NumPyro runs it, which raises NumPyro's error naming the site."""
        data, merge = split_arrays((model_args, model_kwargs))

        def search(rng_key, data):
            args, kwargs = merge(data)
            model = minibatch_model(rng_key, args, kwargs)
            found = initialize_model(rng_key, model, init_strategy=init_strategy, model_args=args, model_kwargs=kwargs)
            info = found.param_info
            finite = [jnp.isfinite(x).all() for x in jax.tree.leaves((info.potential_energy, info.z_grad))]
            return info.z, jnp.stack(finite).all()

        key = self._search_key()
        key = key and (key, init_strategy, merge.treedef, tuple(merge.static))
        # the same model, plates and arguments: the same program (another kernel, another run)
        compiled = _SEARCHES.get(key, lambda: jax.jit(search))
        z, valid = compiled(rng_key, data)
        if not isinstance(valid, jax.core.Tracer) and not bool(valid):
            model = minibatch_model(rng_key, model_args, model_kwargs)
            found = initialize_model(
                rng_key, model, init_strategy=init_strategy, model_args=model_args, model_kwargs=model_kwargs
            )
            z = found.param_info.z
        return self._to_position(z)

    def _search_key(self) -> Any:
        """What the initial-value search's program depends on besides the strategy and the arguments (``None``:
        not reused)."""
        return (type(self), self.model, tuple(sorted(self.plate_sizes.items())), self.replace)

    def _to_position(self, unconstrained: Params) -> Params:
        """Unconstrained values as the chain's position: themselves, or mapped to the support if :attr:`constrained`."""
        if not self.constrained:
            return unconstrained
        return {name: biject_to(self.latent_supports[name])(value) for name, value in unconstrained.items()}

    def _with_latents(self, model: Callable[..., Any], z: Params) -> Callable[..., Any]:
        """``model`` with the chain's latent values ``z`` substituted: unconstrained values through the
        supports' transforms (adding the log-Jacobian), or, if :attr:`constrained`, as they are."""
        if self.constrained:
            return substitute(model, data=z)
        return substitute(model, substitute_fn=partial(_unconstrain_reparam, z))

    def init_batch(self, rng_key: jax.Array) -> minibatch.BatchState:
        """The minibatch state at the start of the chain (the first key of a batch of keys)."""
        key = rng_key if is_prng_key(rng_key) else rng_key[0]
        return minibatch.init(key, self.plate_sizes, self.replace)

    def draw(
        self, rng_key: jax.Array, batch_state: minibatch.BatchState, replace: bool | None = None
    ) -> tuple[dict[str, jax.Array], minibatch.BatchState]:
        """``{plate name: minibatch indices}`` for one step, and the advanced minibatch state (``replace``
        overrides the kernel's choice)."""
        return minibatch.draw(rng_key, batch_state, self.plate_sizes, self.replace if replace is None else replace)

    def epoch(self, rng_key: jax.Array, rows: int) -> Any:
        """Minibatches covering ``rows`` distinct rows of the largest subsampled plate (drawn without
        replacement; smaller plates start new epochs), stacked along a leading axis: what the warm-up's
        Hessian and noise probe average over. One full-data batch for a model without subsampled plates.

        **Example** (5 minibatches of 2 rows, all 10 rows of the plate once)::

            >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> from ppl_sgmcmc.numpyro.potential import ModelTarget
            >>> def model(y):
            ...     mu = numpyro.sample("mu", dist.Normal(0, 1))
            ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
            ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
            >>> target = ModelTarget(model, (jnp.zeros(10),), {}, jax.random.PRNGKey(0), True, "SGLD")
            >>> batches = target.epoch(jax.random.PRNGKey(1), 10)
            >>> batches["data"].shape, sorted(batches["data"].ravel().tolist()) == list(range(10))
            ((5, 2), True)
        """
        if not self.plate_sizes:
            return jax.tree.map(lambda x: x[None], self.draw(rng_key, self.init_batch(rng_key))[0])
        size, n = max(self.plate_sizes.values())
        count = max(1, min(size, rows) // n)
        key_state, key_draws = random.split(rng_key)
        state = minibatch.init(key_state, self.plate_sizes, replace=False)

        def body(state, key):
            batch, state = self.draw(key, state, replace=False)
            return state, batch

        return lax.scan(body, state, random.split(key_draws, count))[1]

    @property
    def stream_block(self) -> int | None:
        """The number of steps whose rows the kernel reads ahead at once (:class:`~ppl_sgmcmc.numpyro.streaming.streamed`),
        or ``None`` if it reads nothing ahead (no streamed array, ``block=1``, or per-datum scores)."""
        model = self.model
        if not isinstance(model, streamed) or not model.arrays or model.block == 1 or self.per_example_scores:
            return None
        return model.block

    def init_block(self, batch_state: minibatch.BatchState) -> Block:
        """The block state to start from: empty, to be read at the first step (see :meth:`draw_block`)."""
        model, block = self.model, self.stream_block
        assert isinstance(model, streamed) and block is not None
        rows = tuple(
            jnp.zeros((block, self.plate_sizes[plate][1], *array.shape[1:]), array.dtype) for array, plate in model.arrays
        )
        indices = {name: jnp.zeros((block, n), jnp.int32) for name, (_, n) in self.plate_sizes.items()}
        return Block(batch_state, indices, rows, jnp.asarray(block, jnp.int32))

    def draw_block(
        self, rng_key: jax.Array, block: Block, draw_keys: Callable[[jax.Array, int], jax.Array]
    ) -> tuple[StreamedBatch, Block]:
        """One step's :class:`~ppl_sgmcmc.numpyro.streaming.StreamedBatch` from ``block``, which is read again
        when used up: the minibatches at ``draw_keys(rng_key, size)`` (the keys the block's steps will draw
        with, from the chain's key at its first step), and their rows, in one host call per streamed array."""
        model = self.model
        assert isinstance(model, streamed)
        size = block.indices[next(iter(block.indices))].shape[0]

        def refill(block, rng_key):
            keys = draw_keys(rng_key, size)
            if self.replace:  # independent draws: all at once (the same indices, one batched draw)
                batch_state, indices = block.batch_state, vmap(lambda key: self.draw(key, block.batch_state)[0])(keys)
            else:  # through an epoch's permutation, one step after the other

                def body(batch_state, key):
                    indices, batch_state = self.draw(key, batch_state)
                    return batch_state, indices

                batch_state, indices = lax.scan(body, block.batch_state, keys)
            return Block(batch_state, indices, model.read(indices), jnp.zeros((), jnp.int32))

        block = when(block.position == size, refill, block, rng_key)
        at = block.position
        batch = StreamedBatch({name: x[at] for name, x in block.indices.items()}, tuple(x[at] for x in block.rows))
        return batch, block._replace(position=at + 1)

    def _energies(
        self, z: Params, batch: Batch, model_args: tuple[Any, ...], model_kwargs: Mapping[str, Any]
    ) -> tuple[jax.Array | float, jax.Array | float]:
        """``(prior part, data part)`` of ``Ũ_t(z)`` (of ``U(z)`` on the full data if ``batch`` is ``None``); the
        data part holds the sites in subsampled plates (a part without sites is ``0.0``)."""
        if isinstance(batch, StreamedBatch):  # rows read ahead: the streamed arrays take them
            assert isinstance(self.model, streamed)
            with self.model.providing(batch.rows):
                return self._energies(z, batch.indices, model_args, model_kwargs)
        model = self._with_latents(full_data(self.model) if batch is None else substitute(self.model, data=batch), z)
        log_probs, _ = compute_log_probs(model, model_args, model_kwargs, {})
        prior = sum((v for k, v in log_probs.items() if k not in self.data_sites), start=0.0)
        data = sum((v for k, v in log_probs.items() if k in self.data_sites), start=0.0)
        return -prior, -data

    def gradient(
        self,
        flat: jax.Array,
        unravel: Callable[[jax.Array], Params],
        batch: Batch,
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> StochasticGradient:
        """``Ũ_t``, its gradient and the mean per-datum score ``ḡ`` at ``flat`` on the minibatch ``batch``."""

        def energy(z):
            prior, data = self._energies(z, batch, model_args, model_kwargs)
            return prior + data

        def prior_energy(z):
            return self._energies(z, batch, model_args, model_kwargs)[0]

        value, grad = value_and_flat_grad(energy, flat, unravel)
        # ḡ = -∇(data part)/N; XLA drops this prior gradient for rules that do not read the score
        score = -(grad - value_and_flat_grad(prior_energy, flat, unravel)[1]) / self.data_size
        if not self.per_example_scores:
            return StochasticGradient(value, grad, score)
        return StochasticGradient(value, grad, score, self.per_example(flat, unravel, batch, model_args, model_kwargs))

    def full_gradient(
        self,
        flat: jax.Array,
        unravel: Callable[[jax.Array], Params],
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> StochasticGradient:
        """``U``, ``∇U`` and the mean per-datum score at ``flat`` on the *full* data (the model's full-data view:
        every subsampled plate on all its rows, scale 1), in one pass: what variance-reduced gradient
        estimators need at their centre (:mod:`ppl_sgmcmc.gradients`). Its memory grows with the data, like
        one evaluation of the full-data model.

        **Example** (``y_i ~ N(μ, 1)``, ``μ ~ N(0, 1)``, ten ``y_i = 1``: ``∇U(μ) = 11 μ - 10``)::

            >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> from jax.flatten_util import ravel_pytree
            >>> from ppl_sgmcmc.numpyro.potential import ModelTarget
            >>> def model(y):
            ...     mu = numpyro.sample("mu", dist.Normal(0, 1))
            ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
            ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
            >>> y = jnp.ones(10)
            >>> target = ModelTarget(model, (y,), {}, jax.random.PRNGKey(0), True, "SGLD")
            >>> flat, unravel = ravel_pytree({"mu": jnp.array(2.0)})
            >>> target.full_gradient(flat, unravel, (y,), {}).grad.tolist()
            [12.0]
        """

        def energy(z):
            prior, data = self._energies(z, None, model_args, model_kwargs)
            return prior + data

        def prior_energy(z):
            return self._energies(z, None, model_args, model_kwargs)[0]

        value, grad = value_and_flat_grad(energy, flat, unravel)
        prior_grad = value_and_flat_grad(prior_energy, flat, unravel)[1]
        return StochasticGradient(value, grad, -(grad - prior_grad) / self.data_size)

    def enable_per_example_scores(self) -> None:
        """Make :meth:`gradient` return per-datum scores, for rules with ``PER_EXAMPLE_SCORES`` (SGFS).

        They are defined for one subsampled plate of at least 2 elements; anything else raises."""
        if len(self.plate_sizes) != 1:
            found = ", ".join(map(repr, self.plate_sizes)) or "none"
            raise ValueError(
                f"{self.kernel_name}: per-datum scores need exactly one plate with `subsample_size` around the "
                f"likelihood (found: {found}). Declare `numpyro.plate(name, N, subsample_size=n)` with n >= 2 "
                "around all observed sites."
            )
        ((name, (_, n)),) = self.plate_sizes.items()
        if n < 2:
            raise ValueError(
                f"{self.kernel_name}: plate {name!r} has subsample_size {n}; the empirical Fisher needs n >= 2 "
                "(Ahn, Korattikara & Welling, ICML 2012, recommend n >= 100)."
            )
        self.per_example_scores = True

    def per_example(
        self,
        flat: jax.Array,
        unravel: Callable[[jax.Array], Params],
        batch: Batch,
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> jax.Array:
        """The ``n×d`` per-datum scores ``∇_x log p(x_i | x)`` of the minibatch (``x``: the chain's position).

        One datum ``i`` is the model traced with its plate holding the single index ``i`` (scale ``N``),
        its data sites' log-density divided by ``N``; ``jax.vmap`` over the minibatch's indices of
        ``jax.grad`` of that costs one batched forward and backward pass, like the minibatch gradient
        (``jax.jacrev`` of the batch's ``n`` log-likelihoods would cost ``n`` backward passes). Row ``i``
        is the gradient of the data site terms of datum ``i``: any user ``scale`` handler is kept, the
        plate's ``N/n`` is not, so the rows sum to ``(n/N)`` times the minibatch gradient of the data part
        and average to ``score``."""
        ((plate, (size, _)),) = self.plate_sizes.items()

        def log_lik(z, index):
            model = self._with_latents(_one_index(self.model, plate, index), z)
            log_probs, _ = compute_log_probs(model, model_args, model_kwargs, {})
            return sum((v for k, v in log_probs.items() if k in self.data_sites), start=0.0) / size

        def score(index):
            return value_and_flat_grad(partial(log_lik, index=index), flat, unravel)[1]

        return jax.vmap(score)(batch[plate])

    def postprocess_fn(
        self, model_args: tuple[Any, ...], model_kwargs: Mapping[str, Any]
    ) -> Callable[[Params], Params]:
        """Map unconstrained samples to constrained values and deterministic sites (on the full data)."""
        if self.constrained:
            return partial(_values_and_deterministic, full_data(self.model), model_args, model_kwargs)
        return partial(constrain_fn, full_data(self.model), model_args, model_kwargs, return_deterministic=True)


class PotentialTarget:
    """A target given as an energy ``potential_fn(z)`` or a stochastic energy ``potential_fn(z, rng_key)``."""

    def __init__(self, potential_fn: Callable[..., jax.Array], kernel_name: str) -> None:
        self.potential_fn = potential_fn
        self.kernel_name = kernel_name
        # stochastic if the second positional parameter has no default: `f(z, scale=1.0)` is an energy of z
        self.stochastic: bool = _model_checks.is_stochastic_potential(potential_fn, kernel_name, "rng_key")
        self.data_size: int = 1
        self.streamed = False

    def initial_params(
        self,
        rng_key: jax.Array,
        init_strategy: Callable[..., Any],
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> Params:
        """Always raises: a ``potential_fn`` gives no way to draw initial values."""
        raise ValueError(
            f"{self.kernel_name}: a kernel built from `potential_fn` needs `init_params`: pass them to "
            "`mcmc.run(rng_key, init_params=...)` (one leading entry per chain when num_chains > 1)."
        )

    def init_batch(self, rng_key: jax.Array) -> minibatch.BatchState:
        """An empty minibatch state: a ``potential_fn`` draws its own data."""
        return minibatch.BatchState({}, {})

    def draw(self, rng_key: jax.Array, batch_state: minibatch.BatchState) -> tuple[jax.Array, minibatch.BatchState]:
        """The step's key is the step's data: ``potential_fn(z, rng_key)`` uses it."""
        return rng_key, batch_state

    #: The keys :meth:`epoch` gives a stochastic ``potential_fn``.
    EPOCH_KEYS = 16

    def epoch(self, rng_key: jax.Array, rows: int) -> jax.Array:
        """Stacked keys to average over: :data:`EPOCH_KEYS` of them for a stochastic ``potential_fn``, one
        otherwise (``rows`` is the model targets' notion)."""
        return random.split(rng_key, self.EPOCH_KEYS if self.stochastic else 1)

    def gradient(
        self,
        flat: jax.Array,
        unravel: Callable[[jax.Array], Params],
        batch: Batch,
        model_args: tuple[Any, ...],
        model_kwargs: Mapping[str, Any],
    ) -> StochasticGradient:
        """The energy and its gradient at ``flat``; the score is the negated gradient (``N = 1``)."""

        def energy(z):
            return self.potential_fn(z, batch) if self.stochastic else self.potential_fn(z)

        value, grad = value_and_flat_grad(energy, flat, unravel)
        return StochasticGradient(value, grad, -grad)

    def postprocess_fn(
        self, model_args: tuple[Any, ...], model_kwargs: Mapping[str, Any]
    ) -> Callable[[Params], Params]:
        """The identity: draws are the values ``potential_fn`` takes."""
        return lambda z: z
