"""lfm2, a built-in extension: short-convolution layers with a fixed-size state, against the eager model."""

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.extensions import find_extension
from optimum_executorch.exporters.extensions.lfm2 import ConvStateCausalLMExportableModule
from optimum_executorch.testing import assert_logits_close, keep_whole_character_tokens, load_eager, save_tiny_model

from .conftest import cell

LAYERS = ["conv", "full_attention", "conv"]


@cell("lfm2", "text-generation")
def test_conv_layers_match_eager(tmp_path):
    src = save_tiny_model("lfm2", tmp_path / "model", num_hidden_layers=3, layer_types=LAYERS)
    # Whole-character tokens only, so that ExecuTorch's C++ runner can stream the text too (test_runner_engine.py).
    model, tokenizer = AutoModelForCausalLM.from_pretrained(src), AutoTokenizer.from_pretrained(src)
    keep_whole_character_tokens(model, tokenizer)
    model.save_pretrained(src)
    out = main_export(src, tmp_path / "et", max_seq_len=48)
    et_model, eager = ExecuTorchModelForCausalLM.from_pretrained(out), load_eager(src)
    torch.manual_seed(0)
    prompt = torch.randint(7, 512, (1, 20))
    kwargs = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    expected = eager.generate(prompt, **kwargs)
    assert et_model.generate(prompt, **kwargs).tolist() == expected.tolist()
    # The convolution state restarts with each sequence.
    assert et_model.generate(prompt, **kwargs).tolist() == expected.tolist()
    with torch.no_grad():
        logits = eager(expected).logits
    for step in range(expected.shape[1]):  # one token a call: every step carries the state of the last ones
        actual = et_model(expected[:, step : step + 1], cache_position=torch.tensor([step])).logits
        assert_logits_close(actual, logits[:, step : step + 1], rtol=1e-4)
    for cut in (1, 2, 5):  # a prompt in two calls, the second shorter or longer than the kernel
        et_model(expected[:, :cut])
        actual = et_model(expected[:, cut:30], cache_position=torch.arange(cut, 30)).logits
        assert_logits_close(actual, logits[:, 29:30], rtol=1e-4)
    # ExecuTorch's C++ runner runs the same program (conv states included) to the same text.
    prompt = "The capital of France is"
    (py_text, _), (runner_text, _) = [
        ExecuTorchModelForCausalLM.from_pretrained(out, engine=engine).generate_text(prompt, max_new_tokens=12)
        for engine in ("python", "runner")
    ]
    assert runner_text == py_text and py_text
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["export_config"] == "Lfm2Extension" and config["cache_layout"] == "hybrid"
    assert config["metadata"]["get_conv_kernel_size"] == 3 and config["custom_sdpa"] is False


def test_conv_layers_keep_no_kv_cache(tmp_path):
    find_extension("lfm2")
    src = save_tiny_model("lfm2", tmp_path / "model", num_hidden_layers=3, layer_types=LAYERS)
    wrapper = ConvStateCausalLMExportableModule(load_eager(src), 256)
    assert [layer.keys.shape[2] for layer in wrapper.cache.layers] == [1, 256, 1]
    assert {i: tuple(s.shape) for i, s in wrapper.cache.conv_states.items()} == {0: (1, 64, 2), 2: (1, 64, 2)}
