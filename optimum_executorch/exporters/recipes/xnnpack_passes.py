"""XNNPACK's lowering without the whole-graph re-traces and code generations that cannot change its result.

Four shortcuts, all active only inside `faster_lowering()` (the XNNPACK recipe's lowering context), all
writing the same program bytes as ExecuTorch's own lowering (tested). A 4-layer SmolLM2-shaped 8da4w
export: 61 s -> 26 s; SmolLM2-135M 8da4w: 462 s -> 220 s (1-3), 193 s -> 158 s (4 and fewer garbage
collections, convert.py).

1. One decomposition instead of two. `to_edge_transform_and_lower` first functionalizes the program
   (`run_decompositions({})`, a full re-trace), then decomposes it with the default table less the ops the
   partitioner keeps (a second full re-trace). ExecuTorch skips the second when no op of the table is left,
   but `sym_size` (in the table, never decomposed) is in every program with a dynamic length, so it always
   runs. The partitioner marks the program (`decompose_at_once`): its functionalization runs the second
   table too (which also functionalizes), and the second call, asked for the same table, returns the
   program as it is. When the partitioner turns out to need its per-node check on the result (ExecuTorch's
   other path), the plain functionalization runs instead and nothing else changes.

2. XNNPACK's per-partition passes without their idle re-traces. `XnnpackBackend.preprocess` runs 17 graph
   passes over every partition before it serializes it. Almost every pass ends by re-tracing the whole
   partition with fake tensors (`ExportPass.call`), whether or not it changed the graph: a 4-layer
   SmolLM2-shaped 8da4w export spent 26 of its 61 s there (23 partitions x 17 passes), while serializing
   the partitions took ~1 s. A re-trace of a graph that no pass touched since the previous re-trace
   returns the same graph, so it is skipped; a pass whose patterns need an op the partition does not
   contain is skipped whole when nothing else is pending. Decisions, from the partition's own graph:
   - `ExportPass.call` (the re-trace, called by a pass at its end) is skipped when the graph's structure
     (every node's name, op, target, arguments) equals the structure the previous re-trace returned,
     unless the pass does its work inside the re-trace (overrides `call_operator` or another hook). A
     partition as the partitioner cut it counts as re-traced: its nodes keep the metadata of the
     program's own last re-trace.
   - Of the passes that work inside the re-trace, two are known to be idle on a given graph:
     `DimOrderOpsRevertPass` without dim-order ops, `ConstPropPass` without a node that has no tensor
     inputs (it folds only nodes whose inputs are all constants; a partition's inputs are placeholders).
   - `ConvertToUpsampleBilinear2d` and `ConvertToSDPAPass` match subgraph patterns; a pattern can only
     match when every op it contains is in the partition.

3. The edge passes without their idle re-traces. Turning the program into the edge dialect re-traces the
   whole program once per pass; four of them change nothing in a transformers decoder and are skipped
   when provably idle and the graph is as the previous re-trace left it: `NormalizeTransposePass` (no
   `aten.t`), `ReplaceBrokenOpsWithFunctionalOpsPass` (no view operator left), `SymToTensorPass` (no
   symbolic value where a Tensor is expected), `RemoveMixedTypeOperators` (the inputs of its binary
   operators already have their promoted dtype). Likewise the bare re-trace that `SpecPropPass` runs in
   `to_executorch` right after another re-trace.

4. One code generation for the cut program instead of one per partition. `to_backend` cuts each partition
   out of the program's graph and then re-sorts the whole graph (torch's `legalize_graph`), which assigns
   the sorted graph to the module and so regenerates the module's Python code, for the whole program, once
   per partition: ~40 s of a SmolLM2-135M 8da4w export (153 partitions of a ~12,000-node graph), against
   1.4 s for the sort itself. Nothing runs that code while the partitions are cut, so the sort is
   kept as it is and the code is generated once, after the last partition.

5. The partitioner's pairwise merge check with set operations (`partition_merge.py`).
"""

import contextlib
import threading
import types
from typing import Any, Optional

from .partition_merge import can_merge_partitions

_state = threading.local()


def _structure(graph_module) -> tuple:
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


def _works_in_retrace(pass_type) -> bool:
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


def _idle_in_retrace(pass_, graph_module) -> bool:
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


def _patterns_absent(pass_type, graph_module) -> bool:
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


def _retrace(original):
    def call(self, graph_module):
        from executorch.exir.pass_base import ExportPass
        from torch.fx.passes.infra.pass_base import PassResult

        if not getattr(_state, "lowering", False):
            return original(self, graph_module)
        last: Optional[tuple] = getattr(_state, "last", None)
        if last is not None:
            if _works_in_retrace(type(self)):
                skip = _idle_in_retrace(self, graph_module)
            else:  # a pass that did its work before calling the re-trace (or none: a bare `ExportPass`, which
                # `SpecPropPass` runs to refresh the metadata) is idle when the graph is unchanged
                skip = getattr(_state, "partition", False) or type(self) is ExportPass
            if skip and _structure(graph_module) == last:
                return PassResult(graph_module, False)
        result = original(self, graph_module)
        _state.last = _structure(result.graph_module)
        return result

    return call


def _record(original):
    """torch's own re-tracing pass base (used by `ReplaceViewOpsWithViewCopyOpsPass`): its output counts as
    the last re-trace too."""

    def call(self, graph_module):
        result = original(self, graph_module)
        if getattr(_state, "lowering", False):
            _state.last = _structure(result.graph_module)
        return result

    return call


