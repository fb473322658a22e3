"""Applies a `QuantizationSpec` to the eager model, in place, with torchao: the quantize stage.

The steps, in order (`quantize`):
1. choose the linears: those kept at 8 bits (`qlinear_8bit_layers`), those whose weights already sit on a 4-bit
   grid (`grid.py`), and those GPTQ rounds (`gptq.py`);
2. calibrate GPTQ on text, when some linear needs it (before any layer is quantized: it runs the float model);
3. quantize the token embedding tables, then the linears, each layer to the group size that fits it;
4. replace the rounded-to-nearest values of the GPTQ linears with GPTQ's, and of the grid linears with the grid.
"""

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Set, Tuple

import torch

from .quantization import (
    AUTO_CALIBRATION_LENGTH,
    EIGHT_BIT_FALLBACK_SCHEMES,
    EMBEDDING_SCHEMES,
    LINEAR_SCHEMES,
    QuantizationSpec,
)
from .weights import release_pages, widen

logger = logging.getLogger(__name__)

_MIN_4BIT_GROUP = 32
# Weights above this many elements are quantized in blocks of rows (`_quantize_by_rows`): 64 MB of fp32 at a time.
_CHUNK_WEIGHTS = 1 << 24


@dataclass
class _Linears:
    """Which linears get which treatment (step 1), and the layouts step 3 gave them."""

    eight_bit: Set[torch.nn.Module] = field(default_factory=set)
    grids: Dict[str, tuple] = field(default_factory=dict)
    gptq: Dict[str, torch.Tensor] = field(default_factory=dict)  # name -> float weight
    calibration_length: Optional[int] = None
    layouts: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # name -> (bits, group size or 0)


def quantize(model, spec: QuantizationSpec, tokenizer=None, dtype: Optional[torch.dtype] = None) -> Dict[str, int]:
    """Quantizes `model` in place. Returns how many layers got each treatment. `tokenizer` reads
    `spec.calibration_data` for GPTQ. `dtype`: the export's, to which a model loaded in a narrower stored dtype is
    widened layer by layer as it is quantized (`weights.py`)."""
    if spec.qlinear is not None and spec.qlinear not in LINEAR_SCHEMES:
        raise ValueError(f"qlinear '{spec.qlinear}' has no kernels in any recipe (see `Recipe.check_quantization`).")
    summary: Dict[str, int] = {}
    linears = _choose_linears(model, spec, dtype)
    hessians = _calibrate(model, spec, linears, tokenizer)
    if hessians:
        summary["linear_gptq"] = len(hessians)
    if spec.qembedding:
        _quantize_embeddings(model, spec, summary, dtype)
    if spec.qlinear:
        _quantize_linears(model, spec, linears, summary, dtype)
    if hessians:
        from .gptq import requantize

        start = time.perf_counter()
        requantize(model, {name: (linears.gptq[name], hessians[name]) + linears.layouts[name] for name in hessians
                           if name in linears.layouts})  # fmt: skip
        logger.info("GPTQ: rounded %d linears in %.1f s.", len(hessians), time.perf_counter() - start)
    if linears.grids:
        from .grid import keep_grids

        wrapped = keep_grids(model, linears.grids, spec.qlinear_group_size)
        summary["linear_on_grid"] = len(linears.grids)
        logger.info("%d linears were already on a 4-bit grid (a dequantized GGUF Q4_0 / Q4_1 file): kept, "
                    "not rounded again (%d with a per-group constant).", len(linears.grids), wrapped)  # fmt: skip
    logger.info("Quantized with %s: %s", {k: v for k, v in spec.to_dict().items() if v is not None}, summary)
    return summary


