"""XNNPACK's lowering without the whole-graph re-traces, checks and code generations that cannot change its result.

Shortcuts, all active only inside `faster_lowering()` (the XNNPACK recipe's lowering context), all
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

6. A partition checked once. ExecuTorch's `_transform` checks the program (code generation, lint, verifier)
   before and after each XNNPACK pass; here each partition is checked once, after its last pass (a 2-layer
   tiny llama 8da4w: 356 -> 14 checks; SmolLM2-135M: ~8 s of a 126 s lowering under a sampling profiler).

7. Edge operators and dim orders in one re-trace (`_edge_ops_in_one_retrace`): the whole-program
   `OpReplacePass` and `MemoryFormatOpsPass` rewrite one operator at a time, so one re-trace through both.

Which passes are idle on a graph is decided in `idle_passes.py`.
"""

import contextlib
import threading
import types
from typing import Optional

from .idle_passes import idle_in_retrace, patterns_absent, structure, works_in_retrace
from .partition_merge import can_merge_partitions

_state = threading.local()


def _retrace(original):
    def call(self, graph_module):
        from executorch.exir.pass_base import ExportPass
        from torch.fx.passes.infra.pass_base import PassResult

        if not getattr(_state, "lowering", False):
            return original(self, graph_module)
        last: Optional[tuple] = getattr(_state, "last", None)
        if last is not None:
            if works_in_retrace(type(self)):
                skip = idle_in_retrace(self, graph_module)
            else:  # a pass that did its work before calling the re-trace (or none: a bare `ExportPass`, which
                # `SpecPropPass` runs to refresh the metadata) is idle when the graph is unchanged
                skip = getattr(_state, "partition", False) or type(self) is ExportPass
            if skip and structure(graph_module) == last:
                return PassResult(graph_module, False)
        result = original(self, graph_module)
        _state.last = structure(result.graph_module)
        return result

    return call


def _record(original):
    """torch's own re-tracing pass base (used by `ReplaceViewOpsWithViewCopyOpsPass`): its output counts as
    the last re-trace too."""

    def call(self, graph_module):
        result = original(self, graph_module)
        if getattr(_state, "lowering", False):
            _state.last = structure(result.graph_module)
        return result

    return call


def _transform(original):
    def transform(self):
        from executorch.backends.xnnpack._passes import XNNPACKPass
        from executorch.exir.pass_base import ExportPass
        from executorch.exir.pass_manager import ExportedProgramPassManager
        from executorch.exir.program._program import _transform_with_pass_manager

        if not all(isinstance(p, type) and issubclass(p, ExportPass) for p in self.passes):
            return original(self)
        _state.partition, _state.last = True, structure(self.exported_program.graph_module)
        try:
            ep = self.exported_program
            for pass_type in self.passes:
                if patterns_absent(pass_type, ep.graph_module) and structure(ep.graph_module) == _state.last:
                    continue
                # ExecuTorch's `_transform` checks the program (code generation, lint, verifier) before and after
                # each pass; the partition is checked once, after its last pass.
                pass_ = pass_type(ep) if issubclass(pass_type, XNNPACKPass) else pass_type()
                manager = ExportedProgramPassManager([pass_])
                manager.check = lambda program: None
                ep = _transform_with_pass_manager(ep, manager)
            ExportedProgramPassManager().check(ep)
            return ep
        finally:
            _state.partition, _state.last = False, None

    transform._optimum_executorch_original = original
    return transform


