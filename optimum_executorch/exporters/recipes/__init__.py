"""Backend recipes: how exported programs are lowered for one ExecuTorch backend.

One file per backend, each registering a `Recipe` subclass with `@register_recipe`.
"""

from typing import Dict, Type

from ..options import _suggest
from .base import Recipe

RECIPES: Dict[str, Type[Recipe]] = {}


def register_recipe(cls: Type[Recipe]) -> Type[Recipe]:
    if cls.name in RECIPES:
        raise ValueError(f"Recipe '{cls.name}' is registered twice.")
    RECIPES[cls.name] = cls
    return cls


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(
            f"Recipe '{name}' is not supported.{_suggest(name, RECIPES)} Supported recipes: {', '.join(sorted(RECIPES))}."
        )
    return RECIPES[name]()


from . import portable, xnnpack  # noqa: E402,F401
