"""Which of ExecuTorch's graph passes provably have nothing to change on a graph (for `faster_lowering()`).

A re-trace (`ExportPass.call`) reads each node's name, kind, target and arguments; `structure` is that, so two
graphs with the same structure re-trace to the same graph. The other functions decide, from a graph alone,
that a pass working inside the re-trace (or matching subgraph patterns) would leave it as it is.
"""

from typing import Any

def structure(graph_module) -> tuple:
    """What a re-trace reads of a graph: each node's name, kind, target and arguments (nodes by name)."""
    import torch

    def arg(value: Any) -> Any:
        return torch.fx.node.map_arg(value, lambda node: ("%", node.name))

    return tuple(
        (node.name, node.op, str(node.target), repr(arg(node.args)), repr(arg(node.kwargs)))
        for node in graph_module.graph.nodes
    )


def _call_targets(graph_module) -> set:
    return {node.target for node in _operator_nodes(graph_module)}


def works_in_retrace(pass_type) -> bool:
    """Whether a pass changes the graph while it is re-traced (an interpreter hook of its own)."""
    from executorch.exir.pass_base import ExportPass

    hooks = ("call_operator", "call_sym", "call_cond", "call_map", "call_delegate", "call_getitem",
             "call_submodule", "placeholder", "output", "run_node", "call_function", "call_scalar")
    return any(getattr(pass_type, hook, None) is not getattr(ExportPass, hook, None) for hook in hooks)


def _operator_nodes(graph_module):
    return [node for node in graph_module.graph.nodes if node.op == "call_function"]


def _schema_values(node):
    """(schema argument, value) for each argument a node passes to its operator."""
    arguments = node.target._schema.arguments
    pairs = list(zip(arguments, node.args))
    by_name = {argument.name: argument for argument in arguments}
    return pairs + [(by_name[name], value) for name, value in node.kwargs.items() if name in by_name]


def _no_const_sources(graph_module) -> bool:
    # ConstPropPass folds a node only when every input is constant; the first such node has no node inputs.
    import torch

    return all(node.all_input_nodes for node in _operator_nodes(graph_module)) and not any(
        isinstance(getattr(graph_module, str(node.target), None), torch.Tensor)
        for node in graph_module.graph.nodes if node.op == "get_attr"
    )


def _aten_targets_only(graph_module) -> bool:
    """Whether every node reaches a pass's `call_operator` as an ATen operator, or not at all (symbolic
    arithmetic; higher-order operators that a re-trace copies blindly, e.g. `auto_functionalized_v2`)."""
    import torch

    higher = torch.ops.higher_order
    with_subgraphs = (higher.cond, higher.while_loop, higher.map_impl, higher.scan)
    return all(
        isinstance(node.target, torch._ops.OpOverload)
        or getattr(node.target, "__module__", None) in ("_operator", "builtins", "math")
        or (isinstance(node.target, torch._ops.HigherOrderOperator) and node.target not in with_subgraphs)
        for node in _operator_nodes(graph_module)
    )


def _no_views(graph_module) -> bool:
    # ReplaceBrokenOpsWithFunctionalOpsPass replaces every view operator by its copy.
    import torch

    return _aten_targets_only(graph_module) and not any(
        isinstance(node.target, torch._ops.OpOverload) and node.target.is_view for node in _operator_nodes(graph_module)
    )


def _no_symbols_as_tensors(graph_module) -> bool:
    # SymToTensorPass wraps a SymInt / SymFloat / SymBool passed where the schema wants a Tensor.
    import torch

    return _aten_targets_only(graph_module) and not any(
        isinstance(argument.type, torch.TensorType)
        and isinstance(value, torch.fx.Node)
        and not isinstance(value.meta.get("val"), torch.Tensor)
        for node in _operator_nodes(graph_module)
        if isinstance(node.target, torch._ops.OpOverload)
        for argument, value in _schema_values(node)
    )


def _no_mixed_types(graph_module) -> bool:
    # RemoveMixedTypeOperators casts the inputs of these binary operators to their promoted dtype.
    import torch
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    aten = torch.ops.aten
    default, int_to_float = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT, ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
    kinds = {aten.add.Tensor: default, aten.mul.Tensor: default, aten.sub.Tensor: default,
             aten.div.Tensor: int_to_float, aten.div.Tensor_mode: default, aten.minimum.default: default}
    if not _aten_targets_only(graph_module):
        return False
    for node in _operator_nodes(graph_module):
        if node.target not in kinds or len(node.args) <= 1:
            continue
        kind = kinds[node.target]
        if node.target == aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            kind = int_to_float
        values = [value.meta.get("val") if isinstance(value, torch.fx.Node) else value for value in node.args]
        if not all(isinstance(value, torch.Tensor) for value in values) or any(
            isinstance(value, torch.fx.Node) for value in node.kwargs.values()
        ):
            return False
        promoted = elementwise_dtypes(*values, type_promotion_kind=kind)[1]
        if any(value.dtype != promoted for value in values):
            return False
    return True


def idle_in_retrace(pass_, graph_module) -> bool:
    """For a pass that works inside the re-trace: True when it has provably nothing to change here."""
    import torch
    from executorch.exir.passes.const_prop_pass import ConstPropPass
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass, MemoryFormatOpsMap
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    idle = {
        DimOrderOpsRevertPass: lambda gm: not (_call_targets(gm) & set(MemoryFormatOpsMap)),
        ConstPropPass: _no_const_sources,
        NormalizeTransposePass: lambda gm: _aten_targets_only(gm) and torch.ops.aten.t.default not in _call_targets(gm),
        ReplaceBrokenOpsWithFunctionalOpsPass: _no_views,
        SymToTensorPass: _no_symbols_as_tensors,
        RemoveMixedTypeOperators: _no_mixed_types,
    }.get(type(pass_))
    return idle is not None and idle(graph_module)


def patterns_absent(pass_type, graph_module) -> bool:
    """For the pattern-matching passes: True when no pattern can match (an op of each is missing)."""
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
    from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import ConvertToUpsampleBilinear2d
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    if pass_type is ConvertToUpsampleBilinear2d:
        patterns = list(bilinear_2d.get_graphs_dict())
    elif pass_type is ConvertToSDPAPass:
        patterns = list(sdpa.get_graphs())
    else:
        return False
    present = _call_targets(graph_module)
    return all(not _call_targets(pattern) <= present for pattern in patterns)
