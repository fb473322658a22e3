"""`main_export()`: the one export pipeline that the CLI and `from_pretrained(export=True)` call.

options -> plan (config, export config, task, recipe, every setting with its source), then the stages, each
timed and logged by `stage()`: load (eager model + preprocessors) -> quantize -> export (wrapper +
torch.export) -> lower (recipe) -> write (the output directory, atomically: a failed export leaves nothing).
"""

import contextlib
import gc
import logging
import os
import shutil
import time
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch

from ..contract import (
    CUSTOM_OPS_KERNEL_LIBRARY,
    PTE_FILE_NAME,
    QUANTIZED_KERNEL_LIBRARY,
    WEIGHTS_FILE_NAME,
    ExportManifest,
)
from ..utils import file_sha256
from .loading import (
    gguf_parsed_once,
    load_model,
    load_preprocessor,
    sentencepiece_model_file,
)
from .options import ExportOptions
from .output_dir import prepare_output_dir, write_output
from .plan import ExportPlan, make_plan
from .quantizer import quantize
from .sentencepiece_model import write_sentencepiece_model
from .tokenizer_check import check_runner_tokenizer
from .weights import widen

logger = logging.getLogger(__name__)

# The stages of an export, in order: the names every log line and timing uses.
STAGES = ("load", "quantize", "export", "lower", "write")


def _package_versions() -> Dict[str, str]:
    versions = {}
    for name in ("optimum-executorch", "executorch", "torch", "torchao", "transformers", "optimum"):
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            pass
    return versions


def export_programs(wrapper) -> Dict[str, "torch.export.ExportedProgram"]:
    """Runs `torch.export` on every method of `wrapper`.

    Export is strict (TorchDynamo) unless the wrapper says `strict_export = False`: a non-strict export
    runs the module in Python under fake tensors, 2-3x faster (SmolLM2-135M 8da4w: 11-18 s instead of
    34-40 s), but with transformers' `StaticCache` its program takes some tensors twice (the cache's) and
    fails in `to_edge_transform_and_lower` (`expected compiled_fn to be GraphModule`).
    """
    programs = {}
    example_inputs = wrapper.example_inputs()
    dynamic_shapes = wrapper.dynamic_shapes()
    for name in wrapper.method_names:
        start = time.perf_counter()
        logger.info("Exporting method '%s' with torch.export...", name)
        module = wrapper if name == "forward" else getattr(wrapper, name)
        with torch.no_grad():
            programs[name] = torch.export.export(
                module, example_inputs[name], dynamic_shapes=dynamic_shapes[name],
                strict=getattr(wrapper, "strict_export", True),
            )
        logger.info("Exported '%s' in %.1f s.", name, time.perf_counter() - start)
    return programs


