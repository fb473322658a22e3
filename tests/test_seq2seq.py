"""text2text-generation (t5, bart): encoder + decoder methods, against eager transformers."""

import json
import logging

import pytest
import torch

from optimum.executorch import ExecuTorchModelForSeq2SeqLM, main_export
from optimum_executorch.testing import assert_logits_close, load_eager, save_tiny_model

from .conftest import answers_from_threads, cell, run_cli

MAX_SEQ_LEN = 32
# no_repeat_ngram_size keeps a random tiny model from repeating one token, so that every step is a real decision.
GREEDY = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, no_repeat_ngram_size=2)


MODEL_TYPES = ["t5", "bart"]


@pytest.fixture(scope="module", params=[pytest.param(m, marks=cell(m, "text2text-generation"), id=m) for m in MODEL_TYPES])
def exported(request, tmp_path_factory):
    model_type = request.param
    root = tmp_path_factory.mktemp(model_type)
    src = save_tiny_model(model_type, root / "model")
    if model_type == "bart":  # one family through the CLI, with the task named
        run_cli("export", "executorch", "--model", src, "--task", "text2text-generation", "--max_seq_len",
                str(MAX_SEQ_LEN), "--output_dir", str(root / "et"), check=True)  # fmt: skip
        out = root / "et"
    else:
        out = main_export(src, root / "et", max_seq_len=MAX_SEQ_LEN)  # task inferred from the config
    return ExecuTorchModelForSeq2SeqLM.from_pretrained(out), load_eager(src), out


def _prompt(length=9, seed=0):
    torch.manual_seed(seed)
    return torch.randint(3, 512, (1, length))


def test_greedy_tokens_match_eager(exported):
    et_model, eager, _ = exported
    for prompt in (_prompt(), _prompt(1, seed=1), _prompt(MAX_SEQ_LEN, seed=2)):
        expected = eager.generate(prompt, **GREEDY)
        assert et_model.generate(prompt, **GREEDY).tolist() == expected.tolist()
    # The program's cache restarts with each input: a second run gives the same tokens.
    assert et_model.generate(_prompt(), **GREEDY).tolist() == eager.generate(_prompt(), **GREEDY).tolist()


def test_one_model_from_several_threads_answers_as_from_one(exported):
    et_model, _, _ = exported
    prompts = [_prompt(seed=seed) for seed in range(3)]
    expected = [et_model.generate(p, **GREEDY).tolist() for p in prompts]
    counter = iter(range(10**6))

    def call():
        i = next(counter) % len(prompts)
        return i, et_model.generate(prompts[i], **GREEDY).tolist()

    answers = answers_from_threads(call, threads=4, calls_per_thread=3)
    assert all(not isinstance(a, Exception) and a[1] == expected[a[0]] for a in answers), answers


def test_every_decoder_step_matches_eager_logits(exported):
    et_model, eager, _ = exported
    prompt = _prompt()
    tokens = eager.generate(prompt, **GREEDY)
    with torch.no_grad():
        expected = eager(input_ids=prompt, decoder_input_ids=tokens).logits
    encoder_outputs = et_model.get_encoder()(input_ids=prompt)
    with torch.no_grad():
        assert_logits_close(encoder_outputs.last_hidden_state, eager.get_encoder()(input_ids=prompt).last_hidden_state)
    for step in range(tokens.shape[1]):
        actual = et_model(
            decoder_input_ids=tokens[:, step : step + 1], encoder_outputs=encoder_outputs, cache_position=torch.tensor([step])
        ).logits
        assert_logits_close(actual, expected[:, step : step + 1], rtol=1e-4)
    # Several decoder tokens in one call (a forced prefix) give the logits of the last one.
    actual = et_model(decoder_input_ids=tokens[:, :5], encoder_outputs=encoder_outputs).logits
    assert_logits_close(actual, expected[:, 4:5], rtol=1e-4)


