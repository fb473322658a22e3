"""`Seq2SeqExportableModule`: an encoder-decoder LM (T5, BART) as two methods, for `torch.export`.

- `encoder(input_ids[1, enc_seq]) -> encoder_hidden_states[1, enc_seq, d_model]`, dynamic `enc_seq`.
- `decoder(decoder_input_ids[1, seq], encoder_hidden_states[1, enc_seq, d_model], cache_position[seq])
  -> logits[1, 1, vocab]`: the decoder's self-attention KV cache is a static cache held inside the program
  (mutable buffers, like the causal LM's); cross-attention keys and values are computed from
  `encoder_hidden_states` on every call, so the caller runs the encoder once per input and passes its
  output to each decoder call. Only the logits of the last position are returned.
"""

from typing import Any, Dict, Optional, Tuple

import torch
from transformers import EncoderDecoderCache, StaticCache
from transformers.cache_utils import DynamicCache, StaticLayer

from ... import contract
from .causal_lm import register_cache_buffers, restart_cache_at

# Dynamic dimensions start at 1; examples larger than 1 keep torch.export from specializing them.
EXAMPLE_ENCODER_SEQ_LEN, EXAMPLE_DECODER_SEQ_LEN = 6, 2


class EncoderMethod(torch.nn.Module):
    """The model's encoder as a method of one input (`input_ids`, or `input_features` for speech)."""

    def __init__(self, model, input_name: str = "input_ids"):
        super().__init__()
        self.encoder = model.get_encoder()
        self.input_name = input_name

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.encoder(**{self.input_name: inputs}, return_dict=True).last_hidden_state


class _DecoderMethod(torch.nn.Module):
    def __init__(self, model, max_seq_len: int):
        super().__init__()
        self.model = model
        config = model.config
        num_layers = next(
            n for n in (getattr(config, k, None) for k in ("decoder_layers", "num_decoder_layers", "num_layers")) if n
        )
        num_heads = getattr(config, "decoder_attention_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "d_kv", None) or config.d_model // num_heads
        self.self_attention_cache = StaticCache(config=config, max_cache_len=max_seq_len)
        self.self_attention_cache.layers = [StaticLayer(max_seq_len) for _ in range(num_layers)]
        self.self_attention_cache.early_initialization(
            batch_size=1, num_heads=num_heads, head_dim=head_dim, dtype=model.dtype, device=model.device
        )
        register_cache_buffers(self, self.self_attention_cache)

    def forward(self, decoder_input_ids, encoder_hidden_states, cache_position) -> torch.Tensor:
        restart_cache_at(self.self_attention_cache, cache_position)
        # An empty cross-attention cache: keys and values are computed from encoder_hidden_states in this call.
        cache = EncoderDecoderCache(self.self_attention_cache, DynamicCache())
        outputs = self.model(
            encoder_outputs=(encoder_hidden_states,),
            decoder_input_ids=decoder_input_ids,
            past_key_values=cache,
            use_cache=True,
            return_dict=True,
        )
        return outputs.logits[:, -1:, :]


class Seq2SeqExportableModule(torch.nn.Module):
    """Wraps a `*ForConditionalGeneration` encoder-decoder model (eval mode) for `torch.export`.

    Args:
        model: the eager transformers model.
        max_seq_len: the longest encoder input, and the number of positions of the decoder's cache (decoder
            start token + generated tokens).
        custom_sdpa: must be False (the CPU custom attention is for decoder-only models).
        hidden_size: the width of `encoder_hidden_states` (`d_model`), checked against the model's.
    """

    method_names = ("encoder", "decoder")
    input_names = ("input_ids",)

    def __init__(self, model, max_seq_len: int, custom_sdpa: bool = False, hidden_size: Optional[int] = None):
        super().__init__()
        if custom_sdpa:
            raise ValueError("custom_sdpa is for decoder-only models.")
        if hidden_size is not None and hidden_size != model.config.d_model:
            raise ValueError(f"hidden_size {hidden_size} differs from the model's d_model {model.config.d_model}.")
        self.model = model
        self.max_seq_len = max_seq_len
        self.encoder = EncoderMethod(model)
        self.decoder = _DecoderMethod(model, max_seq_len)

    def example_inputs(self) -> Dict[str, Tuple[Any, ...]]:
        config = self.model.config
        enc_seq, dec_seq = EXAMPLE_ENCODER_SEQ_LEN, EXAMPLE_DECODER_SEQ_LEN
        hidden = torch.zeros((1, enc_seq, config.d_model), dtype=self.model.dtype)
        return {
            "encoder": (torch.ones((1, enc_seq), dtype=torch.long),),
            "decoder": (torch.zeros((1, dec_seq), dtype=torch.long), hidden, torch.arange(dec_seq)),
        }

    @classmethod
    def input_plan(cls, max_seq_len: int, hidden_size: int = 0, dtype: str = "float32", **kwargs) -> Dict[str, Any]:
        """The inputs of each method, for a dry run: name, dtype, shape (dynamic dimensions as ranges)."""
        enc, dec = f"enc_seq 1..{max_seq_len}", f"seq 1..{max_seq_len - 1}"
        return {
            "encoder": [{"name": "input_ids", "dtype": "int64", "shape": [1, enc]}],
            "decoder": [
                {"name": "decoder_input_ids", "dtype": "int64", "shape": [1, dec]},
                {"name": "encoder_hidden_states", "dtype": dtype, "shape": [1, enc, hidden_size]},
                {"name": "cache_position", "dtype": "int64", "shape": [dec]},
            ],
        }

    def dynamic_shapes(self) -> Dict[str, Any]:
        enc = torch.export.Dim("enc_seq", min=1, max=self.max_seq_len)
        dec = torch.export.Dim("seq", min=1, max=self.max_seq_len - 1)
        return {"encoder": ({1: enc},), "decoder": ({1: dec}, {1: enc}, {0: dec})}

    def metadata(self, generation_config=None) -> Dict[str, Any]:
        config = self.model.config
        eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
        eos = config.eos_token_id if eos is None else eos
        start = getattr(generation_config, "decoder_start_token_id", None) if generation_config is not None else None
        start = config.decoder_start_token_id if start is None else start
        return {
            contract.MAX_SEQ_LEN: self.max_seq_len,
            contract.VOCAB_SIZE: int(config.vocab_size),
            contract.EOS_IDS: [int(i) for i in ([eos] if isinstance(eos, int) else list(eos or []))],
            contract.DECODER_START_TOKEN_ID: int(start),
            contract.D_MODEL: int(config.d_model),
        }
