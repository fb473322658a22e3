"""`ExportPlan`: every decision of an export, made from the options and the model config alone.

`make_plan(options)` resolves the task, the family's export config, the recipe, `max_seq_len`, the
quantization, the attention path and where the weights go, and records where each value came from (the
user, the family's config, the recipe, a global default). `main_export` follows the plan;
`main_export(..., dry_run=True)` (CLI `--dry_run`) returns and prints it without loading any weights.
"""

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from .configs import get_export_config
from .extensions import find_extension, load_extension_modules
from .loading import load_config
from .quantization import QuantizationSpec, checkpoint_quantization
from .recipes import get_recipe
from .tasks import get_task

USER = "user"


@dataclass
class ExportPlan:
    """The resolved export. `sources[name]` says where the value of `name` came from."""

    options: Any
    hf_config: Any
    export_config: Any
    task_spec: Any
    recipe: Any
    max_seq_len: Optional[int]
    quantization: Any
    custom_sdpa: bool
    custom_kv_cache: bool
    external_weights: bool
    sources: Dict[str, str] = field(default_factory=dict)
    # How the checkpoint itself is quantized (torchao), recorded in executorch_config.json; None otherwise.
    checkpoint_quantization: Optional[Dict[str, Any]] = None

    def wrapper_kwargs(self) -> Dict[str, Any]:
        kwargs = dict(self.export_config.wrapper_kwargs(), custom_sdpa=self.custom_sdpa)
        if self.custom_sdpa:
            kwargs["custom_kv_cache"] = self.custom_kv_cache
        return kwargs

    def methods(self) -> Dict[str, List[Dict[str, Any]]]:
        """The program's methods and their inputs (dtype, shape with its dynamic dimensions)."""
        wrapper = self.export_config.wrapper_class()
        return wrapper.input_plan(self.max_seq_len, dtype=self.options.dtype, **self.wrapper_kwargs())

    def to_dict(self) -> Dict[str, Any]:
        values = {
            "model": self.options.model,
            "model_type": self.hf_config.model_type,
            "task": self.task_spec.name,
            "recipe": self.recipe.name,
            "dtype": self.options.dtype,
            "max_seq_len": self.max_seq_len,
            "quantization": {k: v for k, v in self.quantization.to_dict().items() if v is not None}
            if self.quantization.enabled
            else None,
            "custom_sdpa": self.custom_sdpa,
            "custom_kv_cache": self.custom_kv_cache,
            "external_weights": self.external_weights,
        }
        return {
            "settings": {k: {"value": v, "source": self.sources.get(k, "default")} for k, v in values.items()},
            "methods": self.methods(),
            "output_dir": self.options.output_dir,
        }

    def format(self) -> str:
        plan = self.to_dict()
        lines = [f"Export plan (dry run: nothing loaded, nothing written) for {plan['output_dir']}:"]
        for name, entry in plan["settings"].items():
            lines.append(f"  {name:<17} {str(entry['value']):<40} ({entry['source']})")
        for method, inputs in plan["methods"].items():
            for spec in inputs:
                dims = ", ".join(str(d) for d in spec["shape"])
                lines.append(f"  method {method}: {spec['name']} {spec['dtype']}[{dims}]")
        return "\n".join(lines)


def _explicit(options, name: str) -> bool:
    return name in options.explicit


def _resolve_custom_sdpa(options, recipe, export_config, max_seq_len: int) -> Tuple[bool, str]:
    supported = export_config.supports_custom_sdpa(max_seq_len)
    if options.custom_sdpa is None:
        if not recipe.custom_sdpa_default:
            return False, f"recipe '{recipe.name}' default"
        reason = f"recipe '{recipe.name}' default" if supported else "model: not every layer attends over the whole context"
        return supported, reason
    if options.custom_sdpa and not supported:
        raise ValueError(
            f"custom_sdpa is not supported for this {export_config.hf_config.model_type} {export_config.task} export: "
            "it serves causal self-attention over the context or a sliding window of it. Drop --custom_sdpa."
        )
    return options.custom_sdpa, USER


def _resolve_custom_kv_cache(options, custom_sdpa: bool) -> Tuple[bool, str]:
    if options.custom_kv_cache is not None and not custom_sdpa:
        raise ValueError(
            "custom_kv_cache applies to custom SDPA only (the cache layout of ExecuTorch's update_cache op is the "
            "one its custom_sdpa reads), and this export uses plain SDPA over a static cache. Drop "
            "--no_custom_kv_cache / custom_kv_cache, or export with custom SDPA."
        )
    if options.custom_kv_cache is not None:
        return options.custom_kv_cache, USER
    return custom_sdpa, "follows custom_sdpa"


