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

from .quantized_tensors import write_quantized_values

logger = logging.getLogger(__name__)

# Calibration: this many sequences of this many tokens (8192 tokens in all).
CALIBRATION_SEQUENCES = 32
CALIBRATION_LENGTH = 256
_BATCH = 4


def search_scales(weight: torch.Tensor, group_size: int, qmin: int, qmax: int) -> torch.Tensor:
    """Per-group symmetric scales [N, K / group_size] that minimise sum((w - s * clamp(round(w / s)))^2).

    Tries scales around `max|w| / (qmax + 0.5)` (clipping the largest values a little is often better), each
    also refitted by least squares to the integers it produces, and keeps the best per group. A group's error is
    `sum(w^2) - 2 s sum(w q) + s^2 sum(q^2)`, so each candidate costs one rounding pass; rows go in blocks small
    enough for the cache (an LM head's 28M weights: 18.3 -> 1.6 s on two cores)."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // group_size, group_size)
    best = torch.empty(rows, cols // group_size)
    block = max(1, (1 << 18) // cols)
    for start in range(0, rows, block):
        best[start : start + block] = _search_block(groups[start : start + block], qmin, qmax)
    return best


def _search_block(groups: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    largest = groups.abs().amax(-1).clamp_min(1e-12)
    energy = (groups * groups).sum(-1)
    best_scale = largest / (qmax + 0.5)
    best_error = torch.full_like(best_scale, float("inf"))
    ints = torch.empty_like(groups)

    def try_scale(scale):
        nonlocal best_scale, best_error
        torch.mul(groups, scale.reciprocal()[..., None], out=ints).round_().clamp_(qmin, qmax)
        dot, norm = (groups * ints).sum(-1), (ints * ints).sum(-1)
        error = energy - 2 * scale * dot + scale * scale * norm
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_scale = torch.where(better, scale, best_scale)
        return dot, norm

    for step in range(31):
        scale = largest / ((qmax + 0.5) * (0.72 + 0.014 * step))
        dot, norm = try_scale(scale)
        try_scale(torch.where(dot > 0, dot / norm.clamp_min(1e-30), scale))
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


class _InputProducts:
    """Running sums of `X^T X` over the inputs `X` of the named modules, from forward pre-hooks.

    Modules fed the same tensor in a row (q / k / v, gate / up) share one product. Inputs of a few rows (one token a
    step while sampling) are gathered to `_MIN_ROWS` rows before they are multiplied: one product per step would
    run the matrix kernels at a fraction of their speed."""

    _MIN_ROWS = 256

    def __init__(self, model, names: List[str]):
        modules = dict(model.named_modules())
        self.names = names
        self.sums: Dict[str, torch.Tensor] = {}
        self.counts: Dict[str, int] = {}
        self.seen = set()  # the names that saw an input since `seen` was last cleared
        self.current = None  # (the latest input, its rows as float, the names fed it)
        self.pending: Dict[tuple, List[torch.Tensor]] = {}  # names fed the same inputs -> rows not yet multiplied
        self.handles = [modules[name].register_forward_pre_hook(self._hook(name)) for name in names]

    def _hook(self, name):
        def record(module, inputs):
            x = inputs[0]
            if self.current is None or self.current[0] is not x:
                self._close()
                rows = x.detach().reshape(-1, x.shape[-1]).float()
                if rows.shape[0] < self._MIN_ROWS and rows.data_ptr() == x.data_ptr():
                    rows = rows.clone()  # kept past this call: the model may write its input in place later
                self.current = (x, rows, [name])
            else:
                self.current[2].append(name)
            self.seen.add(name)

        return record

    def _close(self):
        if self.current is not None:
            _, rows, names = self.current
            self.current = None
            pending = self.pending.setdefault(tuple(names), [])
            pending.append(rows)
            if sum(part.shape[0] for part in pending) >= self._MIN_ROWS:
                self._multiply(tuple(names))

    def _multiply(self, names: tuple):
        rows = torch.cat(self.pending.pop(names))
        product = rows.T @ rows
        for name in names:
            self.sums[name] = product.clone() if name not in self.sums else self.sums[name].add_(product)
            self.counts[name] = self.counts.get(name, 0) + rows.shape[0]

    def hessians(self) -> Dict[str, torch.Tensor]:
        """Removes the hooks and returns `X^T X / rows` of each named module that saw an input."""
        for handle in self.handles:
            handle.remove()
        self._close()
        for names in list(self.pending):
            self._multiply(names)
        return {name: self.sums[name] / self.counts[name] for name in self.names if name in self.sums}


def input_hessians(model, batches: Iterable[torch.Tensor], names: List[str]) -> Dict[str, torch.Tensor]:
    """`X^T X / n` of the inputs of the named modules, over forward passes of `model` on the token batches.

    A forward stops before the output embedding (the LM head) once every named module has seen its input:
    the logits are not needed (SmolLM2's head is a fifth of its weights, and its logits 200 MB a batch)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    products = _InputProducts(model, names)

    def stop(module, inputs):
        if len(products.seen) == len(names):
            raise _InputsRecorded

    # Registered after the head's own record hook (if the head is named), so that one runs first.
    handle = head.register_forward_pre_hook(stop) if isinstance(head, torch.nn.Module) else None
    try:
        with torch.no_grad():
            for ids in batches:
                products.seen.clear()
                try:
                    model(input_ids=ids)
                except _InputsRecorded:
                    pass
    finally:
        if handle is not None:
            handle.remove()
        hessians = products.hessians()
    return hessians


def calibration_length(model, length: Optional[int] = None) -> int:
    """Tokens per calibration sequence (`length`, default CALIBRATION_LENGTH): models with fewer positions
    (learned position tables) take shorter ones."""
    length = length or CALIBRATION_LENGTH
    positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return min(length, positions or length)


def file_sequences(model, tokenizer, path: str, length: Optional[int] = None) -> torch.Tensor:
    """Calibration sequences [<= CALIBRATION_SEQUENCES, length] cut from the UTF-8 text file `path`."""
    length = calibration_length(model, length)
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
    return ids[: count * length].reshape(count, length)


def sample_with_statistics(model, names: List[str], length: Optional[int] = None):
    """Samples calibration text from the model and records the named modules' input statistics on the way.

    Returns the sequences [CALIBRATION_SEQUENCES, length] and `input_hessians` of the sampled tokens but the last
    (the one no step reads): with the KV cache, the sampling steps feed every module the same rows a forward over
    the sequences would, so no second pass is needed. Temperature 1 from a random first token, seeded: no dataset,
    and the model's own distribution of text."""
    length = calibration_length(model, length)
    vocab_size = model.config.get_text_config().vocab_size
    first = torch.randint(0, vocab_size, (CALIBRATION_SEQUENCES, 1), generator=torch.Generator().manual_seed(0))
    products = _InputProducts(model, names)
    try:
        # One batch: on two cores 32 sequences at once beat two batches of 16 by ~20%.
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.default_generator.manual_seed(0)  # the CPU generator only: the one fork_rng restores
            sequences = model.generate(first, attention_mask=torch.ones_like(first), do_sample=True, temperature=1.0,
                                       top_k=0, top_p=1.0, min_new_tokens=length - 1,
                                       max_new_tokens=length - 1, pad_token_id=0)[:, :length]  # fmt: skip
    finally:
        hessians = products.hessians()
    return sequences, hessians


def calibration_hessians(model, tokenizer, path: Optional[str], names: List[str],
                         length: Optional[int] = None) -> Dict[str, torch.Tensor]:  # fmt: skip
    """The named linears' input Hessians on the text file `path`, or on text the model samples itself (`None`),
    in sequences of `length` tokens (default CALIBRATION_LENGTH)."""
    start = time.perf_counter()
    if path is not None:
        sequences = file_sequences(model, tokenizer, path, length)
        hessians = input_hessians(model, sequences.split(_BATCH), names)
    else:
        sequences, hessians = sample_with_statistics(model, names, length)
    logger.info("GPTQ: input statistics of %d linears on %d sequences of %d tokens (%s) in %.1f s.", len(hessians),
                *sequences.shape, path or "sampled", time.perf_counter() - start)  # fmt: skip
    return hessians


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
