"""The C++ runner engine (`engine="runner"`, ExecuTorch's `TextLLMRunner`) beside the Python engine, and
`optimum-cli executorch run`.

The runner's Python binding cannot pass on a token that ends inside a UTF-8 character, which a random
byte-level model produces all the time; the tiny model here is restricted to tokens that decode to whole
characters (zero lm_head rows for the others), so the two engines can be compared on any prompt.
"""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.tokenizer_check import PARITY_TEXTS, check_runner_tokenizer
from optimum_executorch.testing import (
    greedy_eager,
    keep_whole_character_tokens,
    save_tiny_model,
    save_tiny_sentencepiece_tokenizer,
    tiny_tokenizer,
)

from .conftest import answers_from_threads, run_cli

PROMPT = "The capital of France is"


def _export_whole_char_model(base, sentencepiece=False):
    src = save_tiny_model("llama", base / "src", with_tokenizer=not sentencepiece)
    tokenizer = save_tiny_sentencepiece_tokenizer(src) if sentencepiece else AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src)
    keep_whole_character_tokens(model, tokenizer)
    model.save_pretrained(src)
    main_export(src, base / "et", recipe="xnnpack", max_seq_len=64)
    return base / "src", base / "et"


@pytest.fixture(scope="module")
def whole_char_export(tmp_path_factory):
    return _export_whole_char_model(tmp_path_factory.mktemp("runner_engine"))


@pytest.mark.parametrize("chat", [False, True])
def test_runner_engine_generates_the_python_engine_text(whole_char_export, chat):
    src, export_dir = whole_char_export
    results = {}
    for engine in ("python", "runner"):
        model = ExecuTorchModelForCausalLM.from_pretrained(export_dir, engine=engine)
        pieces = []
        text, stats = model.generate_text(PROMPT, max_new_tokens=12, chat=chat, on_token=pieces.append)
        assert "".join(pieces) == text, engine
        results[engine] = (text, stats)
    (py_text, py_stats), (runner_text, runner_stats) = results["python"], results["runner"]
    assert runner_text == py_text and len(py_text) > 0
    assert runner_stats.prompt_tokens == py_stats.prompt_tokens
    assert runner_stats.new_tokens == py_stats.new_tokens
    assert runner_stats.engine == "runner" and py_stats.engine == "python"
    assert runner_stats.ttft_s >= 0 and py_stats.ttft_s > 0 and py_stats.decode_tokens_per_s > 0

    if not chat:  # and both are the eager model's greedy text
        tokenizer = AutoTokenizer.from_pretrained(src)
        ids = tokenizer(PROMPT, return_tensors="pt").input_ids
        eager = AutoModelForCausalLM.from_pretrained(src, attn_implementation="sdpa").eval()
        expected = greedy_eager(eager, ids, 12)
        assert py_text == tokenizer.decode(expected[0, ids.shape[1] :], skip_special_tokens=True)


def test_runner_engine_repeats_and_reports_load_once(whole_char_export):
    model = ExecuTorchModelForCausalLM.from_pretrained(whole_char_export[1], engine="runner")
    first, stats1 = model.generate_text(PROMPT, max_new_tokens=6)
    second, stats2 = model.generate_text(PROMPT, max_new_tokens=6)
    assert first == second  # the runner restarts its cache for each prompt
    assert stats1.load_s is not None and stats2.load_s is None
    # generate (token ids) still runs from Python on the same object.
    assert model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False).shape == (1, 6)


def test_runner_engine_from_several_threads_answers_as_from_one(whole_char_export):
    model = ExecuTorchModelForCausalLM.from_pretrained(whole_char_export[1], engine="runner")
    expected = model.generate_text(PROMPT, max_new_tokens=8)[0]
    answers = answers_from_threads(lambda: model.generate_text(PROMPT, max_new_tokens=8)[0], threads=4, calls_per_thread=2)
    assert answers == [expected] * 8


def test_engine_errors(whole_char_export, tmp_path):
    export_dir = whole_char_export[1]
    with pytest.raises(ValueError, match="Unknown engine 'cpp'"):
        ExecuTorchModelForCausalLM.from_pretrained(export_dir, engine="cpp")
    model = ExecuTorchModelForCausalLM.from_pretrained(export_dir, engine="runner")
    with pytest.raises(ValueError, match="non-empty string"):
        model.generate_text("")
    with pytest.raises(ValueError, match="at most 64"):
        model.generate_text("Paris " * 80)

    # No tokenizer file the runner reads: a clear error, not a crash inside the runner.
    bare = tmp_path / "bare"
    shutil.copytree(export_dir, bare)
    (bare / "tokenizer.json").unlink()
    model = ExecuTorchModelForCausalLM.from_pretrained(bare, engine="runner")
    with pytest.raises(FileNotFoundError, match="tokenizer.json or tokenizer.model"):
        model.generate_text(PROMPT)


def test_runner_engine_rejects_program_without_runner_metadata(whole_char_export, tmp_path):
    from optimum_executorch.exporters.convert import export_programs
    from optimum_executorch.exporters.recipes import get_recipe
    from optimum_executorch.exporters.wrappers.causal_lm import CausalLMExportableModule
    from optimum_executorch.testing import load_eager

    src, export_dir = whole_char_export
    eager = load_eager(src)
    wrapper = CausalLMExportableModule(eager, max_seq_len=32)
    metadata = {k: v for k, v in wrapper.metadata(eager.generation_config).items() if k != "get_max_seq_len"}
    program = get_recipe("xnnpack").lower(export_programs(wrapper), metadata)
    target = tmp_path / "no_metadata"
    shutil.copytree(export_dir, target)
    with open(target / "model.pte", "wb") as f:
        program.write_to_file(f)
    config = json.loads((target / "executorch_config.json").read_text())
    config.update(max_seq_len=32, kernel_libraries=[], custom_sdpa=False, checksums=None)
    (target / "executorch_config.json").write_text(json.dumps(config))

    model = ExecuTorchModelForCausalLM.from_pretrained(target, engine="runner")
    with pytest.raises(ValueError, match="lacks get_max_seq_len"):
        model.generate_text(PROMPT, max_new_tokens=4)
    # The Python engine reads the context length from executorch_config.json instead.
    assert ExecuTorchModelForCausalLM.from_pretrained(target).max_seq_len == 32


