"""`ExportOptions`: the one typed description of an export, built by every entry point.

The CLI, `main_export(**kwargs)` and `ExecuTorchModelFor*.from_pretrained(..., export=True)` all end up
here. Unknown or misspelled options are rejected with a "did you mean" hint instead of being ignored.
"""

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..peer_options import ALIASES
from ..peer_options import translate as translate_peer_options
from .registry import suggest

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class ExportOptions:
    """Everything that decides what an export produces.

    Args:
        model: a local directory holding a transformers checkpoint, or a Hugging Face Hub model id.
        output_dir: where the export directory (`model.pte` + configs + tokenizer) is written.
        task: what the program does (`text-generation`, ...). `None` infers it from the checkpoint.
        recipe: the ExecuTorch backend recipe (`xnnpack`, `portable`).
        max_seq_len: the context the program is exported for (prompt + generated tokens). Defaults to
            `min(2048, max_position_embeddings)`.
        dtype: the dtype of weights and activations (`float32`, `float16`, `bfloat16`).
        gguf_file: name of a `.gguf` file inside `model` (or a path to one), dequantized on load.
        revision: the Hub revision (branch, tag or commit) to load.
        trust_remote_code: allow modeling code shipped with the checkpoint to run. Off by default.
        cache_dir: Hugging Face cache directory.
        subfolder: the checkpoint's folder inside `model` (a Hub repo or a local directory).
        local_files_only: load from the local cache only (no download); `force_download`: download again.
        token: Hugging Face Hub token.
        overwrite: replace an existing, non-empty `output_dir`.
        qlinear: quantize every linear layer (`8da4w`, `8da8w`), see `quantization.py`.
        qlinear_group_size: group size of the quantized linear weights (default 32 for 8da4w; 0: per
            channel, the only choice for 8da8w).
        qlinear_8bit_layers: with `qlinear="8da4w"`, linear layers kept at 8da8w, by name (`down_proj`,
            `lm_head`, ...): the layers that lose the most at 4 bits.
        qlinear_method: how the quantized linear weights are rounded: `auto` (default: GPTQ for the few 4-bit
            linears of a decoder that are not on a GGUF checkpoint's 4-bit grid, round to nearest otherwise),
            `rtn` (round to nearest) or `gptq` (GPTQ on calibration text for every linear, text-generation only).
        calibration_data: with `qlinear_method="gptq"`, a UTF-8 text file to calibrate on; `None`: text the model
            samples itself.
        qembedding: quantize the embeddings (`4w`, `8w`).
        qembedding_group_size: group size of the quantized embedding weights (default 0: per row).
        custom_sdpa: attention through ExecuTorch's `custom_sdpa` op with an in-place `[B, S, H, D]`
            KV cache. `None` (default): on where the recipe and the model support it.
        custom_kv_cache: with custom SDPA, update the KV cache in place with ExecuTorch's `update_cache`
            op. `None` (default): whenever custom SDPA is on; `False`: `index_copy_` instead (for comparison).
        external_weights: write the weights to `model.ptd` beside `model.pte` (ExecuTorch's program-data
            separation), each distinct tensor once. `None` (default): when it saves space, i.e. when the
            embedding and the LM head share one unquantized weight; `True` / `False`: always / never.
        dry_run: resolve and return the export plan (`ExportPlan`) without loading weights or writing files.
        extension_modules: paths of Python files defining `ModelExtension` classes (out-of-tree architectures),
            imported before the model config is read.
    """

    model: str
    output_dir: Optional[str] = None
    task: Optional[str] = None
    recipe: str = "xnnpack"
    max_seq_len: Optional[int] = None
    dtype: str = "float32"
    gguf_file: Optional[str] = None
    revision: Optional[str] = None
    trust_remote_code: bool = False
    cache_dir: Optional[str] = None
    subfolder: str = ""
    local_files_only: bool = False
    force_download: bool = False
    token: Optional[str] = None
    overwrite: bool = False
    custom_sdpa: Optional[bool] = None
    custom_kv_cache: Optional[bool] = None
    external_weights: Optional[bool] = None
    dry_run: bool = False
    extension_modules: Optional[List[str]] = None
    qlinear: Optional[str] = None
    qlinear_group_size: Optional[int] = None
    qlinear_8bit_layers: Optional[List[str]] = None
    qlinear_method: str = "auto"
    calibration_data: Optional[str] = None
    qembedding: Optional[str] = None
    qembedding_group_size: int = 0
    # The options given with a value other than the default (set by `from_kwargs`): a plan says these came from
    # the user, and an extension's defaults do not replace them. Not an option itself.
    explicit: frozenset = dataclasses.field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def field_names(cls):
        return [f.name for f in dataclasses.fields(cls) if f.name != "explicit"]

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "ExportOptions":
        """Builds options from keyword arguments (this package's names, or the peer optimum-executorch's, see
        `peer_options`), rejecting unknown names with a suggestion."""
        kwargs = translate_peer_options(kwargs)
        for path in ("model", "output_dir"):
            if kwargs.get(path) is not None:
                kwargs[path] = os.fspath(kwargs[path])
        if kwargs.get("subfolder") and kwargs.get("model") and os.path.isdir(kwargs["model"]):
            kwargs["model"], kwargs["subfolder"] = os.path.join(kwargs["model"], kwargs["subfolder"]), ""
        names = cls.field_names()
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            msgs = [f"'{k}'.{suggest(k, names, ALIASES)}" for k in unknown]
            raise TypeError(
                "Unknown export option " + " ".join(msgs) + f" Valid options: {', '.join(sorted(names))}."
            )
        defaults = cls(model=kwargs.get("model"))
        explicit = frozenset(k for k, v in kwargs.items() if getattr(defaults, k) != v)
        options = cls(**kwargs, explicit=explicit)
        options.validate()
        return options

    def validate(self) -> None:
        """Checks every value that can be checked before any model is loaded."""
        from .recipes import get_recipe
        from .tasks import get_task

        if not self.model:
            raise ValueError("No model given: pass a local checkpoint directory or a Hugging Face Hub model id.")
        if self.task is not None:
            get_task(self.task)
        recipe = get_recipe(self.recipe)
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"dtype '{self.dtype}' is not supported.{suggest(self.dtype, SUPPORTED_DTYPES)} "
                f"Choose one of: {', '.join(SUPPORTED_DTYPES)}."
            )
        if self.dtype not in recipe.supported_dtypes:
            raise ValueError(
                f"The '{recipe.name}' recipe does not support dtype '{self.dtype}'. "
                f"It supports: {', '.join(recipe.supported_dtypes)}."
            )
        for size, scheme in (("qlinear_group_size", "qlinear"), ("qembedding_group_size", "qembedding")):
            if getattr(self, scheme) is None and getattr(self, size) not in (None, 0):
                raise ValueError(f"--{size} sets the group size of --{scheme}, which is not given: pass --{scheme} too.")
        recipe.check_quantization(self.quantization_spec())  # raises on an invalid scheme or group size
        if self.max_seq_len is not None and (not isinstance(self.max_seq_len, int) or self.max_seq_len < 2):
            raise ValueError(f"max_seq_len must be an integer >= 2, got {self.max_seq_len!r}.")

    def quantization_spec(self):
        from .quantization import QuantizationSpec

        return QuantizationSpec.of_options(self)

    def to_dict(self) -> Dict[str, Any]:
        """The options as written into `executorch_config.json` (no secrets)."""
        local = ("token", "cache_dir", "output_dir", "local_files_only", "force_download")  # not the export's
        return {k: getattr(self, k) for k in self.field_names() if k not in local}
