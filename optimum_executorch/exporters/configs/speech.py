"""Speech encoder-decoders (Whisper): automatic-speech-recognition as an `encoder` and a `decoder` method."""

from typing import Any, Dict, Optional

from . import register_export_config
from .seq2seq import TINY_ENCODER_DECODER_SIZES, Seq2SeqExportConfig

# WhisperEncoder's two convolutions have strides 1 and 2: it takes twice as many log-mel frames as positions.
WHISPER_FRAMES_PER_POSITION = 2


@register_export_config("whisper")
class WhisperExportConfig(Seq2SeqExportConfig):
    """Whisper: the encoder takes a fixed window of log-mel frames (`2 * max_source_positions`: 3000 frames,
    30 s, for the released checkpoints); `max_seq_len` bounds the decoder's positions (`max_target_positions`,
    448 for the released checkpoints)."""
    coverage_representatives = ("whisper",)

    tasks = ("automatic-speech-recognition",)
    default_max_seq_len = 448
    # The tiny config keeps 80 mel bins (the feature extractor's default) and a 2 s window (100 positions).
    tiny_config_extra = {
        **TINY_ENCODER_DECODER_SIZES,
        "num_mel_bins": 80,
        "max_source_positions": 100,
        "max_target_positions": 64,
        "suppress_tokens": [],
        "begin_suppress_tokens": [],
    }

    def max_positions(self) -> Optional[int]:
        return getattr(self.hf_config, "max_target_positions", None)

    def wrapper_kwargs(self) -> Dict[str, Any]:
        config = self.hf_config
        return {
            "hidden_size": int(config.d_model),
            "num_mel_bins": int(config.num_mel_bins),
            "num_frames": WHISPER_FRAMES_PER_POSITION * int(config.max_source_positions),
            "encoder_seq_len": int(config.max_source_positions),
        }
