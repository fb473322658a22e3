"""`CausalLMExportableModule`: a decoder LM with its KV cache held inside the program.

The exported `forward(input_ids[1, seq], cache_position[seq]) -> logits[1, 1, vocab]` is the contract of
ExecuTorch's LLM runner: a whole prompt is prefilled in one call (dynamic `seq`), then decode runs one
token a call. The cache is a mutable buffer of the program, so the caller never passes it around.
Only the logits of the last position are returned: that is all generation needs, and the planned
output buffer stays `vocab` floats instead of `max_seq_len * vocab`.
"""

from typing import Any, Dict, Optional, Tuple

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from ... import contract


def register_cache_buffers(module: torch.nn.Module, cache) -> None:
    """Registers a static cache's tensors as buffers of `module`, which makes them mutable state of the program."""
    for i, layer in enumerate(cache.layers):
        module.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
        module.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
        module.register_buffer(f"cache_length_{i}", layer.cumulative_length, persistent=False)


def causal_mask(cache_position: torch.Tensor, length: int) -> torch.Tensor:
    """`[1, 1, seq, length]` boolean mask: each query position attends to cache positions up to its own."""
    return (torch.arange(length, dtype=torch.long).reshape(1, -1) <= cache_position.reshape(-1, 1))[None, None]


def restart_cache_at(cache, cache_position: torch.Tensor) -> None:
    """The cache writes new entries after its current length: set it from the first position of this call, so
    that a call at position 0 (a new prompt) restarts the sequence."""
    for layer in cache.layers:
        layer.cumulative_length.copy_(cache_position[0])


