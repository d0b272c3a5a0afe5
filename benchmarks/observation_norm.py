"""
Would normalizing the observations cost the learning suite's parity? The learning suite's tasks that train without
``VecNormalize`` (rl-zoo's entries, the maskable example), its budgets and seeds, the recommended stack (safe
algorithm or safe policy + adaptive lr, as the suite's "+KL-lr" variants) in ``VecNormalize(norm_obs=True,
norm_reward=False)``: the observations normalized, the rewards left to ``normalize_value``. Compared with the suite's
own rows of stock SB3 and of the same stack without it (``learning.jsonl``). The measurement before any default that
normalizes observations (the stress suite's misses, ``stress.md``, commit fae62d2). Resumable: rows already in the
JSONL are skipped.

The same for a slice of the robustness map (a task without ``VecNormalize``: CartPole-v1, rl-zoo's A2C entry, or
Pendulum-v1, its PPO entry): its recommended-stack variants on every cell and seed, observations normalized, scored
against the map's own rows (``robustness.jsonl``). ``--seeds`` adds seeds beyond the map's three; way ``none`` trains
them as the map does (observations as they come), the baseline of those seeds.

Usage::

    python -m benchmarks.observation_norm [env|policy]            # the learning suite's tasks: train what is missing
    python -m benchmarks.observation_norm --summary               # print the comparison
    python -m benchmarks.observation_norm --robustness VARIANT [--way env|policy|none] [--task ENV] [--seeds 3,4]
    python -m benchmarks.observation_norm --robustness-summary [--task ENV]  # its targets against the map's
    python -m benchmarks.observation_norm --robustness-compare VARIANT [--task ENV]  # per cell, at the same seeds
    python -m benchmarks.observation_norm --cost                  # the CPU time it costs a safe algorithm
"""

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import numpy as np
import torch as th

from benchmarks import configs, learning, reports, robustness, robustness_grid, robustness_scores, suite, training, variants

#: Where each way of normalizing writes the learning-suite runs: VecNormalize's ("env"), the safe policy's ("policy")
OUT = {"env": reports.RESULTS / "observation_norm.jsonl", "policy": reports.RESULTS / "observation_norm_policy.jsonl"}
#: Where each way of normalizing writes the robustness slice: VecNormalize's ("env"), the safe policy's ("policy")
ROBUSTNESS_OUT = {
    "env": reports.RESULTS / "observation_norm_robustness.jsonl",
    "policy": reports.RESULTS / "observation_norm_robustness_policy.jsonl",
    # the map's own way (observations as they come) at the seeds the map has not run
    "none": reports.RESULTS / "observation_norm_robustness_none.jsonl",
}
#: The robustness map's tasks that train without VecNormalize
ROBUSTNESS_TASKS = ("CartPole-v1", "Pendulum-v1")
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


def run_robustness(variant: str, way: str, task_id: str = "CartPole-v1", seeds: tuple[int, ...] | None = None) -> None:
    """
    Every cell of the map's ``task_id`` slice for ``variant`` at ``seeds``, observations normalized ``way``.

    :param variant: one of the slice's recommended variants
    :param way: ``"env"`` (``VecNormalize(norm_reward=False)``), ``"policy"`` (the safe policy's own) or ``"none"``
        (as the map trains it: for seeds the map has not run)
    :param task_id: one of :data:`ROBUSTNESS_TASKS`
    :param seeds: the seeds (None: the map's)
    """
    if task_id not in ROBUSTNESS_TASKS:
        raise ValueError(f"task {task_id!r}: one of {ROBUSTNESS_TASKS}")
    if variant not in robustness_grid.TASKS[task_id].recommended:
        raise ValueError(
            f"{variant!r}: not among {task_id}'s recommended variants {robustness_grid.TASKS[task_id].recommended}"
        )
    if way == "none" and (seeds is None or set(seeds) & set(robustness_grid.SEEDS["full"])):
        raise ValueError(
            f"way 'none' trains as the map does: only seeds the map has not run (not {robustness_grid.SEEDS['full']})"
        )
    out = ROBUSTNESS_OUT[way]
    th.set_num_threads(1)
    done: set[tuple[str, str, float, float, int]] = set()
    if out.exists():
        done = {robustness.row_key(row) for row in suite.read_jsonl(out)[1]}
    else:
        meta = dict(kind="meta", command=f"python -m benchmarks.observation_norm --robustness VARIANT --way {way}")
        suite.write_jsonl(out, [dict(meta, **suite.machine_info())])
    grid = {job[:4] + job[5:] for job in robustness.jobs("full") if job[0] == task_id and job[1] == variant}
    # Seed by seed: a run cut short leaves whole seeds of the grid
    for seed in seeds if seeds is not None else robustness_grid.SEEDS["full"]:
        for cell in sorted(grid):
            job = (*cell[:4], seed, cell[4])
            if robustness.job_key(job) in done:
                continue
            for row in robustness.run_job(job, normalize_observations=way):
                suite.write_jsonl(out, [dict(row, kind="run", finished_at=time.time())], mode="a")
                print(json.dumps({key: row[key] for key in ("variant", "lr_factor", "ent_coef", "seed", "final_return")}))


