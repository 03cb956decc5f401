"""Trace a potential's value and gradient once into a graph of tensor operations, replayed each step.

Running a Pyro model costs far more Python than its arithmetic: distribution objects, the handler
stack, broadcasting checks, and an autograd graph built and walked every step. On a small logistic
regression that overhead is about half of a step. :func:`trace` records, once, the ATen operations
that one evaluation of ``(Ũ_t, ∇Ũ_t)`` performs, forward and backward, as a
:class:`torch.fx.GraphModule` (``torch.fx.experimental.proxy_tensor.make_fx``; no TorchScript,
no compiler): later steps call that graph on new parameters, minibatch indices and data.

The trace uses fake tensors (shapes only), so a model whose Python control flow depends on the
*values* of latents or indices cannot be traced: it raises, and the kernel falls back to running
the model eagerly, with a warning. Shapes are fixed by the trace; model arguments that are
tensors are inputs of the graph, other arguments are baked in. The graph is checked against the
eager model at two points before it is used.

Before use the graph is simplified (:func:`simplify`): operations on constants only (the prior's
parameters, ``ones_like`` seeds of the backward pass, ...) are computed once, and no-ops (``detach``,
``x * 1``, views to the same shape) are removed. On a small model that halves the operations per step.
``make_fx`` graphs are not functional: a batched backward (``is_grads_batched``) writes its result into
``zeros`` buffers in place (``copy_`` into a ``slice``/``select`` view). Tensors written in place, and
every view of them, are neither folded nor bypassed, so each call starts from fresh buffers.
"""

import warnings

import pyro
import torch
from torch.fx.node import map_arg

__all__ = ["close", "simplify", "trace"]

aten = torch.ops.aten
_ALIASES = {aten.detach.default, aten.alias.default}
_RESHAPES = {
    aten.view.default,
    aten.expand.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.squeeze.dim,
    aten.unsqueeze.default,
}
_LIKE = {
    aten.ones_like.default,
    aten.zeros_like.default,
    aten.full_like.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
}
_TIMES_ONE = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.pow.Tensor_Scalar}
_PLUS_ZERO = {aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar}
_MAX_FOLDED_NUMEL = 2**22


class CompiledFunction:
    """A traced graph, called without building an autograd graph (it contains its own backward)."""

    def __init__(self, graph):
        self.graph = graph

    def __call__(self, *inputs):
        with torch.no_grad():
            return self.graph(*inputs)


def trace(fn, inputs, check, kernel_name, optimize=True):
    """``fn(*inputs)`` (tensors in, a tuple of tensors out) as a :class:`CompiledFunction`, or ``None``
    (with a warning) if it cannot be traced or ``check(compiled)`` is false. ``optimize=False`` skips
    :func:`simplify` (for comparison)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        with pyro.validation_enabled(False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)
            graph = simplify(graph) if optimize else graph
        compiled = CompiledFunction(graph)
        agrees = check(compiled)
    except Exception as err:  # noqa: BLE001 - any failure to trace means: run eagerly
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        agrees = None
    else:
        reason = "the traced graph disagrees with the model"
    if agrees:
        return compiled
    warnings.warn(
        f"{kernel_name}: could not trace the potential into a graph ({reason[:300]}); running the model eagerly "
        "instead, which is slower. A model whose Python control flow depends on latent values or minibatch "
        "indices cannot be traced. Pass `compile_potential=False` to skip the attempt.",
        RuntimeWarning,
        stacklevel=6,
    )
    return None


def close(a, b):
    """Whether two evaluations of the same quantity agree to float32 round-off."""
    if a.shape != b.shape:
        return False
    if b.numel() == 0:
        return True
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-6 * (1.0 + float(b.abs().max()))))


def _meta(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _same(a, b):
    a, b = _meta(a), _meta(b)
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype


def _is_noop(node, constants):
    """The node's input if the node returns it unchanged: ``detach``/``alias``, a reshape, slice or
    ``slice_backward`` to the same shape, ``x * 1``, ``x / 1``, ``x ** 1``, ``x ± 0`` (0 and 1 as Python
    numbers or constant tensors)."""
    target, args = node.target, node.args
    src = args[0] if args and isinstance(args[0], torch.fx.Node) else None
    if src is None:
        return None
    if target in _ALIASES:
        return src
    if not _same(node, src):
        if (
            target in (aten.add.Tensor, aten.mul.Tensor)
            and len(args) == 2
            and not node.kwargs  # add(0, x, alpha=a) is a * x
            and isinstance(args[1], torch.fx.Node)
        ):
            if _same(node, args[1]) and _is_constant(args[0], constants, 0 if target is aten.add.Tensor else 1):
                return args[1]
        return None
    if target in _RESHAPES or target in (aten.slice.Tensor, aten.slice_backward.default):
        return src
    if len(args) == 2 and not node.kwargs:
        one, zero = _is_constant(args[1], constants, 1), _is_constant(args[1], constants, 0)
        if (target in _TIMES_ONE and one) or (target in _PLUS_ZERO and zero):
            return src
    return None


def _is_constant(arg, constants, value):
    """Whether ``arg`` is the number ``value``, or a folded constant tensor all equal to it."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return arg == value
    tensor = constants.get(arg) if isinstance(arg, torch.fx.Node) else None
    return tensor is not None and tensor.numel() <= 2**16 and bool((tensor == value).all())


