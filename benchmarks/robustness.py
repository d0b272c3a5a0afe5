"""
Robustness map: stock SB3 vs sb3-safe on a grid around rl-zoo's tuned learning rate and entropy coefficient.

Grid: learning rate = the tuned value x (0.3, 1, 3, 10, 30, 100, 300) (a ``lin_`` schedule has its initial value
scaled and stays linear), entropy coefficient in {tuned, 0.1}, seeds 0, 1, 2, on two tasks:

- Pendulum-v1 with rl-zoo's ``ppo.yml`` entry: stock PPO, PPO with SafeMlpPolicy and KLAdaptivePPO, the two safe
  variants with ``NonFiniteGuardCallback(on_nonfinite="rollback")``;
- CartPole-v1 with rl-zoo's ``a2c.yml`` entry: stock A2C vs SafeA2C with the guard in rollback mode.

Budget (size ``full``): Pendulum-v1 49,152 steps per run (12 rollouts of 4 x 1,024; half of rl-zoo's 1e5, by which
the tuned PPO has converged: -150 at 49k steps in the learning suite; halved so that the suite fits on the 2-core
machine next to the full-budget MuJoCo runs), CartPole-v1 100,000 steps (a fifth of rl-zoo's 5e5); 126 Pendulum and
84 CartPole runs. Per run: exception, non-finite parameters, guard rollbacks, final return (deterministic policy, 10
episodes). The report (``robustness.md``) has per task the failures and rollbacks per variant, the share of grid
cells reaching 90 % of the tuned return (normalized by a random policy's return), the worst case per learning-rate
factor, rliable's IQM with a stratified bootstrap interval, heatmaps (``robustness_<env>.png``) and performance
profiles (``robustness_profile.png``).

Wall time estimate of the full size with ``--jobs 2``: measured per run on this 2-core machine at a 1-min load of
about 1, PPO Pendulum-v1 takes about 1.5 s per 4,096-step rollout, so 37-45 s per 100k-step run for the three
variants (half that at 49k steps), and A2C CartPole-v1 about 11 s per 100k steps plus up to 3 s of evaluation: about
3,700 CPU-seconds in all, i.e. about 30 min on two free cores and 45-55 min when they are shared with one other busy
process. At a load of 3-5 (the quick size's run here: 2.7 min with ``--jobs 1``) runs took 2-3 times as long, which
would put the full size at 2-3 hours. The measured wall time is in the report's header.
"""

import functools
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import aggregate, configs, reports, suite, training, variants

SUITE = "robustness"
#: Learning rate = tuned x factor: log-spaced around 1, mostly above it (too high is the common mistake)
LR_FACTORS = {"tiny": (1.0, 100.0), "quick": (1.0, 30.0, 300.0), "full": (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)}
#: The entropy coefficient besides the tuned one (both tuned entries use 0.0: no entropy bonus)
HIGH_ENT_COEF = 0.1
#: Entropy coefficients per size: the tuned one only, or also HIGH_ENT_COEF
ENT_COEF_CHOICES = {"tiny": ("tuned",), "quick": ("tuned",), "full": ("tuned", "high")}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
EVAL_EPISODES = {"tiny": 1, "quick": 5, "full": 10}
#: A grid cell (seed mean of normalized scores) "reaches the tuned return" at this share of it
REACH_THRESHOLD = 0.9
#: Episodes of the uniform random policy whose mean return is the 0 of the normalized score
RANDOM_EPISODES = 100


@dataclass(frozen=True)
class Task:
    """
    One environment with one rl-zoo entry and the variants compared on it.

    :param env_id: the environment (and the task's name in rows and file names)
    :param zoo_file: the rl-zoo file read (``"ppo"`` or ``"a2c"``)
    :param stock: the stock variant (its return at the tuned settings is the 1 of the normalized score)
    :param safe: the sb3-safe variants
    :param timesteps: training budget per size; tiny: one rollout of the zoo's settings (Pendulum: 4 x 1024)
    """

    env_id: str
    zoo_file: str
    stock: str
    safe: tuple[str, ...]
    timesteps: dict[str, int] = field(default_factory=dict)

    @property
    def variants(self) -> tuple[str, ...]:
        return (self.stock, *self.safe)


TASKS = {
    task.env_id: task
    for task in (
        Task(
            "Pendulum-v1",
            "ppo",
            "PPO",
            ("PPO+SafeMlpPolicy+guard", "KLAdaptivePPO+guard"),
            dict(tiny=4_096, quick=16_384, full=49_152),
        ),
        Task("CartPole-v1", "a2c", "A2C", ("SafeA2C+guard",), dict(tiny=1_000, quick=20_000, full=100_000)),
    )
}


