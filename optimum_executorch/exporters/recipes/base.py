"""`Recipe`: lowers `torch.export` programs to one ExecuTorch program for a backend."""

import contextlib
import logging
import time
from typing import Any, Dict, List

from ...contract import WEIGHTS_TAG

logger = logging.getLogger(__name__)


class Recipe:
    """Base recipe: edge lowering with this backend's partitioners, then `to_executorch`.

    Subclasses set `name`, `supported_dtypes` and override `partitioners()`.
    """

    name: str = ""
    supported_dtypes: tuple = ("float32",)
    # Whether exports with this recipe use ExecuTorch's custom attention ops unless told otherwise.
    custom_sdpa_default: bool = False

    # Whether a program of several methods can keep its weights in one external data file (--external_weights):
    # with no delegate holding the weights, ExecuTorch rejects the file when it loads the second method.
    external_weights_across_methods: bool = False
    # The quantized linear schemes this backend has kernels for (`QuantizationSpec.qlinear`).
    quantized_linears: tuple = ()

    def check_quantization(self, spec) -> None:
        """Refuses, before any model is loaded, a `QuantizationSpec` this backend cannot run, saying why."""
        if spec.qlinear is not None and spec.qlinear not in self.quantized_linears:
            raise ValueError(
                f"The '{self.name}' recipe has no kernels for quantized linears (--qlinear {spec.qlinear}): torchao's "
                "quantize / dequantize ops have no ExecuTorch kernel outside a delegate. Export with --recipe xnnpack, "
                "or quantize only the embeddings (--qembedding 4w / 8w), which run in ExecuTorch's quantized kernels."
            )

    def partitioners(self) -> List[Any]:
        return []

    def edge_passes(self) -> List[Any]:
        """Passes over the edge program before partitioning (graph module -> `PassResult`)."""
        return []

    def lowering_context(self):
        """A context the edge lowering runs in (the backend's speed-ups of ExecuTorch's own steps)."""
        return contextlib.nullcontext()

    def lower(
        self,
        programs: Dict[str, "torch.export.ExportedProgram"],
        constant_methods: Dict[str, Any],
        external_weights: bool = False,
    ):
        """Returns an `ExecutorchProgramManager` holding every method and the constant methods.

        With `external_weights`, every weight (the program's own and the delegates') goes to one data file
        (`write_tensor_data_to_file`), where identical tensors are stored once: a tied embedding / LM head
        is then stored once instead of once in the program and once in the XNNPACK delegate.
        """
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes import MemoryPlanningPass

        start = time.perf_counter()
        logger.info("Lowering %s with the '%s' recipe...", ", ".join(programs), self.name)
        if external_weights:
            for program in programs.values():
                _tag_weights_for_delegates(program)
        with self.lowering_context():
            edge = to_edge_transform_and_lower(
                programs,
                partitioner=self.partitioners(),
                compile_config=EdgeCompileConfig(_check_ir_validity=False),
                constant_methods=constant_methods,
                transform_passes=self.edge_passes() or None,
            )
            program = edge.to_executorch(
                ExecutorchBackendConfig(
                    extract_delegate_segments=True,
                    # Folds torchao's dequantize + embedding into ExecuTorch's quantized embedding kernels.
                    do_quant_fusion_and_const_prop=True,
                    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=True, alloc_graph_output=True),
                    external_constants=(lambda node: WEIGHTS_TAG) if external_weights else False,
                )
            )
        logger.info("Lowered in %.1f s.", time.perf_counter() - start)
        return program


def _tag_weights_for_delegates(program) -> None:
    """Marks the constant inputs of `program` (parameters, constants, buffers it never writes) so that the
    delegates serialize them into the external data file too (the KV cache stays in the program)."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    constant_inputs = set(signature.inputs_to_parameters) | set(signature.inputs_to_lifted_tensor_constants)
    constant_inputs |= {name for name, fqn in signature.inputs_to_buffers.items() if fqn not in mutated}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in constant_inputs:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = WEIGHTS_TAG
