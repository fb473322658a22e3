"""`Recipe`: lowers `torch.export` programs to one ExecuTorch program for a backend."""

import logging
import time
from typing import Any, Dict, List

logger = logging.getLogger(__name__)


class Recipe:
    """Base recipe: edge lowering with this backend's partitioners, then `to_executorch`.

    Subclasses set `name`, `supported_dtypes` and override `partitioners()`.
    """

    name: str = ""
    supported_dtypes: tuple = ("float32",)
    # Whether exports with this recipe use ExecuTorch's custom attention ops unless told otherwise.
    custom_sdpa_default: bool = False

    def partitioners(self) -> List[Any]:
        return []

    def lower(self, programs: Dict[str, "torch.export.ExportedProgram"], constant_methods: Dict[str, Any]):
        """Returns an `ExecutorchProgramManager` holding every method and the constant methods."""
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.passes import MemoryPlanningPass

        start = time.perf_counter()
        logger.info("Lowering %s with the '%s' recipe...", ", ".join(programs), self.name)
        edge = to_edge_transform_and_lower(
            programs,
            partitioner=self.partitioners(),
            compile_config=EdgeCompileConfig(_check_ir_validity=False),
            constant_methods=constant_methods,
        )
        program = edge.to_executorch(
            ExecutorchBackendConfig(
                extract_delegate_segments=True,
                # Folds torchao's dequantize + embedding into ExecuTorch's quantized embedding kernels.
                do_quant_fusion_and_const_prop=True,
                memory_planning_pass=MemoryPlanningPass(alloc_graph_input=True, alloc_graph_output=True),
            )
        )
        logger.info("Lowered in %.1f s.", time.perf_counter() - start)
        return program
