"""Per-`model_type` export configs (the ExecuTorch analogue of optimum's `OnnxConfig`).

One class per model family, registered with `@register_export_config("llama", ...)`. A config says which
tasks a family supports, how to load it for export, and its defaults (such as `max_seq_len`).
"""

from typing import Dict, Type

from ..registry import register, suggest
from .base import ExportConfig

EXPORT_CONFIGS: Dict[str, Type[ExportConfig]] = {}


def register_export_config(*model_types: str):
    """Class decorator registering an `ExportConfig` subclass for one or more `model_type`s."""

    def wrap(cls: Type[ExportConfig]) -> Type[ExportConfig]:
        for model_type in model_types:
            register(EXPORT_CONFIGS, model_type, cls, "model_type")
        # Its own model types, not its parent's (Phi3ExportConfig is a DecoderLMExportConfig for phi3 alone).
        cls.model_types = tuple(cls.__dict__.get("model_types", ())) + tuple(model_types)
        return cls

    return wrap


def get_export_config(hf_config, task=None) -> ExportConfig:
    """Returns the export config for `hf_config.model_type` and `task` (inferred when `None`)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in EXPORT_CONFIGS:
        raise ValueError(
            f"model_type '{model_type}' is not supported for export yet.{suggest(str(model_type), EXPORT_CONFIGS)} "
            f"Supported model types: {', '.join(sorted(EXPORT_CONFIGS))}."
        )
    cls = EXPORT_CONFIGS[model_type]
    if task is None:
        task = cls.infer_task(hf_config)
    if task not in cls.tasks:
        raise ValueError(
            f"Task '{task}' is not supported for model_type '{model_type}'; supported: {', '.join(cls.tasks)}. "
            "Pass --task with one of those."
        )
    return cls(hf_config, task)


# Built-in families register themselves on import.
from . import decoder_lm, encoder, seq2seq, speech, vision  # noqa: E402,F401
