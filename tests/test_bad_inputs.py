"""Hostile input that once deleted data, aborted the process or answered silently wrong (issue 33).

Each case gets an error that names the problem and the fix, and loses nothing. Other modules keep the
bad inputs of their own area (test_export_errors.py, test_generation.py, test_runner_engine.py, ...).
"""

import os
import shutil
import struct

import pytest
import torch

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.modeling.program_files import CorruptProgramError

from .conftest import answers_from_threads, run_cli


def _snapshot(directory):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ output over the source
@pytest.mark.parametrize("where", ["source", "inside", "parent"])
def test_output_over_the_checkpoint_is_refused_and_the_checkpoint_kept(tiny_llama_dir, tmp_path, where):
    source = tmp_path / "checkpoint"
    shutil.copytree(tiny_llama_dir, source)
    before = _snapshot(tmp_path)
    out = {"source": source, "inside": source / "et", "parent": tmp_path}[where]
    relation = {"source": "is", "inside": "lies inside", "parent": "contains"}[where]
    with pytest.raises(ValueError, match=f"--output_dir .* {relation} the model checkpoint"):
        main_export(source, out, overwrite=True, max_seq_len=16)
    assert _snapshot(tmp_path) == before


def test_output_over_the_working_directory_or_hub_cache_is_refused(tiny_llama_dir, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("keep me")
    monkeypatch.chdir(work)
    for out in (".", str(tmp_path)):
        with pytest.raises(ValueError, match="the working directory"):
            main_export(tiny_llama_dir, out, overwrite=True, max_seq_len=16)
    with pytest.raises(ValueError, match="No output directory given"):
        main_export(tiny_llama_dir, "", overwrite=True, max_seq_len=16)
    cache = tmp_path / "hub_cache"
    cache.mkdir()
    with pytest.raises(ValueError, match="lies inside the Hugging Face cache"):
        main_export(tiny_llama_dir, cache / "et", cache_dir=str(cache), max_seq_len=16)
    assert (work / "notes.txt").read_text() == "keep me"


def test_cli_export_onto_its_own_checkpoint_exits_with_the_reason(tiny_llama_dir, tmp_path):
    source = tmp_path / "checkpoint"
    shutil.copytree(tiny_llama_dir, source)
    before = _snapshot(source)
    result = run_cli("export", "executorch", "-m", str(source), "-o", str(source), "--overwrite")
    assert result.returncode != 0
    assert "is the model checkpoint" in result.stderr.strip().splitlines()[-1]
    assert _snapshot(source) == before


# --------------------------------------------------------------------------------- damaged programs
def _copy_export(export, tmp_path, name):
    out = tmp_path / name
    shutil.copytree(export, out)
    return out


def test_random_bytes_program_raises_instead_of_aborting(tiny_llama_export, tmp_path):
    out = _copy_export(tiny_llama_export, tmp_path, "random")
    (out / "model.pte").write_bytes(os.urandom(20_000))
    with pytest.raises(CorruptProgramError, match="is not an ExecuTorch program"):
        ExecuTorchModelForCausalLM.from_pretrained(out)
    for command in (("executorch", "run", "-m", str(out), "-p", "hi"), ("executorch", "inspect", "-m", str(out))):
        result = run_cli(*command)
        assert result.returncode == 2, result.stderr
        assert "is not an ExecuTorch program" in result.stderr.strip().splitlines()[-1]


def test_truncated_program_names_the_truncation(tiny_llama_export, tmp_path):
    out = _copy_export(tiny_llama_export, tmp_path, "truncated")
    data = (tiny_llama_export / "model.pte").read_bytes()
    (out / "model.pte").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CorruptProgramError, match="is truncated"):
        ExecuTorchModelForCausalLM.from_pretrained(out)