# --------------------------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------------------------


def tuned_settings(task: Task) -> tuple[Any, float]:
    """
    The zoo entry's learning rate (a float or zoo's linear schedule) and entropy coefficient; where the entry sets
    none (a2c.yml's CartPole-v1 sets no learning rate), the stock algorithm's default, which rl-zoo then trains with.
    """
    config = configs.zoo_config(task.zoo_file, task.env_id)
    defaults = inspect.signature(_stock_class(task).__init__).parameters
    learning_rate = config.kwargs.get("learning_rate", defaults["learning_rate"].default)
    ent_coef = float(config.kwargs.get("ent_coef", defaults["ent_coef"].default))
    return learning_rate, ent_coef


def _stock_class(task: Task) -> type:
    from stable_baselines3 import A2C, PPO

    return {"PPO": PPO, "A2C": A2C}[variants.VARIANTS[task.stock].algo]


def initial_learning_rate(learning_rate: Any) -> float:
    """The learning rate at the start of training: the value, or a linear schedule's initial value."""
    from rl_zoo3.utils import SimpleLinearSchedule

    if isinstance(learning_rate, SimpleLinearSchedule):
        return learning_rate.initial_value
    if callable(learning_rate):
        raise TypeError(f"only rl-zoo's linear schedules can be scaled, not {learning_rate!r}")
    return float(learning_rate)


def scaled_learning_rate(learning_rate: Any, factor: float) -> float | str:
    """
    ``learning_rate`` x ``factor`` as a zoo override: a float, or for zoo's ``lin_`` schedule the string
    ``lin_<initial value x factor>``, so the whole schedule is scaled and stays linear (to 0 at the end).
    """
    from rl_zoo3.utils import SimpleLinearSchedule

    scaled = initial_learning_rate(learning_rate) * factor
    return f"lin_{scaled!r}" if isinstance(learning_rate, SimpleLinearSchedule) else scaled


def ent_coefs(task: Task, size: str) -> list[float]:
    """The entropy coefficients of the grid at ``size`` (one if the tuned one is HIGH_ENT_COEF)."""
    tuned = tuned_settings(task)[1]
    values = [tuned if choice == "tuned" else HIGH_ENT_COEF for choice in ENT_COEF_CHOICES[size]]
    return sorted(set(values))


def jobs(size: str) -> list[tuple[str, str, float, float, int, int, int]]:
    """(task, variant, lr factor, ent_coef, seed, timesteps, eval episodes), the slow PPO task first."""
    tasks = sorted(TASKS.values(), key=lambda task: task.zoo_file != "ppo")
    return [
        (task.env_id, variant, factor, ent_coef, seed, task.timesteps[size], EVAL_EPISODES[size])
        for task in tasks
        for factor in LR_FACTORS[size]
        for ent_coef in ent_coefs(task, size)
        for seed in SEEDS[size]
        for variant in task.variants
    ]


def run_job(job: tuple[str, str, float, float, int, int, int]) -> list[dict[str, Any]]:
    """Train and evaluate one grid cell's run; crashes are results."""
    env_id, variant, factor, ent_coef, seed, timesteps, episodes = job
    task = TASKS[env_id]
    tuned_lr, _ = tuned_settings(task)
    config = configs.zoo_config(task.zoo_file, env_id, learning_rate=scaled_learning_rate(tuned_lr, factor), ent_coef=ent_coef)
    row = training.train(variants.VARIANTS[variant], env_id, config, timesteps, seed, episodes)
    return [
        dict(
            task=env_id,
            lr_factor=factor,
            ent_coef=ent_coef,
            learning_rate=initial_learning_rate(tuned_lr) * factor,
            lr_schedule="linear" if callable(tuned_lr) else "constant",
            **row,
        )
    ]


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    return dict(
        seeds=list(SEEDS[size]),
        eval_episodes=EVAL_EPISODES[size],
        lr_factors=list(LR_FACTORS[size]),
        ent_coefs={env_id: ent_coefs(task, size) for env_id, task in TASKS.items()},
        timesteps={env_id: task.timesteps[size] for env_id, task in TASKS.items()},
    )


# --------------------------------------------------------------------------------------------------------------
# Scores
# --------------------------------------------------------------------------------------------------------------


