"""image-classification (vit, deit, mobilevit, convnext, resnet, efficientnet) against eager transformers."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline

from optimum.executorch import ExecuTorchModelForCausalLM, ExecuTorchModelForImageClassification, main_export
from optimum_executorch.modeling.program_info import describe_export
from optimum_executorch.testing import assert_logits_close, save_tiny_image_classifier

from .conftest import cell, run_cli

MODEL_TYPES = ["vit", "deit", "mobilevit", "convnext", "resnet", "efficientnet"]


def _images(count=3):
    rng = np.random.RandomState(0)
    return [Image.fromarray((rng.rand(40 + 7 * i, 50, 3) * 255).astype("uint8")) for i in range(count)]


@pytest.fixture(scope="module", params=[pytest.param(m, marks=cell(m, "image-classification"), id=m) for m in MODEL_TYPES])
def exported(request, tmp_path_factory):
    model_type = request.param
    root = tmp_path_factory.mktemp(model_type)
    src = save_tiny_image_classifier(model_type, root / "model")
    if model_type == "resnet":  # one family through the CLI, with the task named
        run_cli("export", "executorch", "--model", src, "--task", "image-classification", "--output_dir",
                str(root / "et"), check=True)  # fmt: skip
        out = root / "et"
    else:
        out = main_export(src, root / "et")  # task inferred from the config
    eager = AutoModelForImageClassification.from_pretrained(src).eval()
    return ExecuTorchModelForImageClassification.from_pretrained(out), eager, out, src


def test_logits_match_eager(exported):
    et_model, eager, _, _ = exported
    torch.manual_seed(0)
    for batch in (1, 3):
        pixel_values = torch.randn(batch, *et_model.image_shape)
        with torch.no_grad():
            expected = eager(pixel_values=pixel_values).logits
        assert_logits_close(et_model(pixel_values=pixel_values).logits, expected, rtol=1e-4)


def test_pipeline_matches_eager_pipeline_from_the_output_directory(exported):
    et_model, eager, out, src = exported
    et_pipe = pipeline("image-classification", model=et_model, image_processor=AutoImageProcessor.from_pretrained(out))
    eager_pipe = pipeline("image-classification", model=eager, image_processor=AutoImageProcessor.from_pretrained(src))
    for actual, expected in zip(et_pipe(_images()), eager_pipe(_images())):
        assert [r["label"] for r in actual] == [r["label"] for r in expected]
        assert np.allclose([r["score"] for r in actual], [r["score"] for r in expected], atol=1e-4)


def test_export_records_the_static_image_size(exported):
    et_model, eager, out, _ = exported
    config = json.loads((out / "executorch_config.json").read_text())
    size = eager.config.image_size if hasattr(eager.config, "image_size") else 224
    assert config["task"] == "image-classification" and config["max_seq_len"] is None
    assert config["method_inputs"]["forward"] == [
        {"name": "pixel_values", "dtype": "float32", "shape": ["batch 1..64", 3, size, size]}
    ]
    assert et_model.image_shape == (3, size, size)
    described = describe_export(out)
    assert described["methods"]["forward"]["inputs"][0]["dtype"] == "float32"
    assert described["metadata"]["get_image_height"] == size


def test_wrong_inputs_raise_clear_errors(exported):
    et_model, _, _, _ = exported
    if et_model.config.model_type != "vit":
        pytest.skip("the checks are the runtime class's, the same for every family")
    with pytest.raises(ValueError, match="takes pixel_values \\(images\\)"):
        et_model(input_ids=torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="static image"):
        et_model(pixel_values=torch.randn(1, 3, 48, 48))
    with pytest.raises(ValueError, match="4D float tensor"):
        et_model(pixel_values=torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="float tensor"):
        et_model(pixel_values=torch.zeros(1, 3, 32, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="image-classification"):
        ExecuTorchModelForCausalLM.from_pretrained(exported[2])


def test_sequence_options_and_other_tasks_are_refused(tmp_path):
    src = save_tiny_image_classifier("vit", tmp_path / "model")
    with pytest.raises(ValueError, match="max_seq_len does not apply"):
        main_export(src, tmp_path / "a", max_seq_len=64)
    with pytest.raises(ValueError, match="supported: image-classification"):
        main_export(src, tmp_path / "b", task="fill-mask")
    plan = main_export(src, tmp_path / "c", dry_run=True).to_dict()
    assert plan["settings"]["max_seq_len"] == {"value": None, "source": "not used: the inputs are not sequences"}
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_quantized_vit_matches_eager_quantized_the_same_way(tmp_path):
    """`--qlinear` applies to image models through the same options: 8da8w linears, as eager quantized alike."""
    from optimum_executorch.exporters.quantization import QuantizationSpec
    from optimum_executorch.exporters.quantizer import quantize

    src = save_tiny_image_classifier("vit", tmp_path / "model")
    out = main_export(src, tmp_path / "et", qlinear="8da8w")
    eager_q = AutoModelForImageClassification.from_pretrained(src).eval()
    quantize(eager_q, QuantizationSpec(qlinear="8da8w"))
    layers = json.loads((out / "executorch_config.json").read_text())["quantization"]["layers"]
    assert layers == {"linear_per_channel": 2 * 6 + 1}  # q, k, v, attention output, intermediate, output; classifier
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = eager_q(pixel_values=pixel_values).logits
    actual = ExecuTorchModelForImageClassification.from_pretrained(out)(pixel_values=pixel_values).logits
    assert_logits_close(actual, expected, rtol=1e-4)
