"""torchao quantization: the .pte against the eager model quantized the same way.

Both run the same arithmetic, with one known difference: XNNPACK's 4-bit linear kernels keep the
weight scales in bfloat16 (measured: 3.6e-2 of the largest logit against torchao's float32 scales,
2.4e-7 once the reference's scales are rounded to bfloat16). The reference here rounds them too, so
every scheme must give logits within 1e-4 and the same greedy tokens.
"""

import json

import pytest
import torch

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.quantization import QuantizationSpec
from optimum_executorch.testing import assert_generation_matches_eager, load_eager

PROMPT = torch.tensor([[5, 17, 42, 99, 7, 123, 301, 44]])


def _export_and_reference(src, out, **options):
    out = main_export(src, out, max_seq_len=48, **options)
    eager_q = load_eager(src)
    QuantizationSpec(
        linear=options.get("qlinear"),
        linear_group_size=options.get("qlinear_group_size"),
        embedding=options.get("qembedding"),
    ).apply(eager_q)
    if options.get("qlinear") == "8da4w":
        for module in eager_q.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.scale.data = module.weight.scale.data.to(torch.bfloat16).float()
    return ExecuTorchModelForCausalLM.from_pretrained(out), eager_q, json.loads((out / "executorch_config.json").read_text())


@pytest.mark.parametrize(
    "options, layers",
    [
        ({"qlinear": "8da8w", "qembedding": "8w"}, {"embedding_per_channel": 1, "linear_per_channel": 15}),
        ({"qlinear": "8da4w", "qembedding": "8w"}, {"embedding_per_channel": 1, "linear_group32": 15}),
        # 128 divides only down_proj's 128 inputs: the other linears (64 inputs) fall back to per-channel.
        ({"qlinear": "8da4w", "qlinear_group_size": 128}, {"linear_group128": 2, "linear_per_channel": 13}),
    ],
    ids=["8da8w+8w", "8da4w-g32+8w", "8da4w-g128-fallback"],
)
def test_quantized_export_matches_quantized_eager(tiny_llama_dir, tmp_path, options, layers):
    model, eager_q, config = _export_and_reference(tiny_llama_dir, tmp_path / "et", **options)
    assert config["quantization"]["layers"] == layers
    if options.get("qembedding"):
        assert config["kernel_libraries"][-1] == "executorch.kernels.quantized"
    assert_generation_matches_eager(eager_q, model, PROMPT, max_new_tokens=12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"qlinear": "8da4"}, "Did you mean '8da4w'"),
        ({"qlinear": "4w"}, "Use --qlinear 8da4w"),
        ({"qlinear": "8w"}, "Use --qlinear 8da8w"),
        ({"qembedding": "16w"}, "Choose one of: 8w"),
        ({"qlinear": "8da4w", "qlinear_group_size": 48}, "not a valid group size"),
        ({"qlinear": "8da4w", "qlinear_group_size": -32}, "not a valid group size"),
        ({"qembedding": "8w", "qembedding_group_size": 3}, "not a valid group size"),
        ({"qlinear": "8da8w", "qlinear_group_size": 32}, "Pass --qlinear_group_size 0"),
    ],
)
def test_invalid_quantization_spec_is_rejected_before_any_work(tiny_llama_dir, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        main_export(tiny_llama_dir, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()
