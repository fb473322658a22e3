"""`ExportConfig`: the base class of the per-family export configs."""

from typing import Any, Dict


class ExportConfig:
    """What the exporter needs to know about one model family.

    Subclasses set `tasks` (the first one is the default task) and override the hooks they need.
    """

    model_types: tuple = ()
    tasks: tuple = ()
    default_max_seq_len: int = 2048

    def __init__(self, hf_config, task: str):
        self.hf_config = hf_config
        self.task = task

    @property
    def text_config(self):
        return self.hf_config.get_text_config()

    def model_load_kwargs(self) -> Dict[str, Any]:
        """Extra keyword arguments for `AutoModel*.from_pretrained` when loading for export."""
        return {"attn_implementation": "sdpa"}

    def supports_custom_sdpa(self, max_seq_len: int) -> bool:
        """Whether every layer attends causally over the whole context, as `custom_sdpa` does."""
        layer_types = getattr(self.text_config, "layer_types", None)
        if layer_types:
            return all(t == "full_attention" for t in layer_types)
        window = getattr(self.text_config, "sliding_window", None)
        return window is None or window >= max_seq_len

    def resolve_max_seq_len(self, requested) -> int:
        """`requested` if given (checked against the model's limit), else min(default, model limit)."""
        limit = getattr(self.text_config, "max_position_embeddings", None)
        if requested is None:
            return min(self.default_max_seq_len, limit) if limit else self.default_max_seq_len
        if limit and requested > limit:
            raise ValueError(
                f"max_seq_len={requested} exceeds the model's max_position_embeddings={limit}. "
                f"Pass --max_seq_len {limit} or less."
            )
        return requested
