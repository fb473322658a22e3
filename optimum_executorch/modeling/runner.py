"""Text generation through ExecuTorch's own C++ `TextLLMRunner`, and the stats both engines report.

The runner is the engine behind ExecuTorch's Android and iOS apps: it takes a prompt string, tokenizes it
with `pytorch_tokenizers` (from the exported `tokenizer.json` / `tokenizer.model`), prefills, decodes and
stops at the program's `get_eos_ids`. Running an export directory through it here is the check that the
same files work on a device. `ExecuTorchModelForCausalLM.generate_text` uses it with `engine="runner"`.
"""

import importlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

from ..contract import (
    KERNEL_LIBRARIES,
    PTE_FILE_NAME,
    RUNNER_TOKENIZER_FILES,
    runner_tokenizer_load_path,
)
from .threads import exclusive_cores

ENGINES = ("python", "runner")


@dataclass
class GenerationStats:
    """Timings of one `generate_text` call, the same fields for both engines.

    `ttft_s` runs from the start of the call (tokenization included) to the first new token;
    `prefill_tokens_per_s` is prompt tokens over the prefill time, `decode_tokens_per_s` the tokens after the
    first one over the time after it.
    """

    engine: str
    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    total_s: float
    load_s: Optional[float] = None

    def to_dict(self):
        return asdict(self)

    def __str__(self) -> str:
        load = f"load {self.load_s:.2f} s, " if self.load_s is not None else ""
        return (
            f"[{self.engine}] {self.prompt_tokens} prompt + {self.new_tokens} new tokens: {load}"
            f"first token {self.ttft_s:.3f} s, prefill {self.prefill_tokens_per_s:.1f} tok/s, "
            f"decode {self.decode_tokens_per_s:.1f} tok/s"
        )


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 and tokens > 0 else 0.0


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine '{engine}': choose 'python' (transformers generate) or 'runner' (C++).")
    return engine


def runner_tokenizer_path(model_dir: Path) -> Path:
    """The tokenizer file of an export directory that the runner reads."""
    for name in RUNNER_TOKENIZER_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise FileNotFoundError(
        f"'{model_dir}' has no {' or '.join(RUNNER_TOKENIZER_FILES)}, which ExecuTorch's runner needs. Re-export "
        "the model with its tokenizer, or use engine='python'."
    )


class RunnerEngine:
    """ExecuTorch's `TextLLMRunner` over the `.pte` and tokenizer of an export directory.

    Args:
        model_dir: the export directory.
        num_bos: BOS tokens the runner puts before the prompt (1 when the Hugging Face tokenizer adds one).
        special_texts: the text of the tokenizer's special tokens. The runner streams them (the eos it stops
            at included); they are dropped here, as the Python engine drops special tokens.
        tokenizer_file: the tokenizer file the export found the runner reads (`runner_tokenizer.file` in
            executorch_config.json); by default the first of `RUNNER_TOKENIZER_FILES` present.
        weights_file: the weights file beside the program (`weights_file` in executorch_config.json), if any.
    """

    def __init__(
        self,
        model_dir: Path,
        num_bos: int = 0,
        special_texts: Sequence[str] = (),
        tokenizer_file: Optional[str] = None,
        weights_file: Optional[str] = None,
    ):
        for name in KERNEL_LIBRARIES:  # the runner has its own operator registry: register every kernel a program may call
            importlib.import_module(name)
        from executorch.extension.llm.runner import TextLLMRunner

        self.num_bos = num_bos
        self.special_texts = set(special_texts)
        tokenizer_file = tokenizer_file or runner_tokenizer_path(model_dir).name
        tokenizer_path = runner_tokenizer_load_path(model_dir, tokenizer_file)
        data_path = str(model_dir / weights_file) if weights_file else None
        self._runner = TextLLMRunner(str(model_dir / PTE_FILE_NAME), str(tokenizer_path), data_path)
        self._loaded = False

    def generate_text(
        self,
        prompt: str,
        max_new_tokens: int,
        on_token: Optional[Callable[[str], None]] = None,
        temperature: float = 0.0,
        add_bos: bool = True,
    ) -> Tuple[str, GenerationStats]:
        """Generates up to `max_new_tokens` after `prompt`; `on_token(piece)` gets each new piece of text.

        `add_bos=False` for a prompt that holds its own special tokens (a chat template's output)."""
        from executorch.extension.llm.runner import GenerationConfig

        if not prompt:
            raise ValueError("The prompt is empty: the runner needs at least one token of text.")
        pieces = []
        stats_box = []

        def token_callback(piece: str) -> None:
            if piece in self.special_texts:
                return
            pieces.append(piece)
            if on_token is not None:
                on_token(piece)

        # warming=True keeps the C++ side from printing tokens and a report to stdout: we stream them ourselves.
        config = GenerationConfig(
            echo=False, max_new_tokens=max_new_tokens, temperature=temperature, num_bos=self.num_bos if add_bos else 0,
            warming=True,
        )
        self._runner.reset()
        try:
            with exclusive_cores():
                self._runner.generate(prompt, config, token_callback, stats_box.append)
        except UnicodeDecodeError as err:
            raise RuntimeError(
                f"ExecuTorch's runner produced a token that ends inside a UTF-8 character ({err.reason}), which its "
                "Python binding cannot pass on, so generation stopped. This is a limit of the binding, not of the "
                "program: use engine='python' for this prompt."
            ) from err
        stats = self._stats(stats_box[-1] if stats_box else None, len(pieces))
        return "".join(pieces), stats

    def _stats(self, raw, pieces: int) -> GenerationStats:
        if raw is None:
            return GenerationStats("runner", 0, pieces, 0.0, 0.0, 0.0, 0.0)
        ms = 1e-3
        prefill_s = (raw.prompt_eval_end_ms - raw.inference_start_ms) * ms
        decode_s = (raw.inference_end_ms - raw.prompt_eval_end_ms) * ms
        load_s = None
        if not self._loaded:  # the runner loads the program on its first call
            load_s = (raw.model_load_end_ms - raw.model_load_start_ms) * ms
            self._loaded = True
        # num_generated_tokens counts the tokens after the one the prefill produced.
        return GenerationStats(
            engine="runner",
            prompt_tokens=int(raw.num_prompt_tokens),
            new_tokens=int(raw.num_generated_tokens) + 1,
            ttft_s=(raw.first_token_ms - raw.inference_start_ms) * ms,
            prefill_tokens_per_s=_rate(int(raw.num_prompt_tokens), prefill_s),
            decode_tokens_per_s=_rate(int(raw.num_generated_tokens), decode_s),
            total_s=(raw.inference_end_ms - raw.inference_start_ms) * ms,
            load_s=load_s,
        )