def _choose_linears(model, spec: QuantizationSpec, dtype: Optional[torch.dtype]) -> _Linears:
    if not spec.qlinear:
        return _Linears()
    linears = _Linears(eight_bit=_linears_kept_at_8_bits(model, spec))
    linears.grids = _grids_to_keep(model, spec, linears.eight_bit)
    if dtype is not None and (spec.qlinear_method == "gptq" or spec.qlinear_method == "auto" and linears.grids):
        widen(model, dtype)  # GPTQ calibrates on the whole float model
    linears.gptq, linears.calibration_length = _gptq_linears(model, spec, linears.grids, linears.eight_bit)
    return linears


def _calibrate(model, spec: QuantizationSpec, linears: _Linears, tokenizer) -> Dict[str, torch.Tensor]:
    """GPTQ's input Hessians of the linears it rounds ({} when none)."""
    if not linears.gptq:
        return {}
    from .gptq import calibration_hessians

    try:
        return calibration_hessians(model, tokenizer, spec.calibration_data, list(linears.gptq), linears.calibration_length)
    except Exception as error:  # "auto" asked for nothing: a model that cannot sample still exports
        if spec.qlinear_method != "auto":
            raise
        logger.warning("qlinear_method auto: GPTQ's calibration failed (%s: %s); rounding to nearest instead.",
                       type(error).__name__, error)  # fmt: skip
        return {}


def _quantize_embeddings(model, spec: QuantizationSpec, summary: Dict[str, int], dtype: Optional[torch.dtype]) -> None:
    """Token embedding tables only (the input embedding and its tied copies): small position or bias tables (T5's
    relative attention buckets) stay in float."""
    from torchao.quantization import IntxWeightOnlyConfig

    vocab_size = model.get_input_embeddings().num_embeddings
    tables = {name: m for name, m in model.named_modules()
              if type(m) is torch.nn.Embedding and m.num_embeddings == vocab_size}  # fmt: skip
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None  # only matters for training; the quantized embedding kernels take none
    bits = getattr(torch, f"int{EMBEDDING_SCHEMES[spec.qembedding]}")
    _quantize_layers(model, "embedding", tables, spec.qembedding_group_size,
                     lambda g: IntxWeightOnlyConfig(weight_dtype=bits, granularity=g), summary, dtype)  # fmt: skip


def _quantize_linears(model, spec: QuantizationSpec, linears: _Linears, summary: Dict[str, int],
                      dtype: Optional[torch.dtype]) -> None:  # fmt: skip
    bits = LINEAR_SCHEMES[spec.qlinear]
    all_linears = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    # XNNPACK's 4-bit kernels take groups of a multiple of 32 inputs, and a per-channel 4-bit weight is one group
    # of all its inputs: a linear with another input size keeps 8 bits per channel (a small projection of an
    # image model, e.g. 8 or 48 inputs).
    # With a fallback scheme (8da4w,8da8w), so does every linear whose inputs the group size does not divide.
    group = spec.qlinear_group_size if spec.qlinear in EIGHT_BIT_FALLBACK_SCHEMES else 0
    too_small = {name for name, m in all_linears.items()
                 if bits == 4 and (m.weight.shape[1] % _MIN_4BIT_GROUP or (group and m.weight.shape[1] % group))}  # fmt: skip
    if too_small:
        logger.info("%d linear(s) with inputs not a multiple of %d keep 8 bits per channel: %s.", len(too_small),
                    group or _MIN_4BIT_GROUP, ", ".join(sorted(too_small)[:3]))  # fmt: skip
    eight_bit = {name: m for name, m in all_linears.items() if m in linears.eight_bit or name in too_small}
    rest = {name: m for name, m in all_linears.items() if name not in eight_bit}
    if eight_bit:
        layouts = _quantize_layers(model, "linear_8bit", eight_bit, 0, _linear_config(8), summary, dtype)
        linears.layouts.update({name: (8, group) for name, group in layouts.items()})
    layouts = _quantize_layers(model, "linear", rest, spec.qlinear_group_size, _linear_config(bits), summary, dtype)
    linears.layouts.update({name: (bits, group) for name, group in layouts.items()})