@functools.cache
def random_return(env_id: str, episodes: int = RANDOM_EPISODES, seed: int = 0) -> float:
    """Mean return of uniformly random actions over ``episodes`` seeded episodes: the 0 of the normalized score."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def failed(row: dict[str, Any]) -> bool:
    """An exception in ``learn()`` or in the evaluation, or non-finite parameters: the run has no valid return."""
    return (
        bool(row["error"]) or bool(row.get("eval_error")) or not row["params_finite"] or not math.isfinite(row["final_return"])
    )


@dataclass
class TaskResults:
    """
    One task's runs arranged on the grid, with the references of its normalized score.

    :param task: the task
    :param cells: per variant, the runs of each (lr factor, ent_coef) cell
    :param factors: the learning-rate factors run
    :param ent_coefs: the entropy coefficients run
    :param tuned_ent_coef: the zoo's entropy coefficient
    :param random: mean return of a random policy (normalized score 0)
    :param tuned: the stock variant's mean return at factor 1 and the tuned ent_coef (normalized score 1; NaN if it
        has no finite run there)
    """

    task: Task
    cells: dict[str, dict[tuple[float, float], list[dict[str, Any]]]]
    factors: list[float]
    ent_coefs: list[float]
    tuned_ent_coef: float
    random: float
    tuned: float

    @property
    def normalizable(self) -> bool:
        """Whether the tuned return is above the random one: otherwise a normalized score means nothing."""
        return math.isfinite(self.tuned) and self.tuned > self.random

    def score(self, row: dict[str, Any]) -> float:
        """Normalized score of a run; a failed run scores 0, the random policy's score."""
        if failed(row):
            return 0.0
        return float(aggregate.normalize(np.array([row["final_return"]]), self.random, self.tuned)[0])

    def cell_scores(self, variant: str) -> dict[tuple[float, float], float]:
        """Seed mean of the normalized scores per cell."""
        return {cell: float(np.mean([self.score(row) for row in rows])) for cell, rows in self.cells[variant].items()}

    def score_matrix(self, variant: str) -> np.ndarray:
        """``(seeds, cells)`` normalized scores for rliable, over the cells that have every seed (complete cells)."""
        seeds = max(len(rows) for cells in self.cells.values() for rows in cells.values())
        columns = [
            [self.score(row) for row in sorted(rows, key=lambda row: row["seed"])]
            for _, rows in sorted(self.cells[variant].items())
            if len(rows) == seeds
        ]
        return np.array(columns, dtype=float).T.reshape(seeds, len(columns))


def task_results(task: Task, runs: list[dict[str, Any]]) -> TaskResults:
    """Arrange a task's runs by variant and cell and compute its reference returns."""
    rows = [row for row in runs if row["task"] == task.env_id]
    cells: dict[str, dict[tuple[float, float], list[dict[str, Any]]]] = {variant: {} for variant in task.variants}
    for row in rows:
        cells.setdefault(row["variant"], {}).setdefault((row["lr_factor"], row["ent_coef"]), []).append(row)
    tuned_ent_coef = tuned_settings(task)[1]
    at_tuned = [row["final_return"] for row in cells[task.stock].get((1.0, tuned_ent_coef), []) if not failed(row)]
    return TaskResults(
        task,
        cells,
        sorted({row["lr_factor"] for row in rows}),
        sorted({row["ent_coef"] for row in rows}),
        tuned_ent_coef,
        random_return(task.env_id),
        float(np.mean(at_tuned)) if at_tuned else float("nan"),
    )


# --------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------

HEADLINE_HEADER = [
    "variant",
    "runs crashed or non-finite (of N)",
    "exceptions / non-finite params / evaluation errors",
    "guard rollbacks (total)",
    "runs stopped by the guard",
    "skipped optimizer steps (total)",
    f"cells reaching >= {REACH_THRESHOLD:.0%} of the tuned return",
]


