"""optimum-executorch: export Hugging Face models to ExecuTorch and run them with the transformers API.

Names are resolved lazily, so that `from optimum_executorch import ExecuTorchModelForCausalLM` loads only
the runtime side, and `main_export` loads the export side only when it is used.
"""

import importlib

from .version import __version__

_LAZY = {
    "ExecuTorchModel": ".modeling",
    "ExecuTorchModelForCausalLM": ".modeling",
    "ExecuTorchModelForFeatureExtraction": ".modeling",
    "ExecuTorchModelForImageClassification": ".modeling",
    "ExecuTorchModelForMaskedLM": ".modeling",
    "ExecuTorchModelForSeq2SeqLM": ".modeling",
    "ExecuTorchModelForSequenceClassification": ".modeling",
    "ExecuTorchModelForSpeechSeq2Seq": ".modeling",
    "ExecuTorchModelForTokenClassification": ".modeling",
    "main_export": ".exporters",
    "ExportOptions": ".exporters",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
