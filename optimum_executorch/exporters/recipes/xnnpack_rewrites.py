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
- RMSNorm's `mean(x, -1, keepdim=True)`: XNNPACK does not take it, so it ran as a portable kernel between two
  delegates, twice a layer (3.4 ms of a 128-token prefill). It is `linear(x, [1/D] * D)`.
- transposes of heads and back: transformers moves q, k, v to [batch, heads, seq, head_dim] for RoPE, and the
  cache / attention ops take [batch, seq, heads, head_dim]: six transposes a layer. RoPE (mul, add, the
  rotate-half linear) runs in either layout, so the transposes are pulled back to their sources.
The last two (SmolLM2-135M 8da4w, ten alternating runs of the lowered method): delegates 94 -> 34 a step, decode
step median 6.20 -> 5.89 ms, 128-token prefill 98 -> 93.5 ms, lowering 102 -> 87 s. Rewrites measured and not
kept are in docs/decisions.md.
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
    return [_infer_the_symbolic_dim_of_reshapes, _RotateHalfAsLinear(), _MeanOfLastDimAsLinear(), _sink_head_transposes]


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


def _linear_in_place_of(exported_program, first_input, node, x, weight, name):
    """`linear(x, weight)` inserted before `node`, with `node`'s metadata; `weight` becomes a constant input of
    its own, placed before `first_input`. One constant per use: XNNPACK's partitioner puts the users of one weight
    in one partition, which across layers can depend on itself through the attention ops between them."""
    graph = exported_program.graph_module.graph
    with graph.inserting_before(first_input):
        constant = create_constant_placeholder(exported_program, graph, name, InputKind.PARAMETER, weight)
    with graph.inserting_before(node):
        linear = graph.call_function(_edge.linear.default, (x, constant))
    linear.meta = dict(node.meta)
    return linear


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
            linear = _linear_in_place_of(exported_program, first_input, node, x, rotation, f"_rotate_half_{node.name}")
            negated, first = node.args[0]
            node.replace_all_uses_with(linear)
            for dead in (node, negated, negated.args[0], first):
                if not dead.users:
                    graph.erase_node(dead)
        return ExportedProgramPassResult(exported_program, bool(matches))


def _last_dim_mean(node):
    """(x, D) when `node` is `mean(x, [-1], keepdim=True)` over a static last dim D of a float tensor, else None."""
    if node.op != "call_function" or node.target != _edge.mean.dim or len(node.args) < 3 or not node.args[2]:
        return None
    x, dims = node.args[0], node.args[1]
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if value is None or not value.dtype.is_floating_point or node.kwargs.get("dtype") is not None:
        return None
    if list(dims) not in ([-1], [value.dim() - 1]) or not isinstance(value.shape[-1], int):
        return None
    return x, value.shape[-1]


class _MeanOfLastDimAsLinear(ExportedProgramPassBase):
    """Each `mean(x, -1, keepdim=True)` (RMSNorm's) becomes `linear(x, w)` with a constant w = [1/D] * D."""

    def call(self, exported_program):
        graph = exported_program.graph_module.graph
        matches = [(node, found) for node in graph.nodes if (found := _last_dim_mean(node)) is not None]
        first_input = next(n for n in graph.nodes if n.op == "placeholder")
        for node, (x, size) in matches:
            weight = torch.full((1, size), 1.0 / size, dtype=x.meta["val"].dtype)
            linear = _linear_in_place_of(exported_program, first_input, node, x, weight, f"_mean_{node.name}")
            node.replace_all_uses_with(linear)
            graph.erase_node(node)
        return ExportedProgramPassResult(exported_program, bool(matches))


def _permutation(node):
    """The dims of a `permute_copy` node with static dims, else None."""
    if node.op != "call_function" or node.target != _edge.permute_copy.default:
        return None
    dims = node.args[1]
    rank = len(dims)
    return [d % rank for d in dims] if all(isinstance(d, int) for d in dims) else None


