"""An architecture whose code ships with the checkpoint (trust_remote_code), patched by an out-of-tree extension."""

import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from optimum.executorch import ExecuTorchModelForCausalLM, main_export
from optimum_executorch.exporters.inspector import inspect_checkpoint
from optimum_executorch.testing import TINY_DECODER_CONFIG, assert_generation_matches_eager, tiny_tokenizer

CONFIGURATION = '''
from transformers import LlamaConfig


class RemoteGatedConfig(LlamaConfig):
    model_type = "remote_gated_lm"
'''

MODELING = '''
import torch
from transformers import LlamaForCausalLM

from .configuration_remote import RemoteGatedConfig


class RemoteGuardedNorm(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        if bool(x.abs().max() > 1e4):  # data-dependent: torch.export cannot trace it
            x = x.clamp(-1e4, 1e4)
        return self.normalize(x)

    def normalize(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class RemoteGatedForCausalLM(LlamaForCausalLM):
    config_class = RemoteGatedConfig

    def __init__(self, config):
        super().__init__(config)
        self.model.norm = RemoteGuardedNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()
'''

EXTENSION = '''
import types

from optimum_executorch.exporters.extensions import ModelExtension, ModulePatcher


def _forward(self, x):
    return self.normalize(x.clamp(-1e4, 1e4))


class RemoteGatedExtension(ModelExtension):
    model_types = ("remote_gated_lm",)
    tasks = ("text-generation",)

    def patch_model(self, model):
        patcher = ModulePatcher()
        for module in model.modules():
            # The class comes from the checkpoint's own code, imported by transformers under transformers_modules.
            if type(module).__name__ == "RemoteGuardedNorm" and type(module).__module__.startswith("transformers_modules"):
                patcher.set(module, "forward", types.MethodType(_forward, module))
        return patcher
'''


def _remote_checkpoint(directory):
    directory.mkdir(parents=True)
    (directory / "configuration_remote.py").write_text(CONFIGURATION)
    (directory / "modeling_remote.py").write_text(MODELING)
    config = dict(
        TINY_DECODER_CONFIG,
        model_type="remote_gated_lm",
        architectures=["RemoteGatedForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_remote.RemoteGatedConfig",
            "AutoModelForCausalLM": "modeling_remote.RemoteGatedForCausalLM",
        },
    )
    (directory / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory, trust_remote_code=True), trust_remote_code=True)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    assert type(model.model.norm).__module__.startswith("transformers_modules")
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return str(directory)


def test_remote_code_model_exports_through_an_extension(tmp_path):
    src = _remote_checkpoint(tmp_path / "model")
    extension = tmp_path / "remote_ext.py"
    extension.write_text(EXTENSION)
    report = inspect_checkpoint(src, trust_remote_code=True)  # without the extension: where it breaks
    assert not report["ok"] and report["modules"]["norm"][-1] == "RemoteGuardedNorm"
    out = main_export(src, tmp_path / "et", trust_remote_code=True, extension_modules=[str(extension)], max_seq_len=48)
    eager = AutoModelForCausalLM.from_pretrained(src, trust_remote_code=True, attn_implementation="sdpa").eval()
    assert_generation_matches_eager(eager, ExecuTorchModelForCausalLM.from_pretrained(out), max_new_tokens=10)
    assert inspect_checkpoint(src, trust_remote_code=True, extension_modules=[str(extension)])["ok"]
