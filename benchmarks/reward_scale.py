"""
Reward-scale map: rewards multiplied by 1e-4 ... 1e30 on CartPole-v1 (rl-zoo's A2C entry) and Pendulum-v1
(rl-zoo's PPO entry), the final return evaluated on the unscaled task. Peers in the same run: stock SB3, stock SB3 in
VecNormalize (rl-zoo's ``normalize: true``, observations and rewards: what an SB3 user reaches for), and sb3-safe's
recommended stack (SafeA2C / KLAdaptivePPO + the guard in rollback mode + the adaptive learning rate) without and
with ``normalize_value=True`` (PopArt, :mod:`sb3_safe.common.value_norm`), and with it in
``VecNormalize(norm_reward=False)`` (the peer's observation normalization; the rewards left to ``normalize_value``).

Budgets: the learning suite's (``benchmarks/learning.py``) at full size; quick: three scales, one seed, a few
updates (a smoke check of the harness and of the extremes, not a measurement of learning).
"""

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import aggregate, configs, reports, suite, training
from benchmarks.stress import ScaleReward
from benchmarks.variants import SAFE_ALGORITHM_CLASSES, VARIANTS

SUITE = "reward_scale"
SCALES = {
    "tiny": (1e30,),
    "quick": (1.0, 1e6, 1e30),
    "full": (1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6, 1e10, 1e30),
}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
EVAL_EPISODES = {"tiny": 1, "quick": 3, "full": 10}
#: (family, env): rl-zoo's entry read, timesteps per size (full: the learning suite's budgets)
TASKS: dict[tuple[str, str], dict[str, int]] = {
    ("A2C", "CartPole-v1"): dict(tiny=80, quick=4_000, full=50_000),
    ("PPO", "Pendulum-v1"): dict(tiny=0, quick=4_096, full=49_152),
}
#: Overrides of the zoo entry per size: quick collects 4 x 256 steps per PPO update (zoo: 4 x 1024) to see 4 updates
OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {},
    "quick": {"PPO": dict(n_steps=256)},
    "full": {},
}
#: The ways to train, per family: (label, variant of benchmarks.variants, observation and reward normalization: "" none,
#: "all" VecNormalize of observations and rewards (rl-zoo's ``normalize: true``), "observations" VecNormalize of the
#: observations only, "policy" the safe policy's ``normalize_observations``; normalize_value)
SETTINGS: dict[str, tuple[tuple[str, str, str, bool], ...]] = {
    "A2C": (
        ("A2C", "A2C", "", False),
        ("A2C + VecNormalize", "A2C", "all", False),
        ("SafeA2C+guard+KL-lr", "SafeA2C+guard+KL-lr", "", False),
        ("SafeA2C+guard+KL-lr + normalize_value", "SafeA2C+guard+KL-lr", "", True),
        # The peer's observation normalization, rewards left to normalize_value
        ("SafeA2C+guard+KL-lr + normalize_value + VecNormalize(obs)", "SafeA2C+guard+KL-lr", "observations", True),
        ("SafeA2C+guard+KL-lr + normalize_value + normalize_observations", "SafeA2C+guard+KL-lr", "policy", True),
    ),
    "PPO": (
        ("PPO", "PPO", "", False),
        ("PPO + VecNormalize", "PPO", "all", False),
        ("KLAdaptivePPO+guard+KL-lr", "KLAdaptivePPO+guard+KL-lr", "", False),
        ("KLAdaptivePPO+guard+KL-lr + normalize_value", "KLAdaptivePPO+guard+KL-lr", "", True),
        ("KLAdaptivePPO+guard+KL-lr + normalize_value + VecNormalize(obs)", "KLAdaptivePPO+guard+KL-lr", "observations", True),
        (
            "KLAdaptivePPO+guard+KL-lr + normalize_value + normalize_observations",
            "KLAdaptivePPO+guard+KL-lr",
            "policy",
            True,
        ),
    ),
}
#: The tuned reference of a task: stock SB3 at scale 1 (same budget and seeds)
REFERENCE_SCALE = 1.0
#: Scores are given only where the reference beats random by this share of the random return (else 'n/a')
MIN_REFERENCE_GAIN = 0.1

Job = tuple[str, str, str, float, int, int, int, str]


def jobs(size: str) -> list[Job]:
    """(family, env, label, scale, seed, timesteps, eval episodes, size), the longest task first."""
    return [
        (family, env_id, label, scale, seed, steps[size], EVAL_EPISODES[size], size)
        for (family, env_id), steps in TASKS.items()
        if steps[size]
        for scale in SCALES[size]
        for seed in SEEDS[size]
        for label, *_ in SETTINGS[family]
    ]


def job_key(job: Job) -> tuple[str, str, float, int]:
    """What identifies a run: (env, label, scale, seed); a rerun with the same ``--out`` skips the keys written."""
    return job[1], job[2], job[3], job[4]


