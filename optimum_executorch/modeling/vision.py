"""Runtime class of image-classification programs.

`ExecuTorchModelForImageClassification.forward(pixel_values)` returns `ImageClassifierOutput(logits=...)`, and
`transformers.pipeline("image-classification", model=et_model, image_processor=...)` works on it. The program
takes a dynamic batch of images of one static size (see `exporters/wrappers/vision.py`).
"""

from typing import Optional

import torch
from transformers.modeling_outputs import ImageClassifierOutput

from .. import contract
from .base import ExecuTorchModel, register_for_pipelines
from .checks import one_call_at_a_time
from .threads import exclusive_cores


@register_for_pipelines
class ExecuTorchModelForImageClassification(ExecuTorchModel):
    """`image-classification`: `forward(pixel_values[batch, channels, height, width])` returns
    `ImageClassifierOutput(logits=[batch, num_labels])`."""

    auto_model_class = "AutoModelForImageClassification"
    task = "image-classification"
    main_input_name = "pixel_values"
    input_modalities = ("image",)

    def __init__(self, program, config, model_save_dir, manifest=None):
        super().__init__(program, config, model_save_dir, manifest)
        self._forward_method = self.load_method("forward")
        self.max_batch_size = int(self.read_constant(contract.MAX_BATCH_SIZE, 1))
        self.image_shape = tuple(
            int(self.read_constant(name, default))
            for name, default in ((contract.NUM_CHANNELS, 3), (contract.IMAGE_HEIGHT, 224), (contract.IMAGE_WIDTH, 224))
        )

    @classmethod
    def can_generate(cls) -> bool:
        return False

    def _check(self, pixel_values) -> None:
        expected = f"[batch, {', '.join(str(d) for d in self.image_shape)}]"
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
            got = f", got shape {tuple(pixel_values.shape)}" if isinstance(pixel_values, torch.Tensor) else ""
            raise ValueError(
                f"{type(self).__name__} takes pixel_values, a 4D float tensor {expected}{got}. Prepare images with the "
                "image processor exported with the model."
            )
        if not pixel_values.is_floating_point():
            raise ValueError(f"pixel_values must be a float tensor, got {pixel_values.dtype}.")
        if tuple(pixel_values.shape[1:]) != self.image_shape or pixel_values.shape[0] == 0:
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; this program takes {expected} (a static image "
                "size). Use the image processor exported with the model, which resizes to that size."
            )

    @one_call_at_a_time
    def forward(self, pixel_values: Optional[torch.Tensor] = None, **kwargs) -> ImageClassifierOutput:
        """Runs the program.

        Args:
            pixel_values: `[batch, channels, height, width]` images as the exported image processor prepares them.

        Returns:
            `ImageClassifierOutput(logits=[batch, num_labels])`.
        """
        if pixel_values is None:
            raise ValueError(
                f"{type(self).__name__} takes pixel_values (images), got {sorted(kwargs) or 'nothing'}. Prepare "
                "images with the image processor exported with the model."
            )
        self._check(pixel_values)
        pixel_values = pixel_values.to(device="cpu", dtype=self.dtype).contiguous()
        logits = []
        with exclusive_cores():
            for start in range(0, pixel_values.shape[0], self.max_batch_size):
                batch = pixel_values[start : start + self.max_batch_size].contiguous()
                logits.append(self._forward_method.execute([batch])[0])
        return ImageClassifierOutput(logits=torch.cat(logits))
