"""GPTQ rounding for the quantized linears: the same int4 / int8 tensors torchao builds, with better values in them.

Round-to-nearest (torchao's default) quantizes every weight on its own, with the scale of its group set by the
group's largest value. GPTQ (Frantar et al., 2022) quantizes one input column at a time and moves the rounding
error of that column onto the columns not yet quantized, weighted by the inverse Hessian `(X^T X)^-1` of the
layer's inputs `X` on calibration text, so that the layer's *output* changes least. Here:

- the columns go in decreasing order of `diag(X^T X)` (the inputs with the most energy first), and each
  group's scale is fixed before any column moves ("static groups"), so the groups stay contiguous and the
  tensor is the one XNNPACK's blockwise kernels take;
- each scale is chosen by a search that minimises the group's squared rounding error (rather than largest
  value / 7.5);
- the Hessians come from one pass of the float model over the calibration tokens.

Only the integer values and scales inside torchao's `IntxUnpackedToInt8Tensor` weights change: the exported
graph, its kernels and the `.pte` size are the same as with round-to-nearest.
"""

import logging
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import torch

from .quantization import write_quantized_values

logger = logging.getLogger(__name__)

# Calibration: this many sequences of this many tokens (8192 tokens in all).
CALIBRATION_SEQUENCES = 32
CALIBRATION_LENGTH = 256
_BATCH = 4