def row_key(row: dict[str, Any]) -> tuple[str, str, float, int]:
    """:func:`job_key` of the job that wrote ``row``."""
    return row["env"], row["variant"], row["scale"], row["seed"]


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    return dict(
        scales=list(SCALES[size]),
        seeds=list(SEEDS[size]),
        eval_episodes=EVAL_EPISODES[size],
        timesteps={f"{family} {env}": steps[size] for (family, env), steps in TASKS.items() if steps[size]},
        overrides=OVERRIDES[size],
    )


def run_job(job: Job) -> list[dict[str, Any]]:
    """Train one (task, setting, scale, seed) on the scaled rewards, evaluate on the unscaled task; crashes are results."""
    family, env_id, label, scale, seed, timesteps, episodes, size = job
    _, name, normalization, normalize_value = next(setting for setting in SETTINGS[family] if setting[0] == label)
    variant = VARIANTS[name]
    overrides = dict(OVERRIDES[size].get(family, {}))
    if variant.algo in SAFE_ALGORITHM_CLASSES:  # explicit: the map's rows do not rest on a default
        overrides["normalize_value"] = normalize_value
        variant = dataclasses.replace(variant, normalize_observations=normalization == "policy")
    config = configs.family_config(family, env_id, **overrides)
    if normalization in ("all", "observations"):
        config.normalize, config.normalize_reward = True, normalization == "all"
    wrapper = functools.partial(ScaleReward, scale=scale)
    row = training.train(variant, env_id, config, timesteps, seed, episodes, wrapper=wrapper)
    # The row's variant is the setting's label (the stack it trains with, in ``stack``)
    return [dict(row, family=family, variant=label, stack=row["variant"], scale=scale)]


# ----- report -----


def _score(runs: list[dict[str, Any]], env_id: str) -> tuple[float, float] | None:
    """(random return, tuned return) of a task: 0 and 1 of the normalized score; None without a reference run."""
    from benchmarks.robustness_grid import random_return

    family = next(family for family, env in TASKS if env == env_id)
    stock = SETTINGS[family][0][0]
    tuned = [
        row["final_return"]
        for row in runs
        if row["env"] == env_id
        and row["variant"] == stock
        and row["scale"] == REFERENCE_SCALE
        and np.isfinite(row["final_return"])
    ]
    if not tuned:
        return None
    random, reference = random_return(env_id), float(np.mean(tuned))
    # A reference barely above random (too short a budget: quick) would blow every other score up
    return (random, reference) if reference - random > MIN_REFERENCE_GAIN * abs(random) else None


def _crashed(row: dict[str, Any]) -> bool:
    return bool(row["error"]) or not row["params_finite"]


