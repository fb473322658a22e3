"""`ExecuTorchModelForSeq2SeqLM`: transformers generation over an exported encoder-decoder LM (T5, BART).

The program has two methods (see `exporters/wrappers/seq2seq.py`): `encoder(input_ids)` runs once per input,
and `decoder(decoder_input_ids, encoder_hidden_states, cache_position)` once per generated token, with its
self-attention cache held inside the program. `generate` is transformers' own `GenerationMixin`: it calls
`get_encoder()` once, then `forward` with only the decoder tokens the program has not seen yet.
"""

import contextlib
import logging
from typing import Optional

import torch
from transformers import GenerationConfig, GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .base import ExecuTorchModel, register_for_pipelines
from .checks import check_finite, check_no_padding, check_positions, one_call_at_a_time
from .threads import exclusive_cores

logger = logging.getLogger(__name__)


class _ProgramEncoder:
    """What `get_encoder()` returns: the program's `encoder` method with the transformers encoder call signature."""

    def __init__(self, model: "ExecuTorchModelForSeq2SeqLM"):
        self._model = model

    def forward(self, *args, attention_mask=None, **kwargs) -> BaseModelOutput:
        inputs = args[0] if args else kwargs.get(self._model.main_input_name)
        return self._model.encode(inputs, attention_mask)

    __call__ = forward


