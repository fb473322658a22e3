"""automatic-speech-recognition (whisper): encoder + decoder methods under Whisper's generation, against eager."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoFeatureExtractor, AutoProcessor, AutoTokenizer, WhisperForConditionalGeneration, pipeline

from optimum.executorch import ExecuTorchModelForSeq2SeqLM, ExecuTorchModelForSpeechSeq2Seq, main_export
from optimum_executorch.testing import TINY_WHISPER_CHUNK_SECONDS, assert_logits_close, save_tiny_whisper

from .conftest import answers_from_threads, cell, run_cli

MAX_SEQ_LEN = 48  # below the tiny model's 64 decoder positions: the program's limit is what generation obeys
SAMPLING_RATE = 16000
# no_repeat_ngram_size keeps a random tiny model from repeating one token, so that every step is a real decision.
GREEDY = dict(max_new_tokens=12, do_sample=False, no_repeat_ngram_size=2)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    src = save_tiny_whisper(root / "model")
    run_cli("export", "executorch", "--model", src, "--task", "automatic-speech-recognition", "--max_seq_len",
            str(MAX_SEQ_LEN), "--output_dir", str(root / "et"), check=True)  # fmt: skip
    eager = WhisperForConditionalGeneration.from_pretrained(src, attn_implementation="sdpa").eval()
    return ExecuTorchModelForSpeechSeq2Seq.from_pretrained(root / "et"), eager, root / "et"


def _audio(seconds=1.0, seed=0):
    return (np.random.RandomState(seed).randn(int(seconds * SAMPLING_RATE)) * 0.1).astype(np.float32)


def _features(out, seconds=1.0, seed=0):
    extractor = AutoFeatureExtractor.from_pretrained(out)
    return extractor(_audio(seconds, seed), sampling_rate=SAMPLING_RATE, return_tensors="pt").input_features


@cell("whisper", "automatic-speech-recognition")
@pytest.mark.parametrize(
    "options",
    [{"language": "en"}, {}, {"language": "fr", "task": "translate"}, {"return_timestamps": True}],
    ids=["english", "detected-language", "translate", "timestamps"],
)
def test_generate_matches_eager(exported, options):
    et_model, eager, out = exported
    for seed in (0, 1):
        features = _features(out, seed=seed)
        expected = eager.generate(features, **GREEDY, **options)
        assert et_model.generate(features, **GREEDY, **options).tolist() == expected.tolist()


def test_one_model_from_several_threads_answers_as_from_one(exported):
    et_model, _, out = exported
    inputs = [_features(out, seed=seed) for seed in range(2)]
    expected = [et_model.generate(f, **GREEDY, language="en").tolist() for f in inputs]
    counter = iter(range(10**6))

    def call():
        i = next(counter) % len(inputs)
        return i, et_model.generate(inputs[i], **GREEDY, language="en").tolist()

    answers = answers_from_threads(call, threads=4, calls_per_thread=2)
    assert all(not isinstance(a, Exception) and a[1] == expected[a[0]] for a in answers), answers


def test_generation_stops_within_the_program(exported):
    et_model, eager, out = exported
    features = _features(out, seed=2)
    kwargs = dict(language="en", do_sample=False, no_repeat_ngram_size=2, suppress_tokens=[eager.config.eos_token_id])
    tokens = et_model.generate(features, **kwargs)
    # The program holds 48 decoder positions (the tiny model 64): Whisper's generation stops at 48, the 4 start
    # tokens included, and gives what the eager model gives under the same limit.
    assert tokens.shape[1] == MAX_SEQ_LEN - 4
    limit, eager.config.max_target_positions = eager.config.max_target_positions, MAX_SEQ_LEN
    try:
        assert tokens.tolist() == eager.generate(features, **kwargs).tolist()
    finally:
        eager.config.max_target_positions = limit


def test_encoder_and_every_decoder_step_match_eager_logits(exported):
    et_model, eager, out = exported
    features = _features(out)
    sequence = torch.tensor([[eager.generation_config.decoder_start_token_id, 5, 17, 33, 101, 250]])
    with torch.no_grad():
        expected_hidden = eager.get_encoder()(input_features=features).last_hidden_state
        expected = eager(input_features=features, decoder_input_ids=sequence).logits
    encoder_outputs = et_model.get_encoder()(input_features=features)
    assert_logits_close(encoder_outputs.last_hidden_state, expected_hidden, rtol=1e-4)
    for step in range(sequence.shape[1]):
        actual = et_model(
            decoder_input_ids=sequence[:, step : step + 1], encoder_outputs=encoder_outputs, cache_position=torch.tensor([step])
        ).logits
        assert_logits_close(actual, expected[:, step : step + 1], rtol=1e-4)
    # The forced start tokens in one call give the logits of the last one.
    assert_logits_close(et_model(input_features=features, decoder_input_ids=sequence[:, :4]).logits, expected[:, 3:4], rtol=1e-4)


@pytest.mark.parametrize("seconds", [1.0, 2.0 * TINY_WHISPER_CHUNK_SECONDS + 1], ids=["short", "long-form"])
def test_pipeline_from_the_export_directory_matches_eager(exported, seconds):
    et_model, eager, out = exported
    tokenizer, extractor = AutoTokenizer.from_pretrained(out), AutoFeatureExtractor.from_pretrained(out)
    asr = pipeline("automatic-speech-recognition", model=et_model, tokenizer=tokenizer, feature_extractor=extractor)
    reference = pipeline("automatic-speech-recognition", model=eager, tokenizer=tokenizer, feature_extractor=extractor)
    audio = _audio(seconds, seed=3)
    generate_kwargs = dict(GREEDY, language="en")
    # The pipeline's default of 5 beams does not apply: the program's generation config says 1.
    assert asr(audio, generate_kwargs=generate_kwargs) == reference(audio, generate_kwargs=dict(generate_kwargs, num_beams=1))
    expected = reference(audio, generate_kwargs=dict(generate_kwargs, num_beams=1), return_timestamps=True)
    assert asr(audio, generate_kwargs=generate_kwargs, return_timestamps=True) == expected


def test_export_directory(exported):
    et_model, eager, out = exported
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["task"] == "automatic-speech-recognition" and config["methods"] == ["encoder", "decoder"]
    assert config["method_inputs"]["encoder"] == [{"name": "input_features", "dtype": "float32", "shape": [1, 80, 200]}]
    assert config["method_inputs"]["decoder"][1]["shape"] == [1, 100, 64]
    assert config["metadata"]["get_num_frames"] == 200 and config["metadata"]["get_max_seq_len"] == MAX_SEQ_LEN
    assert config["metadata"]["get_decoder_start_token_id"] == eager.generation_config.decoder_start_token_id
    # Tokenizer and feature extractor are saved: the processor loads from the output directory alone.
    processor = AutoProcessor.from_pretrained(out)
    assert processor.feature_extractor.nb_max_frames == 200 and len(processor.tokenizer) == eager.config.vocab_size
    with pytest.raises(ValueError, match="automatic-speech-recognition"):
        ExecuTorchModelForSeq2SeqLM.from_pretrained(out)
    # The program's limit applies while generating; the saved config stays the model's.
    et_model.save_pretrained(out.parent / "saved")
    saved = json.loads((out.parent / "saved" / "config.json").read_text())
    assert saved["max_target_positions"] == eager.config.max_target_positions == 64


def test_bad_inputs_raise_clear_errors(exported):
    et_model, _, out = exported
    features = _features(out)
    with pytest.raises(ValueError, match=r"takes \[1, 80, 200\]"):
        et_model(input_features=features[:, :, :100], decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="float log-mel features"):
        et_model.get_encoder()(input_features=torch.ones((1, 5), dtype=torch.long))
    with pytest.raises(ValueError, match="batch size 1"):
        et_model.generate(torch.cat([features, features]), max_new_tokens=2)
    with pytest.raises(ValueError, match="80"):
        et_model.generate(features[:, :40], max_new_tokens=2)
    with pytest.raises(ValueError, match="Beam search"):
        et_model.generate(features, max_new_tokens=2, num_beams=2)
    with pytest.raises(ValueError, match="re-export with a larger --max_seq_len"):
        et_model.generate(features, max_new_tokens=MAX_SEQ_LEN)
    asr = pipeline("automatic-speech-recognition", model=et_model, tokenizer=AutoTokenizer.from_pretrained(out),
                   feature_extractor=AutoFeatureExtractor.from_pretrained(out))  # fmt: skip
    with pytest.raises(ValueError, match="cross-attention weights"):
        asr(_audio(), return_timestamps="word")


def test_dry_run_plans_static_encoder(tmp_path):
    src = save_tiny_whisper(tmp_path / "model")
    plan = main_export(src, tmp_path / "out", dry_run=True).to_dict()
    assert plan["settings"]["task"]["value"] == "automatic-speech-recognition"
    assert plan["settings"]["max_seq_len"]["value"] == 64  # the model's max_target_positions
    assert plan["methods"]["encoder"] == [{"name": "input_features", "dtype": "float32", "shape": [1, 80, 200]}]
    assert plan["methods"]["decoder"][0]["shape"] == [1, "seq 1..63"]


def test_quantized_export_matches_eager_quantized_the_same_way(tmp_path):
    """`--qlinear` applies to speech models through the same options: 8da8w linears, as eager quantized alike."""
    from optimum_executorch.exporters.quantization import QuantizationSpec
    from optimum_executorch.exporters.quantizer import quantize

    src = save_tiny_whisper(tmp_path / "model", encoder_layers=1, decoder_layers=1)  # one layer each: lowering time
    out = main_export(src, tmp_path / "et", qlinear="8da8w")
    eager_q = WhisperForConditionalGeneration.from_pretrained(src, attn_implementation="sdpa").eval()
    quantize(eager_q, QuantizationSpec(qlinear="8da8w"))
    layers = json.loads((out / "executorch_config.json").read_text())["quantization"]["layers"]
    # Encoder layer: q, k, v, out, fc1, fc2; decoder layer: those plus cross-attention q, k, v, out; proj_out.
    assert layers == {"linear_per_channel": 6 + 10 + 1}
    et_model = ExecuTorchModelForSpeechSeq2Seq.from_pretrained(out)
    features = _features(out)
    hidden = et_model.get_encoder()(input_features=features).last_hidden_state
    with torch.no_grad():
        expected_hidden = eager_q.get_encoder()(input_features=features).last_hidden_state
    # The encoder's int8 activations round a few values differently from torchao's reference (measured 1.9e-3 of
    # the largest value, against 2e-2 of quantization error from fp32), so its bound is a quality bound.
    assert_logits_close(hidden, expected_hidden, rtol=1e-2)
    # Given the same encoder output, every decoder step computes what eager does.
    tokens = eager_q.generate(features, language="en", return_dict_in_generate=True, **GREEDY).sequences
    with torch.no_grad():
        expected = eager_q(encoder_outputs=(hidden,), decoder_input_ids=tokens).logits
    actual = torch.cat([et_model(decoder_input_ids=tokens[:, i : i + 1], encoder_outputs=(hidden,),
                                 cache_position=torch.tensor([i])).logits for i in range(tokens.shape[1])], dim=1)  # fmt: skip
    assert_logits_close(actual, expected, rtol=1e-4)
