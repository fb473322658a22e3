"""Small helpers shared by the export side, the runtime side and the CLI (standard library only)."""

import difflib


_NEGATIONS = ("no_", "disable", "skip_", "without_")


def _negated(name: str) -> bool:
    return any(word in name for word in _NEGATIONS)


def suggest(name: str, choices, aliases=None) -> str:
    """` Did you mean 'x'?` for the closest choice, or an empty string. `aliases` maps names users bring from
    elsewhere to what to use here (checked first). A close spelling that means the opposite (`--use_x` and
    `--no_x`) is never suggested."""
    name = str(name)
    for key in (name, name.lstrip("-")):
        if aliases and key in aliases:
            return f" Use {aliases[key]} instead."
    close = difflib.get_close_matches(name, [str(c) for c in choices], n=3, cutoff=0.6)
    close = [c for c in close if _negated(c) == _negated(name)]
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
