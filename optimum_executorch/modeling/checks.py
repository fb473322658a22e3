"""Input and output checks shared by the generative runtime classes (causal, seq2seq, speech).

A program holding a KV cache trusts its positions: a negative one reads before the cache (NaN logits), a
huge one writes outside it (a segfault), a gap attends to stale entries. So positions are checked here,
before the program runs, and its logits after it.
"""

import functools
from typing import Optional

import torch


def one_call_at_a_time(method):
    """Runs `method` under the model's lock: a program's KV cache, its position and its planned buffers are
    one sequence's state, so concurrent calls on one model object would interleave two sequences. Calls from
    other threads wait; for parallelism, load one model object per worker."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def check_no_padding(attention_mask: Optional[torch.Tensor]) -> None:
    if attention_mask is not None and not bool(torch.all(attention_mask != 0)):
        raise ValueError("Padding is not supported: pass an attention_mask of all ones (batch size 1), or none.")


def check_positions(
    cache_position: Optional[torch.Tensor], seq_len: int, next_position: int, max_seq_len: int, what: str = "input"
) -> torch.Tensor:
    """The `[seq_len]` positions to run at: `cache_position`, or 0..seq_len-1 (a new sequence) when None.

    Positions must be integers, consecutive, start at 0 (a new sequence) or anywhere up to `next_position`
    (continue the current sequence, or go back in it), and end inside the program's `max_seq_len`.
    """
    if cache_position is None:
        return torch.arange(seq_len, dtype=torch.long)
    if not isinstance(cache_position, torch.Tensor) or cache_position.is_floating_point() or cache_position.is_complex():
        raise ValueError("cache_position must be a tensor of integer positions (or None to start a new sequence).")
    positions = cache_position.to(torch.long).reshape(-1)
    if positions.numel() != seq_len:
        raise ValueError(
            f"cache_position has {positions.numel()} positions for {seq_len} {what} tokens: pass one position per "
            "token (or None to start a new sequence)."
        )
    start = int(positions[0])
    if start < 0 or start > next_position:
        raise ValueError(
            f"cache_position starts at {start}, but the program holds {next_position} positions of the current "
            f"sequence: start at {next_position} to continue it, at 0 for a new sequence, or in between to go back."
        )
    if not torch.equal(positions, torch.arange(start, start + seq_len, dtype=torch.long)):
        raise ValueError(f"cache_position must be consecutive ({start}, {start + 1}, ...), got {positions.tolist()}.")
    if start + seq_len > max_seq_len:
        raise ValueError(
            f"The {what} sequence reaches {start + seq_len} tokens, beyond the {max_seq_len} this program was exported "
            "for. Shorten the prompt, generate fewer tokens, or re-export with a larger --max_seq_len."
        )
    return positions


def check_finite(logits: torch.Tensor, model_dir) -> torch.Tensor:
    """Refuses NaN logits (a damaged program or weights file, or activations beyond the dtype's range):
    `generate` would otherwise emit token 0 over and over."""
    if logits.is_floating_point() and bool(torch.isnan(logits).any()):
        raise RuntimeError(
            f"The program in '{model_dir}' returned NaN logits. Its files may be damaged (load it with the default "
            "verify_checksums=True, or export again); with --dtype float16, activations may overflow: export in "
            "float32."
        )
    return logits
