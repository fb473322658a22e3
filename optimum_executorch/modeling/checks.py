"""Input and output checks shared by the generative runtime classes (causal, seq2seq, speech).

A program holding a KV cache trusts its positions: a negative one reads before the cache (NaN logits), a
huge one writes outside it (a segfault), a gap attends to stale entries. So positions are checked here,
before the program runs, and its logits after it.
"""

import functools
import logging
from typing import Any, Dict, Optional

import torch

logger = logging.getLogger(__name__)


def one_call_at_a_time(method):
    """Runs `method` under the model's lock: a program's KV cache, its position and its planned buffers are
    one sequence's state, so concurrent calls on one model object would interleave two sequences. Calls from
    other threads wait; for parallelism, load one model object per worker."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def check_token_ids(
    ids, vocab_size: int, name: str = "input_ids", max_len: Optional[int] = None, batch_size_1: bool = True
) -> None:
    """Token ids as a program takes them: a 2D integer tensor, inside the vocabulary, within the limits."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        shape = f", got shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else ""
        raise ValueError(
            f"{name} must be a 2D tensor of token ids [batch_size, sequence_length]{shape}. Tokenize the text with "
            "the tokenizer exported with the model."
        )
    if batch_size_1 and ids.shape[0] != 1:
        raise ValueError(
            f"This program was exported for batch size 1, got batch size {ids.shape[0]}. Run the inputs one at a time."
        )
    if ids.numel() == 0:
        raise ValueError(f"{name} is empty: pass at least one token.")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got {ids.dtype}.")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(
            f"{name} has {ids.shape[1]} tokens; this program takes at most {max_len}. Truncate the input "
            f"(tokenizer(..., truncation=True, max_length={max_len})) or re-export with a larger --max_seq_len."
        )
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"Token id {low if low < 0 else high} in {name} is outside the vocabulary of this program "
            f"(0..{vocab_size - 1}). Use the tokenizer that was exported with the model."
        )


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
    if not torch.equal(positions, torch.arange(start, start + seq_len, dtype=torch.long)):
        raise ValueError(f"cache_position must be consecutive ({start}, {start + 1}, ...), got {positions.tolist()}.")
    if start + seq_len > max_seq_len:
        raise ValueError(
            f"The {what} sequence reaches {start + seq_len} tokens, beyond the {max_seq_len} this program was exported "
            "for. Shorten the prompt, generate fewer tokens, or re-export with a larger --max_seq_len."
        )
    if start < 0 or start > next_position:
        raise ValueError(
            f"cache_position starts at {start}, but the program holds {next_position} positions of the current "
            f"sequence: start at {next_position} to continue it, at 0 for a new sequence, or in between to go back."
        )
    return positions


def check_no_beam_search(kwargs: Dict[str, Any], config) -> None:
    if (kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1) > 1:
        raise ValueError("Beam search is not supported by this program (batch size 1): use num_beams=1.")


def clamp_new_tokens(kwargs: Dict[str, Any], config, used: int, capacity: int, what: str) -> None:
    """Caps the tokens `generate` will add so the sequence fits the program: `used` positions are taken (the
    prompt, or the decoder start token), `capacity` exist. Sets `kwargs["max_new_tokens"]` when it caps, with a
    warning: generation then stops cleanly at the limit instead of failing inside the program."""
    if kwargs.get("max_new_tokens") is not None:
        wanted = kwargs["max_new_tokens"]
    elif kwargs.get("max_length") is not None:
        wanted = kwargs["max_length"] - used
    elif getattr(config, "max_new_tokens", None) is not None:
        wanted = config.max_new_tokens
    else:
        wanted = (getattr(config, "max_length", None) or 20) - used
    room = capacity - used
    if wanted > room:
        logger.warning("Generating at most %d new tokens: %s.", room, what)
        kwargs["max_new_tokens"] = room
        kwargs.pop("max_length", None)


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
