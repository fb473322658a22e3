"""Encoder-decoder LMs (T5, BART): text2text-generation as an `encoder` and a `decoder` method."""

from typing import Any, Dict, Optional

from . import register_export_config
from .base import ExportConfig

# Layer, head and feed-forward sizes of tiny test models, in the names BART-like configs use (Whisper's too).
TINY_ENCODER_DECODER_SIZES = {
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}


@register_export_config("t5")
class Seq2SeqExportConfig(ExportConfig):
    """T5: relative position buckets, so no position limit; `max_seq_len` bounds the encoder input and the
    decoder's cache (default 512)."""
    coverage_representatives = ("t5",)

    tasks = ("text2text-generation",)
    default_max_seq_len = 512
    tiny_config_base = "seq2seq"
    tiny_config_extra = {"d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4, "decoder_start_token_id": 0}

    def supports_custom_sdpa(self, max_seq_len: int) -> bool:
        return False

    def max_positions(self) -> Optional[int]:
        return getattr(self.hf_config, "max_position_embeddings", None)

    def wrapper_kwargs(self) -> Dict[str, Any]:
        return {"hidden_size": int(self.hf_config.d_model)}


@register_export_config("bart")
class BartExportConfig(Seq2SeqExportConfig):
    """BART: learned positions (`max_position_embeddings`) in encoder and decoder."""

    tiny_config_extra = {
        **TINY_ENCODER_DECODER_SIZES,
        "max_position_embeddings": 128,
        "decoder_start_token_id": 2,
        "forced_eos_token_id": None,
    }
