"""Checks of a model's plates and data at a kernel's init, with the messages both backends raise.

The NumPyro and Pyro targets (``ppl_sgmcmc/numpyro/potential.py``, ``ppl_sgmcmc/pyro/potential.py``)
read the same facts from a prototype trace (plate sizes, site shapes, the arrays a model subsamples)
and hand them to these functions, so that the same bad input gets the same message on both backends.
``ppl`` is the backend's module name, ``"numpyro"`` or ``"pyro"``, used to spell the fix.

**Example**::

    >>> from ppl_sgmcmc import _model_checks
    >>> try:
    ...     _model_checks.subsample_size("data", 200, 0, "SGLD", "numpyro")
    ... except _model_checks.ModelError as err:
    ...     print(err)
    SGLD: plate 'data' has size N = 200 and subsample_size n = 0; subsample_size must be an integer with
    1 <= n <= N (n = N uses all the data in every step). Declare `numpyro.plate('data', 200, subsample_size=n)`
    with such an n.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

#: How many bad rows a message lists before ``...``.
MAX_ROWS_SHOWN = 5

#: The hint :func:`error_hint` gives when it recognises nothing more specific.
SHAPE_HINT = (
    "Check that every array subsampled inside a plate has the plate's size along the plate's dimension, and that "
    "the model runs on its data without the kernel."
)

_DTYPE_ERROR = re.compile(
    r"dtype|scalar type|integer type|integer or boolean|used as indices|result type|"
    r"not implemented for '(?:int|long|short|char|byte|bool|half|double|float)",
    re.IGNORECASE,
)
_SHAPE_ERROR = re.compile(r"shape|broadcast|size of tensor|must match|dimension", re.IGNORECASE)


class ModelError(ValueError):
    """A mistake in a model or its data, found at a kernel's init; the message says what is wrong and
    how to fix it. The backends' ``model_errors`` pass it on unchanged."""


class Frame(NamedTuple):
    """A subsampled plate around a site: its name, its dim (counted from the right of the batch
    shape, negative), its size ``N`` and its subsample size ``n``."""

    name: str
    dim: int
    size: int
    subsample_size: int


def subsample_size(plate: str, size: Any, n: Any, kernel: str, ppl: str) -> None:
    """Refuse a ``subsample_size`` that is not an integer ``1 <= n <= N`` (``n = 0`` would sample the
    prior, ``n > N`` or ``n < 0`` fail in the PPL with unrelated errors)."""
    value: int | None
    full: int | None
    try:
        value = operator.index(n)
        full = operator.index(size)
    except TypeError:
        value = full = None
    if isinstance(n, bool) or value is None or full is None or not 1 <= value <= full:
        raise ModelError(
            f"{kernel}: plate {plate!r} has size N = {size} and subsample_size n = {n!r}; subsample_size must be an "
            f"integer with 1 <= n <= N (n = N uses all the data in every step). Declare "
            f"`{ppl}.plate({plate!r}, {size}, subsample_size=n)` with such an n."
        )


def plate_declared_again(
    seen: dict[str, tuple[int, int]], plate: str, size: int, n: int | None, kernel: str, ppl: str
) -> None:
    """Record the plate ``plate`` of size ``size`` and subsample size ``n`` in ``seen`` (``{name: (N, n)}``)
    and refuse a name declared again with another size or subsample size, if either is subsampled: the
    kernel draws one set of indices per plate name."""
    n = size if n is None else n
    if plate not in seen:
        seen[plate] = (size, n)
        return
    first = seen[plate]
    if first != (size, n) and (first[1] < first[0] or n < size):
        raise ModelError(
            f"{kernel}: plate {plate!r} is declared with size {first[0]} (subsample_size {first[1]}) and again with "
            f"size {size} (subsample_size {n}). The kernel draws one minibatch of indices per plate name, so one of "
            f"them would index its data with the other's rows. Give the second `{ppl}.plate` its own name, or "
            "declare both with the same size and subsample_size."
        )


