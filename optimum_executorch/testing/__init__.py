"""Tiny-model helpers for checking an export against the eager model.

Public and documented, for contributors and extension authors; the project's own tests use them.
`tiny_models` builds tiny random models, configs and tokenizers; `parity` compares programs and patched
models with the eager model.

Example:
    ```python
    from optimum_executorch.testing import save_tiny_model, assert_generation_matches_eager
    from optimum.executorch import ExecuTorchModelForCausalLM, main_export

    src = save_tiny_model("qwen3", "tiny-qwen3/")
    main_export(src, "tiny-qwen3-et/", max_seq_len=64)
    assert_generation_matches_eager(src, ExecuTorchModelForCausalLM.from_pretrained("tiny-qwen3-et/"))
    ```
"""

from .parity import (
    assert_generation_matches_eager,
    assert_logits_close,
    assert_patch_parity,
    assert_teacher_forced_close,
    assert_weights_resolve,
    export_and_compare,
    greedy_eager,
    load_eager,
)
from .tiny_models import (
    TINY_CHAT_TEMPLATE,
    TINY_DECODER_CONFIG,
    TINY_ENCODER_CONFIG,
    TINY_SEQ2SEQ_CONFIG,
    TINY_VISION_CONFIG,
    keep_whole_character_tokens,
    save_tiny_encoder,
    save_tiny_image_classifier,
    save_tiny_model,
    save_tiny_sentencepiece_tokenizer,
    spread_vision_weights,
    tiny_config,
    tiny_tokenizer,
    tiny_wordpiece_tokenizer,
)
from .tiny_speech import TINY_WHISPER_CHUNK_SECONDS, save_tiny_whisper, tiny_whisper_tokenizer

__all__ = [
    "assert_generation_matches_eager",
    "assert_logits_close",
    "assert_patch_parity",
    "assert_teacher_forced_close",
    "assert_weights_resolve",
    "export_and_compare",
    "greedy_eager",
    "load_eager",
    "TINY_CHAT_TEMPLATE",
    "TINY_DECODER_CONFIG",
    "TINY_ENCODER_CONFIG",
    "TINY_SEQ2SEQ_CONFIG",
    "TINY_VISION_CONFIG",
    "keep_whole_character_tokens",
    "save_tiny_encoder",
    "save_tiny_image_classifier",
    "save_tiny_model",
    "save_tiny_sentencepiece_tokenizer",
    "spread_vision_weights",
    "tiny_config",
    "tiny_tokenizer",
    "tiny_wordpiece_tokenizer",
    "TINY_WHISPER_CHUNK_SECONDS",
    "save_tiny_whisper",
    "tiny_whisper_tokenizer",
]