@register_for_pipelines
class ExecuTorchModelForSeq2SeqLM(ExecuTorchModel, GenerationMixin):
    """A text2text-generation `.pte` (encoder + decoder methods) with the transformers API.

    Example:
        ```python
        from transformers import AutoTokenizer
        from optimum.executorch import ExecuTorchModelForSeq2SeqLM

        model = ExecuTorchModelForSeq2SeqLM.from_pretrained("out/")
        tokenizer = AutoTokenizer.from_pretrained("out/")
        ids = tokenizer("translate English to German: Hello", return_tensors="pt").input_ids
        print(tokenizer.decode(model.generate(ids, max_new_tokens=20)[0], skip_special_tokens=True))
        ```

    Limits, fixed at export: batch size 1, greedy or sampling (no beam search), inputs of at most
    `max_seq_len` tokens, and at most `max_seq_len - 1` generated tokens.
    """

    task = "text2text-generation"
    auto_model_class = "AutoModelForSeq2SeqLM"
    main_input_name = "input_ids"
    _is_stateful = True
    _supports_cache_class = False

    def __init__(self, program, config, model_save_dir, executorch_config=None):
        super().__init__(program, config, model_save_dir, executorch_config)
        self._encoder_method = self.load_method("encoder")
        self._decoder_method = self.load_method("decoder")
        self.max_seq_len = int(self.read_constant("get_max_seq_len", self.executorch_config.get("max_seq_len")))
        self.vocab_size = int(self.read_constant("get_vocab_size", config.vocab_size))
        try:
            self.generation_config = GenerationConfig.from_pretrained(self.model_save_dir)
        except OSError:
            self.generation_config = GenerationConfig.from_model_config(config)
        self._next_position = 0  # decoder positions the program's cache holds for the current sequence

    @classmethod
    def can_generate(cls) -> bool:
        return True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the decoder's cache lives inside the program

    @contextlib.contextmanager
    def _optimize_model_for_decode(self):
        yield  # nothing to switch: the program is fixed at export

    def get_encoder(self, modality: Optional[str] = None) -> _ProgramEncoder:
        return _ProgramEncoder(self)

    # ------------------------------------------------------------------------------------------ checks
    def _check_ids(self, ids, name: str, limit: int) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError(f"{name} must be a 2D tensor of token ids [batch_size, sequence_length].")
        if ids.shape[0] != 1:
            raise ValueError(
                f"This program was exported for batch size 1, got batch size {ids.shape[0]}. Run the inputs one at a time."
            )
        if ids.numel() == 0:
            raise ValueError(f"{name} is empty: pass at least one token.")
        if ids.is_floating_point():
            raise ValueError(f"{name} must hold integer token ids, got {ids.dtype}.")
        if ids.shape[1] > limit:
            raise ValueError(
                f"{name} has {ids.shape[1]} tokens; this program takes at most {limit}. Truncate the input "
                f"(tokenizer(..., truncation=True, max_length={limit})) or re-export with a larger --max_seq_len."
            )
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= self.vocab_size:
            raise ValueError(
                f"Token id {low if low < 0 else high} in {name} is outside the vocabulary of this program "
                f"(0..{self.vocab_size - 1}). Use the tokenizer that was exported with the model."
            )

    # ----------------------------------------------------------------------------------------- methods
    @one_call_at_a_time
    def encode(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> BaseModelOutput:
        """Runs the `encoder` method: `BaseModelOutput(last_hidden_state=[1, seq, d_model])`."""
        if input_ids is None:
            raise ValueError(f"{type(self).__name__} takes input_ids (text tokens) for its encoder.")
        self._check_ids(input_ids, "input_ids", self.max_seq_len)
        check_no_padding(attention_mask)
        with exclusive_cores():
            hidden = self._encoder_method.execute([input_ids.to(torch.long).contiguous()])[0]
        return BaseModelOutput(last_hidden_state=hidden)

    @one_call_at_a_time
    def forward(
        self,
        input_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        decoder_input_ids: Optional[torch.Tensor] = None,
        encoder_outputs=None,
        cache_position: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """Runs the decoder on `decoder_input_ids` at positions `cache_position` (the encoder too, when
        `encoder_outputs` is not given).

        Returns:
            `Seq2SeqLMOutput` whose `logits` are `[1, 1, vocab]`: the last position only.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encode(input_ids if input_ids is not None else kwargs.get(self.main_input_name), attention_mask)
        hidden = encoder_outputs[0] if isinstance(encoder_outputs, (tuple, list)) else encoder_outputs.last_hidden_state
        if decoder_input_ids is None:
            start = self.generation_config.decoder_start_token_id
            decoder_input_ids = torch.tensor([[start if start is not None else self.config.decoder_start_token_id]])
        self._check_ids(decoder_input_ids, "decoder_input_ids", self.max_seq_len)
        seq_len = decoder_input_ids.shape[1]
        cache_position = check_positions(cache_position, seq_len, self._next_position, self.max_seq_len, "decoder")
        end = int(cache_position[-1]) + 1
        with exclusive_cores():
            logits = self._decoder_method.execute(
                [decoder_input_ids.to(torch.long).contiguous(), hidden.to(self.dtype).contiguous(), cache_position.contiguous()]
            )[0]
        self._next_position = end
        return Seq2SeqLMOutput(logits=check_finite(logits, self.model_save_dir).reshape(1, 1, -1), encoder_last_hidden_state=hidden)

    # -------------------------------------------------------------------------------------- generation
    def prepare_inputs_for_generation(self, input_ids, encoder_outputs=None, is_first_iteration=False, **kwargs):
        start = 0 if is_first_iteration else self._next_position
        return {
            "decoder_input_ids": input_ids[:, start:],
            "encoder_outputs": encoder_outputs,
            "cache_position": torch.arange(start, input_ids.shape[1], dtype=torch.long),
        }

    @one_call_at_a_time
    def generate(self, inputs: Optional[torch.Tensor] = None, generation_config=None, **kwargs):
        """transformers' `generate`, with the program's limits checked first (see the class docstring)."""
        config = generation_config if generation_config is not None else self.generation_config
        if (kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1) > 1:
            raise ValueError("Beam search is not supported by this program (batch size 1): use num_beams=1.")
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is not None:
            self._check_ids(input_ids, "input_ids", self.max_seq_len)
        if kwargs.get("max_new_tokens") is not None:
            wanted = kwargs["max_new_tokens"]
        elif kwargs.get("max_length") is not None:
            wanted = kwargs["max_length"] - 1
        else:
            wanted = getattr(config, "max_new_tokens", None) or (getattr(config, "max_length", None) or 20) - 1
        room = self.max_seq_len - 1  # the decoder start token takes position 0
        if wanted > room:
            logger.warning("Generating at most %d new tokens: the decoder holds %d positions.", room, self.max_seq_len)
            kwargs["max_new_tokens"] = room
            kwargs.pop("max_length", None)
        with exclusive_cores():  # once for the whole loop, see threads.py
            return super().generate(inputs, generation_config=generation_config, **kwargs)
