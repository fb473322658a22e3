"""`optimum.executorch`: the public API of optimum-executorch under the optimum namespace (lazy)."""

import optimum_executorch as _package

__version__ = _package.__version__
__all__ = list(_package.__all__)


def __getattr__(name):
    return getattr(_package, name)


def __dir__():
    return sorted(__all__)
