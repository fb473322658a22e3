"""Encoder tasks (fill-mask, feature-extraction, text- and token-classification) against eager transformers."""

import json

import pytest
import torch
import transformers
from transformers import AutoTokenizer, pipeline

import optimum_executorch.modeling as runtime
from optimum.executorch import main_export
from optimum_executorch.exporters.tasks import get_task
from optimum_executorch.testing import assert_logits_close, save_tiny_encoder

from .conftest import cell

TEXTS = ["the capital of france is [MASK].", "a phone", "executorch runs [MASK] programs on mobile devices."]

CASES = [
    ("bert", "fill-mask"),
    ("bert", "feature-extraction"),
    ("bert", "text-classification"),
    ("bert", "token-classification"),
    ("roberta", "fill-mask"),
    ("roberta", "text-classification"),
    ("distilbert", "fill-mask"),
    ("distilbert", "token-classification"),
    ("albert", "fill-mask"),
    ("mobilebert", "fill-mask"),
    ("xlm-roberta", "feature-extraction"),
    # The rest of the matrix (every listed model_type for every encoder task).
    ("xlm-roberta", "fill-mask"),
    ("roberta", "feature-extraction"),
    ("roberta", "token-classification"),
    ("distilbert", "feature-extraction"),
    ("distilbert", "text-classification"),
]


def _export(tmp_path_factory, model_type, task, **options):
    root = tmp_path_factory.mktemp(f"{model_type}-{task}")
    src = save_tiny_encoder(model_type, root / "model", task=task)
    out = main_export(src, root / "et", task=task, max_seq_len=32, **options)
    spec = get_task(task)
    et_model = getattr(runtime, spec.runtime_class).from_pretrained(out)
    eager = getattr(transformers, spec.auto_model_class).from_pretrained(src, attn_implementation="sdpa").eval()
    return et_model, eager, AutoTokenizer.from_pretrained(out), spec


@pytest.fixture(scope="module", params=[pytest.param(case, marks=cell(*case), id="-".join(case)) for case in CASES])
def exported(request, tmp_path_factory):
    return _export(tmp_path_factory, *request.param)


def _compare(et_model, eager, spec, inputs, rtol=1e-4):
    with torch.no_grad():
        expected = eager(**inputs)[spec.output_name]
    actual = et_model(**inputs)[spec.output_name]
    assert actual.shape == expected.shape
    if actual.dim() == 3:  # per token: padded positions are not compared (they are garbage in both)
        mask = inputs["attention_mask"].bool()
        actual, expected = actual[mask], expected[mask]
    return assert_logits_close(actual, expected, rtol)


def _inputs(et_model, tokenizer, texts, **kwargs):
    batch = tokenizer(texts, padding=True, return_tensors="pt", **kwargs)
    return {k: v for k, v in batch.items() if k in et_model.input_names}


def test_padded_batch_matches_eager(exported):
    et_model, eager, tokenizer, spec = exported
    inputs = _inputs(et_model, tokenizer, TEXTS)
    assert 0 in inputs["attention_mask"]  # the batch is padded: the mask must be honoured
    _compare(et_model, eager, spec, inputs)


def test_other_lengths_and_batch_sizes_match_eager(exported):
    et_model, eager, tokenizer, spec = exported
    for texts, length in ((TEXTS[:1], 1), (TEXTS[:1], 32), (TEXTS[1:2], None), (TEXTS * 2, None)):
        inputs = _inputs(et_model, tokenizer, texts, truncation=length is not None, max_length=length)
        if length == 32:
            inputs = {k: torch.nn.functional.pad(v, (0, 32 - v.shape[1]), value=int(k != "token_type_ids"))
                      for k, v in inputs.items()}
            inputs["input_ids"][:, -5:] = 7  # a full-length sequence of real tokens
        _compare(et_model, eager, spec, inputs)


def test_pipeline_matches_eager_pipeline(exported):
    et_model, eager, tokenizer, spec = exported
    text = TEXTS[0] if spec.name == "fill-mask" else TEXTS[2].replace("[MASK]", "pytorch")
    actual = pipeline(spec.name, model=et_model, tokenizer=tokenizer)(text)
    expected = pipeline(spec.name, model=eager, tokenizer=tokenizer)(text)
    if spec.name == "feature-extraction":
        assert_logits_close(torch.tensor(actual), torch.tensor(expected))
        return
    key = {"fill-mask": "token", "text-classification": "label", "token-classification": "entity"}[spec.name]
    assert [r[key] for r in actual] == [r[key] for r in expected]
    assert [float(r["score"]) for r in actual] == pytest.approx([float(r["score"]) for r in expected], abs=1e-4)


def test_export_records_inputs_and_task(exported):
    et_model, eager, tokenizer, spec = exported
    config = json.loads((et_model.model_save_dir / "executorch_config.json").read_text())
    assert config["task"] == spec.name and config["methods"] == ["forward"]
    segments = getattr(eager.config, "type_vocab_size", 0) > 1  # distilbert has none
    assert config["inputs"] == ["input_ids", "attention_mask"] + (["token_type_ids"] if segments else [])
    assert et_model.read_constant("get_max_seq_len") == 32


@pytest.fixture(scope="module")
def bert_fill_mask(tmp_path_factory):
    return _export(tmp_path_factory, "bert", "fill-mask")