def _linear_config(bits: int):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig

    dtype = getattr(torch, f"int{bits}")
    return lambda granularity: Int8DynamicActivationIntxWeightConfig(weight_dtype=dtype, weight_granularity=granularity)


def _quantize_layers(model, kind: str, layers: Dict[str, torch.nn.Module], group_size: int, make_config,
                     summary: Dict[str, int], dtype: Optional[torch.dtype] = None) -> Dict[str, int]:  # fmt: skip
    """Quantizes `layers` (name -> module) with `make_config(granularity)`, in groups of `group_size` input channels
    where that divides the layer's inputs, else per channel; each widened to `dtype` first when given. Returns each
    layer's group size (0: per channel)."""
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup

    chosen: Dict[str, int] = {}
    for name, module in layers.items():
        size = module.weight.shape[1]
        chosen[name] = group_size if group_size and size % group_size == 0 else 0
        if group_size and not chosen[name]:
            logger.info("%s '%s' (%d inputs): group size %d does not fit, per-channel.", kind, name, size, group_size)
    # One layer at a time, so that only that layer's float weight is widened (`weights.py`) while it is quantized.
    for name, module in layers.items():
        old = module.weight
        config = make_config(PerGroup(chosen[name]) if chosen[name] else PerAxis(0))
        if old.shape[0] * old.shape[1] > _CHUNK_WEIGHTS:
            _quantize_by_rows(module, config, dtype or old.dtype)
        else:
            if dtype is not None:
                widen(module, dtype, root=model)
            quantize_(model, config, filter_fn=lambda m, fqn, name=name: fqn == name)
        release_pages(old)
    for group in sorted(set(chosen.values())):
        summary[f"{kind}_{'group' + str(group) if group else 'per_channel'}"] = sum(g == group for g in chosen.values())
    return chosen


def _quantize_by_rows(module, config, dtype: torch.dtype) -> None:
    """Quantizes the weight of a large linear or embedding (an LM head, a token table: 128256 x 2048 in Llama-3.2-1B)
    in blocks of rows, each widened to `dtype` and quantized alone, and joins the blocks' torchao tensors: every
    quantization here groups within a row, so the result is the one a single pass gives, without the pass's
    temporaries of the whole table (~4 fp32 copies, 4 GB for Llama-3.2-1B's)."""
    from torchao.quantization import quantize_

    weight, parts = module.weight, []
    rows_per_block = max(1, _CHUNK_WEIGHTS // weight.shape[1])
    for start in range(0, weight.shape[0], rows_per_block):
        rows = weight[start : start + rows_per_block]
        if isinstance(module, torch.nn.Embedding):
            block = torch.nn.Embedding(rows.shape[0], rows.shape[1], device="meta")
        else:
            block = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device="meta")
        block.weight = torch.nn.Parameter(rows.detach().to(dtype), requires_grad=False)
        quantize_(block, config, filter_fn=lambda m, fqn: m is block)
        release_pages(rows)
        parts.append(block.weight)
    kind = type(parts[0])
    joined = {name: torch.cat([getattr(p, name) for p in parts]) for name in kind.tensor_data_names}
    attributes = [getattr(parts[0], name) for name in kind.tensor_attribute_names]
    module.weight = torch.nn.Parameter(kind(*joined.values(), *attributes), requires_grad=False)


