"""
sb3-safe benchmark harness: one benchmark per claim of the README (its results table names each row's), stock SB3 vs
sb3-safe in the same run.

Usage::

    python -m benchmarks run NAME|all [--quick | --size tiny|quick|full] [--jobs N] [--out DIR]
        [--modules MODULE ...] [--mutants]
    python -m benchmarks report NAME|all [--out DIR]  # from its JSONL

Each suite writes ``<out>/<suite>.jsonl`` (a meta row with command, machine, versions and budget, then one row
per run), ``<out>/<suite>.md`` and PNG plots. Default out: ``benchmarks/results``.
Wall time with ``--jobs 2`` on the 2 shared CPU cores of the committed results: quick 2.5 min for all three
suites (measured before the sb3-contrib families were added, quiet machine); full 35.9 min (stress), 39.1 min
(learning), 40.6 min (overhead) for 0.2.0's variants, as written in each report. With other jobs on the machine
(load 6 on 2 cores was seen here) up to three times that. The robustness suite (not in those figures) is the
longest: its full size took 4.7 h wall with ``--jobs 2`` (summed over the four runs it was resumed in;
see ``benchmarks/robustness.py``), so ``run all`` at full size takes hours; it is resumable: rerun the same command
(same ``--out``) after an interruption and it runs only the jobs whose rows are not in its JSONL yet. The critic
suite (24 runs) took 5.1 min on free cores.
"""

import argparse
import os
import sys
from pathlib import Path
from types import ModuleType

from benchmarks import (
    adaptive_lr,
    critic,
    drop_in,
    fault_mutants,
    faults,
    hostile,
    learning,
    mutation,
    no_stall,
    overhead,
    recipe,
    reports,
    reward_scale,
    robustness,
    secure_load,
    stress,
    suite,
)

SUITES: dict[str, ModuleType] = {
    "overhead": overhead,
    "learning": learning,
    "stress": stress,
    "robustness": robustness,
    "adaptive_lr": adaptive_lr,
    "critic": critic,
    "faults": faults,
    "mutation": mutation,
    "reward_scale": reward_scale,
    "no_stall": no_stall,
    "hostile": hostile,
    "drop_in": drop_in,
    "recipe": recipe,
    "secure_load": secure_load,
}


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``run`` or ``report``, a benchmark of :data:`SUITES` (or ``all``), its size and output."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("suite", choices=(*SUITES, "all"))
    parser.add_argument("--size", choices=suite.SIZES, default="full", help="budget (default full)")
    parser.add_argument("--quick", action="store_const", const="quick", dest="size", help="same as --size quick")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes (default: cores)")
    parser.add_argument("--out", type=Path, default=reports.RESULTS, help="results folder")
    parser.add_argument(
        "--modules", nargs="+", metavar="MODULE", help="mutation only: the modules to mutate (a path or its end)"
    )
    parser.add_argument(
        "--mutants",
        action="store_true",
        help="faults only: run the suite against re-introduced defects and module mutants (benchmarks/fault_mutants.py)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run or report the suites."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mutants and args.suite != "faults":
        parser.error("--mutants runs the faults suite against mutants: run faults --mutants")
    if args.modules and args.suite != "mutation" and not args.mutants:
        parser.error("--modules selects the modules of the mutation suite (or of faults --mutants) only")
    args.out.mkdir(parents=True, exist_ok=True)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    for name in SUITES if args.suite == "all" else (args.suite,):
        module = SUITES[name]
        if args.mutants:
            name, module = "faults_mutants", fault_mutants
        if args.action == "run":
            # Each suite's own command line, so every report names the command that produced it
            command = "python -m benchmarks " + argv_text.replace(" all", f" {name}", 1)
            jobs = module.jobs(args.size, args.modules) if args.modules else module.jobs(args.size)
            suite.run_suite(
                name,
                args.out,
                command,
                args.size,
                # A suite may allow fewer processes (mutation: one work copy, so one at a time)
                min(args.jobs, len(jobs), getattr(module, "MAX_JOBS", len(jobs))),
                module.run_job,
                jobs,
                module.budget(args.size),
                # A suite that names its jobs' keys is resumable: a rerun with the same --out continues it
                job_key=getattr(module, "job_key", None),
                row_key=getattr(module, "row_key", None),
                # A suite whose row keys say what was measured keeps rows of every size in one JSONL
                any_size=getattr(module, "ANY_SIZE", False),
            )
        module.report(args.out)


if __name__ == "__main__":
    main()
