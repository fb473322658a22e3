"""The runtime side never loads the export side: running a .pte costs executorch.runtime + transformers."""

import json
import subprocess
import sys

from .conftest import REPO_ROOT

SCRIPT = r"""
import json, sys
import executorch.runtime, transformers
from transformers import GenerationMixin, GenerationConfig, AutoConfig
from transformers.modeling_outputs import CausalLMOutputWithPast
import optimum.modeling_base
baseline = set(sys.modules)
import torch
from optimum.executorch import ExecuTorchModelForCausalLM
model = ExecuTorchModelForCausalLM.from_pretrained(sys.argv[1])
out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3)
print(json.dumps({"new": sorted(set(sys.modules) - baseline), "shape": list(out.shape)}))
"""

FORBIDDEN = ("optimum_executorch.exporters", "torchao", "executorch.exir.program", "executorch.backends", "torch.export.exported_program")


def test_loading_and_running_does_not_import_the_export_side(tiny_llama_export):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_llama_export)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["shape"] == [1, 6]
    leaked = [m for m in report["new"] if m.startswith(FORBIDDEN)]
    assert leaked == [], f"the runtime imported export-side modules: {leaked}"
    assert "optimum_executorch.modeling.causal_lm" in report["new"]
