"""
The ``sb3-safe`` command.

Each subcommand registers its parser in :func:`build_parser` and sets ``handler``, a function from the parsed
arguments to an exit status, so new subcommands (``train`` and ``enjoy`` through rl_zoo3) slot in beside
``doctor``.
"""

import argparse
import sys
from collections.abc import Sequence

from sb3_safe.doctor import run_doctor


def _doctor(args: argparse.Namespace) -> int:
    return run_doctor(args.path, top=args.top, as_json=args.json)


def _add_doctor(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check a saved SB3 model for NaN / inf, without its environment",
        description=(
            "Load any SB3 model zip without an environment and report non-finite tensors by name, "
            "the log-std range and the largest weights. "
            "Exit status: 0 healthy, 1 non-finite values found, 2 not a readable SB3 model."
        ),
    )
    parser.add_argument("path", help="the model .zip")
    parser.add_argument("--top", type=int, default=5, help="how many of the largest weights to list (default: 5)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=_doctor)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``sb3-safe`` command and its subcommands."""
    from sb3_safe import __version__

    parser = argparse.ArgumentParser(prog="sb3-safe", description="Numerically safe RL with Stable-Baselines3.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", required=True)
    _add_doctor(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``sb3-safe`` command.

    :param argv: the arguments after the program name (default: ``sys.argv[1:]``)
    :return: the exit status
    """
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
