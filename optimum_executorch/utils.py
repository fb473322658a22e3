"""Small helpers shared by the export side, the runtime side and the CLI (standard library only)."""

import difflib


def suggest(name: str, choices) -> str:
    """` Did you mean 'x'?` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def file_sha256(path) -> str:
    """The SHA-256 of a file, read in a stream (about 0.6 s for 500 MB here; the runtime reads the pages next)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def tokenizer_adds_bos(tokenizer) -> bool:
    """Whether a Hugging Face tokenizer puts its BOS token before a text (ExecuTorch's runner must then add one)."""
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a").input_ids[:1] == [bos]
