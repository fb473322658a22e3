"""`main_export(..., dry_run=True)` / `--dry_run`: the export plan, from the config alone."""

import pytest

from optimum.executorch import main_export
from optimum_executorch.exporters import convert
from optimum_executorch.testing import save_tiny_encoder, save_tiny_model

from .conftest import run_cli


@pytest.fixture()
def no_weights(monkeypatch):
    """Fails the test if anything loads weights or a tokenizer."""

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run loaded the model")

    monkeypatch.setattr(convert, "load_model", refuse)
    monkeypatch.setattr(convert, "load_preprocessor", refuse)


def _settings(plan):
    return plan.to_dict()["settings"]


def test_dry_run_plans_without_loading_or_writing(tiny_llama_dir, tmp_path, no_weights):
    plan = main_export(tiny_llama_dir, tmp_path / "out", dry_run=True)
    assert not (tmp_path / "out").exists()
    settings = _settings(plan)
    assert settings["max_seq_len"] == {"value": 256, "source": "default: min(2048, max_position_embeddings=256)"}
    assert settings["task"]["source"] == "inferred from the llama config"
    assert settings["custom_sdpa"] == {"value": True, "source": "recipe 'xnnpack' default"}
    assert settings["custom_kv_cache"]["value"] is True and settings["external_weights"]["value"] is False
    assert plan.to_dict()["methods"]["forward"] == [
        {"name": "input_ids", "dtype": "int64", "shape": [1, "seq_len 1..255"]},
        {"name": "cache_position", "dtype": "int64", "shape": ["seq_len 1..255"]},
    ]
    assert "max_seq_len" in plan.format() and "(user)" in plan.format()  # the model path came from the user


def test_dry_run_says_where_values_came_from(tmp_path, no_weights):
    tied = save_tiny_model("llama", tmp_path / "tied", tie_word_embeddings=True)
    settings = _settings(main_export(tied, tmp_path / "a", dry_run=True))
    assert settings["external_weights"]["value"] is True and "share one weight" in settings["external_weights"]["source"]

    settings = _settings(main_export(tied, tmp_path / "b", dry_run=True, max_seq_len=64, qlinear="8da4w", custom_kv_cache=False))
    assert settings["max_seq_len"] == {"value": 64, "source": "user"}
    assert settings["quantization"]["source"] == "user" and settings["quantization"]["value"]["qlinear"] == "8da4w"
    assert settings["external_weights"]["value"] is False  # quantized: each copy in its own format
    assert settings["custom_kv_cache"] == {"value": False, "source": "user"}

    window = save_tiny_model("mistral", tmp_path / "window", sliding_window=16)
    plan = main_export(window, tmp_path / "c", dry_run=True, max_seq_len=48)
    assert _settings(plan)["custom_sdpa"] == {"value": True, "source": "recipe 'xnnpack' default"}
    assert plan.to_dict()["methods"]["forward"][0]["shape"] == [1, "seq_len 1..16"]  # a ring of 32 slots

    encoder = save_tiny_encoder("bert", tmp_path / "bert", task="fill-mask")
    plan = main_export(encoder, tmp_path / "d", dry_run=True, max_seq_len=32)
    assert plan.to_dict()["methods"]["forward"][0]["shape"] == ["batch 1..64", "seq_len 1..32"]
    assert [i["name"] for i in plan.to_dict()["methods"]["forward"]] == ["input_ids", "attention_mask", "token_type_ids"]


def test_dry_run_still_rejects_bad_options(tiny_llama_dir, tmp_path, no_weights):
    with pytest.raises(ValueError, match="exceeds the 256 positions"):
        main_export(tiny_llama_dir, tmp_path / "out", dry_run=True, max_seq_len=1000)


def test_cli_dry_run(tiny_llama_dir, tmp_path):
    result = run_cli("export", "executorch", "-m", str(tiny_llama_dir), "-o", str(tmp_path / "out"), "--dry_run", check=True)
    assert "Export plan" in result.stdout and "method forward: input_ids int64[1, seq_len 1..255]" in result.stdout
    assert not (tmp_path / "out").exists()


def test_hub_options_reach_the_loader(tiny_llama_dir, no_weights):
    """`subfolder` inside a local directory names the checkpoint; the Hub options are accepted everywhere and go to
    every load (checked here on the options the loader is given)."""
    from pathlib import Path

    from optimum_executorch.exporters.loading import _hub_kwargs
    from optimum_executorch.exporters.options import ExportOptions

    parent = Path(tiny_llama_dir).parent
    plan = main_export(parent, subfolder=Path(tiny_llama_dir).name, local_files_only=True, dry_run=True)
    assert plan.options.model == tiny_llama_dir and plan.options.subfolder == ""
    options = ExportOptions.from_kwargs(model="org/repo", subfolder="sub", local_files_only=True, force_download=True,
                                        revision="v1", cache_dir="/c", token="t")  # fmt: skip
    assert _hub_kwargs(options) == {"revision": "v1", "cache_dir": "/c", "token": "t", "subfolder": "sub",
                                    "local_files_only": True, "force_download": True}  # fmt: skip
    assert "token" not in options.to_dict() and "local_files_only" not in options.to_dict()
