"""
Learning parity: stock SB3 vs sb3-safe with rl-zoo's tuned hyperparameters (identical for both), several seeds.

PPO vs KLAdaptivePPO on CartPole-v1, Pendulum-v1, Hopper-v5; A2C vs SafeA2C on the same and Acrobot-v1;
sb3-contrib's RecurrentPPO with its MlpLstmPolicy vs SafeMlpLstmPolicy on CartPoleNoVel-v1 (zoo's ``ppo_lstm``
entry), and MaskablePPO with its MlpPolicy vs SafeMaskableMlpPolicy on ``examples/maskable.py``'s task (with the
example's settings: rl-zoo has no MaskablePPO file). Reports the final return per variant as the interquartile mean
with a 95 % stratified bootstrap interval over seeds (deterministic evaluation; rliable), the probability that a
safe run beats a stock run, and learning curves; per-seed returns stay in the JSONL.
"""

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import aggregate, configs, reports, suite, training, variants

SUITE = "learning"
#: (stock, safe variants...) of each family: each safe variant is compared with the stock one; "+KL-lr" adds
#: KLAdaptiveLRCallback with its defaults (its target: no cost where stock already works)
FAMILIES = {
    "PPO": ("PPO", "KLAdaptivePPO", "KLAdaptivePPO+KL-lr", "KLAdaptivePPO(normalize_value)"),
    "A2C": ("A2C", "SafeA2C", "SafeA2C+KL-lr", "SafeA2C(normalize_value)"),
    "RecurrentPPO": ("RecurrentPPO", "RecurrentPPO+SafeMlpLstmPolicy", "RecurrentPPO+SafeMlpLstmPolicy+KL-lr"),
    "MaskablePPO": ("MaskablePPO", "MaskablePPO+SafeMaskableMlpPolicy", "MaskablePPO+SafeMaskableMlpPolicy+KL-lr"),
}
#: Section titles of the families without a safe algorithm class (the others: "<stock> vs <safe>")
TITLES = {
    ("RecurrentPPO", "RecurrentPPO+SafeMlpLstmPolicy"): "RecurrentPPO: stock vs safe policy",
    ("MaskablePPO", "MaskablePPO+SafeMaskableMlpPolicy"): "MaskablePPO: stock vs safe policy",
    ("RecurrentPPO", "RecurrentPPO+SafeMlpLstmPolicy+KL-lr"): "RecurrentPPO: stock vs safe policy + adaptive lr",
    ("MaskablePPO", "MaskablePPO+SafeMaskableMlpPolicy+KL-lr"): "MaskablePPO: stock vs safe policy + adaptive lr",
}
#: Families whose safe variant is a safe algorithm (skipped optimizer steps, KL beta)
SAFE_ALGORITHMS = ("PPO", "A2C")
#: Training timesteps per (family, env) and size (0: not run at that size); zoo's budgets are in the report
BUDGETS: dict[tuple[str, str], dict[str, int]] = {
    ("PPO", "CartPole-v1"): dict(tiny=512, quick=4_096, full=51_200),
    ("PPO", "Pendulum-v1"): dict(tiny=0, quick=4_096, full=49_152),
    ("PPO", "Hopper-v5"): dict(tiny=0, quick=1_024, full=20_480),
    ("A2C", "CartPole-v1"): dict(tiny=512, quick=4_000, full=50_000),
    ("A2C", "Acrobot-v1"): dict(tiny=0, quick=4_000, full=75_000),
    ("A2C", "Pendulum-v1"): dict(tiny=0, quick=4_000, full=100_000),
    ("A2C", "Hopper-v5"): dict(tiny=0, quick=1_000, full=20_000),
    # Half of zoo's 1e5 (one rollout: 8 envs x 32 steps): LSTM updates are slow on a CPU, about 2.5 min per run on
    # one shared core, and both policies reach most of CartPoleNoVel's 500 by then
    ("RecurrentPPO", "CartPoleNoVel-v1"): dict(tiny=256, quick=4_096, full=49_152),
    # The example's budget; one rollout is 4 envs x 128 steps
    ("MaskablePPO", configs.MACHINE_SCHEDULING): dict(tiny=512, quick=4_096, full=100_352),
}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
EVAL_EPISODES = {"tiny": 1, "quick": 3, "full": 10}


def jobs(size: str) -> list[tuple[str, str, str, int, int, int]]:
    """(family, env, variant, seed, timesteps, eval episodes), longest first so the pool ends together."""
    budgets = sorted(((key, steps[size]) for key, steps in BUDGETS.items() if steps[size]), key=lambda item: -item[1])
    return [
        (family, env_id, variant, seed, timesteps, EVAL_EPISODES[size])
        for (family, env_id), timesteps in budgets
        for seed in SEEDS[size]
        for variant in FAMILIES[family]
    ]


def job_key(job: tuple[str, str, str, int, int, int]) -> tuple[str, str, str, int]:
    """What identifies a run: (family, env, variant, seed); a rerun with the same ``--out`` skips the keys written."""
    return job[:4]


def row_key(row: dict[str, Any]) -> tuple[str, str, str, int]:
    """:func:`job_key` of the job that wrote ``row``."""
    return row["family"], row["env"], row["variant"], row["seed"]