class TimingStreamer:
    """A transformers streamer that timestamps the prompt and each new token (for the Python engine's stats),
    and hands each new piece of text to `on_token`.

    The new text is the text of prompt + new tokens minus the text of the prompt: decoding the new tokens
    alone would lose the leading space that SentencePiece tokenizers drop at the start of a text.
    """

    def __init__(self, tokenizer, on_token: Optional[Callable[[str], None]] = None):
        self.tokenizer = tokenizer
        self.on_token = on_token
        self.start = time.perf_counter()
        self.prompt_ids = None
        self.token_times = []
        self.tokens = []
        self._prompt_text = ""
        self._emitted = ""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids or [])

    def text(self) -> str:
        """The text of the new tokens so far (special tokens skipped)."""
        full = self.tokenizer.decode((self.prompt_ids or []) + self.tokens, skip_special_tokens=True)
        if full.startswith(self._prompt_text):
            return full[len(self._prompt_text) :]
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def put(self, value) -> None:
        ids = value.reshape(-1).tolist()
        if self.prompt_ids is None:  # generate() puts the prompt first
            self.prompt_ids = ids
            self._prompt_text = self.tokenizer.decode(ids, skip_special_tokens=True)
            return
        self.token_times.append(time.perf_counter())
        self.tokens.extend(ids)
        if self.on_token is not None:
            text = self.text()
            # Emit only complete characters: a byte-level piece may end in the middle of one.
            if len(text) > len(self._emitted) and text.startswith(self._emitted) and not text.endswith("\ufffd"):
                self.on_token(text[len(self._emitted) :])
                self._emitted = text

    def end(self) -> None:
        """Hands on what is left (a last character that took several tokens)."""
        text = self.text()
        if self.on_token is not None and len(text) > len(self._emitted) and text.startswith(self._emitted):
            self.on_token(text[len(self._emitted) :])
            self._emitted = text

    def stats(self) -> GenerationStats:
        end = time.perf_counter()
        first = self.token_times[0] if self.token_times else end
        new = len(self.token_times)
        return GenerationStats(
            engine="python",
            prompt_tokens=self.prompt_tokens,
            new_tokens=new,
            ttft_s=first - self.start,
            prefill_tokens_per_s=_rate(self.prompt_tokens, first - self.start),
            decode_tokens_per_s=_rate(new - 1, (self.token_times[-1] - first) if new else 0.0),
            total_s=end - self.start,
        )

