"""XNNPACK: the optimized CPU backend for Arm and x86 (the default recipe)."""

from . import register_recipe
from .base import Recipe


@register_recipe
class XnnpackRecipe(Recipe):
    name = "xnnpack"
    supported_dtypes = ("float32", "float16")
    custom_sdpa_default = True

    def partitioners(self):
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]
