"""Weights beside the program (`model.ptd`): a tied embedding / LM head is stored once.

Inside one `.pte`, a tied weight is stored twice: once as a program constant (the embedding lookup runs
outside XNNPACK) and once in the XNNPACK delegate (the LM head). In the external data file both are the
same bytes, stored once.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.testing import assert_generation_matches_eager, keep_whole_character_tokens, save_tiny_model

VOCAB = 4096  # a large embedding, so that storing it twice shows in the sizes
PROMPT = torch.tensor([[5, 17, 42, 99, 7, 123]])


def _parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # a tied weight counts once


def _program_bytes(export_dir) -> int:
    return sum((export_dir / name).stat().st_size for name in ("model.pte", "model.ptd") if (export_dir / name).exists())


@pytest.fixture(scope="module")
def tied_src(tmp_path_factory):
    src = save_tiny_model("llama", tmp_path_factory.mktemp("tied") / "src", vocab_size=VOCAB, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_pretrained(src)
    keep_whole_character_tokens(model, AutoTokenizer.from_pretrained(src))  # so that the runner can run it too
    model.save_pretrained(src)
    return src


def test_tied_weights_are_stored_once(tied_src, tmp_path):
    eager = AutoModelForCausalLM.from_pretrained(tied_src)
    assert eager.get_input_embeddings().weight is eager.get_output_embeddings().weight
    out = main_export(tied_src, tmp_path / "et", max_seq_len=48)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["weights_file"] == "model.ptd" and (out / "model.ptd").is_file()
    ratio = _program_bytes(out) / _parameter_bytes(eager)
    assert ratio < 1.05, f"program + weights are {ratio:.2f}x the parameter bytes"

    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert_generation_matches_eager(tied_src, model, PROMPT, max_new_tokens=12)
    # The C++ runner gets the weights file too.
    runner = ExecuTorchModelForCausalLM.from_pretrained(out, engine="runner")
    assert runner.generate_text("The capital", max_new_tokens=8)[0] == model.generate_text("The capital", max_new_tokens=8)[0]


def test_inline_weights_store_a_tied_weight_twice(tied_src, tmp_path):
    out = main_export(tied_src, tmp_path / "et", max_seq_len=48, external_weights=False)
    assert not (out / "model.ptd").exists()
    assert json.loads((out / "executorch_config.json").read_text())["weights_file"] is None
    eager = AutoModelForCausalLM.from_pretrained(tied_src)
    embedding_bytes = eager.get_input_embeddings().weight.numel() * 4
    assert _program_bytes(out) >= _parameter_bytes(eager) + 0.9 * embedding_bytes
    assert_generation_matches_eager(tied_src, ExecuTorchModelForCausalLM.from_pretrained(out), PROMPT, max_new_tokens=6)


def test_untied_model_keeps_one_file_unless_asked(tmp_path):
    src = save_tiny_model("llama", tmp_path / "src", vocab_size=VOCAB)
    out = main_export(src, tmp_path / "et", max_seq_len=48)
    assert not (out / "model.ptd").exists()
    ratio = _program_bytes(out) / _parameter_bytes(AutoModelForCausalLM.from_pretrained(src))
    assert ratio < 1.05

    external = main_export(src, tmp_path / "et_ext", max_seq_len=48, external_weights=True)
    assert (external / "model.ptd").is_file() and (external / "model.pte").stat().st_size < 200_000
    assert_generation_matches_eager(src, ExecuTorchModelForCausalLM.from_pretrained(external), PROMPT, max_new_tokens=6)

    (external / "model.ptd").unlink()
    with pytest.raises(FileNotFoundError, match="holds no model.ptd"):
        ExecuTorchModelForCausalLM.from_pretrained(external)