def plate_constructed_twice(plate: str, size: int, n: int, kernel: str) -> ModelError:
    """Pyro: a subsampled plate constructed twice (Pyro records its indices as a sample site)."""
    return ModelError(
        f"{kernel}: plate {plate!r} (size {size}, subsample_size {n}) is constructed twice; Pyro records a plate's "
        "indices as a sample site named after it, so the second `pyro.plate` fails. Build the plate once and enter "
        f"it twice: `data = pyro.plate({plate!r}, {size}, subsample_size={n})`, then `with data: ...` each time."
    )


def rows_frame(frames: Sequence[Frame], shape: Sequence[int], event_dim: int | None) -> Frame | None:
    """The first of ``frames`` along whose dim (left of ``event_dim`` event dims) an array of ``shape`` has
    the plate's full size: the plate whose rows it holds.

    **Example**::

        >>> rows_frame([Frame("data", -1, 200, 20)], (200, 2), event_dim=1)
        Frame(name='data', dim=-1, size=200, subsample_size=20)
    """
    if event_dim is None:
        return None
    for frame in frames:
        dim = frame.dim - event_dim
        if len(shape) >= -dim and shape[dim] == frame.size:
            return frame
    return None


def bad_rows(bad: np.ndarray, dim: int) -> np.ndarray:
    """The indices along ``dim`` of the boolean mask ``bad`` where any entry is set.

    **Example**::

        >>> import numpy as np
        >>> bad_rows(np.array([[False, False], [False, True], [True, False]]), 0).tolist()
        [1, 2]
    """
    bad = np.moveaxis(np.asarray(bad, dtype=bool), dim, 0)
    return np.flatnonzero(bad.reshape(bad.shape[0], -1).any(axis=1))


def nonfinite_data(
    what: str, rows: np.ndarray | Sequence[int] | None, plate: str | None, size: int | None, count: int, kernel: str
) -> ModelError:
    """The error for non-finite data: ``what`` names the data (``"observed site 'y'"``), ``rows`` are its bad
    rows along the dim of the plate ``plate`` of size ``size`` (``plate=None``: along its first axis; ``rows=None``:
    no rows to name; then ``count`` is the number of bad entries)."""
    if rows is not None:
        shown = ", ".join(str(int(i)) for i in rows[:MAX_ROWS_SHOWN]) + (", ..." if len(rows) > MAX_ROWS_SHOWN else "")
        of = f"of plate {plate!r}" if plate is not None else "along its first axis"
        where = f"at rows [{shown}] {of} ({len(rows)} of {size} rows)"
    else:
        where = f"({count} entries)"
    return ModelError(
        f"{kernel}: {what} has non-finite values (NaN or inf) {where}. A minibatch holding them would give a "
        "non-finite gradient: the kernel would reject its steps as divergences or find no initial values. Drop or "
        "impute those rows before sampling."
    )


def nonfinite_in_arguments(
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    is_array: Callable[[Any], bool],
    bad_mask: Callable[[Any], np.ndarray | None],
    plates: Mapping[str, tuple[int, int]],
    kernel: str,
) -> None:
    """Raise :func:`nonfinite_data` for the first array in the model's arguments that holds NaN or inf
    (``bad_mask(x)``: ``None`` if ``x`` is finite, else its mask of bad entries). Called when the model
    failed, to say why; rows are counted along the first axis, named after a subsampled plate of that size."""
    for label, array in argument_arrays(args, kwargs, is_array):
        bad = bad_mask(array)
        if bad is None:
            continue
        if bad.ndim == 0:
            raise nonfinite_data(f"the model argument {label}", None, None, None, 1, kernel)
        size = bad.shape[0]
        plate = next((name for name, (full, n) in plates.items() if n is not None and n < full == size), None)
        what = f"the model argument {label} (shape {_fmt(bad.shape)})"
        raise nonfinite_data(what, bad_rows(bad, 0), plate, size, int(bad.sum()), kernel)


