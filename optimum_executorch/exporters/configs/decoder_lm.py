"""Decoder-only language models whose attention fits one static KV cache."""

from ... import contract
from . import register_export_config
from .base import ExportConfig


# Each registered model_type is tested against the eager model by tests/test_matrix.py (docs/coverage.md); add a
# family here with the tiny-config overrides that exercise what is particular to it (tests/test_matrix.py).
@register_export_config(
    "llama", "qwen2", "qwen3", "mistral", "olmo", "gemma",
    "olmo2", "granite", "smollm3", "glm", "starcoder2", "cohere2", "phi", "gpt2", "gpt_neox",
)  # fmt: skip
class DecoderLMExportConfig(ExportConfig):
    coverage_representatives = ("llama", "cohere2")  # full attention; sliding + full layers
    """Llama-like decoders: rotary positions, full (or window-masked) attention, one cache per layer."""

    tasks = ("text-generation", "feature-extraction")

    def supports_custom_sdpa(self, max_seq_len: int) -> bool:
        # feature-extraction runs the whole batch at once, with no cache: plain SDPA behind the padding mask.
        return self.task == "text-generation" and super().supports_custom_sdpa(max_seq_len)

    def wrapper_kwargs(self):
        if self.task == "feature-extraction":  # the encoder wrapper: forward(input_ids, attention_mask)
            return {"input_names": ["input_ids", "attention_mask"], "output_name": "last_hidden_state"}
        return dict(super().wrapper_kwargs(), sliding_window=self.sliding_window())


@register_export_config("phi3")
class Phi3ExportConfig(DecoderLMExportConfig):
    """Phi-3 / Phi-3.5 / Phi-4-mini. With long RoPE, a call whose positions pass `original_max_position_embeddings`
    uses the long factors for all of them (traced as a `torch.where`, so the program does the same); transformers'
    generation then drops its cache once and runs the whole sequence again. The program says where, for the
    runtime to do the same."""

    def extra_metadata(self):
        rope = getattr(self.hf_config, "rope_parameters", None) or {}
        # transformers' Phi3ForCausalLM re-runs at the top-level `original_max_position_embeddings` (4096 by default).
        original = getattr(self.hf_config, "original_max_position_embeddings", None)
        if rope.get("rope_type") != "longrope" or not original:
            return super().extra_metadata()
        return dict(super().extra_metadata(), **{contract.REPREFILL_AT: int(original) + 1})