def run_job(job: tuple[str, str, str, int, int, int], guard: str | None = None) -> list[dict[str, Any]]:
    """
    Train and evaluate one (family, env, variant, seed).

    :param guard: a guard in this mode on a variant without one (``benchmarks.no_stall``); None: the variant as it is
    """
    family, env_id, variant, seed, timesteps, episodes = job
    config = configs.family_config(family, env_id)
    row = training.train(variants.guarded(variant, guard), env_id, config, timesteps, seed, episodes, curve=True)
    return [dict(family=family, **row)]


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    return dict(
        seeds=list(SEEDS[size]),
        eval_episodes=EVAL_EPISODES[size],
        timesteps={f"{family} {env}": steps[size] for (family, env), steps in BUDGETS.items() if steps[size]},
    )


def report(out: Path) -> None:
    """``learning.md`` (one table per family) and ``learning_<env>.png`` (curves) from ``learning.jsonl``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    keys = sorted({(row["family"], row["env"]) for row in runs}, key=lambda key: (list(FAMILIES).index(key[0]), key[1]))
    zoo_lines = [
        configs.describe_zoo(configs.family_config(family, env_id), _timesteps(runs, family, env_id)) + f" [{family}]"
        for family, env_id in keys
    ]
    lines = reports.report_header(
        "Learning parity: stock SB3 vs sb3-safe (rl-zoo hyperparameters)",
        meta,
        [
            "Hyperparameters: rl-zoo's tuned entries read from the installed"
            " `rl_zoo3/hyperparams/{ppo,a2c,ppo_lstm}.yml` (Hopper-v5 uses the Hopper-v4 entry); MaskablePPO (no zoo"
            " file): the settings of `examples/maskable.py`; identical for stock and safe; the safe algorithms add their"
            " defaults (safe MlpPolicy; KLAdaptivePPO: d_targ 0.01, beta0 1, bounds (1e-4, 1e3)); RecurrentPPO and"
            " MaskablePPO keep the algorithm and change only the policy (SafeMlpLstmPolicy, SafeMaskableMlpPolicy with"
            " their defaults). MaskablePPO is evaluated with the env's action masks, as it is trained.",
            f"Seeds {meta.get('budget', {}).get('seeds')}; final return: deterministic policy,"
            f" {meta.get('budget', {}).get('eval_episodes')} evaluation episodes on a fresh env (frozen observation"
            " normalization), summarized over seeds with rliable (below each table). Curves: mean of the last 20"
            " training episodes, seed mean,"
            " band min-max.",
            "Budgets (training timesteps per run; the zoo entry read):",
        ],
    )
    lines[-1:-1] = [f"  - {line}" for line in zoo_lines]
    pairs = [(family, stock, safe) for family, (stock, *safes) in FAMILIES.items() for safe in safes]
    for family, stock, safe in pairs:
        rows = []
        paired_scores: list[tuple[list[float], list[float]]] = []
        for fam, env_id in keys:
            if fam != family:
                continue
            selected = {name: _select(runs, family, env_id, name) for name in (stock, safe)}
            if not selected[safe]:
                continue
            finals = {name: [row["final_return"] for row in chosen] for name, chosen in selected.items()}
            wall, cpu = (
                np.mean([row[key] for row in selected[safe]]) / np.mean([row[key] for row in selected[stock]])
                for key in ("wall_s", "cpu_s")
            )
            failures = [
                sum(bool(row["error"]) or not row["params_finite"] for row in selected[name]) for name in (stock, safe)
            ]
            skipped = sum(row["skipped_updates"] or 0 for row in selected[safe])
            betas = ", ".join(f"{row['kl_beta']:.3g}" for row in selected[safe] if row["kl_beta"] is not None) or "-"
            rows.append(
                [
                    env_id,
                    _iqm_text(finals[stock]),
                    _iqm_text(finals[safe]),
                    _improvement_text(finals[safe], finals[stock]),
                    f"{wall:.2f} / {cpu:.2f}",
                    f"{failures[0]} / {failures[1]}",
                    *([skipped] if family in SAFE_ALGORITHMS else []),
                    *([betas] if family == "PPO" else []),
                ]
            )
            paired_scores.append((finals[safe], finals[stock]))
        if not rows:
            continue
        header = [
            "env",
            f"{stock} return IQM [95 % CI]",
            f"{safe} return IQM [95 % CI]",
            f"P({safe} > {stock}) [95 % CI]",
            f"time ratio {safe}/{stock} wall / CPU",
            f"failures {stock} / {safe}",
            *([f"{safe} skipped steps"] if family in SAFE_ALGORITHMS else []),
            *(["final beta per seed"] if family == "PPO" else []),
        ]
        lines += [f"## {TITLES.get((stock, safe), f'{stock} vs {safe}')}", "", *reports.table(header, rows), ""]
        if len(paired_scores) > 1:
            lines += [_overall_improvement(paired_scores, safe, stock), ""]
        if family == "MaskablePPO" and "KL-lr" not in safe:
            lines += [_maskable_reference(), ""]
    lines += [
        "IQM: interquartile mean over seeds (with 3 seeds, their mean), 95 % stratified bootstrap interval (rliable,"
        f" {aggregate.BOOTSTRAP_REPS} resamples). P(safe > stock): probability that a safe run's return exceeds a stock"
        " run's on the same task (Mann-Whitney, ties 1/2), with its bootstrap interval; 0.5 is parity, and the safe"
        " variant is shown worse only where the interval's upper end is below 0.5. With 3 seeds per side the"
        " intervals are wide: they say how little 3 seeds can separate, not that the variants differ.",
        "",
        *[f"![{env_id}](learning_{env_id}.png)" for env_id in sorted({env for _, env in keys})],
    ]
    reports.write_report(out / f"{SUITE}.md", lines)
    plot(runs, out)


def _maskable_reference() -> str:
    """What the example's scripted schedules earn on its task, for reading the MaskablePPO returns."""
    example = configs.maskable_example()
    best, random = (example.scripted_return(choose, seed=0) for choose in (example.best_ready, example.random_ready))
    return (
        f"{configs.MACHINE_SCHEDULING} (`examples/maskable.py`, {example.EPISODE_LENGTH} steps per episode): the optimal"
        f" schedule earns {example.optimal_return():.1f}, always the best ready machine {best:.1f}, a random ready"
        f" machine {random:.1f} (100 episodes)."
    )


