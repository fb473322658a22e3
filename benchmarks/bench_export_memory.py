"""Export memory of big checkpoints: random weights in the shapes of released models, saved in bfloat16 as released,
exported with `--qlinear 8da4w --qembedding 8w --max_seq_len 2048` in a fresh process under `/usr/bin/time -v`.

Records, per shape: checkpoint bytes, export time, the peak RSS as `time -v` reports it (mapped checkpoint pages
included) and its ratio to the checkpoint, each stage's peak RSS and anonymous memory at its end (from the export's
own log), the `.pte` size, and with `--check_tokens` whether the program's greedy tokens equal the eager model's
quantized alike, teacher-forced along the eager greedy sequence (random weights: this is about memory, not quality). Prefill / decode speeds of an export come from
`bench_causal_lm.py --export_dir DIR --model CHECKPOINT`.

    python benchmarks/bench_export_memory.py --shapes llama-3.2-1b llama-3.2-3b --workdir /tmp/big --check_tokens
"""

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from random_checkpoint import save_random_checkpoint  # noqa: E402

EXPORT_OPTIONS = ["--qlinear", "8da4w", "--qembedding", "8w", "--max_seq_len", "2048"]
_STAGE = re.compile(r"Stage (\w+)\s+done in\s+([\d.]+) s \(peak RSS (\d+) MB, anonymous now (\d+) MB\)")

_CHECK_TOKENS = """
import sys, torch
from optimum_executorch.exporters.quantization import QuantizationSpec
from optimum_executorch.exporters.quantizer import quantize
from optimum_executorch.modeling import ExecuTorchModelForCausalLM
from optimum_executorch.testing.matrix import round_grouped_4bit_scales
from optimum_executorch.testing.parity import greedy_eager, load_eager

checkpoint, export_dir = sys.argv[1:3]
eager = load_eager(checkpoint)
spec = QuantizationSpec(qlinear="8da4w", qembedding="8w")
quantize(eager, spec)
round_grouped_4bit_scales(eager, spec)
prompt = torch.tensor([[1, 504, 3458, 282, 7131, 314, 253, 2876]])
sequence = greedy_eager(eager, prompt, 8)
with torch.no_grad():
    expected = eager(sequence).logits[0]
del eager
program = ExecuTorchModelForCausalLM.from_pretrained(export_dir)
errors, agree, margins = [], 0, []
for position in range(sequence.shape[1]):
    actual = program(sequence[:, position : position + 1], cache_position=torch.tensor([position])).logits[0, -1]
    errors.append(float((actual - expected[position]).abs().max() / expected[position].abs().max()))
    agree += int(actual.argmax() == expected[position].argmax())
    top2 = expected[position].topk(2).values
    margins.append(float((top2[0] - top2[1]) / expected[position].abs().max()))
print("TOKENS", agree == sequence.shape[1], agree, sequence.shape[1], max(errors), min(margins))
"""


def export_and_measure(checkpoint: Path, export_dir: Path) -> dict:
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "optimum.commands.optimum_cli", "export", "executorch",
               "--model", str(checkpoint), "--task", "text-generation", "--recipe", "xnnpack", *EXPORT_OPTIONS,
               "--output_dir", str(export_dir), "--overwrite", "-v"]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    log = result.stdout + result.stderr
    if result.returncode != 0:
        raise RuntimeError(f"export of {checkpoint} failed:\n{log[-4000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1))
    checkpoint_bytes = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))
    stages = {name: {"seconds": float(s), "peak_rss_mb": int(peak), "anonymous_mb": int(anon)}
              for name, s, peak, anon in _STAGE.findall(log)}  # fmt: skip
    return {
        "checkpoint_mb": checkpoint_bytes / 1e6,
        "export_s": seconds,
        "peak_rss_mb": peak_kb * 1024 / 1e6,
        "peak_over_checkpoint": peak_kb * 1024 / checkpoint_bytes,
        "pte_mb": (export_dir / "model.pte").stat().st_size / 1e6,
        "stages": stages,
    }


def check_tokens(checkpoint: Path, export_dir: Path) -> dict:
    """Along the eager model's greedy sequence, teacher-forced: top-1 agreement, the largest logit error (relative to
    the largest logit) and the smallest top-1 margin of the eager model (random weights give near-flat logits)."""
    result = subprocess.run([sys.executable, "-c", _CHECK_TOKENS, str(checkpoint), str(export_dir)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    line = next((l for l in result.stdout.splitlines() if l.startswith("TOKENS")), None)
    if line is None:
        raise RuntimeError(f"token check failed:\n{result.stderr[-3000:]}")
    print(line)
    _, same, agree, positions, error, margin = line.split()
    return {"greedy_equal": same == "True", "top1_agree": f"{agree}/{positions}", "max_rel_error": float(error),
            "min_top1_margin": float(margin)}  # fmt: skip


def table(results: dict) -> str:
    lines = ["| shape | bf16 checkpoint | export | peak RSS | peak / checkpoint | stages: peak RSS (anonymous at end), MB | .pte | top-1 = eager (logit error) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for shape, r in results.items():
        stages = ", ".join(f"{n} {s['peak_rss_mb']} ({s['anonymous_mb']})" for n, s in r["stages"].items())
        same = f"{r['top1_agree']} (error {r['max_rel_error']:.1e})" if "top1_agree" in r else "-"
        lines.append(f"| {shape} | {r['checkpoint_mb'] / 1e3:.2f} GB | {r['export_s']:.0f} s | {r['peak_rss_mb'] / 1e3:.2f} GB "
                     f"| {r['peak_over_checkpoint']:.2f}x | {stages} | {r['pte_mb']:.0f} MB | {same} |")  # fmt: skip
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["llama-3.2-1b", "llama-3.2-3b"])
    parser.add_argument("--workdir", default="/tmp/bench_export_memory", help="checkpoints and exports (kept)")
    parser.add_argument("--check_tokens", action="store_true", help="compare greedy tokens with the eager model")
    parser.add_argument("--json", default="benchmarks/results/export_memory.json")
    args = parser.parse_args()
    results = {}
    for shape in args.shapes:
        checkpoint, export_dir = Path(args.workdir) / shape, Path(args.workdir) / f"{shape}-8da4w"
        if not (checkpoint / "config.json").is_file():
            print(f"Saving a random {shape} checkpoint (bf16) to {checkpoint}...", flush=True)
            save_random_checkpoint(shape, checkpoint, dtype="bfloat16")
        print(f"Exporting {shape}...", flush=True)
        results[shape] = export_and_measure(checkpoint, export_dir)
        if args.check_tokens:
            results[shape].update(check_tokens(checkpoint, export_dir))
        print(json.dumps(results[shape]), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