def test_sentence_pair_segments_reach_the_program(tmp_path_factory):
    et_model, eager, tokenizer, spec = _export(tmp_path_factory, "bert", "text-classification")
    inputs = _inputs(et_model, tokenizer, [["a phone", "a server"]])
    assert inputs["token_type_ids"].any()
    _compare(et_model, eager, spec, inputs)


@pytest.mark.parametrize(
    "make_inputs, message",
    [
        (lambda ids: {"input_ids": torch.zeros((1, 33), dtype=torch.long)}, "at most 32"),
        (lambda ids: {"pixel_values": torch.zeros((1, 3, 8, 8))}, "takes input_ids"),
        (lambda ids: {"input_ids": torch.zeros((1, 3, 8, 8))}, "2D tensor of token ids"),
        (lambda ids: {"input_ids": ids.float()}, "integer token ids"),
        (lambda ids: {"input_ids": torch.tensor([[2, 500, 3]])}, "outside the vocabulary"),
        (lambda ids: {"input_ids": ids, "attention_mask": torch.ones((1, 2), dtype=torch.long)}, "must match input_ids"),
        (lambda ids: {"input_ids": torch.tensor([[2, 9, 3], [2, 3, 0]])}, "no attention_mask was passed"),
    ],
    ids=["too-long", "image-input", "3d-input", "float-ids", "id-outside-vocab", "mask-shape", "padded-without-mask"],
)
def test_bad_input_raises_clear_error(bert_fill_mask, make_inputs, message):
    et_model = bert_fill_mask[0]
    with pytest.raises(ValueError, match=message):
        et_model(**make_inputs(torch.tensor([[2, 9, 10, 3]])))


def test_model_without_segments_rejects_segment_ids(tmp_path):
    src = save_tiny_encoder("roberta", tmp_path / "model", type_vocab_size=1)  # as the real RoBERTa checkpoints
    et_model = runtime.ExecuTorchModelForMaskedLM.from_pretrained(main_export(src, tmp_path / "et", max_seq_len=16))
    assert et_model.input_names == ["input_ids", "attention_mask"]
    with pytest.raises(ValueError, match="token_type_ids must be all zeros"):
        et_model(torch.tensor([[0, 9, 2]]), token_type_ids=torch.tensor([[0, 1, 1]]))


def test_task_is_inferred_from_the_architecture(tmp_path):
    src = save_tiny_encoder("bert", tmp_path / "model", task="token-classification")
    out = main_export(src, tmp_path / "et", max_seq_len=16)
    assert json.loads((out / "executorch_config.json").read_text())["task"] == "token-classification"


def test_encoder_export_errors(tmp_path):
    src = save_tiny_encoder("bert", tmp_path / "model", task="fill-mask")
    with pytest.raises(ValueError, match="custom_sdpa is not supported"):
        main_export(src, tmp_path / "a", custom_sdpa=True)
    with pytest.raises(ValueError, match="128 positions"):
        main_export(src, tmp_path / "b", max_seq_len=1024)
    with pytest.raises(ValueError, match="supported: feature-extraction, fill-mask"):
        main_export(src, tmp_path / "c", task="text-generation")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_quantized_encoder_agrees_with_fp32(tmp_path_factory):
    """8da8w linears: the quantized program's top-1 predictions agree with the fp32 eager model's."""
    et_model, eager, tokenizer, spec = _export(tmp_path_factory, "bert", "fill-mask", qlinear="8da8w")
    inputs = _inputs(et_model, tokenizer, TEXTS)
    with torch.no_grad():
        expected = eager(**inputs).logits
    actual = et_model(**inputs).logits
    mask = inputs["attention_mask"].bool()
    agreement = float((actual.argmax(-1) == expected.argmax(-1))[mask].float().mean())
    assert agreement >= 0.9, f"top-1 agreement {agreement:.2f} below 0.9"
    assert json.loads((et_model.model_save_dir / "executorch_config.json").read_text())["quantization"]["qlinear"] == "8da8w"


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_decoder_lm_last_hidden_state(tmp_path, model_type):
    """feature-extraction on a decoder-only LM: its last hidden state for a padded batch (either padding side)."""
    from optimum_executorch.testing import save_tiny_model

    src = save_tiny_model(model_type, tmp_path / "model")
    out = main_export(src, tmp_path / "et", task="feature-extraction", max_seq_len=32)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["custom_sdpa"] is False and config["inputs"] == ["input_ids", "attention_mask"]
    et_model = runtime.ExecuTorchModelForFeatureExtraction.from_pretrained(out)
    eager = transformers.AutoModel.from_pretrained(src, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    for side in ("right", "left"):
        tokenizer.padding_side = side
        batch = tokenizer(["The capital of France is Paris.", "A phone"], padding=True, return_tensors="pt")
        assert 0 in batch["attention_mask"]
        with torch.no_grad():
            expected = eager(**batch).last_hidden_state
        mask = batch["attention_mask"].bool()
        assert_logits_close(et_model(**batch).last_hidden_state[mask], expected[mask], rtol=1e-4)
    text = "Once upon a time"
    actual = pipeline("feature-extraction", model=et_model, tokenizer=tokenizer)(text)
    expected = pipeline("feature-extraction", model=eager, tokenizer=tokenizer)(text)
    assert_logits_close(torch.tensor(actual), torch.tensor(expected), rtol=1e-4)
