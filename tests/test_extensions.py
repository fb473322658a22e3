"""ModelExtension plug-ins: an out-of-tree architecture through --extension_modules, defaults, patches, errors."""

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.extensions import ModulePatcher, load_extension_modules
from optimum_executorch.testing import assert_generation_matches_eager, assert_patch_parity, load_eager, save_tiny_model

from .conftest import REPO_ROOT, run_cli

EXAMPLE = str(REPO_ROOT / "examples" / "custom_extension" / "gated_norm_lm.py")


@pytest.fixture(scope="module")
def example():
    """The example extension's module (it registers the architecture with transformers on import)."""
    (extension,) = load_extension_modules([EXAMPLE])
    return sys.modules[extension.__module__], extension


@pytest.fixture(scope="module")
def gated_src(example, tmp_path_factory):
    return save_tiny_model("gated_norm_lm", tmp_path_factory.mktemp("gated") / "model")


def test_out_of_tree_architecture_exports_and_runs(example, gated_src, tmp_path):
    out = tmp_path / "et"
    run_cli("export", "executorch", "--model", gated_src, "--extension_modules", EXAMPLE, "--output_dir", str(out), check=True)
    config = json.loads((out / "executorch_config.json").read_text())
    assert config["export_config"] == "GatedNormExtension" and config["cache_layout"] == "full"
    assert config["max_seq_len"] == 128 and config["metadata"]["get_clamp_limit"] == 10000  # the extension's defaults
    et_model = ExecuTorchModelForCausalLM.from_pretrained(out)
    assert_generation_matches_eager(gated_src, et_model, max_new_tokens=12)
    # Running needs neither the extension nor the architecture's code: a fresh process that never imports them.
    result = run_cli("executorch", "run", "--model", str(out), "--prompt", "The capital", "--max_new_tokens", "4")
    assert result.returncode == 0, result.stderr


def test_the_patch_is_what_makes_the_model_exportable(example, gated_src):
    module, extension = example
    norm = module.GuardedRMSNorm(8)
    with pytest.raises(Exception, match="(?i)data.dependent|guard"):
        torch.export.export(norm, (torch.randn(2, 8),), strict=True)
    eager = load_eager(gated_src)
    ext = extension(eager.config, "text-generation")
    with ext.patch_model(eager):
        torch.export.export(eager.model.norm, (torch.randn(2, 64),), strict=True)
    assert "forward" not in eager.model.norm.__dict__  # restored


def test_extension_defaults_never_override_the_user(example, gated_src, tmp_path):
    settings = main_export(gated_src, tmp_path / "a", extension_modules=[EXAMPLE], dry_run=True).to_dict()["settings"]
    assert settings["max_seq_len"] == {"value": 128, "source": "GatedNormExtension default"}
    settings = main_export(gated_src, tmp_path / "b", extension_modules=[EXAMPLE], max_seq_len=64, dry_run=True).to_dict()["settings"]
    assert settings["max_seq_len"] == {"value": 64, "source": "user"}


def test_patch_parity_helper_passes_a_good_patch_and_catches_broken_ones(example, gated_src):
    _, extension = example
    eager = load_eager(gated_src, dtype=torch.bfloat16)  # the helper compares in float32 whatever the config says
    ext = extension(eager.config, "text-generation")
    input_ids = torch.tensor([[5, 17, 42, 99, 7]])
    assert assert_patch_parity(ext, eager, input_ids) < 1e-6

    class WrongValues(extension):
        def patch_model(self, model):
            patcher = ModulePatcher()
            patcher.set(model.model.norm, "forward", types.MethodType(lambda self, x: self._normalize(x) * 1.01, model.model.norm))
            return patcher

    with pytest.raises(AssertionError, match="logits differ"):
        assert_patch_parity(WrongValues(eager.config, "text-generation"), eager, input_ids)

    class NotRestored(extension):
        def patch_model(self, model):
            model.model.norm.forward = types.MethodType(type(model.model.norm).forward, model.model.norm)
            return ModulePatcher()

    with pytest.raises(AssertionError, match="left modules patched"):
        assert_patch_parity(NotRestored(eager.config, "text-generation"), eager, input_ids)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_conflicting_and_bad_extension_files_give_clear_errors(tmp_path):
    header = "from optimum_executorch.exporters.extensions import ModelExtension\n"
    claims_llama = _write(tmp_path / "claims_llama.py", header + "class Mine(ModelExtension):\n    model_types = ('llama',)\n")
    with pytest.raises(ValueError, match="'llama' is claimed twice: by .*DecoderLMExportConfig.* and by .*Mine"):
        load_extension_modules([claims_llama])
    first = _write(tmp_path / "first.py", header + "class First(ModelExtension):\n    model_types = ('twice_type',)\n")
    second = _write(tmp_path / "second.py", header + "class Second(ModelExtension):\n    model_types = ('twice_type',)\n")
    load_extension_modules([first])
    with pytest.raises(ValueError, match="claimed twice: by .*First.*first.py.* and by .*Second.*second.py"):
        load_extension_modules([second])
    with pytest.raises(FileNotFoundError, match="not a Python file"):
        load_extension_modules([str(tmp_path / "missing.py")])
    empty = _write(tmp_path / "empty.py", "X = 1\n")
    with pytest.raises(ValueError, match="defines no ModelExtension"):
        load_extension_modules([empty])
    broken = _write(tmp_path / "broken.py", "import not_a_module_anywhere\n")
    with pytest.raises(ImportError, match="Could not import extension module .*broken.py.*ModuleNotFoundError"):
        load_extension_modules([broken])
    result = run_cli("export", "executorch", "--model", "x", "--extension_modules", str(tmp_path / "missing.py"),
                     "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 2 and "not a Python file" in result.stderr and not (tmp_path / "out").exists()


def test_weight_resolution_and_tiny_export_helpers(example, gated_src, tmp_path):
    from optimum_executorch.testing import assert_weights_resolve, export_and_compare

    _, extension = example
    eager = load_eager(gated_src)
    ext = extension(eager.config, "text-generation")
    assert assert_weights_resolve(ext, eager, gated_src) == 21  # 2 layers x 9 + embedding, norm, lm_head

    class RenamesWrong(extension):
        def rename_weights(self, state_dict):
            return {k.replace("mlp.gate_proj", "mlp.fused_gate"): v for k, v in state_dict.items()}

    with pytest.raises(AssertionError, match="do not resolve: model.layers.0.mlp.gate_proj.weight: not in the checkpoint"):
        assert_weights_resolve(RenamesWrong(eager.config, "text-generation"), eager, gated_src)
    export_and_compare(gated_src, tmp_path / "et", extension_modules=[EXAMPLE], max_new_tokens=4)
