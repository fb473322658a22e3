"""Writing chosen integers and scales into torchao's quantized weights: the leaf that round-to-nearest's
alternatives (GPTQ, kept GGUF grids) share, importing nothing of this package."""


def write_quantized_values(name: str, quantized, integers, scales) -> None:
    """Writes integers [N, K] and per-group scales into a torchao-quantized weight (`IntxUnpackedToInt8Tensor`),
    symmetric (zero points cleared): how GPTQ and the kept GGUF grids replace round-to-nearest's values."""
    if quantized.qdata.shape != integers.shape or quantized.scale.numel() != scales.numel():
        raise RuntimeError(f"Unexpected torchao layout for '{name}': {quantized.qdata.shape} / {quantized.scale.shape}.")
    quantized.qdata.copy_(integers.to(quantized.qdata.dtype))
    quantized.scale.copy_(scales.reshape(quantized.scale.shape).to(quantized.scale.dtype))
    if quantized.zero_point is not None:
        quantized.zero_point.zero_()
