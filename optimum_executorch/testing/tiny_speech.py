"""A tiny random Whisper checkpoint (model, tokenizer, feature extractor, generation config), built in a second."""

import json
from pathlib import Path
from typing import Any, Sequence, Union

import torch

# One second of 16 kHz audio is 100 log-mel frames; the tiny model's window is 2 s (200 frames, 100 positions).
TINY_WHISPER_CHUNK_SECONDS = 2
TINY_WHISPER_LANGUAGES = ("en", "fr", "de")


def tiny_whisper_tokenizer(languages: Sequence[str] = TINY_WHISPER_LANGUAGES, chunk_seconds: int = TINY_WHISPER_CHUNK_SECONDS):
    """A `WhisperTokenizer` laid out like the released ones on a tiny byte-level BPE: text pieces, then
    `<|endoftext|>`, `<|startoftranscript|>`, one token per language, the task and control tokens ending with
    `<|notimestamps|>`, then one timestamp token per 0.02 s of the window."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AddedToken, WhisperTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet, show_progress=False)
    bpe.train_from_iterator(["The capital of France is Paris. Speech runs on a phone, transcribed offline."] * 4, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = WhisperTokenizer(vocab=model["vocab"], merges=merges)
    controls = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    specials = ["<|startoftranscript|>"] + [f"<|{lang}|>" for lang in languages] + controls
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    steps = int(chunk_seconds / 0.02)
    tokenizer.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", normalized=False, special=False) for i in range(steps + 1)])
    return tokenizer


def save_tiny_whisper(directory: Union[str, Path], seed: int = 0, **overrides: Any) -> str:
    """Builds a random tiny Whisper (2+2 layers, d_model 64, 80 mel bins, a 2 s window), saves it with its
    tokenizer, feature extractor and a multilingual generation config to `directory`."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from .tiny_models import tiny_config

    directory = Path(directory)
    tokenizer = tiny_whisper_tokenizer()
    token = tokenizer.convert_tokens_to_ids
    eot, sot = token("<|endoftext|>"), token("<|startoftranscript|>")
    ids = dict(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, decoder_start_token_id=sot)
    config = tiny_config("whisper", vocab_size=len(tokenizer), **ids, **overrides)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # decisive logits, so that parity tests compare real choices and not ties
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    generation = model.generation_config
    for name, value in ids.items():
        setattr(generation, name, value)
    generation.is_multilingual = True
    generation.lang_to_id = {f"<|{lang}|>": token(f"<|{lang}|>") for lang in TINY_WHISPER_LANGUAGES}
    generation.task_to_id = {task: token(f"<|{task}|>") for task in ("transcribe", "translate")}
    generation.no_timestamps_token_id = token("<|notimestamps|>")
    generation.suppress_tokens, generation.begin_suppress_tokens = [], [eot]
    generation.max_length = config.max_target_positions
    generation.max_initial_timestamp_index = 50
    generation._from_model_config = False  # or from_pretrained rebuilds it from config.json without the fields above
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins, chunk_length=TINY_WHISPER_CHUNK_SECONDS).save_pretrained(directory)
    return str(directory)
