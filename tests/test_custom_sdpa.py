"""ExecuTorch's custom_sdpa / update_cache path (default for xnnpack) against the eager model."""

import json

import pytest
import torch

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.testing import assert_generation_matches_eager, save_tiny_model

PROMPT = torch.tensor([[5, 17, 42, 99, 7, 123]])


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_custom_sdpa_matches_eager(model_type, tmp_path):
    src = save_tiny_model(model_type, tmp_path / "src")
    out = main_export(src, tmp_path / "et", max_seq_len=48)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["custom_sdpa"] is True
    assert config["kernel_libraries"] == ["executorch.extension.llm.custom_ops.custom_ops"]
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert_generation_matches_eager(src, model, PROMPT, max_new_tokens=20)
    # A second prompt restarts the sequence at position 0: same answer again.
    assert_generation_matches_eager(src, model, PROMPT, max_new_tokens=20)


@pytest.mark.parametrize(
    "model_type, overrides",
    [("mistral", {}), ("cohere2", {"layer_types": ["sliding_attention", "full_attention"]})],
)
def test_sliding_window_layers_keep_a_ring_on_the_custom_path(model_type, overrides, tmp_path):
    """Window 8, context 48: each sliding layer keeps 16 slots, written with update_cache_with_indices and attended
    with custom_sdpa behind the window mask; a 12-token prompt goes in two calls and 24 new tokens wrap the ring."""
    src = save_tiny_model(model_type, tmp_path / "src", sliding_window=8, **overrides)
    out = main_export(src, tmp_path / "et", max_seq_len=48)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["custom_sdpa"] is True and config["metadata"]["get_max_seq_len"] == 8
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert model.max_chunk_len == 8
    prompt = torch.tensor([[5, 17, 42, 99, 7, 123, 64, 33, 250, 8, 91, 12]])
    assert_generation_matches_eager(src, model, prompt, max_new_tokens=24)


def test_static_cache_path_when_custom_sdpa_is_off(tiny_llama_dir, tmp_path):
    out = main_export(tiny_llama_dir, tmp_path / "et", max_seq_len=48, custom_sdpa=False)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["custom_sdpa"] is False and config["kernel_libraries"] == []
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert_generation_matches_eager(tiny_llama_dir, model, PROMPT, max_new_tokens=20)


def test_custom_sdpa_with_index_copy_cache(tiny_llama_dir, tmp_path):
    """--no_custom_kv_cache: custom SDPA reads a cache written by index_copy_ instead of update_cache."""
    out = main_export(tiny_llama_dir, tmp_path / "et", max_seq_len=48, custom_kv_cache=False)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["custom_sdpa"] is True and config["custom_kv_cache"] is False
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert_generation_matches_eager(tiny_llama_dir, model, PROMPT, max_new_tokens=20)
    assert_generation_matches_eager(tiny_llama_dir, model, PROMPT, max_new_tokens=20)


def test_custom_kv_cache_needs_custom_sdpa(tiny_llama_dir, tmp_path):
    with pytest.raises(ValueError, match="custom_kv_cache applies to custom SDPA only"):
        main_export(tiny_llama_dir, tmp_path / "et", max_seq_len=48, custom_sdpa=False, custom_kv_cache=True)
    assert not (tmp_path / "et").exists()
    with pytest.raises(ValueError, match="custom_kv_cache applies to custom SDPA only"):
        main_export(tiny_llama_dir, tmp_path / "et", max_seq_len=48, custom_sdpa=False, custom_kv_cache=False)


def test_static_cache_is_exported_strict_because_non_strict_does_not_lower(tiny_llama_dir):
    """The custom-SDPA wrapper exports non-strict (2-3x faster); transformers' StaticCache wrapper cannot yet:
    its non-strict program takes some tensors as two inputs each and the lowering's decomposition rejects it.
    When this test fails, torch fixed that: drop `strict_export` from the wrapper and this test."""
    from executorch.exir import to_edge_transform_and_lower

    from optimum_executorch.exporters.wrappers.causal_lm import CausalLMExportableModule
    from optimum_executorch.testing.parity import load_eager

    wrapper = CausalLMExportableModule(load_eager(tiny_llama_dir), max_seq_len=16, custom_sdpa=False)
    assert wrapper.strict_export is True
    with torch.no_grad():
        program = torch.export.export(
            wrapper, wrapper.example_inputs()["forward"], dynamic_shapes=wrapper.dynamic_shapes()["forward"], strict=False
        )
    with pytest.raises(AssertionError, match="compiled_fn"):
        to_edge_transform_and_lower(program)
    assert CausalLMExportableModule(load_eager(tiny_llama_dir), max_seq_len=16, custom_sdpa=True).strict_export is False
