"""Registers `optimum-cli export executorch` (kept light: no heavy imports here)."""

from optimum.commands.export.base import ExportCommand
from optimum_executorch.commands.export_executorch import ExecuTorchExportCommand

REGISTER_COMMANDS = [(ExecuTorchExportCommand, ExportCommand)]
