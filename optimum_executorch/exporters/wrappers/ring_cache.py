"""`RingCacheCausalLMExportableModule`: a hybrid decoder LM whose sliding-window layers keep a ring buffer.

Models such as Gemma 3 interleave sliding-window layers (each token sees the last `window` positions) with
full-attention layers. A full-length cache for every layer makes memory grow with `max_seq_len` in every layer;
here a sliding layer keeps only `2 * window` positions, position `p` in slot `p % (2 * window)`, so its memory is
fixed whatever the context. The program then takes at most `window` tokens a call (a longer prompt is fed in
chunks, which the runtime and ExecuTorch's runner do from `get_max_seq_len`): with `2 * window` slots, no token
of a chunk overwrites a position that a query of the same chunk still attends to.

The masks are computed from `cache_position` alone (no state): after a call ending at position `e`, slot `s`
holds position `e - ((e - s) mod size)`, or nothing if that is negative.
"""

from typing import Any, Dict, Optional, Sequence

import torch
from transformers.cache_utils import StaticLayer

from ... import contract
from ..attention.custom_sdpa import ring_chunk_len, ring_positions
from .causal_lm import CausalLMExportableModule, causal_mask

SLIDING, FULL = "sliding_attention", "full_attention"


class RingLayer(StaticLayer):
    """A cache layer of `size` slots that writes position `p` to slot `p % size`."""

    is_sliding = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        kv_length = key_states.shape[-2]
        slots = (torch.arange(kv_length, device=self.device) + self.cumulative_length) % self.max_cache_len
        self.cumulative_length.add_(kv_length)
        self.keys.index_copy_(2, slots, key_states)
        self.values.index_copy_(2, slots, value_states)
        return self.keys, self.values


class RingCacheCausalLMExportableModule(CausalLMExportableModule):
    """A `CausalLMExportableModule` whose sliding-window layers keep a ring buffer of `2 * sliding_window` slots.

    Args:
        model: the eager model; it must take a dict of masks keyed by layer type as `attention_mask` (the
            transformers models with `config.layer_types` do).
        max_seq_len: the context: prompt + generated tokens (the full-attention layers' cache length).
        layer_types: `config.layer_types` (`sliding_attention` / `full_attention` per layer).
        kwargs: `CausalLMExportableModule`'s (`sliding_window`: the window of the sliding layers; `custom_sdpa`).
    """

    def __init__(self, model, max_seq_len: int, layer_types: Sequence[str] = (), **kwargs):
        self.layer_types = list(layer_types)
        # With custom SDPA, the attention modules keep their own rings (attention/custom_sdpa.py).
        custom = kwargs.get("custom_sdpa", False)
        self.ring_size = None if custom else self.ring_size_for(max_seq_len, kwargs.get("sliding_window"))
        super().__init__(model, max_seq_len, **kwargs)

    @staticmethod
    def ring_size_for(max_seq_len: int, sliding_window: Optional[int]) -> Optional[int]:
        """`2 * sliding_window`, or None when that is no smaller than a full-length cache."""
        return 2 * sliding_window if sliding_window and 2 * sliding_window < max_seq_len else None

    @classmethod
    def chunk_len_for(cls, max_seq_len: int, custom_sdpa: bool = False, sliding_window: Optional[int] = None,
                      **kwargs) -> int:  # fmt: skip
        return ring_chunk_len(max_seq_len, sliding_window)  # a ring on either path

    def cache_layer(self, index: int, text_config):
        if self.ring_size and self.layer_types[index] == SLIDING:
            return RingLayer(self.ring_size)
        return StaticLayer(self.max_seq_len)

    def attention_masks(self, cache_position: torch.Tensor) -> Dict[str, torch.Tensor]:
        query = cache_position.reshape(-1, 1)
        if self.ring_size:  # the position each slot holds (negative: empty)
            held = ring_positions(cache_position[-1], self.ring_size).reshape(1, -1)
        else:
            held = torch.arange(self.max_seq_len, dtype=torch.long).reshape(1, -1)
        sliding = (held >= 0) & (held <= query) & (query - held < self.sliding_window)
        return {FULL: causal_mask(cache_position, self.max_seq_len), SLIDING: sliding[None, None]}

    def metadata(self, generation_config) -> Dict[str, Any]:
        # ExecuTorch's runner feeds at most get_max_seq_len tokens a call, get_max_context_len in all.
        metadata = super().metadata(generation_config)
        metadata[contract.SLIDING_WINDOW] = int(self.sliding_window or 0)
        return metadata
