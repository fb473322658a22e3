"""gemma3_text, a built-in extension: sliding-window layers with a ring-buffer cache, against the eager model."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.wrappers.ring_cache import RingCacheCausalLMExportableModule
from optimum_executorch.testing import (
    assert_generation_matches_eager,
    assert_logits_close,
    keep_whole_character_tokens,
    load_eager,
    save_tiny_model,
)

from .conftest import cell

WINDOW, MAX_SEQ_LEN = 8, 48
LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]
# As for gemma (tests/test_matrix.py): XNNPACK's arithmetic on gemma's tanh-GELU and scaled embeddings.
RTOL = 5e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    src = save_tiny_model("gemma3_text", root / "model", num_hidden_layers=3, layer_types=LAYERS, sliding_window=WINDOW)
    # Whole-character tokens only, so that ExecuTorch's C++ runner can stream the text too (test_runner_engine.py).
    model, tokenizer = AutoModelForCausalLM.from_pretrained(src), AutoTokenizer.from_pretrained(src)
    keep_whole_character_tokens(model, tokenizer)
    model.save_pretrained(src)
    out = main_export(src, root / "et", max_seq_len=MAX_SEQ_LEN)
    return ExecuTorchModelForCausalLM.from_pretrained(out), load_eager(src), out


@cell("gemma3_text", "text-generation")
def test_greedy_tokens_match_eager_past_the_window(exported):
    et_model, eager, _ = exported
    torch.manual_seed(0)
    # A 20-token prompt (fed 8 tokens a call) and 24 new tokens: the 16-slot ring wraps around twice.
    prompt = torch.randint(7, 512, (1, 20))
    kwargs = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False)
    expected = eager.generate(prompt, **kwargs)
    assert et_model.generate(prompt, **kwargs).tolist() == expected.tolist()
    with torch.no_grad():
        logits = eager(expected).logits
    # Token by token through the whole sequence, then a chunk of a full window at once.
    for step in range(expected.shape[1]):
        actual = et_model(expected[:, step : step + 1], cache_position=torch.tensor([step])).logits
        assert_logits_close(actual, logits[:, step : step + 1], rtol=RTOL)
    actual = et_model(expected[:, :30]).logits  # positions 0..29 in chunks of 8, 8, 8, 6
    assert_logits_close(actual, logits[:, 29:30], rtol=RTOL)


def test_cpp_runner_feeds_a_long_prompt_in_window_sized_calls(exported):
    _, _, out = exported
    prompt = "The capital of France is Paris. The capital of Italy is"  # 12 tokens: more than one call of 8
    results = [
        ExecuTorchModelForCausalLM.from_pretrained(out, engine=engine).generate_text(prompt, max_new_tokens=12)
        for engine in ("python", "runner")
    ]
    (py_text, py_stats), (runner_text, runner_stats) = results
    assert py_stats.prompt_tokens > WINDOW and runner_stats.prompt_tokens == py_stats.prompt_tokens
    assert runner_text == py_text and runner_stats.new_tokens == py_stats.new_tokens == 12


def test_sliding_layers_memory_does_not_grow_with_context(exported):
    _, eager, _ = exported
    for max_seq_len in (MAX_SEQ_LEN, 256):
        wrapper = RingCacheCausalLMExportableModule(eager, max_seq_len, sliding_window=WINDOW, layer_types=LAYERS)
        slots = [layer.keys.shape[2] for layer in wrapper.cache.layers]
        assert slots == [2 * WINDOW, max_seq_len, 2 * WINDOW]
        assert wrapper.max_chunk_len == WINDOW
    # A context no longer than the ring: every layer keeps every position, and a call takes a whole prompt.
    wrapper = RingCacheCausalLMExportableModule(eager, 16, sliding_window=WINDOW, layer_types=LAYERS)
    assert [layer.keys.shape[2] for layer in wrapper.cache.layers] == [16, 16, 16] and wrapper.max_chunk_len == 15


def test_export_records_the_hybrid_cache(exported):
    et_model, _, out = exported
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["export_config"] == "Gemma3TextExtension" and config["cache_layout"] == "hybrid"
    # ExecuTorch's runner contract: at most get_max_seq_len tokens a call, get_max_context_len in all.
    assert config["metadata"]["get_max_seq_len"] == WINDOW and config["metadata"]["get_max_context_len"] == MAX_SEQ_LEN
    assert config["metadata"]["get_sliding_window"] == WINDOW and config["custom_sdpa"] is True
    assert config["method_inputs"]["forward"][0]["shape"] == [1, f"seq_len 1..{WINDOW}"]
    assert et_model.max_seq_len == MAX_SEQ_LEN and et_model.max_chunk_len == WINDOW
    with pytest.raises(ValueError, match=f"at most {MAX_SEQ_LEN}"):
        et_model.generate(torch.ones((1, MAX_SEQ_LEN), dtype=torch.long), max_new_tokens=1)


def test_dry_run_and_the_static_ring_path(tmp_path):
    """The default is custom SDPA (rings in the attention modules); --no_custom_sdpa keeps the wrapper's rings and
    plain attention, also against eager past the window."""
    src = save_tiny_model("gemma3_text", tmp_path / "model", layer_types=LAYERS[:2], sliding_window=WINDOW)
    plan = main_export(src, tmp_path / "out", dry_run=True, max_seq_len=64).to_dict()
    assert plan["methods"]["forward"][0]["shape"] == [1, f"seq_len 1..{WINDOW}"]
    assert plan["settings"]["custom_sdpa"]["value"] is True
    out = main_export(src, tmp_path / "static", max_seq_len=MAX_SEQ_LEN, custom_sdpa=False)
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert model.executorch_config["custom_sdpa"] is False and model.max_chunk_len == WINDOW
    prompt = torch.tensor([[5, 17, 42, 99, 7, 123, 64, 33, 250, 8, 91, 12]])
    assert_generation_matches_eager(src, model, prompt, max_new_tokens=24, rtol=RTOL)