def _schema_args(node):
    """``(schema argument, value)`` of an ``OpOverload`` node's arguments, positional and keyword."""
    schema = node.target._schema
    pairs = list(zip(schema.arguments, node.args))
    by_name = {a.name: a for a in schema.arguments}
    pairs += [(by_name[k], v) for k, v in node.kwargs.items() if k in by_name]
    return pairs


def _written(graph):
    """The nodes whose tensor is written in place somewhere in ``graph``, or shares memory with one that
    is: the in-place operations' mutated arguments, closed under aliasing (views, ``detach``, reshapes,
    ``getitem``, in-place results, in both directions: a write into a view writes into its base)."""
    parent = {}

    def find(n):
        while parent.get(n, n) is not n:
            n = parent[n]
        return n

    def union(a, b):
        parent[find(a)] = find(b)

    writes = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            for n in node.all_input_nodes:  # operator.getitem of a multi-output view, ...: assume aliasing
                union(node, n)
            continue
        for arg, value in _schema_args(node):
            values = value if isinstance(value, (list, tuple)) else [value]
            nodes = [v for v in values if isinstance(v, torch.fx.Node)]
            info = arg.alias_info
            if info is not None or (node.target in _RESHAPES and arg.name == "self"):
                for n in nodes:
                    union(node, n)
            if info is not None and info.is_write:
                writes.extend(nodes)
    if not writes:
        return set()
    roots = {find(n) for n in writes}
    return {n for n in graph.nodes if find(n) in roots}


def _mutates(node):
    return node.target._schema.is_mutable


def simplify(gm):
    """Fold constant sub-expressions of an ATen graph into attributes and drop no-ops (in place).

    Random operations are never folded; ``ones_like``/``zeros_like``/``full_like`` fold whenever their
    input's shape is known (they do not read its values). ``make_fx`` output may write in place (the
    batched backward of :func:`torch.autograd.grad` with ``is_grads_batched`` fills ``zeros`` through
    ``copy_`` into views): in-place operations, the tensors they write and all their aliases are never
    folded (a folded buffer would be written, and read before the write at fold time) nor bypassed as
    no-ops (``x + 0`` of a buffer filled later would read it unfilled; bypassing ``y = x * 1`` with ``y``
    written would write ``x``). Outputs that end up constants or inputs are returned as copies.
    """
    graph = gm.graph
    written = _written(graph)
    constants = {}
    for node in list(graph.nodes):
        if node.op == "get_attr":
            if node not in written:
                constants[node] = getattr(gm, node.target)
            continue
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        target = node.target
        if torch.Tag.nondeterministic_seeded in target.tags or _mutates(node) or node in written:
            continue
        source = _is_noop(node, constants)
        if source is not None and any(n in written for n in node.all_input_nodes):
            source = None
        if source is not None:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            continue
        inputs = node.all_input_nodes
        if target in _LIKE and inputs and isinstance(_meta(inputs[0]), torch.Tensor):
            shape_only = inputs[0]
        else:
            shape_only = None
        if not all(n in constants or n is shape_only for n in inputs):
            continue

        def real(n, shape_only=shape_only):
            if n is shape_only:
                return torch.empty(_meta(n).shape, dtype=_meta(n).dtype, device=_meta(n).device)
            return constants[n]

        out = _meta(node)
        if isinstance(out, torch.Tensor) and out.numel() > _MAX_FOLDED_NUMEL:
            continue
        value = target(*map_arg(node.args, real), **map_arg(node.kwargs, real))
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_folded_{len(constants)}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value, persistent=False)
        with graph.inserting_before(node):
            folded = graph.get_attr(name)
        folded.meta = dict(node.meta)
        node.replace_all_uses_with(folded)
        graph.erase_node(node)
        constants[folded] = value
    _copy_shared_outputs(graph)
    graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _copy_shared_outputs(graph):
    """Return a ``clone`` of each output that is a folded constant or a graph input, so that a caller
    writing into an output does not change the graph's constants or its own inputs."""
    (output,) = [n for n in graph.nodes if n.op == "output"]

    def copy(n):
        if n.op not in ("get_attr", "placeholder") or not isinstance(_meta(n), torch.Tensor):
            return n
        with graph.inserting_before(output):
            cloned = graph.call_function(aten.clone.default, (n,))
        cloned.meta = dict(n.meta)
        return cloned

    output.args = map_arg(output.args, copy)
