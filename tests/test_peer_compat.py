"""huggingface/optimum-executorch (1.1), the peer: its README's snippets run here unchanged but for the model id
(a local tiny checkpoint: no Hub here), and its options map onto ours (`optimum_executorch/peer_options.py`)."""

import json

import pytest
import torch

from optimum_executorch.exporters.quantization import QuantizationSpec
from optimum_executorch.exporters.quantizer import quantize
from optimum_executorch.testing import assert_teacher_forced_close, greedy_eager, load_eager
from optimum_executorch.testing.matrix import round_grouped_4bit_scales

from .conftest import run_cli

# What the README's snippets ask for, as this package's options.
README_QUANTIZATION = QuantizationSpec(qlinear="8da4w", qembedding="8w")


@pytest.fixture(scope="module")
def peer_cli_export(tiny_llama_dir, tmp_path_factory):
    """README "Option 2, Step 1", unchanged but for the model id and the output directory."""
    output_dir = tmp_path_factory.mktemp("peer") / "hf_smollm2"
    result = run_cli(
        "export", "executorch",
        "--model", tiny_llama_dir,
        "--task", "text-generation",
        "--recipe", "xnnpack",
        "--use_custom_sdpa",
        "--use_custom_kv_cache",
        "--qlinear", "8da4w",
        "--qembedding", "8w",
        f"--output_dir={output_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return output_dir


def test_readme_cli_export_matches_eager(peer_cli_export, tiny_llama_dir):
    from optimum.executorch import ExecuTorchModelForCausalLM

    manifest = json.loads((peer_cli_export / "executorch_config.json").read_text())
    assert manifest["custom_sdpa"] and manifest["custom_kv_cache"]
    assert (manifest["quantization"]["qlinear"], manifest["quantization"]["qembedding"]) == ("8da4w", "8w")
    eager = load_eager(tiny_llama_dir)
    quantize(eager, README_QUANTIZATION)
    round_grouped_4bit_scales(eager, README_QUANTIZATION)
    # Quantized embeddings + 8-bit activations: at an exact .5 tie, one activation step rounds apart from eager,
    # up to 4.6e-2 of the largest logit (test_quantization.py); elsewhere the two agree to 1e-4.
    assert_teacher_forced_close(eager, ExecuTorchModelForCausalLM.from_pretrained(peer_cli_export), rtol=0.1)


def test_readme_snippets_run_unchanged(peer_cli_export, tiny_llama_dir):
    model_id = tiny_llama_dir
    # --- README "Option 1: Export and Load in One Python API", unchanged below this line but for model_id.
    from optimum.executorch import ExecuTorchModelForCausalLM
    from transformers import AutoTokenizer

    # Load and export the model on-the-fly
    model = ExecuTorchModelForCausalLM.from_pretrained(
        model_id,
        recipe="xnnpack",
        attn_implementation="custom_sdpa",  # Use custom SDPA implementation for better performance
        use_custom_kv_cache=True,  # Use custom KV cache for better performance
        **{"qlinear": "8da4w", "qembedding": "8w"},  # Quantize linear and embedding layers
    )

    # Generate text right away
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    generated_text = model.text_generation(
        tokenizer=tokenizer,
        prompt="Once upon a time",
        max_seq_len=128,
    )
    print(generated_text)
    # --- README "Option 2, Step 2": the program the CLI wrote, loaded from its directory.
    model_2 = ExecuTorchModelForCausalLM.from_pretrained(peer_cli_export)
    generated_text_2 = model_2.text_generation(tokenizer=tokenizer, prompt="Once upon a time", max_seq_len=128)
    # --- the checks: both ways make the same program, and text_generation is greedy generation, echoing the prompt.
    assert generated_text == generated_text_2
    prompt = torch.tensor([tokenizer.encode("Once upon a time")])
    expected = model_2.generate(prompt, max_new_tokens=128 - prompt.shape[1], do_sample=False)
    assert generated_text == tokenizer.decode(expected[0], skip_special_tokens=True)
    assert generated_text.startswith("Once upon a time")
    assert model.stats.prompt_tokens == prompt.shape[1] and model.stats.new_tokens >= 1
    assert model.max_cache_size == model.max_seq_len and model.bos_token_id == tokenizer.bos_token_id
    assert tokenizer.eos_token_id in model.eos_token_ids


def test_text_generation_is_eager_greedy(et_model, tiny_llama_dir):
    """`text_generation` on an fp32 program: the eager model's greedy text, up to `max_seq_len` tokens in all."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    prompt = torch.tensor([tokenizer.encode("Once upon a time")])
    expected = greedy_eager(load_eager(tiny_llama_dir), prompt, 30 - prompt.shape[1])[0].tolist()
    eos = et_model.eos_token_ids
    stop = next((i + 1 for i in range(prompt.shape[1], len(expected)) if expected[i] in eos), len(expected))
    text = et_model.text_generation(tokenizer, "Once upon a time", echo=False, max_seq_len=30)
    assert text == tokenizer.decode(expected[prompt.shape[1] : stop], skip_special_tokens=True)


@pytest.mark.parametrize(
    "peer, ours",
    [
        ({"model_name_or_path": "m"}, {"model": "m"}),
        ({"use_custom_sdpa": True, "use_custom_kv_cache": True}, {}),  # the default here
        ({"use_custom_sdpa": False}, {"custom_sdpa": False}),
        ({"attn_implementation": "sdpa"}, {"custom_sdpa": False}),
        ({"attn_implementation": "custom_sdpa"}, {}),
        ({"disable_dynamic_shapes": True, "device": "cpu"}, {}),
        ({"qlinear": "8da4w", "qlinear_encoder": "8da4w"}, {"qlinear": "8da4w"}),
    ],
)
def test_peer_options_map_onto_ours(peer, ours):
    from optimum_executorch.peer_options import translate

    assert translate(peer) == ours


@pytest.mark.parametrize(
    "peer, message",
    [
        ({"device": "cuda"}, "device 'cuda' is not available: this package exports programs for CPUs"),
        ({"qlinear_encoder": "8da8w"}, "Pass --qlinear 8da8w to quantize both"),
        ({"qlinear": "4w", "qlinear_packing_format": "tile_packed_to_4d"}, "CUDA kernels"),
        ({"image_size": 512}, "object-detection"),
        ({"recipe": "coreml"}, "recipe 'coreml' is not available: Core ML programs run on Apple devices only"),
        ({"attn_implementation": "flash_attention_2"}, "attn_implementation 'flash_attention_2' is not supported"),
    ],
)
def test_peer_options_we_do_not_build_are_refused_before_loading(peer, message, tiny_llama_dir, tmp_path):
    from optimum_executorch import main_export

    with pytest.raises(ValueError, match=message):
        main_export(model_name_or_path=tiny_llama_dir, output_dir=tmp_path / "o", **peer)
    assert not (tmp_path / "o").exists()


def test_peer_module_path_and_dry_run(tiny_llama_dir):
    from optimum.exporters.executorch import main_export

    plan = main_export(model_name_or_path=tiny_llama_dir, task="text-generation", recipe="xnnpack",
                       qlinear="8da4w,8da8w", use_custom_sdpa=True, dry_run=True)  # fmt: skip
    assert plan.custom_sdpa and plan.quantization.qlinear == "8da4w,8da8w"


def test_mixed_scheme_keeps_8_bits_where_the_group_does_not_divide():
    """The peer's "8da4w,8da8w": 4-bit groups where the group size divides the inputs, 8 bits per channel elsewhere
    (plain 8da4w gives those one 4-bit group per channel)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16))  # 64 % 64 == 0, 32 % 64 != 0
    spec = QuantizationSpec(qlinear="8da4w,8da8w", qlinear_group_size=64)
    x = torch.randn(3, 64)
    reference = model(x)
    summary = quantize(model, spec)
    assert summary == {"linear_8bit_per_channel": 1, "linear_group64": 1}, summary
    assert (model(x) - reference).abs().max() < 0.1 * reference.abs().max()


