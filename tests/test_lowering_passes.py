"""The XNNPACK lowering without idle re-traces (recipes/xnnpack_passes.py) writes the same bytes as ExecuTorch's
own, with one whole-program decomposition instead of two and one re-trace per partition instead of ~15."""

import contextlib

import pytest
import torch

from optimum.executorch import main_export
from optimum_executorch.exporters.recipes import get_recipe
from optimum_executorch.exporters.recipes.xnnpack import XnnpackRecipe


class _EveryPass(torch.nn.Module):
    """Ops that XNNPACK's passes rewrite: conv + batch norm, conv1d, activations to fuse, a concatenation of
    more than five inputs, padding, bilinear upsampling, PReLU, attention as matmul + softmax, a constant, a
    transpose (`aten.t`), a binary operator on mixed dtypes."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)
        self.conv1d = torch.nn.Conv1d(4, 4, 3, padding=1)
        self.prelu = torch.nn.PReLU()
        self.proj = torch.nn.Linear(8, 8)
        with torch.no_grad():
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.5, 2)

    @staticmethod
    def example_inputs():
        return torch.randn(1, 3, 6, 6), torch.randn(1, 5, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 8)

    def forward(self, x, q, k, v):
        y = torch.nn.functional.hardtanh(self.norm(self.conv(x)), 0.0, 6.0)
        y = torch.nn.functional.pad(y, (1, 1, 1, 1))
        y = torch.nn.functional.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        y = self.prelu(y)
        z = self.conv1d(y.flatten(2)[:, :, :16])
        z = torch.cat([torch.relu(z[:, :, i : i + 2]) for i in range(7)], dim=-1)
        scores = torch.softmax(q @ k.transpose(-1, -2) * 0.35, dim=-1)
        attention = self.proj(scores @ v) + torch.ones(8) * 2
        attention = attention @ self.proj.weight.t() + torch.arange(8)
        return z, attention


FAST_CONTEXT = XnnpackRecipe.lowering_context


def _use_fast_lowering(monkeypatch, fast):
    plain = lambda self: contextlib.nullcontext()  # noqa: E731  (ExecuTorch's lowering as it ships)
    monkeypatch.setattr(XnnpackRecipe, "lowering_context", FAST_CONTEXT if fast else plain)


@pytest.fixture()
def count_retraces(monkeypatch):
    """Counts partition re-traces (`ExportPass.call`), decompositions of programs of over 100 nodes and program
    checks (code generation, lint and verifier, run by ExecuTorch's pass manager)."""
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.pass_manager import ExportedProgramPassManager

    calls = {"retrace": 0, "decompose": 0, "check": 0}
    retrace, decompose = ExportPass.call, torch.export.ExportedProgram.run_decompositions
    check = ExportedProgramPassManager.check

    def counted_check(self, program):
        calls["check"] += 1
        return check(self, program)

    def counted_retrace(self, graph_module):
        calls["retrace"] += 1
        return retrace(self, graph_module)

    def counted_decompose(self, *args, **kwargs):
        calls["decompose"] += len(self.graph.nodes) > 100
        return decompose(self, *args, **kwargs)

    monkeypatch.setattr(ExportPass, "call", counted_retrace)
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted_decompose)
    monkeypatch.setattr(ExportedProgramPassManager, "check", counted_check)
    return calls


def test_every_pass_program_is_lowered_to_the_same_bytes(monkeypatch):
    model = _EveryPass().eval()
    inputs = _EveryPass.example_inputs()
    program = torch.export.export(model, inputs)
    buffers = []
    for fast in (False, True):
        _use_fast_lowering(monkeypatch, fast)
        buffers.append(get_recipe("xnnpack").lower({"forward": program}, {}).buffer)
    assert buffers[0] == buffers[1]


def test_partitioned_program_code_is_generated_from_its_final_graph(monkeypatch):
    # The partitions are cut with one code generation at the end instead of one per partition: once they are
    # all cut, the program's code is that of its graph.
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend import backend_api

    cut, fresh = backend_api._create_partitions, []

    def checked_cut(graph_module, *args, **kwargs):
        result = cut(graph_module, *args, **kwargs)
        fresh.append(graph_module.code == graph_module.graph.python_code("self").src)
        return result

    monkeypatch.setattr(backend_api, "_create_partitions", checked_cut)
    model = _EveryPass().eval()
    inputs = _EveryPass.example_inputs()
    recipe = get_recipe("xnnpack")
    with recipe.lowering_context():
        edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=recipe.partitioners())
    assert fresh == [True]
    assert "executorch_call_delegate" in edge.exported_program().graph_module.code
    torch.testing.assert_close(edge.exported_program().module()(*inputs), model(*inputs))


def test_llama_8da4w_is_lowered_to_the_same_bytes_once_decomposed_and_with_fewer_retraces(
    tiny_llama_dir, tmp_path, monkeypatch, count_retraces
):
    options = dict(max_seq_len=32, qlinear="8da4w", qembedding="8w")
    _use_fast_lowering(monkeypatch, False)
    plain = main_export(tiny_llama_dir, tmp_path / "plain", **options)
    counts_plain = dict(count_retraces)
    _use_fast_lowering(monkeypatch, True)
    count_retraces.update(retrace=0, decompose=0, check=0)
    fast = main_export(tiny_llama_dir, tmp_path / "fast", **options)
    assert (fast / "model.pte").read_bytes() == (plain / "model.pte").read_bytes()
    # Each XNNPACK partition is re-traced once instead of by every pass (about 15 times), and checked once
    # after its passes instead of before and after each.
    assert count_retraces["retrace"] < counts_plain["retrace"] / 2, (count_retraces, counts_plain)
    assert count_retraces["check"] < counts_plain["check"] / 4, (count_retraces, counts_plain)
    assert (counts_plain["decompose"], count_retraces["decompose"]) == (2, 1)