def _transform(original):
    def transform(self):
        from executorch.backends.xnnpack._passes import XNNPACKPass
        from executorch.exir.pass_base import ExportPass
        from executorch.exir.program._program import _transform as apply_pass

        if not all(isinstance(p, type) and issubclass(p, ExportPass) for p in self.passes):
            return original(self)
        _state.partition, _state.last = True, _structure(self.exported_program.graph_module)
        try:
            ep = self.exported_program
            for pass_type in self.passes:
                if _patterns_absent(pass_type, ep.graph_module) and _structure(ep.graph_module) == _state.last:
                    continue
                ep = apply_pass(ep, pass_type(ep) if issubclass(pass_type, XNNPACKPass) else pass_type())
            return ep
        finally:
            _state.partition, _state.last = False, None

    transform._optimum_executorch_original = original
    return transform


def _sort_without_codegen(original):
    """torch's `legalize_graph`, leaving the module's code to be generated after the last partition is cut."""

    def legalize_graph(graph_module):
        stale = getattr(_state, "stale", None)
        if stale is None:
            return original(graph_module)
        holder = types.SimpleNamespace(graph=graph_module.graph)  # receives the sorted graph, generates nothing
        original(holder)
        graph_module._graph = holder.graph
        holder.graph.owning_module = graph_module
        stale[id(graph_module)] = graph_module
        return graph_module

    return legalize_graph


def _partitions_cut_then_codegen(original):
    def create_partitions_in_graph_module(graph_module, *args, **kwargs):
        outer = getattr(_state, "stale", None)
        _state.stale = stale = {} if outer is None else outer
        try:
            return original(graph_module, *args, **kwargs)
        finally:
            if outer is None:
                _state.stale = None
                for module in stale.values():
                    module.recompile()

    return create_partitions_in_graph_module


_DECOMPOSITIONS = "_optimum_executorch_decompositions"
_DECOMPOSED = "_optimum_executorch_decomposed"


def decompose_at_once(program, partitioner) -> None:
    """Marks `program` so that its functionalization also runs the decompositions that would follow it when
    `partitioner` turns out to have no per-node check on the result (ExecuTorch's path that skips a
    decomposition with nothing to do); with a check, the plain functionalization is run instead."""
    from executorch.exir.tracer import _default_decomposition_table

    kept_ops, _ = partitioner.ops_to_not_decompose(program)
    table = _default_decomposition_table()
    for op in kept_ops:
        table.pop(op, None)
    setattr(program, _DECOMPOSITIONS, (table, lambda result: partitioner.ops_to_not_decompose(result)[1] is None))


def _decompositions(original):
    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        marked = self.__dict__.pop(_DECOMPOSITIONS, None)
        done = self.__dict__.pop(_DECOMPOSED, None)
        if marked is not None and decomp_table is not None and len(decomp_table) == 0:
            table, without_check = marked
            result = original(self, table, *args, **kwargs)
            if without_check(result):
                setattr(result, _DECOMPOSED, frozenset(table))
                return result
        elif done is not None and decomp_table is not None and set(decomp_table) <= done and not args and not kwargs:
            # Decomposed by this table already: what is left of it (`sym_size`, which ExecuTorch's own "nothing to
            # decompose" test counts) does not decompose, so a second re-trace would return the same program.
            return self
        return original(self, decomp_table, *args, **kwargs)

    return run_decompositions


@contextlib.contextmanager
def faster_lowering():
    """Within this block, the edge lowering decomposes marked programs once, XNNPACK's preprocess skips the
    re-traces and passes that cannot change a partition, and the cut program's code is generated once."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.exir import lowered_backend_module
    from executorch.exir.backend import backend_api
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from executorch.exir.pass_base import ExportPass
    from torch._export.pass_base import _ExportPassBaseDeprecatedDoNotUse as TorchExportPass
    from torch.export import ExportedProgram

    if hasattr(XNNPACKPassManager.transform, "_optimum_executorch_original"):  # already active (nested)
        yield
        return
    originals = (XNNPACKPassManager.transform, ExportPass.call, ExportedProgram.run_decompositions,
                 TorchExportPass.call, lowered_backend_module.legalize_graph,
                 backend_api._create_partitions_in_graph_module, GroupBasedPartitioner._can_merge_partitions)
    XNNPACKPassManager.transform = _transform(originals[0])
    ExportPass.call = _retrace(originals[1])
    ExportedProgram.run_decompositions = _decompositions(originals[2])
    TorchExportPass.call = _record(originals[3])
    lowered_backend_module.legalize_graph = _sort_without_codegen(originals[4])
    backend_api._create_partitions_in_graph_module = _partitions_cut_then_codegen(originals[5])
    GroupBasedPartitioner._can_merge_partitions = can_merge_partitions
    _state.lowering, _state.last, _state.stale = True, None, None
    try:
        yield
    finally:
        (XNNPACKPassManager.transform, ExportPass.call, ExportedProgram.run_decompositions,
         TorchExportPass.call, lowered_backend_module.legalize_graph,
         backend_api._create_partitions_in_graph_module, GroupBasedPartitioner._can_merge_partitions) = originals
        _state.lowering, _state.last, _state.stale = False, None, None
