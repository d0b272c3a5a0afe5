"""
Does the safe policy's default observation normalization cost stock PPO on Pendulum-v1 only early? The robustness
map's ``PPO+SafeMlpPolicy+guard+KL-lr`` rows at the tuned learning rate (x1; every factor above trains the same runs,
the adaptive lr caps them alike), with ``normalize_observations`` on (the default) and off, at rl-zoo's full budget of
100,000 steps instead of the map's 49,152; the map's seeds and entropy coefficients, the same evaluation.

Usage: ``python -m benchmarks.observation_norm_budget [--out DIR] [--way WAY]`` (about 20 CPU-minutes; one row per
run appended to ``observation_norm_budget.jsonl``, runs already there skipped; one process per ``--way`` to use two
cores); ``--report`` prints the mean final return per way.
"""

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from benchmarks import reports, robustness_grid, suite, training, variants

TASK = "Pendulum-v1"
VARIANT = "PPO+SafeMlpPolicy+guard+KL-lr"
TIMESTEPS = 100_000
#: the safe policy's normalize_observations per way
WAYS = {"default": True, "raw observations": False}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=reports.RESULTS)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--way", choices=list(WAYS), action="append", help="only these ways (default: both)")
    args = parser.parse_args(argv)
    path = args.out / "observation_norm_budget.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if args.report:
        for way in WAYS:
            returns = [row["final_return"] for row in rows if row["way"] == way]
            mean = f"mean {statistics.mean(returns):.1f}, " if returns else ""
            print(f"{way}: {len(returns)} runs, {mean}runs {sorted(returns)}")
        return
    suite._init_worker()  # one torch thread, as the map's runs
    task = robustness_grid.TASKS[TASK]
    done = {(row["way"], row["ent_coef"], row["seed"]) for row in rows}
    for ent_coef in robustness_grid.ent_coefs(task, "full"):
        for seed in robustness_grid.SEEDS["full"]:
            for way, setting in WAYS.items():
                if (way, ent_coef, seed) in done or (args.way and way not in args.way):
                    continue
                # The map's cell at x1, trained for rl-zoo's budget
                config = robustness_grid.cell_config(task, 1.0, ent_coef, "full")
                variant = dataclasses.replace(variants.VARIANTS[VARIANT], normalize_observations=setting)
                row = training.train(variant, TASK, config, TIMESTEPS, seed, robustness_grid.EVAL_EPISODES["full"])
                row.update(way=way, ent_coef=ent_coef, timesteps=TIMESTEPS, commit=suite._git_commit())
                suite.write_jsonl(path, [row], mode="a")
                print(f"[budget] {way} ent_coef={ent_coef} seed={seed} final_return={row['final_return']:.1f}", flush=True)


if __name__ == "__main__":
    main()
