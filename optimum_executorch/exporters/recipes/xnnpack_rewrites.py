"""Edge-graph rewrites that keep ops inside XNNPACK's delegate: same arithmetic, a form its partitioner takes.

An op the partitioner refuses runs in ExecuTorch's portable kernels and cuts the delegate in two. Kept here are
the rewrites that measured faster (SmolLM2-135M 8da4w, one decode step of the lowered method, alternating runs):

- RoPE's `rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`: XNNPACK slices only tensors of static shape, so the
  four slices a layer (queries and keys) ran outside it. It is a product with a constant [D, D] matrix of 0 and
  +-1 (exact: one nonzero term a sum), which XNNPACK runs as one linear in place of the slices, `neg` and `cat`.
- reshapes whose result has one symbolic size (the sequence length): refused when the shape holds the symbol, or
  a symbol and a -1 (transformers' `view(*input_shape, -1, head_dim)`); taken with the symbol written as -1.
Together: 153 -> 94 delegate calls a step, decode 5.62 -> 5.36 ms (median of nine runs each), export 179 ->
144 s (fewer, larger partitions to lower).

Tried and not kept: RMSNorm's `mean(-1)` viewed as the 4-D mean XNNPACK takes, and `unsqueeze` off the last
dimension as a reshape. Both moved every remaining op into one delegate a layer (33 calls a step) and made the
step slower (5.6-6.0 ms): on a decode step's tiny tensors a portable kernel costs less than one more XNNPACK
op handed to its thread pool, and a delegate boundary costs little.
"""

import torch
from executorch.backends.transforms.utils import create_constant_placeholder
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportedProgramPassBase, ExportedProgramPassResult
from torch.export.graph_signature import InputKind
from torch.fx.passes.infra.pass_base import PassResult

# Imported only by `XnnpackRecipe.edge_passes()`, on the export side.
_edge = exir_ops.edge.aten


def xnnpack_rewrites():
    """The rewrite passes, in the order `to_edge_transform_and_lower(transform_passes=...)` runs them."""
    return [_infer_the_symbolic_dim_of_reshapes, _RotateHalfAsLinear()]


def _with_inferred_size(shape):
    """`shape` with its one symbolic size written as -1; None when more than one size is symbolic."""
    symbolic = [i for i, size in enumerate(shape) if not isinstance(size, int)]
    # With a static size of 0 the element count no longer determines the symbol.
    if len(symbolic) > 1 or (symbolic and any(isinstance(size, int) and size == 0 for size in shape)):
        return None
    shape = list(shape)
    if symbolic:
        shape[symbolic[0]] = -1
    return shape


def _infer_the_symbolic_dim_of_reshapes(graph_module):
    """Writes a reshape (`view_copy`) whose result has one symbolic size as its result's shape with that size -1.

    XNNPACK reshapes with one inferred size, but its partitioner refuses a shape that holds a symbol (the
    sequence length of a program with dynamic shapes) or two inferred sizes (transformers' `view(*input_shape,
    -1, head_dim)` is both), so such reshapes ran outside the delegate and split it. The result's static sizes
    are known, and the element count determines the one symbolic size."""
    view = torch.ops.aten.view_copy.default
    changed = False
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "_op", node.target) is not view:
            continue
        value = node.meta.get("val")
        if len(node.args) < 2 or not isinstance(node.args[1], (list, tuple)) or value is None:
            continue
        shape = _with_inferred_size(value.shape)
        if shape is not None and -1 in shape and list(node.args[1]) != shape:
            node.args = (node.args[0], shape) + tuple(node.args[2:])
            changed = True
    if changed:
        graph_module.recompile()
    return PassResult(graph_module, changed)


def _span(node, rank, size):
    """(dim, start, end) of a `slice_copy` of unit step with static bounds (end clipped to `size`), else None."""
    dim, start, end, step = (list(node.args[1:]) + [None] * 4)[:4]
    dim, start, step = dim or 0, start or 0, 1 if step is None else step
    end = size if end is None else end
    if not all(isinstance(v, int) for v in (dim, start, end, step)) or step != 1:
        return None
    return dim % rank, start, min(end, size)


def _halves(node):
    """(x, D) when `node` is `cat([-x[..., D/2:], x[..., :D/2]], -1)` with a static even D, else None."""
    if node.op != "call_function" or node.target != _edge.cat.default or len(node.args[0]) != 2:
        return None
    negated, first = node.args[0]
    if getattr(negated, "target", None) != _edge.neg.default:
        return None
    second = negated.args[0]
    if any(getattr(n, "target", None) != _edge.slice_copy.Tensor for n in (first, second)):
        return None
    x = first.args[0]
    if second.args[0] is not x or "val" not in x.meta:
        return None
    rank, size = x.meta["val"].dim(), x.meta["val"].shape[-1]
    if not isinstance(size, int) or size % 2:
        return None
    last = rank - 1
    dim = node.args[1] if len(node.args) > 1 else 0
    if dim % rank != last or _span(first, rank, size) != (last, 0, size // 2):
        return None
    if _span(second, rank, size) != (last, size // 2, size):
        return None
    return x, size


class _RotateHalfAsLinear(ExportedProgramPassBase):
    """Each rotate-half becomes `linear(x, R)` with its own constant R (an `ExportedProgram` pass: it adds inputs)."""

    def call(self, exported_program):
        graph = exported_program.graph_module.graph
        matches = [(node, found) for node in graph.nodes if (found := _halves(node)) is not None]
        first_input = next(n for n in graph.nodes if n.op == "placeholder")
        for node, (x, size) in matches:
            half = size // 2
            rotation = torch.zeros(size, size, dtype=x.meta["val"].dtype)
            rotation[torch.arange(half), torch.arange(half) + half] = -1
            rotation[torch.arange(half) + half, torch.arange(half)] = 1
            # One constant per use: XNNPACK's partitioner puts the users of one weight in one partition, which
            # across layers can depend on itself through the attention ops between them.
            with graph.inserting_before(first_input):
                weight = create_constant_placeholder(
                    exported_program, graph, f"_rotate_half_{node.name}", InputKind.PARAMETER, rotation
                )
            with graph.inserting_before(node):
                linear = graph.call_function(_edge.linear.default, (x, weight))
            linear.meta = dict(node.meta)
            negated, first = node.args[0]
            node.replace_all_uses_with(linear)
            for dead in (node, negated, negated.args[0], first):
                if not dead.users:
                    graph.erase_node(dead)
        return ExportedProgramPassResult(exported_program, bool(matches))
