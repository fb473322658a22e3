"""Quantization spec strings ("8da4w", "8w", group sizes) -> torchao configs applied to the eager model.

`QuantizationSpec` is validated with the other options, before any model is loaded, and the recipe checks it has
kernels for it. `quantizer.quantize(model, spec)` quantizes the model in place with torchao; the recipe's lowering then maps the quantized linears to
XNNPACK's kernels and the quantized embeddings to ExecuTorch's `quantized_decomposed` kernels.

Schemes:
    linear     8da4w / 8da8w: int8 dynamic activations, int4 / int8 weights (XNNPACK kernels); 8da4w,8da8w: 8da4w,
               and 8da8w per channel for the linears whose inputs the group size does not divide
    embedding  4w / 8w: int4 / int8 weights
Mixed: with 8da4w, `qlinear_8bit_layers` names linears (by the last part of their module name, e.g.
`down_proj`, `lm_head`) that get 8da8w instead, the way llama.cpp's "K_M" formats keep the sensitive
layers at more bits.
Rounding (`qlinear_method`): "rtn" rounds each weight to the nearest level of its group (torchao's default);
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
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..utils import suggest
from ..contract import QUANTIZED_KERNEL_LIBRARY

logger = logging.getLogger(__name__)

LINEAR_SCHEMES = {"8da4w": 4, "8da8w": 8, "8da4w,8da8w": 4}
# 4-bit schemes whose linears that the group size does not divide get 8 bits per channel instead of 4 bits per
# channel (the peer's "8da4w,8da8w"; plain 8da4w keeps 4 bits, one group per channel).
EIGHT_BIT_FALLBACK_SCHEMES = ("8da4w,8da8w",)
# Weight-only linears, named so that a recipe can say why it does not run them (`Recipe.check_quantization`), and
# the scheme that stores the same weights.
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


def _check_group_size(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (value & (value - 1)) != 0:
        raise ValueError(
            f"{name}={value!r} is not a valid group size: use a power of two such as 32, 64 or 128, "
            "or 0 for one scale per output channel."
        )


@dataclass(frozen=True)
class QuantizationSpec:
    """Which layers to quantize, and how: the export options of that name (`ExportOptions`, the CLI), validated.
    The recipe checks that it has kernels for them (`Recipe.check_quantization`).

    Args:
        qlinear: scheme of every `nn.Linear` (including the LM head), or `None` to keep them in float.
        qlinear_group_size: group size of the linear weights (0: per output channel). `None`: 32 for 8da4w,
            per channel for 8da8w (XNNPACK's 8-bit weight kernels take one scale per channel).
        qembedding: scheme of every `nn.Embedding`, or `None`.
        qembedding_group_size: group size of the embedding weights (0: per row).
        qlinear_8bit_layers: with `qlinear="8da4w"`, names of linears kept at 8da8w (per channel): a linear
            matches when its module name is the given name or ends with "." + name.
        qlinear_method: how the quantized linear weights are rounded: "rtn" (round to nearest), "gptq", or "auto"
            ("gptq" for the few linears of a decoder that are not on a kept 4-bit grid, "rtn" otherwise).
        calibration_data: with "gptq", a UTF-8 text file to calibrate on; `None`: text the model samples itself.
    """

    qlinear: Optional[str] = None
    qlinear_group_size: Optional[int] = None
    qembedding: Optional[str] = None
    qembedding_group_size: int = 0
    qlinear_8bit_layers: Optional[Tuple[str, ...]] = None
    qlinear_method: str = "auto"
    calibration_data: Optional[str] = None

    def __post_init__(self):
        if self.qlinear is not None and self.qlinear not in LINEAR_SCHEMES and self.qlinear not in WEIGHT_ONLY_LINEAR_SCHEMES:
            raise ValueError(
                f"qlinear '{self.qlinear}' is not supported.{suggest(self.qlinear, LINEAR_SCHEMES)} "
                f"Choose one of: {', '.join(LINEAR_SCHEMES)}."
            )
        if self.qembedding is not None and self.qembedding not in EMBEDDING_SCHEMES:
            raise ValueError(
                f"qembedding '{self.qembedding}' is not supported.{suggest(self.qembedding, EMBEDDING_SCHEMES)} "
                f"Choose one of: {', '.join(EMBEDDING_SCHEMES)}."
            )
        if self.qlinear_group_size is None:
            object.__setattr__(self, "qlinear_group_size", 32 if self.four_bit_linears else 0)
        _check_group_size("qlinear_group_size", self.qlinear_group_size)
        _check_group_size("qembedding_group_size", self.qembedding_group_size)
        if self.qlinear_8bit_layers is not None:
            names = tuple(n.strip(". ") if isinstance(n, str) else n for n in self.qlinear_8bit_layers)
            if not self.four_bit_linears:
                raise ValueError(
                    f"qlinear_8bit_layers keeps some linears at 8 bits inside a 4-bit model: it needs --qlinear 8da4w, "
                    f"got --qlinear {self.qlinear}."
                )
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    "qlinear_8bit_layers needs layer names such as down_proj or lm_head, "
                    f"got {self.qlinear_8bit_layers!r}."
                )
            object.__setattr__(self, "qlinear_8bit_layers", names)
        self._check_method()

    def _check_method(self) -> None:
        if self.qlinear_method not in LINEAR_METHODS:
            raise ValueError(
                f"qlinear_method '{self.qlinear_method}' is not supported.{suggest(self.qlinear_method, LINEAR_METHODS)} "
                f"Choose one of: {', '.join(LINEAR_METHODS)}."
            )
        if self.qlinear_method == "gptq" and self.qlinear is None:
            raise ValueError("qlinear_method gptq rounds quantized linear weights: it needs --qlinear (8da4w or 8da8w).")
        if self.calibration_data is not None:
            if self.qlinear_method != "gptq":
                raise ValueError("calibration_data is read by GPTQ only: add --qlinear_method gptq, or drop it.")
            if not Path(self.calibration_data).is_file():
                raise ValueError(
                    f"calibration_data '{self.calibration_data}' is not a file: pass a UTF-8 text file, or leave it "
                    "out to calibrate on text the model samples itself."
                )

    @classmethod
    def field_names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of_options(cls, options) -> "QuantizationSpec":
        """The spec of the quantization options in `options` (an `ExportOptions`, or a dict of export options)."""
        get = options.get if isinstance(options, dict) else lambda name, default: getattr(options, name, default)
        values = {name: get(name, field.default) for name, field in ((f.name, f) for f in fields(cls))}
        if values["qlinear_8bit_layers"] is not None and not isinstance(values["qlinear_8bit_layers"], str):
            values["qlinear_8bit_layers"] = tuple(values["qlinear_8bit_layers"])
        return cls(**values)

    @property
    def four_bit_linears(self) -> bool:
        return LINEAR_SCHEMES.get(self.qlinear) == 4

    @property
    def enabled(self) -> bool:
        return self.qlinear is not None or self.qembedding is not None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def kernel_libraries(self):
        return [QUANTIZED_KERNEL_LIBRARY] if self.qembedding else []


def checkpoint_quantization(hf_config) -> Optional[Dict[str, Any]]:
    """How the checkpoint itself is quantized, or None. A torchao checkpoint exports as it is (its tensors are what
    `quantizer.quantize` would produce); GGUF files are dequantized on load; other methods are refused."""
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