def _gptq_linears(model, spec: QuantizationSpec, grids, eight_bit) -> Tuple[Dict[str, Any], Optional[int]]:
    """The linears GPTQ rounds (name -> float weight) and its calibration length (`None`: the default).

    "gptq": every linear not on a kept grid. "auto": the 4-bit ones of a decoder whose quantized linears are on
    a kept grid but for a few (at most an eighth), on `AUTO_CALIBRATION_LENGTH` tokens; none otherwise (at 8
    bits rounding to nearest loses little). "rtn": none."""
    if spec.qlinear_method == "rtn":
        return {}, None
    off_grid = {name: m.weight.detach() for name, m in model.named_modules()
                if type(m) is torch.nn.Linear and name not in grids}  # fmt: skip
    if spec.qlinear_method == "gptq":
        return off_grid, None
    off_grid = {name: w for name, w in off_grid.items() if model.get_submodule(name) not in eight_bit}
    config = getattr(model, "config", None)
    decoder = callable(getattr(model, "can_generate", None)) and model.can_generate() and config is not None \
        and not getattr(config, "is_encoder_decoder", False)  # fmt: skip
    if not (decoder and 0 < len(off_grid) <= len(grids) / 8):
        return {}, None
    logger.info("GPTQ for the %d linear(s) not on a 4-bit grid (%s; qlinear_method auto, 'rtn' skips it).",
                len(off_grid), ", ".join(list(off_grid)[:3]))  # fmt: skip
    return off_grid, AUTO_CALIBRATION_LENGTH


def _grids_to_keep(model, spec: QuantizationSpec, eight_bit) -> dict:
    """4-bit grouped linears whose float weights already sit on a 4-bit grid of the group size (see `grid.py`)."""
    if not spec.four_bit_linears:
        return {}
    from .grid import GGUF_GROUP_SIZE, find_grid, find_grids, on_8bit_grid

    group_size = spec.qlinear_group_size
    linears = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear and m not in eight_bit}
    grids = find_grids({name: m for name, m in linears.items()
                        if group_size and m.weight.shape[1] % group_size == 0}, group_size)  # fmt: skip
    first = next((m for m in linears.values() if m.weight.shape[1] % GGUF_GROUP_SIZE == 0), None)
    if (not grids and group_size != GGUF_GROUP_SIZE and first is not None
            and find_grid(first.weight, GGUF_GROUP_SIZE) is not None):  # fmt: skip
        logger.warning(
            "The linears are on 4-bit grids of %d weights (a GGUF Q4_0 / Q4_1 file), which --qlinear_group_size "
            "%d cannot keep: they are rounded again. Use --qlinear_group_size %d to keep them.",
            GGUF_GROUP_SIZE, group_size, GGUF_GROUP_SIZE,
        )  # fmt: skip
    stored_at_8 = sorted({name.rsplit(".", 1)[-1] for name, m in linears.items()
                          if name not in grids and _read_once(on_8bit_grid, m.weight)})  # fmt: skip
    if stored_at_8:
        logger.warning(
            "Linears stored at 8 bits in the checkpoint (e.g. a GGUF Q8_0 tensor) are rounded to 4: %s. To keep "
            "them at 8 bits, add --qlinear_8bit_layers %s (SmolLM2-135M's Q8_0 LM head: perplexity 1.037x with "
            "qlinear_method auto's GPTQ, 1.114x rounded to nearest -> 1.006x of fp32 at 8 bits, 12.6 MB more, "
            "decode ~9%% slower).", ", ".join(stored_at_8), " ".join(stored_at_8),
        )  # fmt: skip
    return grids


def _read_once(check, weight: torch.Tensor):
    """`check(weight)`, then the file pages it read handed back (`weights.py`): the checks read every weight once
    before quantization reads them again."""
    try:
        return check(weight)
    finally:
        release_pages(weight)


def _linears_kept_at_8_bits(model, spec: QuantizationSpec) -> set:
    """The linear modules `qlinear_8bit_layers` names; a name that matches no linear is an error."""
    if not spec.qlinear_8bit_layers:
        return set()
    linears = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    chosen, unmatched = set(), []
    for wanted in spec.qlinear_8bit_layers:
        hits = [m for name, m in linears.items() if name == wanted or name.endswith("." + wanted)]
        if not hits:
            unmatched.append(wanted)
        chosen.update(hits)
    if unmatched:
        kinds = sorted({name.rsplit(".", 1)[-1] for name in linears})
        raise ValueError(
            f"qlinear_8bit_layers: no linear layer is named {', '.join(map(repr, unmatched))} in this model. "
            f"Its linear layers end in: {', '.join(kinds)}."
        )
    return chosen
