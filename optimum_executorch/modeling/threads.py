"""One thread pool at a time: libtorch's OpenMP and MKL threads stay idle while a program runs.

On a small CPU, XNNPACK's thread pool wants every core for each delegate call. Two other thread pools in
the same process get in its way, and their threads spin for a while after each use:
- MKL inside libtorch: ExecuTorch's `llama::custom_sdpa` kernel (pip wheel) multiplies through it, from
  ExecuTorch's worker threads, and MKL starts an OpenMP team of its own for each call;
- libtorch's OpenMP team: the eager ops `generate` runs between two program calls (logits processors,
  argmax, `isin` over a 49k vocabulary) are large enough to run in parallel.
Measured on 2 cores, SmolLM2-135M 8da4w through `generate`: 86-90 tok/s decode as it was, 151-155 with
`OMP_NUM_THREADS=1` set before the process starts. That variable is a trap: the user must know it, and
it cripples eager torch for the whole process. `torch.set_num_threads(1)` only reaches the calling
thread's OpenMP and MKL settings, not the MKL calls made from ExecuTorch's worker threads.

So the runtime narrows both pools to one thread only while a program runs (`generate` as a whole, or one
`forward`): MKL's process-wide thread count (what worker threads use) and the calling thread's OpenMP and
MKL settings, all restored on exit, so eager models in the same process keep their speed. Where libtorch
has no MKL or no GNU OpenMP (other builds), the missing part is left alone.
"""

import contextlib
import ctypes
import os
import threading
from typing import Callable, List, Optional

_lock = threading.Lock()
_depth = 0
_restore: List[Callable[[], None]] = []
_library_cache: dict = {}


def _function(library: str, name: str, restype, argtypes) -> Optional[Callable]:
    """`name` from the copy of `library` that torch loaded (torch/lib), or None where it has none."""
    key = (library, name)
    if key not in _library_cache:
        import torch

        fn = None
        path = os.path.join(os.path.dirname(torch.__file__), "lib", library)
        if os.path.exists(path):
            try:
                fn = getattr(ctypes.CDLL(path), name)
                fn.restype, fn.argtypes = restype, argtypes
            except (OSError, AttributeError):
                fn = None
        _library_cache[key] = fn
    return _library_cache[key]


def _narrow() -> List[Callable[[], None]]:
    """Sets every pool this build has to one thread; returns the calls that undo it."""
    undo = []
    get_mkl = _function("libtorch_cpu.so", "MKL_Get_Max_Threads", ctypes.c_int, [])
    set_mkl_global = _function("libtorch_cpu.so", "mkl_serv_set_num_threads", None, [ctypes.c_int])
    set_mkl_local = _function("libtorch_cpu.so", "MKL_Set_Num_Threads_Local", ctypes.c_int, [ctypes.c_int])
    if get_mkl and set_mkl_global and set_mkl_local:
        local = set_mkl_local(0)  # 0: this thread follows the global count, which get_mkl now reads
        global_count = get_mkl()
        set_mkl_global(1)
        set_mkl_local(1)
        undo.append(lambda: (set_mkl_global(global_count), set_mkl_local(local)))
    get_omp = _function("libgomp.so.1", "omp_get_max_threads", ctypes.c_int, [])
    set_omp = _function("libgomp.so.1", "omp_set_num_threads", None, [ctypes.c_int])
    if get_omp and set_omp:
        omp_count = get_omp()
        set_omp(1)
        undo.append(lambda: set_omp(omp_count))
    return undo


@contextlib.contextmanager
def exclusive_cores():
    """Runs the block with libtorch's OpenMP and MKL on one thread, restoring them on exit.

    Re-entrant: nested blocks (a `forward` inside `generate`) keep the outermost setting. Call it from the
    thread that runs the program.
    """
    global _depth, _restore
    with _lock:
        _depth += 1
        if _depth == 1:
            _restore = _narrow()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for undo in reversed(_restore):
                    undo()
                _restore = []