def subsampled_array(shape: Sequence[int], event_dim: int | None, ppl: str) -> str:
    """How a message names an array passed to ``subsample`` that no observed site uses as it is."""
    return f"the array of shape {tuple(shape)} passed to `{ppl}.subsample(..., event_dim={event_dim})`"


class Subsampled(NamedTuple):
    """An array the model passed to ``numpyro.subsample`` / ``pyro.subsample`` in the prototype trace."""

    #: the ``subsample`` message; its value ends as the minibatch's rows (the object an observed site gets)
    msg: dict[str, Any]
    #: the whole array
    array: Any
    event_dim: int | None
    #: the subsampled plate that indexes its rows, if one does
    frame: Frame | None


BadMask = Callable[[Any], "np.ndarray | None"]  # the backend's NaN/inf mask of an array, None if finite


def check_finite(
    value: Any, what: str, frame: Frame | None, event_dim: int | None, kernel_name: str, bad_mask: BadMask
) -> None:
    """Raise if the data ``value`` holds NaN or inf (``bad_mask``: the backend's one-reduction test); the bad
    rows of ``frame`` are located only when there are some."""
    bad = bad_mask(value)
    if bad is None:
        return
    if frame is not None and event_dim is not None and bad.ndim >= event_dim - frame.dim:
        rows = bad_rows(bad, frame.dim - event_dim)
        raise nonfinite_data(what, rows, frame.name, frame.size, int(bad.sum()), kernel_name)
    raise nonfinite_data(what, None, None, None, int(bad.sum()), kernel_name)


def check_subsampled(
    subsampled: Sequence[Subsampled], observed: Mapping[int, str], kernel_name: str, bad_mask: BadMask, ppl: str
) -> set[str]:
    """Check each array passed to ``<ppl>.subsample`` once for NaN and inf, named after an observed site
    whose value it became (``observed``: ``{id(value): site name}``); return the names of every observed site
    whose value came from a checked array (several sites may observe one array)."""
    arrays: dict[int, tuple[Subsampled, str | None]] = {}
    sites: set[str] = set()
    for record in subsampled:
        site = observed.get(id(record.msg["value"]))
        if site is not None:
            sites.add(site)
        if id(record.array) not in arrays or arrays[id(record.array)][1] is None:
            arrays[id(record.array)] = (record, site)
    for record, site in arrays.values():
        what = (
            f"observed site {site!r}"
            if site is not None
            else subsampled_array(tuple(record.array.shape), record.event_dim, ppl)
        )
        check_finite(record.array, what, record.frame, record.event_dim, kernel_name, bad_mask)
    return sites


def explain_failure(
    subsampled: Sequence[Subsampled],
    model_args: tuple[Any, ...],
    model_kwargs: Mapping[str, Any],
    plates: Mapping[str, tuple[int, int]],
    kernel_name: str,
    is_array: Callable[[Any], bool],
    bad_mask: BadMask,
    ppl: str,
) -> None:
    """After the model failed on its data: raise the non-finite-data error if NaN or inf in the arrays it
    subsampled or in its arguments explain the failure (a distribution refusing NaN parameters, say)."""
    check_subsampled(subsampled, {}, kernel_name, bad_mask, ppl)
    nonfinite_in_arguments(model_args, model_kwargs, is_array, bad_mask, plates, kernel_name)


def _fmt(shape: Sequence[int]) -> str:
    return str(tuple(int(s) for s in shape))