def test_partition_merge_check_decides_as_executorch_on_every_pair(tiny_llama_dir, tmp_path, monkeypatch):
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner

    from optimum_executorch.exporters.recipes.partition_merge import can_merge_partitions

    original, decisions = GroupBasedPartitioner._can_merge_partitions, []

    def both(self, p1, p2, partitions_by_id):
        decision = original(self, p1, p2, partitions_by_id)
        decisions.append((decision, can_merge_partitions(self, p1, p2, partitions_by_id)))
        return decision

    _use_fast_lowering(monkeypatch, False)
    monkeypatch.setattr(GroupBasedPartitioner, "_can_merge_partitions", both)
    main_export(tiny_llama_dir, tmp_path / "out", max_seq_len=32, qlinear="8da4w", qembedding="8w")
    assert all(ours == theirs for theirs, ours in decisions)
    assert {theirs for theirs, _ in decisions} == {True, False}  # merges allowed and refused were both checked


@pytest.mark.parametrize("skip_dim_order", [False, True])
def test_edge_operators_and_dim_orders_come_from_one_retrace(skip_dim_order, count_retraces):
    # `_generate_edge_program` lists OpReplacePass and MemoryFormatOpsPass back to back: inside the lowering
    # context they run as one re-trace, with the same edge program; without MemoryFormatOpsPass (or called one
    # at a time, as ExecuTorch's `_to_edge` does) OpReplacePass runs alone.
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.passes import MemoryFormatOpsPass, OpReplacePass
    from executorch.exir.program import _program

    model = _EveryPass().eval()
    program = torch.export.export(model, _EveryPass.example_inputs())
    config = EdgeCompileConfig(_skip_dim_order=skip_dim_order)
    plain = to_edge(program, compile_config=config).exported_program()
    plain_retraces = count_retraces["retrace"]
    with FAST_CONTEXT(get_recipe("xnnpack")):
        count_retraces["retrace"] = 0
        fast = to_edge(program, compile_config=config).exported_program()
        fast_retraces = count_retraces["retrace"]
        gm = program.graph_module
        alone = MemoryFormatOpsPass()(_program.OpReplacePass()(gm).graph_module).graph_module  # one at a time
    assert (_program.OpReplacePass, _program.MemoryFormatOpsPass) == (OpReplacePass, MemoryFormatOpsPass)
    assert fast.graph_module.code == plain.graph_module.code
    if not skip_dim_order:
        assert "dim_order_ops__to_dim_order_copy" in fast.graph_module.code
    assert fast_retraces < plain_retraces if not skip_dim_order else fast_retraces <= plain_retraces
    assert "torch.ops.aten" not in alone.code.replace("torch.ops.aten.sym_size", "")



def _weight_digests(programs) -> dict:
    """sha256 of every weight of `programs` (the inner tensors of a quantized tensor subclass)."""
    import hashlib

    def leaves(tensor):
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
            return [leaf for name in tensor.__tensor_flatten__()[0] for leaf in leaves(getattr(tensor, name))]
        return [tensor]

    return {f"{method}.{name}.{i}": hashlib.sha256(leaf.detach().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
            for method, program in programs.items() for name, tensor in {**program.state_dict, **program.constants}.items()
            if isinstance(tensor, torch.Tensor) for i, leaf in enumerate(leaves(tensor))}  # fmt: skip


def test_xnnpack_preprocess_copies_share_weights_that_the_lowering_leaves_unchanged(tiny_llama_dir, tmp_path, monkeypatch):
    """Inside the lowering context the program copy handed to XNNPACK's preprocess shares its weight tensors (no
    clone of every delegated weight) but has its own graph; ExecuTorch's deep copy is back outside the context; and
    the weights the lowering shared are unchanged by it (an 8da4w export)."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    program = torch.export.export(torch.nn.Linear(64, 64).eval(), (torch.randn(1, 64),))
    with FAST_CONTEXT(None):
        shared = XnnpackBackend.copy_exported_program_for_preprocess(program, [])
    cloned = XnnpackBackend.copy_exported_program_for_preprocess(program, [])
    assert shared.graph is not program.graph
    assert all(shared.state_dict[name] is tensor for name, tensor in program.state_dict.items())
    assert all(cloned.state_dict[name] is not tensor for name, tensor in program.state_dict.items())

    lower, checked = XnnpackRecipe.lower, []

    def lower_and_compare(self, programs, *args, **kwargs):
        before = _weight_digests(programs)
        result = lower(self, programs, *args, **kwargs)
        after = _weight_digests(programs)
        # The lowering moves a duplicate buffer (the rotary frequencies' second name) in or out of the dicts.
        common = before.keys() & after.keys()
        assert len(common) >= len(before) - 2 and all(after[name] == before[name] for name in common)
        checked.append(len(before))
        return result

    monkeypatch.setattr(XnnpackRecipe, "lower", lower_and_compare)
    main_export(tiny_llama_dir, tmp_path / "out", max_seq_len=32, qlinear="8da4w", qembedding="8w")
    assert checked