def _edge_ops_in_one_retrace(op_replace, memory_format):
    """Stand-ins for `OpReplacePass` (ATen operators to edge operators) and `MemoryFormatOpsPass` (memory formats
    to dim orders), which `_generate_edge_program` lists back to back, each a re-trace of the whole program.

    Both rewrite one operator at a time in `call_operator` and override nothing else, so one re-trace through
    both hooks in turn (ATen to edge, then the dim order of that edge operator) rewrites each node as the two
    re-traces did. The first stand-in, when the second is created before it runs (as in that list), runs both;
    the second then returns the graph the first made. Otherwise (`_to_edge` calls each as soon as it is
    made), each runs alone.
    """
    from torch.fx.passes.infra.pass_base import PassResult

    both = type("OpReplaceAndMemoryFormatOpsPass", (op_replace, memory_format), {})

    class EdgeOps(op_replace):
        def __init__(self):
            super().__init__()
            self.with_dim_orders, self.made = False, None  # not `output`: an ExportPass hook
            _state.edge_ops = self

        def call(self, graph_module):
            _state.edge_ops = None
            result = both().call(graph_module) if self.with_dim_orders else super().call(graph_module)
            self.made = result.graph_module
            return result

    class DimOrders(memory_format):
        def __init__(self):
            super().__init__()
            self.done_by, _state.edge_ops = getattr(_state, "edge_ops", None), None
            if self.done_by is not None:
                self.done_by.with_dim_orders = True

        def call(self, graph_module):
            if self.done_by is not None and self.done_by.made is graph_module:
                return PassResult(graph_module, True)
            return super().call(graph_module)

    return EdgeOps, DimOrders


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


def _copy_sharing_weights(cls, program, compile_specs):
    """The copy of a partition's program that ExecuTorch hands to XNNPACK's preprocess, sharing its weight tensors.

    ExecuTorch deep-copies every partition's program before the first preprocess and keeps the copies until the
    last: a clone of every delegated weight held beside the originals and the packed bytes (Llama-3.2-1B 8da4w:
    ~1.3 GB of the lowering's peak). XNNPACK's preprocess replaces constants, never writes into them, so sharing
    the tensors gives the same bytes; ExecuTorch's CUDA backend copies the same way."""
    import copy

    import torch

    tensors = {id(t): t for values in (program.state_dict, program.constants) for t in values.values()
               if isinstance(t, torch.Tensor)}  # fmt: skip
    return copy.deepcopy(program, tensors)


@contextlib.contextmanager
def faster_lowering():
    """Within this block, the edge lowering decomposes marked programs once, XNNPACK's preprocess skips the
    re-traces and passes that cannot change a partition, and the cut program's code is generated once; the copies
    of the partitions XNNPACK preprocesses share their weights (`_copy_sharing_weights`)."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir import lowered_backend_module
    from executorch.exir.backend import backend_api
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.program import _program
    from torch._export.pass_base import _ExportPassBaseDeprecatedDoNotUse as TorchExportPass
    from torch.export import ExportedProgram

    if hasattr(XNNPACKPassManager.transform, "_optimum_executorch_original"):  # already active (nested)
        yield
        return
    originals = (XNNPACKPassManager.transform, ExportPass.call, ExportedProgram.run_decompositions,
                 TorchExportPass.call, lowered_backend_module.legalize_graph,
                 backend_api._create_partitions_in_graph_module, GroupBasedPartitioner._can_merge_partitions,
                 _program.OpReplacePass, _program.MemoryFormatOpsPass)
    XNNPACKPassManager.transform = _transform(originals[0])
    ExportPass.call = _retrace(originals[1])
    ExportedProgram.run_decompositions = _decompositions(originals[2])
    TorchExportPass.call = _record(originals[3])
    lowered_backend_module.legalize_graph = _sort_without_codegen(originals[4])
    backend_api._create_partitions_in_graph_module = _partitions_cut_then_codegen(originals[5])
    GroupBasedPartitioner._can_merge_partitions = can_merge_partitions
    _program.OpReplacePass, _program.MemoryFormatOpsPass = _edge_ops_in_one_retrace(*originals[7:])
    _state.lowering, _state.last, _state.stale, _state.edge_ops = True, None, None, None
    own_copy = XnnpackBackend.__dict__.get("copy_exported_program_for_preprocess")
    XnnpackBackend.copy_exported_program_for_preprocess = classmethod(_copy_sharing_weights)
    try:
        yield
    finally:
        if own_copy is None:
            del XnnpackBackend.copy_exported_program_for_preprocess  # inherited again
        else:
            XnnpackBackend.copy_exported_program_for_preprocess = own_copy
        (XNNPACKPassManager.transform, ExportPass.call, ExportedProgram.run_decompositions,
         TorchExportPass.call, lowered_backend_module.legalize_graph,
         backend_api._create_partitions_in_graph_module, GroupBasedPartitioner._can_merge_partitions,
         _program.OpReplacePass, _program.MemoryFormatOpsPass) = originals
        _state.lowering, _state.last, _state.stale, _state.edge_ops = False, None, None, None