def report(out: Path) -> None:
    """``robustness.md``, ``robustness_<env>.png`` (heatmaps) and ``robustness_profile.png`` from the JSONL."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    results = [task_results(task, runs) for task in TASKS.values() if any(row["task"] == task.env_id for row in runs)]
    grid = meta.get("budget", {})
    lines = reports.report_header(
        "Robustness map: learning rate x entropy coefficient around rl-zoo's tuned settings, stock SB3 vs sb3-safe",
        meta,
        [
            f"Grid: learning rate = tuned x ({', '.join(f'{factor:g}' for factor in grid.get('lr_factors', []))});"
            " ent_coef ("
            + " / ".join(
                f"{env_id}: {', '.join(f'{ent:g}' for ent in ents)}" for env_id, ents in grid.get("ent_coefs", {}).items()
            )
            + ")"
            + f"; seeds {grid.get('seeds')}; timesteps per run "
            + ", ".join(f"{env_id} {steps:,}" for env_id, steps in grid.get("timesteps", {}).items())
            + f"; final return: deterministic policy, {grid.get('eval_episodes')} evaluation episodes on a fresh env.",
            "Hyperparameters: otherwise rl-zoo's tuned entries, read from the installed `rl_zoo3/hyperparams/`:",
            "Variants: stock SB3 (MlpPolicy); PPO with SafeMlpPolicy; KLAdaptivePPO and SafeA2C (their defaults); every"
            " sb3-safe variant with `NonFiniteGuardCallback(on_nonfinite='rollback')` (each rollback restores the last"
            " healthy state and halves the learning rate; after 3 rollbacks the guard stops training, and the run is"
            " evaluated as it stands: 'stopped by the guard').",
            "Failed run: an exception in `learn()` or in the evaluation, or non-finite parameters at the end. Its return"
            " is NaN: the worst return in the worst-case tables, normalized score 0 (the random policy's) in the shares,"
            " the IQM, the heatmaps' colour and the performance profiles.",
            "Normalized score: (return - random) / (tuned - random); random: the mean return of uniformly random actions"
            f" over {RANDOM_EPISODES} seeded episodes; tuned: the stock variant's mean return at factor 1 and the tuned"
            " ent_coef in this run (values per task below). A cell (learning rate, ent_coef) 'reaches the tuned return'"
            f" when its seed mean score is >= {REACH_THRESHOLD}.",
        ],
    )
    # The zoo entries as sub-items of the hyperparameters item
    at = next(i for i, line in enumerate(lines) if line.startswith("- Hyperparameters")) + 1
    lines[at:at] = [f"  - {_describe(result.task, _timesteps(result))}" for result in results]
    for result in results:
        lines += _task_section(result)
    lines += [
        "## Performance profiles",
        "",
        "Share of runs (all cells and seeds) with a normalized score above each threshold, 95 % stratified bootstrap"
        " bands (rliable); failed runs score 0.",
        "",
        f"![profiles]({SUITE}_profile.png)",
    ]
    reports.write_report(out / f"{SUITE}.md", lines)
    for result in results:
        plot_heatmaps(result, out)
    plot_profiles(results, out)


def _describe(task: Task, timesteps: int) -> str:
    """The zoo entry and how its learning rate and entropy coefficient are set."""
    learning_rate, ent_coef = tuned_settings(task)
    config = configs.zoo_config(task.zoo_file, task.env_id)
    if "learning_rate" not in config.kwargs:
        source = f"{_stock_class(task).__name__}'s default {learning_rate:g} (the entry sets none)"
    elif callable(learning_rate):
        source = f"lin_{initial_learning_rate(learning_rate):g} (initial value scaled, schedule kept linear)"
    else:
        source = f"{learning_rate:g} (constant)"
    return f"{configs.describe_zoo(config, timesteps)}; tuned learning rate {source}, tuned ent_coef {ent_coef:g}"


def _timesteps(result: TaskResults) -> int:
    return max(row["timesteps"] for cells in result.cells.values() for rows in cells.values() for row in rows)


def _task_section(result: TaskResults) -> list[str]:
    """A task's headline table, worst case per learning-rate factor, IQM and heatmaps."""
    task = result.task
    at_tuned = result.cells[task.stock].get((1.0, result.tuned_ent_coef), [])
    n_valid = sum(not failed(row) for row in at_tuned)
    lines = [
        f"## {task.env_id}: {task.stock} vs {', '.join(task.safe)}",
        "",
        f"References: random policy {result.random:.1f}; tuned return {result.tuned:.1f} ({task.stock} at factor 1,"
        f" ent_coef {result.tuned_ent_coef:g}, mean of the {n_valid} run(s) with a valid return of {len(at_tuned)}).",
        "",
    ]
    if not result.normalizable:
        lines += [
            "**The tuned return does not exceed the random policy's at this budget: normalized scores, shares and IQM are"
            " not defined (n/a).**",
            "",
        ]
    headline = []
    for variant in task.variants:
        rows = [row for cells in result.cells[variant].values() for row in cells]
        exceptions = sum(bool(row["error"]) for row in rows)
        nonfinite = sum(not row["params_finite"] for row in rows)
        eval_errors = sum(bool(row.get("eval_error")) for row in rows)
        cells = result.cell_scores(variant)
        reached = sum(score >= REACH_THRESHOLD for score in cells.values())
        headline.append(
            [
                variant,
                f"{sum(failed(row) for row in rows)} of {len(rows)}",
                f"{exceptions} / {nonfinite} / {eval_errors}",
                _total(rows, "guard_rollbacks"),
                _total(rows, "guard_stopped"),
                _total(rows, "skipped_updates"),
                f"{reached} of {len(cells)} ({reached / len(cells):.0%})" if result.normalizable and cells else "n/a",
            ]
        )
    lines += ["### Headline", "", *reports.table(HEADLINE_HEADER, headline), ""]
    lines += _worst_case(result)
    if result.normalizable:
        scores = {variant: result.score_matrix(variant) for variant in task.variants}
        lines += [
            "### IQM of the normalized scores over all cells",
            "",
            *aggregate.markdown_table(scores, digits=2, label="IQM normalized score"),
            "",
            "Runs x tasks: seeds x grid cells (the bootstrap resamples seeds within each cell"
            + (
                "; with one seed there is nothing to resample: the interval is the point)."
                if len(scores[task.stock]) < 2
                else ")."
            ),
            "",
        ]
    lines += [
        f"![{task.env_id}]({SUITE}_{task.env_id}.png)",
        "",
        "Heatmaps: colour = mean final return over seeds (a failed run counted at the random policy's return), one"
        " colour scale per task; 'xN': N failed seeds; 'rN': N guard rollbacks in the cell's runs.",
        "",
    ]
    errors = [
        f"- {variant}: " + "; ".join(f"`{error}`" for error in sorted(messages))
        for variant in task.variants
        if (messages := {_error_text(row) for rows in result.cells[variant].values() for row in rows if failed(row)})
    ]
    if errors:
        lines += ["Failures (type: first line):", "", *errors, ""]
    return lines


