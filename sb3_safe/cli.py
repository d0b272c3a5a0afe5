"""
The ``sb3-safe`` command.

Each subcommand registers its parser in :func:`build_parser` and sets ``handler``, a function from the parsed
arguments to an exit status. ``train`` and ``enjoy`` also set ``passthrough``: the arguments they do not know
are rl_zoo3's, handed on as ``zoo_args``.
"""

import argparse
import os
import sys
from collections.abc import Sequence

from sb3_safe.doctor import (
    DEFAULT_MAX_CALLS,
    DEFAULT_MAX_ENTRY_BYTES,
    DEFAULT_MAX_OPCODES,
    DEFAULT_MAX_TOTAL_BYTES,
    DEFAULT_MAX_VALUES,
    STOCK_LOG_STD_RANGE,
    WEIGHT_LIMIT,
    SizeLimits,
    run_doctor,
)

#: exit status for bad input to ``train`` / ``enjoy`` (argparse's for usage errors)
EXIT_USAGE = 2
#: exit status when the reader of the output stopped reading before the end (as the Python docs advise)
EXIT_CLOSED_PIPE = 1
#: exit status after Ctrl-C (SIGINT), as a shell reports a command the signal ended: 128 + 2
EXIT_INTERRUPTED = 130
_MIB = 2**20


def _doctor(args: argparse.Namespace) -> int:
    limits = SizeLimits(
        entry=int(args.max_entry_mb * _MIB),
        total=int(args.max_total_mb * _MIB),
        values=args.max_values,
        calls=args.max_calls,
        opcodes=args.max_opcodes,
    )
    from sb3_safe.loading.building import algorithms

    status = run_doctor(
        args.path,
        top=args.top,
        as_json=args.json,
        limits=limits,
        trusted_modules=tuple(args.trust),
        dis=args.dis,
        algorithm=None if args.algo is None else algorithms()[args.algo],
    )
    # The status still says what was found when the reader stopped reading (doctor ... | head -1)
    _flush_stdout()
    return status


def _positive_count(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if count <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return count


def _positive_megabytes(value: str) -> float:
    try:
        megabytes = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, got {value!r}") from None
    if not 0 < megabytes < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of MiB, got {value!r}")
    return megabytes


def _algorithm_names() -> list[str]:
    from sb3_safe.loading.building import algorithms

    return list(algorithms())


def _add_doctor(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check a saved SB3 model for code it would run, NaN / inf and runaway magnitudes, without loading it",
        description=(
            "Read any SB3 model zip as untrusted input, without loading it and without an environment. "
            "Nothing of the file runs: its pickles are read opcode by opcode, and every global they would import "
            "or call is compared with what SB3 / sb3-contrib / sb3-safe model files hold; only then are data's items "
            "built by the restricted unpickler sb3_safe.load uses, and the tensors loaded with "
            "torch.load(weights_only=True), all within one budget for the file; then the model is built from what was "
            "read as sb3_safe.load builds it (SB3's load, no code of the file; its tensors no larger than twice the "
            "file, within the budget), so that a file doctor calls healthy loads. Reports code the file would run, "
            "non-finite tensors by name, the log-std range and the largest weights. Unhealthy besides: a log-std outside the "
            "policy's log_std_range (sb3-safe's policies) or outside "
            f"[{STOCK_LOG_STD_RANGE[0]:g}, {STOCK_LOG_STD_RANGE[1]:g}] (other policies), a policy weight with "
            f"|value| > {WEIGHT_LIMIT:g} (the reasons: sb3_safe.doctor). "
            "It does not make SB3's load safe: load still unpickles the file. "
            "Exit status: 0 healthy; 1 unhealthy (code beyond what SB3 model files need, a lambda learning rate "
            "stored with its code included, NaN / inf, values beyond the limits); 2 not a readable SB3 model (not "
            "a zip, damaged, an entry missing or of the wrong shape, beyond the size limits, a directory, a model "
            "SB3 cannot build from it), with one line on stderr: the cause sb3_safe.load refuses it for."
        ),
    )
    parser.add_argument(
        "path",
        help="the model .zip (.zip may be left out, as for SB3's load), or a pickle SB3 writes: vecnormalize.pkl, a "
        "replay buffer (its globals are checked)",
    )
    parser.add_argument("--top", type=int, default=5, help="how many of the largest weights to list (default: 5)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--max-entry-mb",
        type=_positive_megabytes,
        default=DEFAULT_MAX_ENTRY_BYTES / _MIB,
        help="refuse an entry larger than this uncompressed, in MiB, before reading it "
        f"(default: {DEFAULT_MAX_ENTRY_BYTES // _MIB}, 40 times an Atari CNN policy's optimizer state)",
    )
    parser.add_argument(
        "--max-total-mb",
        type=_positive_megabytes,
        default=DEFAULT_MAX_TOTAL_BYTES / _MIB,
        help="refuse a file that makes its reader hold more than this, in MiB: every archive's entries, nested ones "
        f"included, and the pickles of data (default: {DEFAULT_MAX_TOTAL_BYTES // _MIB})",
    )
    for flag, default, what in (
        ("--max-values", DEFAULT_MAX_VALUES, "values searched for globals in the arguments of the file's calls"),
        ("--max-calls", DEFAULT_MAX_CALLS, "calls the file's pickles make to build objects"),
        ("--max-opcodes", DEFAULT_MAX_OPCODES, "opcodes of all the file's pickles"),
    ):
        parser.add_argument(
            flag, type=_positive_count, default=default, help=f"the file's budget of {what} (default: {default})"
        )
    parser.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module (or package) of your own whose classes the model may name, e.g. a features extractor "
        "(repeatable; never imported by doctor)",
    )
    parser.add_argument(
        "--algo",
        metavar="CLASS",
        choices=_algorithm_names(),
        help="the algorithm whose load builds the model, as sb3_safe.load(CLASS, ...) (default: the one whose saved "
        f"attributes the file's data holds); one of {', '.join(_algorithm_names())}",
    )
    parser.add_argument(
        "--dis",
        metavar="ENTRY",
        help="print the opcodes of one pickle instead of the report (pickletools, nothing loaded): "
        "'data[\"KEY\"]' for an item of data, or a .pth entry such as policy.pth",
    )
    parser.set_defaults(handler=_doctor)


