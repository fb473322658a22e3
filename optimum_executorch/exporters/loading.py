"""Loading the eager model, its config and its tokenizer for export.

Sources: a local checkpoint directory, a Hugging Face Hub id (through huggingface_hub, which honours
`HF_HUB_OFFLINE`), or a GGUF file (dequantized to a normal model on load).
"""

import contextlib
import functools
import logging
import os
from typing import Any, Dict, Optional, Tuple

import torch

logger = logging.getLogger(__name__)


def _hub_kwargs(options) -> Dict[str, Any]:
    kwargs = {"revision": options.revision, "cache_dir": options.cache_dir, "token": options.token}
    return {k: v for k, v in kwargs.items() if v is not None}


def _source(options) -> Tuple[str, Dict[str, Any]]:
    """Where to load from and the Hub / GGUF keyword arguments (a full path in `gguf_file` is accepted)."""
    kwargs = _hub_kwargs(options)
    source, gguf_file = options.model, options.gguf_file
    if gguf_file and os.path.isfile(gguf_file):
        source, gguf_file = os.path.dirname(os.path.abspath(gguf_file)), os.path.basename(gguf_file)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    return source, kwargs


@contextlib.contextmanager
def gguf_parsed_once():
    """Within this block a GGUF file is parsed once, however often transformers reads it.

    Loading a GGUF checkpoint for export reads the file four times (the config for the plan, the config and the
    weights for the model, the tokenizer), each time building gguf's `GGUFReader`, which parses every metadata
    field (SmolLM2-135M's 49,152-token vocabulary: ~2.5 s a parse on two cores), and mapping tensor names builds
    gguf's `TensorNameMap` again for every submodule of the model (397 for SmolLM2, ~10 ms each). Here readers
    are shared by path (and modification time) and name maps by (architecture, blocks); both are only read."""
    try:
        import gguf
    except ImportError:
        yield
        return
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), os.stat(path).st_mtime_ns, mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def load_config(options):
    """Loads the model config, turning "not found" into an error that names the fix."""
    from transformers import AutoConfig

    source, kwargs = _source(options)
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
    source, kwargs = _source(options)
    kwargs.update(load_kwargs)
    dtype = getattr(torch, options.dtype)
    model = auto_class.from_pretrained(source, dtype=dtype, trust_remote_code=options.trust_remote_code, **kwargs)
    if "gguf_file" in kwargs:
        # The weights are dequantized already; the leftover quantizer would stop save_pretrained and
        # mislead the export about the weights' format.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    # Inference only. A checkpoint quantized by torchao loads as tensor-subclass parameters that require grad,
    # which torch.export cannot unwrap (its int8 data cannot require grad).
    model.requires_grad_(False)
    model.eval()
    return model


# The transformers Auto class that loads each kind of preprocessor a task may need.
_PREPROCESSOR_AUTO_CLASSES = {
    "tokenizer": "AutoTokenizer",
    "image_processor": "AutoImageProcessor",
    "feature_extractor": "AutoFeatureExtractor",
}


def load_preprocessor(options, kind: str = "tokenizer") -> Optional[Any]:
    """The checkpoint's preprocessor of `kind` (`tokenizer`, `image_processor`, `feature_extractor`), or `None` (with a warning)."""
    import transformers

    auto_class = getattr(transformers, _PREPROCESSOR_AUTO_CLASSES[kind])
    source, kwargs = _source(options)
    try:
        return auto_class.from_pretrained(source, trust_remote_code=options.trust_remote_code, **kwargs)
    except (OSError, ValueError, TypeError, KeyError) as err:
        logger.warning(
            "No %s saved with the export: could not load one from '%s' (%s). Save one beside the exported model "
            "before running a pipeline on it.", kind.replace("_", " "), options.model, err,
        )
        return None


def load_tokenizer(options) -> Optional[Any]:
    """The tokenizer of the checkpoint, or `None` (with a warning) when it has none."""
    return load_preprocessor(options, "tokenizer")


def sentencepiece_model_file(options) -> Optional[str]:
    """The checkpoint's SentencePiece `tokenizer.model`, or `None`. transformers does not save it with a fast
    tokenizer, but ExecuTorch's runner needs it for SentencePiece models (it cannot read their tokenizer.json)."""
    if options.gguf_file:
        return None
    local = os.path.join(options.model, "tokenizer.model")
    if os.path.isdir(options.model):
        return local if os.path.isfile(local) else None
    try:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(options.model, "tokenizer.model", **_hub_kwargs(options))
    except Exception:  # no such file in the repo, or offline
        return None
