"""`SpeechSeq2SeqExportableModule`: a speech encoder-decoder (Whisper) as two methods, for `torch.export`.

- `encoder(input_features[1, num_mel_bins, num_frames]) -> encoder_hidden_states[1, encoder_seq_len, d_model]`:
  a fixed window of log-mel features (Whisper: 80 or 128 bins x 3000 frames, 30 s), so every shape is static.
- `decoder(...)`: the same method as the text encoder-decoders' (`wrappers/seq2seq.py`), over the encoder's
  fixed number of positions.
"""

from typing import Any, Dict, Optional, Tuple

import torch

from .seq2seq import EXAMPLE_DECODER_SEQ_LEN, EncoderMethod, Seq2SeqExportableModule


class SpeechSeq2SeqExportableModule(Seq2SeqExportableModule):
    """Wraps a `*ForConditionalGeneration` speech model (eval mode) for `torch.export`.

    Args:
        model: the eager transformers model.
        max_seq_len: the number of positions of the decoder's cache (start tokens + generated tokens).
        custom_sdpa: must be False.
        hidden_size: `d_model`, checked against the model's.
        num_mel_bins, num_frames: the shape of one window of log-mel features.
        encoder_seq_len: the encoder's output positions for one window.
    """

    input_names = ("input_features",)

    def __init__(
        self,
        model,
        max_seq_len: int,
        custom_sdpa: bool = False,
        hidden_size: Optional[int] = None,
        num_mel_bins: int = 80,
        num_frames: int = 3000,
        encoder_seq_len: int = 1500,
    ):
        super().__init__(model, max_seq_len, custom_sdpa=custom_sdpa, hidden_size=hidden_size)
        self.encoder = EncoderMethod(model, "input_features")
        self.num_mel_bins, self.num_frames, self.encoder_seq_len = num_mel_bins, num_frames, encoder_seq_len

    def example_inputs(self) -> Dict[str, Tuple[Any, ...]]:
        dtype, dec_seq = self.model.dtype, EXAMPLE_DECODER_SEQ_LEN
        hidden = torch.zeros((1, self.encoder_seq_len, self.model.config.d_model), dtype=dtype)
        return {
            "encoder": (torch.zeros((1, self.num_mel_bins, self.num_frames), dtype=dtype),),
            "decoder": (torch.zeros((1, dec_seq), dtype=torch.long), hidden, torch.arange(dec_seq)),
        }

    @classmethod
    def input_plan(
        cls,
        max_seq_len: int,
        hidden_size: int = 0,
        dtype: str = "float32",
        num_mel_bins: int = 80,
        num_frames: int = 3000,
        encoder_seq_len: int = 1500,
        **kwargs,
    ) -> Dict[str, Any]:
        plan = super().input_plan(max_seq_len, hidden_size=hidden_size, dtype=dtype)
        plan["encoder"] = [{"name": "input_features", "dtype": dtype, "shape": [1, num_mel_bins, num_frames]}]
        plan["decoder"][1]["shape"] = [1, encoder_seq_len, hidden_size]
        return plan

    def dynamic_shapes(self) -> Dict[str, Any]:
        dec = torch.export.Dim("seq", min=1, max=self.max_seq_len - 1)
        return {"encoder": None, "decoder": ({1: dec}, None, {0: dec})}

    def metadata(self, generation_config=None) -> Dict[str, Any]:
        return dict(
            super().metadata(generation_config),
            get_num_mel_bins=self.num_mel_bins,
            get_num_frames=self.num_frames,
            get_encoder_seq_len=self.encoder_seq_len,
        )