def report(out: Path) -> None:
    """``reward_scale.md`` and ``reward_scale.png`` from ``reward_scale.jsonl``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    size = meta.get("size")
    expected = len(jobs(size)) if size in SCALES else len(runs)
    status = "complete" if "wall_s" in meta and len(runs) >= expected else f"partial: {len(runs)} of {expected} runs"
    lines = reports.report_header(
        "Reward scale: rewards x 1e-4 ... 1e30, stock SB3 vs sb3-safe"
        + (" (quick smoke check; the measurement: `reward_scale_full/`)" if size != "full" else ""),
        meta,
        [
            f"Size `{size}` ({status})"
            + (
                ": a smoke check of the harness and the extremes, a few updates per run, not a measurement of learning"
                if size != "full"
                else ""
            ),
            f"Budget: scales {meta.get('budget', {}).get('scales')}, seeds {meta.get('budget', {}).get('seeds')}, timesteps"
            f" {meta.get('budget', {}).get('timesteps')}, zoo overrides {meta.get('budget', {}).get('overrides')}; final"
            f" return: deterministic policy, {meta.get('budget', {}).get('eval_episodes')} episodes of the unscaled task.",
            "Start: rl-zoo's tuned entry (`a2c.yml` CartPole-v1, `ppo.yml` Pendulum-v1), rewards multiplied by the scale"
            " in a wrapper (stored as float32 by the rollout buffer). Variants: stock SB3; stock SB3 in VecNormalize"
            " (rl-zoo's `normalize: true`: observations and rewards); the recommended stack (safe algorithm +"
            " `NonFiniteGuardCallback(on_nonfinite='rollback')` + `KLAdaptiveLRCallback()`), without and with"
            " `normalize_value=True`, and with it in `VecNormalize(norm_reward=False)` (the peer's observation"
            " normalization, the rewards left to `normalize_value`; added after the others, its rows may be of"
            " a later commit).",
            "Normalized score: 0 a uniformly random policy, 1 stock SB3's mean return at scale 1 (the tuned reference,"
            f" same budget; 'n/a' where it beats random by less than {MIN_REFERENCE_GAIN:.0%} of the random return)."
            " Crash: an exception or non-finite parameters at the end (the run scores NaN).",
        ],
    )
    for env_id in dict.fromkeys(row["env"] for row in runs):
        family = next(family for family, env in TASKS if env == env_id)
        labels = [label for label, *_ in SETTINGS[family] if any(row["variant"] == label for row in runs)]
        scales = sorted({row["scale"] for row in runs if row["env"] == env_id})
        reference = _score(runs, env_id)
        header = ["variant", *(f"x{scale:g}" for scale in scales)]
        returns, worst, iqms, counts = [], [], [], []
        for label in labels:
            cells_return, cells_worst, cells_iqm = [label], [label], [label]
            crashes = stalls = skipped = rollbacks = 0
            for scale in scales:
                selected = [row for row in runs if row["env"] == env_id and row["variant"] == label and row["scale"] == scale]
                values = np.array([row["final_return"] if not _crashed(row) else np.nan for row in selected], dtype=float)
                crashes += sum(_crashed(row) for row in selected)
                stalls += sum(row.get("guard_stalls") or 0 for row in selected)
                skipped += sum(row.get("skipped_updates") or 0 for row in selected)
                rollbacks += sum(row.get("guard_rollbacks") or 0 for row in selected)
                cells_return.append(reports.mean_std(values) if len(values) else "-")
                finite = values[np.isfinite(values)]
                cells_worst.append(f"{finite.min():.1f}" if len(finite) == len(values) and len(values) else "crash")
                if reference is None or not len(finite):
                    cells_iqm.append("n/a")
                    continue
                scores = aggregate.normalize(np.nan_to_num(values, nan=reference[0]), *reference)
                point, low, high = aggregate.iqm_with_interval({label: scores.reshape(-1, 1)})[label]
                cells_iqm.append(f"{point:.2f} [{low:.2f}, {high:.2f}]" if len(values) > 1 else f"{point:.2f}")
            returns.append(cells_return)
            worst.append(cells_worst)
            iqms.append(cells_iqm)
            counts.append([label, crashes, stalls, skipped, rollbacks])
        lines += [
            f"## {env_id} ({family}: rl-zoo's entry)",
            "",
            "Final return (mean +- std over seeds):",
            "",
            *reports.table(header, returns),
            "",
            "Normalized score, IQM [95 % stratified bootstrap CI over seeds; a crash scores as random]"
            + ("" if reference is None else f" (random {reference[0]:.1f}, tuned {reference[1]:.1f}):"),
            "",
            *reports.table(header, iqms),
            "",
            "Worst run per scale (final return; 'crash' where a run crashed):",
            "",
            *reports.table(header, worst),
            "",
            "Crashes, guard stall events, skipped optimizer steps and guard rollbacks (all scales, all seeds):",
            "",
            *reports.table(["variant", "crashes", "stall events", "skipped steps", "rollbacks"], counts),
            "",
        ]
    lines += ["![reward scale](reward_scale.png)"]
    reports.write_report(out / f"{SUITE}.md", lines)
    plot(runs, out)


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    """A heatmap per task: mean normalized score per variant (rows) and reward scale (columns)."""
    plt = reports.pyplot()
    envs = list(dict.fromkeys(row["env"] for row in runs))
    figure, axes = plt.subplots(1, max(1, len(envs)), figsize=(7.5 * max(1, len(envs)), 4.2), squeeze=False)
    for axis, env_id in zip(axes[0], envs, strict=False):
        family = next(family for family, env in TASKS if env == env_id)
        labels = [label for label, *_ in SETTINGS[family] if any(row["variant"] == label for row in runs)]
        scales = sorted({row["scale"] for row in runs if row["env"] == env_id})
        reference = _score(runs, env_id)
        grid = np.full((len(labels), len(scales)), np.nan)
        for i, label in enumerate(labels):
            for j, scale in enumerate(scales):
                values = [
                    row["final_return"] if not _crashed(row) else np.nan
                    for row in runs
                    if row["env"] == env_id and row["variant"] == label and row["scale"] == scale
                ]
                if values and reference is not None:
                    grid[i, j] = float(np.mean(aggregate.normalize(np.nan_to_num(values, nan=reference[0]), *reference)))
        image = axis.imshow(grid, vmin=0.0, vmax=1.2, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            axis.text(j, i, "n/a" if np.isnan(value) else f"{value:.2f}", ha="center", va="center", color="w", fontsize=8)
        axis.set_xticks(range(len(scales)), [f"{scale:g}" for scale in scales], fontsize=8)
        axis.set_yticks(range(len(labels)), labels, fontsize=8)
        axis.set(xlabel="reward scale", title=f"{env_id}: normalized score (1 = stock at scale 1)")
        figure.colorbar(image, ax=axis, fraction=0.046)
    reports.save_figure(figure, out / f"{SUITE}.png")