def robustness_summary(task_id: str = "CartPole-v1") -> None:
    """
    The recommended stack's targets on the map's ``task_id`` slice: the map's own rows, then each way of normalizing
    in place of the variant's rows. Where a way has seeds beyond the map's, ``none`` at the same seeds is the
    baseline (the map's rows plus :data:`ROBUSTNESS_OUT`'s ``none``), printed as ``map+``.
    """
    task = robustness_grid.TASKS[task_id]
    map_rows = [row for row in suite.read_jsonl(reports.RESULTS / "robustness.jsonl")[1] if row.get("task") == task.env_id]
    none = ROBUSTNESS_OUT["none"]
    extra = [row for row in suite.read_jsonl(none)[1] if row.get("task") == task.env_id] if none.exists() else []
    ways = [("map", map_rows, False)] + ([("map+", map_rows + extra, False)] if extra else [])
    for way, out in ROBUSTNESS_OUT.items():
        rows = [row for row in suite.read_jsonl(out)[1] if row.get("task") == task.env_id] if out.exists() else []
        if rows and way != "none":
            ways.append((way, rows, True))
    for label, rows, replaces in ways:
        replaced = {row["variant"] for row in rows} if replaces else set()
        merged = [row for row in map_rows if row["variant"] not in replaced] + rows if replaces else rows
        result = robustness_scores.task_results(task, merged)
        iqms = robustness_scores.iqm_intervals(result)
        for variant in task.recommended:
            seeds = sorted({row["seed"] for row in merged if row["variant"] == variant})
            for target in robustness_scores.targets(result, variant, iqms):
                print(f"{label:6s} {variant:32s} seeds {seeds} {target.name}: {target.text}")


