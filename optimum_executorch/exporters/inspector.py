"""Checkpoint inspector: can this architecture be exported, and if not, where does it break?

`inspect_checkpoint(model)` reads the config (no weights), shrinks it to a tiny float32 CPU model (2 layers,
or one layer of each distinct layer type for hybrid models; small hidden size and vocabulary; special token
ids clamped below the new vocabulary), lists the checkpoint's safetensors prefixes (from the file headers),
the attention / norm / MLP / RoPE / convolution module classes of the model, and runs the real export path
(extension patch, task wrapper, `torch.export`) on the tiny model in seconds. What failed comes with the
reason and a starter `ModelExtension` for it. `optimum-cli executorch inspect --model <checkpoint>` prints it.
"""

import json
import os
import time
from collections import Counter
from typing import Any, Dict, List, Optional

import torch

from .configs import EXPORT_CONFIGS, get_export_config
from .configs.base import ExportConfig
from .extensions import find_extension, load_extension_modules
from .loading import load_config
from .options import ExportOptions
from .recipes import get_recipe
from .tasks import get_task

# Sizes of the shrunken model, applied to whichever of these names the config has.
TINY_SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 256, "max_position_embeddings": 256, "d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4,
    "moe_intermediate_size": 64, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip
LAYER_COUNT_NAMES = ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers", "num_decoder_layers")
MODULE_KINDS = {"attention": ("Attention",), "norm": ("Norm",), "mlp": ("MLP", "FeedForward", "Mlp", "FFN"),
                "rope": ("Rotary", "RoPE"), "conv": ("Conv",)}  # fmt: skip


def _reason(err: Exception) -> str:
    """One line: the exception's first line, plus torch.export's "Explanation:" and user-code line if any."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [""]
    extra = [line for line in lines[1:] if line.startswith(("Explanation:", "File \""))][:2]
    return " | ".join([f"{type(err).__name__}: {lines[0]}"] + extra)[:600]


def shrink_config(hf_config):
    """A copy of `hf_config` small enough to build and export in seconds (see the module docstring)."""
    config = hf_config.__class__.from_dict(hf_config.to_dict())
    text = config.get_text_config()
    for target in {id(config): config, id(text): text}.values():
        for name, value in TINY_SIZES.items():
            if getattr(target, name, None) is not None:
                setattr(target, name, value)
        layer_types = getattr(target, "layer_types", None)
        # Hybrid models: one layer of each distinct type, in the order they first appear (at least 2 layers).
        kept = list(dict.fromkeys(layer_types)) if layer_types else []
        count = max(2, len(kept))
        if layer_types:
            target.layer_types = (kept * 2)[:count]
        aliases = getattr(type(target), "attribute_map", {})  # e.g. ConvNeXt's num_hidden_layers -> num_stages
        for name in LAYER_COUNT_NAMES:
            if name not in aliases and getattr(target, name, None):
                setattr(target, name, count)
        vocab = getattr(target, "vocab_size", None)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
            value = getattr(target, name, None)
            if vocab and isinstance(value, int) and value >= vocab:
                setattr(target, name, vocab - 1)
            elif vocab and isinstance(value, list):
                setattr(target, name, [min(v, vocab - 1) for v in value])
    config.dtype = torch.float32
    return config


def safetensors_prefixes(model: str, depth: int = 2) -> Dict[str, int]:
    """Parameter-name prefixes (first `depth` dotted parts, digits collapsed) and counts, from local
    safetensors headers; empty for a Hub id or a checkpoint without safetensors."""
    if not os.path.isdir(model):
        return {}
    from safetensors import safe_open

    counts: Counter = Counter()
    for file in sorted(f for f in os.listdir(model) if f.endswith(".safetensors")):
        with safe_open(os.path.join(model, file), framework="pt") as handle:
            for key in handle.keys():
                parts = ["N" if p.isdigit() else p for p in key.split(".")]
                counts[".".join(parts[:depth])] += 1
    return dict(sorted(counts.items()))


def module_classes(model) -> Dict[str, List[str]]:
    """Class names of the model's modules, grouped by kind (attention, norm, mlp, rope, conv)."""
    found: Dict[str, List[str]] = {kind: [] for kind in MODULE_KINDS}
    for module in model.modules():
        name = type(module).__name__
        for kind, words in MODULE_KINDS.items():
            if any(w in name for w in words) and name not in found[kind]:
                found[kind].append(name)
    return found


