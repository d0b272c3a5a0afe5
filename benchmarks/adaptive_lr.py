"""
The KL of each update at rl-zoo's tuned settings: what :class:`~sb3_safe.KLAdaptiveLRCallback`'s defaults
(``PPO_STYLE``, ``ONE_STEP`` in ``sb3_safe/common/adaptive_lr.py``) are set from.

Stock algorithms with their tuned zoo entries (the maskable example's settings for MaskablePPO), the callback in
measure-only mode (no trust region, no change of the learning rate: a tolerance of 1e12 and bounds that never bind)
and every update measured (its sampling of A2C-style updates turned off here). Per task: the distribution of the
mean rollout KL per update, and the share of updates above the callback's undo bound (``undo_above`` times the
default target): the updates it would redo at a sound learning rate.
"""

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import configs, reports, suite, training, variants
from sb3_safe.common.adaptive_lr import DEFAULT_TOLERANCE, ONE_STEP, PPO_STYLE

SUITE = "adaptive_lr"
#: (family, env): full budget; tiny / quick are fractions of it
TASKS: dict[tuple[str, str], int] = {
    ("PPO", "Pendulum-v1"): 49_152,
    ("PPO", "CartPole-v1"): 51_200,
    ("PPO", "Acrobot-v1"): 49_152,
    ("A2C", "CartPole-v1"): 100_000,
    ("A2C", "Acrobot-v1"): 75_000,
    ("RecurrentPPO", "CartPoleNoVel-v1"): 32_768,
    ("MaskablePPO", configs.MACHINE_SCHEDULING): 50_176,
}
TINY_TASKS = (("PPO", "CartPole-v1"), ("A2C", "CartPole-v1"))
FRACTION = {"tiny": 0.02, "quick": 0.2, "full": 1.0}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}


def jobs(size: str) -> list[tuple[str, str, int, int]]:
    """(family, env, seed, timesteps)."""
    tasks = TINY_TASKS if size == "tiny" else tuple(TASKS)
    return [
        (family, env_id, seed, max(1_000, int(TASKS[family, env_id] * FRACTION[size])))
        for family, env_id in tasks
        for seed in SEEDS[size]
    ]


def run_job(job: tuple[str, str, int, int]) -> list[dict[str, Any]]:
    """Train the stock algorithm with the callback measuring only; the KL of every update."""
    from sb3_safe import KLAdaptiveLRCallback
    from sb3_safe.common import adaptive_lr

    family, env_id, seed, timesteps = job
    adaptive_lr.MEASURED_SAMPLES = 1  # every update, also A2C's (the callback samples them to save time)
    config = configs.family_config(family, env_id)
    env = training.make_env(env_id, config.n_envs, seed, normalize=config.normalize, gamma=config.gamma)
    model = variants.build_model(variants.VARIANTS[family], env, seed, config.kwargs)
    callback = KLAdaptiveLRCallback(tolerance=1e12, trust_region=False, lr_bounds=(1e-12, 1e12))
    model.learn(timesteps, callback=callback)
    defaults = ONE_STEP if family == "A2C" else PPO_STYLE
    env.close()
    return [
        dict(
            family=family,
            env=env_id,
            seed=seed,
            timesteps=timesteps,
            variant=family,
            target_kl=defaults.target_kl,
            undo_above=defaults.undo_above,
            kls=[kl for kl, _ in callback.history],
        )
    ]


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    return dict(seeds=list(SEEDS[size]), timesteps={f"{family} {env}": steps for family, env, _, steps in jobs(size)})


def report(out: Path) -> None:
    """``adaptive_lr.md`` from ``adaptive_lr.jsonl``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    lines = reports.report_header(
        "The KL of each update at rl-zoo's tuned settings (what KLAdaptiveLRCallback's defaults are set from)",
        meta,
        [
            "Stock algorithms, tuned zoo entries (MaskablePPO: `examples/maskable.py`'s settings), seeds"
            f" {meta.get('budget', {}).get('seeds')}; `KLAdaptiveLRCallback` measuring only (no redo, no change of"
            " the learning rate), every update measured: the mean KL(pi_old || pi_new) over the update's rollout.",
            f"Default target and undo bound: `PPO_STYLE` (target {PPO_STYLE.target_kl:g}, undo above"
            f" {PPO_STYLE.undo_above:g}x) for the PPO family, `ONE_STEP` (target {ONE_STEP.target_kl:g}, undo above"
            f" {ONE_STEP.undo_above:g}x) for A2C; no change within a factor {DEFAULT_TOLERANCE:g} of the target.",
        ],
    )
    rows = []
    for family, env_id in dict.fromkeys((row["family"], row["env"]) for row in runs):
        selected = [row for row in runs if row["family"] == family and row["env"] == env_id]
        kls = np.array([kl for row in selected for kl in row["kls"]], dtype=float)
        kls = kls[np.isfinite(kls)]
        if not len(kls):
            continue
        # The callback's defaults now (rows keep those of the run that measured them)
        defaults = ONE_STEP if family == "A2C" else PPO_STYLE
        target, undo = defaults.target_kl, defaults.undo_above
        q10, q50, q90, q99 = np.quantile(kls, [0.1, 0.5, 0.9, 0.99])
        rows.append(
            [
                f"{family} {env_id}",
                f"{len(kls)} ({len(selected)} seeds)",
                f"{kls.mean():.3g}",
                f"{q10:.2g} / {q50:.2g} / {q90:.2g} / {q99:.2g}",
                f"{target:g}",
                f"{kls.mean() / target:.2f}",
                f"{np.mean(kls > undo * target):.1%}",
            ]
        )
    header = [
        "task",
        "updates",
        "mean KL",
        "10th / 50th / 90th / 99th percentile",
        "default target",
        "mean / target",
        "share above the undo bound",
    ]
    lines += [*reports.table(header, rows), ""]
    lines += [
        "Reading: a default target near the mean KL of tuned updates (mean / target near 1) means the callback changes"
        " little where the learning rate is already sound; the last column is how often it would undo and redo a"
        " tuned update (each costs one more `train()` on the rollout). The A2C-style target sits above the tuned"
        " A2C updates on purpose: aimed at them (1e-3) the learning rate drifted below the tuned one on CartPole-v1,"
        " and the robustness map measured 3e-3 better (`robustness.md`).",
    ]
    reports.write_report(out / f"{SUITE}.md", lines)
