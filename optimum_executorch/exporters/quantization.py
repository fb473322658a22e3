"""Quantization spec strings ("8da4w", "8w", group sizes) -> torchao configs applied to the eager model.

`QuantizationSpec` is validated with the other options, before any model is loaded. `apply(model)`
quantizes the model in place with torchao; the recipe's lowering then maps the quantized linears to
XNNPACK's kernels and the quantized embeddings to ExecuTorch's `quantized_decomposed` kernels.

Schemes:
    linear     8da4w / 8da8w: int8 dynamic activations, int4 / int8 weights (XNNPACK kernels)
    embedding  4w / 8w: int4 / int8 weights
Mixed: with 8da4w, `linear_8bit_layers` names linears (by the last part of their module name, e.g.
`down_proj`, `lm_head`) that get 8da8w instead, the way llama.cpp's "K_M" formats keep the sensitive
layers at more bits.
Rounding (`linear_method`): "rtn" rounds each weight to the nearest level of its group (torchao's default);
"gptq" chooses the levels with GPTQ on calibration text (see `gptq.py`): same tensors, same kernels, better
values, at the cost of one calibration pass at export. With either, 4-bit linears whose weights are already on a
4-bit grid of the group size (a dequantized GGUF Q4_0 / Q4_1 file) keep that grid (see `grid.py`). "auto" (the
default) is "gptq" with a shorter calibration (`AUTO_CALIBRATION_LENGTH`) where a decoder's linears are on such a
grid but for a few (SmolLM2's Q8_0 LM head): those few are what the program loses quality on, and calibrating
them costs ~25 s; everywhere else it is "rtn".
Group sizes: a positive power of two (weights quantized in groups of that many input channels), or 0
for one scale per output channel. A layer whose input size the group size does not divide falls back
to per-channel, and the log says which.
"""

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..utils import suggest
from ..contract import QUANTIZED_KERNEL_LIBRARY

logger = logging.getLogger(__name__)

LINEAR_SCHEMES = {"8da4w": 4, "8da8w": 8}
# Weight-only linears: XNNPACK's partitioner takes a quantized linear only with int8 dynamic activations, so
# these would run outside the delegate, dequantizing every weight at every call. The 8da schemes store the
# same weights.
WEIGHT_ONLY_LINEAR_SCHEMES = {"4w": "8da4w", "8w": "8da8w"}
# Quantized embeddings are exact in ExecuTorch's kernels. Together with 8da linears, the program can differ from
# torchao's eager reference by one step of the first layer's int8 activation quantization: quantized embedding
# rows sit on an integer grid that RMSNorm and per-token quantization map onto exact .5 ties for some tokens,
# and XNNPACK breaks those ties differently (measured on a tiny llama: 4w, 79 of 512 tokens, 77 of them with such
# a tie; 8w, 37). Both roundings are equally good.
EMBEDDING_SCHEMES = {"4w": 4, "8w": 8}
LINEAR_METHODS = ("auto", "rtn", "gptq")
# "auto"'s calibration: 32 sampled sequences of this many tokens. SmolLM2-135M's Q4_1 GGUF (only the LM head off
# the grid), .pte-equivalent eager perplexity on Wikipedia: rtn 26.89 (1.114x fp32); 32 x 128 tokens 25.12
# (1.040x) in 23 s; 32 x 256 (explicit "gptq") 24.95 in 46 s; 16 x 256 25.40 in 30 s.
AUTO_CALIBRATION_LENGTH = 128
# Kernels the program needs when embeddings are quantized (imported by the runtime before loading).


