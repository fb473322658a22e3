"""Portable: ExecuTorch's reference kernels, no delegate. Slow, but runs every op everywhere."""

from . import register_recipe
from .base import Recipe


@register_recipe
class PortableRecipe(Recipe):
    name = "portable"
    supported_dtypes = ("float32", "float16", "bfloat16")