def _fail(command: str, message: str) -> int:
    print(f"sb3-safe {command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _zoo(args: argparse.Namespace) -> int:
    if args.help:
        print(args.format_help())
    try:
        from sb3_safe import zoo
        from sb3_safe.zoo.command import print_zoo_help
    except ImportError as error:
        return _fail(args.command, f"needs rl_zoo3 and optuna, pip install 'sb3-safe[zoo]' ({error})")
    from sb3_safe.loading import RefusedFileError

    if args.help:
        # Then rl_zoo3's own options, and nothing else
        print_zoo_help(args.command)
        return 0
    try:
        if args.command == "enjoy":
            zoo.enjoy(args.zoo_args, trust=args.trust, trust_folder=args.trust_folder)
            return 0
        report = zoo.train(args.zoo_args, report=not args.no_report, trust=args.trust)
    except (zoo.ZooUsageError, RefusedFileError) as error:
        return _fail(args.command, str(error))
    except zoo.TrainingInterrupted as interruption:
        sys.stdout.flush()
        print(f"sb3-safe {args.command}: {interruption}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if report is not None:
        print(report.summary())
    return 0


def _add_zoo_command(
    subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]", name: str, help: str, description: str
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        # -h also shows rl_zoo3's options; no abbreviations, so that rl_zoo3's options never match ours
        add_help=False,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and rl_zoo3's options, then exit")
    parser.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module (or package) of your own whose classes the loaded model (and enjoy's run folder, as wrappers) "
        "may name, e.g. a features extractor (repeatable; as doctor's)",
    )
    parser.set_defaults(handler=_zoo, passthrough=True, format_help=parser.format_help)
    return parser


def _add_train(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = _add_zoo_command(
        subparsers,
        "train",
        help="train with rl_zoo3 (every rl_zoo3.train option), kl_ppo and safe_a2c included",
        description=(
            "Run rl-baselines3-zoo's trainer (python -m rl_zoo3.train) with sb3-safe's algorithms registered:\n"
            "  kl_ppo    KLAdaptivePPO\n"
            "  safe_a2c  SafeA2C\n"
            "Every rl_zoo3.train option is accepted (listed below). Without --conf-file, the algorithms with a\n"
            "packaged configuration (kl_ppo, safe_a2c, ppo, a2c, ppo_lstm) use it: sb3-safe's zoo_configs/<algo>.yml,\n"
            "rl-zoo's tuned values with the safe policies and the guard; the other algorithms use rl_zoo3's own.\n"
            "The run's first line names the configuration file, its entry and whether the guard is on.\n"
            "After training (not -optimize) the saved model is evaluated for --eval-episodes episodes and\n"
            "the training returns are plotted to learning_curve.png next to it.\n"
            "A model continued with -i (and its vecnormalize.pkl, replay_buffer.pkl) is loaded as sb3_safe.load\n"
            "loads it: refused if its pickles name or call more than SB3 files need (--trust MODULE: your own).\n"
            "Exit status: 0 done, 2 bad input (an option, the configuration file, a hyperparameter, the trial\n"
            "of --trial-id, a refused model, an environment whose package is missing), with one line on stderr,\n"
            "before training starts, leaving no empty folder behind."
        ),
    )
    parser.add_argument("--no-report", action="store_true", help="skip the final evaluation and the learning-curve plot")


def _add_enjoy(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = _add_zoo_command(
        subparsers,
        "enjoy",
        help="run a trained agent with rl_zoo3's enjoy (every rl_zoo3.enjoy option)",
        description=(
            "Run rl-baselines3-zoo's enjoy (python -m rl_zoo3.enjoy) with kl_ppo and safe_a2c registered:\n"
            "load the model that `sb3-safe train` saved in the log folder (-f) and run or render it.\n"
            "The run folder is read as data, nothing of it runs: its config.yml and args.yml are read with a YAML\n"
            "loader that builds only what rl-zoo writes (plain values, OrderedDict, tuples, classes of the SB3\n"
            "family), the normalize field is parsed as a literal instead of evaluated, the env_wrapper and\n"
            "vec_env_wrapper classes must be of gymnasium, SB3, sb3-contrib, rl_zoo3 or sb3-safe; the model and\n"
            "its vecnormalize.pkl are loaded as sb3_safe.load loads them: refused if their pickles name or call\n"
            "more than SB3 files need. --trust MODULE: your own classes, in the model and as wrappers.\n"
            "--trust-folder: a folder of your own, read and run as rl_zoo3 does.\n"
            "Every rl_zoo3.enjoy option is accepted (listed below).\n"
            "Exit status: 0 done, 2 bad input (an option, no saved model where -f points, a refused model or run\n"
            "folder file), with one line on stderr."
        ),
    )
    parser.add_argument(
        "--trust-folder",
        action="store_true",
        help="the run folder is your own: read its config.yml and args.yml with yaml's unsafe loader, evaluate its "
        "normalize field and load its model and vecnormalize.pkl with SB3's own load, as rl_zoo3 does",
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``sb3-safe`` command and its subcommands."""
    from sb3_safe import __version__

    parser = argparse.ArgumentParser(prog="sb3-safe", description="Numerically safe RL with Stable-Baselines3.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", required=True)
    _add_doctor(subparsers)
    _add_train(subparsers)
    _add_enjoy(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``sb3-safe`` command.

    :param argv: the arguments after the program name (default: ``sys.argv[1:]``)
    :return: the exit status
    """
    try:
        parser = build_parser()
        args, zoo_args = parser.parse_known_args(argv)
        if not getattr(args, "passthrough", False):
            # Parsed again, strictly: argparse's usual error for unknown arguments
            args = parser.parse_args(argv)
        args.zoo_args = zoo_args
        return args.handler(args)
    except BrokenPipeError:
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt:
        # Ctrl-C outside training (which train reports itself): no traceback
        print("sb3-safe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        # Also after argparse's -h and --version (SystemExit)
        _flush_stdout()


def _flush_stdout() -> None:
    # Here, not at exit, so that a closed pipe is handled
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped reading (sb3-safe train --help | head -1). As the Python docs advise: the rest of the
        # output goes to devnull, so that the interpreter's flush at exit cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