def _check_group_size(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (value & (value - 1)) != 0:
        raise ValueError(
            f"{name}={value!r} is not a valid group size: use a power of two such as 32, 64 or 128, "
            "or 0 for one scale per output channel."
        )


@dataclass(frozen=True)
class QuantizationSpec:
    """Which layers to quantize, and how.

    Args:
        linear: scheme of every `nn.Linear` (including the LM head), or `None` to keep them in float.
        linear_group_size: group size of the linear weights (0: per output channel). `None`: 32 for 8da4w,
            per channel for 8da8w (XNNPACK's 8-bit weight kernels take one scale per channel).
        embedding: scheme of every `nn.Embedding`, or `None`.
        embedding_group_size: group size of the embedding weights (0: per row).
        linear_8bit_layers: with `linear="8da4w"`, names of linears kept at 8da8w (per channel): a linear
            matches when its module name is the given name or ends with "." + name.
        linear_method: how the quantized linear weights are rounded: "rtn" (round to nearest), "gptq", or "auto"
            ("gptq" for the few linears of a decoder that are not on a kept 4-bit grid, "rtn" otherwise).
        calibration_data: with "gptq", a UTF-8 text file to calibrate on; `None`: text the model samples itself.
    """

    linear: Optional[str] = None
    linear_group_size: Optional[int] = None
    embedding: Optional[str] = None
    embedding_group_size: int = 0
    linear_8bit_layers: Optional[Tuple[str, ...]] = None
    linear_method: str = "auto"
    calibration_data: Optional[str] = None

    def __post_init__(self):
        if self.linear in WEIGHT_ONLY_LINEAR_SCHEMES:
            raise ValueError(
                f"qlinear '{self.linear}' (weight-only) is not offered: XNNPACK runs quantized linears only with int8 "
                f"dynamic activations, and outside it every weight would be dequantized at every call. Use "
                f"--qlinear {WEIGHT_ONLY_LINEAR_SCHEMES[self.linear]}, which stores the same {self.linear[0]}-bit weights."
            )
        if self.linear is not None and self.linear not in LINEAR_SCHEMES:
            raise ValueError(
                f"qlinear '{self.linear}' is not supported.{suggest(self.linear, LINEAR_SCHEMES)} "
                f"Choose one of: {', '.join(LINEAR_SCHEMES)}."
            )
        if self.embedding is not None and self.embedding not in EMBEDDING_SCHEMES:
            raise ValueError(
                f"qembedding '{self.embedding}' is not supported.{suggest(self.embedding, EMBEDDING_SCHEMES)} "
                f"Choose one of: {', '.join(EMBEDDING_SCHEMES)}."
            )
        if self.linear_group_size is None:
            object.__setattr__(self, "linear_group_size", 32 if self.linear == "8da4w" else 0)
        _check_group_size("qlinear_group_size", self.linear_group_size)
        if self.linear == "8da8w" and self.linear_group_size:
            raise ValueError(
                f"qlinear 8da8w takes one scale per output channel (XNNPACK has no grouped 8-bit kernels), "
                f"got qlinear_group_size={self.linear_group_size}. Pass --qlinear_group_size 0, or use 8da4w."
            )
        _check_group_size("qembedding_group_size", self.embedding_group_size)
        if self.linear_8bit_layers is not None:
            names = tuple(n.strip(". ") if isinstance(n, str) else n for n in self.linear_8bit_layers)
            if self.linear != "8da4w":
                raise ValueError(
                    f"qlinear_8bit_layers keeps some linears at 8 bits inside a 4-bit model: it needs --qlinear 8da4w, "
                    f"got --qlinear {self.linear}."
                )
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    "qlinear_8bit_layers needs layer names such as down_proj or lm_head, "
                    f"got {self.linear_8bit_layers!r}."
                )
            object.__setattr__(self, "linear_8bit_layers", names)
        self._check_method()

    def _check_method(self) -> None:
        if self.linear_method not in LINEAR_METHODS:
            raise ValueError(
                f"qlinear_method '{self.linear_method}' is not supported.{suggest(self.linear_method, LINEAR_METHODS)} "
                f"Choose one of: {', '.join(LINEAR_METHODS)}."
            )
        if self.linear_method == "gptq" and self.linear is None:
            raise ValueError("qlinear_method gptq rounds quantized linear weights: it needs --qlinear (8da4w or 8da8w).")
        if self.calibration_data is not None:
            if self.linear_method != "gptq":
                raise ValueError("calibration_data is read by GPTQ only: add --qlinear_method gptq, or drop it.")
            if not Path(self.calibration_data).is_file():
                raise ValueError(
                    f"calibration_data '{self.calibration_data}' is not a file: pass a UTF-8 text file, or leave it "
                    "out to calibrate on text the model samples itself."
                )

    @property
    def enabled(self) -> bool:
        return self.linear is not None or self.embedding is not None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def kernel_libraries(self):
        return [QUANTIZED_KERNEL_LIBRARY] if self.embedding else []

    def apply(self, model, tokenizer=None) -> Dict[str, int]:
        """Quantizes `model` in place. Returns how many layers got each treatment. `tokenizer` reads
        `calibration_data` for GPTQ."""
        import torch
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup

        summary: Dict[str, int] = {}
        linear_layouts: Dict[str, Tuple[int, int]] = {}  # linear name -> (bits, group size or 0)

        def quantize_layers(kind, layer_type, in_dim, group_size, make_config, select=lambda module: True, bits=None):
            groups = {}
            for name, module in model.named_modules():
                if type(module) is not layer_type or not select(module):
                    continue
                size = module.weight.shape[in_dim]
                use_group = group_size if group_size and size % group_size == 0 else 0
                if group_size and not use_group:
                    logger.info("%s '%s' (%d inputs): group size %d does not fit, per-channel.", kind, name, size, group_size)
                groups.setdefault(use_group, set()).add(name)
                if bits:
                    linear_layouts[name] = (bits, use_group)
            for use_group, names in groups.items():
                granularity = PerGroup(use_group) if use_group else PerAxis(0)
                quantize_(model, make_config(granularity), filter_fn=lambda m, fqn, names=names: fqn in names)
                key = f"{kind}_{'group' + str(use_group) if use_group else 'per_channel'}"
                summary[key] = len(names)

        def linear_config(bits):
            return lambda g: Int8DynamicActivationIntxWeightConfig(weight_dtype=getattr(torch, f"int{bits}"), weight_granularity=g)

        eight_bit = self._linears_kept_at_8_bits(model) if self.linear else set()
        grids = self._grids_to_keep(model, eight_bit)
        float_linears, length = self._gptq_linears(model, grids, eight_bit)
        hessians = {}
        if float_linears:
            from .gptq import calibration_hessians

            try:
                hessians = calibration_hessians(model, tokenizer, self.calibration_data, list(float_linears), length)
            except Exception as error:  # "auto" asked for nothing: a model that cannot sample still exports
                if self.linear_method != "auto":
                    raise
                logger.warning("qlinear_method auto: GPTQ's calibration failed (%s: %s); rounding to nearest instead.",
                               type(error).__name__, error)  # fmt: skip
            if hessians:
                summary["linear_gptq"] = len(hessians)
        if self.embedding:
            # Token embedding tables only (the input embedding and its tied copies): small position or bias
            # tables (T5's relative attention buckets) stay in float.
            vocab_size = model.get_input_embeddings().num_embeddings
            for module in model.modules():
                if isinstance(module, torch.nn.Embedding):
                    # Only matters for training; the fused quantized embedding kernels take no padding index.
                    module.padding_idx = None
            bits = EMBEDDING_SCHEMES[self.embedding]
            quantize_layers(
                "embedding",
                torch.nn.Embedding,
                1,
                self.embedding_group_size,
                lambda g: IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"), granularity=g),
                select=lambda module: module.num_embeddings == vocab_size,
            )
        if self.linear:
            if eight_bit:
                select = lambda m: m in eight_bit  # noqa: E731
                quantize_layers("linear_8bit", torch.nn.Linear, 1, 0, linear_config(8), select=select, bits=8)
            bits = LINEAR_SCHEMES[self.linear]
            quantize_layers(
                "linear",
                torch.nn.Linear,
                1,
                self.linear_group_size,
                linear_config(bits),
                select=lambda module: module not in eight_bit,
                bits=bits,
            )
        if hessians:
            from .gptq import requantize

            start = time.perf_counter()
            requantize(model, {name: (float_linears[name], hessians[name]) + linear_layouts[name] for name in hessians
                               if name in linear_layouts})  # fmt: skip
            logger.info("GPTQ: rounded %d linears in %.1f s.", len(hessians), time.perf_counter() - start)
        if grids:
            from .grid import keep_grids

            wrapped = keep_grids(model, grids, self.linear_group_size)
            summary["linear_on_grid"] = len(grids)
            logger.info("%d linears were already on a 4-bit grid (a dequantized GGUF Q4_0 / Q4_1 file): kept, "
                        "not rounded again (%d with a per-group constant).", len(grids), wrapped)  # fmt: skip
        logger.info("Quantized with %s: %s", {k: v for k, v in self.to_dict().items() if v is not None}, summary)
        return summary

    def _gptq_linears(self, model, grids, eight_bit) -> Tuple[Dict[str, Any], Optional[int]]:
        """The linears GPTQ rounds (name -> float weight) and its calibration length (`None`: the default).

        "gptq": every linear not on a kept grid. "auto": the 4-bit ones of a decoder whose quantized linears are on
        a kept grid but for a few (at most an eighth), on `AUTO_CALIBRATION_LENGTH` tokens; none otherwise (at 8
        bits rounding to nearest loses little). "rtn": none."""
        import torch

        if self.linear is None or self.linear_method == "rtn":
            return {}, None
        off_grid = {name: m.weight.detach() for name, m in model.named_modules()
                    if type(m) is torch.nn.Linear and name not in grids}  # fmt: skip
        if self.linear_method == "gptq":
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

    def _grids_to_keep(self, model, eight_bit) -> dict:
        """4-bit grouped linears whose float weights already sit on a 4-bit grid of the group size (see `grid.py`)."""
        import torch

        if self.linear != "8da4w":
            return {}
        from .grid import GGUF_GROUP_SIZE, find_grid, find_grids, on_8bit_grid

        group_size = self.linear_group_size
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
                              if name not in grids and on_8bit_grid(m.weight)})  # fmt: skip
        if stored_at_8:
            logger.warning(
                "Linears stored at 8 bits in the checkpoint (e.g. a GGUF Q8_0 tensor) are rounded to 4: %s. To keep "
                "them at 8 bits, add --qlinear_8bit_layers %s (SmolLM2-135M's Q8_0 LM head: perplexity 1.037x with "
                "qlinear_method auto's GPTQ, 1.114x rounded to nearest -> 1.006x of fp32 at 8 bits, 12.6 MB more, "
                "decode ~9%% slower).", ", ".join(stored_at_8), " ".join(stored_at_8),
            )  # fmt: skip
        return grids

    def _linears_kept_at_8_bits(self, model) -> set:
        """The linear modules `linear_8bit_layers` names; a name that matches no linear is an error."""
        import torch

        if not self.linear_8bit_layers:
            return set()
        linears = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Linear}
        chosen, unmatched = set(), []
        for wanted in self.linear_8bit_layers:
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


def checkpoint_quantization(hf_config) -> Optional[Dict[str, Any]]:
    """How the checkpoint itself is quantized, or None. A torchao checkpoint exports as it is (its tensors are what
    `QuantizationSpec.apply` would produce); GGUF files are dequantized on load; other methods are refused."""
    config = getattr(hf_config, "quantization_config", None)
    if config is None:
        return None
    config = config if isinstance(config, dict) else config.to_dict()
    method = config.get("quant_method")
    if method == "gguf":
        return None
    if method != "torchao":
        raise ValueError(
            f"The checkpoint is quantized with '{method}', which ExecuTorch cannot run. Export the unquantized "
            "checkpoint (optionally with --qlinear / --qembedding), or one quantized with torchao."
        )
    quant_type = config.get("quant_type")
    schemes = sorted({v.get("_type", "?") for v in quant_type.values()}) if isinstance(quant_type, dict) else [str(quant_type)]
    return {
        "source": "checkpoint",
        "quant_method": "torchao",
        "configs": schemes,
        "embeddings": bool(config.get("include_input_output_embeddings")),
    }