@pytest.mark.parametrize(
    "flag, hint",
    [("--quantize", "Use --qlinear 8da4w"), ("--use_custom_sdap", "Did you mean '--use_custom_sdpa'?")],
)
def test_unknown_cli_option_hints_never_the_opposite(flag, hint, tmp_path):
    result = run_cli("export", "executorch", "-m", "x", "-o", str(tmp_path / "o"), flag)
    assert result.returncode == 2 and hint in result.stderr, result.stderr


def test_a_directory_holding_only_a_program_loads_in_a_fresh_process(tiny_llama_export, tiny_llama_dir, tmp_path):
    """What the peer's export writes: a `.pte` (any name), no executorch_config.json, no config.json. The metadata
    comes from the program's constant methods, and the kernel libraries it may need are imported."""
    import shutil
    import subprocess
    import sys

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_llama_export / "model.pte", bare / "smollm2.pte")
    script = (
        "import sys, torch\n"
        "from optimum.executorch import ExecuTorchModelForCausalLM\n"
        "model = ExecuTorchModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "print(model.generate(torch.tensor([[3, 14, 15, 92, 65]]), max_new_tokens=10, min_new_tokens=10).tolist())\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(bare)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = greedy_eager(load_eager(tiny_llama_dir), torch.tensor([[3, 14, 15, 92, 65]]), 10)
    assert result.stdout.strip().splitlines()[-1] == str(expected.tolist())

    from optimum.executorch import ExecuTorchModelForCausalLM

    shutil.copy(bare / "smollm2.pte", bare / "other.pte")
    with pytest.raises(ValueError, match=r"several programs \(other.pte, smollm2.pte\): choose one with file_name="):
        ExecuTorchModelForCausalLM.from_pretrained(bare)
    model = ExecuTorchModelForCausalLM.from_pretrained(bare, file_name="other.pte")
    assert model.config.vocab_size == model.vocab_size and model.max_seq_len == 64