def _resolve_external_weights(options, hf_config, task_spec, quantization, recipe, export_config) -> Tuple[bool, str]:
    methods = len(export_config.wrapper_class().method_names)
    if methods > 1 and not recipe.external_weights_across_methods:
        if options.external_weights:
            raise ValueError(
                f"external_weights with the '{recipe.name}' recipe and a program of {methods} methods: ExecuTorch "
                "rejects such a data file when it loads the second method (InvalidExternalData). Drop "
                "--external_weights, or export with --recipe xnnpack."
            )
        return False, f"default: the '{recipe.name}' recipe keeps the weights of a {methods}-method program inside it"
    if options.external_weights is not None:
        return options.external_weights, USER
    tied = task_spec.lm_head and bool(getattr(hf_config.get_text_config(), "tie_word_embeddings", False))
    if tied and not quantization.enabled:
        return True, "default: the embedding and LM head share one weight, stored once in model.ptd"
    return False, "default: no shared weight to store once"


# The plan setting an `ExportOptions` field feeds, where the names differ.
_SETTING_OF_OPTION = dict.fromkeys(QuantizationSpec.field_names(), "quantization")


def _with_extension_defaults(options, export_config):
    """`options` with the defaults the model's extension asks for, except where the user set the option (a new
    value: the caller's options are not changed), and where each came from."""
    defaults = export_config.export_defaults(options.recipe, export_config.task)
    unknown = [name for name in defaults if name not in options.field_names()]
    if unknown:
        raise ValueError(f"{type(export_config).__name__}.export_defaults() names unknown export options {unknown}.")
    applied = {name: value for name, value in defaults.items() if name not in options.explicit}
    if not applied:
        return options, {}
    options = replace(options, **applied)
    options.validate()
    return options, {_SETTING_OF_OPTION.get(name, name): f"{type(export_config).__name__} default" for name in applied}


def make_plan(options) -> ExportPlan:
    """Resolves every decision of the export from `options` and the model config (no weights loaded)."""
    load_extension_modules(options.extension_modules)
    hf_config = load_config(options)
    find_extension(hf_config.model_type)
    export_config = get_export_config(hf_config, options.task)
    options, extension_sources = _with_extension_defaults(options, export_config)
    task_spec = get_task(export_config.task)
    recipe = get_recipe(options.recipe)
    max_seq_len = export_config.resolve_max_seq_len(options.max_seq_len)
    quantization = options.quantization_spec()
    prequantized = checkpoint_quantization(hf_config)
    if prequantized and quantization.enabled:
        raise ValueError(
            f"'{options.model}' is already quantized with torchao ({', '.join(prequantized['configs'])}). Drop "
            "--qlinear / --qembedding to export it as it is, or quantize the unquantized checkpoint."
        )
    if quantization.qlinear_method == "gptq" and not task_spec.llm_runner:
        raise ValueError(
            f"qlinear_method gptq calibrates by running the model on text, which this exporter does for "
            f"text-generation only (this export is {task_spec.name}). Use --qlinear_method rtn."
        )
    custom_sdpa, sdpa_source = _resolve_custom_sdpa(options, recipe, export_config, max_seq_len)
    custom_kv_cache, cache_source = _resolve_custom_kv_cache(options, custom_sdpa)
    external_weights, weights_source = _resolve_external_weights(options, hf_config, task_spec, quantization, recipe, export_config)
    limit = export_config.max_positions()
    sources = {
        "model": USER,
        "model_type": "model config",
        "task": USER if options.task else f"inferred from the {hf_config.model_type} config",
        "recipe": USER if _explicit(options, "recipe") else "default",
        "dtype": USER if _explicit(options, "dtype") else "default",
        "max_seq_len": USER
        if options.max_seq_len is not None
        else "not used: the inputs are not sequences"
        if max_seq_len is None
        else f"default: min({export_config.default_max_seq_len}, max_position_embeddings={limit})",
        "quantization": USER
        if quantization.enabled
        else f"checkpoint: torchao {', '.join(prequantized['configs'])}"
        if prequantized
        else "default: none",
        "custom_sdpa": sdpa_source,
        "custom_kv_cache": cache_source,
        "external_weights": weights_source,
        **extension_sources,
    }
    return ExportPlan(
        options, hf_config, export_config, task_spec, recipe, max_seq_len, quantization,
        custom_sdpa, custom_kv_cache, external_weights, sources, prequantized,
    )  # fmt: skip
