"""The output directory of an export: refused where it would replace the user's data, checked for writing
before any work, and written atomically (a failed or killed export leaves the previous output as it was)."""

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Optional

from ..contract import EXECUTORCH_CONFIG_NAME

logger = logging.getLogger(__name__)


def _overlap(output_dir: Path, other: Path) -> Optional[str]:
    """How `output_dir` overlaps `other` ("is", "contains", "lies inside"), or None."""
    out, other = output_dir.resolve(), other.resolve()
    if out == other:
        return "is"
    if out in other.parents:
        return "contains"
    if other in out.parents:
        return "lies inside"
    return None


def _holds_other_files(directory: Path) -> bool:
    """Whether `directory` holds files that are not a previous export (an overwrite would delete them)."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return False
    return not ((directory / EXECUTORCH_CONFIG_NAME).is_file() or any(directory.glob("*.pte")))


def refuse_output_over_inputs(options, output_dir: Path) -> None:
    """An export replaces its output directory: refuse one that is or holds the checkpoint, a Hugging Face cache or
    the working directory, or lies inside the cache, before any work (`-m DIR -o DIR --overwrite` deleted DIR).
    Inside the checkpoint, only a directory holding files other than a previous export is refused."""
    from huggingface_hub.constants import HF_HUB_CACHE

    protected = []
    for source in (options.model, options.gguf_file):
        if source and Path(source).expanduser().exists():
            protected.append(("the model checkpoint", Path(source).expanduser()))
    protected += [("the Hugging Face cache", Path(cache).expanduser()) for cache in (HF_HUB_CACHE, options.cache_dir) if cache]
    for what, path in protected:
        relation = _overlap(output_dir, path)
        if relation == "lies inside" and what == "the model checkpoint" and not _holds_other_files(output_dir):
            continue  # a new subdirectory (`-m . -o et`), or a previous export: the checkpoint's files stay
        if relation:
            raise ValueError(
                f"--output_dir '{output_dir}' {relation} {what} '{path}': an export replaces its output directory. "
                "Choose a directory outside it."
            )
    cwd = Path.cwd()
    if _overlap(output_dir, cwd) in ("is", "contains"):
        raise ValueError(
            f"--output_dir '{output_dir}' {_overlap(output_dir, cwd)} the working directory: an export replaces its "
            "output directory. Name a new subdirectory, e.g. --output_dir ./executorch_model."
        )


def prepare_output_dir(options) -> Path:
    """Every check of `options.output_dir` that can be made before any work, and the cleanup of a killed export."""
    if options.output_dir is None or not str(options.output_dir).strip():
        raise ValueError("No output directory given: pass --output_dir (a new or empty directory).")
    output_dir = Path(options.output_dir)
    refuse_output_over_inputs(options, output_dir)
    remove_stale_partials(output_dir)
    check_output_dir(output_dir, options.overwrite)
    check_writable(output_dir)
    return output_dir


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"Output path '{output_dir}' exists and is not a directory. Choose another --output_dir.")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"Output directory '{output_dir}' exists and is not empty. Pass --overwrite to replace it, "
            "or choose another --output_dir."
        )


def _host_tag() -> str:
    # On a shared filesystem a PID names a process of one host only.
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def _partial_prefix(output_dir: Path, kind: str = "partial") -> str:
    # The writer's host and PID in the name tell a stale partial (its writer is gone) from one still being written.
    return f".{output_dir.name[:160]}.{kind}-{_host_tag()}-{os.getpid()}-"


def remove_stale_partials(output_dir: Path) -> None:
    """Cleans up after an export of the same output that was killed mid-write (its process is gone): a partial
    is removed; a previous export set aside for the rename is put back if the output is missing."""
    if not output_dir.parent.is_dir():
        return
    pattern = re.compile(rf"^\.{re.escape(output_dir.name[:160])}\.(partial|old)-{_host_tag()}-(\d+)-")
    for path in sorted(output_dir.parent.iterdir()):
        match = pattern.match(path.name)
        if not match or not path.is_dir() or _process_alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and (path / "previous").is_dir() and not output_dir.exists():
            os.replace(path / "previous", output_dir)
            logger.info("Restored %s from %s, set aside by an export that did not finish.", output_dir, path)
        else:
            logger.info("Removing %s, left by an export of %s that did not finish.", path, output_dir)
        shutil.rmtree(path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_writable(output_dir: Path) -> None:
    """Fails before any work where the output cannot be written, not after the whole export."""
    if len(output_dir.name.encode()) > 200:
        raise ValueError(f"--output_dir's name is {len(output_dir.name.encode())} bytes long; keep it under 200.")
    existing = output_dir.absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"Cannot create '{output_dir}': '{existing}' is a file.")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=_partial_prefix(output_dir), dir=existing))
    except OSError as err:
        raise PermissionError(f"Cannot write into '{existing}' ({err.strerror}). Choose another --output_dir.") from err


def write_output(output_dir: Path, overwrite: bool, write_files) -> None:
    """Writes into a temporary sibling directory, then moves it into place in one rename."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_partial_prefix(output_dir), dir=output_dir.parent))
    try:
        write_files(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; an export directory is made like any mkdir
        if output_dir.exists():
            check_output_dir(output_dir, overwrite)
            old = Path(tempfile.mkdtemp(prefix=_partial_prefix(output_dir, "old"), dir=output_dir.parent))
            os.replace(output_dir, old / "previous")
            os.replace(tmp, output_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
