"""optimum-executorch: export Hugging Face models to ExecuTorch and run them with the transformers API.

Names are resolved lazily, so that `from optimum_executorch import ExecuTorchModelForCausalLM` loads only
the runtime side, and `main_export` loads the export side only when it is used.
"""

import importlib
import logging

from .version import __version__


def _not_import_noise(record: logging.LogRecord) -> bool:
    # Two notes printed on importing torchao, before the output (or the error) of every command: its CUDA kernel
    # libraries (_C_*.so) do not load on a CPU-only install, and it registers an Enum as a pytree constant.
    message = record.getMessage()
    return not (
        message.startswith("Failed to load") and "torchao/_C" in message
        or "is an Enum subclass and is now natively supported" in message
    )


for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).addFilter(_not_import_noise)

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
