"""Runtime side: run exported programs with the transformers API. Never imports the export side."""

from .base import ExecuTorchModel
from .causal_lm import ExecuTorchModelForCausalLM
from .encoder import (
    ExecuTorchModelForFeatureExtraction,
    ExecuTorchModelForMaskedLM,
    ExecuTorchModelForSequenceClassification,
    ExecuTorchModelForTokenClassification,
)
from .seq2seq import ExecuTorchModelForSeq2SeqLM
from .speech import ExecuTorchModelForSpeechSeq2Seq
from .vision import ExecuTorchModelForImageClassification

__all__ = [
    "ExecuTorchModel",
    "ExecuTorchModelForCausalLM",
    "ExecuTorchModelForFeatureExtraction",
    "ExecuTorchModelForImageClassification",
    "ExecuTorchModelForMaskedLM",
    "ExecuTorchModelForSeq2SeqLM",
    "ExecuTorchModelForSequenceClassification",
    "ExecuTorchModelForSpeechSeq2Seq",
    "ExecuTorchModelForTokenClassification",
]
