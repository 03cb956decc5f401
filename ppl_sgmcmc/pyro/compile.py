"""Trace a potential's value and gradient once into a graph of tensor operations, compiled by TorchInductor.

Running a Pyro model costs far more Python than its arithmetic: distribution objects, the handler
stack, broadcasting checks, and an autograd graph built and walked every step. On a small logistic
regression that overhead is about half of a step. :func:`trace` records, once, the ATen operations
that one evaluation of ``(Ũ_t, ∇Ũ_t)`` performs, forward and backward, as a
:class:`torch.fx.GraphModule` (``torch.fx.experimental.proxy_tensor.make_fx`` on fake tensors), and
compiles that graph with TorchInductor (the compiler of ``torch.compile``: Ansel et al., "PyTorch 2:
Faster Machine Learning Through Dynamic Python Bytecode Transformation and Graph Compilation",
ASPLOS 2024). Inductor folds the operations on constants (the prior's parameters, the ``ones_like``
seeds of the backward pass), drops no-ops, functionalises the in-place writes of a batched backward
(``is_grads_batched`` fills ``zeros`` buffers through ``copy_`` into views) and fuses what is left
into C++ loops. Later steps call the compiled graph on new parameters, minibatch indices and data. Once the
steps after the warm-up are all the same, the kernel traces this graph (:attr:`CompiledFunction.traced`) into
one graph of the whole step, with the update rule's arithmetic (:func:`compile_tensors`).

How much each stage gains is measured in ``benchmarks/pyro_compile.py`` and ``benchmarks/throughput.py``
(``benchmarks/RESULTS.md``). ``torch.compile`` of the model's Python itself breaks the graph at
``torch.autograd.grad`` and in Pyro's handlers, hence the ``make_fx`` trace first. The traced graph is
compiled by TorchInductor alone (``torch._inductor.compile``, :class:`InductorGraph`), not through
``torch.compile``'s TorchDynamo frame: Dynamo's guards and wrappers cost more per call than the whole
compiled gradient of a small model. The inputs' dtypes, shapes, strides and devices are checked in Python
instead, and a call with others runs the graph through ``torch.compile``, which specialises it again. No
CUDA graphs (``"reduce-overhead"``): they would overwrite a call's outputs with the next call's, which the
kernels keep. The price is compile time: a few seconds for the first graph in a process and for a graph
Inductor has not compiled on this machine before (its C++ is cached on disk), tenths of a second for the
next graphs. A kernel whose graph is identical to one compiled before in the process (the same model and
data shapes, another step size or kernel) reuses that compiled graph.

The trace uses fake tensors (shapes only), so a model whose Python control flow depends on the
*values* of latents, data or indices cannot be traced: it raises, and the kernel falls back to
running the model eagerly, with a warning. So it does when the compiler fails (no C++ compiler,
say) or when the compiled graph disagrees with the eager model at either of the two points it is
checked at before use. Shapes are fixed by the trace; model arguments that are tensors are inputs
of the graph, other arguments are baked in.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pyro
import torch

__all__ = ["CompiledFunction", "InductorGraph", "close", "compile_graph", "compile_tensors", "trace"]


class CompiledFunction:
    """A traced (by default compiled) graph, called without building an autograd graph (it contains
    its own backward). ``copies``: the positions of the outputs returned as copies, because the graph
    returns them in memory shared with an input or with its other calls' outputs (a constant), so
    that a caller writing into an output changes neither its inputs nor later calls' outputs.
    ``traced``: the ``make_fx`` graph before compilation, which a larger trace can call (the kernel's
    compiled step traces the gradient's graph into its own)."""

    def __init__(
        self,
        graph: Callable[..., Sequence[torch.Tensor]],
        copies: Sequence[int] = (),
        traced: torch.fx.GraphModule | None = None,
    ) -> None:
        self.graph = graph
        self.copies = tuple(copies)
        self.traced = traced

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            outputs = tuple(self.graph(*inputs))
            if self.copies:
                outputs = tuple(out.clone() if i in self.copies else out for i, out in enumerate(outputs))
        return outputs


def _storage(t: object) -> int | None:
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return None
    return t.untyped_storage().data_ptr()


def _shared_outputs(graph: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]) -> list[int]:
    """The positions of ``graph``'s outputs that share memory with one of ``inputs`` or with the same
    output of another call (two calls on ``inputs``; which outputs alias is fixed by the graph)."""
    with torch.no_grad():
        first, second = tuple(graph(*inputs)), tuple(graph(*inputs))
    given = {_storage(t) for t in inputs} - {None}
    return [
        i
        for i, (a, b) in enumerate(zip(first, second))
        if _storage(a) is not None and (_storage(a) in given or _storage(a) == _storage(b))
    ]


