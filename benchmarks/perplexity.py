"""Perplexity of an exported causal LM beside the eager fp32 model, on real English Wikipedia text.

The text ships in the `gensim` PyPI package (`pip install --no-deps gensim==4.4.0`): 106 articles of a
Wikipedia dump, wiki markup stripped here. Both models score the same tokens in the same windows of
`--context` tokens: the eager model in one forward per window, the program one token a call (its
`forward` returns the logits of the last position only, so each call gives the next-token logits of one
position, with the KV cache inside the program). Perplexity = exp(mean negative log-likelihood).

    python benchmarks/perplexity.py --export_dir out/ [--tokens 2048 --context 512]
"""

import argparse
import bz2
import html
import importlib.metadata
import json
import math
import re
import time
from pathlib import Path

WIKI_FILE = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def wikipedia_text(max_chars: int = 400_000) -> str:
    """Plain text of the articles in gensim's Wikipedia sample (markup, templates, references removed)."""
    try:
        path = importlib.metadata.distribution("gensim").locate_file(WIKI_FILE)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("The Wikipedia text ships in gensim: pip install --no-deps gensim==4.4.0") from None
    raw = bz2.open(path, "rt", encoding="utf-8").read()
    articles = []
    for body in re.findall(r"<text[^>]*>(.*?)</text>", raw, flags=re.S):
        text = html.unescape(body)
        if text.startswith("#REDIRECT"):
            continue
        for _ in range(3):  # nested templates
            text = re.sub(r"\{\{[^{}]*\}\}", "", text)
        text = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>|<!--.*?-->|<[^>]+>", "", text, flags=re.S)
        text = re.sub(r"\{\|.*?\|\}", "", text, flags=re.S)  # tables
        text = re.sub(r"\[\[(?:File|Image|Category):[^\]]*\]\]", "", text)
        text = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", text)  # [[target|label]] -> label
        text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)
        text = re.sub(r"'{2,}", "", text)
        text = re.sub(r"^[*#:;=|!].*$", "", text, flags=re.M)  # lists, headings, table rows
        text = re.sub(r"\n{2,}", "\n\n", text).strip()
        if len(text) > 500:
            articles.append(text)
        if sum(map(len, articles)) > max_chars:
            break
    return "\n\n".join(articles)


def _nll_eager(model, windows):
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for ids in windows:
            logits = model(ids).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
    return total, count


def _nll_program(model, windows):
    import torch

    total, count = 0.0, 0
    for ids in windows:
        for position in range(ids.shape[1] - 1):
            logits = model(ids[:, position : position + 1], cache_position=torch.tensor([position])).logits[0, -1]
            total += float(torch.nn.functional.cross_entropy(logits[None].float(), ids[0, position + 1 : position + 2]))
            count += 1
    return total, count


def main():
    parser = argparse.ArgumentParser(description="Perplexity of a .pte and of the eager model on Wikipedia text.")
    parser.add_argument("--export_dir", required=True, help="an export directory of a text-generation model")
    parser.add_argument("--model", default=None, help="eager checkpoint (default: the one the export was made from)")
    parser.add_argument("--gguf_file", default=None)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens scored in all")
    parser.add_argument("--context", type=int, default=512, help="tokens per window")
    parser.add_argument("--json", default="benchmarks/results/perplexity.json")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from optimum.executorch import ExecuTorchModelForCausalLM

    config = json.loads((Path(args.export_dir) / "executorch_config.json").read_text())
    if args.model is None:
        args.model, args.gguf_file = config["options"]["model"], args.gguf_file or config["options"].get("gguf_file")
    program = ExecuTorchModelForCausalLM.from_pretrained(args.export_dir)
    if args.context > program.max_seq_len:
        raise SystemExit(f"--context {args.context} is beyond the program's {program.max_seq_len} positions.")
    ids = program.tokenizer(wikipedia_text(), return_tensors="pt").input_ids[:, : args.tokens]
    windows = [ids[:, i : i + args.context] for i in range(0, ids.shape[1] - 1, args.context)]
    windows = [w for w in windows if w.shape[1] > 1]

    kwargs = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    eager = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, **kwargs).eval()
    start = time.perf_counter()
    eager_nll, count = _nll_eager(eager, windows)
    eager_s = time.perf_counter() - start
    start = time.perf_counter()
    program_nll, program_count = _nll_program(program, windows)
    program_s = time.perf_counter() - start
    assert count == program_count

    quantization = config.get("quantization") or {}
    label = "+".join(filter(None, [quantization.get("qlinear"), quantization.get("qembedding")])) or config["dtype"]
    gptq_linears = (quantization.get("layers") or {}).get("linear_gptq")
    if gptq_linears:
        label += f", gptq ({quantization['qlinear_method']}, {gptq_linears} linear(s)) on "
        label += quantization.get("calibration_data") or "self-sampled text"
    if quantization.get("qlinear_8bit_layers"):
        label += f" ({'/'.join(quantization['qlinear_8bit_layers'])} at 8da8w)"
    report = {
        "tokens": count,
        "context": args.context,
        "eager_fp32_perplexity": math.exp(eager_nll / count),
        "program_perplexity": math.exp(program_nll / count),
        "program": label,
        "eager_s": eager_s,
        "program_s": program_s,
    }
    report["ratio"] = report["program_perplexity"] / report["eager_fp32_perplexity"]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"| model | perplexity ({count} tokens of Wikipedia, windows of {args.context}) |")
    print("| --- | ---: |")
    print(f"| eager fp32 (transformers) | {report['eager_fp32_perplexity']:.3f} |")
    print(f"| .pte ({label}) | {report['program_perplexity']:.3f} ({report['ratio']:.3f}x) |")


if __name__ == "__main__":
    main()