class CausalLMExportableModule(torch.nn.Module):
    """Wraps a `*ForCausalLM` model and its KV cache of `max_seq_len` positions for `torch.export`.

    Args:
        model: the eager transformers model (eval mode, sdpa attention).
        max_seq_len: number of positions of the cache, i.e. prompt + generated tokens.
        custom_sdpa: attend through ExecuTorch's `custom_sdpa` / `update_cache` ops, with the cache in
            the attention modules (see `attention/custom_sdpa.py`); otherwise transformers' `StaticCache`
            and plain SDPA over the whole cache behind a mask.
        custom_kv_cache: with `custom_sdpa`, write the cache in place with `llama::update_cache` (default);
            `False` writes it with `index_copy_` (a whole-cache copy per call once exported).
    """

    method_names = ("forward",)

    def __init__(
        self,
        model,
        max_seq_len: int,
        custom_sdpa: bool = False,
        custom_kv_cache: bool = True,
        sliding_window: Optional[int] = None,
    ):
        super().__init__()
        self.model = model
        self.max_seq_len = max_seq_len
        self.custom_sdpa = custom_sdpa
        self.sliding_window = sliding_window
        if custom_sdpa:
            from ..attention import install_custom_sdpa

            windows = install_custom_sdpa(model, max_seq_len, custom_kv_cache=custom_kv_cache)
            chunk = min((w for w in windows if w and 2 * w < max_seq_len), default=max_seq_len - 1)
            if chunk < self.max_chunk_len:  # a call longer than a ring's window would overwrite what it attends to
                raise ValueError(f"Sliding-window layers of window {chunk} need sliding_window={chunk} (got "
                                 f"{sliding_window}) to bound the tokens a call takes.")  # fmt: skip
            return
        text_config = model.config.get_text_config()
        self.cache = StaticCache(config=text_config, max_cache_len=max_seq_len)
        self.cache.layers = [self.cache_layer(i, text_config) for i in range(len(self.cache.layers))]
        num_kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        self.cache.early_initialization(
            batch_size=1, num_heads=num_kv_heads, head_dim=head_dim, dtype=model.dtype, device=model.device
        )
        register_cache_buffers(self, self.cache)

    @property
    def strict_export(self) -> bool:
        """Non-strict export (faster) when the attention modules own the cache; transformers' `StaticCache`
        needs strict export (see `convert.export_programs`)."""
        return not self.custom_sdpa

    @classmethod
    def chunk_len_for(cls, max_seq_len: int, custom_sdpa: bool = False, sliding_window: Optional[int] = None,
                      **wrapper_kwargs) -> int:  # fmt: skip
        """The most tokens one call takes (a longer prompt is fed in chunks): with custom SDPA, sliding-window layers
        keep a ring that takes at most `sliding_window` tokens a call (`attention/custom_sdpa.py`)."""
        from ..attention.custom_sdpa import ring_chunk_len

        return ring_chunk_len(max_seq_len, sliding_window) if custom_sdpa else max_seq_len - 1

    @property
    def max_chunk_len(self) -> int:
        return self.chunk_len_for(self.max_seq_len, self.custom_sdpa, self.sliding_window)

    def cache_layer(self, index: int, text_config):
        """The cache of layer `index`. transformers' sliding-window layer holds only the last `window` positions
        and updates them with data-dependent control flow that cannot be exported; a full-length layer holds
        every position, and the model's own sliding-window mask still hides what is out of the window."""
        return StaticLayer(self.max_seq_len)

    def attention_masks(self, cache_position: torch.Tensor):
        """The attention mask(s) to pass to the model, or None to let the model build them from the cache."""
        return None

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        if self.custom_sdpa:
            # The attention modules own the cache; positions tell them where the new tokens go.
            outputs = self.model(
                input_ids=input_ids, position_ids=cache_position.unsqueeze(0), use_cache=False, logits_to_keep=1
            )
            return outputs.logits
        restart_cache_at(self.cache, cache_position)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=self.attention_masks(cache_position),
            position_ids=cache_position.unsqueeze(0),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return outputs.logits

    def example_inputs(self, seq_len: int = 4) -> Dict[str, Tuple[Any, ...]]:
        """Example arguments of each exported method."""
        seq_len = min(seq_len, self.max_chunk_len)
        input_ids = torch.zeros((1, seq_len), dtype=torch.long)
        cache_position = torch.arange(seq_len, dtype=torch.long)
        return {"forward": (input_ids, cache_position)}

    @classmethod
    def input_plan(cls, max_seq_len: int, **kwargs) -> Dict[str, Any]:
        """The inputs of each method, for a dry run: name, dtype, shape (dynamic dimensions as ranges)."""
        seq = f"seq_len 1..{cls.chunk_len_for(max_seq_len, **kwargs)}"
        return {
            "forward": [
                {"name": "input_ids", "dtype": "int64", "shape": [1, seq]},
                {"name": "cache_position", "dtype": "int64", "shape": [seq]},
            ]
        }

    def dynamic_shapes(self) -> Dict[str, Any]:
        """Dynamic dimensions of each method: the sequence length, from 1 to max_seq_len - 1."""
        seq = torch.export.Dim("seq_len", min=1, max=self.max_chunk_len)
        return {"forward": ({1: seq}, {0: seq})}

    def metadata(self, generation_config) -> Dict[str, Any]:
        """Constant methods stored in the program, read by ExecuTorch's LLM runner and by our runtime."""
        text_config = self.model.config.get_text_config()
        eos = generation_config.eos_token_id if generation_config is not None else None
        if eos is None:
            eos = text_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        bos = generation_config.bos_token_id if generation_config is not None else None
        if bos is None:
            bos = getattr(text_config, "bos_token_id", None)
        metadata = {
            # ExecuTorch's runner feeds at most get_max_seq_len tokens a call, get_max_context_len in all.
            contract.MAX_SEQ_LEN: self.max_seq_len if self.max_chunk_len == self.max_seq_len - 1 else self.max_chunk_len,
            contract.MAX_CONTEXT_LEN: self.max_seq_len,
            contract.VOCAB_SIZE: int(text_config.vocab_size),
            contract.N_LAYERS: int(text_config.num_hidden_layers),
            contract.EOS_IDS: [int(i) for i in eos_ids],
            contract.USE_KV_CACHE: True,
            contract.ENABLE_DYNAMIC_SHAPE: True,
        }
        if bos is not None:
            metadata[contract.BOS_ID] = int(bos)
        return metadata