_MEMO_CODES = 64  # generated codes remembered, and for each code ...
_MEMO_VARIANTS = 8  # ... graphs with other constants
_MEMO_MAX_NUMEL = 2**20  # graphs holding more constant elements (a closed-over data set) are not remembered
_memo: OrderedDict[tuple, list[tuple[list[torch.Tensor], InductorGraph]]] = OrderedDict()


def _constants(graph: torch.fx.GraphModule) -> list[torch.Tensor] | None:
    """The tensors the graph holds (``get_attr``), or ``None`` if it holds anything else or too much."""
    values = [getattr(graph, node.target) for node in graph.graph.nodes if node.op == "get_attr"]
    if not all(isinstance(v, torch.Tensor) for v in values) or sum(v.numel() for v in values) > _MEMO_MAX_NUMEL:
        return None
    return values


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values as bytes: equal for two NaNs of the same bits (``torch.equal`` is false for NaN, and a
    kernel's step holds NaN constants: SGFS's noise scale) and unequal for ``0.0`` and ``-0.0``."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.device == y.device and torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b)
    )


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    return tuple((t.dtype, t.shape, t.stride(), t.device) for t in inputs)


class InductorGraph:
    """A traced graph compiled by TorchInductor for inputs like the example ``inputs``
    (``torch._inductor.compile``: no TorchDynamo frame, hence no guards). Called with inputs of other dtypes,
    shapes, strides or devices, it runs the graph through ``torch.compile(graph, dynamic=False,
    fullgraph=True)`` instead, whose guards specialise it to them.

    :ivar graph: the ``torch.fx.GraphModule`` compiled.
    """

    def __init__(self, graph: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> None:
        self.graph = graph
        self._signature = _signature(inputs)
        with _cacheable():
            self._run = torch._inductor.compile(graph, list(inputs))
        self._other: Callable[..., Sequence[torch.Tensor]] | None = None

    def __call__(self, *inputs: torch.Tensor) -> Sequence[torch.Tensor]:
        if _signature(inputs) == self._signature:
            return self._run(*inputs)
        if self._other is None:
            self._other = torch.compile(self.graph, dynamic=False, fullgraph=True)
        return self._other(*inputs)


def _cacheable() -> Any:
    """The tracing context under which ``torch._inductor.compile`` keys a ``make_fx`` graph in Inductor's FX graph
    cache (on disk, across processes): without a shape environment it bypasses the cache ("No shape env") and
    lowers every graph again in every process. The key holds the graph's code and its tensor constants' values."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv())))


def _inductor(graph: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> InductorGraph:
    """:class:`InductorGraph` ``(graph, inputs)``, or the one compiled before in this process for an identical
    graph (same generated code, equal constants, inputs of the same shapes and dtypes): each new
    ``GraphModule`` would otherwise be looked up in Inductor's FX graph cache again (:func:`_cacheable`; a graph
    new to the cache is lowered, about 0.3-1 s per kernel)."""
    constants = _constants(graph)
    key = (graph.code, _signature(inputs))
    if constants is not None:
        for held, compiled in _memo.get(key, ()):
            if _same(held, constants):
                _memo.move_to_end(key)
                return compiled
    compiled = InductorGraph(graph, inputs)
    if constants is not None:
        variants = _memo.setdefault(key, [])
        variants.append((constants, compiled))
        del variants[:-_MEMO_VARIANTS]
        _memo.move_to_end(key)
        while len(_memo) > _MEMO_CODES:
            _memo.popitem(last=False)
    return compiled


def compile_graph(
    graph: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], compile: bool = True
) -> CompiledFunction:
    """``graph`` (a ``make_fx`` trace) compiled by Inductor (:class:`InductorGraph`; ``compile=False``: run
    as traced) and called twice on the example ``inputs``, which finds the outputs to return as copies.
    Raises what the compiler raises."""
    run = _inductor(graph, inputs) if compile else graph
    return CompiledFunction(run, _shared_outputs(run, inputs), graph)


def trace(
    fn: Callable[..., tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor],
    check: Callable[[CompiledFunction], bool],
    kernel_name: str,
    optimize: bool = True,
) -> CompiledFunction | None:
    """``fn(*inputs)`` (tensors in, a tuple of tensors out) traced and compiled as a
    :class:`CompiledFunction`, or ``None`` (with a ``RuntimeWarning``) if it cannot be traced or
    compiled, or ``check(compiled)`` is false. ``optimize=False`` skips the compiler: the traced
    graph runs as it is (for comparison).

    >>> import warnings
    >>> def value_and_grad(x, data):
    ...     x = x.detach().requires_grad_()
    ...     with torch.enable_grad():
    ...         energy = 0.5 * ((x - data) ** 2).sum()
    ...         (grad,) = torch.autograd.grad(energy, x)
    ...     return energy.detach(), grad
    >>> x, data = torch.zeros(3), torch.tensor([1.0, 2.0, 3.0])
    >>> compiled = trace(value_and_grad, (x, data), lambda c: close(c(x, data)[1], -data), "example")
    >>> compiled(torch.ones(3), data)
    (tensor(2.5000), tensor([ 0., -1., -2.]))
    >>> def branching(x, data):  # Python control flow on a tensor's value: not traceable
    ...     return value_and_grad(x if data.sum() > 0 else -x, data)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     print(trace(branching, (x, data), lambda c: True, "example"))
    None
    >>> print(caught[0].message)  # doctest: +ELLIPSIS
    example: could not trace the potential into a compiled graph (...); running the model eagerly ...
    """
    try:
        compiled = _trace_and_compile(fn, inputs, optimize)
        agrees = check(compiled)
    except Exception as err:  # noqa: BLE001 - any failure to trace or compile means: run eagerly
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        agrees = None
    else:
        reason = "the compiled graph disagrees with the model"
    if agrees:
        return compiled
    warnings.warn(
        f"{kernel_name}: could not trace the potential into a compiled graph ({reason[:300]}); running the "
        "model eagerly instead, which is slower. A model whose Python control flow depends on latent values, "
        "data or minibatch indices cannot be traced. Pass `compile_potential=False` to skip the attempt.",
        RuntimeWarning,
        stacklevel=6,
    )
    return None


def _trace_and_compile(
    fn: Callable[..., tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor], optimize: bool = True
) -> CompiledFunction:
    """``fn`` traced by ``make_fx`` on fake tensors and compiled (:func:`compile_graph`); raises on failure."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)
        return compile_graph(graph, inputs, compile=optimize)


