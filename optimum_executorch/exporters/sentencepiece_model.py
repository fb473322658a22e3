"""A SentencePiece `tokenizer.model` written from a SentencePiece-style `tokenizer.json`.

ExecuTorch's runner reads `tokenizer.json` with `pytorch_tokenizers`, which has no Metaspace
pre-tokenizer, so it cannot read the tokenizer.json of SentencePiece models (Llama 2, Mistral, Gemma...).
When a checkpoint ships only that tokenizer.json, `write_sentencepiece_model` rebuilds the SentencePiece
BPE model it was converted from: the same pieces with the same ids, byte-fallback pieces, control tokens,
and piece scores that replay the merges in their order. The export's tokenizer check then verifies it.
"""

import json
import logging
import re
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _is_sentencepiece_style(spec) -> bool:
    """BPE over `▁`-joined words: a Metaspace pre-tokenizer, or the Prepend("▁") + Replace(" ", "▁") normalizer."""
    text = json.dumps([spec.get("pre_tokenizer"), spec.get("normalizer")])
    return spec.get("model", {}).get("type") == "BPE" and ("Metaspace" in text or '"▁"' in text)


def _add_pieces(proto, sp_pb2, vocab, scores, unk, special) -> None:
    """One piece per token, in id order, typed as SentencePiece reads them."""
    kinds = sp_pb2.ModelProto.SentencePiece
    for token, _ in sorted(vocab.items(), key=lambda item: item[1]):
        piece = proto.pieces.add()
        piece.piece = token
        piece.score = scores.get(token, 0.0)
        if token == unk:
            piece.type = kinds.UNKNOWN
        elif token in special:
            piece.type = kinds.CONTROL
        elif _BYTE_PIECE.match(token):
            piece.type = kinds.BYTE
        else:
            piece.type = kinds.NORMAL


def write_sentencepiece_model(hf_tokenizer, path: Path) -> Optional[Path]:
    """Writes `path` (a SentencePiece BPE model) equivalent to `hf_tokenizer`, or returns None (with the
    reason in the log) when its tokenizer.json is not a SentencePiece-style BPE."""
    try:
        from sentencepiece import sentencepiece_model_pb2 as sp_pb2
    except ImportError as err:  # needs protobuf
        logger.info("Not writing tokenizer.model: %s", err)
        return None
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if not _is_sentencepiece_style(spec):
        return None
    model = spec["model"]
    vocab = dict(model["vocab"])
    for added in spec.get("added_tokens", []):
        vocab.setdefault(added["content"], added["id"])
    size = max(vocab.values()) + 1
    if sorted(vocab.values()) != list(range(size)):
        logger.info("Not writing tokenizer.model: the vocabulary ids are not dense.")
        return None
    # A piece made by merge number r scores -r, so that SentencePiece, which merges the best-scoring pair
    # first, replays the merges in their order.
    scores = {}
    for rank, merge in enumerate(model.get("merges", [])):
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        scores.setdefault(left + right, -float(rank + 1))
    special = {added["content"] for added in spec.get("added_tokens", []) if added.get("special")}
    unk = model.get("unk_token") or getattr(hf_tokenizer, "unk_token", None)
    if unk not in vocab:
        logger.info("Not writing tokenizer.model: SentencePiece needs an unknown-token piece, and this vocabulary has none.")
        return None

    proto = sp_pb2.ModelProto()
    _add_pieces(proto, sp_pb2, vocab, scores, unk, special)
    trainer = proto.trainer_spec
    trainer.model_type = sp_pb2.TrainerSpec.BPE
    trainer.vocab_size = size
    trainer.byte_fallback = bool(model.get("byte_fallback"))
    ids = {name: getattr(hf_tokenizer, f"{name}_token_id", None) for name in ("unk", "bos", "eos", "pad")}
    for name, value in ids.items():
        setattr(trainer, f"{name}_id", value if value is not None else -1)
    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = True
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    path.write_bytes(proto.SerializeToString())
    return path
