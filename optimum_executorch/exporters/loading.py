"""Loading the eager model, its config and its tokenizer for export.

Sources: a local checkpoint directory, a Hugging Face Hub id (through huggingface_hub, which honours
`HF_HUB_OFFLINE`), or a GGUF file (dequantized to a normal model on load).
"""

import logging
import os
from typing import Any, Dict, Optional

import torch

logger = logging.getLogger(__name__)


def _hub_kwargs(options) -> Dict[str, Any]:
    kwargs = {"revision": options.revision, "cache_dir": options.cache_dir, "token": options.token}
    return {k: v for k, v in kwargs.items() if v is not None}


def _gguf_location(options):
    """(directory or repo id, file name) of the GGUF file, accepting a full path in `gguf_file`."""
    if options.gguf_file and os.path.isfile(options.gguf_file):
        return os.path.dirname(os.path.abspath(options.gguf_file)), os.path.basename(options.gguf_file)
    return options.model, options.gguf_file


def load_config(options):
    """Loads the model config, turning "not found" into an error that names the fix."""
    from transformers import AutoConfig

    source, gguf_file = _gguf_location(options)
    kwargs = _hub_kwargs(options)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code, **kwargs)
    except (OSError, ValueError) as err:
        if "trust_remote_code" in str(err):
            raise ValueError(
                f"'{options.model}' ships its own modeling code. Review it, then pass --trust_remote_code to run it."
            ) from err
        raise OSError(
            f"Could not load a model config from '{options.model}': {err}. Pass a local directory that holds "
            "config.json (or --gguf_file), or a Hub model id; set HF_HUB_OFFLINE=0 to allow downloads."
        ) from err


def load_model(options, auto_class, load_kwargs: Dict[str, Any]):
    """Loads the eager model in eval mode with the requested dtype."""
    source, gguf_file = _gguf_location(options)
    kwargs = dict(_hub_kwargs(options), **load_kwargs)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    dtype = getattr(torch, options.dtype)
    model = auto_class.from_pretrained(source, dtype=dtype, trust_remote_code=options.trust_remote_code, **kwargs)
    if gguf_file:
        # The weights are dequantized already; the leftover quantizer would stop save_pretrained and
        # mislead the export about the weights' format.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    model.eval()
    return model


def load_tokenizer(options) -> Optional[Any]:
    """The tokenizer of the checkpoint, or `None` (with a warning) when it has none."""
    from transformers import AutoTokenizer

    source, gguf_file = _gguf_location(options)
    kwargs = _hub_kwargs(options)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=options.trust_remote_code, **kwargs)
    except (OSError, ValueError, TypeError) as err:
        logger.warning("No tokenizer saved with the export: could not load one from '%s' (%s).", options.model, err)
        return None
