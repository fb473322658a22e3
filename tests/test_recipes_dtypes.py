"""Recipes and dtypes other than the default xnnpack/float32, each against the eager model."""

import pytest
import torch

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.testing import assert_generation_matches_eager, assert_logits_close, load_eager

PROMPT = torch.tensor([[5, 17, 42, 99, 7, 123]])


def test_portable_recipe_matches_eager(tiny_llama_dir, tmp_path):
    out = main_export(tiny_llama_dir, tmp_path / "et", recipe="portable", max_seq_len=32)
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert_generation_matches_eager(tiny_llama_dir, model, PROMPT, max_new_tokens=10)


@pytest.mark.parametrize("recipe, dtype", [("xnnpack", "float16"), ("portable", "bfloat16")])
def test_half_precision_export_matches_eager_in_that_dtype(tiny_llama_dir, tmp_path, recipe, dtype):
    out = main_export(tiny_llama_dir, tmp_path / "et", recipe=recipe, dtype=dtype, max_seq_len=32)
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert model.dtype == getattr(torch, dtype)
    eager = load_eager(tiny_llama_dir, dtype=getattr(torch, dtype))
    with torch.no_grad():
        expected = eager(PROMPT).logits[:, -1:].float()
    actual = model(PROMPT).logits.float()
    # Half precision: logits within 2% of their scale, and the same top-1 token.
    assert_logits_close(actual, expected, rtol=2e-2)
    assert int(actual.argmax()) == int(expected.argmax())


class _Linears(torch.nn.Module):
    def __init__(self, upsample=False):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.upsample = upsample

    def forward(self, x):
        y = self.proj(x)
        if self.upsample:
            y = torch.nn.functional.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        return y


@pytest.mark.parametrize("upsample", [False, True])
def test_xnnpack_partitioner_drops_the_op_check_only_for_linear_programs(upsample):
    # Linears only: no per-node check, so the edge lowering skips its third decomposition. Any other op kept
    # whole (bilinear upsampling here) keeps XNNPACK's own check and the lowering as ExecuTorch runs it.
    from optimum_executorch.exporters.recipes import get_recipe

    program = torch.export.export(_Linears(upsample).eval(), (torch.randn(1, 2, 4, 8),)).run_decompositions({})
    (partitioner,) = get_recipe("xnnpack").partitioners()
    ops, check = partitioner.ops_to_not_decompose(program)
    assert torch.ops.aten.linear.default in ops
    assert (check is None) == (not upsample)
