"""`ModelExtension`: how an architecture plugs into the exporter without forking it.

An extension is one class per architecture: `model_types = ("my_arch",)` plus the hooks it needs (see
`ModelExtension`). It is an `ExportConfig`, so everything a built-in family can say, an extension can say too.

- Built-in extensions live one package per architecture under this folder (`extensions/<arch>/`), each
  exporting its class(es) from `__init__.py`; they are imported only when a config names a model_type no
  family has registered (`discover_builtin_extensions`).
- Out-of-tree extensions are Python files: `--extension_modules path/to/my_ext.py` (CLI) or
  `main_export(..., extension_modules=["path/to/my_ext.py"])`. Every `ModelExtension` subclass defined in
  the file with `model_types` is registered; a file may also register its own config and model classes with
  transformers' Auto classes (a custom architecture).
- Two extensions (or an extension and a built-in family) claiming one model_type is an error naming both.
"""

import contextlib
import importlib
import importlib.util
import inspect
import logging
import pkgutil
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional

from ..configs import EXPORT_CONFIGS
from ..configs.base import ExportConfig

logger = logging.getLogger(__name__)


class ModelExtension(ExportConfig):
    """Base class of architecture extensions. Override what the architecture needs; the defaults change nothing.

    Hooks (defined on `ExportConfig`, see there): `patch_model(model)` (a context manager for export),
    `export_defaults(recipe, task)`, `extra_metadata()`, plus everything an export config says (tasks,
    `model_load_kwargs`, `supports_custom_sdpa`, `wrapper_kwargs`, `resolve_max_seq_len`, tiny-config sizes).

    Class attributes:
        model_types: the `config.model_type` values this extension handles.
        tasks: the tasks it supports (first: the default), as for any `ExportConfig`.
        cache_layout: how the model keeps state between decode steps: `"full"` (one KV cache per layer over the
            whole context), `"sliding_window"`, `"hybrid"` (both, per layer), `"recurrent"` (a fixed-size state,
            e.g. convolution or SSM). Recorded in `executorch_config.json`.
    """

    cache_layout: str = "full"

    def rename_weights(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """Maps checkpoint parameter names to the (patched) model's names, for fused or renamed parameters.
        (Used by `optimum_executorch.testing.assert_weights_resolve`; loading still goes through transformers.)"""
        return state_dict


class ModulePatcher:
    """Records every attribute it changes (a module's class, a `forward`, anything else) and restores them all,
    last change first, on `restore()` / when leaving `with`.

    Example:
        ```python
        def patch_model(self, model):
            patcher = ModulePatcher()
            for module in model.modules():
                if type(module).__name__ == "MyNorm":
                    patcher.set(module, "forward", functools.partial(export_friendly_norm, module))
            return patcher
        ```
    """

    _MISSING = object()

    def __init__(self):
        self._changes: List[tuple] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._changes.append((obj, name, obj.__dict__.get(name, self._MISSING) if name != "__class__" else obj.__class__))
        setattr(obj, name, value)

    def restore(self) -> None:
        while self._changes:
            obj, name, old = self._changes.pop()
            if old is self._MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

    def __enter__(self) -> "ModulePatcher":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def _origin(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__} ({inspect.getsourcefile(cls) or 'unknown file'})"


def register_extension(cls):
    """Registers `cls` (a `ModelExtension` subclass) for each of its `model_types`. Class decorator."""
    if not (isinstance(cls, type) and issubclass(cls, ModelExtension)):
        raise TypeError(f"{cls!r} is not a ModelExtension subclass.")
    if not cls.model_types:
        raise ValueError(f"{_origin(cls)} declares no model_types: set model_types = ('<model_type>',).")
    for model_type in cls.model_types:
        existing = EXPORT_CONFIGS.get(model_type)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"model_type '{model_type}' is claimed twice: by {_origin(existing)} and by {_origin(cls)}. "
                "Remove one of them (or give them different model_types)."
            )
    for model_type in cls.model_types:
        EXPORT_CONFIGS[model_type] = cls
    return cls


def load_extension_modules(paths: Iterable[str]) -> List[type]:
    """Imports each Python file in `paths` and registers the `ModelExtension` subclasses it defines."""
    registered = []
    for path in paths or ():
        file = Path(path)
        if file.suffix != ".py" or not file.is_file():
            raise FileNotFoundError(f"Extension module '{path}' is not a Python file. Pass the path to a .py file.")
        name = f"optimum_executorch_extension_{file.stem}_{abs(hash(str(file.resolve())))}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as err:
                del sys.modules[name]
                raise ImportError(f"Could not import extension module '{path}': {type(err).__name__}: {err}") from err
        module = sys.modules[name]
        found = [
            obj for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, ModelExtension) and obj.model_types and obj.__module__ == name
        ]  # fmt: skip
        if not found:
            raise ValueError(
                f"Extension module '{path}' defines no ModelExtension subclass with model_types. Define one, e.g. "
                "`class MyExtension(ModelExtension): model_types = ('my_arch',)`."
            )
        for cls in found:
            register_extension(cls)
            logger.info("Extension %s registered for %s.", cls.__qualname__, ", ".join(cls.model_types))
        registered.extend(found)
    return registered


def discover_builtin_extensions() -> Iterator[str]:
    """Imports the built-in extension packages (`extensions/<arch>/`), each registering its classes."""
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")
            yield info.name


def find_extension(model_type: Optional[str]) -> None:
    """Makes sure the built-in extensions are registered when `model_type` has no export config yet."""
    if model_type not in EXPORT_CONFIGS:
        for _ in discover_builtin_extensions():
            pass
