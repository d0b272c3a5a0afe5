"""
Would normalizing the observations cost the learning suite's parity? The learning suite's tasks that train without
``VecNormalize`` (rl-zoo's entries, the maskable example), its budgets and seeds, the recommended stack (safe
algorithm or safe policy + adaptive lr, as the suite's "+KL-lr" variants) in ``VecNormalize(norm_obs=True,
norm_reward=False)``: the observations normalized, the rewards left to ``normalize_value``. Compared with the suite's
own rows of stock SB3 and of the same stack without it (``learning.jsonl``). The measurement before any default that
normalizes observations (the stress suite's misses, ``stress.md``, thirteenth session). Resumable: rows already in the
JSONL are skipped.

Usage::

    python -m benchmarks.observation_norm            # train what is missing
    python -m benchmarks.observation_norm --summary  # print the comparison
"""

import dataclasses
import json
import sys
import time
from typing import Any

import torch as th

from benchmarks import configs, learning, reports, suite, training, variants

OUT = reports.RESULTS / "observation_norm.jsonl"
#: (family, env, stock variant, the stack's variant) of each learning-suite task without VecNormalize
TASKS = (
    ("PPO", "CartPole-v1", "PPO", "KLAdaptivePPO+KL-lr"),
    ("PPO", "Pendulum-v1", "PPO", "KLAdaptivePPO+KL-lr"),
    ("A2C", "CartPole-v1", "A2C", "SafeA2C+KL-lr"),
    ("MaskablePPO", configs.MACHINE_SCHEDULING, "MaskablePPO", "MaskablePPO+SafeMaskableMlpPolicy+KL-lr"),
)


def run(family: str, env_id: str, variant: str, seed: int) -> dict[str, Any]:
    """One learning-suite run of ``variant`` with its observations (only) normalized."""
    config = configs.family_config(family, env_id)
    if config.normalize:
        raise ValueError(f"{family} {env_id} normalizes already: not a task of this measurement")
    config = dataclasses.replace(config, normalize=True, normalize_reward=False)
    steps, episodes = learning.BUDGETS[(family, env_id)]["full"], learning.EVAL_EPISODES["full"]
    row = training.train(variants.VARIANTS[variant], env_id, config, steps, seed, episodes)
    return dict(row, kind="run", family=family, observations_normalized=True)


def main() -> None:
    th.set_num_threads(1)  # as the suites' workers
    done: set[tuple[str, str, int]] = set()
    if OUT.exists():
        done = {(r["family"], r["env"], r["seed"]) for r in suite.read_jsonl(OUT)[1]}
    else:
        meta = dict(kind="meta", command="python -m benchmarks.observation_norm")
        suite.write_jsonl(OUT, [dict(meta, **suite.machine_info())])
    for family, env_id, _stock, variant in TASKS:
        for seed in learning.SEEDS["full"]:
            if (family, env_id, seed) in done:
                continue
            row = run(family, env_id, variant, seed)
            suite.write_jsonl(OUT, [dict(row, finished_at=time.time())], mode="a")
            print(json.dumps({key: row[key] for key in ("family", "env", "variant", "seed", "final_return")}), flush=True)


def summary() -> None:
    """Per task: final returns of stock SB3, of the stack (both the learning suite's) and of the stack here."""
    suite_rows = suite.read_jsonl(reports.RESULTS / "learning.jsonl")[1]
    rows = suite.read_jsonl(OUT)[1]
    for family, env_id, stock, variant in TASKS:
        line = [f"{family} {env_id}"]
        ways = (("stock", suite_rows, stock), ("stack", suite_rows, variant), ("stack+obs", rows, variant))
        returns = {}
        for label, source, name in ways:
            returns[label] = [
                r["final_return"]
                for r in sorted(source, key=lambda r: r["seed"])
                if r.get("family") == family and r["env"] == env_id and r["variant"] == name
            ]
            line.append(f"{label} {learning._iqm_text(returns[label])} {[round(v, 1) for v in returns[label]]}")
        line.append(f"P(stack+obs > stock) {learning._improvement_text(returns['stack+obs'], returns['stock'])}")
        print(" | ".join(line))


if __name__ == "__main__":
    if sys.argv[1:] == ["--summary"]:
        summary()
    else:
        main()
