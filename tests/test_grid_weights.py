"""4-bit linears whose weights are already on a 4-bit grid (a dequantized GGUF Q4_0 / Q4_1 file) keep that grid.

The tiny llama's decoder linears are put on grids the way GGUF stores them (groups of 32: Q4_1 `d * q + m`,
Q4_0 `d * (q - 8)`); the LM head stays float, so it is rounded as usual. Checks: the grid is found and rebuilt
exactly, the .pte matches the eager model quantized the same way, and keeping the grid is much closer to the
float model than rounding again.
"""

import pytest
import torch

from optimum.executorch import main_export
from optimum_executorch.exporters import grid
from optimum_executorch.exporters.grid import GroupOffsetLinear, find_grid
from optimum_executorch.exporters.quantization import QuantizationSpec
from optimum_executorch.exporters.quantizer import quantize
from optimum_executorch.testing import assert_generation_matches_eager, load_eager, save_tiny_model

from .test_quantization import PROMPT, _export_and_reference


def _grid_weight(rows, cols, generator, kind):
    """Random weights on a GGUF-like grid: `kind` "q4_1" (scale and minimum per group) or "q4_0" (scale only, as
    ggml picks it: the group's signed value of largest magnitude / -8, so negative for about half the groups)."""
    if kind == "q4_0":
        values = 0.05 * torch.randn(rows, cols // 32, 32, generator=generator)
        scale = values.gather(-1, values.abs().argmax(-1, keepdim=True)) / -8
        return (scale * (torch.clamp(torch.round(values / scale) + 8, 0, 15) - 8)).reshape(rows, cols)
    scale = 0.02 + 0.05 * torch.rand(rows, cols // 32, generator=generator)
    levels = torch.randint(0, 16, (rows, cols // 32, 32), generator=generator).float()
    minimum = -8 * scale + 0.5 * scale * torch.randn(rows, cols // 32, generator=generator)
    return (scale[..., None] * levels + minimum[..., None]).reshape(rows, cols)


def _rebuilt(integers, scales, offsets):
    rows, cols = integers.shape
    return (integers.reshape(rows, -1, 32) * scales[..., None] + offsets[..., None]).reshape(rows, cols)


@pytest.fixture(scope="module")
def grid_llama_dir(tmp_path_factory):
    """The tiny llama with every decoder linear on a grid: down_proj Q4_0-like, the others Q4_1-like (the LM head
    stays float)."""
    directory = save_tiny_model("llama", tmp_path_factory.mktemp("grid_llama") / "model")
    model = load_eager(directory)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, module in model.model.layers.named_modules():
            if isinstance(module, torch.nn.Linear):
                kind = "q4_0" if name.endswith("down_proj") else "q4_1"
                module.weight.copy_(_grid_weight(*module.weight.shape, generator, kind))
    model.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("kind", ["q4_1", "q4_0"])
def test_grid_is_found_and_rebuilt_exactly(kind):
    weight = _grid_weight(48, 128, torch.Generator().manual_seed(1), kind)
    integers, scales, offsets = find_grid(weight, 32)
    assert integers.min() >= -8 and integers.max() <= 7 and bool((scales > 0).all())
    assert float((_rebuilt(integers, scales, offsets) - weight).abs().max()) <= 1e-5 * float(weight.abs().max())
    if kind == "q4_1":
        assert bool((offsets != 0).all())
    else:
        # A Q4_0 group is a symmetric int4 group as it is when its scale is positive (its value of largest
        # magnitude negative, level -8); with a negative scale its levels run -7..8 and it needs the constant.
        groups = weight.reshape(48, -1, 32)
        extreme = groups.gather(-1, groups.abs().argmax(-1, keepdim=True)).squeeze(-1)
        assert torch.equal(offsets != 0, extreme > 0) and 0 < int((extreme > 0).sum()) < extreme.numel()


def test_weights_off_the_grid_are_not_taken_for_one():
    weight = _grid_weight(48, 128, torch.Generator().manual_seed(1), "q4_1")
    assert find_grid(torch.randn(48, 128), 32) is None
    nudged = weight.clone()
    nudged[20, 70] += 0.1 * (nudged[20, 64:96].amax() - nudged[20, 64:96].amin()) / 15  # a tenth of a step
    assert find_grid(nudged, 32) is None
    # Groups of 64 span two Q4_1 groups of 32, two grids: not one 4-bit grid.
    assert find_grid(weight, 64) is None
    # A constant group is on any grid.
    flat = weight.clone()
    flat[3, :32] = 0.25
    integers, scales, offsets = find_grid(flat, 32)
    assert torch.allclose(_rebuilt(integers, scales, offsets), flat, atol=1e-6)


@pytest.mark.parametrize("attention", [{}, {"custom_sdpa": False}], ids=["custom-sdpa", "static-cache-strict-export"])
def test_grid_program_matches_eager_and_keeps_the_grid(grid_llama_dir, tmp_path, attention):
    model, eager_q, config = _export_and_reference(grid_llama_dir, tmp_path / "et", qlinear="8da4w", **attention)
    # 14 decoder linears on a grid; the LM head (float) is rounded as usual.
    # The LM head, the one linear off the grid, is rounded by GPTQ (qlinear_method "auto").
    assert config["quantization"]["layers"] == {"linear_group32": 15, "linear_on_grid": 14, "linear_gptq": 1}
    wrapped = [name for name, m in eager_q.named_modules() if isinstance(m, GroupOffsetLinear)]
    assert len(wrapped) == 14  # Q4_1 always needs the constant; these Q4_0 down projections have negative scales
    assert_generation_matches_eager(eager_q, model, PROMPT, max_new_tokens=12)


def test_linears_reading_the_same_input_average_it_once(grid_llama_dir):
    model = load_eager(grid_llama_dir)
    quantize(model, QuantizationSpec(qlinear="8da4w"))
    ids = torch.randint(3, 512, (1, 5), generator=torch.Generator().manual_seed(0))
    program = torch.export.export(model, (ids,), {"use_cache": False}, strict=False)
    means = [n for n in program.graph.nodes if n.target == torch.ops.aten.mean.dim and list(n.args[1]) == [2, 3]]
    # A layer's inputs: q / k / v's, o's, gate / up's, down's (7 linears, 4 inputs), 2 layers.
    assert len(means) == 8

    # Eager: the shared means follow the input, by identity and in-place writes.
    attention = model.model.layers[0].self_attn
    q, k = attention.q_proj, attention.k_proj
    assert q._means is k._means
    x = torch.randn(1, 3, q.in_features)

    def alone(wrapper, x):
        return wrapper.linear(x) + torch.nn.functional.linear(grid.GroupMeans(32)(x), wrapper.offsets)

    with torch.no_grad():
        assert torch.equal(q(x), alone(q, x)) and torch.equal(k(x), alone(k, x))
        other = torch.randn_like(x)
        assert torch.equal(k(other), alone(k, other))
        q(x)
        x.mul_(2)
        assert torch.equal(k(x), alone(k, x))
        # Held weakly: a finished forward's input is freed.
        del x, other
        assert q._means._last[0]() is None


def _logit_error(model, reference, ids):
    with torch.no_grad():
        return float((model(ids).logits - reference).abs().max() / reference.abs().max())


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_keeping_the_grid_is_closer_to_the_float_model_than_rounding_again(grid_llama_dir, monkeypatch, method):
    ids = torch.randint(3, 512, (1, 48), generator=torch.Generator().manual_seed(0))
    float_model = load_eager(grid_llama_dir)
    with torch.no_grad():
        reference = float_model(ids).logits
    kept = load_eager(grid_llama_dir)
    summary = quantize(kept, QuantizationSpec(qlinear="8da4w", qlinear_method=method))
    assert summary["linear_on_grid"] == 14
    for name, module in float_model.model.layers.named_modules():
        if isinstance(module, torch.nn.Linear):
            wrapper = kept.model.layers.get_submodule(name)
            quantized = (wrapper.linear if isinstance(wrapper, GroupOffsetLinear) else wrapper).weight
            offsets = wrapper.offsets / 32 if isinstance(wrapper, GroupOffsetLinear) else torch.zeros_like(quantized.scale)
            rebuilt = _rebuilt(quantized.qdata.float(), quantized.scale.reshape(offsets.shape), offsets)
            assert float((rebuilt - module.weight).abs().max()) <= 1e-5 * float(module.weight.abs().max()), name
    rounded = load_eager(grid_llama_dir)
    monkeypatch.setattr(grid, "find_grids", lambda *args: {})
    quantize(rounded, QuantizationSpec(qlinear="8da4w", qlinear_method=method))
    # What is left with the grid kept is the int8 activation rounding and the LM head's 4 bits.
    kept_error, rounded_error = _logit_error(kept, reference, ids), _logit_error(rounded, reference, ids)
    assert kept_error < 0.5 * rounded_error, f"grid kept {kept_error:.3e}, rounded again {rounded_error:.3e}"


def test_a_linear_stored_at_8_bits_is_named_with_the_option_that_keeps_it(grid_llama_dir, caplog):
    # A GGUF's Q8_0 tensor (here the LM head: `d * q`, q in -127..127 per group of 32) rounded to 4 bits loses
    # what the file kept; the log says which layers and how to keep them at 8 bits.
    generator = torch.Generator().manual_seed(2)

    def q8_0(shape):
        scale = 0.001 + 0.002 * torch.rand(shape[0], shape[1] // 32, 1, generator=generator)
        levels = torch.randint(-126, 127, (shape[0], shape[1] // 32, 32), generator=generator)
        levels[..., 0] = 127  # the group's largest magnitude is 127 steps (GGUF's scale is largest / 127)
        return (scale * levels).reshape(shape)

    assert grid.on_8bit_grid(q8_0((16, 64))) and not grid.on_8bit_grid(torch.randn(16, 64))
    for eight_bit in (None, ("lm_head",)):
        model = load_eager(grid_llama_dir)
        with torch.no_grad():
            model.lm_head.weight.copy_(q8_0(model.lm_head.weight.shape))
        caplog.clear()
        quantize(model, QuantizationSpec(qlinear="8da4w", qlinear_8bit_layers=eight_bit))
        hints = [r.getMessage() for r in caplog.records if "stored at 8 bits" in r.getMessage()]
        if eight_bit:
            assert not hints
        else:
            assert len(hints) == 1 and "--qlinear_8bit_layers lm_head" in hints[0], hints


def test_grid_kept_in_float16_and_named_when_the_group_size_cannot_keep_it(caplog):
    generator = torch.Generator().manual_seed(3)
    weight = _grid_weight(16, 64, generator, "q4_1")
    x = torch.randn(1, 5, 64, generator=generator)
    for dtype, group_size in ((torch.float16, 32), (torch.float32, 64)):
        model = torch.nn.Sequential(torch.nn.Linear(64, 16, bias=False))
        with torch.no_grad():
            model[0].weight.copy_(weight)
        model.to(dtype)
        caplog.clear()
        summary = quantize(model, QuantizationSpec(qlinear="8da4w", qlinear_group_size=group_size))
        with torch.no_grad():
            out = model(x.to(dtype)).float()
        # The int8 activation rounding is what is left (and float16's own rounding).
        error = float((out - x @ weight.T).abs().max() / (x @ weight.T).abs().max())
        if group_size == 32:
            assert summary["linear_on_grid"] == 1 and error < 0.02, (summary, error)
        else:
            assert "linear_on_grid" not in summary
            assert any("--qlinear_group_size 32 to keep them" in r.getMessage() for r in caplog.records)


def test_auto_rounds_with_gptq_only_the_few_4bit_linears_off_a_grid(grid_llama_dir, tiny_llama_dir, monkeypatch,
                                                                    caplog):  # fmt: skip
    from optimum_executorch.exporters import gptq
    from optimum_executorch.exporters.quantization import AUTO_CALIBRATION_LENGTH

    def head_after(directory, **options):
        model = load_eager(directory)
        summary = quantize(model, QuantizationSpec(qlinear="8da4w", **options))
        return summary.get("linear_gptq"), model.lm_head.weight.qdata

    # Grid model: the float LM head gets GPTQ, on the shorter calibration; the same as asking for GPTQ with it.
    layers, auto_head = head_after(grid_llama_dir)
    _, rtn_head = head_after(grid_llama_dir, qlinear_method="rtn")
    monkeypatch.setattr(gptq, "CALIBRATION_LENGTH", AUTO_CALIBRATION_LENGTH)
    _, gptq_head = head_after(grid_llama_dir, qlinear_method="gptq")
    assert layers == 1 and torch.equal(auto_head, gptq_head) and not torch.equal(auto_head, rtn_head)
    # A model that cannot sample its calibration text is rounded to nearest, with a warning.
    monkeypatch.setattr(gptq, "sample_with_statistics", lambda *args: (_ for _ in ()).throw(RuntimeError("no generate")))
    layers, failed_head = head_after(grid_llama_dir)
    assert layers is None and torch.equal(failed_head, rtn_head)
    assert any("calibration failed (RuntimeError: no generate)" in r.getMessage() for r in caplog.records)
    # Round to nearest where no grid is kept, and for a head kept at 8 bits.
    for directory, options in ((tiny_llama_dir, {}), (grid_llama_dir, {"qlinear_8bit_layers": ("lm_head",)})):
        layers, auto_head = head_after(directory, **options)
        _, rtn_head = head_after(directory, qlinear_method="rtn", **options)
        assert layers is None and torch.equal(auto_head, rtn_head)
