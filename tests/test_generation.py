"""Runtime behaviour of ExecuTorchModelForCausalLM on the shared tiny llama export, against eager."""

import json
import tempfile

import pytest
import torch
from transformers import AutoTokenizer, StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer, pipeline

from optimum.executorch import ExecuTorchModelForCausalLM
from optimum_executorch.testing import assert_generation_matches_eager, assert_logits_close, greedy_eager, load_eager

PROMPT = torch.tensor([[5, 17, 42, 99, 7, 123]])


@pytest.fixture(scope="module")
def eager(tiny_llama_dir):
    return load_eager(tiny_llama_dir)


def test_greedy_prefill_and_decode_match_eager(tiny_llama_dir, et_model):
    assert_generation_matches_eager(tiny_llama_dir, et_model, PROMPT, max_new_tokens=20)


def test_program_metadata(et_model, tiny_llama_export):
    expected = {
        "get_max_seq_len": 64,
        "get_max_context_len": 64,
        "get_vocab_size": 512,
        "get_n_layers": 2,
        "get_bos_id": 1,
        "get_eos_ids": [2],
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
    }
    for name, value in expected.items():
        assert et_model.read_constant(name) == value, name
    config = json.loads((tiny_llama_export / "executorch_config.json").read_text())
    assert config["task"] == "text-generation" and config["recipe"] == "xnnpack"
    assert config["max_seq_len"] == 64 and config["methods"] == ["forward"]
    assert {"executorch", "torch", "transformers"} <= set(config["versions"])
    for name in ("model.pte", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_llama_export / name).is_file(), name


def test_sampling_is_seeded_and_matches_eager(et_model, eager):
    kwargs = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9, max_new_tokens=15)
    torch.manual_seed(123)
    first = et_model.generate(PROMPT, **kwargs)
    torch.manual_seed(123)
    second = et_model.generate(PROMPT, **kwargs)
    torch.manual_seed(123)
    with torch.no_grad():
        reference = eager.generate(PROMPT, **kwargs)
    assert first.tolist() == second.tolist() == reference.tolist()


def test_repetition_penalty_matches_eager(et_model, eager):
    kwargs = dict(do_sample=False, repetition_penalty=1.5, max_new_tokens=15)
    with torch.no_grad():
        reference = eager.generate(PROMPT, **kwargs)
    assert et_model.generate(PROMPT, **kwargs).tolist() == reference.tolist()


def test_stops_at_any_of_several_eos_ids(et_model, eager):
    full = greedy_eager(eager, PROMPT, 12)[0, PROMPT.shape[1] :].tolist()
    eos_ids = [2, full[4]]  # the fifth generated token becomes an end-of-sequence token
    kwargs = dict(max_new_tokens=12, eos_token_id=eos_ids, pad_token_id=0, do_sample=False)
    with torch.no_grad():
        expected = eager.generate(PROMPT, **kwargs)
    out = et_model.generate(PROMPT, **kwargs)
    assert out.tolist() == expected.tolist()
    assert out.shape[1] <= PROMPT.shape[1] + 5 and int(out[0, -1]) in eos_ids


def test_stopping_criteria_and_streamer(et_model, tiny_llama_export):
    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= PROMPT.shape[1] + 5, dtype=torch.bool)

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_export)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    out = et_model.generate(
        PROMPT, max_new_tokens=30, stopping_criteria=StoppingCriteriaList([StopAfter()]), streamer=streamer
    )
    assert out.shape[1] == PROMPT.shape[1] + 5
    streamed = "".join(streamer)
    assert streamed == tokenizer.decode(out[0, PROMPT.shape[1] :])


def test_pipeline_text_and_chat_match_eager(et_model, eager, tiny_llama_export):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_export)
    et_pipe = pipeline("text-generation", model=et_model, tokenizer=tokenizer)
    eager_pipe = pipeline("text-generation", model=eager, tokenizer=tokenizer)
    kwargs = dict(max_new_tokens=10, do_sample=False)
    assert et_pipe("The capital of France is", **kwargs) == eager_pipe("The capital of France is", **kwargs)
    chat = [{"role": "user", "content": "Where does ExecuTorch run?"}]
    et_chat = et_pipe(chat, **kwargs)[0]["generated_text"]
    assert et_chat == eager_pipe(chat, **kwargs)[0]["generated_text"]
    assert et_chat[-1]["role"] == "assistant"


