"""XNNPACK: the optimized CPU backend for Arm and x86 (the default recipe)."""

from . import register_recipe
from .base import Recipe


@register_recipe
class XnnpackRecipe(Recipe):
    name = "xnnpack"
    supported_dtypes = ("float32", "float16")
    custom_sdpa_default = True
    quantized_linears = ("8da4w", "8da8w", "8da4w,8da8w")
    external_weights_across_methods = True

    def check_quantization(self, spec) -> None:
        from ..quantization import WEIGHT_ONLY_LINEAR_SCHEMES

        if spec.qlinear in WEIGHT_ONLY_LINEAR_SCHEMES:
            raise ValueError(
                f"qlinear '{spec.qlinear}' (weight-only) is not offered: XNNPACK runs quantized linears only with int8 "
                f"dynamic activations, and outside it every weight would be dequantized at every call. Use "
                f"--qlinear {WEIGHT_ONLY_LINEAR_SCHEMES[spec.qlinear]}, which stores the same {spec.qlinear[0]}-bit "
                "weights."
            )
        if spec.qlinear == "8da8w" and spec.qlinear_group_size:
            raise ValueError(
                f"qlinear 8da8w takes one scale per output channel (XNNPACK has no grouped 8-bit kernels), "
                f"got qlinear_group_size={spec.qlinear_group_size}. Pass --qlinear_group_size 0, or use 8da4w."
            )
        super().check_quantization(spec)

    def partitioners(self):
        return [_checked_once_partitioner()]

    def edge_passes(self):
        from .xnnpack_rewrites import xnnpack_rewrites

        return xnnpack_rewrites()

    def lowering_context(self):
        from .xnnpack_passes import faster_lowering

        return faster_lowering()


def _checked_once_partitioner():
    """XNNPACK's partitioner, telling the edge lowering when none of its ops needs the per-node check.

    XNNPACK keeps a few ops whole (linear, the torchao quantization primitives, ...) and gives
    `to_edge_transform_and_lower` a per-node check for them. With a check, the lowering decomposes the whole
    graph three times (functionalize; all but the kept ops; then whatever the check refused), each a full
    re-trace; without one, twice. When every kept node in the program passes the check, the third pass
    has nothing to do: this partitioner says so by returning no check (measured on an 8-layer SmolLM2-shaped
    8da4w export: decompositions 25 s -> 15 s, 87 s -> 75 s in all). Only for programs whose kept nodes are
    all linears and torchao quantization primitives (transformers' text models): other kept ops (bilinear
    upsampling in MobileViT) can pass the check and still be left out of a partition, which the lowering
    handles only with the check. Otherwise the check is returned and the lowering runs exactly as before.
    """
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    linear = torch.ops.aten.linear.default

    class CheckedOncePartitioner(XnnpackPartitioner):
        def ops_to_not_decompose(self, ep):
            ops, check = super().ops_to_not_decompose(ep)
            if check is None or ep is None:
                return ops, check
            kept = set(ops)
            nodes = [node for node in ep.graph.nodes if node.op == "call_function" and node.target in kept]
            # No kept node found: an edge-dialect program (the check after lowering) or nothing to keep.
            linears_only = bool(nodes) and all(n.target is linear or n.target.namespace == "torchao" for n in nodes)
            return ops, (None if linears_only and all(check(node) for node in nodes) else check)

        def transform_for_pre_decomposition(self, ep):
            from .xnnpack_passes import decompose_at_once

            ep = super().transform_for_pre_decomposition(ep)
            decompose_at_once(ep, self)
            return ep

    return CheckedOncePartitioner()

