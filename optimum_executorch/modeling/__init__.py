"""Runtime side: run exported programs with the transformers API. Never imports the export side."""

from .base import ExecuTorchModel
from .causal_lm import ExecuTorchModelForCausalLM
from .encoder import (
    ExecuTorchModelForFeatureExtraction,
    ExecuTorchModelForMaskedLM,
    ExecuTorchModelForSequenceClassification,
    ExecuTorchModelForTokenClassification,
)

__all__ = [
    "ExecuTorchModel",
    "ExecuTorchModelForCausalLM",
    "ExecuTorchModelForFeatureExtraction",
    "ExecuTorchModelForMaskedLM",
    "ExecuTorchModelForSequenceClassification",
    "ExecuTorchModelForTokenClassification",
]