def test_save_and_reload_round_trip(et_model, tmp_path):
    expected = et_model.generate(PROMPT, max_new_tokens=8, do_sample=False)
    et_model.save_pretrained(tmp_path / "copy")
    for name in ("model.pte", "config.json", "executorch_config.json", "tokenizer.json", "generation_config.json"):
        assert (tmp_path / "copy" / name).is_file(), name
    reloaded = ExecuTorchModelForCausalLM.from_pretrained(tmp_path / "copy")
    assert reloaded.generate(PROMPT, max_new_tokens=8, do_sample=False).tolist() == expected.tolist()


def test_long_prompt_in_one_forward_matches_eager(et_model, eager):
    prompt = torch.randint(3, 512, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = eager(prompt).logits[:, -1:]
    assert_logits_close(et_model(prompt).logits, expected)


def test_generation_stops_cleanly_at_the_context_limit(et_model, eager, caplog):
    prompt = torch.randint(3, 512, (1, 58), generator=torch.Generator().manual_seed(2))
    with caplog.at_level("WARNING"):
        out = et_model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert out.shape[1] == 64
    assert "at most 6 new tokens" in caplog.text
    assert out.tolist() == greedy_eager(eager, prompt, 6).tolist()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m.generate(torch.zeros((1, 64), dtype=torch.long), max_new_tokens=1), "re-export with a larger --max_seq_len"),
        (lambda m: m.generate(torch.tensor([[5, 512]]), max_new_tokens=2), "outside the vocabulary"),
        (lambda m: m(torch.tensor([[-1]])), "outside the vocabulary"),
        (lambda m: m.generate(torch.tensor([[5, 6], [7, 8]]), max_new_tokens=2), "batch size 1"),
        (lambda m: m.generate(PROMPT, num_beams=2, max_new_tokens=2), "num_beams=1"),
        (lambda m: m(torch.tensor([[5]]), cache_position=torch.tensor([64])), "beyond the 64"),
        (lambda m: m(PROMPT, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]])), "Padding is not supported"),
        (lambda m: m(PROMPT, cache_position=torch.arange(3)), "one position per token"),
    ],
    ids=["prompt-too-long", "id-too-large", "negative-id", "batch-2", "beam-search", "past-context", "padding",
         "positions-mismatch"],
)
def test_bad_runtime_input_raises_clear_error(et_model, call, message):
    with pytest.raises(ValueError, match=message):
        call(et_model)
    # The program still works afterwards.
    assert et_model.generate(PROMPT, max_new_tokens=2).shape[1] == PROMPT.shape[1] + 2


def test_push_to_hub_uploads_the_export_directory(et_model, monkeypatch):
    import huggingface_hub

    uploaded = {}

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        uploaded["repo"] = (repo_id, private, exist_ok)

    def upload_folder(self, repo_id, folder_path, commit_message=None, revision=None, create_pr=False, **kwargs):
        from pathlib import Path

        uploaded["files"] = sorted(p.name for p in Path(folder_path).iterdir())
        uploaded["commit"] = (commit_message, revision, create_pr)
        return f"https://huggingface.co/{repo_id}"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    assert et_model.push_to_hub("me/tiny-llama-et", private=True).endswith("me/tiny-llama-et")
    assert uploaded["repo"] == ("me/tiny-llama-et", True, True)
    assert {"model.pte", "config.json", "executorch_config.json", "tokenizer.json"} <= set(uploaded["files"])
    assert uploaded["commit"] == ("Upload ExecuTorch model", None, False)
    # transformers' signature: commit message, branch, pull request; and save_pretrained(push_to_hub=True).
    et_model.push_to_hub("me/tiny-llama-et", commit_message="v2", revision="dev", create_pr=True)
    assert uploaded["commit"] == ("v2", "dev", True)
    with tempfile.TemporaryDirectory() as directory:
        et_model.save_pretrained(directory, push_to_hub=True, repo_id="me/saved", commit_message="saved")
    assert uploaded["repo"][0] == "me/saved" and uploaded["commit"][0] == "saved"


def test_repr_names_program_task_recipe_and_methods(et_model):
    assert repr(et_model) == (
        f"ExecuTorchModelForCausalLM(program='{et_model.model_save_dir}', task='text-generation', "
        "recipe='xnnpack', methods=['forward'])"
    )


def test_from_pretrained_with_export_true_exports_on_the_fly(tiny_llama_dir, tmp_path):
    model = ExecuTorchModelForCausalLM.from_pretrained(tiny_llama_dir, export=True, max_seq_len=32, recipe="portable")
    assert model.max_seq_len == 32 and model.executorch_config["recipe"] == "portable"
    assert_generation_matches_eager(tiny_llama_dir, model, PROMPT, max_new_tokens=10)
    model.save_pretrained(tmp_path / "saved")  # the temporary export can be kept
    assert ExecuTorchModelForCausalLM.from_pretrained(tmp_path / "saved").max_seq_len == 32