def site_shape(
    site: str,
    value_shape: Sequence[int],
    batch_shape: Sequence[int],
    event_shape: Sequence[int],
    frames: Sequence[Frame],
    kernel: str,
    ppl: str,
) -> None:
    """Check the value of a sample site inside subsampled plates (``frames``) against its distribution:
    along each plate's dim it has the minibatch's size ``n`` (or 1), and broadcasting it with the
    distribution's shape ``batch_shape + event_shape`` does not enlarge that shape (an observed ``y`` of
    shape ``(N, 1)`` against a plate of size ``N`` at dim -1 would broadcast to ``(N, n)`` pairs)."""
    value_shape, batch_shape, event_shape = tuple(value_shape), tuple(batch_shape), tuple(event_shape)
    dist_shape = batch_shape + event_shape
    event_dim = len(event_shape)
    for frame in frames:
        dim = frame.dim - event_dim
        if len(value_shape) < -dim or value_shape[dim] in (1, frame.subsample_size):
            continue
        where = (
            f"observed site {site!r} inside plate {frame.name!r} (size {frame.size}, subsample_size "
            f"{frame.subsample_size}, dim {frame.dim}) has a value of shape {_fmt(value_shape)}"
        )
        if value_shape[dim] == frame.size:
            raise ModelError(
                f"{kernel}: {where}, with the plate's full size {frame.size} along dim {dim} instead of the minibatch's "
                f"{frame.subsample_size}: the data are not subsampled. Wrap it in `{ppl}.subsample({site}, "
                f"event_dim={event_dim})` (or index it with the plate's indices: `with {ppl}.plate(...) as idx:` and "
                f"`obs={site}[idx]`)."
            )
        raise ModelError(
            f"{kernel}: {where}, of size {value_shape[dim]} along dim {dim}; it must have the minibatch's size "
            f"{frame.subsample_size} there. Subsample it with this plate (`{ppl}.subsample({site}, "
            f"event_dim={event_dim})`)."
        )
    try:
        broadcast = tuple(np.broadcast_shapes(value_shape, dist_shape))
    except ValueError:
        broadcast = None
    if broadcast == dist_shape:
        return
    full = list(dist_shape)
    for frame in frames:
        if len(full) >= -(frame.dim - event_dim):
            full[frame.dim - event_dim] = frame.size
    plates = ", ".join(f"{f.name!r} (size {f.size}, subsample_size {f.subsample_size}, dim {f.dim})" for f in frames)
    if broadcast is None:
        effect = "which does not broadcast with it"
    else:
        effect = (
            f"which broadcasts with it to {_fmt(broadcast)}: the log-likelihood would sum {math.prod(broadcast)} "
            f"terms instead of {math.prod(dist_shape)}"
        )
    raise ModelError(
        f"{kernel}: observed site {site!r} has a value of shape {_fmt(value_shape)} and its distribution the shape "
        f"{_fmt(dist_shape)} (batch {_fmt(batch_shape)}, event {_fmt(event_shape)}) inside plate(s) {plates}, "
        f"{effect}. Reshape the data of {site!r} to {_fmt(full)} (e.g. `y.reshape({', '.join(map(str, full))})`), or "
        f"declare its trailing dimensions as an event: `{ppl}.subsample(y, event_dim=1)` and `.to_event(1)` on the "
        "distribution."
    )


def local_latent(site: str, plate: str, kernel: str, ppl: str) -> NotImplementedError:
    """The error for a latent site (not a local Gibbs site) inside a subsampled plate."""
    return NotImplementedError(
        f"{kernel}: latent site {site!r} lies inside the subsampled plate {plate!r}; SG-MCMC kernels move global "
        "latents only. Marginalise the local latent out of the likelihood, move it outside the plate, or make it a "
        f"local Gibbs site: `gibbs_sites=[{site!r}], gibbs_fn=...` redraws it from its conditional for each "
        f"minibatch (see ppl_sgmcmc.{ppl}.gibbs)."
        + (
            " A `PyroModule`'s `PyroSample` weight is sampled where it is first read: read the weights before the "
            "plate (call the network, or read each weight, before `with pyro.plate(...)`)."
            if ppl == "pyro"
            else ""
        )
    )