def compile_tensors(
    fn: Callable[..., tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor]
) -> CompiledFunction | None:
    """A kernel's own per-step tensor arithmetic (``fn``: tensors in, a tuple of tensors out, no Python
    control flow on values) as one compiled graph for inputs shaped like ``inputs``, or ``None`` if it cannot
    be compiled (no C++ compiler, say: the caller then runs ``fn`` eagerly). Eager torch runs each
    elementwise operation as its own pass over memory; Inductor fuses them into one loop.

    >>> from ppl_sgmcmc import noise
    >>> def update(previous, variance, count, gradient):
    ...     state, term = noise.update(noise.NoiseState(previous, variance, count), gradient, 1.0, True)
    ...     return (*state, term)
    >>> zeros = torch.zeros(3)  # one tensor for two arguments, as noise.init gives
    >>> compiled = compile_tensors(update, (zeros, zeros, torch.tensor(0, dtype=torch.int32), torch.ones(3)))
    >>> [t.tolist() for t in compiled(torch.ones(3), zeros, torch.tensor(1, dtype=torch.int32), torch.full((3,), 3.0))]
    [[3.0, 3.0, 3.0], [1.0, 1.0, 1.0], 2, [2.0, 2.0, 2.0]]
    """
    # distinct copies: make_fx gives one input to every argument that is the same tensor object
    examples = tuple(t.clone() for t in inputs)
    try:
        return _trace_and_compile(fn, examples)
    except Exception:  # noqa: BLE001 - any failure to trace or compile means: run eagerly
        return None


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two evaluations of the same quantity agree to float32 round-off (NaN agrees with NaN: a noise ratio
    not yet measured)."""
    if a.shape != b.shape:
        return False
    if b.numel() == 0:
        return True
    if b.dtype == torch.bool:
        return a.dtype == torch.bool and torch.equal(a, b)
    scale = float(torch.nan_to_num(b.abs(), nan=0.0, posinf=0.0).max())
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-6 * (1.0 + scale), equal_nan=True))
