"""`ExecuTorchModelForSeq2SeqLM`: transformers generation over an exported encoder-decoder LM (T5, BART).

The program has two methods (see `exporters/wrappers/seq2seq.py`): `encoder(input_ids)` runs once per input,
and `decoder(decoder_input_ids, encoder_hidden_states, cache_position)` once per generated token, with its
self-attention cache held inside the program. `generate` is transformers' own `GenerationMixin`: it calls
`get_encoder()` once, then `forward` with only the decoder tokens the program has not seen yet.
"""

import contextlib
from typing import Optional

import torch
from transformers import GenerationConfig, GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .. import contract
from .base import ExecuTorchModel, register_for_pipelines
from .checks import (
    check_finite,
    check_no_beam_search,
    check_no_padding,
    check_positions,
    check_token_ids,
    clamp_new_tokens,
    one_call_at_a_time,
)
from .threads import exclusive_cores


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

    def __init__(self, program, config, model_save_dir, manifest=None):
        super().__init__(program, config, model_save_dir, manifest)
        self._encoder_method = self.load_method("encoder")
        self._decoder_method = self.load_method("decoder")
        self.max_seq_len = int(self.read_constant(contract.MAX_SEQ_LEN, self.manifest.max_seq_len))
        self.vocab_size = int(self.read_constant(contract.VOCAB_SIZE, config.vocab_size))
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
        check_token_ids(ids, self.vocab_size, name, max_len=limit)

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
        check_no_beam_search(kwargs, config)
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is not None:
            self._check_ids(input_ids, "input_ids", self.max_seq_len)
        # The decoder start token takes position 0.
        clamp_new_tokens(kwargs, config, 1, self.max_seq_len, f"the decoder holds {self.max_seq_len} positions")
        with exclusive_cores():  # once for the whole loop, see threads.py
            return super().generate(inputs, generation_config=generation_config, **kwargs)