@contextlib.contextmanager
def _fewer_garbage_collections(first_generation: int = 100_000):
    """Python's cycle collector, at its default thresholds (700, 10, 10), runs a full pass over every live
    object (the model, each graph, its fake tensors) every few hundred thousand allocations; an export
    allocates millions of short-lived graph objects: SmolLM2-135M 8da4w spent 29 s of ~200 collecting, 25 s
    of it in 45 full passes. With the first threshold raised to 50,000-200,000 for the duration of the
    export: ~10 s, one full pass or none, peak RSS unchanged.
    The thresholds are restored after; a collector switched off (threshold 0) stays off."""
    thresholds = gc.get_threshold()
    if thresholds[0]:
        gc.set_threshold(max(first_generation, thresholds[0]), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


@_fewer_garbage_collections()
def main_export(
    model: Optional[str] = None,
    output_dir: Optional[Union[str, os.PathLike]] = None,
    task: Optional[str] = None,
    **kwargs: Any,
) -> Union[Path, "ExportPlan"]:
    """Exports a Hugging Face model to an ExecuTorch program directory.

    Args: `model`, a checkpoint directory or Hub id; `output_dir`, the directory to write (new or empty unless
    `overwrite=True`); `task`, inferred from the model when `None`; `**kwargs`, any other `ExportOptions` field
    (`recipe`, `max_seq_len`, `dtype`, `gguf_file`, `qlinear`, ...; unknown names raise `TypeError`). The option
    names of huggingface/optimum-executorch (`model_name_or_path`, `use_custom_sdpa`, ...) are accepted too.

    Returns the output directory; with `dry_run=True`, the `ExportPlan` (nothing loaded, nothing written).
    Example: `main_export("path/to/SmolLM2-135M", "out/", task="text-generation", max_seq_len=256)`.
    """
    options = ExportOptions.from_kwargs(model=model, output_dir=output_dir, task=task, **kwargs)
    output_dir = None if options.dry_run and output_dir is None else prepare_output_dir(options)  # a plan writes nothing
    start = time.perf_counter()

    with gguf_parsed_once():  # a GGUF checkpoint is read for the plan, the model and the tokenizer
        plan = make_plan(options)
        if options.dry_run:
            return plan
        with stage("load"):
            eager, preprocessors = load_stage(plan)
    with stage("quantize"):
        quantized_layers = quantize_stage(plan, eager, preprocessors.get("tokenizer"))
    with stage("export"):
        wrapper, programs, constant_methods = export_stage(plan, eager)
    with stage("lower"):
        executorch_program = plan.recipe.lower(programs, constant_methods, external_weights=plan.external_weights)
    manifest = build_manifest(plan, wrapper, constant_methods, quantized_layers)
    with stage("write"):
        write_output(
            output_dir, options.overwrite, lambda d: write_files(d, plan, eager, preprocessors, executorch_program, manifest)
        )
    sizes = ", ".join(f"{name} {(output_dir / name).stat().st_size / 1e6:.1f} MB" for name in manifest.checksums)
    logger.info("Wrote %s (%s) in %.1f s in total.", output_dir, sizes, time.perf_counter() - start)
    return output_dir


@contextlib.contextmanager
def stage(name: str):
    """Times and logs one stage of an export (`STAGES`), with the process's peak RSS at its end."""
    start = time.perf_counter()
    yield
    # The stage's cyclic garbage (graphs, fake tensors, program copies: some hold weights) goes before the next
    # stage allocates, not whenever the raised thresholds of `_fewer_garbage_collections` come round: one full pass.
    gc.collect()
    logger.info("Stage %-8s done in %6.1f s (peak RSS %.0f MB, anonymous now %.0f MB).", name,
                time.perf_counter() - start, _peak_rss_mb(), _anonymous_rss_mb())  # fmt: skip


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def _anonymous_rss_mb() -> float:
    """The process's resident memory that is not a mapped file (Linux; 0 elsewhere): what the export holds itself,
    as opposed to checkpoint pages the kernel can drop."""
    try:
        with open("/proc/self/status") as status:
            return next((int(line.split()[1]) for line in status if line.startswith("RssAnon:")), 0) / 1024
    except OSError:
        return 0.0


def load_stage(plan: ExportPlan) -> Tuple[Any, Dict[str, Any]]:
    """The eager model (eval, requested dtype) and the preprocessors the task saves with the program."""
    options, task_spec = plan.options, plan.task_spec
    logger.info("Loading '%s' (%s, task %s)...", options.model, plan.hf_config.model_type, task_spec.name)
    # Preprocessors first: a damaged tokenizer fails the export before the weights are read.
    preprocessors = {kind: load_preprocessor(options, kind) for kind in task_spec.preprocessors}
    eager = load_model(options, task_spec.load_auto_class(), plan.export_config.model_load_kwargs())
    return eager, preprocessors


def quantize_stage(plan: ExportPlan, eager, tokenizer) -> Dict[str, int]:
    """Quantizes the eager model as planned, and widens what a checkpoint loaded in its narrower stored dtype still
    holds in it (`weights.py`). Returns how many layers got each treatment."""
    dtype = getattr(torch, plan.options.dtype)
    quantized_layers = quantize(eager, plan.quantization, tokenizer, dtype) if plan.quantization.enabled else {}
    widen(eager, dtype)
    return quantized_layers


def export_stage(plan: ExportPlan, eager) -> Tuple[Any, Dict[str, Any], Dict[str, Any]]:
    """The task's wrapper around the (patched) model, its `torch.export`ed methods and its constant methods."""
    export_config = plan.export_config
    with export_config.patch_model(eager):
        wrapper = export_config.wrapper_class()(eager, max_seq_len=plan.max_seq_len, **plan.wrapper_kwargs())
        programs = export_programs(wrapper)
    constant_methods = dict(wrapper.metadata(getattr(eager, "generation_config", None)), **export_config.extra_metadata())
    if plan.external_weights:
        logger.info("Weights go to %s (%s).", WEIGHTS_FILE_NAME, plan.sources["external_weights"])
    return wrapper, programs, constant_methods


def build_manifest(plan: ExportPlan, wrapper, constant_methods, quantized_layers) -> ExportManifest:
    """What was exported, as `executorch_config.json` records it (checksums and tokenizer check added on write)."""
    quantization, options = plan.quantization, plan.options
    kernel_libraries = (
        ([CUSTOM_OPS_KERNEL_LIBRARY] if plan.custom_sdpa else [])
        + quantization.kernel_libraries()
        + ([QUANTIZED_KERNEL_LIBRARY] if (plan.checkpoint_quantization or {}).get("embeddings") else [])
    )
    return ExportManifest(
        task=plan.task_spec.name,
        model_type=plan.hf_config.model_type,
        recipe=plan.recipe.name,
        dtype=options.dtype,
        max_seq_len=plan.max_seq_len,
        methods=list(wrapper.method_names),
        inputs=list(getattr(wrapper, "input_names", ("input_ids", "cache_position"))),
        method_inputs=plan.methods(),
        custom_sdpa=plan.custom_sdpa,
        custom_kv_cache=plan.custom_kv_cache,
        export_config=type(plan.export_config).__name__,
        cache_layout=getattr(plan.export_config, "cache_layout", None),
        weights_file=WEIGHTS_FILE_NAME if plan.external_weights else None,
        kernel_libraries=kernel_libraries,
        quantization=dict(quantization.to_dict(), layers=quantized_layers)
        if quantization.enabled
        else plan.checkpoint_quantization,
        metadata=constant_methods,
        options=options.to_dict(),
        versions=_package_versions(),
        checksums={name: "" for name in [PTE_FILE_NAME] + ([WEIGHTS_FILE_NAME] if plan.external_weights else [])},
    )


def write_files(directory: Path, plan: ExportPlan, eager, preprocessors, executorch_program, manifest) -> None:
    """Writes the program, its weights, the configs, the preprocessors and the manifest into `directory`."""
    options, tokenizer = plan.options, preprocessors.get("tokenizer")
    with open(directory / PTE_FILE_NAME, "wb") as f:
        executorch_program.write_to_file(f)
    if plan.external_weights:
        executorch_program.write_tensor_data_to_file(str(directory))
        if not (directory / WEIGHTS_FILE_NAME).is_file():
            raise RuntimeError(f"ExecuTorch wrote no {WEIGHTS_FILE_NAME} for an export with external weights.")
    eager.config.save_pretrained(directory)
    if getattr(eager, "generation_config", None) is not None and eager.can_generate():
        eager.generation_config.save_pretrained(directory)
    for preprocessor in preprocessors.values():
        if preprocessor is not None:
            preprocessor.save_pretrained(directory)
    if tokenizer is not None and plan.task_spec.llm_runner:
        sentencepiece_model = sentencepiece_model_file(options)
        if sentencepiece_model and not (directory / "tokenizer.model").exists():
            shutil.copy(sentencepiece_model, directory / "tokenizer.model")
        if not (directory / "tokenizer.model").exists() and write_sentencepiece_model(tokenizer, directory / "tokenizer.model"):
            logger.info("Wrote tokenizer.model (rebuilt from tokenizer.json) for ExecuTorch's runner.")
        manifest.runner_tokenizer = check_runner_tokenizer(tokenizer, directory, manifest.metadata)
    manifest.checksums = {name: file_sha256(directory / name) for name in manifest.checksums}
    manifest.to_json(directory)
