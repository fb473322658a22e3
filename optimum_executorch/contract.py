"""The contract between the export side and the runtime side: standard library only, imported by both.

An export directory is the interface: the file names below, the constant methods inside the program (the
names ExecuTorch's C++ LLM runner reads, mirrored from its `constants.h`), the kernel libraries a program may
need registered, and `executorch_config.json`, read and written only through `ExportManifest`. Neither side
spells these strings itself.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

# ----------------------------------------------------------------------------------------------- files
PTE_FILE_NAME = "model.pte"
# Weights kept beside the program (ExecuTorch's program-data separation); `WEIGHTS_TAG` names the file.
WEIGHTS_TAG = "model"
WEIGHTS_FILE_NAME = f"{WEIGHTS_TAG}.ptd"
EXECUTORCH_CONFIG_NAME = "executorch_config.json"
# Tokenizer files ExecuTorch's runner reads (pytorch_tokenizers), in order of preference.
RUNNER_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")

# ------------------------------------------------------------------------------- program metadata methods
# Read by ExecuTorch's LLM runner (extension/llm/runner/constants.h).
MAX_SEQ_LEN = "get_max_seq_len"  # the most tokens one call takes
MAX_CONTEXT_LEN = "get_max_context_len"  # positions in all: prompt + generated tokens
BOS_ID = "get_bos_id"
EOS_IDS = "get_eos_ids"
VOCAB_SIZE = "get_vocab_size"
N_LAYERS = "get_n_layers"
USE_KV_CACHE = "use_kv_cache"
ENABLE_DYNAMIC_SHAPE = "enable_dynamic_shape"
LLM_METADATA_METHODS = (MAX_SEQ_LEN, MAX_CONTEXT_LEN, BOS_ID, EOS_IDS, VOCAB_SIZE, N_LAYERS, USE_KV_CACHE, ENABLE_DYNAMIC_SHAPE)
# Written for other tasks, read by this package's runtime classes.
MAX_BATCH_SIZE = "get_max_batch_size"
NUM_LABELS = "get_num_labels"
NUM_CHANNELS = "get_num_channels"
IMAGE_HEIGHT = "get_image_height"
IMAGE_WIDTH = "get_image_width"
NUM_MEL_BINS = "get_num_mel_bins"
NUM_FRAMES = "get_num_frames"
DECODER_START_TOKEN_ID = "get_decoder_start_token_id"
D_MODEL = "get_d_model"
SLIDING_WINDOW = "get_sliding_window"
# The sequence length at which generation runs the whole sequence again from position 0, as the eager model does
# (Phi-3's long RoPE factors: every position's encoding changes once the sequence passes the pretraining length).
REPREFILL_AT = "get_reprefill_at"
# Methods a program must have for ExecuTorch's runner: the decoder and the context length it sizes its loop by.
RUNNER_REQUIRED_METHODS = ("forward", MAX_SEQ_LEN)

# ------------------------------------------------------------------------------------ kernel libraries
# Python modules whose import registers kernels a program may call outside its delegates.
CUSTOM_OPS_KERNEL_LIBRARY = "executorch.extension.llm.custom_ops.custom_ops"  # llama::custom_sdpa, update_cache
QUANTIZED_KERNEL_LIBRARY = "executorch.kernels.quantized"  # quantized_decomposed::embedding_*
KERNEL_LIBRARIES = (CUSTOM_OPS_KERNEL_LIBRARY, QUANTIZED_KERNEL_LIBRARY)


def runner_tokenizer_load_path(model_dir: Path, file_name: str) -> Path:
    """The path to hand the runner's tokenizer library for `file_name`: the directory for tokenizer.json (the
    library then reads bos/eos from tokenizer_config.json), the file itself otherwise."""
    return model_dir if file_name == RUNNER_TOKENIZER_FILES[0] else model_dir / file_name


# ---------------------------------------------------------------------------------- the export manifest
@dataclasses.dataclass
class ExportManifest:
    """`executorch_config.json`: what was exported, as the runtime needs to know it.

    Written once by the export's write stage, read by the runtime classes and `inspect`. Keys a newer or older
    version wrote that this one does not know are kept in `extra` and written back unchanged.
    """

    task: Optional[str] = None
    model_type: Optional[str] = None
    recipe: Optional[str] = None
    dtype: str = "float32"
    max_seq_len: Optional[int] = None
    methods: List[str] = dataclasses.field(default_factory=list)
    # The forward method's input names, in order (encoders: input_ids, attention_mask[, token_type_ids]).
    inputs: List[str] = dataclasses.field(default_factory=list)
    # Each method's inputs: dtype and shape, dynamic dimensions as "name lo..hi", static ones as numbers.
    method_inputs: Dict[str, Any] = dataclasses.field(default_factory=dict)
    custom_sdpa: bool = False
    custom_kv_cache: bool = False
    export_config: Optional[str] = None
    cache_layout: Optional[str] = None
    # Weights beside the program; loaders pass this file with model.pte (TextLLMRunner: data_path).
    weights_file: Optional[str] = None
    # Python modules that register kernels the program needs; the runtime imports them before loading.
    kernel_libraries: List[str] = dataclasses.field(default_factory=list)
    quantization: Optional[Dict[str, Any]] = None
    metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    versions: Dict[str, str] = dataclasses.field(default_factory=dict)
    runner_tokenizer: Optional[Dict[str, Any]] = None
    # SHA-256 of each program file, checked before loading: a damaged file otherwise loads and answers NaN.
    checksums: Optional[Dict[str, str]] = None
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def field_names(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    def to_dict(self) -> Dict[str, Any]:
        data = {name: getattr(self, name) for name in self.field_names()}
        return {**self.extra, **data}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ExportManifest":
        known = cls.field_names()
        values = {k: v for k, v in data.items() if k in known and v is not None}
        return cls(**values, extra={k: v for k, v in data.items() if k not in known})

    def to_json(self, directory: Union[str, Path]) -> Path:
        path = Path(directory) / EXECUTORCH_CONFIG_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        return path

    @classmethod
    def from_json(cls, directory: Union[str, Path]) -> "ExportManifest":
        """The manifest of an export directory; an empty one where the directory has none (a bare program)."""
        path = Path(directory) / EXECUTORCH_CONFIG_NAME
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"'{path}' is not valid JSON ({err}): copy it from the export again, or export again.") from err
        if not isinstance(data, dict):
            raise ValueError(f"'{path}' must hold a JSON object: copy it from the export again, or export again.")
        return cls.from_dict(data)
