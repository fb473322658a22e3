"""The export options of huggingface/optimum-executorch (1.1), mapped onto this package's, so its users' commands
and code run unchanged.

`translate(kwargs)` is called by `ExportOptions.from_kwargs`, the one door of every entry point (CLI,
`main_export`, `from_pretrained(..., export=True)`). Where the peer's option means what ours already does by
default, it is accepted and the log says so in one line; where the peer builds something this package does not
(another device, per-part quantization, object detection), the error says what to pass instead.

Standard library only: the CLI reads `ALIASES` and `add_peer_arguments` on every start.
"""

import logging
from typing import Any, Dict

logger = logging.getLogger(__name__)

# The peer's names of options this package spells differently.
RENAMED = {"model_name_or_path": "model"}

# Options of the peer that change nothing here, with the reason printed when they are given.
NO_OP = {
    "disable_dynamic_shapes": "programs here always take a prompt of any length up to max_seq_len in one call "
    "(ExecuTorch's runners prefill that way), so --disable_dynamic_shapes changes nothing.",
}

# attn_implementation values (the peer's from_pretrained): whether they ask for ExecuTorch's custom SDPA.
_ATTENTION = {"custom_sdpa": True, "sdpa": False, "eager": False}

# Peer option names and what to use here instead: the hints an unknown-option error gives.
ALIASES = {
    "--quantize": "--qlinear 8da4w (linear layers) and --qembedding 8w (embeddings)",
    "--quantization": "--qlinear 8da4w (linear layers) and --qembedding 8w (embeddings)",
    "--use_kv_cache": "nothing: decoders always export with a KV cache",
    "--hf_token": "--token",
    "--max_length": "--max_seq_len",
    "--max_seq_length": "--max_seq_len",
    "--torch_dtype": "--dtype",
}

# The peer's recipes that this package does not build, and why.
OTHER_RECIPES = {
    "coreml": "Core ML programs run on Apple devices only",
    "cuda": "this package exports for CPUs",
    "cuda-windows": "this package exports for CPUs",
    "metal": "Metal programs run on Apple GPUs only",
}


# The peer's CLI options that this package's CLI has no option for: name -> (argparse type, or None for a
# flag; the note its --help shows).
_PEER_CLI = {
    "use_custom_sdpa": (None, "Custom SDPA: on by default here."),
    "use_custom_kv_cache": (None, "In-place KV cache: on by default here."),
    "disable_dynamic_shapes": (None, "Changes nothing: programs here take prompts of any length."),
    "device": (str, "cpu only (the programs are for CPUs)."),
    "qlinear_encoder": (str, "Must equal --qlinear, which quantizes the encoder too."),
    "qlinear_encoder_group_size": (int, "Must equal --qlinear_group_size."),
    "qembedding_encoder": (str, "Must equal --qembedding."),
    "qembedding_encoder_group_size": (int, "Must equal --qembedding_group_size."),
    "qlinear_packing_format": (str, "CUDA only: refused."),
    "qlinear_encoder_packing_format": (str, "CUDA only: refused."),
    "image_size": (int, "Object detection only: refused."),
}
PEER_OPTIONS = frozenset(_PEER_CLI)


def add_peer_arguments(parser) -> None:
    """The peer's CLI options, in their own group of `parser` (argparse); each is `None` when not given."""
    group = parser.add_argument_group(
        "Options of huggingface/optimum-executorch", "Accepted so that its commands run unchanged; see each note."
    )
    for name, (kind, note) in _PEER_CLI.items():
        if kind is None:
            group.add_argument(f"--{name}", action="store_true", default=None, help=note)
        else:
            group.add_argument(f"--{name}", type=kind, default=None, help=note)


def translate(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """`kwargs` with the peer's option names and values replaced by this package's (a new dict)."""
    kwargs = dict(kwargs)
    for peer, ours in RENAMED.items():
        if peer in kwargs:
            if kwargs.get(ours) is not None:
                raise TypeError(f"Both '{peer}' and '{ours}' given: pass one ('{peer}' is the same option).")
            kwargs[ours] = kwargs.pop(peer)
    for name, reason in NO_OP.items():
        if kwargs.pop(name, None):
            logger.info(reason)
    _translate_attention(kwargs)
    _check_device(kwargs.pop("device", None))
    _translate_encoder_quantization(kwargs)
    _refuse_peer_only(kwargs)
    return kwargs


def _translate_attention(kwargs: Dict[str, Any]) -> None:
    """use_custom_sdpa / use_custom_kv_cache / attn_implementation -> custom_sdpa / custom_kv_cache.

    The peer's default is plain SDPA and asks for the custom ops by flag; here they are the default wherever the
    recipe and model support them, so asking for them keeps the default (on where supported), and turning them off
    turns them off."""
    attention = kwargs.pop("attn_implementation", None)
    if attention is not None:
        if attention not in _ATTENTION:
            raise ValueError(
                f"attn_implementation '{attention}' is not supported: use 'custom_sdpa' (ExecuTorch's attention op, "
                "the default here) or 'sdpa' (plain attention over a static cache)."
            )
        kwargs.setdefault("use_custom_sdpa", _ATTENTION[attention])
    for peer, ours in (("use_custom_sdpa", "custom_sdpa"), ("use_custom_kv_cache", "custom_kv_cache")):
        if peer not in kwargs:
            continue
        value = kwargs.pop(peer)
        if kwargs.get(ours) is not None:
            raise TypeError(f"Both '{peer}' and '{ours}' given: pass one.")
        if value:
            logger.info("%s: on by default here (where the recipe and the model support it).", peer)
        elif value is not None:
            kwargs[ours] = False


def _check_device(device) -> None:
    if device is None or str(device) == "cpu":
        return
    raise ValueError(
        f"device '{device}' is not available: this package exports programs for CPUs (recipes xnnpack and "
        "portable) and loads the model on the CPU to do so. Drop --device, or pass --device cpu."
    )


def _translate_encoder_quantization(kwargs: Dict[str, Any]) -> None:
    """--qlinear_encoder* / --qembedding_encoder*: the peer quantizes an encoder apart from its decoder. Here
    --qlinear / --qembedding quantize every layer, encoder included, so the encoder option is accepted when it
    asks for the same as the model-wide one, and refused otherwise."""
    for part in ("qlinear", "qembedding"):
        for suffix in ("", "_group_size"):
            name, ours = f"{part}_encoder{suffix}", f"{part}{suffix}"
            value = kwargs.pop(name, None)
            if value is None or value == kwargs.get(ours):
                continue
            raise ValueError(
                f"--{name} {value}: this package quantizes the encoder and the decoder alike, with --{ours} "
                f"(now {kwargs.get(ours)}). Pass --{ours} {value} to quantize both, or drop --{name}."
            )


def _refuse_peer_only(kwargs: Dict[str, Any]) -> None:
    for name in ("qlinear_packing_format", "qlinear_encoder_packing_format"):
        if kwargs.pop(name, None) is not None:
            raise ValueError(f"--{name} packs 4-bit weights for CUDA kernels; this package exports for CPUs: drop it.")
    if kwargs.pop("image_size", None) is not None:
        raise ValueError(
            "--image_size sets the input size of object-detection programs, a task this package does not export "
            "yet; image classifiers take the size of their checkpoint's image processor: drop it."
        )
    recipe = kwargs.get("recipe")
    if recipe in OTHER_RECIPES:
        from .exporters.recipes import RECIPES

        raise ValueError(
            f"recipe '{recipe}' is not available: {OTHER_RECIPES[recipe]}. Available recipes: {', '.join(sorted(RECIPES))}."
        )
