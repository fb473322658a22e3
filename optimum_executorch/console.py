"""What the CLI commands show: this package's log lines as they happen; other libraries' output held back.

Exporting or running a program makes torch, ExecuTorch, torchao and transformers print: Python warnings (the same
FutureWarning dozens of times), native log lines written by C++ straight to the file descriptors, progress bars
of steps that take no time. `captured_output` sends file descriptors 1 and 2 to a temporary file for the block,
while this package's logger and the block's own writer go to the real terminal; afterwards the captured text is
dropped, filtered or shown (in full after an unexpected failure, where it may hold the cause).

Standard library only: imported on every `optimum-cli` start.
"""

import contextlib
import ctypes
import logging
import os
import re
import sys
import tempfile

PACKAGE_LOGGER = "optimum_executorch"

# Lines that native code writes while loading and running (ExecuTorch's and torch's logs, the runner's
# end-of-generation line, torchao's note that its CUDA kernels are absent).
NATIVE_LINE = re.compile(r"^(\[[\w./-]+:\d+\]|[IWEDF]\d{4} |[IWEDF] tokenizers:|Reached to the end|Failed to load .*torchao)")


def _flush_native() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers of native code
    except (OSError, AttributeError):
        pass


class _Formatter(logging.Formatter):
    """Time and message; warnings and errors also say so."""

    def formatMessage(self, record) -> str:
        text = super().formatMessage(record)
        if record.levelno < logging.WARNING:
            return text
        time, _, message = text.partition(" ")
        return f"{time} {record.levelname}: {message}"


def _show_package_log(stream, level: int):
    """Sends the package's log records of `level` and above to `stream` (and not to the root logger's handlers);
    returns a function that undoes it."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

    def undo():
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]

    return undo


@contextlib.contextmanager
def captured_output(enabled: bool = True, keep=None, log_level: int = logging.INFO):
    """Captures what is written to stdout/stderr during the block; yields a writer to the real stdout.

    The package's log records of `log_level` and above go to the real stderr as they happen. Afterwards, the
    captured lines for which `keep(line)` is true are shown on stderr (`keep=None`: none). After an exception
    other than a usage error (`ValueError`, `TypeError`, `OSError`) everything captured is shown. `enabled=False`
    captures nothing (verbose mode) and still shows the package's log."""
    if not enabled:
        undo = _show_package_log(sys.stderr, log_level)
        try:
            yield lambda text: (sys.stdout.write(text), sys.stdout.flush())
        finally:
            undo()
        return
    _flush_native()
    with contextlib.ExitStack() as stack:
        capture = stack.enter_context(tempfile.TemporaryFile())
        saved = {}
        for fd in (1, 2):
            saved[fd] = os.dup(fd)
            stack.callback(os.close, saved[fd])
        stack.callback(lambda: [os.dup2(saved[fd], fd) for fd in (1, 2)])
        stack.callback(_flush_native)  # runs first: flush into the capture before restoring
        log_stream = stack.enter_context(os.fdopen(os.dup(saved[2]), "w", buffering=1))
        stack.callback(_show_package_log(log_stream, log_level))
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        show_all = False
        try:
            yield lambda text: os.write(saved[1], text.encode("utf-8"))
        except Exception as err:
            show_all = not isinstance(err, (ValueError, TypeError, OSError))  # usage errors need no third-party log
            raise
        finally:
            _flush_native()
            capture.seek(0)
            lines = capture.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if show_all or (keep is not None and line.strip() and keep(line)))
            if kept:
                os.write(saved[2], kept.encode("utf-8"))


def not_native(line: str) -> bool:
    """`keep` for commands that show Python warnings but not native log lines."""
    return not NATIVE_LINE.match(line)
