"""4-bit linear weights that are already on a grid (a dequantized GGUF Q4_0 / Q4_1 file) keep it.

transformers loads a GGUF file by dequantizing it: each block of 32 weights of a Q4_1 tensor becomes
`d * q + m` (q in 0..15, one float scale `d` and minimum `m` per block), Q4_0 `d * (q - 8)`. Rounding those
floats again onto torchao's symmetric grid (scale = largest / 7.5, no minimum) adds a second 4-bit error on top
of the file's: SmolLM2-135M-Instruct (Q4_1) at 8da4w measured perplexity 32.5 against 24.1 for the float model,
and 24.3 when the file's grid is kept (eager, same tokens, LM head at 8 bits).

Kept here as `w = d * (q - 8) + (m + 8 d)` (Q4_1; a Q4_0 group with a positive scale has no second term): the
first term is a symmetric int4 group with scale `d`, the tensor XNNPACK's blockwise 4-bit kernels take; the second
is constant over each group, so its product with an input `x` is `mean of x over each group @ offsets.T * group
size`.
`GroupOffsetLinear` adds that term when some group needs it: a mean over groups of 32 inputs and a float linear
of `in / 32` inputs, both inside XNNPACK's delegate, for `1 / 32` more float weights than the linear has. Q4_1
always needs it; Q4_0 only for groups whose scale GGUF stored negative (ggml divides by the signed value of
largest magnitude, so a positive one gives levels -7..8, one past int4's 7). Linears of one module that read the
same input (q / k / v, gate / up) share its means (`GroupMeans`): 7 -> 4 means a llama layer, a SmolLM2-135M
decode step ~10% faster.

Exact in the eager model; XNNPACK keeps the group scales in bfloat16 (GGUF's are float16), so a weight of the
`.pte` can move by up to ~1/64 of a step: far below the half step that rounding again costs.
"""

import weakref
from typing import Dict, Optional, Tuple

import torch

from .quantized_tensors import write_quantized_values
from .weights import release_pages

# GGUF's 4-bit and 8-bit blocks (Q4_0, Q4_1, Q8_0) hold 32 weights.
GGUF_GROUP_SIZE = 32
# A group is on a grid when every weight is within this fraction of a step of `low + step * q`.
_TOLERANCE = 1 / 64
# A group's constant below this fraction of a step is float noise (Q4_0's -8 d + 8 d).
_ZERO = 1e-3
# Rows checked before the whole weight: float weights that were never quantized fail on the first group.
_PROBE_ROWS = 4


def find_grid(weight: torch.Tensor, group_size: int) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """If every group of `group_size` inputs of `weight` [N, K] holds at most 16 evenly spaced values, returns
    (int8 integers [N, K] in -8..7, scales [N, K / group_size] > 0, offsets [N, K / group_size]) with
    `weight == scales * integers + offsets` per group (to float rounding); otherwise None."""
    rows, cols = weight.shape
    if group_size <= 0 or cols % group_size:
        return None
    if rows > _PROBE_ROWS and _solve(weight[:_PROBE_ROWS], group_size) is None:
        return None
    return _solve(weight, group_size)


