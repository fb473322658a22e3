"""`optimum-cli executorch run` (generate text from an export directory, streamed to the terminal) and
`optimum-cli executorch inspect` (describe an export).

Argument parsing and printing only; the work is `ExecuTorchModelForCausalLM.generate_text`. Heavy imports
stay inside `run` (this module is imported on every `optimum-cli` start).
"""

import logging
import sys
from argparse import ArgumentParser

from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

from ..console import captured_output, not_native
from .export_executorch import _reject_unknown_options


def parse_args_run(parser: ArgumentParser) -> None:
    parser.add_argument("-m", "--model", required=True, help="An export directory (or a Hub repo holding one).")
    parser.add_argument("-p", "--prompt", required=True, help="The prompt text (the user message with --chat).")
    parser.add_argument("--chat", action="store_true", help="Wrap the prompt in the model's chat template.")
    parser.add_argument("--max_new_tokens", type=int, default=128, help="Most tokens to generate (default 128).")
    parser.add_argument(
        "--engine",
        default="python",
        choices=["python", "runner"],
        help="python: transformers generate over the program (default); runner: ExecuTorch's C++ TextLLMRunner.",
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 for greedy decoding (default).")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="Show the native runtime's own log lines (hidden by default)."
    )
    _reject_unknown_options(parser)


class ExecuTorchRunCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="run", help="Generate text with an exported text-generation program.")

    @staticmethod
    def parse_args(parser: ArgumentParser) -> None:
        parse_args_run(parser)

    def run(self) -> None:
        from ..modeling.causal_lm import ExecuTorchModelForCausalLM

        args = self.args
        try:
            with captured_output(not args.verbose, keep=not_native, log_level=logging.WARNING) as write:
                model = ExecuTorchModelForCausalLM.from_pretrained(args.model, engine=args.engine)
                _, stats = model.generate_text(
                    args.prompt,
                    max_new_tokens=args.max_new_tokens,
                    chat=args.chat,
                    on_token=write,
                    temperature=args.temperature,
                )
                write("\n")
        except (ValueError, TypeError, OSError, RuntimeError, ImportError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(stats, file=sys.stderr)


class ExecuTorchInspectCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(
        name="inspect",
        help="Describe an export (files, settings, methods with shapes, metadata, delegation), or check whether a "
        "checkpoint can be exported (tiny dry-run export, module classes, weight prefixes, starter extension).",
    )

    @staticmethod
    def parse_args(parser: ArgumentParser) -> None:
        parser.add_argument(
            "-m", "--model", required=True, help="An export directory or .pte file; or a checkpoint directory or Hub id."
        )
        parser.add_argument("--json", action="store_true", help="Print the description as JSON.")
        parser.add_argument("--task", default=None, help="Checkpoints: the task to check (default: inferred).")
        parser.add_argument("--trust_remote_code", action="store_true", help="Checkpoints: allow the repo's own code.")
        parser.add_argument("--extension_modules", nargs="+", default=None, metavar="FILE.py", help="Checkpoints: extensions.")
        _reject_unknown_options(parser)

    def run(self) -> None:
        import json
        from pathlib import Path

        path = Path(self.args.model)
        is_export = path.suffix == ".pte" or (path / "model.pte").is_file()
        if not path.exists() and (path.suffix == ".pte" or str(path).startswith((".", "/", "~"))):
            print(
                f"error: '{path}' does not exist. Pass an export directory or .pte file, or a checkpoint directory "
                "or Hub id to check whether it can be exported.",
                file=sys.stderr,
            )
            sys.exit(2)
        if path.is_file() and path.suffix != ".pte":
            print(
                f"error: '{path}' is a file but not an ExecuTorch program (.pte). Pass an export directory or a .pte "
                "file, or a checkpoint directory or Hub id to check whether it can be exported.",
                file=sys.stderr,
            )
            sys.exit(2)
        try:
            if is_export:
                from ..modeling.program_info import describe_export, format_description

                with captured_output(keep=not_native, log_level=logging.WARNING):
                    description = describe_export(path)
                print(json.dumps(description, indent=2) if self.args.json else format_description(description))
                return
            from ..exporters.inspector import format_report, inspect_checkpoint, report_json

            report = inspect_checkpoint(
                self.args.model, self.args.task, self.args.trust_remote_code, self.args.extension_modules
            )
        except (ValueError, TypeError, OSError, RuntimeError, ImportError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(report_json(report) if self.args.json else format_report(report))


class ExecuTorchCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="executorch", help="Run or inspect programs exported with `optimum-cli export executorch`.")
    SUBCOMMANDS = (
        CommandInfo(name="run", help=ExecuTorchRunCommand.COMMAND.help, subcommand_class=ExecuTorchRunCommand),
        CommandInfo(name="inspect", help=ExecuTorchInspectCommand.COMMAND.help, subcommand_class=ExecuTorchInspectCommand),
    )