def fixed_parameter(site: str, kernel: str, ppl: str) -> ModelError:
    """The error for a ``param`` site (a learnable parameter, not a latent) in a model under a kernel."""
    if ppl == "pyro":
        fix = (
            "give it a prior: declare it with `pyro.sample`, or, for a `PyroModule`'s parameter, assign a "
            "`PyroSample` (`module.weight = PyroSample(dist.Normal(0., 1.).expand([out, in]).to_event(2))`; "
            "`pyro.nn.module.to_pyro_module_` turns an `nn.Module` into a `PyroModule` whose parameters are still "
            "`pyro.param`s)"
        )
    else:
        fix = (
            "give it a prior: declare it with `numpyro.sample`, or build the network with "
            "`numpyro.contrib.module.random_flax_module` / `random_nnx_module` / `random_eqx_module` and a prior "
            "for every parameter (a distribution, not a dict that leaves some out) instead of `flax_module` / "
            "`nnx_module` / `eqx_module`"
        )
    return ModelError(
        f"{kernel}: site {site!r} is a `{ppl}.param`, a parameter without a prior: SG-MCMC kernels move `{ppl}.sample` "
        f"latents only, so it would stay at its initial value. To sample it, {fix}; to keep it fixed, pass it to the "
        "model as an argument."
    )


def mutable_state(site: str, kernel: str) -> ModelError:
    """The error for a ``numpyro.mutable`` site (batch-norm statistics, say) in a model under a kernel."""
    return ModelError(
        f"{kernel}: site {site!r} is a `numpyro.mutable` state (batch-norm statistics, say), which a potential "
        "cannot carry: a step's gradient would see the minibatch's statistics, so the potential would not be a sum "
        "over the data rows, and the state's updates would be lost. Use a network without mutable state: "
        "`flax.linen.LayerNorm` (or `nnx.LayerNorm`, `equinox.nn.LayerNorm`) instead of batch norm, or no "
        "normalisation layer, and no `mutable=` argument."
    )


def error_hint(
    message: str, plates: Mapping[str, tuple[int, int]] | None, dtypes: Sequence[tuple[str, str]] | None, ppl: str
) -> str:
    """The hint appended to an error the model raised under a kernel: a dtype error says so (and lists
    the data arguments' dtypes, ``dtypes``: ``[(label, dtype)]``); a shape error that names a subsampled
    plate's size ``N`` and subsample size ``n`` (``plates``: ``{name: (N, n)}``) points at a missing
    ``subsample``; anything else gets :data:`SHAPE_HINT`.

    **Example**::

        >>> print(error_hint("addmv tensors must have the same dtype", None, [("args[0]", "torch.float64")], "pyro"))
        This is a dtype error, not a shape error: the model mixes arrays of different dtypes, or indexes (or
        observes a discrete distribution) with floats. The data arguments: args[0] of dtype torch.float64. Give
        continuous data the latents' floating dtype (`torch.get_default_dtype()`, e.g. `X.float()`), and integer
        dtypes to indices and to the observations of discrete distributions such as Categorical.
    """
    if "to be within the support" in message:  # Pyro's validation of a value
        return (
            "A value lies outside its distribution's support: observed data to recode into the support (labels ±1 "
            "for a Bernoulli: `(y + 1) / 2`), or initial values that are not in the latents' unconstrained space."
        )
    if _DTYPE_ERROR.search(message):
        listed = ", ".join(f"{label} of dtype {dtype}" for label, dtype in dtypes or ())
        if ppl == "pyro":
            floating = "`torch.get_default_dtype()`, e.g. `X.float()`"
        else:
            floating = "float32 unless `jax_enable_x64` is set, e.g. `jnp.asarray(X, jnp.float32)`"
        return (
            "This is a dtype error, not a shape error: the model mixes arrays of different dtypes, or indexes (or "
            f"observes a discrete distribution) with floats.{f' The data arguments: {listed}.' if listed else ''} "
            f"Give continuous data the latents' floating dtype ({floating}), and integer dtypes to indices and to "
            "the observations of discrete distributions such as Categorical."
        )
    if _SHAPE_ERROR.search(message) and plates and "invalid shape of" not in message:
        numbers = set(re.findall(r"\d+", message))
        for name, (size, n) in plates.items():
            if n is not None and n < size and str(size) in numbers and str(n) in numbers:
                return (
                    f"An array with the full size {size} of plate {name!r} met the minibatch's {n} rows: inside the "
                    f"plate, pass every data array through `{ppl}.subsample(X, event_dim=...)` (or index it with the "
                    "plate's indices) before using it."
                )
    return SHAPE_HINT


