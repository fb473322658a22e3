"""Attention through ExecuTorch's custom CPU ops, with the KV cache in the `[B, S, H, D]` layout.

`install_custom_sdpa(model, max_seq_len)` gives every attention module of a transformers model its own
key/value cache buffers and switches the model to the `executorch_custom_sdpa` attention
implementation, registered in transformers' `AttentionInterface` (model code is not forked):

- `llama::update_cache(new, cache, start_pos)` writes the new keys/values in place (with
  `custom_kv_cache=False`, an `index_copy_` does, which the exported program runs as a copy of the
  whole cache: the baseline that the benchmark's ablation measures);
- `llama::custom_sdpa(q, k_cache, v_cache, start_pos, ...)` attends causally over positions
  `[0, start_pos + seq)` only, instead of over the whole `max_seq_len` cache behind a mask.

The start position comes from `position_ids`, which the model passes to the attention function.

Sliding-window layers whose window is shorter than the context keep a ring of `2 * window` slots (position `p`
in slot `p % (2 * window)`; `max_seq_len` slots when that is no more): `llama::update_cache_with_indices` writes
the new keys/values into their slots in place, and `llama::custom_sdpa` attends over every slot behind a float
mask built from the positions the slots hold (`ring_positions`), so a sliding layer's
memory and attention cost stay fixed whatever the context. A call then takes at most `window` tokens, so that no
token of a call overwrites a position that a query of the same call still attends to.
"""

import importlib
from typing import List, Optional

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from ...contract import CUSTOM_OPS_KERNEL_LIBRARY

CUSTOM_SDPA = "executorch_custom_sdpa"
# Recorded in executorch_config.json: the runtime loads these kernels before loading the program.


def _load_custom_ops() -> None:
    importlib.import_module(CUSTOM_OPS_KERNEL_LIBRARY)  # registers torch.ops.llama.*


