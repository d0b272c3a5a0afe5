"""
Would normalizing the observations cost the learning suite's parity? The learning suite's tasks that train without
``VecNormalize`` (rl-zoo's entries, the maskable example), its budgets and seeds, the recommended stack (safe
algorithm or safe policy + adaptive lr, as the suite's "+KL-lr" variants) in ``VecNormalize(norm_obs=True,
norm_reward=False)``: the observations normalized, the rewards left to ``normalize_value``. Compared with the suite's
own rows of stock SB3 and of the same stack without it (``learning.jsonl``). The measurement before any default that
normalizes observations (the stress suite's misses, ``stress.md``, thirteenth session). Resumable: rows already in the
JSONL are skipped.

The same for the robustness map's CartPole-v1 slice (rl-zoo's A2C entry, no ``VecNormalize``; the map's other tasks
have bounded observations or ``VecNormalize``): its recommended-stack variants on every cell and seed, observations
normalized, scored against the map's own rows (``robustness.jsonl``).

Usage::

    python -m benchmarks.observation_norm [env|policy]            # the learning suite's tasks: train what is missing
    python -m benchmarks.observation_norm --summary               # print the comparison
    python -m benchmarks.observation_norm --robustness VARIANT [env|policy]  # the map's CartPole-v1 slice, one variant
    python -m benchmarks.observation_norm --robustness-summary              # its targets against the map's
"""

import dataclasses
import json
import sys
import time
from typing import Any

import torch as th

from benchmarks import configs, learning, reports, robustness, robustness_scores, suite, training, variants

#: Where each way of normalizing writes the learning-suite runs: VecNormalize's ("env"), the safe policy's ("policy")
OUT = {"env": reports.RESULTS / "observation_norm.jsonl", "policy": reports.RESULTS / "observation_norm_policy.jsonl"}
#: Where each way of normalizing writes the robustness slice: VecNormalize's ("env"), the safe policy's ("policy")
ROBUSTNESS_OUT = {
    "env": reports.RESULTS / "observation_norm_robustness.jsonl",
    "policy": reports.RESULTS / "observation_norm_robustness_policy.jsonl",
}
ROBUSTNESS_TASK = "CartPole-v1"
#: (family, env, stock variant, the stack's variant) of each learning-suite task without VecNormalize
TASKS = (
    ("PPO", "CartPole-v1", "PPO", "KLAdaptivePPO+KL-lr"),
    ("PPO", "Pendulum-v1", "PPO", "KLAdaptivePPO+KL-lr"),
    ("A2C", "CartPole-v1", "A2C", "SafeA2C+KL-lr"),
    ("MaskablePPO", configs.MACHINE_SCHEDULING, "MaskablePPO", "MaskablePPO+SafeMaskableMlpPolicy+KL-lr"),
)


#: More seeds where the suite's three disagree: stock and the stack, each without and with the observations normalized
MORE_SEEDS = {("MaskablePPO", configs.MACHINE_SCHEDULING): (3, 4, 5, 6, 7)}


def jobs(way: str) -> list[tuple[str, str, str, bool, int]]:
    """
    (family, env, variant, observations normalized, seed): the suite's seeds normalized, then :data:`MORE_SEEDS`
    (normalized, and for ``"env"`` also stock and the stack as the suite trains them).

    :param way: ``"env"`` or ``"policy"``
    """
    listed = [(family, env_id, variant, True, seed) for family, env_id, _, variant in TASKS for seed in learning.SEEDS["full"]]
    for family, env_id, stock, variant in TASKS:
        for seed in MORE_SEEDS.get((family, env_id), ()):
            if way == "env":
                listed += [(family, env_id, stock, False, seed), (family, env_id, variant, False, seed)]
            listed.append((family, env_id, variant, True, seed))
    return listed


def run(family: str, env_id: str, variant: str, normalized: bool, seed: int, way: str = "env") -> dict[str, Any]:
    """
    One learning-suite run of ``variant``, its observations (only) normalized or as the suite trains it.

    :param way: ``"env"``: normalized by ``VecNormalize(norm_reward=False)``; ``"policy"``: by the safe policy
    """
    config = configs.family_config(family, env_id)
    if config.normalize:
        raise ValueError(f"{family} {env_id} normalizes already: not a task of this measurement")
    trained = variants.VARIANTS[variant]
    if normalized and way == "env":
        config = dataclasses.replace(config, normalize=True, normalize_reward=False)
    elif normalized:
        trained = dataclasses.replace(trained, normalize_observations=True)
    steps, episodes = learning.BUDGETS[(family, env_id)]["full"], learning.EVAL_EPISODES["full"]
    row = training.train(trained, env_id, config, steps, seed, episodes)
    return dict(row, kind="run", family=family, observations_normalized=normalized)


