"""Checks, at export, that ExecuTorch's runner tokenizes like the Hugging Face tokenizer.

The C++ runner reads the exported `tokenizer.json` (or `tokenizer.model`) with `pytorch_tokenizers`, its
own implementation. Where it splits a string differently, the program gets other tokens on a device than in
Python, and answers differently with no error anywhere. `check_runner_tokenizer` encodes a fixed set of
strings with both, checks bos/eos against the program's metadata, records the result in
`executorch_config.json` and warns, naming the first string that differs.
"""

import logging
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .. import contract
from ..contract import RUNNER_TOKENIZER_FILES, runner_tokenizer_load_path
from ..utils import tokenizer_adds_bos

logger = logging.getLogger(__name__)

# ASCII, accents, CJK, emoji, digits, whitespace runs, punctuation and code; the chat template's output is
# added per tokenizer.
PARITY_TEXTS = (
    "Hello, world! The capital of France is Paris.",
    "naïve café, déjà vu, Zürich, São Paulo, Ærøskøbing",
    "日本語のテキストと中文文本，한국어 텍스트",
    "emoji 🙂🚀👩‍👩‍👧 ok",
    "digits 0 12 345 6789 3.14159 1,000,000 42/7 +1-800-555",
    "  two  spaces,\ttabs\t\tand\nnew\n\n\nlines   ",
    "def f(x):\n    return x ** 2  # code",
    "MiXeD CaSe ALLCAPS don't we'll it's",
)


def _load_runner_tokenizers(directory: Path) -> Tuple[List[Tuple[str, Any]], List[str]]:
    """The tokenizers the runner can load from `directory` as `(file name, tokenizer)`, and why others failed.

    `tokenizer.json` (read from the directory, so that bos/eos come from tokenizer_config.json) and a
    SentencePiece `tokenizer.model`: the runner's tokenizer.json reader has no Metaspace pre-tokenizer, so
    it cannot read the tokenizer.json of SentencePiece models.
    """
    from pytorch_tokenizers import CppHFTokenizer, CppSPTokenizer

    loaded, errors = [], []
    for file_name, cls in zip(RUNNER_TOKENIZER_FILES, (CppHFTokenizer, CppSPTokenizer)):
        if not (directory / file_name).is_file():
            continue
        tokenizer = cls()
        try:
            tokenizer.load(str(runner_tokenizer_load_path(directory, file_name)))
        except Exception as err:
            errors.append(f"{file_name}: {err}")
            continue
        loaded.append((file_name, tokenizer))
    if not loaded and not errors:
        errors.append("no tokenizer.json or tokenizer.model was written")
    return loaded, errors


def _compare(hf_tokenizer, runner_tokenizer, texts: List[str]) -> Dict[str, Any]:
    record: Dict[str, Any] = {"texts": len(texts), "matches": True, "mismatched_texts": [], "first_mismatch": None}
    for text in texts:
        expected = hf_tokenizer(text, add_special_tokens=False).input_ids
        try:
            actual = list(runner_tokenizer.encode(text, 0, 0))
        except Exception as err:  # the runner would fail on such a prompt
            actual = f"error: {err}"
        if actual == expected:
            continue
        record["matches"] = False
        record["mismatched_texts"].append(text)
        if record["first_mismatch"] is None:
            record["first_mismatch"] = {"text": text, "hf": expected, "runner": actual}
    return record


def _texts(hf_tokenizer) -> List[str]:
    texts = list(PARITY_TEXTS)
    if getattr(hf_tokenizer, "chat_template", None):
        try:
            messages = [{"role": "user", "content": "Hi there!"}, {"role": "assistant", "content": "Hello. 🙂"}]
            texts.append(hf_tokenizer.apply_chat_template(messages, tokenize=False))
        except Exception as err:  # a template that needs other roles or variables: check the rest
            logger.info("Chat template not rendered for the tokenizer check (%s).", err)
    return texts


def check_runner_tokenizer(hf_tokenizer, directory: Path, metadata: Dict[str, Any]) -> Dict[str, Any]:
    """Compares the runner's tokenizer in `directory` with `hf_tokenizer`; returns the record for
    `executorch_config.json`: `matches` (every string encodes the same), `mismatched_texts`, `first_mismatch`,
    `special_tokens_agree` (bos/eos of tokenizer, runner and program metadata)."""
    loaded, errors = _load_runner_tokenizers(directory)
    if not loaded:
        logger.warning(
            "ExecuTorch's runner cannot load this tokenizer (%s): the program runs from Python, but not in the "
            "C++ runner on a device.",
            "; ".join(errors),
        )
        return {"file": None, "matches": False, "errors": errors}

    texts = _texts(hf_tokenizer)
    # The first file that tokenizes every text alike, else the one with the fewest differences.
    candidates = [(file_name, tokenizer, _compare(hf_tokenizer, tokenizer, texts)) for file_name, tokenizer in loaded]
    file_name, runner_tokenizer, record = min(candidates, key=lambda c: len(c[2]["mismatched_texts"]))
    record = dict(file=file_name, **record)
    if record["first_mismatch"] is not None:
        mismatch = record["first_mismatch"]
        logger.warning(
            "ExecuTorch's runner (%s) tokenizes differently from the Hugging Face tokenizer: %r -> %s (runner) vs "
            "%s (Hugging Face). On a device this model would see other tokens than in Python for such text.",
            file_name,
            mismatch["text"],
            mismatch["runner"],
            mismatch["hf"],
        )
    record.update(_check_special_tokens(hf_tokenizer, runner_tokenizer, metadata))
    return record


def _check_special_tokens(hf_tokenizer, runner_tokenizer, metadata) -> Dict[str, Any]:
    problems = []
    adds_bos = tokenizer_adds_bos(hf_tokenizer)
    if adds_bos and runner_tokenizer.bos_tok() != hf_tokenizer.bos_token_id:
        problems.append(f"bos: the runner's is {runner_tokenizer.bos_tok()}, the tokenizer's {hf_tokenizer.bos_token_id}")
    if adds_bos and metadata.get(contract.BOS_ID) not in (None, hf_tokenizer.bos_token_id):
        problems.append(f"bos: the program's get_bos_id is {metadata['get_bos_id']}, the tokenizer's {hf_tokenizer.bos_token_id}")
    eos_ids = metadata.get(contract.EOS_IDS) or []
    if hf_tokenizer.eos_token_id is not None and eos_ids and hf_tokenizer.eos_token_id not in eos_ids:
        problems.append(
            f"eos: the tokenizer's eos {hf_tokenizer.eos_token_id} is not among the program's get_eos_ids {eos_ids}"
        )
    for problem in problems:
        logger.warning("Special tokens disagree, %s; generation may not start or stop as in Python.", problem)
    return {"adds_bos": adds_bos, "special_tokens_agree": not problems, "special_token_problems": problems}