def custom_sdpa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An `AttentionInterface` function: `query/key/value` are `[B, H, S, D]`; returns `[B, S, H, D]`."""
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError("executorch_custom_sdpa needs position_ids to locate the new tokens in the cache.")
    start_pos = position_ids[0, 0].item()
    max_seq_len = module.et_max_seq_len
    torch._check(start_pos >= 0)
    torch._check(start_pos < max_seq_len)
    torch._check(start_pos + query.shape[2] <= max_seq_len)

    dtype = query.dtype
    compute = dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32  # no fp16 kernel
    q = query.transpose(1, 2).to(compute)
    k = key.transpose(1, 2).to(module.et_key_cache.dtype)
    v = value.transpose(1, 2).to(module.et_value_cache.dtype)
    if (kwargs.get("sliding_window") or None) != (module.et_window or None) and module.et_window is not None:
        raise ValueError(f"Layer {module.layer_idx}: sliding window {kwargs.get('sliding_window')} at run time, "
                         f"{module.et_window} when its cache was made.")  # fmt: skip
    if module.et_window is not None:
        return _ring_attention(module, q, k, v, position_ids[0], scaling).to(dtype), None
    if module.et_custom_kv_cache:
        torch.ops.llama.update_cache(k, module.et_key_cache, start_pos)
        torch.ops.llama.update_cache(v, module.et_value_cache, start_pos)
    else:
        positions = position_ids[0]
        module.et_key_cache.index_copy_(1, positions, k)
        module.et_value_cache.index_copy_(1, positions, v)
    output = torch.ops.llama.custom_sdpa(
        q, module.et_key_cache, module.et_value_cache, start_pos, None, 0.0, True, scaling
    )
    return output.to(dtype), None


def ring_positions(last_position: torch.Tensor, size: int) -> torch.Tensor:
    """The position each of `size` ring slots holds after a write ending at `last_position` (negative: empty)."""
    slots = torch.arange(size, dtype=torch.long)
    return last_position - torch.remainder(last_position - slots, size)


def _ring_attention(module, q, k, v, positions, scaling):
    """A sliding-window layer: the new keys/values into their ring slots, then attention over every slot behind the
    window mask of each query position."""
    size = module.et_key_cache.shape[1]
    slots = torch.remainder(positions, size).reshape(1, -1)
    torch.ops.llama.update_cache_with_indices(k, module.et_key_cache, 0, slots)
    torch.ops.llama.update_cache_with_indices(v, module.et_value_cache, 0, slots)
    held = ring_positions(positions[-1], size).reshape(1, -1)
    query = positions.reshape(-1, 1)
    visible = (held >= 0) & (held <= query) & (query - held < module.et_window)
    mask = torch.zeros(visible.shape, dtype=torch.float32).masked_fill(~visible, float("-inf"))
    # custom_sdpa attends over the first start_pos + seq slots: all of them.
    start = size - q.shape[1]
    torch._check(start >= 0)
    return torch.ops.llama.custom_sdpa(q, module.et_key_cache, module.et_value_cache, start, mask, 0.0, False, scaling)


def _no_mask(*args, **kwargs):
    return None  # custom_sdpa applies the causal mask itself


def _register() -> None:
    if CUSTOM_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(CUSTOM_SDPA, custom_sdpa_attention)
        AttentionMaskInterface.register(CUSTOM_SDPA, _no_mask)


def _attention_modules(model):
    """The self-attention modules: those that transformers numbered with a `layer_idx`, with a `head_dim`, and either
    an `o_proj` or a class named `...Attention` (phi's `dense`, gpt2's `c_proj`, gpt_neox's `dense`)."""
    return [
        m for m in model.modules()
        if hasattr(m, "layer_idx") and _head_dim(m)
        and (hasattr(m, "o_proj") or type(m).__name__.endswith("Attention"))
    ]  # fmt: skip


def _head_dim(module):
    return getattr(module, "head_dim", None) or getattr(module, "head_size", None)  # gpt_neox: head_size


def _kv_heads(module, text_config) -> int:
    """Key/value heads of one attention module: grouped-query modules say how many query heads share one
    (`num_key_value_groups`); the others (gpt2, gpt_neox) have one per query head."""
    groups = getattr(module, "num_key_value_groups", None)
    return text_config.num_attention_heads // groups if groups else text_config.num_attention_heads


def sliding_window_of(module, text_config, max_seq_len: int) -> Optional[int]:
    """The window of an attention module if it is a sliding-window layer whose window is shorter than the context
    (its own `sliding_window`, else its `layer_types` entry, else the config's), or None."""
    if hasattr(module, "sliding_window"):
        window = module.sliding_window
    elif getattr(text_config, "layer_types", None):
        sliding = text_config.layer_types[module.layer_idx] == "sliding_attention"
        window = text_config.sliding_window if sliding else None
    else:
        window = getattr(text_config, "sliding_window", None)
    return window if window and window < max_seq_len else None


def ring_chunk_len(max_seq_len: int, window: Optional[int]) -> int:
    """The most tokens a call takes when sliding layers of `window` keep a ring of `2 * window` slots."""
    return window if window and 2 * window < max_seq_len else max_seq_len - 1


def install_custom_sdpa(model, max_seq_len: int, custom_kv_cache: bool = True) -> List[Optional[int]]:
    """Adds `[1, slots, kv_heads, head_dim]` cache buffers to each attention module (`max_seq_len` slots, or a ring
    for a sliding-window layer) and switches the model to the custom attention. `custom_kv_cache=False` updates the
    full-length caches with `index_copy_` instead of `llama::update_cache`. Returns each changed module's window
    (None: full attention)."""
    _load_custom_ops()
    _register()
    text_config = model.config.get_text_config()
    cache_dtype = model.dtype if model.dtype in (torch.float32, torch.bfloat16) else torch.float32
    modules = _attention_modules(model)
    for module in modules:
        module.et_window = sliding_window_of(module, text_config, max_seq_len)
        module.et_max_seq_len = max_seq_len
        slots = min(2 * module.et_window, max_seq_len) if module.et_window else max_seq_len
        shape = (1, slots, _kv_heads(module, text_config), _head_dim(module))
        module.register_buffer("et_key_cache", torch.zeros(shape, dtype=cache_dtype), persistent=False)
        module.register_buffer("et_value_cache", torch.zeros(shape, dtype=cache_dtype), persistent=False)
        module.et_custom_kv_cache = custom_kv_cache
    model.set_attn_implementation(CUSTOM_SDPA)
    return [module.et_window for module in modules]
