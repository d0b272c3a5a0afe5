"""
KLAdaptivePPO's ``normalize_value`` with and without SB3's reward normalization: the robustness map's Acrobot-v1
cells (rl-zoo's PPO entry, VecNormalize, 49,152 steps, guard + adaptive lr, ent_coef 0), each run four ways:
``normalize_value`` off / on x ``VecNormalize(norm_reward=True)`` (the entry's) / ``norm_reward=False`` (observations
still normalized). Measures whether PopArt's value normalization and VecNormalize's reward normalization get in each
other's way, the question behind ``normalize_value``'s default. Resumable: rows already in the JSONL are skipped.

Usage::

    python -m benchmarks.value_norm_vecnormalize 1,10 0,1,2,3,4,5   # learning-rate factors, seeds
"""

import dataclasses
import json
import sys
import time
from typing import Any

import torch as th
from stable_baselines3.common import vec_env

from benchmarks import reports, robustness_grid, suite, training, variants

OUT = reports.RESULTS / "value_norm_vecnormalize.jsonl"
TASK = "Acrobot-v1"
VARIANT = "KLAdaptivePPO+guard+KL-lr"


def _vec_normalize_with(norm_reward: bool) -> type:
    """VecNormalize with ``norm_reward`` by default (the evaluation env still passes its own False)."""

    class VecNormalize(vec_env.VecNormalize):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("norm_reward", norm_reward)
            super().__init__(*args, **kwargs)

    return VecNormalize


def run(factor: float, seed: int, normalize_value: bool, norm_reward: bool) -> dict[str, Any]:
    """One run of the map's cell (``factor``, ent_coef 0) with the two normalizations as given."""
    task = robustness_grid.TASKS[TASK]
    config = robustness_grid.cell_config(task, factor, 0.0, "full")
    variant = dataclasses.replace(variants.VARIANTS[VARIANT], normalize_value=normalize_value)
    stock = vec_env.VecNormalize
    # training.make_env imports VecNormalize from the package when it runs: swapped there for this run only
    vec_env.VecNormalize = _vec_normalize_with(norm_reward)  # type: ignore[misc]
    try:
        row = training.train(variant, TASK, config, task.timesteps["full"], seed, robustness_grid.EVAL_EPISODES["full"])
    finally:
        vec_env.VecNormalize = stock  # type: ignore[misc]
    return dict(row, kind="run", factor=factor, normalize_value=normalize_value, norm_reward=norm_reward)


def main(factors: list[float], seeds: list[int]) -> None:
    th.set_num_threads(1)  # as the suites' workers
    done = set()
    if OUT.exists():
        done = {(r["factor"], r["seed"], r["normalize_value"], r["norm_reward"]) for r in suite.read_jsonl(OUT)[1]}
    else:
        meta = dict(kind="meta", command="python -m benchmarks.value_norm_vecnormalize " + " ".join(sys.argv[1:]))
        suite.write_jsonl(OUT, [dict(meta, **suite.machine_info())])
    for factor in factors:
        for seed in seeds:
            for norm_reward in (True, False):
                for normalize_value in (False, True):
                    if (factor, seed, normalize_value, norm_reward) in done:
                        continue
                    row = run(factor, seed, normalize_value, norm_reward)
                    suite.write_jsonl(OUT, [dict(row, finished_at=time.time())], mode="a")
                    shown = ("factor", "seed", "normalize_value", "norm_reward", "final_return")
                    print(json.dumps({key: row[key] for key in shown}), flush=True)


if __name__ == "__main__":
    main([float(f) for f in sys.argv[1].split(",")], [int(s) for s in sys.argv[2].split(",")])
