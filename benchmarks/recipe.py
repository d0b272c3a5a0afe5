"""
The README's recipe on a healthy, tuned run: an SB3 script as a user has it (PPO with rl-zoo's Pendulum-v1 settings,
``VecNormalize``, an ``EvalCallback``), and the same script with the README's three changes (``SafeMlpPolicy``,
``KLAdaptiveLRCallback()``, ``NonFiniteGuardCallback(on_nonfinite="rollback")``), same seeds. Claim: the changes keep
a tuned run (returns at least stock's, within seed noise), and every change of the learning rate is logged with its KL.

Sizes: full is rl-zoo's budget (100,000 steps, 3 seeds); quick (one seed, 5 updates) and tiny (one update) check the
harness, not the claim. Rows: one per arm and seed (final return, the evaluations' curve, the adaptive lr's
decisions), resumable.
"""

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import reports, suite

SUITE = "recipe"
ENV_ID = "Pendulum-v1"
#: rl-zoo's ppo.yml entry for Pendulum-v1 (n_envs 4, 1e5 steps)
SETTINGS: dict[str, Any] = dict(
    n_steps=1024,
    gae_lambda=0.95,
    gamma=0.9,
    n_epochs=10,
    ent_coef=0.0,
    learning_rate=1e-3,
    clip_range=0.2,
    use_sde=True,
    sde_sample_freq=4,
)
N_ENVS = 4
TIMESTEPS = {"tiny": 4_096, "quick": 20_480, "full": 100_000}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
EVAL_FREQ = {"tiny": 2_048, "quick": 5_000, "full": 5_000}
EVAL_EPISODES = {"tiny": 2, "quick": 5, "full": 10}
#: evaluations averaged for a run's final return
LAST_EVALUATIONS = 5
ARMS = ("stock", "recipe")
#: (arm, seed, size)
Job = tuple[str, int, str]


def jobs(size: str) -> list[Job]:
    """Both arms at each seed of ``size``."""
    return [(arm, seed, size) for seed in SEEDS[size] for arm in ARMS]


def job_key(job: Job) -> tuple[str, int]:
    """What identifies a run (a rerun with the same ``--out`` skips those written)."""
    return job[0], job[1]


def row_key(row: dict[str, Any]) -> tuple[str, int]:
    """:func:`job_key` of the job that wrote ``row``."""
    return row["arm"], row["seed"]


def run_job(job: Job) -> list[dict[str, Any]]:
    """Train one arm with one seed; its final return (mean of the last evaluations) and the rate's changes."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_safe import KLAdaptiveLRCallback, NonFiniteGuardCallback, SafeMlpPolicy

    arm, seed, size = job
    env = VecNormalize(make_vec_env(ENV_ID, n_envs=N_ENVS, seed=seed), gamma=SETTINGS["gamma"])
    eval_env = VecNormalize(make_vec_env(ENV_ID, n_envs=1, seed=seed + 1000), training=False, norm_reward=False)
    # SB3 keeps the evaluations' results only where it writes them
    with tempfile.TemporaryDirectory(prefix="recipe_eval_") as log_path:
        evaluation = EvalCallback(
            eval_env,
            eval_freq=EVAL_FREQ[size] // N_ENVS,
            n_eval_episodes=EVAL_EPISODES[size],
            log_path=log_path,
            verbose=0,
        )
        callbacks: list[Any] = [evaluation]
        adaptive = None
        if arm == "recipe":
            adaptive = KLAdaptiveLRCallback()
            callbacks += [adaptive, NonFiniteGuardCallback(on_nonfinite="rollback")]
        model = PPO(SafeMlpPolicy if arm == "recipe" else "MlpPolicy", env, seed=seed, device="cpu", **SETTINGS)
        model.learn(TIMESTEPS[size], callback=callbacks)
    returns = [float(np.mean(results)) for results in evaluation.evaluations_results]
    row: dict[str, Any] = dict(
        arm=arm,
        seed=seed,
        timesteps=TIMESTEPS[size],
        final_return=float(np.mean(returns[-LAST_EVALUATIONS:])),
        curve=returns,
    )
    if adaptive is not None:
        row["rate_changes"] = [dict(kl=kl, factor=factor) for kl, factor in adaptive.decisions if factor != 1.0]
        row["redone_updates"] = adaptive.redone_updates
        row["final_learning_rate"] = float(model.policy.optimizer.param_groups[0]["lr"])
    return [row]


def budget(size: str) -> dict[str, Any]:
    """The runs recorded in the JSONL meta row (a resumed run must have the same)."""
    return dict(
        env=ENV_ID,
        n_envs=N_ENVS,
        timesteps=TIMESTEPS[size],
        seeds=list(SEEDS[size]),
        eval_freq=EVAL_FREQ[size],
        eval_episodes=EVAL_EPISODES[size],
        last_evaluations=LAST_EVALUATIONS,
    )


def report(out: Path) -> None:
    """``recipe.md``: the claim and the figure first, then the method, then the rows."""
    meta, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    plan = meta.get("budget") or budget(meta.get("size", "full"))
    by_arm = {arm: sorted((row for row in rows if row["arm"] == arm), key=lambda row: row["seed"]) for arm in ARMS}
    finals = {arm: [row["final_return"] for row in by_arm[arm]] for arm in ARMS}
    changes = sum(len(row.get("rate_changes", [])) + row.get("redone_updates", 0) for row in by_arm["recipe"])
    seeds = f"{len(by_arm['recipe'])} seed" + "s" * (len(by_arm["recipe"]) != 1)
    figure = (
        f"**Mean final return: recipe {np.mean(finals['recipe']):.1f} (std over seeds {np.std(finals['recipe']):.1f}),"
        f" stock PPO {np.mean(finals['stock']):.1f} (std {np.std(finals['stock']):.1f}), {seeds};"
        f" the adaptive lr changed the rate {changes} times over all runs.**"
    )
    lines = reports.report_header(
        "The README's recipe on a healthy, tuned run",
        meta,
        [
            f"PPO with rl-zoo's {plan['env']} settings ({plan['n_envs']} envs, {plan['timesteps']:,} steps, gSDE) in"
            f" `VecNormalize`, an `EvalCallback` every {plan['eval_freq']:,} steps ({plan['eval_episodes']}"
            f" deterministic episodes); final return = mean of the last {plan['last_evaluations']} evaluations; seeds"
            f" {plan['seeds']}.",
            "Recipe: `SafeMlpPolicy`, `KLAdaptiveLRCallback()` (defaults),"
            ' `NonFiniteGuardCallback(on_nonfinite="rollback")`; stock: `"MlpPolicy"`, no callback but the evaluation.',
        ],
        summary=figure,
    )
    stock_by_seed = {row["seed"]: row for row in by_arm["stock"]}
    lines += reports.table(
        ["seed", "stock", "recipe", "rate decisions (window KL, factor)", "updates redone (KL > 6x target)", "final lr"],
        [
            [
                row["seed"],
                f"{stock_by_seed[row['seed']]['final_return']:.1f}" if row["seed"] in stock_by_seed else "not run",
                f"{row['final_return']:.1f}",
                ", ".join(f"({change['kl']:.3g}, x{change['factor']:.3g})" for change in row["rate_changes"]) or "none",
                row["redone_updates"],
                f"{row['final_learning_rate']:.3g}",
            ]
            for row in by_arm["recipe"]
        ],
    )
    lines += [
        "",
        f"Caveats: {seeds} of one task; where the means differ by less than stock's spread over"
        " seeds, the difference is not a measured gain, only the absence of a loss.",
    ]
    reports.write_report(out / f"{SUITE}.md", lines)