def extension_skeleton(model_type: str, classes: Dict[str, List[str]], task: str) -> str:
    """A starter ModelExtension for `model_type`, to save as a file and pass with --extension_modules."""
    suspects = ", ".join(classes.get("attention", []) + classes.get("norm", []) + classes.get("conv", [])) or "..."
    name = "".join(part.capitalize() for part in model_type.replace("-", "_").split("_")) + "Extension"
    return f'''import types

from optimum_executorch.exporters.extensions import ModelExtension, ModulePatcher


class {name}(ModelExtension):
    model_types = ("{model_type}",)
    tasks = ("{task}",)
    cache_layout = "full"  # or "sliding_window", "hybrid", "recurrent"

    def patch_model(self, model):
        # Swap what torch.export cannot trace (modules seen: {suspects}) for export-friendly forwards.
        patcher = ModulePatcher()
        for module in model.modules():
            if type(module).__name__ == "TheModuleThatFails":
                patcher.set(module, "forward", types.MethodType(export_friendly_forward, module))
        return patcher

    def export_defaults(self, recipe, task):
        return {{}}  # e.g. {{"max_seq_len": 1024}}; never overrides what the user sets
'''


def inspect_checkpoint(
    model: str, task: Optional[str] = None, trust_remote_code: bool = False, extension_modules=None
) -> Dict[str, Any]:
    """Inspects a checkpoint (local directory or Hub id) as described in the module docstring."""
    options = ExportOptions(model=model, task=task, trust_remote_code=trust_remote_code, extension_modules=extension_modules)
    load_extension_modules(extension_modules)
    hf_config = load_config(options)
    model_type = hf_config.model_type
    find_extension(model_type)
    report: Dict[str, Any] = {
        "model": model,
        "model_type": model_type,
        "architectures": list(getattr(hf_config, "architectures", None) or []),
        "export_config": getattr(EXPORT_CONFIGS.get(model_type), "__name__", None),
        "safetensors_prefixes": safetensors_prefixes(model),
        "steps": [],
    }
    steps = report["steps"]

    def step(name: str, fn):
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as err:  # the report says what failed and why; it never raises
            steps.append({"step": name, "ok": False, "error": _reason(err)})
            return None
        steps.append({"step": name, "ok": True, "seconds": round(time.perf_counter() - start, 2)})
        return value

    tiny_config = step("shrink config", lambda: shrink_config(hf_config))
    export_config = step("find export config", lambda: get_export_config(tiny_config, task)) if tiny_config else None
    if tiny_config is not None and export_config is None:
        # Unsupported: try the generic path of the task anyway, to show what works and what breaks.
        export_config = ExportConfig(tiny_config, task or "text-generation")
    task_name = export_config.task if export_config else (task or "text-generation")
    report["task"] = task_name
    spec = get_task(task_name)
    tiny = None
    if tiny_config is not None:
        load_kwargs = export_config.model_load_kwargs() if export_config else {}
        tiny = step(
            "build tiny model",
            lambda: spec.load_auto_class().from_config(tiny_config, trust_remote_code=trust_remote_code, **load_kwargs).eval(),
        )
    report["modules"] = module_classes(tiny) if tiny is not None else {}
    if tiny is not None and export_config is not None:
        report["methods"] = step("torch.export (tiny model)", lambda: _export_tiny(export_config, tiny))
    failed = not all(s["ok"] for s in steps) or len(steps) < 4 or report["export_config"] is None
    report["ok"] = not failed
    if failed:
        report["skeleton"] = extension_skeleton(model_type, report["modules"], task_name)
    return report


def _export_tiny(export_config, tiny) -> list:
    """Exports the tiny model as the default xnnpack export would; returns the method names."""
    from .convert import export_programs

    limit = export_config.resolve_max_seq_len(None)  # None: the inputs are not sequences
    max_seq_len = None if limit is None else min(64, limit)
    with export_config.patch_model(tiny):
        kwargs = dict(export_config.wrapper_kwargs())
        if max_seq_len and export_config.supports_custom_sdpa(max_seq_len) and get_recipe("xnnpack").custom_sdpa_default:
            kwargs["custom_sdpa"] = True
        wrapper = export_config.wrapper_class()(tiny, max_seq_len=max_seq_len, **kwargs)
        return list(export_programs(wrapper))


def format_report(report: Dict[str, Any]) -> str:
    """The report as the lines `optimum-cli executorch inspect --model <checkpoint>` prints."""
    lines = [f"Checkpoint: {report['model']} (model_type {report['model_type']}, task {report.get('task')})"]
    lines.append(f"  export config  {report['export_config'] or 'none: not supported yet (see the skeleton below)'}")
    for prefix, count in report["safetensors_prefixes"].items():
        lines.append(f"  weights        {prefix:<40} {count} tensors")
    for kind, names in report.get("modules", {}).items():
        if names:
            lines.append(f"  {kind:<14} {', '.join(names)}")
    for s in report["steps"]:
        lines.append(f"  {'ok  ' if s['ok'] else 'FAIL'} {s['step']:<26} {s.get('seconds', '') if s['ok'] else s['error']}")
    lines.append("Result: " + ("exportable." if report["ok"] else "not exportable as is."))
    if report.get("skeleton"):
        lines += ["Starter extension (save as my_ext.py, fill in, pass --extension_modules my_ext.py):", report["skeleton"]]
    return "\n".join(lines)


def report_json(report: Dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)