def _select(runs: list[dict[str, Any]], family: str, env_id: str, variant: str) -> list[dict[str, Any]]:
    return [row for row in runs if row["family"] == family and row["env"] == env_id and row["variant"] == variant]


def _timesteps(runs: list[dict[str, Any]], family: str, env_id: str) -> int:
    return max(row["timesteps"] for row in runs if row["family"] == family and row["env"] == env_id)


def _finite_column(values: list[float]) -> np.ndarray:
    """Finite returns as a ``(runs, 1)`` score matrix (one task)."""
    array = np.asarray(values, dtype=float)
    return array[np.isfinite(array)][:, None]


def _iqm_text(values: list[float]) -> str:
    """``IQM [low, high]`` over the finite returns, with ``(n=k)`` when some runs had none."""
    scores = _finite_column(values)
    if len(scores) < 2:
        return "n/a (< 2 runs)"
    point, low, high = aggregate.iqm_with_interval({"runs": scores})["runs"]
    return f"{point:.1f} [{low:.1f}, {high:.1f}]" + ("" if len(scores) == len(values) else f" (n={len(scores)})")


def _improvement_text(safe: list[float], stock: list[float]) -> str:
    """P(safe > stock) with its interval, bold where the safe variant is worse beyond the interval."""
    safe_scores, stock_scores = _finite_column(safe), _finite_column(stock)
    if len(safe_scores) < 2 or len(stock_scores) < 2:
        return "n/a (< 2 runs)"
    point, low, high = aggregate.probability_of_improvement(safe_scores, stock_scores)
    text = f"{point:.2f} [{low:.2f}, {high:.2f}]"
    return f"**{text} (worse)**" if high < 0.5 else text


def _overall_improvement(pairs: list[tuple[list[float], list[float]]], safe: str, stock: str) -> str:
    """P(safe > stock) averaged over the family's tasks (the tasks' run counts must match), as a sentence."""
    safe_matrix = np.column_stack([np.asarray(pair[0], dtype=float) for pair in pairs])
    stock_matrix = np.column_stack([np.asarray(pair[1], dtype=float) for pair in pairs])
    if not (np.isfinite(safe_matrix).all() and np.isfinite(stock_matrix).all()):
        return "Over all tasks: n/a (some run has no finite return)."
    point, low, high = aggregate.probability_of_improvement(safe_matrix, stock_matrix)
    return (
        f"Over all {len(pairs)} tasks: P({safe} > {stock}) = {point:.2f} [95 % CI {low:.2f}, {high:.2f}]"
        " (averaged over tasks, stratified bootstrap over runs)."
    )


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    """One PNG per env, one panel per algorithm family."""
    plt = reports.pyplot()
    # Grid points before the first finished episode are NaN for every seed: expected, not worth a warning
    warnings.filterwarnings("ignore", "All-NaN slice|Mean of empty slice", RuntimeWarning)
    for env_id in sorted({row["env"] for row in runs}):
        families = [family for family in FAMILIES if any(r["family"] == family and r["env"] == env_id for r in runs)]
        figure, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
        for axis, family in zip(axes[0], families, strict=True):
            grid = np.linspace(0, _timesteps(runs, family, env_id), 100)
            for variant in FAMILIES[family]:
                selected = _select(runs, family, env_id, variant)
                if not selected:
                    continue
                curves = np.array([reports.smoothed_curve(row["curve"], grid) for row in selected])
                axis.plot(grid, np.nanmean(curves, axis=0), label=f"{variant} ({len(selected)} seeds)")
                axis.fill_between(grid, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.2)
            axis.set(title=f"{env_id}: {family} family", xlabel="timesteps", ylabel="training return")
            axis.legend()
        reports.save_figure(figure, out / f"learning_{env_id}.png")
