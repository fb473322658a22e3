"""Bidirectional text encoders (BERT-like): fill-mask, feature-extraction, text- and token-classification."""

from typing import Any, Dict, Optional

from ..tasks import get_task
from . import register_export_config
from .base import ExportConfig

# The task a checkpoint is for, read from the class in `config.architectures` when no task is given.
_TASK_BY_ARCHITECTURE_SUFFIX = {
    "ForMaskedLM": "fill-mask",
    "ForPreTraining": "fill-mask",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
}


@register_export_config("bert")
class EncoderExportConfig(ExportConfig):
    """BERT-like encoders. The program takes `token_type_ids` when the model has segment embeddings."""
    coverage_representatives = ("bert",)

    tasks = ("feature-extraction", "fill-mask", "text-classification", "token-classification")
    default_max_seq_len = 512
    tiny_config_base = "encoder"
    # How many positions of `max_position_embeddings` a sequence cannot use (RoBERTa's padding offset).
    position_offset = 0

    @classmethod
    def infer_task(cls, hf_config) -> str:
        for architecture in getattr(hf_config, "architectures", None) or []:
            for suffix, task in _TASK_BY_ARCHITECTURE_SUFFIX.items():
                if architecture.endswith(suffix):
                    return task
        return "feature-extraction"

    def supports_custom_sdpa(self, max_seq_len: int) -> bool:
        return False

    def max_positions(self) -> Optional[int]:
        limit = getattr(self.hf_config, "max_position_embeddings", None)
        return limit - self.position_offset if limit else None

    def input_names(self):
        names = ["input_ids", "attention_mask"]
        if (getattr(self.hf_config, "type_vocab_size", 0) or 0) > 1:
            names.append("token_type_ids")
        return names

    def wrapper_kwargs(self) -> Dict[str, Any]:
        return {"input_names": self.input_names(), "output_name": get_task(self.task).output_name}


@register_export_config("roberta", "xlm-roberta", "camembert")
class RobertaExportConfig(EncoderExportConfig):
    """RoBERTa numbers positions from `pad_token_id + 1`, so `pad_token_id + 1` positions are unusable."""

    @property
    def position_offset(self) -> int:
        return (getattr(self.hf_config, "pad_token_id", None) or 0) + 1


@register_export_config("distilbert")
class DistilBertExportConfig(EncoderExportConfig):
    """DistilBERT: BERT without segment embeddings, with its own names for the sizes."""

    tiny_config_renames = {
        "hidden_size": "dim",
        "intermediate_size": "hidden_dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
    }


@register_export_config("albert")
class AlbertExportConfig(EncoderExportConfig):
    """ALBERT: factorized embeddings, shared layers."""

    tiny_config_extra = {"embedding_size": 32}


@register_export_config("mobilebert")
class MobileBertExportConfig(EncoderExportConfig):
    """MobileBERT: bottleneck layers inside each block."""

    tiny_config_extra = {"embedding_size": 32, "intra_bottleneck_size": 32, "true_hidden_size": 32}
