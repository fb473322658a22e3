"""`optimum-cli export executorch` end to end, and its errors."""

import re

import torch

from optimum.executorch import ExecuTorchModelForCausalLM
from optimum_executorch.testing import greedy_eager, load_eager

from .conftest import run_cli


def test_cli_export_then_generate_matches_eager(tiny_llama_dir, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "export", "executorch", "--model", tiny_llama_dir, "--task", "text-generation",
        "--recipe", "xnnpack", "--max_seq_len", "32", "--output_dir", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Exported to" in result.stdout
    assert "Lowering forward" in result.stderr  # progress is reported
    # Only this package's timed log lines: other libraries' warnings and native log lines are held back (-v).
    assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in result.stderr.splitlines()), result.stderr
    assert len(result.stderr.splitlines()) <= 15, result.stderr
    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert model.max_seq_len == 32
    prompt = torch.tensor([[3, 14, 15, 92, 65]])
    expected = greedy_eager(load_eager(tiny_llama_dir), prompt, 10)
    assert model.generate(prompt, max_new_tokens=10, min_new_tokens=10).tolist() == expected.tolist()


def test_cli_bad_task_exits_with_clear_error(tiny_llama_dir, tmp_path):
    result = run_cli("export", "executorch", "-m", tiny_llama_dir, "--task", "translate", "-o", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "Task 'translate' is not supported" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()


def test_cli_misspelled_option_is_rejected(tiny_llama_dir, tmp_path):
    result = run_cli("export", "executorch", "-m", tiny_llama_dir, "-o", str(tmp_path / "o"), "--max_seq_lne", "8")
    assert result.returncode == 2
    assert "unrecognized arguments: --max_seq_lne 8. Did you mean '--max_seq_len'?" in result.stderr