def _worst_case(result: TaskResults) -> list[str]:
    """Per learning-rate factor, each variant's worst return and whether each safe variant's is >= stock's."""
    task = result.task
    rows, verdicts = [], {variant: [] for variant in task.safe}
    for factor in result.factors:
        worst = {variant: _worst(result, variant, factor) for variant in task.variants}
        cells = [f"x{factor:g}", *[text for _, text in worst.values()]]
        for variant in task.safe:
            safe, stock = worst[variant][0], worst[task.stock][0]
            if math.isinf(safe) and math.isinf(stock):
                cells.append("tie (both have failed runs)")
                verdicts[variant].append(True)
            else:
                cells.append("yes" if safe >= stock else "**no**")
                verdicts[variant].append(safe >= stock)
        rows.append(cells)
    header = [
        "lr factor",
        *[f"{variant} worst return" for variant in task.variants],
        *[f"{variant} >= {task.stock}?" for variant in task.safe],
    ]
    lines = [
        "### Worst case per learning-rate factor",
        "",
        f"Minimum final return over ent_coef ({', '.join(f'{ent:g}' for ent in result.ent_coefs)}) and seeds;"
        " 'failed k of n': k runs without a valid return, which rank below any return.",
        "",
        *reports.table(header, rows),
        "",
    ]
    for variant, passed in verdicts.items():
        below = [f"x{factor:g}" for factor, ok in zip(result.factors, passed, strict=True) if not ok]
        lines.append(
            f"- {variant}: worst case >= {task.stock}'s at {sum(passed)} of {len(passed)} learning-rate factors"
            + (f"; below it at {', '.join(below)}." if below else ".")
        )
    seeds = max((len(rows) for rows in result.cells[task.stock].values()), default=0)
    n_runs = len(result.ent_coefs) * seeds
    lines += [
        f"- A minimum over {n_runs} run{'s' if n_runs != 1 else ''} per factor and variant: a single run decides it, so"
        " a 'no' or 'yes' between two finite returns is within seed noise unless the gap is large.",
        "",
    ]
    return lines


def _worst(result: TaskResults, variant: str, factor: float) -> tuple[float, str]:
    """(sort key, text): the minimum return at ``factor``, -inf when a run there failed."""
    rows = [row for (f, _), cell in result.cells[variant].items() if f == factor for row in cell]
    if not rows:
        return float("nan"), "n/a"
    n_failed = sum(failed(row) for row in rows)
    if n_failed:
        return float("-inf"), f"failed {n_failed} of {len(rows)}"
    worst = min(row["final_return"] for row in rows)
    return worst, f"{worst:.1f}"


