"""`optimum-cli executorch run`: generate text from an export directory, streamed to the terminal.

Argument parsing and printing only; the work is `ExecuTorchModelForCausalLM.generate_text`. Heavy imports
stay inside `run` (this module is imported on every `optimum-cli` start).
"""

import contextlib
import os
import sys
import tempfile
from argparse import ArgumentParser

from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

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


@contextlib.contextmanager
def _native_output_captured(enabled: bool):
    """Sends what native code writes to stdout/stderr (ExecuTorch's log lines) to a temporary file; yields
    a writer to the real stdout. The captured text is replayed on stderr if the block fails unexpectedly."""
    if not enabled:
        yield lambda text: (sys.stdout.write(text), sys.stdout.flush())
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 1)
        os.dup2(capture.fileno(), 2)
        try:
            yield lambda text: os.write(saved_out, text.encode("utf-8"))
        except BaseException as err:
            if not isinstance(err, (ValueError, TypeError, OSError)):  # not a usage error: show the native log
                os.dup2(saved_err, 2)
                capture.seek(0)
                sys.stderr.write(capture.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)


class ExecuTorchRunCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="run", help="Generate text with an exported text-generation program.")

    @staticmethod
    def parse_args(parser: ArgumentParser) -> None:
        parse_args_run(parser)

    def run(self) -> None:
        from ..modeling.causal_lm import ExecuTorchModelForCausalLM

        args = self.args
        try:
            with _native_output_captured(not args.verbose) as write:
                model = ExecuTorchModelForCausalLM.from_pretrained(args.model, engine=args.engine)
                _, stats = model.generate_text(
                    args.prompt,
                    max_new_tokens=args.max_new_tokens,
                    chat=args.chat,
                    on_token=write,
                    temperature=args.temperature,
                )
        except (ValueError, TypeError, OSError, RuntimeError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(stats, file=sys.stderr)


class ExecuTorchCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="executorch", help="Run programs exported with `optimum-cli export executorch`.")
    SUBCOMMANDS = (CommandInfo(name="run", help=ExecuTorchRunCommand.COMMAND.help, subcommand_class=ExecuTorchRunCommand),)
