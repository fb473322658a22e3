"""The causal-LM API of huggingface/optimum-executorch (1.1) on `ExecuTorchModelForCausalLM`, so its users'
code runs unchanged: `text_generation(tokenizer, prompt, echo, max_seq_len)`, `stats`, `max_cache_size`,
`bos_token_id`, `eos_token_ids`. Each is a thin view of this package's own generation and metadata."""

import logging
from typing import List, Optional

import torch

from .. import contract

logger = logging.getLogger(__name__)


class PeerCausalLMAPI:
    """Mixed into `ExecuTorchModelForCausalLM`, whose `generate`, `max_seq_len` and `read_constant` it uses."""

    stats = None  # the `GenerationStats` of the last `text_generation` call

    @property
    def max_cache_size(self) -> int:
        """Positions the program's KV cache holds: prompt plus generated tokens (`max_seq_len` here)."""
        return self.max_seq_len

    @property
    def bos_token_id(self) -> Optional[int]:
        value = self.read_constant(contract.BOS_ID)
        return None if value is None else int(value)

    @property
    def eos_token_ids(self) -> List[int]:
        return [int(i) for i in self.read_constant(contract.EOS_IDS, [])]

    def text_generation(self, tokenizer, prompt: str, echo: bool = True, max_seq_len: Optional[int] = None) -> str:
        """Greedy generation from `prompt` until an end-of-sequence token or `max_seq_len` tokens in all (prompt
        included; default and upper bound: the program's context). Returns the decoded text, with the prompt
        when `echo`; the timings are in `self.stats`. `generate_text` is this package's richer form (streaming,
        chat template, sampling)."""
        from .runner import TimingStreamer

        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string.")
        if max_seq_len is None or max_seq_len > self.max_seq_len:
            if max_seq_len is not None:
                logger.warning("max_seq_len=%d is more than the program's context, %d: generating up to %d tokens.",
                               max_seq_len, self.max_seq_len, self.max_seq_len)  # fmt: skip
            max_seq_len = self.max_seq_len
        input_ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long)
        streamer = TimingStreamer(tokenizer, None)
        eos = self.eos_token_ids or None
        output = self.generate(input_ids, max_new_tokens=max(1, max_seq_len - input_ids.shape[1]), do_sample=False,
                               eos_token_id=eos, streamer=streamer)  # fmt: skip
        self.stats = streamer.stats()
        tokens = output[0] if echo else output[0, input_ids.shape[1]:]
        return tokenizer.decode(tokens, skip_special_tokens=True)
