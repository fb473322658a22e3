"""Decoder-only language models whose attention fits one static KV cache."""

from . import register_export_config
from .base import ExportConfig


# Each of these is tested against the eager model (tests/test_families.py); add a family here together
# with its test.
@register_export_config("llama", "qwen2", "qwen3", "mistral", "phi3", "olmo", "gemma")
class DecoderLMExportConfig(ExportConfig):
    """Llama-like decoders: rotary positions, full (or window-masked) attention, one cache per layer."""

    tasks = ("text-generation",)