def _total(rows: list[dict[str, Any]], key: str) -> int | str:
    """Sum of ``key`` over the rows, ``-`` where the variant does not record it (no guard, stock algorithm)."""
    values = [row[key] for row in rows if row.get(key) is not None]
    return int(sum(values)) if values else "-"


def _error_text(row: dict[str, Any]) -> str:
    if row["error"]:
        return row["error"]
    if row.get("eval_error"):
        return f"in evaluation: {row['eval_error']}"
    return "non-finite parameters"


# --------------------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------------------


def plot_heatmaps(result: TaskResults, out: Path) -> None:
    """One panel per variant: rows ent_coef, columns learning-rate factor, colour the seed mean return."""
    plt = reports.pyplot()
    task = result.task
    means, texts = {}, {}
    for variant in task.variants:
        grid = np.full((len(result.ent_coefs), len(result.factors)), np.nan)
        text = np.full(grid.shape, "", dtype=object)
        for (factor, ent_coef), rows in result.cells[variant].items():
            i, j = result.ent_coefs.index(ent_coef), result.factors.index(factor)
            # A failed run has no return: it counts as the random policy's, as in the aggregates
            grid[i, j] = np.mean([result.random if failed(row) else row["final_return"] for row in rows])
            n_failed = sum(failed(row) for row in rows)
            rollbacks = sum(row["guard_rollbacks"] or 0 for row in rows)
            text[i, j] = (
                f"{grid[i, j]:.0f}" + (f"\nx{n_failed}" if n_failed else "") + (f"\nr{rollbacks}" if rollbacks else "")
            )
        means[variant], texts[variant] = grid, text
    values = np.concatenate([grid[np.isfinite(grid)] for grid in means.values()])
    low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    if high <= low:
        low, high = low - 1.0, high + 1.0
    n = len(task.variants)
    figure, axes = plt.subplots(
        1,
        n + 1,
        figsize=(1.0 + n * (1.2 + 0.75 * len(result.factors)), 1.6 + 0.9 * len(result.ent_coefs)),
        gridspec_kw=dict(width_ratios=[1.0] * n + [0.05]),
    )
    image = None
    for axis, variant in zip(axes[:-1], task.variants, strict=True):
        image = axis.imshow(means[variant], vmin=low, vmax=high, cmap="viridis", aspect="auto", origin="lower")
        for (i, j), text in np.ndenumerate(texts[variant]):
            # Dark text on the bright end of viridis, white on the dark end
            bright = np.isfinite(means[variant][i, j]) and means[variant][i, j] > (low + high) / 2
            axis.text(j, i, text, ha="center", va="center", fontsize=7, color="black" if bright else "white")
        axis.set_xticks(range(len(result.factors)), [f"x{factor:g}" for factor in result.factors], fontsize=8)
        axis.set_yticks(range(len(result.ent_coefs)), [f"{ent:g}" for ent in result.ent_coefs], fontsize=8)
        axis.set(title=variant, xlabel="learning rate / tuned", ylabel="ent_coef")
        axis.title.set_fontsize(9)
    assert image is not None
    figure.colorbar(image, cax=axes[-1], label="mean final return")
    figure.suptitle(f"{task.env_id}: final return over the grid (xN failed seeds, rN rollbacks)", fontsize=10)
    reports.save_figure(figure, out / f"{SUITE}_{task.env_id}.png")


def plot_profiles(results: list[TaskResults], out: Path) -> None:
    """Performance profiles of the normalized scores, one panel per task (a note where they are not defined)."""
    plt = reports.pyplot()
    figure, axes = plt.subplots(1, max(len(results), 1), figsize=(6 * max(len(results), 1), 4), squeeze=False)
    for axis, result in zip(axes[0], results, strict=False):
        axis.set_title(result.task.env_id)
        if not result.normalizable:
            axis.text(0.5, 0.5, "tuned return <= random return:\nno normalized score", ha="center", va="center")
            axis.set_axis_off()
            continue
        scores = {variant: result.score_matrix(variant) for variant in result.task.variants}
        top = max(1.25, max(float(np.max(matrix)) for matrix in scores.values() if matrix.size))
        aggregate.performance_profile(axis, scores, np.linspace(0.0, top, 61))
        axis.axvline(REACH_THRESHOLD, color="grey", linestyle=":", linewidth=1)
    reports.save_figure(figure, out / f"{SUITE}_profile.png")
