"""Edge rewrites of the XNNPACK recipe (recipes/xnnpack_rewrites.py): ops its partitioner refused (RoPE's
rotate-half slices, reshapes holding the sequence length) stay inside the delegate, and the lowered program, run
by ExecuTorch, computes what the eager module does at several sequence lengths."""

from types import SimpleNamespace

import torch

from optimum_executorch.exporters.grid import GroupOffsetLinear
from optimum_executorch.exporters.recipes import get_recipe
from optimum_executorch.exporters.recipes.xnnpack import XnnpackRecipe


class _LlamaAttentionInput(torch.nn.Module):
    """What a llama layer runs before its attention op: RMSNorm, a projection viewed as heads, RoPE."""

    def __init__(self, rotation=8):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, bias=False)
        self.rotation = rotation  # 8 (half of the head size): transformers' rotate_half; other: not it

    def forward(self, x, cos, sin):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        q = self.proj(h).view(*x.shape[:-1], -1, 16).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        rotated = torch.cat((-q[..., self.rotation :], q[..., : self.rotation]), dim=-1)
        return (q * cos + rotated * sin).transpose(1, 2).reshape(*x.shape[:-1], -1)


def _lower(model, example, dynamic_shapes, monkeypatch, with_rewrites=True):
    """The lowered ExecuTorch method, the number of delegates and the call_function targets left outside them."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    program = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)
    if not with_rewrites:
        monkeypatch.setattr(XnnpackRecipe, "edge_passes", lambda self: [])
    recipe = get_recipe("xnnpack")
    with recipe.lowering_context():
        edge = to_edge_transform_and_lower(
            program, partitioner=recipe.partitioners(), transform_passes=recipe.edge_passes() or None
        )
    graph_module = edge.exported_program().graph_module
    calls = [n for n in graph_module.graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)]
    delegated = [n for n in calls if "executorch_call_delegate" in str(n.target)]
    outside = [str(n.target) for n in calls if n not in delegated and "sym_size" not in str(n.target)]
    lowered = [getattr(graph_module, n.args[0].target).original_module for n in delegated]
    inside = [str(m.target) for module in lowered for m in module.graph.nodes if m.op == "call_function"]
    buffer = edge.to_executorch().buffer  # kept alive with the method: the loaded program reads it in place
    method = Runtime.get().load_program(buffer).load_method("forward")
    return SimpleNamespace(method=method, buffer=buffer, delegates=len(delegated), outside=outside, inside=inside)


def _inputs(length, generator):
    return (torch.randn(1, length, 64, generator=generator),
            torch.randn(1, length, 16, generator=generator), torch.randn(1, length, 16, generator=generator))  # fmt: skip


def _dynamic():
    seq = torch.export.Dim("seq", max=32)
    return ({1: seq}, {1: seq}, {1: seq})


def _assert_runs_like_eager(method, model):
    generator = torch.Generator().manual_seed(1)
    for length in (1, 7):
        inputs = _inputs(length, generator)
        torch.testing.assert_close(method.execute(list(inputs))[0], model(*inputs).detach(), rtol=1e-5, atol=1e-5)


def test_rotate_half_and_head_reshapes_stay_in_the_delegate(monkeypatch):
    torch.manual_seed(0)
    model = _LlamaAttentionInput().eval()
    example = _inputs(5, torch.Generator().manual_seed(0))
    lowered = _lower(model, example, _dynamic(), monkeypatch)
    plain = _lower(model, example, _dynamic(), monkeypatch, with_rewrites=False)
    # Without the rewrites the head reshape and rotate-half's two slices ran outside XNNPACK, cutting it in three.
    assert sum("slice_copy" in name for name in plain.outside) == 2 and any("view_copy" in n for n in plain.outside)
    assert any("mean" in name for name in plain.outside) and sum("permute" in n for n in plain.inside) == 2
    outside_ops = ("slice", "cat", "neg", "view", "mean", "permute")
    assert not any(op in name for name in lowered.outside for op in outside_ops), lowered.outside
    # RMSNorm's mean is a linear inside the delegate; RoPE runs on [batch, seq, heads, head_dim] as the module's
    # input and output are laid out, so the transposes there and back are gone.
    assert not any("permute" in name or "mean" in name for name in lowered.inside), lowered.inside
    # Left outside by choice: RoPE's unsqueezes of cos / sin (cheaper as portable kernels on a decode step).
    assert lowered.delegates == 1 < plain.delegates, (lowered.delegates, plain.delegates)
    _assert_runs_like_eager(lowered.method, model)


class _HeadTransposes(torch.nn.Module):
    """Heads moved to dim 1 and back: around RoPE-like ops, with nothing between, and from a transpose whose
    result is also used elsewhere (kept for that use)."""

    def forward(self, x, cos, sin):
        heads = x.view(*x.shape[:-1], 4, 16)
        q = heads.transpose(1, 2)
        rope = (q * cos.unsqueeze(1) + q * sin.unsqueeze(1)).transpose(1, 2)
        v = heads.transpose(1, 2).transpose(1, 2)
        shared = (heads * 2).transpose(1, 2)
        kept = (shared * cos.unsqueeze(1)).transpose(1, 2)
        return (rope + v + kept).reshape(*x.shape[:-1], -1), shared.sum(-1)


def test_transposes_of_heads_and_back_are_pulled_through_ropes_ops(monkeypatch):
    model = _HeadTransposes().eval()
    example = _inputs(5, torch.Generator().manual_seed(0))
    lowered = _lower(model, example, _dynamic(), monkeypatch)
    plain = _lower(model, example, _dynamic(), monkeypatch, with_rewrites=False)
    permutes = [sum("permute" in name for name in p.inside + p.outside) for p in (plain, lowered)]
    # Six before; left: the transpose whose result is also returned (the mul after it reads its input instead).
    assert permutes == [6, 1], permutes
    generator = torch.Generator().manual_seed(1)
    for length in (1, 7):
        inputs = _inputs(length, generator)
        for actual, expected in zip(lowered.method.execute(list(inputs)), model(*inputs)):
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_rotation_other_than_rotate_half_is_left_as_it_is(monkeypatch):
    torch.manual_seed(0)
    model = _LlamaAttentionInput(rotation=4).eval()
    lowered = _lower(model, _inputs(5, torch.Generator().manual_seed(0)), _dynamic(), monkeypatch)
    assert sum("slice_copy" in name for name in lowered.outside) == 2, lowered.outside
    _assert_runs_like_eager(lowered.method, model)


def test_reshapes_with_a_symbolic_size_stay_in_the_delegate(monkeypatch):
    # A reshape whose shape holds the sequence length (a symbol) was refused by XNNPACK's partitioner and ran
    # between two delegates; the recipe writes that size as -1, which XNNPACK takes.
    torch.manual_seed(0)
    model = GroupOffsetLinear(torch.nn.Linear(64, 16, bias=False), torch.randn(16, 2), 32).eval()
    dynamic = ({1: torch.export.Dim("seq", max=32)},)
    delegates = {}
    for with_rewrites in (True, False):
        lowered = _lower(model, (torch.randn(1, 5, 64),), dynamic, monkeypatch, with_rewrites)
        delegates[with_rewrites] = lowered.delegates
        for length in (1, 7):
            inputs = torch.randn(1, length, 64)
            output = lowered.method.execute([inputs])[0]
            torch.testing.assert_close(output, model(inputs).detach(), rtol=1e-5, atol=1e-5)
    assert delegates == {True: 1, False: 2}, delegates


class _PerHeadScale(torch.nn.Module):
    """Heads moved to dim 1, scaled by a [heads, head_dim] weight unsqueezed to [heads, 1, head_dim] (rank 3: it
    broadcasts from the right against the rank-4 heads), and moved back."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4, 16), requires_grad=False)

    def forward(self, x, cos, sin):
        q = x.view(*x.shape[:-1], 4, 16).transpose(1, 2)
        return (q * self.scale.unsqueeze(1) + q * cos.unsqueeze(1)).transpose(1, 2).reshape(*x.shape[:-1], -1)


def test_an_unsqueeze_of_lower_rank_is_not_moved_as_a_head_dim(monkeypatch):
    # Moving the transposes back through the mul would need the [4, 1, 16] operand as [4, 16, 1]'s rank-4 form;
    # an unsqueeze that broadcasts from the right is not one the pull-back can move, so the transposes stay.
    torch.manual_seed(0)
    model = _PerHeadScale().eval()
    lowered = _lower(model, _inputs(5, torch.Generator().manual_seed(0)), _dynamic(), monkeypatch)
    assert sum("permute" in name for name in lowered.inside + lowered.outside) == 2
    _assert_runs_like_eager(lowered.method, model)
