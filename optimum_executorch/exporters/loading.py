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

from .weights import float32_buffers, load_dtype, restore_computed_buffers, safetensors_dtypes

logger = logging.getLogger(__name__)


def _hub_kwargs(options) -> Dict[str, Any]:
    kwargs = {"revision": options.revision, "cache_dir": options.cache_dir, "token": options.token,
              "subfolder": options.subfolder, "local_files_only": options.local_files_only,
              "force_download": options.force_download}  # fmt: skip
    return {k: v for k, v in kwargs.items() if v}


def _source(options) -> Tuple[str, Dict[str, Any]]:
    """Where to load from and the Hub / GGUF keyword arguments (a full path in `gguf_file` is accepted)."""
    kwargs = _hub_kwargs(options)
    source, gguf_file = options.model, options.gguf_file
    if gguf_file and os.path.isfile(gguf_file):
        source, gguf_file = os.path.dirname(os.path.abspath(gguf_file)), os.path.basename(gguf_file)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    return source, kwargs


class DamagedCheckpointError(ValueError):
    """A checkpoint file that cannot be read as what it claims to be (truncated, damaged)."""


def _checked_gguf(reader_class, path, mode="r"):
    """gguf's reader of `path`, with a damaged or truncated file named as such (gguf itself fails with a struct
    or reshape error, or reads tensors past the end of the file)."""
    size = os.path.getsize(path)
    try:
        reader = reader_class(path, mode)
    except Exception as err:
        raise DamagedCheckpointError(
            f"'{path}' is not a readable GGUF file ({size:,} bytes; {type(err).__name__}: {err}): it is truncated or "
            "damaged. Download it again."
        ) from err
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise DamagedCheckpointError(f"'{path}' is truncated: its tensors end at byte {end:,}, the file has {size:,}. Download it again.")
    return reader


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
            readers[key] = _checked_gguf(reader_class, path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def _check_local_source(options) -> None:
    """A `--model` that names a local path must be a checkpoint directory: say so before transformers reads it
    as a Hub id ("Repo id must be in the form ...") or unpickles a file."""
    model = os.path.expanduser(str(options.model))
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or os.path.exists(model)
    if not looks_local or options.gguf_file and os.path.isfile(options.gguf_file):
        return
    if not os.path.exists(model):
        raise FileNotFoundError(f"No such directory: '{options.model}'. Pass a checkpoint directory or a Hub model id.")
    if os.path.isfile(model):
        hint = f" For a GGUF file pass --model {os.path.dirname(model) or '.'} --gguf_file {os.path.basename(model)}." if model.endswith(".gguf") else ""
        raise NotADirectoryError(
            f"'{options.model}' is a file; --model takes the checkpoint directory (the one holding config.json).{hint}"
        )
    if not options.gguf_file and not os.path.isfile(os.path.join(model, "config.json")):
        raise FileNotFoundError(
            f"'{options.model}' holds no config.json, so it is not a transformers checkpoint directory"
            f"{' (it is empty)' if not os.listdir(model) else ''}. Pass the directory that holds config.json and "
            "the weights, or --gguf_file for a GGUF checkpoint."
        )


def load_config(options):
    """Loads the model config, turning "not found" into an error that names the fix."""
    from transformers import AutoConfig

    _check_local_source(options)
    source, kwargs = _source(options)
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code, **kwargs)
    except DamagedCheckpointError:
        raise
    except Exception as err:
        gguf_path = os.path.join(source, kwargs["gguf_file"]) if "gguf_file" in kwargs else None
        if gguf_path and os.path.isfile(gguf_path) and not isinstance(err, (ImportError, MemoryError)):
            import gguf

            _checked_gguf(gguf.GGUFReader, gguf_path)  # names a truncated or damaged file; else the error stands
        if not isinstance(err, (OSError, ValueError)):
            raise
        if "trust_remote_code" in str(err):
            raise ValueError(
                f"'{options.model}' ships its own modeling code. Review it, then pass --trust_remote_code to run it."
            ) from err
        raise OSError(
            f"Could not load a model config from '{options.model}': {err}. Pass a local directory that holds "
            "config.json (or --gguf_file), or a Hub model id; set HF_HUB_OFFLINE=0 to allow downloads."
        ) from err


def _is_unreadable_weights(err: Exception) -> bool:
    """Whether loading failed in the weights file's reader (a truncated or damaged file), not elsewhere."""
    import pickle
    import struct

    try:
        from safetensors import SafetensorError
    except ImportError:
        SafetensorError = ()
    if isinstance(err, (SafetensorError, pickle.UnpicklingError, EOFError, struct.error)):
        return True
    return isinstance(err, RuntimeError) and any(s in str(err) for s in ("PytorchStreamReader", "zip archive"))


