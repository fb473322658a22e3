"""`ExecuTorchModel`: the base of every runtime class. Loads an exported directory and its program.

This module is the RUNTIME side: it imports `executorch.runtime` and transformers, never the export
side (`optimum_executorch.exporters`, `torch.export`, `executorch.exir`, torchao) at module level. The
export side is imported only inside `from_pretrained(..., export=True)`.
"""

import importlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch
from optimum.modeling_base import OptimizedModel
from transformers import AutoConfig, PretrainedConfig

from ..contract import EXECUTORCH_CONFIG_NAME, KERNEL_LIBRARIES, ExportManifest
from .program_files import (
    CorruptProgramError,
    check_data_file,
    check_program_file,
    explain_runtime_error,
    find_program_file,
    verify_checksums,
)

logger = logging.getLogger(__name__)


def _resolve_model_dir(
    model_id: Union[str, os.PathLike],
    subfolder: str = "",
    revision: Optional[str] = None,
    cache_dir: Optional[str] = None,
    token: Optional[Union[bool, str]] = None,
    local_files_only: bool = False,
    force_download: bool = False,
) -> Path:
    """A local directory holding the exported files: `model_id` itself, or a Hub snapshot of it."""
    local = Path(model_id) / subfolder
    if local.is_dir():
        return local
    if os.path.exists(model_id) or str(model_id).startswith((".", "/")):
        raise FileNotFoundError(f"'{model_id}' is not a directory. Pass the output directory of an export.")
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            str(model_id),
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
            force_download=force_download,
        )
    except Exception as err:
        raise OSError(
            f"Could not find '{model_id}' locally nor download it from the Hugging Face Hub ({err}). Pass an "
            "export directory (see `optimum-cli export executorch --help`), or unset HF_HUB_OFFLINE to download."
        ) from err
    return Path(path) / subfolder


def _holds_program(model_id, subfolder: str, revision, token, local_files_only: bool) -> bool:
    """Whether `model_id` (a directory or a Hub repo) holds a `.pte` program rather than only a checkpoint. When
    the Hub cannot be asked, it is taken to hold one (loading then says what is missing)."""
    local = Path(model_id) / subfolder
    if local.is_dir():
        exported = any(local.glob("*.pte")) or (local / EXECUTORCH_CONFIG_NAME).is_file()
        return exported or not (local / "config.json").is_file()
    if os.path.exists(model_id) or str(model_id).startswith((".", "/")):
        return True
    from huggingface_hub import HfApi, snapshot_download

    try:
        if local_files_only:  # what the cache holds
            cached = Path(snapshot_download(str(model_id), revision=revision, local_files_only=True)) / subfolder
            return any(cached.glob("*.pte")) or not (cached / "config.json").is_file()
        files = HfApi().list_repo_files(str(model_id), revision=revision, token=token)
    except Exception:  # offline, no such repo, no access: loading reports it
        return True
    prefix = f"{subfolder.strip('/')}/" if subfolder else ""
    return any(f.startswith(prefix) and f.endswith(".pte") and "/" not in f[len(prefix):] for f in files)


def _load_config(model_dir: Path) -> PretrainedConfig:
    """The exported `config.json`. An architecture transformers does not know (exported through an out-of-tree
    extension) is read as a plain `PretrainedConfig`: the program, not the modeling code, runs it."""
    try:
        return AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        model_type = PretrainedConfig.get_config_dict(model_dir)[0].get("model_type")
        if model_type is None or model_type in CONFIG_MAPPING:
            raise
        logger.info("config.json of '%s' is of a model type transformers does not know; read as a plain config.", model_dir)
        return PretrainedConfig.from_pretrained(model_dir)


def register_for_pipelines(cls):
    """Class decorator: lists a runtime class in its transformers Auto class (`cls.auto_model_class`).

    `transformers.pipeline(task, model=et_model)` checks the model's class against that Auto class and logs
    an error for any other class. It is registered under `AutoConfig`, a key no real config has, so no
    transformers model lookup changes.
    """
    import transformers

    getattr(transformers, cls.auto_model_class).register(AutoConfig, cls, exist_ok=True)
    return cls


