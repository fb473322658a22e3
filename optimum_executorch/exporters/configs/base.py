"""`ExportConfig`: the base class of the per-family export configs."""

import contextlib
from typing import Any, Dict, Optional


class ExportConfig:
    """What the exporter needs to know about one model family.

    Subclasses set `tasks` (the first one is the default task) and override the hooks they need.
    """

    model_types: tuple = ()
    tasks: tuple = ()
    default_max_seq_len: int = 2048
    # How `optimum_executorch.testing.tiny_config` shrinks this family: which size table it starts from,
    # names this family's config uses instead of the usual ones, and family-specific extra sizes.
    tiny_config_base: str = "decoder"
    tiny_config_renames: Dict[str, str] = {}
    tiny_config_extra: Dict[str, Any] = {}
    # The model_types of this config that stand for its kind of program in the coverage matrix
    # (`testing.matrix.claimed_cells`): claimed with every recipe and quantized, where the others claim xnnpack.
    coverage_representatives: tuple = ()

    def __init__(self, hf_config, task: str):
        self.hf_config = hf_config
        self.task = task

    @classmethod
    def infer_task(cls, hf_config) -> str:
        """The task to export for when none is given: the first of `tasks` unless a family knows better."""
        return cls.tasks[0]

    @classmethod
    def represents_its_kind(cls, model_type: str) -> bool:
        return model_type in cls.coverage_representatives

    @property
    def text_config(self):
        return self.hf_config.get_text_config()

    def model_load_kwargs(self) -> Dict[str, Any]:
        """Extra keyword arguments for `AutoModel*.from_pretrained` when loading for export."""
        return {"attn_implementation": "sdpa"}

    def supports_custom_sdpa(self, max_seq_len: int) -> bool:
        """Whether ExecuTorch's `custom_sdpa` serves every attention layer: causal over the whole context, or over a
        sliding window of it (from a ring cache, see `attention/custom_sdpa.py`)."""
        return True

    def sliding_window(self) -> Optional[int]:
        """The window of the model's sliding-window layers, or None if it has none."""
        layer_types = getattr(self.text_config, "layer_types", None)
        if layer_types is not None and "sliding_attention" not in layer_types:
            return None
        return getattr(self.text_config, "sliding_window", None) or None

    def patch_model(self, model) -> contextlib.AbstractContextManager:
        """A context manager in which `model` can be exported (modules swapped for export-friendly ones). Every
        class and `forward` it changes must be restored on exit (`extensions.ModulePatcher` keeps the books;
        `optimum_executorch.testing.assert_patch_parity` checks it)."""
        return contextlib.nullcontext()

    def export_defaults(self, recipe: str, task: str) -> Dict[str, Any]:
        """Export options this family wants by default for `recipe` and `task` (names of `ExportOptions`
        fields). They never override an option the user set."""
        return {}

    def extra_metadata(self) -> Dict[str, Any]:
        """Extra constant methods stored in the program (name -> int, float, bool or list of ints)."""
        return {}

    def wrapper_class(self):
        """The `nn.Module` class that makes the model exportable for `self.task`: the task's own (`TaskSpec.wrapper`),
        unless the family brings one (e.g. a cache layout the task's wrapper does not know)."""
        from ..tasks import get_task

        return get_task(self.task).load_wrapper_class()

    def wrapper_kwargs(self) -> Dict[str, Any]:
        """Family-specific keyword arguments of the task's exportable wrapper."""
        return {}

    def max_positions(self) -> Optional[int]:
        """The longest sequence the model can take (`max_position_embeddings`), or None if unbounded."""
        return getattr(self.text_config, "max_position_embeddings", None)

    def resolve_max_seq_len(self, requested) -> int:
        """`requested` if given (checked against the model's limit), else min(default, model limit)."""
        limit = self.max_positions()
        if limit is not None and (not isinstance(limit, int) or limit < 2):
            raise ValueError(
                f"config.json gives max_position_embeddings={limit!r}: a model must take at least 2 positions. "
                "Fix the checkpoint's config.json."
            )
        if requested is None:
            return min(self.default_max_seq_len, limit) if limit else self.default_max_seq_len
        if limit and requested > limit:
            raise ValueError(
                f"max_seq_len={requested} exceeds the {limit} positions this model can take. "
                f"Pass --max_seq_len {limit} or less."
            )
        return requested
