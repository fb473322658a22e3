"""The checkpoint inspector: tiny dry-run export of every supported family, a clean report for unsupported ones."""

import pytest
from transformers import AutoConfig

from optimum_executorch.exporters.configs import EXPORT_CONFIGS
from optimum_executorch.exporters.extensions import discover_builtin_extensions
from optimum_executorch.exporters.inspector import inspect_checkpoint, shrink_config
from optimum_executorch.testing import tiny_config

from .conftest import run_cli


def _save_config(config, directory):
    config.save_pretrained(directory)
    return str(directory)


def test_every_supported_family_exports_in_the_dry_run(tmp_path):
    failed = {}
    list(discover_builtin_extensions())  # built-in extensions (gemma3_text, lfm2) are families of this package too
    ours = ("optimum_executorch.exporters.configs", "optimum_executorch.exporters.extensions.")
    builtin = [m for m, cls in EXPORT_CONFIGS.items() if cls.__module__.startswith(ours)]
    assert len(builtin) >= 23 and {"gemma3_text", "lfm2", "whisper"} <= set(builtin)
    for model_type in sorted(builtin):
        report = inspect_checkpoint(_save_config(tiny_config(model_type), tmp_path / model_type))
        if not report["ok"]:
            failed[model_type] = report["steps"]
        assert report["export_config"] == EXPORT_CONFIGS[model_type].__name__
    assert not failed, failed


def test_report_lists_weights_and_modules(tiny_llama_dir):
    report = inspect_checkpoint(tiny_llama_dir)
    assert report["ok"] and report["task"] == "text-generation"
    assert report["safetensors_prefixes"]["model.layers"] == 18  # 2 layers x 9 tensors, from the headers alone
    assert report["modules"]["attention"] == ["LlamaAttention"] and report["modules"]["rope"] == ["LlamaRotaryEmbedding"]


def test_unsupported_architecture_gets_a_clean_report_and_a_skeleton(tmp_path):
    src = _save_config(AutoConfig.for_model("gptj"), tmp_path / "gptj")
    report = inspect_checkpoint(src)
    assert not report["ok"] and report["export_config"] is None
    failed = [s for s in report["steps"] if not s["ok"]]
    assert failed[0]["step"] == "find export config" and "not supported" in failed[0]["error"]
    assert 'model_types = ("gptj",)' in report["skeleton"]
    result = run_cli("executorch", "inspect", "--model", src)
    assert result.returncode == 0, result.stderr
    assert "not exportable as is" in result.stdout and "class GptjExtension(ModelExtension)" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_shrink_keeps_one_layer_of_each_type_and_clamps_special_ids():
    config = AutoConfig.for_model("gemma3_text", eos_token_id=[1, 106], bos_token_id=2, pad_token_id=0)
    config.eos_token_id = [1, 1000]
    assert len(set(config.layer_types)) == 2 and config.num_hidden_layers > 2
    tiny = shrink_config(config)
    assert tiny.num_hidden_layers == 2 and tiny.layer_types == ["sliding_attention", "full_attention"]
    assert tiny.vocab_size == 256 and tiny.eos_token_id == [1, 255] and tiny.hidden_size == 64
    assert config.num_hidden_layers > 2  # the original is untouched


def test_missing_checkpoint_is_a_clear_cli_error(tmp_path):
    result = run_cli("executorch", "inspect", "--model", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.mark.parametrize("flag", ["--trust_remote_code", "--json"])
def test_inspect_flags_parse(tiny_llama_dir, flag):
    result = run_cli("executorch", "inspect", "--model", tiny_llama_dir, flag)
    assert result.returncode == 0, result.stderr