def _key(row: dict[str, Any]) -> tuple[str, str, str, bool, int]:
    return row["family"], row["env"], row["variant"], row["observations_normalized"], row["seed"]


def main(way: str) -> None:
    th.set_num_threads(1)  # as the suites' workers
    out = OUT[way]
    done: set[tuple[str, str, str, bool, int]] = set()
    if out.exists():
        done = {_key(row) for row in suite.read_jsonl(out)[1]}
    else:
        meta = dict(kind="meta", command=f"python -m benchmarks.observation_norm {way}")
        suite.write_jsonl(out, [dict(meta, **suite.machine_info())])
    for job in jobs(way):
        if job in done:
            continue
        row = run(*job, way=way)
        suite.write_jsonl(out, [dict(row, finished_at=time.time())], mode="a")
        print(json.dumps({key: row[key] for key in ("family", "env", "variant", "seed", "final_return")}), flush=True)


def summary() -> None:
    """Per task: final returns of stock SB3, of the stack (the suite's, then here) and of the stack normalized each way."""
    suite_rows = [dict(row, observations_normalized=False) for row in suite.read_jsonl(reports.RESULTS / "learning.jsonl")[1]]
    rows = {way: suite.read_jsonl(out)[1] for way, out in OUT.items() if out.exists()}
    unnormalized = suite_rows + [row for row in rows.get("env", []) if not row["observations_normalized"]]
    for family, env_id, stock, variant in TASKS:
        line = [f"{family} {env_id}"]
        returns = {}
        ways = [("stock", stock, unnormalized), ("stack", variant, unnormalized)]
        ways += [
            (f"stack+obs({way})", variant, [row for row in way_rows if row["observations_normalized"]])
            for way, way_rows in rows.items()
        ]
        for label, name, source in ways:
            returns[label] = [
                row["final_return"]
                for row in sorted(source, key=lambda row: row["seed"])
                if row.get("family") == family and row["env"] == env_id and row["variant"] == name
            ]
            line.append(f"{label} {learning._iqm_text(returns[label])} {[round(v, 1) for v in returns[label]]}")
            if label.startswith("stack+obs"):
                line.append(f"P(> stock) {learning._improvement_text(returns[label], returns['stock'])}")
        print(" | ".join(line))


def run_robustness(variant: str, way: str) -> None:
    """
    Every cell and seed of the map's :data:`ROBUSTNESS_TASK` slice for ``variant``, observations normalized.

    :param variant: one of the slice's recommended variants
    :param way: ``"env"`` (``VecNormalize(norm_reward=False)``) or ``"policy"`` (the safe policy's own)
    """
    if variant not in robustness.TASKS[ROBUSTNESS_TASK].recommended:
        raise ValueError(f"{variant!r}: not among {ROBUSTNESS_TASK}'s recommended variants")
    out = ROBUSTNESS_OUT[way]
    th.set_num_threads(1)
    done: set[tuple[str, str, float, float, int]] = set()
    if out.exists():
        done = {robustness.row_key(row) for row in suite.read_jsonl(out)[1]}
    else:
        meta = dict(kind="meta", command=f"python -m benchmarks.observation_norm --robustness VARIANT {way}")
        suite.write_jsonl(out, [dict(meta, **suite.machine_info())])
    for job in robustness.jobs("full"):
        if job[0] != ROBUSTNESS_TASK or job[1] != variant or robustness.job_key(job) in done:
            continue
        for row in robustness.run_job(job, normalize_observations=way):
            suite.write_jsonl(out, [dict(row, kind="run", finished_at=time.time())], mode="a")
            print(json.dumps({key: row[key] for key in ("variant", "lr_factor", "ent_coef", "seed", "final_return")}))


def robustness_summary() -> None:
    """The recommended stack's targets on the map's slice: its own rows, then with the observations normalized."""
    task = robustness.TASKS[ROBUSTNESS_TASK]
    map_rows = [row for row in suite.read_jsonl(reports.RESULTS / "robustness.jsonl")[1] if row.get("task") == task.env_id]
    ways = [("map", map_rows)] + [(way, suite.read_jsonl(out)[1]) for way, out in ROBUSTNESS_OUT.items() if out.exists()]
    for label, normalized in ways:
        replaced = {row["variant"] for row in normalized} if label != "map" else set()
        rows = [row for row in map_rows if row["variant"] not in replaced] + (normalized if label != "map" else [])
        result = robustness_scores.task_results(task, rows)
        iqms = robustness_scores.iqm_intervals(result)
        for variant in task.recommended:
            for target in robustness_scores.targets(result, variant, iqms):
                print(f"{label:6s} {variant:32s} {target.name}: {target.text}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--summary"]:
        summary()
    elif sys.argv[1:2] == ["--robustness"]:
        run_robustness(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "env")
    elif sys.argv[1:] == ["--robustness-summary"]:
        robustness_summary()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "env")