def test_cli_run_streams_text_and_stats(whole_char_export):
    export_dir = whole_char_export[1]
    outputs = {}
    for engine in ("python", "runner"):
        result = run_cli("executorch", "run", "--model", str(export_dir), "--prompt", PROMPT, "--max_new_tokens", "10",
                         "--engine", engine, check=True)
        outputs[engine] = result.stdout
        assert f"[{engine}] " in result.stderr and "decode" in result.stderr
        assert "Doing a warmup run" not in result.stderr + result.stdout  # native log lines hidden
    assert outputs["python"] == outputs["runner"] and outputs["python"].strip()

    chat = run_cli("executorch", "run", "-m", str(export_dir), "-p", "Hi", "--chat", "--max_new_tokens", "5", check=True)
    assert chat.stdout.strip()


def test_cli_run_errors(whole_char_export, tmp_path):
    result = run_cli("executorch", "run", "--model", str(tmp_path / "missing"), "--prompt", PROMPT)
    assert result.returncode == 2 and "is not a directory" in result.stderr
    result = run_cli("executorch", "run", "--model", str(whole_char_export[1]), "--prompt", PROMPT, "--max_tokens", "3")
    assert result.returncode != 0 and "--max_new_tokens" in result.stderr


def test_export_records_that_the_runner_tokenizes_alike(whole_char_export):
    record = json.loads((whole_char_export[1] / "executorch_config.json").read_text())["runner_tokenizer"]
    assert record["file"] == "tokenizer.json"
    assert record["matches"] and record["mismatched_texts"] == []
    assert record["texts"] == len(PARITY_TEXTS) + 1  # + the chat template's output
    assert record["special_tokens_agree"] and not record["adds_bos"]


def test_sentencepiece_model_runs_in_the_runner_from_tokenizer_model(tmp_path):
    """The runner cannot read a SentencePiece model's tokenizer.json (no Metaspace pre-tokenizer): the export
    ships the checkpoint's tokenizer.model, and the runner reads that."""
    _, export_dir = _export_whole_char_model(tmp_path, sentencepiece=True)
    assert (export_dir / "tokenizer.model").is_file()
    record = json.loads((export_dir / "executorch_config.json").read_text())["runner_tokenizer"]
    assert record["file"] == "tokenizer.model" and record["special_tokens_agree"]
    # One known difference, recorded: SentencePiece puts its "▁" prefix before a text that starts with a space;
    # transformers' Llama tokenizer does not.
    assert record["mismatched_texts"] == [t for t in PARITY_TEXTS if t[0].isspace()]

    texts = {}
    for engine in ("python", "runner"):
        model = ExecuTorchModelForCausalLM.from_pretrained(export_dir, engine=engine)
        texts[engine], _ = model.generate_text(PROMPT, max_new_tokens=10)
    assert texts["runner"] == texts["python"] and texts["python"].strip()


def test_tokenizer_check_flags_a_mismatched_tokenizer(tmp_path, caplog):
    tiny_tokenizer(300).save_pretrained(tmp_path)  # what the runner would read
    with caplog.at_level("WARNING"):
        record = check_runner_tokenizer(tiny_tokenizer(), tmp_path, {"get_eos_ids": [99]})
    assert not record["matches"] and record["first_mismatch"]["text"] == PARITY_TEXTS[0]
    assert "tokenizes differently" in caplog.text and repr(PARITY_TEXTS[0]) in caplog.text
    assert not record["special_tokens_agree"] and "get_eos_ids [99]" in record["special_token_problems"][0]

    empty = tmp_path / "empty"
    empty.mkdir()
    record = check_runner_tokenizer(tiny_tokenizer(), empty, {})
    assert record["file"] is None and "no tokenizer.json" in record["errors"][0]


def test_tokenizer_model_rebuilt_when_the_checkpoint_has_only_tokenizer_json(tmp_path):
    """A SentencePiece model whose checkpoint ships only tokenizer.json (which the runner cannot read): the
    export rebuilds tokenizer.model from it, and it tokenizes like the original SentencePiece model."""
    import sentencepiece

    original = tmp_path / "original"
    save_tiny_sentencepiece_tokenizer(original)
    src = save_tiny_model("llama", tmp_path / "src", with_tokenizer=False)
    AutoTokenizer.from_pretrained(original).save_pretrained(src)  # tokenizer.json + tokenizer_config.json only
    assert not (tmp_path / "src" / "tokenizer.model").exists()
    export_dir = main_export(src, tmp_path / "et", max_seq_len=32)

    record = json.loads((export_dir / "executorch_config.json").read_text())["runner_tokenizer"]
    assert record["file"] == "tokenizer.model"
    assert record["mismatched_texts"] == [t for t in PARITY_TEXTS if t[0].isspace()]  # the known difference only
    rebuilt = sentencepiece.SentencePieceProcessor(model_file=str(export_dir / "tokenizer.model"))
    reference = sentencepiece.SentencePieceProcessor(model_file=str(original / "tokenizer.model"))
    for text in PARITY_TEXTS:
        assert rebuilt.encode(text) == reference.encode(text), text
