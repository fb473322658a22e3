"""Widening a 16-bit checkpoint to the export dtype one tensor at a time, so that an export holds about one copy
of the weights instead of three.

An fp32 export of a bf16 / fp16 safetensors checkpoint used to load the model in fp32: transformers maps the file
(its pages count as resident once read) and widens every tensor into new memory, so the load alone peaked at the
file plus twice its size (Llama-3.2-1B: 7.5 GB for 2.47 GB of bf16). Loaded in its stored dtype instead, the model's
tensors are views of the mapped file, read only when touched. `widen` then gives each module its fp32 tensors
just before the quantizer (or the export) needs them and hands the file pages it has copied back to the kernel,
so the fp32 copy of a layer lives only until that layer is quantized.

The pages are released with `madvise(MADV_DONTNEED)` on Linux (elsewhere they stay until the mapping closes): only
whole pages, inside a safetensors file mapping, that are still the file's (`/proc/self/pagemap`): the mapping is
private, so such a page read again comes back from the file, the same bytes.
"""

import ctypes
import os
import sys
from typing import List, Optional, Tuple

import torch


_MADV_DONTNEED = 4
# safetensors' names of the floating dtypes a checkpoint can be widened from.
_STORED_16_BIT = {"BF16": torch.bfloat16, "F16": torch.float16}
_WIDENED_FROM = tuple(_STORED_16_BIT.values())


def safetensors_dtypes(path) -> set:
    """The dtypes (safetensors' names: `BF16`, `F32`, `I64`, ...) of the tensors in a `.safetensors` file, read from
    its header alone."""
    import json
    import struct

    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def load_dtype(stored_dtypes: Optional[set], dtype: torch.dtype) -> torch.dtype:
    """The dtype to load a checkpoint in for an export in `dtype`: the checkpoint's own when every floating tensor of
    it is bf16 (or every one fp16) and the export widens it to fp32 (`widen` does, layer by layer), else `dtype`.
    `stored_dtypes`: its tensors' dtypes (`safetensors_dtypes`), `None` when unknown."""
    floating = {name for name in stored_dtypes or () if name.startswith(("F", "BF"))}
    if dtype != torch.float32 or len(floating) != 1 or next(iter(floating)) not in _STORED_16_BIT:
        return dtype
    return _STORED_16_BIT[next(iter(floating))]


def float32_buffers(auto_class, config, trust_remote_code: bool = False) -> dict:
    """The buffers a model computes when it is built (rotary frequencies, embedding scales), computed in fp32 with
    the parameters left on the meta device: a model built in bf16 computes some of them in bf16, and widening
    them afterwards would not bring back the bits (Gemma's sqrt(hidden_size) embedding scale)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        if hasattr(auto_class, "from_config"):  # an Auto class
            skeleton = auto_class.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
        else:
            skeleton = auto_class._from_config(config, dtype=torch.float32)
    return {name: b for name, b in skeleton.named_buffers(remove_duplicate=False) if b.device.type != "meta"}


def restore_computed_buffers(model, buffers: dict) -> None:
    """Puts the fp32 `buffers` (`float32_buffers`) in place of the non-persistent buffers the model computed
    at load (persistent ones come from the checkpoint and are widened like weights)."""
    for name, module in model.named_modules():
        for key in module._non_persistent_buffers_set:
            full = f"{name}.{key}" if name else key
            if full in buffers and module._buffers.get(key) is not None:
                module._buffers[key] = buffers[full]


def widen(module: torch.nn.Module, dtype: torch.dtype, root: Optional[torch.nn.Module] = None) -> int:
    """Casts every 16-bit floating parameter and buffer of `module` to `dtype`, one tensor at a time, releasing the
    file pages each one was read from. A tensor shared with another module (a tied embedding) is cast once and the
    cast shared. `root`: the whole model, to find the other owners of a shared tensor. Returns the bytes widened."""
    root = root if root is not None else module
    todo = [t for t in _tensors(module) if t.dtype in _WIDENED_FROM and t.dtype != dtype]
    if not todo:
        return 0
    owners = {}
    for owner, kind, key, tensor in _slots(root):
        owners.setdefault(id(tensor), []).append((owner, kind, key))
    widened = 0
    for tensor in todo:
        cast = tensor.detach().to(dtype)
        if isinstance(tensor, torch.nn.Parameter):
            cast = torch.nn.Parameter(cast, requires_grad=False)
        for owner, kind, key in owners.get(id(tensor), []):
            getattr(owner, kind)[key] = cast
        widened += tensor.numel() * tensor.element_size()
        release_pages(tensor)
    return widened


def _slots(module: torch.nn.Module):
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            for key, tensor in getattr(owner, kind).items():
                if tensor is not None:
                    yield owner, kind, key, tensor


def _tensors(module: torch.nn.Module) -> List[torch.Tensor]:
    seen, tensors = set(), []
    for _, _, _, tensor in _slots(module):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors.append(tensor)
    return tensors


def release_pages(tensor: torch.Tensor) -> None:
    """Hands back the pages of `tensor` that are pages of a mapped safetensors file, unchanged since the load: after
    a look that copied what it needed (the 4-bit grid search), or once the tensor is replaced (widened, quantized).
    A later read brings them back from the file. Pages written since the load (a weight edited in place) are the
    process's own copies and are kept, so no view of the tensor can ever read other values."""
    if not sys.platform.startswith("linux") or tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    try:
        contiguous = tensor.is_contiguous()
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor subclass holds no storage of its own
        return
    # A contiguous block of rows of a larger weight: just those rows; otherwise the whole storage.
    start, size = (tensor.data_ptr(), tensor.numel() * tensor.element_size()) if contiguous else (storage.data_ptr(), storage.nbytes())
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = -(-start // page) * page, (start + size) // page * page
    if last <= first or not _in_safetensors_mapping(first, last) or not _unwritten(first, last, page):
        return
    libc = _libc()
    if libc is not None:
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED)


def _unwritten(first: int, last: int, page: int) -> bool:
    """Whether every page in [first, last) that is resident is a page of the mapped file, none a private copy made by
    a write (/proc/self/pagemap: bit 63 present, 62 swapped, 61 file page)."""
    import numpy as np

    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first // page * 8)
            entries = np.frombuffer(pagemap.read((last - first) // page * 8), dtype=np.uint64)
    except OSError:
        return False
    present, swapped, file_page = (entries >> np.uint64(63)) & 1, (entries >> np.uint64(62)) & 1, (entries >> np.uint64(61)) & 1
    return bool(not swapped.any() and not (present & (1 - file_page)).any())


def _in_safetensors_mapping(first: int, last: int) -> bool:
    for low, high, path in _file_mappings():
        if low <= first and last <= high:
            return path.endswith(".safetensors")
    return False


def _file_mappings() -> List[Tuple[int, int, str]]:
    mappings = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    mappings.append((low, high, fields[5].strip()))
    except OSError:
        pass
    return mappings


_LIBC = []


def _libc():
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
