"""`ExecuTorchModelForCausalLM`: transformers generation over an exported decoder LM.

The program holds its KV cache. `forward(input_ids, cache_position)` feeds only the tokens the program
has not seen yet and returns the logits of the last position; `generate` is transformers' own
`GenerationMixin` (greedy, sampling, logits processors, stopping criteria, streamers) on top of it.
"""

import contextlib
import logging
from typing import Optional

import torch
from transformers import GenerationConfig, GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from .base import ExecuTorchModel, register_for_pipelines
from .threads import exclusive_cores

logger = logging.getLogger(__name__)


@register_for_pipelines
class ExecuTorchModelForCausalLM(ExecuTorchModel, GenerationMixin):
    """A text-generation `.pte` with the transformers API.

    Example:
        ```python
        from transformers import AutoTokenizer
        from optimum.executorch import ExecuTorchModelForCausalLM

        model = ExecuTorchModelForCausalLM.from_pretrained("out/")
        tokenizer = AutoTokenizer.from_pretrained("out/")
        ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        print(tokenizer.decode(model.generate(ids, max_new_tokens=20)[0]))
        ```

    Limits, fixed at export: batch size 1, greedy or sampling (no beam search), and at most
    `max_seq_len` tokens of prompt plus generated text. `generate` stops cleanly, with a warning, when the
    context is full; a prompt that does not fit raises `ValueError`.
    """

    task = "text-generation"
    auto_model_class = "AutoModelForCausalLM"
    main_input_name = "input_ids"
    _is_stateful = True
    _supports_cache_class = False

    def __init__(self, program, config, model_save_dir, executorch_config=None):
        super().__init__(program, config, model_save_dir, executorch_config)
        self._forward_method = program.load_method("forward")
        self.max_seq_len = int(self.read_constant("get_max_seq_len", self.executorch_config.get("max_seq_len")))
        self.vocab_size = int(self.read_constant("get_vocab_size", config.get_text_config().vocab_size))
        try:
            self.generation_config = GenerationConfig.from_pretrained(self.model_save_dir)
        except OSError:
            self.generation_config = GenerationConfig.from_model_config(config)
        self._next_position = 0  # number of positions the program's cache holds for the current sequence

    @classmethod
    def can_generate(cls) -> bool:
        return True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache lives inside the program

    @contextlib.contextmanager
    def _optimize_model_for_decode(self):
        yield  # nothing to switch: the program is fixed at export

    # ----------------------------------------------------------------------------------------- forward
    def _check_input_ids(self, input_ids: torch.Tensor) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("input_ids must be a 2D tensor of shape [batch_size, sequence_length].")
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"This program was exported for batch size 1, got batch size {input_ids.shape[0]}. "
                "Run the prompts one at a time."
            )
        if input_ids.numel() == 0:
            raise ValueError("input_ids is empty: pass at least one token.")
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"Token id {bad} is outside the vocabulary of this program (0..{self.vocab_size - 1}). "
                "Use the tokenizer that was exported with the model."
            )

    def forward(
        self,
        input_ids: torch.LongTensor,
        cache_position: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Runs the program on `input_ids` at positions `cache_position`.

        Args:
            input_ids: `[1, seq]` token ids the program has not seen yet.
            cache_position: `[seq]` positions of those tokens. `None` starts a new sequence at position 0.
            attention_mask: accepted for API compatibility; it must be all ones (no padding).

        Returns:
            `CausalLMOutputWithPast` whose `logits` are `[1, 1, vocab]`: the last position only.
        """
        self._check_input_ids(input_ids)
        if attention_mask is not None and not bool(torch.all(attention_mask != 0)):
            raise ValueError("Padding is not supported: pass an attention_mask of all ones (batch size 1).")
        seq_len = input_ids.shape[1]
        if cache_position is None:
            cache_position = torch.arange(seq_len, dtype=torch.long)
        cache_position = cache_position.to(torch.long).reshape(-1)
        if cache_position.numel() != seq_len:
            raise ValueError(
                f"cache_position has {cache_position.numel()} positions for {seq_len} input tokens: pass one "
                "position per token (or None to start a new sequence)."
            )
        end = int(cache_position[-1]) + 1
        if end > self.max_seq_len:
            raise ValueError(
                f"The sequence reaches {end} tokens, beyond the {self.max_seq_len} this program was exported for. "
                "Shorten the prompt or re-export with a larger --max_seq_len."
            )
        input_ids = input_ids.to(torch.long)
        # The program accepts at most max_seq_len - 1 tokens a call: feed a longer prompt in chunks.
        step = self.max_seq_len - 1
        with exclusive_cores():
            for start in range(0, seq_len, step):
                chunk = slice(start, start + step)
                logits = self._forward_method.execute(
                    [input_ids[:, chunk].contiguous(), cache_position[chunk].contiguous()]
                )[0]
        self._next_position = end
        return CausalLMOutputWithPast(logits=logits.reshape(1, 1, -1))

    # -------------------------------------------------------------------------------------- generation
    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        next_sequence_length: Optional[int] = None,
        is_first_iteration: bool = False,
        inputs_embeds: Optional[torch.Tensor] = None,
        **kwargs,
    ):
        if inputs_embeds is not None:
            raise ValueError("This program takes input_ids, not inputs_embeds.")
        start = 0 if is_first_iteration else self._next_position
        return {
            "input_ids": input_ids[:, start:],
            "cache_position": torch.arange(start, input_ids.shape[1], dtype=torch.long),
        }

    def generate(self, inputs: Optional[torch.Tensor] = None, generation_config=None, **kwargs):
        """transformers' `generate`, with the program's limits checked first (see the class docstring)."""
        config = generation_config if generation_config is not None else self.generation_config
        num_beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
        if num_beams > 1:
            raise ValueError("Beam search is not supported by this program (batch size 1): use num_beams=1.")
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is None:
            raise ValueError("Pass the prompt as input_ids (a [1, seq] tensor of token ids).")
        self._check_input_ids(input_ids)
        prompt_len = input_ids.shape[1]
        if prompt_len >= self.max_seq_len:
            raise ValueError(
                f"The prompt has {prompt_len} tokens; this program holds at most {self.max_seq_len} "
                "(prompt + new tokens). Shorten the prompt or re-export with a larger --max_seq_len."
            )
        if kwargs.get("max_new_tokens") is not None:
            wanted = kwargs["max_new_tokens"]
        elif kwargs.get("max_length") is not None:
            wanted = kwargs["max_length"] - prompt_len
        elif getattr(config, "max_new_tokens", None) is not None:
            wanted = config.max_new_tokens
        else:
            wanted = (getattr(config, "max_length", None) or 20) - prompt_len
        room = self.max_seq_len - prompt_len
        if wanted > room:
            logger.warning(
                "Generating at most %d new tokens: the program's context is %d tokens and the prompt has %d.",
                room,
                self.max_seq_len,
                prompt_len,
            )
            kwargs["max_new_tokens"] = room
            kwargs.pop("max_length", None)
        with exclusive_cores():  # once for the whole loop, see threads.py
            return super().generate(inputs, generation_config=generation_config, **kwargs)
