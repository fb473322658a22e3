"""Registers `optimum-cli export executorch` and `optimum-cli executorch run|inspect` (kept light: no heavy imports)."""

from optimum.commands.export.base import ExportCommand
from optimum_executorch.commands.export_executorch import ExecuTorchExportCommand
from optimum_executorch.commands.executorch_command import ExecuTorchCommand

REGISTER_COMMANDS = [(ExecuTorchExportCommand, ExportCommand), ExecuTorchCommand]
