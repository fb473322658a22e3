"""`ExecuTorchModelForCausalLM`: transformers generation over an exported decoder LM.

The program holds its KV cache. `forward(input_ids, cache_position)` feeds only the tokens the program
has not seen yet and returns the logits of the last position; `generate` is transformers' own
`GenerationMixin` (greedy, sampling, logits processors, stopping criteria, streamers) on top of it.
"""

import contextlib
import functools
import logging
from typing import Callable, Optional, Tuple

import torch
from transformers import GenerationConfig, GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from .. import contract
from ..utils import tokenizer_adds_bos
from .base import ExecuTorchModel, register_for_pipelines
from .peer_api import PeerCausalLMAPI
from .checks import (
    check_finite,
    check_no_beam_search,
    check_no_padding,
    check_positions,
    check_token_ids,
    clamp_new_tokens,
    one_call_at_a_time,
)
from .runner import (
    GenerationStats,
    RunnerEngine,
    TimingStreamer,
    check_engine,
    runner_tokenizer_path,
)
from .threads import exclusive_cores

logger = logging.getLogger(__name__)


@register_for_pipelines
class ExecuTorchModelForCausalLM(ExecuTorchModel, PeerCausalLMAPI, GenerationMixin):
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

    Two engines: `generate` (token ids in and out, transformers' `GenerationMixin`) always runs the program
    from Python. `generate_text` (text in and out, with timing stats) runs the `engine` chosen at load:
    `"python"` (default) or `"runner"`, ExecuTorch's C++ `TextLLMRunner`, the engine of its mobile apps:
    `ExecuTorchModelForCausalLM.from_pretrained("out/", engine="runner").generate_text("Hello")`.
    """

    task = "text-generation"
    auto_model_class = "AutoModelForCausalLM"
    main_input_name = "input_ids"
    _is_stateful = True
    _supports_cache_class = False

    runtime_options = ("engine",)

    def __init__(self, program, config, model_save_dir, manifest=None, engine: str = "python"):
        super().__init__(program, config, model_save_dir, manifest)
        self.engine = check_engine(engine)
        # ExecuTorch's LLM runner contract: get_max_context_len positions in all, get_max_seq_len tokens a call at most.
        per_call = int(self.read_constant(contract.MAX_SEQ_LEN, self.manifest.max_seq_len))
        self.max_seq_len = int(self.read_constant(contract.MAX_CONTEXT_LEN, per_call))
        # A program exported with a static prompt length (the peer's --disable_dynamic_shapes: one token a call)
        # takes no more than its input's size.
        largest_input = self.program.metadata("forward").input_tensor_meta(0).sizes()[-1]
        self.max_chunk_len = min(per_call, largest_input, self.max_seq_len - 1)
        self.vocab_size = int(self.read_constant(contract.VOCAB_SIZE, config.get_text_config().vocab_size))
        self.reprefill_at = self.read_constant(contract.REPREFILL_AT)  # see contract.REPREFILL_AT
        try:
            self.generation_config = GenerationConfig.from_pretrained(self.model_save_dir)
        except OSError:
            self.generation_config = GenerationConfig.from_model_config(config)
        self._next_position = 0  # number of positions the program's cache holds for the current sequence
        if self.engine == "python":
            self._forward_method  # load (and pack the weights) now, not inside the first timed call  # noqa: B018

    @functools.cached_property
    def _forward_method(self):
        # With engine="runner", loaded only if forward is called: loading packs the weights for XNNPACK, memory
        # the runner (which loads the program itself) does not need.
        return self.load_method("forward")

    @functools.cached_property
    def tokenizer(self):
        """The Hugging Face tokenizer exported with the program."""
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.model_save_dir)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise FileNotFoundError(
                f"'{self.model_save_dir}' holds no usable tokenizer ({err}); text in and out needs one. Copy the "
                "checkpoint's tokenizer files (tokenizer.json, tokenizer_config.json) into it, or export again. "
                "generate() on token ids works without it."
            ) from err

    @functools.cached_property
    def _runner(self) -> RunnerEngine:
        missing = [name for name in contract.RUNNER_REQUIRED_METHODS if name not in self.program.method_names]
        if missing:
            raise ValueError(
                f"'{self.model_save_dir}' lacks {', '.join(missing)}, which ExecuTorch's runner needs. Re-export it with "
                "`optimum-cli export executorch`, or use engine='python'."
            )
        runner_tokenizer_path(self.model_save_dir)  # a clear error before the tokenizer is loaded
        checked = self.manifest.runner_tokenizer or {}
        if checked and not checked.get("file"):
            raise ValueError(
                f"ExecuTorch's runner cannot read the tokenizer of '{self.model_save_dir}' "
                f"({'; '.join(checked.get('errors', []))}). Use engine='python'."
            )
        if checked and not checked.get("matches", True):
            logger.warning(
                "ExecuTorch's runner tokenizes some text differently from the Hugging Face tokenizer (checked at "
                "export, e.g. %r): its answers can differ from engine='python' on such text.",
                (checked.get("first_mismatch") or {}).get("text"),
            )
        return RunnerEngine(
            self.model_save_dir,
            num_bos=int(tokenizer_adds_bos(self.tokenizer)),
            special_texts=set(self.tokenizer.all_special_tokens)
            | {token.content for token in self.tokenizer.added_tokens_decoder.values() if token.special},
            tokenizer_file=checked.get("file"),
            weights_file=self.manifest.weights_file,
        )

    @classmethod
    def config_from_program(cls, program, model_dir):
        """A directory holding only a program (as huggingface/optimum-executorch writes): the config generation
        needs, from the program's LLM metadata."""
        from transformers import PretrainedConfig

        def constant(name):
            return list(program.load_method(name).execute([])) if name in program.method_names else None

        vocab, bos, eos = constant(contract.VOCAB_SIZE), constant(contract.BOS_ID), constant(contract.EOS_IDS)
        if vocab is None:
            return super().config_from_program(program, model_dir)
        logger.info("'%s' holds no config.json: the program's metadata gives the vocabulary and special tokens.", model_dir)
        return PretrainedConfig(vocab_size=int(vocab[0]), bos_token_id=int(bos[0]) if bos else None,
                                eos_token_id=[int(i) for i in eos] if eos else None)  # fmt: skip

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
        check_token_ids(input_ids, self.vocab_size)

    @one_call_at_a_time
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
        check_no_padding(attention_mask)
        seq_len = input_ids.shape[1]
        cache_position = check_positions(cache_position, seq_len, self._next_position, self.max_seq_len, "input")
        end = int(cache_position[-1]) + 1
        input_ids = input_ids.to(torch.long)
        # The program accepts at most max_chunk_len tokens a call: feed a longer prompt in chunks.
        step = self.max_chunk_len
        with exclusive_cores():
            for start in range(0, seq_len, step):
                chunk = slice(start, start + step)
                logits = self._forward_method.execute(
                    [input_ids[:, chunk].contiguous(), cache_position[chunk].contiguous()]
                )[0]
        self._next_position = end
        # This package's programs return the last position's logits; others (the peer's) every position's.
        logits = logits.reshape(-1, logits.shape[-1])[-1:]
        return CausalLMOutputWithPast(logits=check_finite(logits, self.model_save_dir).reshape(1, 1, -1))

    # -------------------------------------------------------------------------------------- generation
    def _check_prompt_fits(self, prompt_len: int) -> None:
        if prompt_len >= self.max_seq_len:
            raise ValueError(
                f"The prompt has {prompt_len} tokens; this program holds at most {self.max_seq_len} "
                "(prompt + new tokens). Shorten the prompt or re-export with a larger --max_seq_len."
            )

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
        if self.reprefill_at is not None and input_ids.shape[1] >= self.reprefill_at > start:
            start = 0  # the whole sequence again, as the eager model does there (contract.REPREFILL_AT)
        return {
            "input_ids": input_ids[:, start:],
            "cache_position": torch.arange(start, input_ids.shape[1], dtype=torch.long),
        }

    @one_call_at_a_time
    def generate(self, inputs: Optional[torch.Tensor] = None, generation_config=None, **kwargs):
        """transformers' `generate`, with the program's limits checked first (see the class docstring)."""
        config = generation_config if generation_config is not None else self.generation_config
        check_no_beam_search(kwargs, config)
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is None:
            raise ValueError("Pass the prompt as input_ids (a [1, seq] tensor of token ids).")
        self._check_input_ids(input_ids)
        check_no_padding(kwargs.get("attention_mask"))
        prompt_len = input_ids.shape[1]
        self._check_prompt_fits(prompt_len)
        clamp_new_tokens(
            kwargs, config, prompt_len, self.max_seq_len,
            f"the program's context is {self.max_seq_len} tokens and the prompt has {prompt_len}",
        )  # fmt: skip
        with exclusive_cores():  # once for the whole loop, see threads.py
            return super().generate(inputs, generation_config=generation_config, **kwargs)

    @one_call_at_a_time
    def generate_text(
        self,
        prompt: str,
        max_new_tokens: int = 128,
        chat: bool = False,
        on_token: Optional[Callable[[str], None]] = None,
        temperature: float = 0.0,
    ) -> Tuple[str, GenerationStats]:
        """Generates text after `prompt` with this model's `engine`, streaming it to `on_token`.

        Args:
            prompt: the prompt text, or the user message when `chat=True`.
            max_new_tokens: the most tokens to generate (fewer at an eos token or when the context is full).
            chat: wrap `prompt` in the tokenizer's chat template as one user turn, ready for the answer.
            on_token: called with each new piece of text as soon as it is generated.
            temperature: 0 for greedy decoding (the default), otherwise sampling at that temperature.

        Returns:
            The new text (without the prompt) and its `GenerationStats` (time to first token, prefill and
            decode tokens/s).
        """
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string.")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}.")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 for greedy decoding), got {temperature!r}.")
        runner = self._runner if self.engine == "runner" else None  # its files are checked first
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(f"The tokenizer in '{self.model_save_dir}' has no chat template: drop chat=True.")
            messages = [{"role": "user", "content": prompt}]
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        streamer = TimingStreamer(self.tokenizer, on_token)
        # A chat template writes its own special tokens.
        input_ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=not chat).input_ids
        self._check_prompt_fits(input_ids.shape[1])
        if self.engine == "runner":
            if self.reprefill_at is not None and input_ids.shape[1] + max_new_tokens >= self.reprefill_at:
                logger.warning("ExecuTorch's runner does not run the sequence again at %d tokens as the eager model "
                               "does (long RoPE): past it, its text can differ from engine='python'.", self.reprefill_at)  # fmt: skip
            return runner.generate_text(prompt, max_new_tokens, on_token, temperature, add_bos=not chat)
        sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        self.generate(input_ids, max_new_tokens=max_new_tokens, streamer=streamer, **sampling)
        return streamer.text(), streamer.stats()