class ExecuTorchModel(OptimizedModel):
    """Base class of the runtime models: an ExecuTorch program plus the configs exported with it.

    Use `from_pretrained(dir_or_repo_id)` to load an export directory, or
    `from_pretrained(model_id, export=True, ...)` to export a transformers checkpoint first.
    """

    task: Optional[str] = None
    auto_model_class = None
    # Keyword arguments of `from_pretrained` that configure the runtime class itself (e.g. `engine`).
    runtime_options: tuple = ()

    def __init__(
        self,
        program,
        config: PretrainedConfig,
        model_save_dir: Union[str, Path],
        manifest: Optional[ExportManifest] = None,
    ):
        super().__init__(model=program, config=config)
        self.program = program
        self.model_save_dir = Path(model_save_dir)
        self.manifest = manifest if manifest is not None else ExportManifest()
        self._temp_dir = None  # keeps an on-the-fly export alive as long as the model
        self._lock = threading.RLock()  # see checks.one_call_at_a_time

    @property
    def executorch_config(self) -> Dict[str, Any]:
        """`executorch_config.json` as a dict (read-only view of `self.manifest`)."""
        return self.manifest.to_dict()

    # ----------------------------------------------------------------------------------------- loading
    @staticmethod
    def load_kernel_libraries(names) -> None:
        """Imports the modules that register kernels a program needs (recorded at export)."""
        for name in names:
            if not name.startswith("executorch."):
                raise ValueError(f"Refusing to import kernel library '{name}': only executorch modules are allowed.")
            importlib.import_module(name)

    @staticmethod
    def load_program(pte_path: Path, weights_path: Optional[Path] = None, checksums: Optional[Dict[str, str]] = None):
        """Loads a `.pte` (and the weights file it was exported with, if any) with `executorch.runtime`.

        The files are checked first (see `program_files.py`): identifiers, header extents and, when given,
        the SHA-256 `checksums` recorded at export, so a damaged file raises an error that names it instead
        of crashing the process or answering NaN. Loader failures become errors that name the fix.
        """
        if not pte_path.is_file():
            raise FileNotFoundError(
                f"No ExecuTorch program at '{pte_path}'. Export one with `optimum-cli export executorch "
                "--model <id> --output_dir <dir>` and load that directory."
            )
        if weights_path is not None and not weights_path.is_file():
            raise FileNotFoundError(
                f"'{pte_path.parent}' holds no {weights_path.name}, the weights {pte_path.name} was exported with. "
                "Copy it beside the program, or export again."
            )
        check_program_file(pte_path)
        if weights_path is not None:
            check_data_file(weights_path)
        verify_checksums(pte_path.parent, checksums)
        from executorch.runtime import Runtime, Verification

        try:
            return Runtime.get().load_program(
                pte_path, verification=Verification.InternalConsistency, data_path=weights_path
            )
        except RuntimeError as err:
            weights = f" or its weights file {weights_path.name}" if weights_path is not None else ""
            raise CorruptProgramError(
                f"'{pte_path}'{weights} is not valid (corrupt, truncated or from another export: "
                f"{explain_runtime_error(err)}). Export it again."
            ) from err

    def load_method(self, name: str):
        """Loads one method of the program; a failure names what the runtime's error code means."""
        try:
            return self.program.load_method(name)
        except RuntimeError as err:
            raise RuntimeError(
                f"Could not load method '{name}' of '{self.model_save_dir}': {explain_runtime_error(err)}."
            ) from err

    def read_constant(self, name: str, default: Any = None) -> Any:
        """The value of a constant metadata method of the program (`get_max_seq_len`, ...)."""
        if name not in self.program.method_names:
            return default
        value = self.load_method(name).execute([])
        return value[0] if len(value) == 1 and not name.endswith("_ids") else list(value)

    @classmethod
    def from_pretrained(
        cls,
        model_id: Union[str, os.PathLike],
        config: Optional[PretrainedConfig] = None,
        export: Optional[bool] = None,
        subfolder: str = "",
        revision: Optional[str] = None,
        force_download: bool = False,
        local_files_only: bool = False,
        trust_remote_code: bool = False,
        cache_dir: Optional[str] = None,
        token: Optional[Union[bool, str]] = None,
        verify_checksums: bool = True,
        file_name: Optional[str] = None,
        **kwargs,
    ) -> "ExecuTorchModel":
        """Loads an exported directory (local or on the Hub), or exports a transformers checkpoint first.

        Args:
            model_id: an export directory, a Hub repo holding one, or a transformers checkpoint directory or
                Hub id (exported on the fly).
            export: `True`: export `model_id` into a temporary directory first; `None` (default): do so when
                `model_id` holds no `.pte` program; `False`: never. Remaining keyword arguments are export
                options (`recipe`, `max_seq_len`, `qlinear`, ..., or the peer optimum-executorch's names), see
                `main_export`, or options of the runtime class (`runtime_options`, such as `engine` for causal LMs).
            verify_checksums: compare the program and weights files with the SHA-256 recorded at export
                before loading them (about 0.6 s per 500 MB). `False` skips it.
            file_name: the program's file in the directory (default `model.pte`, or the directory's only `.pte`).
        """
        runtime_kwargs = {name: kwargs.pop(name) for name in cls.runtime_options if name in kwargs}
        if export is None:
            export = not _holds_program(model_id, subfolder, revision, token, local_files_only)
            if export:
                logger.info("'%s' holds no ExecuTorch program: exporting it first.", model_id)
        if export:
            hub = {"revision": revision, "cache_dir": cache_dir, "token": token if isinstance(token, str) else None,
                   "subfolder": subfolder, "local_files_only": local_files_only, "force_download": force_download}  # fmt: skip
            return cls._export_then_load(model_id, runtime_kwargs, trust_remote_code=trust_remote_code, **hub, **kwargs)
        if kwargs:
            raise TypeError(
                f"Unexpected arguments {sorted(kwargs)} for loading an exported model: '{model_id}' holds a program, "
                "which is loaded as it is. Export options apply when exporting a checkpoint: drop them, or export "
                "the checkpoint (export=True)."
            )
        model_dir = _resolve_model_dir(
            model_id, subfolder, revision, cache_dir, token, local_files_only, force_download
        )
        return cls._from_dir(model_dir, config, verify_checksums, file_name, **runtime_kwargs)

    @classmethod
    def _export_then_load(cls, model_id, runtime_kwargs: Dict[str, Any], **export_options) -> "ExecuTorchModel":
        """Exports `model_id` for this class's task into a temporary directory that lives as long as the model."""
        from ..exporters import main_export  # the export side, only when asked for

        temp_dir = tempfile.TemporaryDirectory(prefix="optimum_executorch_")
        out = Path(temp_dir.name) / "export"
        main_export(str(model_id), out, task=cls.task, **export_options)
        model = cls._from_dir(out, config=None, **runtime_kwargs)
        model._temp_dir = temp_dir
        return model

    @classmethod
    def _from_dir(
        cls,
        model_dir: Path,
        config: Optional[PretrainedConfig] = None,
        verify_checksums: bool = True,
        file_name: Optional[str] = None,
        **runtime_kwargs,
    ) -> "ExecuTorchModel":
        pte_path = find_program_file(model_dir, file_name)
        manifest = ExportManifest.from_json(model_dir)
        if (model_dir / EXECUTORCH_CONFIG_NAME).is_file():
            cls.load_kernel_libraries(manifest.kernel_libraries)
            weights_file = manifest.weights_file
        else:  # made by another exporter (huggingface/optimum-executorch): nothing says which kernels it needs
            cls.load_kernel_libraries(KERNEL_LIBRARIES)
            weights_file = pte_path.with_suffix(".ptd").name if pte_path.with_suffix(".ptd").is_file() else None
        if weights_file is not None and Path(weights_file).name != weights_file:
            raise ValueError(f"weights_file {weights_file!r} in {EXECUTORCH_CONFIG_NAME} must be a file name in '{model_dir}'.")
        program = cls.load_program(
            pte_path, model_dir / weights_file if weights_file else None, manifest.checksums if verify_checksums else None
        )
        task = manifest.task
        if cls.task and task and task != cls.task:
            raise ValueError(
                f"'{model_dir}' was exported for task '{task}', which {cls.__name__} does not run "
                f"({cls.task}). Load it with the runtime class of that task."
            )
        if config is None:
            config = _load_config(model_dir) if (model_dir / "config.json").is_file() else cls.config_from_program(program, model_dir)
        return cls(program, config, model_save_dir=model_dir, manifest=manifest, **runtime_kwargs)

    @classmethod
    def config_from_program(cls, program, model_dir: Path) -> PretrainedConfig:
        """The model config of a program directory without `config.json`. Task classes whose program's metadata
        says enough build one (causal LMs); the others need the checkpoint's."""
        raise FileNotFoundError(
            f"'{model_dir}' holds no config.json. Copy the checkpoint's config.json beside the program, or pass "
            "config=AutoConfig.from_pretrained(<checkpoint>)."
        )

    # ------------------------------------------------------------------------------------------ saving
    def _save_pretrained(self, save_directory: Union[str, Path]) -> None:
        """Copies every exported file (program, configs, tokenizer) into `save_directory`."""
        save_directory = Path(save_directory)
        if save_directory.resolve() == self.model_save_dir.resolve():
            return
        for item in self.model_save_dir.iterdir():
            if item.is_file() and item.name != "config.json":
                shutil.copy2(item, save_directory / item.name)

    def save_pretrained(self, save_directory: Union[str, Path], push_to_hub: bool = False, **hub_kwargs) -> None:
        """Writes the program, configs and tokenizer to `save_directory` (a directory `from_pretrained` loads).

        With `push_to_hub=True`, also uploads them, as transformers does: `repo_id` (default: the directory's name)
        and the other `push_to_hub` arguments in `hub_kwargs`.
        """
        super().save_pretrained(save_directory)
        if push_to_hub:
            repo_id = hub_kwargs.pop("repo_id", Path(save_directory).name)
            self._upload_folder(save_directory, repo_id, **hub_kwargs)

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: Optional[str] = None,
        private: Optional[bool] = None,
        token: Optional[Union[bool, str]] = None,
        revision: Optional[str] = None,
        create_pr: bool = False,
    ):
        """Uploads the export directory to the Hugging Face Hub repo `repo_id` (created if missing); transformers'
        arguments. Returns the commit information."""
        with tempfile.TemporaryDirectory() as directory:
            self.save_pretrained(directory)
            return self._upload_folder(directory, repo_id, commit_message, private, token, revision, create_pr)

    @staticmethod
    def _upload_folder(directory, repo_id, commit_message=None, private=None, token=None, revision=None, create_pr=False):
        from huggingface_hub import HfApi

        api = HfApi(token=token if isinstance(token, str) else None)
        api.create_repo(repo_id, private=private, exist_ok=True)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(directory),
            commit_message=commit_message or "Upload ExecuTorch model",
            revision=revision,
            create_pr=create_pr,
        )

    def __repr__(self) -> str:
        methods = [m for m in self.program.method_names if not m.startswith(("get_", "use_", "enable_"))]
        return (
            f"{type(self).__name__}(program='{self.model_save_dir}', task={self.manifest.task!r}, "
            f"recipe={self.manifest.recipe!r}, methods={sorted(methods)})"
        )

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.manifest.dtype)

    def to(self, *args, **kwargs):
        return self  # an ExecuTorch program runs where it is loaded

    def eval(self):
        return self