def _solve(weight, group_size):
    rows, cols = weight.shape
    groups = weight.detach().float().reshape(rows, cols // group_size, group_size)
    low = groups.amin(-1)
    span = groups.amax(-1) - low
    step = torch.zeros_like(span)
    pending = span > 0
    # The finest grid first: a Q4_1 group spans all 16 levels, a Q4_0 group may span fewer (a group on a coarser
    # grid also fits a finer one, exactly as well).
    for steps in range(15, 0, -1):
        if not bool(pending.any()):
            break
        candidate = span[pending] / steps
        values = groups[pending] - low[pending][:, None]
        levels = torch.round(values / candidate[:, None])
        fits = ((values - levels * candidate[:, None]).abs() <= _TOLERANCE * candidate[:, None]).all(-1)
        index = pending.nonzero(as_tuple=True)
        fitted = tuple(i[fits] for i in index)
        step[fitted] = candidate[fits]
        pending[fitted] = False
    unresolved = pending & (span > 0)
    if bool(unresolved.any()):
        return None
    # Constant groups (span 0) take any positive scale: the smallest step of the layer, or 1.
    positive = step[step > 0]
    filler = positive.min() if positive.numel() else torch.tensor(1.0)
    step = torch.where(step > 0, step, filler)
    levels = torch.clamp(torch.round((groups - low[..., None]) / step[..., None]), 0, 15)
    # Shift the levels onto -8..7 so that the group's constant is as small as it can be: zero for Q4_0 groups with
    # a positive scale (`d * (q - 8)`), `m + 8 d` for Q4_1.
    shift = torch.clamp(torch.round(low / step), min=-8)
    shift = torch.minimum(shift, 7 - levels.amax(-1))
    integers = levels + shift[..., None]
    offsets = low - shift * step
    offsets = torch.where(offsets.abs() <= _ZERO * step, torch.zeros_like(offsets), offsets)
    return integers.reshape(rows, cols).to(torch.int8), step, offsets


def on_8bit_grid(weight: torch.Tensor, group_size: int = GGUF_GROUP_SIZE) -> bool:
    """Whether every group of `weight` [N, K] is `d * q` with integer q in -127..127 (a dequantized GGUF Q8_0)."""
    rows, cols = weight.shape
    if cols % group_size or not (bool(weight.detach().amax() > 0) or bool(weight.detach().amin() < 0)):  # no |w| copy
        return False
    for part in (weight[:_PROBE_ROWS], weight):
        groups = part.detach().float().reshape(part.shape[0], -1, group_size)
        step = (groups.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-30)
        if not bool(((groups - torch.round(groups / step) * step).abs() <= _TOLERANCE * step).all()):
            return False
    return True


class GroupOffsetLinear(torch.nn.Module):
    """`linear(x) + group means of x @ offsets.T`: a quantized linear plus the per-group constant of its weights.

    `offsets` [out, in / group] are the groups' constants times the group size (the mean times the group size is
    the sum). The group mean is a 4-D `mean` over the two innermost dimensions, the form XNNPACK lowers."""

    def __init__(self, linear: torch.nn.Module, offsets: torch.Tensor, group_size: int, means=None):
        super().__init__()
        self.linear = linear
        self.group_size = group_size
        dtype = linear.weight.dtype if linear.weight.dtype.is_floating_point else torch.float32
        self.offsets = torch.nn.Parameter((offsets * group_size).to(dtype), requires_grad=False)
        # Shared with the sibling linears (same parent module) that may read the same input.
        self._means = means if means is not None else GroupMeans(group_size)

    # Model code that reads a projection's attributes (its weight's dtype, its sizes) still finds them.
    @property
    def weight(self):
        return self.linear.weight

    @property
    def bias(self):
        return self.linear.bias

    @property
    def in_features(self):
        return self.linear.in_features

    @property
    def out_features(self):
        return self.linear.out_features

    def forward(self, x):
        return self.linear(x) + torch.nn.functional.linear(self._means(x), self.offsets)


class GroupMeans:
    """The means of an input over its groups of `group_size` ([..., in] -> [..., in / group]), computed once for
    the linears that read the same input (q / k / v, gate / up): a program then averages each input once.

    Remembers only the last input (by identity and, in eager mode, its version counter, which in-place writes
    advance), so the input of another call, or the same tensor written in place, is averaged again. In eager
    mode it holds the input weakly (a finished forward frees its activations). A plain object, not a module:
    the wrappers that share it keep their own state dicts."""

    def __init__(self, group_size: int):
        self.group_size = group_size
        self._last = None

    def __call__(self, x):
        # Under torch.export's strict tracing (dynamo) the version counter is a symbol and weak references are
        # not traced; a trace holds no in-place writes, and its tensors live as long as the trace.
        tracing = torch.compiler.is_compiling()
        if self._last is not None:
            held, version, means = self._last
            if (held() if isinstance(held, weakref.ref) else held) is x and (tracing or version == x._version):
                return means
        groups = x.shape[-1] // self.group_size
        means = x.reshape(-1, groups, self.group_size, 1).mean((2, 3), keepdim=True).reshape(*x.shape[:-1], groups)
        self._last = (x, None, means) if tracing else (weakref.ref(x), x._version, means)
        return means


def find_grids(linears: Dict[str, torch.nn.Module], group_size: int) -> Dict[str, tuple]:
    """The linears (name -> module) whose float weights are on a 4-bit grid of `group_size`: name -> find_grid's."""
    found = {}
    for name, linear in linears.items():
        found[name] = find_grid(linear.weight, group_size)
        release_pages(linear.weight)  # read again when quantized; meanwhile not resident (weights.py)
    return {name: grid for name, grid in found.items() if grid is not None}


def keep_grids(model, grids: Dict[str, tuple], group_size: int) -> int:
    """Writes each grid into its torchao-quantized linear (int4 groups of `group_size`) and, where a group's
    constant is not zero, wraps the linear in `GroupOffsetLinear`. Returns how many were wrapped."""
    modules = dict(model.named_modules())
    shared = {}
    wrapped = 0
    for name, (integers, scales, offsets) in grids.items():
        linear = modules[name]
        write_quantized_values(name, linear.weight, integers, scales)
        if bool((offsets != 0).any()):
            parent, _, child = name.rpartition(".")
            # Siblings only: the same tensor read by linears of different layers (an encoder's output read by
            # every cross-attention) is averaged once per layer, each layer's ops staying together.
            means = shared.setdefault((parent, linear.in_features), GroupMeans(group_size))
            setattr(modules[parent] if parent else model, child, GroupOffsetLinear(linear, offsets, group_size, means))
            wrapped += 1
    return wrapped
