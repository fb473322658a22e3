"""`EncoderExportableModule`: a bidirectional encoder (BERT-like) with one tensor out, for `torch.export`.

The exported `forward(input_ids[batch, seq], attention_mask[batch, seq][, token_type_ids[batch, seq]])`
has a dynamic batch and sequence length and returns the one tensor the task needs: `logits` (fill-mask,
text- and token-classification) or `last_hidden_state` (feature-extraction). The attention mask is an
input, so padded batches give the same outputs as the eager model.
"""

from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from ... import contract

# The dimensions are dynamic from 1; the example inputs must be larger than 1 in each, or torch.export
# specializes that dimension to the example's size.
EXAMPLE_BATCH, EXAMPLE_SEQ_LEN = 2, 8


class EncoderExportableModule(torch.nn.Module):
    """Wraps a transformers encoder model (`*Model`, `*ForMaskedLM`, `*For*Classification`).

    Args:
        model: the eager transformers model (eval mode).
        max_seq_len: the longest sequence the program accepts.
        custom_sdpa: must be False (the CPU custom attention is causal, for decoders).
        input_names: the program's inputs, in order: `input_ids`, `attention_mask`, and `token_type_ids` for
            models with segment embeddings.
        output_name: the field of the model's output to return (`logits`, `last_hidden_state`).
        max_batch_size: the largest batch the program accepts.
    """

    method_names = ("forward",)

    def __init__(
        self,
        model,
        max_seq_len: int,
        custom_sdpa: bool = False,
        input_names: Sequence[str] = ("input_ids", "attention_mask"),
        output_name: str = "logits",
        max_batch_size: int = 64,
    ):
        super().__init__()
        if custom_sdpa:
            raise ValueError("custom_sdpa is for decoder models; encoders attend in both directions.")
        self.model = model
        self.max_seq_len = max_seq_len
        self.input_names = tuple(input_names)
        self.output_name = output_name
        self.max_batch_size = max_batch_size

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        return self.model(**inputs, return_dict=True)[self.output_name]

    def example_inputs(self, batch: int = EXAMPLE_BATCH, seq_len: int = EXAMPLE_SEQ_LEN) -> Dict[str, Tuple[Any, ...]]:
        seq_len = min(seq_len, self.max_seq_len)
        ids = torch.ones((batch, seq_len), dtype=torch.long)
        tensors = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids),
        }
        return {"forward": tuple(tensors[name] for name in self.input_names)}

    @classmethod
    def input_plan(
        cls, max_seq_len: int, input_names: Sequence[str] = ("input_ids", "attention_mask"), max_batch_size: int = 64, **kwargs
    ) -> Dict[str, Any]:
        """The inputs of `forward`, for a dry run: name, dtype, shape (dynamic dimensions as ranges)."""
        shape = [f"batch 1..{max_batch_size}", f"seq_len 1..{max_seq_len}"]
        return {"forward": [{"name": name, "dtype": "int64", "shape": shape} for name in input_names]}

    def dynamic_shapes(self) -> Dict[str, Any]:
        batch = torch.export.Dim("batch", min=1, max=self.max_batch_size)
        seq = torch.export.Dim("seq_len", min=1, max=self.max_seq_len)
        return {"forward": {name: {0: batch, 1: seq} for name in self.input_names}}

    def metadata(self, generation_config=None) -> Dict[str, Any]:
        config = self.model.config
        return {
            contract.MAX_SEQ_LEN: self.max_seq_len,
            contract.MAX_BATCH_SIZE: self.max_batch_size,
            contract.VOCAB_SIZE: int(config.vocab_size),
        }