def search_scales(weight: torch.Tensor, group_size: int, qmin: int, qmax: int) -> torch.Tensor:
    """Per-group symmetric scales [N, K / group_size] that minimise sum((w - s * clamp(round(w / s)))^2).

    Tries scales around `max|w| / (qmax + 0.5)` (clipping the largest values a little is often better), each
    also refitted by least squares to the integers it produces, and keeps the best per group."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // group_size, group_size)
    largest = groups.abs().amax(-1).clamp_min(1e-12)
    best_scale = largest / (qmax + 0.5)
    best_error = torch.full_like(best_scale, float("inf"))
    for step in range(31):
        scale = largest / ((qmax + 0.5) * (0.72 + 0.014 * step))
        ints = torch.clamp(torch.round(groups / scale[..., None]), qmin, qmax)
        dot, norm = (groups * ints).sum(-1), (ints * ints).sum(-1)
        refit = torch.where(dot > 0, dot / norm.clamp_min(1e-30), scale)
        for candidate in (scale, refit):
            ints = torch.clamp(torch.round(groups / candidate[..., None]), qmin, qmax)
            error = ((groups - candidate[..., None] * ints) ** 2).sum(-1)
            better = error < best_error
            best_error = torch.where(better, error, best_error)
            best_scale = torch.where(better, candidate, best_scale)
    return best_scale


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, qmin: int, qmax: int,
                  damping: float = 0.01, block: int = 128):  # fmt: skip
    """GPTQ of one weight [N, K] given its inputs' Hessian [K, K]. Returns (integers [N, K], scales [N, K/g])."""
    work = weight.detach().float().clone()
    hessian = hessian.detach().double().clone()
    columns = work.shape[1]
    dead = torch.diag(hessian) == 0  # inputs that are always zero: their weights do not matter
    hessian[dead, dead] = 1.0
    work[:, dead] = 0.0
    scales = search_scales(work, group_size, qmin, qmax)
    order = torch.argsort(torch.diag(hessian), descending=True)
    work, hessian = work[:, order], hessian[order][:, order]
    hessian += damping * torch.diag(hessian).mean() * torch.eye(columns, dtype=hessian.dtype)
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(hessian))
    upper = torch.linalg.cholesky(inverse, upper=True).float()
    column_scales = scales[:, order // group_size]  # [N, K] in the processing order
    ints = torch.empty_like(work)
    for start in range(0, columns, block):
        end = min(start + block, columns)
        chunk, errors = work[:, start:end].clone(), torch.empty(work.shape[0], end - start)
        for j in range(end - start):
            scale = column_scales[:, start + j]
            q = torch.clamp(torch.round(chunk[:, j] / scale), qmin, qmax)
            ints[:, start + j] = q
            error = (chunk[:, j] - scale * q) / upper[start + j, start + j]
            chunk[:, j:] -= error[:, None] * upper[start + j, start + j : end][None, :]
            errors[:, j] = error
        work[:, end:] -= errors @ upper[start:end, end:]
    result = torch.empty_like(ints)
    result[:, order] = ints
    return result, scales


class _InputsRecorded(Exception):
    """Stops a calibration forward at the output embedding once every named module has recorded its input."""


def input_hessians(model, batches: Iterable[torch.Tensor], names: List[str]) -> Dict[str, torch.Tensor]:
    """`X^T X / n` of the inputs of the named modules, over forward passes of `model` on the token batches.

    A forward stops before the output embedding (the LM head) once every named module has seen its input:
    the logits are not needed (SmolLM2's head is a fifth of its weights, and its logits 200 MB a batch)."""
    modules = dict(model.named_modules())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    sums: Dict[str, torch.Tensor] = {}
    counts: Dict[str, int] = {}
    last = [None, None]  # the latest input and its product: q/k/v (and gate/up) are fed the same tensor in a row
    seen = set()

    def hook(name):
        def record(module, inputs):
            x = inputs[0]
            if last[0] is not x:
                flat = x.detach().reshape(-1, x.shape[-1]).float()
                last[0], last[1] = x, (flat.T @ flat, flat.shape[0])
            product, rows = last[1]
            sums[name] = product.clone() if name not in sums else sums[name].add_(product)
            counts[name] = counts.get(name, 0) + rows
            seen.add(name)

        return record

    def stop(module, inputs):
        if len(seen) == len(names):
            raise _InputsRecorded

    handles = [modules[name].register_forward_pre_hook(hook(name)) for name in names]
    if isinstance(head, torch.nn.Module):
        handles.append(head.register_forward_pre_hook(stop))  # after the head's own record hook, if named
    try:
        with torch.no_grad():
            for ids in batches:
                seen.clear()
                try:
                    model(input_ids=ids)
                except _InputsRecorded:
                    pass
                last[0] = last[1] = None
    finally:
        for handle in handles:
            handle.remove()
    return {name: sums[name] / counts[name] for name in names if name in sums}


def calibration_batches(model, tokenizer, path: Optional[str]) -> List[torch.Tensor]:
    """Token batches [4, <= CALIBRATION_LENGTH] to calibrate on: from the text file `path`, or sampled from the model.

    Sampling (temperature 1 from a random first token, seeded) needs no dataset and follows the model's own
    distribution of text; a file of text like the one the model will see does at least as well."""
    # Models with fewer positions (learned position tables) calibrate on shorter sequences.
    text_config = model.config.get_text_config()
    positions = getattr(text_config, "max_position_embeddings", None)
    length = min(CALIBRATION_LENGTH, positions or CALIBRATION_LENGTH)
    if path is not None:
        if tokenizer is None:
            raise ValueError(f"calibration_data '{path}' needs the model's tokenizer, which could not be loaded.")
        text = Path(path).read_text(encoding="utf-8")
        ids = tokenizer(text, return_tensors="pt").input_ids[0]
        count = min(CALIBRATION_SEQUENCES, ids.numel() // length)
        if count == 0:
            raise ValueError(
                f"calibration_data '{path}' holds {ids.numel()} tokens; GPTQ needs at least {length} "
                f"(best {CALIBRATION_SEQUENCES * length}). Pass a longer text file."
            )
        if count < CALIBRATION_SEQUENCES:
            logger.warning("calibration_data gives %d sequences of %d tokens (%d wanted).", count, length,
                           CALIBRATION_SEQUENCES)  # fmt: skip
        sequences = ids[: count * length].reshape(count, length)
    else:
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(0)
        first = torch.randint(0, text_config.vocab_size, (CALIBRATION_SEQUENCES, 1), generator=generator)
        # One batch: on two cores 32 sequences at once beat two batches of 16 by ~20%.
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.default_generator.manual_seed(0)  # the CPU generator only: the one fork_rng restores
            sequences = model.generate(first, attention_mask=torch.ones_like(first), do_sample=True, temperature=1.0,
                                       top_k=0, top_p=1.0, min_new_tokens=length - 1,
                                       max_new_tokens=length - 1, pad_token_id=0)[:, :length]  # fmt: skip
        logger.info("GPTQ: sampled %d calibration sequences of %d tokens in %.1f s.", *sequences.shape,
                    time.perf_counter() - start)  # fmt: skip
    return list(sequences.split(_BATCH))


def requantize(model, entries) -> None:
    """Rewrites the integers and scales of torchao-quantized linears with GPTQ's.

    `entries`: linear name -> (float weight, input Hessian, bits, group size or 0 for per channel)."""
    modules = dict(model.named_modules())
    for done, (name, (weight, hessian, bits, group_size)) in enumerate(entries.items()):
        quantized = modules[name].weight
        qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        ints, scales = gptq_quantize(weight, hessian, group_size or weight.shape[1], qmin, qmax)
        write_quantized_values(name, quantized, ints, scales)
        if (done + 1) % 50 == 0:
            logger.info("GPTQ: %d/%d linears.", done + 1, len(entries))
