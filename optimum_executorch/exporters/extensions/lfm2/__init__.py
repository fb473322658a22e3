"""LFM2: short gated convolutions (`conv` layers, kernel `conv_L_cache`, 3 in the released models) interleaved
with full-attention layers.

A `conv` layer's state between calls is the last `conv_L_cache - 1` inputs of its convolution, `[1, hidden,
conv_L_cache - 1]`: a few KB, whatever the context. transformers keeps it in `Lfm2HybridConvCache` and updates it
with a branch on the call's length and on the cache's contents, which `torch.export` cannot follow. For export,
each conv layer runs one form for prefill and decode alike: the previous state (zeros at position 0) is put in
front of the new inputs, the convolution runs over that without padding, and the last `conv_L_cache - 1` inputs
become the new state. Attention layers keep a static KV cache of `max_seq_len` positions; conv layers keep none.
"""

import types
from typing import Any, Dict

import torch
import torch.nn.functional as F
from transformers.cache_utils import StaticLayer

from ...wrappers.causal_lm import CausalLMExportableModule, causal_mask
from .. import ModelExtension, ModulePatcher, register_extension

CONV, FULL = "conv", "full_attention"


def _conv_forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
    """`Lfm2ShortConv.forward` for export: the convolution state lives in `past_key_values.conv_states`."""
    projected = self.in_proj(hidden_states).transpose(-1, -2)
    gate_in, gate_out, x = projected.chunk(3, dim=-2)
    inputs = gate_in * x  # [1, hidden, seq]
    state = past_key_values.conv_states[self.layer_idx]  # [1, hidden, kernel - 1]
    restart = past_key_values.layers[self.layer_idx].cumulative_length == 0  # a call at position 0: a new sequence
    window = torch.cat([torch.where(restart, torch.zeros_like(state), state), inputs], dim=-1)
    state.copy_(window[:, :, window.shape[-1] - state.shape[-1] :])
    out = F.conv1d(window, self.conv.weight, self.conv.bias, groups=window.shape[1])  # [1, hidden, seq]
    return self.out_proj((gate_out * out).transpose(-1, -2).contiguous())


class ConvStateCausalLMExportableModule(CausalLMExportableModule):
    """A `CausalLMExportableModule` whose `conv` layers keep a convolution state instead of a KV cache."""

    def __init__(self, model, max_seq_len: int, custom_sdpa: bool = False, custom_kv_cache: bool = True):
        if custom_sdpa:
            raise ValueError("custom_sdpa expects attention in every layer; LFM2's conv layers have none.")
        super().__init__(model, max_seq_len)
        config = model.config
        self.cache.conv_states = {}  # layer index -> [1, hidden, kernel - 1], a buffer (mutable state) of the program
        for i, layer_type in enumerate(config.layer_types):
            if layer_type == CONV:
                state = torch.zeros((1, config.hidden_size, config.conv_L_cache - 1), dtype=model.dtype)
                self.register_buffer(f"conv_state_{i}", state, persistent=False)
                self.cache.conv_states[i] = getattr(self, f"conv_state_{i}")

    def cache_layer(self, index: int, text_config):
        # A conv layer's KV entry is never written: one position keeps the cache's bookkeeping uniform.
        return StaticLayer(1 if text_config.layer_types[index] == CONV else self.max_seq_len)

    def attention_masks(self, cache_position: torch.Tensor) -> Dict[str, Any]:
        return {FULL: causal_mask(cache_position, self.max_seq_len), CONV: None}


@register_extension
class Lfm2Extension(ModelExtension):
    """`lfm2` (`Lfm2ForCausalLM`): text generation with convolution states and a static KV cache."""
    coverage_representatives = ("lfm2",)

    model_types = ("lfm2",)
    tasks = ("text-generation",)
    cache_layout = "hybrid"
    tiny_config_extra = {"layer_types": [CONV, FULL], "conv_L_cache": 3, "block_auto_adjust_ff_dim": False}

    def supports_custom_sdpa(self, max_seq_len: int) -> bool:
        return False

    def wrapper_class(self):
        return ConvStateCausalLMExportableModule

    def patch_model(self, model) -> ModulePatcher:
        patcher = ModulePatcher()
        for module in model.modules():
            if type(module).__name__ == "Lfm2ShortConv":
                patcher.set(module, "forward", types.MethodType(_conv_forward, module))
        return patcher

    def extra_metadata(self) -> Dict[str, Any]:
        return {"get_conv_kernel_size": int(self.text_config.conv_L_cache)}
