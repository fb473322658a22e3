"""Export side: Hugging Face model -> torch.export -> ExecuTorch program directory."""

from .convert import main_export
from .options import ExportOptions

__all__ = ["main_export", "ExportOptions"]
