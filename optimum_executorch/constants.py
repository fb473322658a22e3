"""Names shared by the export side and the runtime side (this module imports nothing heavy)."""

PTE_FILE_NAME = "model.pte"
# Weights kept beside the program (ExecuTorch's program-data separation); `WEIGHTS_TAG` names the file.
WEIGHTS_TAG = "model"
WEIGHTS_FILE_NAME = f"{WEIGHTS_TAG}.ptd"
EXECUTORCH_CONFIG_NAME = "executorch_config.json"

# Constant methods written into every text-generation program; ExecuTorch's LLM runner reads them.
LLM_METADATA_METHODS = (
    "get_max_seq_len",
    "get_max_context_len",
    "get_bos_id",
    "get_eos_ids",
    "get_vocab_size",
    "get_n_layers",
    "use_kv_cache",
    "enable_dynamic_shape",
)
