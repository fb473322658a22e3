"""Custom CPU attention for export: ExecuTorch's `llama::custom_sdpa` and `llama::update_cache` ops."""

from .custom_sdpa import CUSTOM_SDPA, install_custom_sdpa

__all__ = ["CUSTOM_SDPA", "install_custom_sdpa"]
