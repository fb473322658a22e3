"""Checks of a program (`.pte`) and its weights file (`.ptd`) before they reach ExecuTorch's runtime.

ExecuTorch's loader trusts its input: a file of random bytes aborts the process (the pybind layer cannot
turn the loader's log into a Python error), a damaged flatbuffer read with minimal verification can
crash it, and bytes flipped inside the weights load fine and answer NaN. So the runtime checks, in order:
the file's identifier and that the extents its header declares lie inside the file, then (when the export
recorded them) the SHA-256 of each file; the flatbuffer itself is then loaded with ExecuTorch's own
internal-consistency verification. Standard library only.
"""

import re
import struct
from pathlib import Path
from typing import Dict, Optional

from ..contract import PTE_FILE_NAME
from ..utils import file_sha256

# Flatbuffer file identifiers at bytes 4..8: a program ("ET" + schema version) and a named-data file.
_PROGRAM_IDENTIFIER = re.compile(rb"ET[0-9a-zA-Z]{2}")
_DATA_IDENTIFIER = re.compile(rb"FT[0-9a-zA-Z]{2}")
# The extended headers that follow the identifier and say where the segments (weights, delegate blobs) lie.
_PROGRAM_HEADER, _DATA_HEADER = b"eh00", b"FH01"

# ExecuTorch's `Error` codes (runtime/core/error.h), as its loader prints them ("error: 0x14").
RUNTIME_ERRORS = {
    0x01: "internal error of the runtime",
    0x02: "the program is in an invalid state",
    0x10: "an operation this runtime does not support",
    0x12: "an input of the wrong shape, type or value",
    0x13: "a value of the wrong type",
    0x14: "an operator the program needs is not registered: import the kernel library that provides it "
    "(executorch.extension.llm.custom_ops for llama::*, executorch.kernels.quantized for quantized_decomposed::*), "
    "or the program was exported for another runtime",
    0x20: "something the program refers to was not found (a method, or its weights file)",
    0x21: "out of memory",
    0x22: "a file could not be read",
    0x23: "the program is malformed",
    0x24: "the weights file does not belong to this program",
    0x25: "out of resources",
    0x30: "a delegate blob this runtime's backend cannot read (another backend or version)",
    0x31: "a delegate ran out of memory",
    0x32: "a delegate handle is invalid",
}


def explain_runtime_error(err: Exception) -> str:
    """The runtime's message with its error code put into words."""
    text = str(err)
    match = re.search(r"0x:?([0-9a-fA-F]+)", text)
    meaning = RUNTIME_ERRORS.get(int(match.group(1), 16)) if match else None
    return f"{text} ({meaning})" if meaning else text


class CorruptProgramError(ValueError):
    """A program or weights file that is not what its export wrote."""


def _read_head(path: Path, identifier: "re.Pattern", what: str, fix: str):
    """The file's size and first 64 bytes, once its flatbuffer file identifier (bytes 4..8) is the expected one."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
    if size < 16 or not identifier.fullmatch(head[4:8]):
        raise CorruptProgramError(
            f"'{path}' is not {what} (no '{identifier.pattern[:2].decode()}' file identifier at byte 4; {size:,} bytes). {fix}"
        )
    return size, head


def _check_extents(path: Path, size: int, ends: Dict[str, int]) -> None:
    for part, end in ends.items():
        if end > size:
            raise CorruptProgramError(
                f"'{path}' is truncated: its header places the {part} up to byte {end:,}, but the file has "
                f"{size:,} bytes. Copy or download it again, or export again."
            )


def check_program_file(path: Path) -> None:
    """Refuses a `.pte` that is not an ExecuTorch program or is shorter than its header says."""
    size, head = _read_head(
        path, _PROGRAM_IDENTIFIER, "an ExecuTorch program",
        "Pass the model.pte written by `optimum-cli export executorch`, or export again.",
    )  # fmt: skip
    if head[8:12] == _PROGRAM_HEADER and len(head) >= 32:
        length, program_size, segment_base = struct.unpack_from("<IQQ", head, 12)
        segment_size = struct.unpack_from("<Q", head, 32)[0] if length >= 32 and len(head) >= 40 else 0
        ends = {"program": program_size}
        if segment_size:
            ends["weights and delegate data"] = segment_base + segment_size
        _check_extents(path, size, ends)


def check_data_file(path: Path) -> None:
    """Refuses a `.ptd` that is not ExecuTorch named data or is shorter than its header says."""
    size, head = _read_head(
        path, _DATA_IDENTIFIER, "an ExecuTorch weights file", "Pass the model.ptd written with the program, or export again."
    )
    if head[8:12] == _DATA_HEADER and len(head) >= 48:
        _, flatbuffer_offset, flatbuffer_size, segment_base, segment_size = struct.unpack_from("<IQQQQ", head, 12)
        _check_extents(path, size, {"index": flatbuffer_offset + flatbuffer_size, "weights": segment_base + segment_size})


def verify_checksums(model_dir: Path, checksums: Optional[Dict[str, str]]) -> None:
    """Compares each file's SHA-256 with the one its export recorded."""
    for name, expected in (checksums or {}).items():
        path = model_dir / name
        if path.is_file() and file_sha256(path) != expected:
            raise CorruptProgramError(
                f"'{path}' is not the file its export wrote (its SHA-256 differs from the one recorded in "
                "executorch_config.json): it was changed or damaged after the export, or executorch_config.json "
                "comes from another export. Copy or download the export again, or export again. "
                "(verify_checksums=False skips this check.)"
            )


def find_program_file(model_dir: Path, file_name: Optional[str] = None) -> Path:
    """The program of a directory: `file_name`, else `model.pte`, else the directory's only `.pte` (an export made
    by another tool, such as huggingface/optimum-executorch, may name it otherwise)."""
    if file_name is not None:
        if Path(file_name).name != file_name:
            raise ValueError(f"file_name must be a file name in '{model_dir}', got {file_name!r}.")
        return model_dir / file_name
    default = model_dir / PTE_FILE_NAME
    programs = sorted(p.name for p in model_dir.glob("*.pte"))
    if default.is_file() or not programs:
        return default  # a missing program is reported by the loader, with the fix
    if len(programs) > 1:
        raise ValueError(f"'{model_dir}' holds several programs ({', '.join(programs)}): choose one with file_name=.")
    return model_dir / programs[0]