def argument_arrays(
    args: Sequence[Any], kwargs: Mapping[str, Any], is_array: Callable[[Any], bool]
) -> list[tuple[str, Any]]:
    """``[(label, array)]`` of the arrays in a model's arguments (nested tuples, lists and dicts).

    **Example**::

        >>> import numpy as np
        >>> [(label, a.dtype.name) for label, a in argument_arrays(
        ...     (np.zeros(2),), {"y": [np.arange(3)]}, lambda x: isinstance(x, np.ndarray))]
        [('args[0]', 'float64'), ("kwargs['y'][0]", 'int64')]
    """

    def walk(tree: Any, label: str) -> list[tuple[str, Any]]:
        if is_array(tree):
            return [(label, tree)]
        if isinstance(tree, (list, tuple)):
            return [found for i, x in enumerate(tree) for found in walk(x, f"{label}[{i}]")]
        if isinstance(tree, Mapping):
            return [found for k, x in tree.items() for found in walk(x, f"{label}[{k!r}]")]
        return []

    return walk(tuple(args), "args") + walk(dict(kwargs), "kwargs")


def data_dtypes(
    args: Sequence[Any], kwargs: Mapping[str, Any], is_array: Callable[[Any], bool]
) -> list[tuple[str, str]]:
    """``[(label, dtype)]`` of the arrays in a model's arguments, for :func:`error_hint`."""
    return [(label, str(array.dtype)) for label, array in argument_arrays(args, kwargs, is_array)]


