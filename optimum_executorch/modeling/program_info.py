"""What an exported program holds: methods, their inputs and outputs, metadata, delegation.

`describe_export(path)` reads an export directory (or a bare `.pte`) and returns a plain dict; `optimum-cli
executorch inspect --model out/` prints it. The delegation summary (how many calls go to each backend,
which operators run outside it) comes from the program's serialized instructions, read with ExecuTorch's
own deserializer, which is imported only here, when asked for.
"""

import json
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Union

from ..contract import (
    EXECUTORCH_CONFIG_NAME,
    PTE_FILE_NAME,
    WEIGHTS_FILE_NAME,
    ExportManifest,
)

# ExecuTorch's ScalarType codes (the same numbering as torch's).
_DTYPE_NAMES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64", 11: "bool", 15: "bfloat16"}


def _tensor(info) -> Dict[str, Any]:
    dtype = info.dtype()
    return {"shape": list(info.sizes()), "dtype": _DTYPE_NAMES.get(int(dtype), str(dtype))}


def _instructions(pte_path: Path) -> Dict[str, Dict[str, Any]]:
    """Per method: calls to each delegate backend and the operators that run outside any delegate."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(pte_path.read_bytes())
    program = getattr(pte, "program", pte)
    summary = {}
    for plan in program.execution_plan:
        delegate_calls, operator_calls = Counter(), Counter()
        for chain in plan.chains:
            for instruction in chain.instructions:
                args = instruction.instr_args
                kind = type(args).__name__
                if kind == "DelegateCall":
                    delegate_calls[plan.delegates[args.delegate_index].id] += 1
                elif kind == "KernelCall":
                    operator_calls[plan.operators[args.op_index].name] += 1
        summary[plan.name] = {"delegate_calls": dict(delegate_calls), "operators_outside": dict(operator_calls)}
    return summary


def describe_export(path: Union[str, Path]) -> Dict[str, Any]:
    """Describes an export directory (or a `.pte` file): files, export settings, methods and delegation."""
    from .base import ExecuTorchModel

    path = Path(path)
    model_dir, pte_path = (path.parent, path) if path.suffix == ".pte" else (path, path / PTE_FILE_NAME)
    config = ExportManifest.from_json(model_dir).to_dict() if (model_dir / EXECUTORCH_CONFIG_NAME).is_file() else {}
    ExecuTorchModel.load_kernel_libraries(config.get("kernel_libraries", []))
    weights = config.get("weights_file")
    if weights is None and (model_dir / WEIGHTS_FILE_NAME).is_file():
        weights = WEIGHTS_FILE_NAME
    program = ExecuTorchModel.load_program(pte_path, model_dir / weights if weights else None, config.get("checksums"))
    instructions = _instructions(pte_path)

    methods, constants = {}, {}
    for name in sorted(program.method_names):
        method = program.load_method(name)
        meta = method.metadata
        if meta.num_inputs() == 0:  # a constant method: its value is the metadata
            values = method.execute([])
            constants[name] = values[0] if len(values) == 1 and not name.endswith("_ids") else list(values)
            continue
        methods[name] = {
            "inputs": [_tensor(meta.input_tensor_meta(i)) for i in range(meta.num_inputs())],
            "outputs": [_tensor(meta.output_tensor_meta(i)) for i in range(meta.num_outputs())],
            **instructions.get(name, {}),
        }
    files = {p.name: p.stat().st_size for p in sorted(model_dir.iterdir()) if p.is_file()} if path.suffix != ".pte" else {}
    settings = {
        k: config.get(k)
        for k in ("task", "model_type", "recipe", "dtype", "max_seq_len", "custom_sdpa", "custom_kv_cache", "quantization", "weights_file")
        if k in config
    }
    runner_tokenizer = config.get("runner_tokenizer")
    if runner_tokenizer:
        settings["runner_tokenizer"] = {k: runner_tokenizer.get(k) for k in ("file", "matches", "mismatched_texts")}
    return {"path": str(path), "files": files, "export": settings, "methods": methods, "metadata": constants}


def format_description(description: Dict[str, Any]) -> str:
    """The description as the lines `optimum-cli executorch inspect` prints."""
    lines = [f"ExecuTorch export: {description['path']}"]
    for name, size in description["files"].items():
        lines.append(f"  file      {name:<28} {size / 1e6:10.2f} MB")
    for key, value in description["export"].items():
        if key == "quantization" and value:
            value = {k: v for k, v in value.items() if v is not None}
        lines.append(f"  export    {key:<16} {json.dumps(value)}")
    for name, method in description["methods"].items():
        signature = lambda tensors: ", ".join(f"{t['dtype']}{t['shape']}" for t in tensors)  # noqa: E731
        lines.append(f"  method    {name}({signature(method['inputs'])}) -> {signature(method['outputs'])}")
        lines.append("            shapes are upper bounds of the dynamic dimensions")
        delegated = method.get("delegate_calls", {})
        outside = method.get("operators_outside", {})
        calls = ", ".join(f"{count} x {backend}" for backend, count in delegated.items()) or "none"
        lines.append(f"            delegate calls: {calls}; operator calls outside delegates: {sum(outside.values())}")
        if outside:
            top = ", ".join(f"{op} x{count}" for op, count in Counter(outside).most_common(8))
            lines.append(f"            outside: {top}")
    for name, value in description["metadata"].items():
        lines.append(f"  metadata  {name:<22} {value}")
    return "\n".join(lines)