def _moved_unsqueeze(node, dims):
    """`(tensor, dim)` such that `unsqueeze(tensor, dim)` is `permute(node, dims)`: `node` is an unsqueeze whose
    other sizes keep their order under `dims`; else None."""
    if node.op != "call_function" or node.target != _edge.unsqueeze_copy.default:
        return None
    if "val" not in node.meta or node.meta["val"].dim() != len(dims):  # a lower rank broadcasts from the right
        return None
    inserted = node.args[1] % len(dims)
    others = [d for d in dims if d != inserted]
    return (node.args[0], dims.index(inserted)) if others == sorted(others) else None


def _commuting_region(root, dims):
    """The nodes from which `permute(root, dims)` can be pulled back to its sources: elementwise `mul` / `add`
    and last-dimension `linear`s, fed by permutes that `dims` undoes, unsqueezes it moves, constants and
    scalars. Returns (region, sources, unsqueezes) or None. Every region node is used only inside it (the root:
    only by the permute)."""
    inverse = [dims.index(i) for i in range(len(dims))]
    region, sources, unsqueezes, stack = [], set(), set(), [root]
    while stack:
        node = stack.pop()
        if node in region or node in sources:
            continue
        if _permutation(node) == inverse:
            sources.add(node)
            continue
        if node.op != "call_function" or node.target not in (_edge.mul.Tensor, _edge.add.Tensor, _edge.linear.default):
            return None
        if node.target == _edge.linear.default and dims[-1] != len(dims) - 1:
            return None
        operands = node.args[:1] if node.target == _edge.linear.default else node.args[:2]
        region.append(node)
        for operand in operands:
            if not isinstance(operand, torch.fx.Node):
                continue
            if _moved_unsqueeze(operand, dims) is not None and _permutation(operand) is None:
                unsqueezes.add(operand)
            else:
                stack.append(operand)
    inside = set(region)
    if any(user not in inside for node in region if node is not root for user in node.users):
        return None
    return region, sources, unsqueezes


def _sink_head_transposes(graph_module):
    """Removes `permute(f(permute(x, p)), p^-1)` pairs: f made of elementwise ops and last-dimension linears
    (RoPE on heads) runs on x in its own layout, and a permute of a permute that undoes it is x.

    transformers moves queries, keys and values to [batch, heads, seq, head_dim] for RoPE; ExecuTorch's cache
    and attention ops take [batch, seq, heads, head_dim], so each layer transposed q, k and v there and back
    (six transposes a layer). RoPE's cos / sin operands (`unsqueeze(cos, 1)`) become `unsqueeze(cos, 2)`."""
    graph = graph_module.graph
    changed, made = False, {}  # an unsqueeze -> its moved copy, shared by the regions that read it (q and k)
    for node in list(graph.nodes):
        dims = _permutation(node)
        if dims is None or not isinstance(node.args[0], torch.fx.Node) or len(node.args[0].users) != 1:
            continue
        found = _commuting_region(node.args[0], dims)
        if found is None:
            continue
        region, sources, unsqueezes = found
        moved = {}
        for unsqueezed in unsqueezes:
            key = (unsqueezed, tuple(dims))
            if key not in made:
                with graph.inserting_after(unsqueezed):
                    made[key] = graph.call_function(_edge.unsqueeze_copy.default, _moved_unsqueeze(unsqueezed, dims))
                made[key].meta = dict(unsqueezed.meta, val=unsqueezed.meta["val"].permute(dims).contiguous())
            moved[unsqueezed] = made[key]
        replace = {source: source.args[0] for source in sources}
        replace.update(moved)
        for inner in region:
            inner.args = tuple(replace.get(a, a) if isinstance(a, torch.fx.Node) else a for a in inner.args)
            inner.meta["val"] = inner.meta["val"].permute(dims).contiguous()
        root = node.args[0]
        node.replace_all_uses_with(replace.get(root, root))
        graph.erase_node(node)
        for dead in list(sources) + list(unsqueezes):
            if not dead.users:
                graph.erase_node(dead)
        changed = True
    if changed:
        graph_module.recompile()
    return PassResult(graph_module, changed)
