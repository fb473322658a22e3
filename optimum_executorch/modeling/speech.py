"""`ExecuTorchModelForSpeechSeq2Seq`: Whisper's generation over an exported speech encoder-decoder.

The program has two methods (see `exporters/wrappers/speech.py`): `encoder(input_features)` over one fixed
window of log-mel features, and the same `decoder` as the text encoder-decoders (`seq2seq.py`). `generate` is
transformers' own Whisper generation (`WhisperGenerationMixin`): language detection, the forced
`<|startoftranscript|><|lang|><|task|><|notimestamps|>` prefix, timestamps, long-form audio window by window,
temperature fallback; each window's encoder runs once, then the decoder once per token.
"""

import copy
from types import SimpleNamespace
from typing import Optional

import torch
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

from .. import contract
from .base import register_for_pipelines
from .checks import check_no_beam_search, one_call_at_a_time
from .seq2seq import ExecuTorchModelForSeq2SeqLM
from .threads import exclusive_cores


# What WhisperGenerationMixin reads of the eager model's modules: the strides of the encoder's two
# convolutions (it takes 2 log-mel frames per position).
_WHISPER_ENCODER_STRIDES = SimpleNamespace(
    encoder=SimpleNamespace(conv1=SimpleNamespace(stride=(1,)), conv2=SimpleNamespace(stride=(2,)))
)


@register_for_pipelines
class ExecuTorchModelForSpeechSeq2Seq(ExecuTorchModelForSeq2SeqLM, WhisperGenerationMixin):
    """An automatic-speech-recognition `.pte` (Whisper: encoder + decoder methods) with the transformers API.

    Example:
        ```python
        from transformers import AutoFeatureExtractor, AutoTokenizer, pipeline
        from optimum.executorch import ExecuTorchModelForSpeechSeq2Seq

        model = ExecuTorchModelForSpeechSeq2Seq.from_pretrained("out/")
        asr = pipeline("automatic-speech-recognition", model=model, tokenizer=AutoTokenizer.from_pretrained("out/"),
                       feature_extractor=AutoFeatureExtractor.from_pretrained("out/"))
        print(asr(audio_16khz_float_array)["text"])
        ```

    Limits, fixed at export: batch size 1, greedy or sampling (no beam search), `max_seq_len` decoder positions
    (start tokens + prompt + generated tokens). Word-level timestamps need the cross-attention weights, which the
    program does not return.
    """

    task = "automatic-speech-recognition"
    auto_model_class = "AutoModelForSpeechSeq2Seq"
    main_input_name = "input_features"

    def __init__(self, program, config, model_save_dir, manifest=None):
        super().__init__(program, config, model_save_dir, manifest)
        self.model = _WHISPER_ENCODER_STRIDES
        self.num_mel_bins = int(self.read_constant(contract.NUM_MEL_BINS, config.num_mel_bins))
        self.num_frames = int(self.read_constant(contract.NUM_FRAMES, 2 * config.max_source_positions))
        # Whisper's generation caps the decoder sequence at `config.max_target_positions`; during `generate` it reads
        # a copy capped at the program's positions (the model's own config, saved with the model, stays as it is).
        self._generation_model_config = copy.deepcopy(config)
        self._generation_model_config.max_target_positions = min(int(config.max_target_positions), self.max_seq_len)
        if self.generation_config.num_beams is None:
            # Set explicitly, so that a pipeline does not add its default of 5 beams, which batch size 1 excludes.
            self.generation_config.num_beams = 1

    @one_call_at_a_time
    def encode(self, input_features: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> BaseModelOutput:
        """Runs the `encoder` method on one window of log-mel features `[1, num_mel_bins, num_frames]`."""
        expected = (1, self.num_mel_bins, self.num_frames)
        if not isinstance(input_features, torch.Tensor) or not input_features.is_floating_point():
            raise ValueError(
                f"{type(self).__name__} takes input_features: float log-mel features of shape {list(expected)}, made "
                "by the feature extractor exported with the model (AutoFeatureExtractor.from_pretrained(out))."
            )
        if tuple(input_features.shape) != expected:
            raise ValueError(
                f"input_features has shape {list(input_features.shape)}; this program takes {list(expected)} (batch "
                f"size 1, {self.num_mel_bins} mel bins, {self.num_frames} frames). Use the exported feature extractor, "
                "which pads or truncates audio to that window, and pass one input at a time."
            )
        with exclusive_cores():
            hidden = self._encoder_method.execute([input_features.to(self.dtype).contiguous()])[0]
        return BaseModelOutput(last_hidden_state=hidden)

    @one_call_at_a_time
    def generate(self, input_features: Optional[torch.Tensor] = None, generation_config=None, **kwargs):
        """Whisper's `generate` (language, task, timestamps, long-form), within the program's limits (see the
        class docstring)."""
        config = generation_config if generation_config is not None else self.generation_config
        check_no_beam_search(kwargs, config)
        if kwargs.get("return_token_timestamps"):
            raise ValueError(
                "Word-level timestamps (return_token_timestamps, return_timestamps='word') need the decoder's "
                "cross-attention weights, which the exported program does not return. Use return_timestamps=True."
            )
        if input_features is not None and input_features.dim() == 3 and input_features.shape[0] != 1:
            raise ValueError(
                f"This program was exported for batch size 1, got batch size {input_features.shape[0]}. "
                "Run the inputs one at a time."
            )
        if input_features is not None and input_features.dim() == 3 and input_features.shape[1] != self.num_mel_bins:
            raise ValueError(
                f"input_features has {input_features.shape[1]} mel bins; this program takes {self.num_mel_bins}. "
                "Use the feature extractor exported with the model."
            )
        wanted = kwargs.get("max_new_tokens")
        if wanted is not None and wanted >= self.max_seq_len:
            raise ValueError(
                f"max_new_tokens={wanted} does not fit the {self.max_seq_len} decoder positions of this program, which "
                "also hold the start tokens. Ask for fewer tokens or re-export with a larger --max_seq_len."
            )
        config, self.config = self.config, self._generation_model_config
        try:
            with exclusive_cores():  # once for the whole loop, see threads.py
                return WhisperGenerationMixin.generate(self, input_features, generation_config=generation_config, **kwargs)
        finally:
            self.config = config
