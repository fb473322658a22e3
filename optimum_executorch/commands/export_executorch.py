"""`optimum-cli export executorch`: argument parsing only; the work is `main_export`.

This module is imported on every `optimum-cli` start: it must stay light (argparse and optimum's base
command only). Everything heavy is imported inside `run`.
"""

from argparse import ArgumentParser

from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

from ..peer_options import ALIASES, PEER_OPTIONS, add_peer_arguments
from ..utils import suggest


def _reject_unknown_options(parser: ArgumentParser) -> None:
    """Makes `parser` fail on an unknown option with a "did you mean" hint (argparse only lists it)."""
    parse_known_args = parser.parse_known_args

    def checked(args=None, namespace=None):
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
            hints = "".join(suggest(a.split("=")[0], known, ALIASES) for a in extras if a.startswith("-"))
            parser.error(f"unrecognized arguments: {' '.join(extras)}.{hints}")
        return namespace, extras

    parser.parse_known_args = checked


def parse_args_executorch(parser: ArgumentParser) -> None:
    required = parser.add_argument_group("Required arguments")
    required.add_argument("-m", "--model", required=True, help="Local checkpoint directory or Hugging Face Hub id.")
    required.add_argument("-o", "--output_dir", required=True, help="Directory to write the export to.")

    optional = parser.add_argument_group("Optional arguments")
    optional.add_argument(
        "--task",
        default=None,
        help="Task to export for (default: inferred from the checkpoint): text-generation, "
        "feature-extraction, fill-mask, text-classification, token-classification, image-classification, "
        "text2text-generation, automatic-speech-recognition.",
    )
    optional.add_argument("--recipe", default="xnnpack", help="Backend recipe: xnnpack (default) or portable.")
    optional.add_argument(
        "--max_seq_len",
        type=int,
        default=None,
        help="Context of the program, prompt + generated tokens (default: min(2048, max_position_embeddings); "
        "encoders and encoder-decoders: 512). Not for image models.",
    )
    optional.add_argument("--dtype", default="float32", help="float32 (default), float16 or bfloat16.")
    optional.add_argument(
        "--gguf_file",
        default=None,
        help="A .gguf file in --model (or a path), dequantized on load; with --qlinear 8da4w its 4-bit tensors keep their grid.",
    )
    optional.add_argument("--revision", default=None, help="Hub revision: branch, tag or commit.")
    optional.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="Allow modeling code shipped with the checkpoint to run. Review that code first.",
    )
    optional.add_argument("--cache_dir", default=None, help="Hugging Face cache directory.")
    optional.add_argument("--token", default=None, help="Hugging Face Hub token (default: the one `hf auth login` saved).")
    optional.add_argument("--subfolder", default="", help="The checkpoint's folder inside --model (Hub repo or directory).")
    optional.add_argument("--local_files_only", action="store_true", help="Use the local Hugging Face cache only.")
    optional.add_argument("--force_download", action="store_true", help="Download the checkpoint again.")
    _add_quantization_options(optional)
    _add_program_options(optional)
    optional.add_argument("--overwrite", action="store_true", help="Replace a non-empty --output_dir.")
    optional.add_argument("-q", "--quiet", action="store_true", help="Print warnings and errors only.")
    optional.add_argument(
        "-v", "--verbose", action="store_true", help="Also show other libraries' warnings and log lines (hidden by default)."
    )
    add_peer_arguments(parser)
    _reject_unknown_options(parser)


def _add_quantization_options(optional) -> None:
    """--qlinear*, --qembedding*, --calibration_data: what torchao quantizes, and how."""
    optional.add_argument("--qlinear", default=None, help="Quantize linear layers: 8da4w or 8da8w (torchao).")
    optional.add_argument(
        "--qlinear_group_size",
        type=int,
        default=None,
        help="Group size of quantized linear weights: default 32 for 8da4w; 0 means per channel (8da8w).",
    )
    optional.add_argument(
        "--qlinear_8bit_layers",
        nargs="+",
        default=None,
        metavar="NAME",
        help="With --qlinear 8da4w: linear layers kept at 8da8w, by name (e.g. down_proj lm_head).",
    )
    optional.add_argument(
        "--qlinear_method",
        default="auto",
        help="How quantized linear weights are rounded: auto (default: GPTQ for the few 4-bit linears of a decoder "
        "that a GGUF Q4_0 / Q4_1 file does not put on a 4-bit grid, e.g. its LM head; round to nearest otherwise), "
        "rtn (round to nearest) or gptq (every linear calibrated on text; better quality, same program size and "
        "speed, longer export).",
    )
    optional.add_argument(
        "--calibration_data",
        default=None,
        metavar="TEXT_FILE",
        help="With --qlinear_method gptq: a UTF-8 text file to calibrate on (default: text the model samples itself).",
    )
    optional.add_argument("--qembedding", default=None, help="Quantize embeddings: 4w or 8w (torchao).")
    optional.add_argument(
        "--qembedding_group_size", type=int, default=0, help="Group size of quantized embedding weights (0: per row)."
    )


def _add_program_options(optional) -> None:
    """Attention, cache, weights file, dry run and extensions: the shape of the program itself."""
    optional.add_argument(
        "--no_custom_sdpa",
        dest="custom_sdpa",
        action="store_false",
        default=None,
        help="Use plain SDPA over a static cache instead of ExecuTorch's custom_sdpa/update_cache ops "
        "(which are the default for xnnpack where the model supports them).",
    )
    optional.add_argument(
        "--no_custom_kv_cache",
        dest="custom_kv_cache",
        action="store_false",
        default=None,
        help="With custom SDPA, update the KV cache with index_copy_ (a whole-cache copy a call) instead of "
        "ExecuTorch's in-place update_cache op. For comparisons; slower.",
    )
    weights = optional.add_mutually_exclusive_group()
    weights.add_argument(
        "--external_weights",
        dest="external_weights",
        action="store_true",
        default=None,
        help="Write the weights to model.ptd beside model.pte, each distinct tensor once (default: only when the "
        "embedding and the LM head share one weight, which model.pte alone would store twice).",
    )
    weights.add_argument(
        "--no_external_weights",
        dest="external_weights",
        action="store_false",
        default=None,
        help="Keep every weight inside model.pte, even a tied embedding / LM head (stored twice then).",
    )
    optional.add_argument(
        "--dry_run",
        action="store_true",
        help="Print the export plan (task, defaults and where each came from, methods and input shapes) without "
        "loading weights or writing anything.",
    )
    optional.add_argument(
        "--extension_modules",
        nargs="+",
        default=None,
        metavar="FILE.py",
        help="Python files defining ModelExtension classes for architectures outside this package.",
    )


class ExecuTorchExportCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="executorch", help="Export a Hugging Face model to an ExecuTorch program (.pte).")

    @staticmethod
    def parse_args(parser: ArgumentParser) -> None:
        parse_args_executorch(parser)

    def run(self) -> None:
        import logging
        import sys

        from ..console import captured_output
        from ..exporters import main_export

        options = {k: v for k, v in vars(self.args).items() if k not in ("func", "quiet", "verbose")}
        options = {k: v for k, v in options.items() if v is not None or k not in PEER_OPTIONS}
        level = logging.WARNING if self.args.quiet else logging.INFO
        try:
            # torch, ExecuTorch and torchao print dozens of warnings and native log lines during an export: shown
            # with -v, or when the export fails unexpectedly (they may hold the cause).
            with captured_output(not self.args.verbose, log_level=level):
                result = main_export(**options)
        except (ValueError, TypeError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        print(result.format() if self.args.dry_run else f"Exported to {result}")