def test_export_directory(exported):
    et_model, eager, out = exported
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["task"] == "text2text-generation" and config["methods"] == ["encoder", "decoder"]
    assert [i["name"] for i in config["method_inputs"]["decoder"]] == ["decoder_input_ids", "encoder_hidden_states", "cache_position"]
    assert config["metadata"]["get_decoder_start_token_id"] == eager.generation_config.decoder_start_token_id
    # The tied embedding (shared by encoder, decoder and LM head) is stored once, in model.ptd.
    assert config["weights_file"] == "model.ptd"
    params = sum(p.numel() for p in eager.parameters()) * 4  # parameters() lists a tied weight once
    assert (out / "model.ptd").stat().st_size < 1.02 * params


def test_limits_and_bad_inputs_raise_clear_errors(exported, caplog):
    et_model, _, _ = exported
    with pytest.raises(ValueError, match="at most 32"):
        et_model.generate(_prompt(MAX_SEQ_LEN + 1), max_new_tokens=2)
    with pytest.raises(ValueError, match="batch size 1"):
        et_model.generate(torch.ones((2, 4), dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        et_model.generate(torch.tensor([[5, 512]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="Beam search"):
        et_model.generate(_prompt(), max_new_tokens=2, num_beams=2)
    with pytest.raises(ValueError, match="Padding"):
        et_model.generate(_prompt(4), attention_mask=torch.tensor([[1, 1, 1, 0]]), max_new_tokens=2)
    with caplog.at_level(logging.WARNING):
        tokens = et_model.generate(_prompt(), max_new_tokens=100, min_new_tokens=100, do_sample=False)
    assert tokens.shape[1] == MAX_SEQ_LEN and "at most 31 new tokens" in caplog.text


def test_dry_run_plans_both_methods(tmp_path):
    src = save_tiny_model("t5", tmp_path / "model")
    plan = main_export(src, tmp_path / "out", dry_run=True).to_dict()
    assert plan["settings"]["task"]["value"] == "text2text-generation"
    assert plan["settings"]["max_seq_len"]["value"] == 512 and plan["settings"]["custom_sdpa"]["value"] is False
    assert plan["methods"]["encoder"] == [{"name": "input_ids", "dtype": "int64", "shape": [1, "enc_seq 1..512"]}]
    assert plan["methods"]["decoder"][1]["shape"] == [1, "enc_seq 1..512", 64]
    with pytest.raises(ValueError, match="custom_sdpa is not supported"):
        main_export(src, tmp_path / "out", custom_sdpa=True)
    # The portable recipe keeps a two-method program's weights inside it (ExecuTorch rejects one shared data file).
    plan = main_export(src, tmp_path / "out", recipe="portable", dry_run=True).to_dict()
    assert plan["settings"]["external_weights"]["value"] is False
    with pytest.raises(ValueError, match="InvalidExternalData"):
        main_export(src, tmp_path / "out", recipe="portable", external_weights=True, dry_run=True)


def _quantized(src, out, **options):
    from optimum_executorch.exporters.quantization import QuantizationSpec
    from optimum_executorch.exporters.quantizer import quantize

    out = main_export(src, out, max_seq_len=MAX_SEQ_LEN, **options)
    eager_q = load_eager(src)
    quantize(eager_q, QuantizationSpec(qlinear=options.get("qlinear"), qembedding=options.get("qembedding")))
    layers = json.loads((out / "executorch_config.json").read_text())["quantization"]["layers"]
    return ExecuTorchModelForSeq2SeqLM.from_pretrained(out), eager_q, layers


def test_quantized_export_matches_quantized_eager(tmp_path):
    src = save_tiny_model("t5", tmp_path / "model", num_layers=1, num_decoder_layers=1)  # one layer each: lowering time
    et_model, eager_q, layers = _quantized(src, tmp_path / "et", qlinear="8da8w")
    # Encoder layer: q, k, v, o, wi, wo; decoder layer: those plus cross-attention q, k, v, o; the LM head.
    assert layers == {"linear_per_channel": 6 + 10 + 1}
    prompt = _prompt()
    tokens = eager_q.generate(prompt, **GREEDY)
    assert et_model.generate(prompt, **GREEDY).tolist() == tokens.tolist()
    with torch.no_grad():
        expected = eager_q(input_ids=prompt, decoder_input_ids=tokens).logits[:, -1:]
    assert_logits_close(et_model(input_ids=prompt, decoder_input_ids=tokens).logits, expected, rtol=1e-4)
