"""Shared fixtures: one tiny llama exported once per session, and a helper to run the CLI."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Tests never reach the network: models are built locally or ship in PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
logging.getLogger("optimum_executorch").setLevel(logging.INFO)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from optimum_executorch.testing import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny_llama") / "model")


@pytest.fixture(scope="session")
def tiny_llama_export(tiny_llama_dir, tmp_path_factory):
    """The tiny llama exported once (xnnpack, fp32, max_seq_len 64), shared by the runtime tests."""
    from optimum_executorch import main_export

    out = tmp_path_factory.mktemp("tiny_llama_export") / "et"
    main_export(tiny_llama_dir, out, task="text-generation", recipe="xnnpack", max_seq_len=64)
    return out


@pytest.fixture()
def et_model(tiny_llama_export):
    from optimum.executorch import ExecuTorchModelForCausalLM

    return ExecuTorchModelForCausalLM.from_pretrained(tiny_llama_export)


def run_cli(*args, check=False, timeout=900):
    """Runs `optimum-cli ...` in a subprocess that imports this checkout."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cli = [sys.executable, "-m", "optimum.commands.optimum_cli", *args]
    result = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"optimum-cli failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def answers_from_threads(call, threads=4, calls_per_thread=3):
    """Runs `call()` `calls_per_thread` times in each of `threads` threads at once; returns every answer
    (an exception counts as an answer, so a test sees it)."""
    import concurrent.futures

    def worker():
        answers = []
        for _ in range(calls_per_thread):
            try:
                answers.append(call())
            except Exception as err:  # noqa: BLE001
                answers.append(err)
        return answers

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(worker) for _ in range(threads)]
        return [answer for future in futures for answer in future.result()]


# The coverage matrix: each test marked `@pytest.mark.cell(Cell)` records its outcome in test-results/coverage.json
# (merged with earlier runs, so that running a subset updates only its cells) and its time in
# coverage-timings.json; `python -m optimum_executorch.coverage` renders docs/coverage.md from them.
RESULTS_DIR = REPO_ROOT / "test-results"
_CELL_RESULTS, _CELL_TIMES = {}, {}
COLLECTED_CELLS, COLLECTED_FILES = pytest.StashKey(), pytest.StashKey()


def cell(model_type, task, recipe="xnnpack", quantization="fp32"):
    """The mark of a test that proves one cell of the coverage matrix."""
    from optimum_executorch.testing.matrix import Cell

    return pytest.mark.cell(Cell(model_type, task, recipe, quantization))


def pytest_configure(config):
    config.addinivalue_line("markers", "cell(cell): the coverage-matrix cell (testing.matrix.Cell) a test proves")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Every cell some collected test proves, before `-k` / `-m` deselect any (see test_matrix)."""
    config.stash[COLLECTED_CELLS] = {m.args[0] for item in items for m in item.iter_markers("cell")}
    config.stash[COLLECTED_FILES] = {item.path.name for item in items}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("cell")
    if marker is None or (report.when != "call" and not report.failed and not report.skipped):
        return
    cell = marker.args[0]
    reason, outcome = "", report.outcome
    if hasattr(report, "wasxfail"):  # a known failure: failed, with the reason it is known for
        reason, outcome = report.wasxfail, "failed"
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = (crash.message if crash else str(report.longrepr)).strip().splitlines()[0]
    elif report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    # Several tests may prove one cell: a failure of any one is the cell's result, and a pass outranks a skip.
    rank = {"skipped": 0, "passed": 1, "failed": 2}
    if rank[outcome] >= rank[_CELL_RESULTS.get(cell.id, {}).get("outcome", "skipped")]:
        _CELL_RESULTS[cell.id] = {**cell.__dict__, "outcome": outcome, "reason": reason}
    _CELL_TIMES[cell.id] = round(_CELL_TIMES.get(cell.id, 0) + report.duration, 1)


def pytest_sessionfinish(session, exitstatus):
    import json

    if not _CELL_RESULTS:
        return
    RESULTS_DIR.mkdir(exist_ok=True)
    for name, new in (("coverage.json", {"cells": _CELL_RESULTS}), ("coverage-timings.json", {"seconds": _CELL_TIMES})):
        path = RESULTS_DIR / name
        old = json.loads(path.read_text()) if path.is_file() else {}
        key = next(iter(new))
        merged = {**old.get(key, {}), **new[key]}
        path.write_text(json.dumps({key: dict(sorted(merged.items()))}, indent=1, sort_keys=True) + "\n")
