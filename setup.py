"""Packaging for optimum-executorch.

The dependency set is pinned to the one that is known to work together (see README.md). Install torch
first, pinned, so that pip takes the CPU wheel instead of a multi-GB CUDA build:

    pip install torch==2.13.0 && pip install -e ".[dev]"
"""

import re
from pathlib import Path

from setuptools import find_namespace_packages, setup

VERSION = re.search(
    r'__version__ = "([^"]+)"', Path(__file__).with_name("optimum_executorch").joinpath("version.py").read_text()
).group(1)

INSTALL_REQUIRES = [
    "torch==2.13.0",
    "executorch==1.5.1",
    "torchao>=0.18.0,<0.19",
    "transformers==5.23.0",
    "optimum==2.3.0",
    "huggingface_hub>=1.0",
    "accelerate>=1.10",
    "datasets>=4.0",
    "gguf>=0.17",
    "safetensors",
    "psutil",
    "pillow>=10",  # images for the image-classification processors and pipeline
]

EXTRAS_REQUIRE = {
    "dev": ["pytest>=8", "pytest-timeout", "psutil"],
    "quality": ["ruff"],
}

setup(
    name="optimum-executorch",
    version=VERSION,
    description="Export Hugging Face models to ExecuTorch (.pte) and run them with the transformers API",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_namespace_packages(include=["optimum_executorch*", "optimum.executorch", "optimum.exporters.executorch", "optimum.commands.register"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    include_package_data=True,
    zip_safe=False,
)