def is_stochastic_potential(potential_fn: Callable[..., Any], kernel: str, second: str) -> bool:
    """Whether ``potential_fn`` is a stochastic energy ``f(z, second)``: it is when its second positional
    parameter has no default (``f(z, scale=1.0)`` is an energy of ``z`` alone). A function that needs more
    than two positional arguments is refused.

    **Example**::

        >>> is_stochastic_potential(lambda z, rng_key: 0.0, "SGLD", "rng_key")
        True
        >>> is_stochastic_potential(lambda z, scale=1.0: 0.0, "SGLD", "rng_key")
        False
    """
    try:
        parameters = list(inspect.signature(potential_fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required = [p.name for p in positional if p.default is inspect.Parameter.empty]
    if len(required) > 2:
        raise TypeError(
            f"{kernel}: `potential_fn` must take the latent values, `f(z)`, or the latent values and a {second}, "
            f"`f(z, {second})`; it requires {len(required)} positional arguments ({', '.join(required)}). Give the "
            "others defaults or bind them with `functools.partial`."
        )
    return len(positional) >= 2 and positional[1].default is inspect.Parameter.empty


def local_sites_message(local: Sequence[str], aside: str = "") -> str:
    """Why the pointwise log-likelihood of a run with local Gibbs sites ``local`` cannot be computed."""
    return (
        f"the local Gibbs site(s) {list(local)} are not among the samples (a kernel keeps no local draws), and "
        "the pointwise log-likelihood p(y_i | θ) needs them marginalised, which the kernel cannot do for a "
        f"general model{aside}"
    )


def log_likelihood_too_large(
    num_bytes: int, limit: int, num_chains: int, num_draws: int, sizes: Mapping[str, int], thinning: str
) -> str:
    """The refusal of a pointwise log-likelihood over ``limit`` bytes; ``thinning`` names the driver's ways to
    keep fewer draws."""
    values = " + ".join(f"{size} ({name!r})" for name, size in sizes.items())
    return (
        f"the pointwise log-likelihood would take {num_bytes / 2**30:.2f} GiB ({num_chains} chains × {num_draws} "
        f"draws × {values} values), above max_log_likelihood_bytes={limit}. Pass log_likelihood=False, keep "
        f"fewer draws ({thinning}, fewer `num_samples`, or thin the samples yourself), or raise "
        "max_log_likelihood_bytes."
    )


def no_latent_sites(kernel: str, ppl: str) -> ModelError:
    """The error for a model without a latent site the chain could move (every sample site is observed, or a
    local Gibbs site)."""
    return ModelError(
        f"{kernel}: the model has no latent sample site (every `{ppl}.sample` is observed, or a local Gibbs site), "
        f"so there is nothing for the chain to move. Declare at least one `{ppl}.sample` site without `obs=`; to "
        "evaluate a model at fixed values, run it directly or with `Predictive`."
    )


def initial_sites(given: Sequence[str], latents: Sequence[str], arg: str, kernel: str) -> None:
    """Refuse initial values (``arg``: ``init_params`` or ``initial_params``) whose sites ``given`` lack some of
    the model's ``latents`` or name a site that is not one (a site renamed since the values were saved).

    **Example**::

        >>> try:
        ...     initial_sites(["nu"], ["mu"], "init_params", "SGLD")
        ... except ModelError as err:
        ...     print(err)
        SGLD: `init_params` lacks the latent site(s) 'mu' and names 'nu', which is not a latent site of the model;
        the model's latent sites are 'mu'. Give unconstrained values for exactly these sites (values saved from a
        run of a model whose sites have since been renamed must be renamed too).
    """
    missing = [name for name in latents if name not in given]
    unknown = [name for name in given if name not in latents]
    if not missing and not unknown:
        return
    parts = []
    if missing:
        parts.append(f"lacks the latent site(s) {', '.join(map(repr, missing))}")
    if unknown:
        parts.append(f"names {', '.join(map(repr, unknown))}, which {'is' if len(unknown) == 1 else 'are'} not "
                     f"{'a latent site' if len(unknown) == 1 else 'latent sites'} of the model")  # fmt: skip
    raise ModelError(
        f"{kernel}: `{arg}` {' and '.join(parts)}; the model's latent sites are {', '.join(map(repr, latents))}. "
        "Give unconstrained values for exactly these sites (values saved from a run of a model whose sites have "
        "since been renamed must be renamed too)."
    )


def nonfinite_initial(sites: Sequence[str], arg: str, kernel: str) -> ModelError:
    """The error for initial values (``arg``) that hold NaN or inf at ``sites``."""
    return ModelError(
        f"{kernel}: `{arg}` holds NaN or inf at the site(s) {', '.join(map(repr, sites))}; the chain needs a finite "
        "start. Give finite unconstrained values (a constrained value `x` of a site is `biject_to(support).inv(x)` "
        "in its unconstrained space), or leave the start to the init strategy."
    )


def scalar_parameters(support: Any, is_array: Callable[[Any], bool]) -> bool:
    """Whether the constraint ``support`` has no array parameter with more than one entry (its check then
    applies to a whole data array, not only to the minibatch whose distribution holds it).

    **Example**::

        >>> import numpy as np
        >>> from types import SimpleNamespace
        >>> scalar_parameters(SimpleNamespace(lower_bound=0.0), lambda x: isinstance(x, np.ndarray))
        True
        >>> scalar_parameters(SimpleNamespace(upper_bound=np.arange(3)), lambda x: isinstance(x, np.ndarray))
        False
    """
    seen: set[int] = set()

    def fixed(node: Any) -> bool:
        if id(node) in seen:
            return True
        seen.add(id(node))
        if is_array(node):
            return math.prod(node.shape) <= 1
        if isinstance(node, (list, tuple)):
            return all(fixed(x) for x in node)
        return all(fixed(x) for x in getattr(node, "__dict__", {}).values())

    return fixed(support)


def check_support(
    value: Any, ok: np.ndarray, what: str, distribution: str, support: Any, frame: Frame | None, kernel: str
) -> None:
    """Raise if observed data lie outside their distribution's support: ``ok`` is the support's check of
    ``value`` (a boolean array of its batch shape), ``frame`` the subsampled plate whose rows it holds, if
    one does.

    **Example** (labels ±1 for a Bernoulli)::

        >>> import numpy as np
        >>> y = np.array([1.0, -1.0, 1.0, 0.0])
        >>> try:
        ...     check_support(y, (y == 0) | (y == 1), "observed site 'y'", "Bernoulli", "Boolean()",
        ...                   Frame("data", -1, 4, 2), "SGLD")
        ... except ModelError as err:
        ...     print(str(err)[:145])
        SGLD: observed site 'y' has values outside the support Boolean() of its Bernoulli distribution at rows [1] of
        plate 'data' (1 of 4 rows; e.g. -1)
    """
    bad = ~np.asarray(ok, dtype=bool)
    if not bad.any():
        return
    array = np.asarray(value)
    examples = ""
    if array.shape == bad.shape:
        shown = sorted({float(x) for x in array[bad].ravel()[:100]})[:3]
        examples = "; e.g. " + ", ".join(f"{x:g}" for x in shown)
    if frame is not None and bad.ndim >= -frame.dim:
        rows = bad_rows(bad, frame.dim)
        listed = ", ".join(str(int(i)) for i in rows[:MAX_ROWS_SHOWN]) + (", ..." if len(rows) > MAX_ROWS_SHOWN else "")
        where = f"at rows [{listed}] of plate {frame.name!r} ({len(rows)} of {frame.size} rows{examples})"
    else:
        where = f"({int(bad.sum())} of {bad.size} entries{examples})"
    raise ModelError(
        f"{kernel}: {what} has values outside the support {support} of its {distribution} distribution {where}. "
        "Its log-density is not defined there (NUTS would find no initial values; a kernel that does not validate "
        "the data would sample a wrong posterior). Recode the data into the support (labels ±1 for a Bernoulli: "
        "`(y + 1) / 2`), or give the site a distribution whose support holds them."
    )


def initial_shapes(
    given: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]], arg: str, chains: str, kernel: str
) -> None:
    """Refuse initial values (``arg``) whose shapes ``given`` (``{site: shape}``, without a chain axis) differ from
    the model's unconstrained shapes ``expected``; ``chains`` says how the driver takes one value per chain."""
    wrong = [name for name in expected if name in given and tuple(given[name]) != tuple(expected[name])]
    if wrong:
        raise ModelError(
            f"{kernel}: `{arg}` gives the latent site(s) {', '.join(f'{k!r} the shape {_fmt(given[k])}' for k in wrong)}; "
            f"the model's are {', '.join(f'{k!r}: {_fmt(expected[k])}' for k in wrong)}. Give unconstrained values of "
            f"each site's shape (a simplex of size k has k - 1 unconstrained coordinates; {chains})."
        )