def _overwrite_weights(pte, value: bytes):
    """Overwrites the middle of the program's segment data (the delegate's weights) with `value` bytes."""
    data = bytearray(pte.read_bytes())
    segment_base, segment_size = struct.unpack_from("<Q", data, 24)[0], struct.unpack_from("<Q", data, 32)[0]
    start, end = segment_base + segment_size // 2, segment_base + segment_size * 6 // 10
    data[start:end] = value * (end - start)
    pte.write_bytes(bytes(data))


def test_bytes_changed_inside_the_program_fail_the_checksum(tiny_llama_export, tmp_path):
    out = _copy_export(tiny_llama_export, tmp_path, "flipped")
    _overwrite_weights(out / "model.pte", b"\xff")  # 0xffffffff is a NaN in float32
    with pytest.raises(CorruptProgramError, match="SHA-256 differs"):
        ExecuTorchModelForCausalLM.from_pretrained(out)
    # Skipping the check loads it, and NaN logits raise instead of generating token 0.
    model = ExecuTorchModelForCausalLM.from_pretrained(out, verify_checksums=False)
    with pytest.raises(RuntimeError, match="returned NaN logits"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3)


def test_damaged_weights_file_is_refused(tiny_llama_dir, tmp_path):
    out = main_export(tiny_llama_dir, tmp_path / "ptd", max_seq_len=16, external_weights=True)
    weights = out / "model.ptd"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CorruptProgramError, match="model.ptd' is not the file its export wrote"):
        ExecuTorchModelForCausalLM.from_pretrained(out)
    weights.write_bytes(os.urandom(4096))
    with pytest.raises(CorruptProgramError, match="is not an ExecuTorch weights file"):
        ExecuTorchModelForCausalLM.from_pretrained(out, verify_checksums=False)


# ------------------------------------------------------------------------------ positions and inputs
@pytest.mark.parametrize(
    "positions, message",
    [
        ([-1], "starts at -1"),
        ([-40], "starts at -40"),
        ([-(10**9)], "starts at -1000000000"),
        ([3, 2, 1], "starts at 3"),
        ([0, 2, 1], "must be consecutive"),
        ([0.0, 1.0, 2.0], "integer positions"),
    ],
)
def test_bad_cache_position_is_refused(et_model, positions, message):
    ids = torch.tensor([[1, 2, 3]])[:, : len(positions)]
    with pytest.raises(ValueError, match=message):
        et_model(ids, cache_position=torch.tensor(positions))


def test_cache_position_continues_or_restarts_but_never_skips(et_model):
    et_model(torch.tensor([[1, 2, 3]]), cache_position=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="start at 3 to continue"):
        et_model(torch.tensor([[4]]), cache_position=torch.tensor([5]))
    et_model(torch.tensor([[4]]), cache_position=torch.tensor([3]))  # continue
    et_model(torch.tensor([[4]]), cache_position=torch.tensor([1]))  # go back
    et_model(torch.tensor([[1]]), cache_position=torch.tensor([0]))  # restart


def test_generate_refuses_float_ids_and_padding(et_model):
    with pytest.raises(ValueError, match="integer token ids, got torch.float32"):
        et_model.generate(torch.tensor([[5.7, 3.0]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="Padding is not supported"):
        et_model.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]]), max_new_tokens=2)


# ------------------------------------------------------------------------------------------ threads
def test_one_model_from_several_threads_answers_as_from_one(et_model):
    prompts = [torch.tensor([[1, 5, 9, 2]]), torch.tensor([[7, 3]]), torch.tensor([[11, 12, 13, 14, 15, 16]])]
    expected = {i: et_model.generate(p, max_new_tokens=12, do_sample=False).tolist() for i, p in enumerate(prompts)}
    counter = iter(range(10**6))

    def call():
        i = next(counter) % len(prompts)
        return i, et_model.generate(prompts[i], max_new_tokens=12, do_sample=False).tolist()

    answers = answers_from_threads(call, threads=6, calls_per_thread=4)
    assert all(not isinstance(a, Exception) for a in answers), [a for a in answers if isinstance(a, Exception)]
    assert all(tokens == expected[i] for i, tokens in answers)
