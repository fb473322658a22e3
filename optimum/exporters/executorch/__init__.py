"""`optimum.exporters.executorch`: the module path huggingface/optimum-executorch gives `main_export`, kept so that
its users' code runs unchanged. The export side is `optimum_executorch.exporters` (imported on first use)."""

__all__ = ["main_export", "ExportOptions"]


def __getattr__(name):
    if name in __all__:
        from optimum_executorch import exporters

        return getattr(exporters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
