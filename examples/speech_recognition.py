"""Export a Whisper checkpoint to ExecuTorch and transcribe a 16 kHz WAV file with the .pte, through the pipeline.

Equivalent CLI for the export:

    optimum-cli export executorch --model <whisper checkpoint dir or Hub id> --task automatic-speech-recognition \
        --recipe xnnpack --output_dir whisper_et

Usage: python examples/speech_recognition.py --model <checkpoint> --audio speech.wav [--output_dir whisper_et]
       [--language en] [--timestamps]

The WAV file must be 16-bit PCM at the feature extractor's sampling rate (16 kHz for Whisper), mono or
stereo (averaged); longer than 30 s is fine (transcribed window after window). Without `--audio`, one second
of silence is transcribed, which checks the export end to end.
"""

import argparse
import logging
import wave
from pathlib import Path

import numpy as np
from transformers import AutoFeatureExtractor, AutoTokenizer, pipeline

from optimum.executorch import ExecuTorchModelForSpeechSeq2Seq, main_export


def read_wav(path: str, sampling_rate: int) -> np.ndarray:
    """A 16-bit PCM WAV file as float32 samples in [-1, 1] (channels averaged)."""
    with wave.open(path, "rb") as f:
        if f.getsampwidth() != 2:
            raise SystemExit(f"{path}: 16-bit PCM expected, got {8 * f.getsampwidth()}-bit samples.")
        if f.getframerate() != sampling_rate:
            raise SystemExit(f"{path}: {f.getframerate()} Hz; resample it to {sampling_rate} Hz first.")
        samples = np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16).reshape(-1, f.getnchannels())
    return (samples.mean(axis=1) / 32768.0).astype(np.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Whisper checkpoint directory or Hub id")
    parser.add_argument("--audio", default=None, help="16-bit PCM WAV file at 16 kHz")
    parser.add_argument("--output_dir", default="whisper_et")
    parser.add_argument("--language", default=None, help="e.g. en (default: detected)")
    parser.add_argument("--timestamps", action="store_true", help="print segment timestamps")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    out = Path(args.output_dir)
    if not (out / "model.pte").is_file():
        main_export(args.model, out, task="automatic-speech-recognition", recipe="xnnpack")

    # Everything the pipeline needs comes from the export directory alone.
    asr = pipeline(
        "automatic-speech-recognition",
        model=ExecuTorchModelForSpeechSeq2Seq.from_pretrained(out),
        tokenizer=AutoTokenizer.from_pretrained(out),
        feature_extractor=AutoFeatureExtractor.from_pretrained(out),
    )
    rate = asr.feature_extractor.sampling_rate
    audio = read_wav(args.audio, rate) if args.audio else np.zeros(rate, dtype=np.float32)
    generate_kwargs = {"language": args.language} if args.language else {}
    result = asr(audio, generate_kwargs=generate_kwargs, return_timestamps=args.timestamps)
    print(result["text"])
    for chunk in result.get("chunks", []):
        print(f"  [{chunk['timestamp'][0]} - {chunk['timestamp'][1]}] {chunk['text']}")


if __name__ == "__main__":
    main()