def _stored_dtypes(options) -> Optional[set]:
    """The dtypes of the checkpoint's tensors from its safetensors headers (a local directory's files, or the Hub's
    metadata of a repo), or `None` when unknown: GGUF, `.bin` weights, offline, a Hub subfolder."""
    source, kwargs = _source(options)
    if "gguf_file" in kwargs:
        return None
    directory = os.path.join(source, options.subfolder) if options.subfolder else source
    if os.path.isdir(directory):
        names = os.listdir(directory)
        files = [os.path.join(directory, n) for n in names if n.endswith(".safetensors")]
        if not files or any(n.endswith(".bin") for n in names):
            return None
        return set().union(*(safetensors_dtypes(f) for f in files))
    if options.subfolder or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or options.local_files_only:
        return None
    try:
        from huggingface_hub import get_safetensors_metadata

        return set(get_safetensors_metadata(source, revision=options.revision, token=options.token).parameter_count)
    except Exception:  # not a safetensors repo, no network: load as asked
        return None


def load_model(options, auto_class, load_kwargs: Dict[str, Any]):
    """Loads the eager model in eval mode with the requested dtype.

    An fp32 export of a checkpoint stored in bf16 or fp16 loads it as stored: the weights stay views of the mapped
    file until `weights.widen` casts them, layer by layer (see `weights.py`)."""
    source, kwargs = _source(options)
    kwargs.update(load_kwargs)
    dtype = getattr(torch, options.dtype)
    load_as = load_dtype(_stored_dtypes(options), dtype)
    try:
        model, info = auto_class.from_pretrained(
            source, dtype=load_as, trust_remote_code=options.trust_remote_code, output_loading_info=True, **kwargs
        )
    except Exception as err:
        if isinstance(err, RuntimeError) and "ignore_mismatched_sizes" in str(err):
            raise ValueError(
                f"The weights of '{options.model}' do not have the shapes its config.json gives (vocab_size, hidden_size, "
                "...; transformers printed the mismatched tensors above): the config was edited or belongs to another "
                "checkpoint. Make config.json match the weights."
            ) from err
        if not _is_unreadable_weights(err):
            raise
        raise OSError(
            f"Could not load the weights of '{options.model}' ({type(err).__name__}: {err}). The checkpoint files may be "
            "damaged or incomplete: download or save them again."
        ) from err
    if "gguf_file" in kwargs:
        # The weights are dequantized already; the leftover quantizer would stop save_pretrained and
        # mislead the export about the weights' format.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        logger.warning(
            "%d weights of %s are not in '%s' and were initialized at random (%s): the program's outputs that depend "
            "on them mean nothing until the model is fine-tuned. Export a checkpoint trained for this task.",
            len(missing), type(model).__name__, options.model, ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else ""),
        )
    if load_as != dtype:
        restore_computed_buffers(model, float32_buffers(auto_class, model.config, options.trust_remote_code))
        model.config.dtype = dtype  # what the export computes in, as a load in `dtype` records it
        logger.info("Loaded in %s, as stored; widened to %s layer by layer.", str(load_as)[6:], options.dtype)
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
        if "trust_remote_code" in str(err):
            raise ValueError(
                f"The {kind.replace('_', ' ')} of '{options.model}' ships its own code. Review it, then pass "
                "--trust_remote_code to run it."
            ) from err
        present = _tokenizer_files(source) if kind == "tokenizer" and not options.gguf_file else []
        if present and not _missing_dependency(err):
            raise ValueError(
                f"Could not load the tokenizer of '{options.model}' from {', '.join(present)} ({err}). An export "
                "without it could not run a pipeline or ExecuTorch's runner: repair or replace those files (or "
                "remove them to export without a tokenizer)."
            ) from err
        logger.warning(
            "No %s saved with the export: could not load one from '%s' (%s). Save one beside the exported model "
            "before running a pipeline on it.", kind.replace("_", " "), options.model, err,
        )
        return None


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def _tokenizer_files(source: str):
    """The tokenizer files a local checkpoint directory holds."""
    return [name for name in _TOKENIZER_FILES if os.path.isfile(os.path.join(source, name))]


def _missing_dependency(err: Exception) -> bool:
    # transformers says a tokenizer needs a package that is not installed (sentencepiece, protobuf, tiktoken).
    text = str(err).lower()
    return "pip install" in text or "requires the" in text or "library but it was not found" in text


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
