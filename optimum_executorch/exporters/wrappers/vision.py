"""`ImageClassifierExportableModule`: an image classifier with one tensor out, for `torch.export`.

The exported `forward(pixel_values[batch, channels, height, width])` has a dynamic batch and the static
image size of the model, and returns `logits[batch, num_labels]`.
"""

from typing import Any, Dict, Sequence, Tuple

import torch

from ... import contract

# The batch is dynamic from 1; the example must be larger than 1, or torch.export specializes it.
EXAMPLE_BATCH = 2


class ImageClassifierExportableModule(torch.nn.Module):
    """Wraps a transformers `*ForImageClassification` model.

    Args:
        model: the eager transformers model (eval mode).
        max_seq_len: unused (images have no sequence); accepted so every task's wrapper is built alike.
        custom_sdpa: must be False.
        image_size: `(height, width)` of the images the program takes.
        num_channels: channels of the images (3 for RGB).
        max_batch_size: the largest batch the program accepts.
    """

    method_names = ("forward",)
    input_names = ("pixel_values",)

    def __init__(
        self,
        model,
        max_seq_len=None,
        custom_sdpa: bool = False,
        image_size: Sequence[int] = (224, 224),
        num_channels: int = 3,
        max_batch_size: int = 64,
    ):
        super().__init__()
        if custom_sdpa:
            raise ValueError("custom_sdpa is for decoder models, not image classifiers.")
        self.model = model
        self.image_size = tuple(int(s) for s in image_size)
        self.num_channels = int(num_channels)
        self.max_batch_size = max_batch_size

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).logits

    def example_inputs(self, batch: int = EXAMPLE_BATCH) -> Dict[str, Tuple[Any, ...]]:
        dtype = next(self.model.parameters()).dtype
        return {"forward": (torch.randn((batch, self.num_channels, *self.image_size), dtype=dtype),)}

    @classmethod
    def input_plan(cls, max_seq_len=None, image_size=(224, 224), num_channels=3, max_batch_size=64, dtype="float32", **kwargs):
        """The inputs of `forward`, for a dry run: name, dtype, shape (dynamic dimensions as ranges)."""
        shape = [f"batch 1..{max_batch_size}", num_channels, *image_size]
        return {"forward": [{"name": "pixel_values", "dtype": dtype, "shape": shape}]}

    def dynamic_shapes(self) -> Dict[str, Any]:
        return {"forward": {"pixel_values": {0: torch.export.Dim("batch", min=1, max=self.max_batch_size)}}}

    def metadata(self, generation_config=None) -> Dict[str, Any]:
        return {
            contract.MAX_BATCH_SIZE: self.max_batch_size,
            contract.NUM_CHANNELS: self.num_channels,
            contract.IMAGE_HEIGHT: self.image_size[0],
            contract.IMAGE_WIDTH: self.image_size[1],
            contract.NUM_LABELS: int(self.model.config.num_labels),
        }
