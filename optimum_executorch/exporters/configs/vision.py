"""Image classifiers: ViT-like transformers (vit, deit, mobilevit) and convolutional nets (convnext, resnet, efficientnet)."""

from typing import Any, Dict, Optional, Tuple

from . import register_export_config
from .base import ExportConfig

# The input size of a family whose config does not name one (ResNet): what its processors resize to.
DEFAULT_IMAGE_SIZE = 224


@register_export_config("vit")
class ImageClassificationExportConfig(ExportConfig):
    """Image classifiers. The program takes `pixel_values[batch, channels, height, width]` with a dynamic batch
    and the static image size of the config (what the checkpoint's image processor produces)."""
    coverage_representatives = ("vit",)

    tasks = ("image-classification",)
    tiny_config_base = "vision"
    tiny_config_extra = {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "patch_size": 8
    }

    def model_load_kwargs(self) -> Dict[str, Any]:
        return {}

    def supports_custom_sdpa(self, max_seq_len) -> bool:
        return False

    def max_positions(self) -> Optional[int]:
        return None

    def resolve_max_seq_len(self, requested) -> None:
        if requested is not None:
            raise ValueError(
                f"max_seq_len does not apply to {self.task} ({self.hf_config.model_type} takes images of a fixed "
                "size, not a sequence). Drop --max_seq_len."
            )
        return None

    def image_size(self) -> Tuple[int, int]:
        size = getattr(self.hf_config, "image_size", None) or DEFAULT_IMAGE_SIZE
        if isinstance(size, (list, tuple)):
            return int(size[0]), int(size[-1])
        return int(size), int(size)

    def wrapper_kwargs(self) -> Dict[str, Any]:
        return {"image_size": self.image_size(), "num_channels": int(getattr(self.hf_config, "num_channels", 3))}


@register_export_config("deit")
class DeiTExportConfig(ImageClassificationExportConfig):
    """DeiT: AutoModelForImageClassification picks the class from `config.architectures` (with or without the
    distillation head), so the tiny test config names one."""

    tiny_config_extra = dict(ImageClassificationExportConfig.tiny_config_extra, architectures=["DeiTForImageClassification"])


@register_export_config("mobilevit")
class MobileViTExportConfig(ImageClassificationExportConfig):
    """MobileViT: convolutions with transformer blocks over unfolded patches; downsamples by 32."""

    tiny_config_extra = {
        "hidden_sizes": [32, 48, 64],
        "neck_hidden_sizes": [8, 8, 16, 16, 24, 24, 32],
        "patch_size": 2,
    }


@register_export_config("convnext")
class ConvNextExportConfig(ImageClassificationExportConfig):
    """ConvNeXt: four stages of depthwise-convolution blocks."""

    tiny_config_extra = {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]}


@register_export_config("resnet")
class ResNetExportConfig(ImageClassificationExportConfig):
    """ResNet: its config names no image size; the program takes `DEFAULT_IMAGE_SIZE` unless the config says."""

    tiny_config_extra = {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "layer_type": "basic"}


@register_export_config("efficientnet")
class EfficientNetExportConfig(ImageClassificationExportConfig):
    """EfficientNet: `hidden_dim` must equal the top convolution's width, `round_filters(1280)`."""

    tiny_config_extra = {"width_coefficient": 0.25, "depth_coefficient": 0.1, "hidden_dim": 320}
