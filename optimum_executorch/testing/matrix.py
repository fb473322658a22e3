"""The coverage matrix: what each registered model_type claims (task x recipe x quantization), and the check that
proves one cell against the eager model.

A model_type claims every task its export config lists with the default recipe (xnnpack) in float32. Every
text-generation family, and one model_type per other kind of program (`ExportConfig.coverage_representatives`), also claims its default
task (the first it lists) with each quantized linear scheme of `QUANTIZATIONS` the recipe has kernels for
(`Recipe.quantized_linears`). The other recipes are claimed for the default task of the representatives, one per
kind of program: full attention, sliding + full layers, a ring-buffer cache, convolution state, an encoder, an
image model, encoder-decoder text and speech. `check_cell` builds a
tiny random checkpoint of the model_type for the task, exports it with the cell's recipe and quantization, and
compares the program with the eager model (quantized the same way for a quantized cell) on the task's outputs.
`python -m optimum_executorch.coverage` turns the results of a test run into docs/coverage.md.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

import torch

# Quantization columns: name -> the export options that produce it.
QUANTIZATIONS: Dict[str, Dict[str, str]] = {"fp32": {}, "8da4w": {"qlinear": "8da4w"}}
# Greedy decoding that makes a random tiny model take real decisions (no repeated token loops).
DEFAULT_RECIPE = "xnnpack"
_GREEDY = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, no_repeat_ngram_size=2)


@dataclass(frozen=True, order=True)
class Cell:
    model_type: str
    task: str
    recipe: str
    quantization: str

    @property
    def id(self) -> str:
        return f"{self.model_type}-{self.task}-{self.recipe}-{self.quantization}"

    @property
    def column(self) -> str:
        return f"{self.task} · {self.recipe} · {self.quantization}"


def registered_model_types() -> Dict[str, type]:
    """Every model_type the package itself registers: the export configs and the built-in extensions (not those a
    user's `--extension_modules` file, or a test, registered in this process)."""
    from ..exporters.configs import EXPORT_CONFIGS
    from ..exporters.extensions import discover_builtin_extensions

    for _ in discover_builtin_extensions():
        pass
    package = __name__.split(".")[0] + ".exporters."
    return {name: cls for name, cls in EXPORT_CONFIGS.items() if cls.__module__.startswith(package) and cls.tasks}


def claimed_cells() -> List[Cell]:
    from ..exporters.recipes import RECIPES

    cells = []
    for model_type, config in sorted(registered_model_types().items()):
        default_task, representative = config.tasks[0], config.represents_its_kind(model_type)
        for task in config.tasks:
            for name, recipe in sorted(RECIPES.items()):
                if name != DEFAULT_RECIPE and not (task == default_task and representative):
                    continue
                for quantization, options in QUANTIZATIONS.items():
                    qlinear = options.get("qlinear")
                    quantized_claimed = task == default_task and (representative or task == "text-generation")
                    if qlinear and not (quantized_claimed and qlinear in recipe.quantized_linears):
                        continue
                    cells.append(Cell(model_type, task, name, quantization))
    return cells


def build_tiny_checkpoint(model_type: str, task: str, directory: Union[str, Path], **overrides) -> str:
    """A tiny random checkpoint of `model_type` for `task` (with its tokenizer or processor) in `directory`."""
    from .tiny_models import save_tiny_encoder, save_tiny_image_classifier, save_tiny_model
    from .tiny_speech import save_tiny_whisper

    if task in ("text-generation", "text2text-generation"):
        return save_tiny_model(model_type, directory, **overrides)
    if task == "image-classification":
        return save_tiny_image_classifier(model_type, directory, **overrides)
    if task == "automatic-speech-recognition":
        return save_tiny_whisper(directory, **overrides)
    return save_tiny_encoder(model_type, directory, task=task, **overrides)


def eager_reference(src: str, task: str, quantization: str, tokenizer=None):
    """The eager model of `src` for `task`, quantized as the program is (`QUANTIZATIONS[quantization]`). XNNPACK
    keeps the scales of grouped 4-bit weights in bfloat16: the reference rounds them the same way, so that the two
    run the same arithmetic."""
    from transformers import AutoConfig

    from ..exporters.configs import get_export_config
    from ..exporters.extensions import find_extension
    from ..exporters.quantization import QuantizationSpec
    from ..exporters.quantizer import quantize
    from ..exporters.tasks import get_task

    config = AutoConfig.from_pretrained(src)
    find_extension(config.model_type)
    load_kwargs = get_export_config(config, task).model_load_kwargs()  # as the exporter loads it
    eager = get_task(task).load_auto_class().from_pretrained(src, **load_kwargs).eval()
    options = QUANTIZATIONS[quantization]
    if options:
        spec = QuantizationSpec.of_options(options)
        quantize(eager, spec, tokenizer)
        round_grouped_4bit_scales(eager, spec)
    return eager


def round_grouped_4bit_scales(model, spec) -> None:
    """Rounds the scales of the grouped 4-bit linears of `model` to bfloat16, as XNNPACK stores them."""
    eight_bit = tuple(spec.qlinear_8bit_layers or ())
    if not spec.four_bit_linears:
        return
    for name, module in model.named_modules():
        scale = getattr(getattr(module, "weight", None), "scale", None)
        if isinstance(module, torch.nn.Linear) and scale is not None and not name.endswith(eight_bit):
            if scale.dim() == 2 and scale.shape[-1] > 1:  # grouped (per-channel scales stay float32)
                scale.data = scale.data.to(torch.bfloat16).float()


def check_cell(cell: Cell, workdir: Union[str, Path], rtol: float = 1e-4, overrides: Optional[dict] = None) -> None:
    """Exports a tiny `cell.model_type` for `cell.task` with the cell's recipe and quantization and asserts that the
    program matches the eager model (quantized alike) within `rtol` of the largest output, with the same greedy
    tokens for generative tasks."""
    from .. import modeling
    from ..exporters import main_export
    from ..exporters.tasks import get_task

    workdir = Path(workdir)
    src = build_tiny_checkpoint(cell.model_type, cell.task, workdir / "src", **(overrides or {}))
    options = dict(QUANTIZATIONS[cell.quantization], recipe=cell.recipe)
    if cell.task not in ("image-classification",):
        options["max_seq_len"] = 48
    out = main_export(src, workdir / "et", task=cell.task, **options)
    spec = get_task(cell.task)
    program = getattr(modeling, spec.runtime_class).from_pretrained(out)
    eager = eager_reference(src, cell.task, cell.quantization)
    _CHECKS.get(cell.task, _check_outputs)(program, eager, spec, rtol)


def _check_causal_lm(program, eager, spec, rtol):
    from .parity import assert_generation_matches_eager, assert_teacher_forced_close

    if rtol <= 1e-3:
        assert_generation_matches_eager(eager, program, max_new_tokens=20, rtol=rtol)
    else:
        assert_teacher_forced_close(eager, program, rtol)


def _check_seq2seq(program, eager, spec, rtol):
    torch.manual_seed(0)
    prompt = torch.randint(3, eager.config.vocab_size, (1, 9))
    expected = eager.generate(prompt, **_GREEDY)
    actual = program.generate(prompt, **_GREEDY)
    assert actual.tolist() == expected.tolist(), f"greedy tokens differ:\n pte:   {actual.tolist()}\n eager: {expected.tolist()}"


def _check_speech(program, eager, spec, rtol):
    torch.manual_seed(0)
    features = torch.randn(1, eager.config.num_mel_bins, 2 * eager.config.max_source_positions)
    greedy = dict(_GREEDY, min_new_tokens=None, language="en")
    expected = eager.generate(features, **greedy)
    actual = program.generate(features, **greedy)
    assert actual.tolist() == expected.tolist(), f"greedy tokens differ:\n pte:   {actual.tolist()}\n eager: {expected.tolist()}"


def _check_image(program, eager, spec, rtol):
    from .parity import assert_logits_close

    torch.manual_seed(0)
    pixel_values = torch.randn(2, *program.image_shape)
    with torch.no_grad():
        expected = eager(pixel_values=pixel_values).logits
    assert_logits_close(program(pixel_values=pixel_values).logits, expected, rtol)


def _check_outputs(program, eager, spec, rtol):
    """Encoder tasks (and a decoder's feature extraction): the task's output for a batch of two sequences, the
    second padded."""
    from .parity import assert_logits_close

    torch.manual_seed(0)
    input_ids = torch.randint(5, eager.config.vocab_size, (2, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    with torch.no_grad():
        expected = eager(input_ids=input_ids, attention_mask=attention_mask)[spec.output_name]
    actual = program(input_ids=input_ids, attention_mask=attention_mask)[spec.output_name]
    if actual.dim() == 3:  # per token: padded positions are not compared (they are garbage in both)
        mask = attention_mask.bool()
        actual, expected = actual[mask], expected[mask]
    assert_logits_close(actual, expected, rtol)


_CHECKS = {
    "text-generation": _check_causal_lm,
    "text2text-generation": _check_seq2seq,
    "automatic-speech-recognition": _check_speech,
    "image-classification": _check_image,
}
