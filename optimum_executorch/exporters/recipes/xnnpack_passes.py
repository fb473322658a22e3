"""XNNPACK's per-partition passes without the re-traces that cannot change anything.

`XnnpackBackend.preprocess` runs 17 graph passes over every partition before it serializes it. Almost
every pass ends by re-tracing the whole partition with fake tensors (`ExportPass.call`), whether or not it
changed the graph, and that re-trace is most of the lowering of a transformers decoder: a 4-layer
SmolLM2-shaped 8da4w export spent 26 of its 61 s there (23 partitions x 17 passes), while serializing
the partitions took ~1 s. A re-trace of a graph that no pass touched since the previous re-trace returns the
same graph, so it is skipped here; a pass whose patterns need an op the partition does not contain is
skipped whole when nothing else is pending. What runs is otherwise unchanged, and the delegate bytes are
the same (tested).

Decisions, from the partition's own graph:
- `ExportPass.call` (the re-trace, called by a pass at its end) is skipped when the graph's structure
  (every node's name, op, target, arguments) equals the structure the previous re-trace returned, unless
  the pass does its work inside the re-trace (overrides `call_operator` or another interpreter hook).
- Of the passes that work inside the re-trace, two are known to be idle on a given graph:
  `DimOrderOpsRevertPass` without dim-order ops, `ConstPropPass` without a node that has no tensor inputs
  (it folds only nodes whose inputs are all constants, and a partition's inputs are placeholders).
- `ConvertToUpsampleBilinear2d` and `ConvertToSDPAPass` match subgraph patterns; a pattern can only match
  when every op it contains is in the partition.
"""

import contextlib
import threading
from typing import Any, Optional

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
    return {node.target for node in graph_module.graph.nodes if node.op == "call_function"}


def _works_in_retrace(pass_type) -> bool:
    """Whether a pass changes the graph while it is re-traced (an interpreter hook of its own)."""
    from executorch.exir.pass_base import ExportPass

    hooks = ("call_operator", "call_sym", "call_cond", "call_map", "call_delegate", "call_getitem",
             "call_submodule", "placeholder", "output", "run_node", "call_function", "call_scalar")
    return any(getattr(pass_type, hook, None) is not getattr(ExportPass, hook, None) for hook in hooks)


def _idle_in_retrace(pass_, graph_module) -> bool:
    """For a pass that works inside the re-trace: True when it has provably nothing to change here."""
    import torch
    from executorch.exir.passes.const_prop_pass import ConstPropPass
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass, MemoryFormatOpsMap

    if type(pass_) is DimOrderOpsRevertPass:
        return not (_call_targets(graph_module) & set(MemoryFormatOpsMap))
    if type(pass_) is ConstPropPass:
        # A node folds only when every input is constant; the first such node has no node inputs at all.
        return all(
            node.all_input_nodes for node in graph_module.graph.nodes if node.op == "call_function"
        ) and not any(isinstance(getattr(graph_module, str(n.target), None), torch.Tensor)
                      for n in graph_module.graph.nodes if n.op == "get_attr")
    return False


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
        from torch.fx.passes.infra.pass_base import PassResult

        last: Optional[tuple] = getattr(_state, "last", None)
        if last is not None:
            if _works_in_retrace(type(self)):
                skip = _idle_in_retrace(self, graph_module) and _structure(graph_module) == last
            else:
                skip = _structure(graph_module) == last
            if skip:
                return PassResult(graph_module, False)
        result = original(self, graph_module)
        if last is not None or getattr(_state, "active", False):
            _state.last = _structure(result.graph_module)
        return result

    call._optimum_executorch_original = original
    return call


def _transform(original):
    def transform(self):
        from executorch.backends.xnnpack._passes import XNNPACKPass
        from executorch.exir.pass_base import ExportPass
        from executorch.exir.program._program import _transform as apply_pass

        if not all(isinstance(p, type) and issubclass(p, ExportPass) for p in self.passes):
            return original(self)
        _state.active, _state.last = True, None
        try:
            ep = self.exported_program
            for pass_type in self.passes:
                if (_state.last is not None and _patterns_absent(pass_type, ep.graph_module)
                        and _structure(ep.graph_module) == _state.last):
                    continue
                ep = apply_pass(ep, pass_type(ep) if issubclass(pass_type, XNNPACKPass) else pass_type())
            return ep
        finally:
            _state.active, _state.last = False, None

    transform._optimum_executorch_original = original
    return transform


@contextlib.contextmanager
def skip_idle_retraces():
    """Within this block, XNNPACK's preprocess skips the re-traces and passes that cannot change a partition."""
    from executorch.backends.xnnpack._passes import XNNPACKPassManager
    from executorch.exir.pass_base import ExportPass

    if hasattr(XNNPACKPassManager.transform, "_optimum_executorch_original"):  # already active (nested)
        yield
        return
    original_transform, original_call = XNNPACKPassManager.transform, ExportPass.call
    XNNPACKPassManager.transform = _transform(original_transform)
    ExportPass.call = _retrace(original_call)
    try:
        yield
    finally:
        XNNPACKPassManager.transform, ExportPass.call = original_transform, original_call
