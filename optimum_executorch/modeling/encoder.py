"""Runtime classes of encoder programs: fill-mask, feature-extraction, text- and token-classification.

They mirror the ONNX Runtime model classes: `forward(input_ids, attention_mask, token_type_ids)` returns
the transformers output class of the task, and `transformers.pipeline(task, model=et_model, tokenizer=...)`
works on them. The program has a dynamic batch and sequence length (see `exporters/wrappers/encoder.py`).
"""

from typing import Optional

import torch
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .. import contract
from .base import ExecuTorchModel, register_for_pipelines
from .checks import check_token_ids, one_call_at_a_time
from .threads import exclusive_cores


class ExecuTorchModelForEncoder(ExecuTorchModel):
    """Base of the encoder runtime classes: runs the program, returns `output_class(**{output_field: ...})`."""

    output_class = BaseModelOutput
    output_field = "last_hidden_state"
    main_input_name = "input_ids"
    input_modalities = ("text",)

    def __init__(self, program, config, model_save_dir, manifest=None):
        super().__init__(program, config, model_save_dir, manifest)
        self._forward_method = self.load_method("forward")
        self.input_names = list(self.manifest.inputs or ["input_ids", "attention_mask"])
        self.max_seq_len = int(self.read_constant(contract.MAX_SEQ_LEN, self.manifest.max_seq_len))
        self.max_batch_size = int(self.read_constant(contract.MAX_BATCH_SIZE, 1))
        self.vocab_size = int(self.read_constant(contract.VOCAB_SIZE, config.vocab_size))

    @classmethod
    def can_generate(cls) -> bool:
        return False

    def _check(self, input_ids, attention_mask, token_type_ids):
        if not isinstance(input_ids, torch.Tensor):
            raise ValueError(
                f"{type(self).__name__} takes input_ids, a 2D tensor of token ids [batch_size, sequence_length]. "
                "Tokenize the text with the tokenizer exported with the model."
            )
        check_token_ids(input_ids, self.vocab_size, max_len=self.max_seq_len, batch_size_1=False)
        for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if tensor is not None and tuple(tensor.shape) != tuple(input_ids.shape):
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}; it must match input_ids {tuple(input_ids.shape)}.")
        pad = getattr(self.config, "pad_token_id", None)
        if attention_mask is None and input_ids.shape[0] > 1 and pad is not None and bool((input_ids[:, -1] == pad).any()):
            raise ValueError(
                f"input_ids look padded (rows end with pad_token_id {pad}) but no attention_mask was passed: pass "
                "the attention_mask the tokenizer returned, so that padding is ignored."
            )
        if token_type_ids is not None and "token_type_ids" not in self.input_names and bool(token_type_ids.any()):
            raise ValueError(
                f"This {self.config.model_type} program has no segment embeddings: token_type_ids must be all zeros."
            )

    @one_call_at_a_time
    def _run(self, inputs):
        args = [inputs[name].to(device="cpu", dtype=torch.long).contiguous() for name in self.input_names]
        return self._forward_method.execute(args)[0]

    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        **kwargs,
    ):
        """Runs the program.

        Args:
            input_ids: `[batch, seq]` token ids, `seq` up to the exported `max_seq_len`.
            attention_mask: `[batch, seq]`, 1 for real tokens and 0 for padding (default: all ones).
            token_type_ids: `[batch, seq]` segment ids, for models that have segment embeddings.

        Returns:
            The transformers output class of the task (`MaskedLMOutput`, `BaseModelOutput`, ...).
        """
        if input_ids is None:
            raise ValueError(f"{type(self).__name__} takes input_ids (text tokens), got {sorted(kwargs) or 'nothing'}.")
        self._check(input_ids, attention_mask, token_type_ids)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask if attention_mask is not None else torch.ones_like(input_ids),
            "token_type_ids": token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids),
        }
        inputs = {name: inputs[name] for name in self.input_names}
        outputs = []
        with exclusive_cores():
            for start in range(0, input_ids.shape[0], self.max_batch_size):
                outputs.append(self._run({k: v[start : start + self.max_batch_size] for k, v in inputs.items()}))
        return self.output_class(**{self.output_field: torch.cat(outputs)})


@register_for_pipelines
class ExecuTorchModelForFeatureExtraction(ExecuTorchModelForEncoder):
    """`feature-extraction`: `forward` returns `BaseModelOutput(last_hidden_state=[batch, seq, hidden])`."""

    auto_model_class = "AutoModel"
    task = "feature-extraction"


@register_for_pipelines
class ExecuTorchModelForMaskedLM(ExecuTorchModelForEncoder):
    """`fill-mask`: `forward` returns `MaskedLMOutput(logits=[batch, seq, vocab])`."""

    auto_model_class = "AutoModelForMaskedLM"
    task = "fill-mask"
    output_class = MaskedLMOutput
    output_field = "logits"


@register_for_pipelines
class ExecuTorchModelForSequenceClassification(ExecuTorchModelForEncoder):
    """`text-classification`: `forward` returns `SequenceClassifierOutput(logits=[batch, num_labels])`."""

    auto_model_class = "AutoModelForSequenceClassification"
    task = "text-classification"
    output_class = SequenceClassifierOutput
    output_field = "logits"


@register_for_pipelines
class ExecuTorchModelForTokenClassification(ExecuTorchModelForEncoder):
    """`token-classification`: `forward` returns `TokenClassifierOutput(logits=[batch, seq, num_labels])`."""

    auto_model_class = "AutoModelForTokenClassification"
    task = "token-classification"
    output_class = TokenClassifierOutput
    output_field = "logits"
