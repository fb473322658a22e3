"""Decoder-only language models whose attention fits one static KV cache."""

from . import register_export_config
from .base import ExportConfig


@register_export_config(
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "phi3",
    "olmo",
    "olmo2",
    "gemma",
    "granite",
    "smollm3",
)
class DecoderLMExportConfig(ExportConfig):
    """Llama-like decoders: rotary positions, full (or window-masked) attention, one cache per layer."""

    tasks = ("text-generation",)
