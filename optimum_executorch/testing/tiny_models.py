"""Tiny random models, configs and tokenizers, built in milliseconds, for export tests."""

from pathlib import Path
from typing import Any, Dict, Union

import torch

# Small enough that export + lowering takes seconds on two cores.
TINY_DECODER_CONFIG: Dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# Encoders (BERT-like); each family's config says how it departs from this (configs/encoder.py).
TINY_ENCODER_CONFIG: Dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "num_labels": 3,
}


# Image classifiers; each family's config adds its own stage sizes (configs/vision.py).
TINY_VISION_CONFIG: Dict[str, Any] = {"image_size": 32, "num_labels": 3}

# Encoder-decoder LMs (T5, BART); each family's config adds its own layer and head counts (configs/seq2seq.py).
TINY_SEQ2SEQ_CONFIG: Dict[str, Any] = {
    "vocab_size": 512,
    "d_model": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

_TINY_BASES = {
    "decoder": TINY_DECODER_CONFIG,
    "encoder": TINY_ENCODER_CONFIG,
    "vision": TINY_VISION_CONFIG,
    "seq2seq": TINY_SEQ2SEQ_CONFIG,
}


def tiny_config(model_type: str, **overrides: Any):
    """A 2-layer, hidden-64 config of `model_type` (any transformers model type)."""
    from transformers import AutoConfig

    from ..exporters.configs import EXPORT_CONFIGS
    from ..exporters.configs.base import ExportConfig
    from ..exporters.extensions import find_extension

    find_extension(model_type)  # built-in extensions say how to shrink their families too
    family = EXPORT_CONFIGS.get(model_type, ExportConfig)
    base = _TINY_BASES[family.tiny_config_base]
    kwargs = {family.tiny_config_renames.get(k, k): v for k, v in base.items()}
    kwargs.update(family.tiny_config_extra)
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_tokenizer(vocab_size: int = TINY_DECODER_CONFIG["vocab_size"]):
    """A byte-level BPE tokenizer trained in milliseconds on a few sentences, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "The capital of France is Paris. The capital of Italy is Rome.",
        "Once upon a time there was a small model that ran on a phone.",
        "ExecuTorch runs PyTorch programs on mobile and embedded devices.",
    ] * 4
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        chat_template=TINY_CHAT_TEMPLATE,
    )


def save_tiny_sentencepiece_tokenizer(directory: Union[str, Path], vocab_size: int = 400):
    """Trains a byte-fallback SentencePiece BPE model (Llama-style `tokenizer.model`) in well under a second,
    saves it with a `tokenizer_config.json` to `directory` and returns the Hugging Face tokenizer of it."""
    import json

    import sentencepiece
    from transformers import AutoTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    corpus = [
        "The capital of France is Paris. The capital of Italy is Rome.",
        "Once upon a time there was a small model that ran on a phone.",
        "naïve café, déjà vu; 日本語 and emoji 🙂 with digits 12345.",
    ] * 20
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        # As Llama's: no NFKC and whitespace kept as written (the converted fast tokenizer does neither).
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        minloglevel=2,
    )
    (directory / "tokenizer.vocab").unlink()
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(directory)


def keep_whole_character_tokens(model, tokenizer) -> None:
    """Zeroes the LM-head rows of tokens that do not decode to whole characters, so that a random model writes
    text that ExecuTorch's runner passes on as Python does: bytes of a longer UTF-8 character (the runner's
    binding cannot pass a partial character to Python), SentencePiece byte-fallback pieces (the runner's
    SentencePiece decoder prints them as `<0xNN>`) and ids beyond the tokenizer."""
    import re

    byte_piece = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
    with torch.no_grad():
        for token_id in range(model.config.vocab_size):
            if (
                token_id >= len(tokenizer)
                or "\ufffd" in tokenizer.decode([token_id])
                or byte_piece.match(tokenizer.convert_ids_to_tokens(token_id) or "")
            ):
                model.lm_head.weight[token_id] = 0.0


def tiny_wordpiece_tokenizer(vocab_size: int = TINY_ENCODER_CONFIG["vocab_size"]):
    """A BERT-style WordPiece tokenizer ([CLS] ... [SEP], [MASK]) trained in milliseconds."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    corpus = [
        "The capital of France is Paris. The capital of Italy is Rome.",
        "A small model runs on a phone; a large one needs a server.",
        "ExecuTorch runs PyTorch programs on mobile and embedded devices.",
    ] * 4
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def save_tiny_encoder(model_type: str, directory: Union[str, Path], task: str = "fill-mask", seed: int = 0, **overrides):
    """Builds a random tiny encoder of `model_type` for `task`, saves it and a WordPiece tokenizer."""
    import transformers

    auto = {
        "feature-extraction": "AutoModel",
        "fill-mask": "AutoModelForMaskedLM",
        "text-classification": "AutoModelForSequenceClassification",
        "token-classification": "AutoModelForTokenClassification",
    }[task]
    directory = Path(directory)
    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, auto).from_config(config)
    model.save_pretrained(directory)
    tiny_wordpiece_tokenizer(config.vocab_size).save_pretrained(directory)
    return str(directory)


def spread_vision_weights(model) -> None:
    """Re-initializes a random vision model so that its output depends on its input: the default initializers
    (std 0.02, unit BatchNorm statistics) shrink activations layer after layer until a tiny convolutional model
    answers the same for every image. Convolutions and linears get std 1.5/sqrt(fan_in); normalizations get
    random affine parameters and running statistics, so that folding them into convolutions is exercised."""
    import math

    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, norms):
                if getattr(module, "weight", None) is not None:
                    module.weight.normal_(1.0, 0.1)
                    module.bias.normal_(0.0, 0.1)
                if getattr(module, "running_mean", None) is not None:
                    module.running_mean.normal_(0.0, 0.1)
                    module.running_var.uniform_(0.5, 1.5)
            elif isinstance(module, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)):
                module.weight.normal_(0.0, 1.5 / math.sqrt(module.weight[0].numel()))
                if module.bias is not None:
                    module.bias.normal_(0.0, 0.1)


def save_tiny_image_classifier(model_type: str, directory: Union[str, Path], seed: int = 0, **overrides: Any) -> str:
    """Builds a random tiny image classifier of `model_type`, saves it and an image processor that resizes and
    normalizes to its input size."""
    from transformers import AutoModelForImageClassification
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

    directory = Path(directory)
    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForImageClassification.from_config(config)
    spread_vision_weights(model)
    model.save_pretrained(directory)
    size = getattr(config, "image_size", None) or 224
    ViTImageProcessorPil(size={"height": size, "width": size}).save_pretrained(directory)
    return str(directory)


def save_tiny_model(
    model_type: str, directory: Union[str, Path], seed: int = 0, with_tokenizer: bool = True, **overrides: Any
) -> str:
    """Builds a random tiny generative LM of `model_type` (a causal LM, or an encoder-decoder LM such as t5),
    saves it (and a tokenizer) to `directory`."""
    import transformers

    directory = Path(directory)
    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    auto_class = "AutoModelForSeq2SeqLM" if config.is_encoder_decoder else "AutoModelForCausalLM"
    model = getattr(transformers, auto_class).from_config(config)
    # Random init leaves logits nearly flat; larger weights make greedy choices decisive, so that a
    # parity test compares real decisions and not ties.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(directory)
    if with_tokenizer:
        tiny_tokenizer(config.vocab_size).save_pretrained(directory)
    return str(directory)
