"""Parity checks: an exported program, or a patched model, against the eager transformers model."""

from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch

def load_eager(model_dir: Union[str, Path], dtype: torch.dtype = torch.float32):
    """The eager transformers model of `model_dir`, as the exporter loads it (sdpa attention)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    auto_class = "AutoModelForSeq2SeqLM" if config.is_encoder_decoder else "AutoModelForCausalLM"
    model = getattr(transformers, auto_class).from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def greedy_eager(eager, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy tokens of the eager model (no eos stop), for comparison with a program."""
    with torch.no_grad():
        return eager.generate(
            input_ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False
        )


def assert_logits_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-4) -> float:
    """Asserts `max|actual - expected| <= rtol * max|expected|` and returns that relative error.

    Logits are compared relative to their scale: an element-wise relative check fails on logits near
    zero for rounding differences that cannot change any decision.
    """
    assert actual.shape == expected.shape, f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}"
    error = float((actual.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-12))
    assert error <= rtol, f"logits differ: max abs error is {error:.2e} of the largest logit (allowed {rtol:.0e})"
    return error


def _module_state(model) -> Dict[str, Any]:
    """Each module's class, its own `forward` (if set on the instance) and its class's `forward`."""
    return {
        name: (type(module), module.__dict__.get("forward"), type(module).__dict__.get("forward"))
        for name, module in model.named_modules()
    }


def assert_patch_parity(extension, model, *args, rtol: float = 1e-5, **kwargs) -> float:
    """Asserts that `extension.patch_model(model)` (an export config or `ModelExtension` instance) keeps the model's
    outputs: `model(*args, **kwargs)` before and inside the patch, in float32 whatever the config's dtype, within
    `rtol` (see `assert_logits_close`), and that every module's class and `forward` is restored on exit.
    Returns the relative error."""
    model = model.float().eval()
    before = _module_state(model)
    with torch.no_grad():
        expected = model(*args, **kwargs)
        with extension.patch_model(model):
            actual = model(*args, **kwargs)
    after = _module_state(model)
    changed = sorted(name for name in before if before[name] != after.get(name))
    assert not changed, f"patch_model left modules patched after exit: {changed[:5]}"
    first = lambda output: output if isinstance(output, torch.Tensor) else output[0]  # noqa: E731
    return assert_logits_close(first(actual), first(expected), rtol)


def assert_generation_matches_eager(
    reference: Union[str, Path, torch.nn.Module],
    et_model,
    input_ids: Optional[torch.Tensor] = None,
    max_new_tokens: int = 20,
    rtol: float = 1e-4,
) -> torch.Tensor:
    """Asserts that `et_model` (an `ExecuTorchModelForCausalLM`) matches the eager model `reference`
    (a model, or a checkpoint directory loaded with `load_eager`).

    Checks: prefill logits of the prompt within `rtol` (see `assert_logits_close`), then the same greedy tokens for
    `max_new_tokens`, then the logits of a decode step at the end of that sequence. Returns the tokens.
    """
    eager = reference if isinstance(reference, torch.nn.Module) else load_eager(reference)
    if input_ids is None:
        torch.manual_seed(0)
        input_ids = torch.randint(3, eager.config.vocab_size, (1, 7))
    with torch.no_grad():
        expected_logits = eager(input_ids).logits[:, -1:, :]
    actual_logits = et_model(input_ids).logits
    assert_logits_close(actual_logits, expected_logits, rtol)

    expected = greedy_eager(eager, input_ids, max_new_tokens)
    actual = et_model.generate(input_ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    assert actual.tolist() == expected.tolist(), f"greedy tokens differ:\n pte:   {actual.tolist()}\n eager: {expected.tolist()}"

    # Decode step logits at the end of the sequence (the cache holds prompt + generated tokens).
    with torch.no_grad():
        expected_step = eager(expected).logits[:, -1:, :]
    n = expected.shape[1]
    actual_step = et_model(expected[:, -1:], cache_position=torch.tensor([n - 1])).logits
    assert_logits_close(actual_step, expected_step, rtol)
    return actual


def assert_teacher_forced_close(eager, et_model, rtol: float, max_new_tokens: int = 20, min_agreement: float = 0.9):
    """Compares `et_model` with `eager` along eager's own greedy sequence, one token at a time: every step's logits
    within `rtol` and the same top-1 at `min_agreement` of the steps. For programs that round some activation
    differently from eager (quantized): one greedy choice between two near-equal logits may differ, and then two
    free-running sequences part, which says nothing about the program."""
    torch.manual_seed(0)
    sequence = greedy_eager(eager, torch.randint(3, eager.config.vocab_size, (1, 7)), max_new_tokens)
    with torch.no_grad():
        expected = eager(sequence).logits[0]
    agree = 0
    for position in range(sequence.shape[1]):
        actual = et_model(sequence[:, position : position + 1], cache_position=torch.tensor([position])).logits[0, -1]
        assert_logits_close(actual, expected[position], rtol)
        agree += int(actual.argmax() == expected[position].argmax())
    assert agree >= min_agreement * sequence.shape[1], f"top-1 agrees at {agree} of {sequence.shape[1]} positions"


def assert_weights_resolve(extension, model, checkpoint_dir: Union[str, Path]) -> int:
    """Asserts that every parameter and persistent buffer of `model`, inside `extension.patch_model(model)`,
    resolves from the safetensors files saved in `checkpoint_dir` (after `extension.rename_weights`) by name,
    shape and value. Weights tied to one already resolved are skipped. Returns how many tensors resolved."""
    from safetensors.torch import load_file

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    assert files, f"no .safetensors file in '{checkpoint_dir}'"
    saved: Dict[str, torch.Tensor] = {}
    for file in files:
        saved.update(load_file(str(file)))
    saved = extension.rename_weights(saved)
    problems, seen, resolved = [], set(), 0
    with extension.patch_model(model):
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            if name not in saved:
                problems.append(f"{name}: not in the checkpoint")
            elif tuple(saved[name].shape) != tuple(tensor.shape):
                problems.append(f"{name}: shape {tuple(tensor.shape)}, checkpoint {tuple(saved[name].shape)}")
            elif not torch.equal(saved[name].to(tensor.dtype), tensor.detach()):
                problems.append(f"{name}: values differ from the checkpoint")
            else:
                resolved += 1
    assert not problems, f"{len(problems)} weights do not resolve: " + "; ".join(problems[:5])
    return resolved


def export_and_compare(model_dir: Union[str, Path], output_dir: Union[str, Path], max_new_tokens: int = 12, **options):
    """Exports the tiny causal LM in `model_dir` (`main_export(model_dir, output_dir, **options)`, default
    max_seq_len 64) and checks prefill logits, greedy tokens and a decode step against the eager model
    (`assert_generation_matches_eager`). Returns the export directory."""
    from ..exporters import main_export
    from ..modeling import ExecuTorchModelForCausalLM

    options.setdefault("max_seq_len", 64)
    out = main_export(model_dir, output_dir, task="text-generation", **options)
    assert_generation_matches_eager(model_dir, ExecuTorchModelForCausalLM.from_pretrained(out), max_new_tokens=max_new_tokens)
    return out
