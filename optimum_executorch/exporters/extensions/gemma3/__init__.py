"""Gemma 3 (text): sliding-window layers (window 512 in the released models) interleaved with full-attention
layers, each sliding layer with a ring-buffer cache of fixed size (`wrappers/ring_cache.py`)."""

from typing import Any, Dict

from ...wrappers.ring_cache import RingCacheCausalLMExportableModule
from .. import ModelExtension, register_extension


@register_extension
class Gemma3TextExtension(ModelExtension):
    """`gemma3_text` (`Gemma3ForCausalLM`): text generation with a hybrid cache."""
    coverage_representatives = ("gemma3_text",)

    model_types = ("gemma3_text",)
    tasks = ("text-generation",)
    cache_layout = "hybrid"
    tiny_config_extra = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}

    def wrapper_class(self):
        return RingCacheCausalLMExportableModule

    def wrapper_kwargs(self) -> Dict[str, Any]:
        config = self.text_config
        return {"sliding_window": config.sliding_window, "layer_types": list(config.layer_types)}
