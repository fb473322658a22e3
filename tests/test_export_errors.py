"""Bad export input: a clear error that names the fix, raised early, and nothing half-written."""

import gc
import json
import shutil

import pytest
from transformers import GPTJConfig

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.recipes.base import Recipe


def _no_partial_dirs(parent):
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name] == []


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"task": "text-generatoin"}, ValueError, "Did you mean 'text-generation'"),
        ({"task": "image-to-pizza"}, ValueError, "Supported tasks: automatic-speech-recognition, feature-extraction, fill-mask"),
        ({"max_seq_length": 128}, TypeError, "Did you mean 'max_seq_len'"),
        ({"recipe": "xnnpak"}, ValueError, "Did you mean 'xnnpack'"),
        ({"dtype": "float64"}, ValueError, "Choose one of: float32, float16, bfloat16"),
        ({"dtype": "bfloat16", "recipe": "xnnpack"}, ValueError, "does not support dtype 'bfloat16'"),
        ({"max_seq_len": 1}, ValueError, "max_seq_len must be an integer >= 2"),
        ({"max_seq_len": 4096}, ValueError, "exceeds the 256 positions this model can take"),
    ],
)
def test_bad_option_is_rejected_before_writing(tiny_llama_dir, tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        main_export(tiny_llama_dir, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()
    assert _no_partial_dirs(tmp_path)


def test_unsupported_model_type_lists_supported(tmp_path):
    GPTJConfig(n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path / "gptj")
    with pytest.raises(ValueError, match=r"model_type 'gptj' is not supported.*Supported model types: .*bert.*llama"):
        main_export(tmp_path / "gptj", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_model_names_the_fix(tmp_path, monkeypatch):
    with pytest.raises(OSError, match="No such directory"):
        main_export(tmp_path / "does-not-exist", tmp_path / "out")
    # A Hub id that is not in the cache, with downloads off (HF_HUB_OFFLINE=1 in the tests).
    with pytest.raises(OSError, match="Could not load a model config from 'nobody/no-such-model'"):
        main_export("nobody/no-such-model", tmp_path / "out")
    with pytest.raises(OSError, match="nor download it from the Hugging Face Hub"):
        ExecuTorchModelForCausalLM.from_pretrained("nobody/no-such-model")
    assert not (tmp_path / "out").exists()


def test_non_empty_output_dir_is_refused_unless_overwrite(tiny_llama_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(FileExistsError, match="Pass --overwrite"):
        main_export(tiny_llama_dir, out, max_seq_len=16)
    assert (out / "keep.txt").read_text() == "user data"

    main_export(tiny_llama_dir, out, max_seq_len=16, overwrite=True)
    assert not (out / "keep.txt").exists()
    assert json.loads((out / "executorch_config.json").read_text())["max_seq_len"] == 16
    assert ExecuTorchModelForCausalLM.from_pretrained(out).max_seq_len == 16
    assert _no_partial_dirs(tmp_path)


def test_failed_lowering_leaves_nothing_behind(tiny_llama_dir, tmp_path, monkeypatch):
    seen = []

    def fail(self, programs, constant_methods, **kwargs):
        seen.append(gc.get_threshold())
        raise RuntimeError("lowering failed on purpose")

    monkeypatch.setattr(Recipe, "lower", fail)
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="on purpose"):
        main_export(tiny_llama_dir, tmp_path / "out", max_seq_len=16)
    assert list(tmp_path.iterdir()) == []
    # The export runs with fewer garbage collections (convert.py) and gives the process its thresholds back.
    assert seen[0][0] >= 100_000 and gc.get_threshold() == before


def test_failed_write_leaves_previous_output_intact(tiny_llama_export, tmp_path):
    from optimum_executorch.exporters.output_dir import write_output

    out = tmp_path / "out"
    shutil.copytree(tiny_llama_export, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def write_then_fail(directory):
        (directory / "model.pte").write_bytes(b"half")
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        write_output(out, True, write_then_fail)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _no_partial_dirs(tmp_path)


def test_missing_and_corrupt_program_give_clear_errors(tiny_llama_export, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="No ExecuTorch program"):
        ExecuTorchModelForCausalLM.from_pretrained(empty)

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_llama_export, corrupt)
    (corrupt / "model.pte").write_bytes(b"not a program" * 100)
    with pytest.raises(ValueError, match="is not an ExecuTorch program"):
        ExecuTorchModelForCausalLM.from_pretrained(corrupt)

    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_llama_export, truncated)
    data = (tiny_llama_export / "model.pte").read_bytes()
    (truncated / "model.pte").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="is truncated"):
        ExecuTorchModelForCausalLM.from_pretrained(truncated)


def test_export_options_without_export_flag_are_rejected(tiny_llama_export):
    with pytest.raises(TypeError, match="export=True"):
        ExecuTorchModelForCausalLM.from_pretrained(tiny_llama_export, max_seq_len=32)