def distribution_name(fn: Any) -> str:
    """The class name of a distribution, through the wrappers that batch, mask or make it independent.

    **Example**::

        >>> import numpyro.distributions as dist
        >>> distribution_name(dist.Bernoulli(0.5).expand([3]).mask(False).to_event(1))
        'Bernoulli'
    """
    while type(fn).__name__ in ("ExpandedDistribution", "Independent", "MaskedDistribution"):
        fn = fn.base_dist
    return re.sub(r"(?<=.)(Probs|Logits)$", "", type(fn).__name__)  # NumPyro's BernoulliProbs is a Bernoulli


def no_bijection(site: str, distribution: str, support: Any, kernel: str, ppl: str) -> NotImplementedError:
    """The error for a latent site whose support has no bijection to unconstrained space (a sphere, Pyro's
    positive-definite and lower-Cholesky matrices): no gradient-based kernel moves it, NUTS neither."""
    reparam = "`numpyro.handlers.reparam`" if ppl == "numpyro" else "`pyro.poutine.reparam`"
    return NotImplementedError(
        f"{kernel}: latent site {site!r} ({distribution}) has the support {support}, which {ppl} cannot map to "
        "unconstrained space (`biject_to` has no bijection for it), so no gradient-based kernel can move it (NUTS "
        "neither). Reparametrise it: sample unconstrained (or Cholesky-factor) latents and build the value from "
        f"them with `{ppl}.deterministic`, or use {reparam} (`ProjectedNormalReparam` for a ProjectedNormal)."
    )
