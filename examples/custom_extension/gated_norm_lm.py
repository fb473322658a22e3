"""An out-of-tree architecture, exported through `--extension_modules` without touching optimum-executorch.

`gated_norm_lm` is a Llama-like decoder whose RMSNorm guards against overflow with a data-dependent branch
(`if x.abs().max() > limit: ...`). Eager PyTorch runs it; `torch.export` cannot (control flow on tensor
values). The extension below swaps that forward, only while exporting, for an export-friendly one that
computes the same values, sets a default context length, and stores one extra metadata value.

    optimum-cli export executorch --model tiny-gated/ --extension_modules examples/custom_extension/gated_norm_lm.py \
        --output_dir tiny-gated-et/
    python -c "from optimum.executorch import ExecuTorchModelForCausalLM as M; print(M.from_pretrained('tiny-gated-et/'))"

Running the exported program needs neither this file nor the architecture's Python code.
"""

import types

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from optimum_executorch.exporters.extensions import ModelExtension, ModulePatcher

CLAMP_LIMIT = 1e4


class GatedNormConfig(LlamaConfig):
    model_type = "gated_norm_lm"


class GuardedRMSNorm(torch.nn.Module):
    """RMSNorm that clamps extreme activations first, with a branch torch.export cannot trace."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        if bool(hidden_states.abs().max() > CLAMP_LIMIT):  # data-dependent: eager only
            hidden_states = hidden_states.clamp(-CLAMP_LIMIT, CLAMP_LIMIT)
        return self._normalize(hidden_states)

    def _normalize(self, hidden_states):
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)).to(hidden_states.dtype)


class GatedNormLMForCausalLM(LlamaForCausalLM):
    config_class = GatedNormConfig

    def __init__(self, config):
        super().__init__(config)
        eps = config.rms_norm_eps
        for layer in self.model.layers:
            layer.input_layernorm = GuardedRMSNorm(config.hidden_size, eps)
            layer.post_attention_layernorm = GuardedRMSNorm(config.hidden_size, eps)
        self.model.norm = GuardedRMSNorm(config.hidden_size, eps)
        self.post_init()


AutoConfig.register(GatedNormConfig.model_type, GatedNormConfig, exist_ok=True)
AutoModelForCausalLM.register(GatedNormConfig, GatedNormLMForCausalLM, exist_ok=True)


def _export_forward(self, hidden_states):
    # Same values as GuardedRMSNorm.forward: clamping is a no-op below the limit, so no branch is needed.
    return self._normalize(hidden_states.clamp(-CLAMP_LIMIT, CLAMP_LIMIT))


class GatedNormExtension(ModelExtension):
    model_types = ("gated_norm_lm",)
    tasks = ("text-generation",)

    def patch_model(self, model):
        patcher = ModulePatcher()
        for module in model.modules():
            if isinstance(module, GuardedRMSNorm):
                patcher.set(module, "forward", types.MethodType(_export_forward, module))
        return patcher

    def export_defaults(self, recipe, task):
        return {"max_seq_len": 128}

    def extra_metadata(self):
        return {"get_clamp_limit": int(CLAMP_LIMIT)}
