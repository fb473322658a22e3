"""`optimum-cli executorch inspect` / `describe_export`: what an export holds, read back from the program."""

import json

from optimum.executorch import main_export
from optimum_executorch.modeling.program_info import describe_export

from .conftest import run_cli


def test_describe_xnnpack_export(tiny_llama_export):
    description = describe_export(tiny_llama_export)
    forward = description["methods"]["forward"]
    assert forward["inputs"] == [{"shape": [1, 63], "dtype": "int64"}, {"shape": [63], "dtype": "int64"}]
    assert forward["outputs"] == [{"shape": [1, 1, 512], "dtype": "float32"}]
    assert forward["delegate_calls"]["XnnpackBackend"] > 0
    assert "llama::custom_sdpa" in forward["operators_outside"]  # attention runs in ExecuTorch's own kernel
    assert description["metadata"]["get_max_seq_len"] == 64 and description["metadata"]["get_eos_ids"] == [2]
    assert description["export"]["recipe"] == "xnnpack" and description["files"]["model.pte"] > 0
    # A bare .pte is described too (without the directory's settings).
    assert describe_export(tiny_llama_export / "model.pte")["methods"]["forward"]["inputs"] == forward["inputs"]


def test_describe_portable_export_has_no_delegate(tiny_llama_dir, tmp_path):
    out = main_export(tiny_llama_dir, tmp_path / "et", recipe="portable", max_seq_len=32)
    forward = describe_export(out)["methods"]["forward"]
    assert forward["delegate_calls"] == {} and sum(forward["operators_outside"].values()) > 20


def test_cli_inspect(tiny_llama_export, tmp_path):
    result = run_cli("executorch", "inspect", "--model", str(tiny_llama_export), check=True)
    assert "method    forward(int64[1, 63], int64[63]) -> float32[1, 1, 512]" in result.stdout
    assert "XnnpackBackend" in result.stdout and "get_max_seq_len" in result.stdout
    as_json = json.loads(run_cli("executorch", "inspect", "-m", str(tiny_llama_export), "--json", check=True).stdout)
    assert as_json["metadata"]["get_vocab_size"] == 512

    missing = run_cli("executorch", "inspect", "--model", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