def robustness_compare(variant: str, task_id: str = "CartPole-v1") -> None:
    """
    ``variant`` on the map's ``task_id`` slice as the map trains it (its rows and ``none``'s) and with the safe
    policy's ``normalize_observations`` (``policy``'s), at the seeds both have: per learning-rate factor and ent_coef,
    the mean final return, the runs at the task's maximum (CartPole-v1: 500) and the worst run.
    """
    task = robustness_grid.TASKS[task_id]
    read = {way: suite.read_jsonl(out)[1] if out.exists() else [] for way, out in ROBUSTNESS_OUT.items()}
    map_rows = suite.read_jsonl(reports.RESULTS / "robustness.jsonl")[1]

    def of_variant(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [row for row in rows if row.get("task") == task.env_id and row["variant"] == variant]

    ways = {"as the map": of_variant(map_rows + read["none"]), "normalize_observations": of_variant(read["policy"])}
    seeds = set.intersection(*({row["seed"] for row in rows} for rows in ways.values()))
    best = max(row["final_return"] for rows in ways.values() for row in rows if row["final_return"] is not None)
    print(f"{task_id} {variant}, seeds {sorted(seeds)}; 'at max': final return >= {best}")
    cells = sorted({(row["lr_factor"], row["ent_coef"]) for rows in ways.values() for row in rows})
    totals: dict[str, list[float]] = {way: [] for way in ways}
    for cell in cells:
        line = [f"x{cell[0]:<6g} ent {cell[1]:<4g}"]
        for way, rows in ways.items():
            runs = [row for row in rows if (row["lr_factor"], row["ent_coef"]) == cell and row["seed"] in seeds]
            # A failed run (no return) ranks below any: -inf
            returns = [float("-inf") if row["final_return"] is None else float(row["final_return"]) for row in runs]
            totals[way] += returns
            line.append(
                f"{way}: mean {np.mean(returns):7.1f} at max {sum(value >= best for value in returns)}/{len(returns)}"
                f" worst {min(returns):7.1f}"
            )
        print(" | ".join(line))
    for way, returns in totals.items():
        print(
            f"all cells, {way}: mean {np.mean(returns):.1f}, at max {sum(value >= best for value in returns)}/{len(returns)}"
        )


#: The cost measurement's tasks: (the stack's variant, env, rl-zoo family, timesteps per timed run)
COST_TASKS = (
    ("SafeA2C+guard+KL-lr", "CartPole-v1", "A2C", 24_000),
    ("KLAdaptivePPO+guard+KL-lr", "Pendulum-v1", "PPO", 12_288),
)
COST_OUT = reports.RESULTS / "observation_norm_cost.jsonl"


def cost(rounds: int = 9) -> None:
    """
    What ``normalize_observations=True`` costs the recommended stack's training, in the process's CPU time of
    ``learn()``: per task of :data:`COST_TASKS` and round, a run without and a run with it (rl-zoo's settings, one
    torch thread, the order alternating from round to round), and their ratio; the median ratio is printed, every
    run written to :data:`COST_OUT` (replaced).
    """
    th.set_num_threads(1)
    meta = dict(kind="meta", command="python -m benchmarks.observation_norm --cost", rounds=rounds)
    suite.write_jsonl(COST_OUT, [dict(meta, **suite.machine_info())])
    for name, env_id, family, steps in COST_TASKS:
        config = configs.family_config(family, env_id)
        ratios = []
        for round_index in range(rounds):
            cpu: dict[bool, float] = {}
            for normalized in (False, True) if round_index % 2 == 0 else (True, False):
                variant = dataclasses.replace(variants.VARIANTS[name], normalize_observations=normalized)
                row = training.train(variant, env_id, config, steps, round_index, eval_episodes=0)
                cpu[normalized] = row["cpu_s"]
                suite.write_jsonl(
                    COST_OUT, [dict(row, kind="run", round=round_index, observations_normalized=normalized)], mode="a"
                )
            ratios.append(cpu[True] / cpu[False])
        print(f"{name} {env_id}, {steps} steps: CPU time with / without, median of {rounds} rounds {np.median(ratios):.3f}")


def main_cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.observation_norm")
    parser.add_argument("way", nargs="?", default="env", choices=("env", "policy"))
    parser.add_argument("--summary", action="store_true")
    parser.add_argument("--robustness", metavar="VARIANT")
    parser.add_argument("--robustness-summary", action="store_true")
    parser.add_argument("--robustness-compare", metavar="VARIANT")
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--way", dest="robustness_way", default="env", choices=tuple(ROBUSTNESS_OUT))
    parser.add_argument("--task", default="CartPole-v1", choices=ROBUSTNESS_TASKS)
    parser.add_argument("--seeds", type=lambda text: tuple(int(seed) for seed in text.split(",")), default=None)
    args = parser.parse_args(argv)
    if args.summary:
        summary()
    elif args.robustness:
        run_robustness(args.robustness, args.robustness_way, args.task, args.seeds)
    elif args.robustness_summary:
        robustness_summary(args.task)
    elif args.cost:
        cost()
    elif args.robustness_compare:
        robustness_compare(args.robustness_compare, args.task)
    else:
        main(args.way)


if __name__ == "__main__":
    main_cli(sys.argv[1:])
