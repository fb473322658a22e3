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
