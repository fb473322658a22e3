"""Backend recipes: how exported programs are lowered for one ExecuTorch backend.

One file per backend, each registering a `Recipe` subclass with `@register_recipe`.
"""

from typing import Dict, Type

from ..registry import lookup, register
from .base import Recipe

RECIPES: Dict[str, Type[Recipe]] = {}


def register_recipe(cls: Type[Recipe]) -> Type[Recipe]:
    return register(RECIPES, cls.name, cls, "Recipe")


def get_recipe(name: str) -> Recipe:
    return lookup(RECIPES, name, "Recipe")()


from . import portable, xnnpack  # noqa: E402,F401
