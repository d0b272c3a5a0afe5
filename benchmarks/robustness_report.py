"""
The robustness map's report (:mod:`benchmarks.robustness`): ``robustness.md`` with, per task, the counts of each
variant, the IQM and the share of cells at the tuned return, the worst case per learning-rate factor against the
best peer's and the targets of the recommended stack; the heatmaps ``robustness_<env>.png`` and the performance
profiles ``robustness_profile.png``. Built from the JSONL alone (``python -m benchmarks report robustness``).
"""

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import aggregate, configs, reports, suite
from benchmarks.robustness_grid import (
    RANDOM_EPISODES,
    SUITE,
    TASKS,
    initial_learning_rate,
    job_key,
    jobs,
    row_key,
    stock_class,
    task_config,
    tuned_settings,
)
from benchmarks.robustness_scores import (
    REACH_THRESHOLD,
    TARGET_IQM,
    TARGET_SHARE,
    TaskResults,
    beats_best_peer,
    best_peer_worst,
    cells_reached,
    failed,
    iqm_intervals,
    targets,
    task_results,
    worst_return,
)

HEADLINE_HEADER = [
    "variant",
    "role",
    "runs failed (of N)",
    "exceptions / non-finite params / evaluation errors",
    "guard rollbacks (total)",
    "runs stopped by the guard",
    "updates redone by the adaptive lr (total)",
    "skipped optimizer steps (total)",
    f"IQM normalized score [{aggregate.CONFIDENCE:.0%} CI]",
    f"cells >= {REACH_THRESHOLD:.0%} of tuned",
]


#: Runs of the map repeated on another CPU with the same code and seeds, read beside the map's JSONL if present
REPLICATE_FILE = f"{SUITE}_cpu_replicate.jsonl"


def report(out: Path) -> None:
    """``robustness.md``, the heatmaps and the performance profiles from ``robustness.jsonl`` in ``out``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    results = [task_results(task, runs) for task in TASKS.values() if any(row["task"] == task.env_id for row in runs)]
    lines = reports.report_header(
        "Robustness map, second edition: training through a wrong learning rate, peers vs sb3-safe",
        meta,
        _budget_lines(meta, runs),
    )
    # The tasks as sub-items of the grid item
    at = next(i for i, line in enumerate(lines) if line.startswith("- Grid per task")) + 1
    grid = meta.get("budget", {}).get("tasks", {})
    lines[at:at] = [f"  - {_describe(result, grid.get(result.task.env_id, {}).get('overrides'))}" for result in results]
    for result in results:
        lines += _task_section(result)
    replicate = out / REPLICATE_FILE
    if replicate.exists():
        lines += cpu_replicate_section(suite.read_jsonl(replicate), {result.task.env_id: result for result in results})
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


def cpu_replicate_section(
    replicate: tuple[dict[str, Any], list[dict[str, Any]]], results: dict[str, TaskResults]
) -> list[str]:
    """
    How far chance decides a run at the map's budgets: the same jobs (code, settings, seed) on two CPUs, whose float
    kernels round differently, compared per task and variant on the normalized scores of ``results`` (its
    references).

    :param replicate: the meta row and the runs of :data:`REPLICATE_FILE`, each job once per CPU (``cpu``)
    :param results: the map's results per task
    """
    meta, runs = replicate
    by_job: dict[Any, dict[str, dict[str, Any]]] = {}
    for row in runs:
        by_job.setdefault(row_key(row), {})[row["cpu"]] = row
    pairs = {key: list(rows.values()) for key, rows in by_job.items() if len(rows) == 2 and key[0] in results}
    cpus = sorted({row["cpu"] for rows in pairs.values() for row in rows})
    table_rows = []
    for task_variant in sorted({key[:2] for key in pairs}):
        result = results[task_variant[0]]
        keys = [key for key in pairs if key[:2] == task_variant]
        scores = {key: [result.score(row) for row in pairs[key]] for key in keys}
        cells: dict[Any, list[list[float]]] = {}
        for key in keys:
            cells.setdefault(key[2:4], []).append(scores[key])
        # Cells with as many seeds as the map's: their seed means on each CPU
        seeds = max(len(rows) for rows in result.cells[task_variant[1]].values())
        whole = [np.mean(cell, axis=0) for cell in cells.values() if len(cell) == seeds]
        table_rows.append(
            [
                *task_variant,
                len(keys),
                sum(pairs[key][0]["final_return"] == pairs[key][1]["final_return"] for key in keys),
                f"{np.median([abs(a - b) for a, b in scores.values()]):.2f}",
                sum((a >= REACH_THRESHOLD) != (b >= REACH_THRESHOLD) for a, b in scores.values()),
                f"{sum((a >= REACH_THRESHOLD) != (b >= REACH_THRESHOLD) for a, b in whole)} of {len(whole)}",
            ]
        )
    header = [
        "task",
        "variant",
        "runs on both CPUs",
        "same final return",
        "median difference of normalized score",
        f"runs on different sides of {REACH_THRESHOLD:.0%}",
        f"cells (all seeds) on different sides of {REACH_THRESHOLD:.0%}",
    ]
    return [
        "## The same runs on another CPU",
        "",
        f"{meta.get('note', '')}. CPUs: {', '.join(cpus)}. A run's settings and seed fix it on one machine; another"
        " CPU's float kernels round differently, and over tens of thousands of steps some runs part as far as two seeds."
        " Scores use this map's references.",
        "",
        *reports.table(header, table_rows),
        "",
    ]


def _budget_lines(meta: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """The header's items: the grid, variants, definitions, the commits of a resumed run and what is missing."""
    episodes = meta.get("budget", {}).get("eval_episodes", "?")
    lines = [
        "Grid per task (as run): learning rate = tuned x factor, entropy coefficient, seeds; otherwise the entry's"
        f" settings. Final return: deterministic policy, {episodes} evaluation episodes on a fresh env.",
        "Peers: stock SB3 / sb3-contrib (`MlpPolicy`, `MlpLstmPolicy`; the normalization reference); `(target_kl=0.01)`:"
        " SB3's early stop of PPO's epochs at that approximate KL; `+SBX-lr`: SBX's `KLAdaptiveLR` rule as SBX applies"
        " it, after every minibatch on that minibatch's ratio before its step (`benchmarks/peers.py`).",
        "sb3-safe: the safe policy (`SafeMlpPolicy`, `SafeMlpLstmPolicy`, `SafeMaskableMlpPolicy`) or algorithm"
        " (KLAdaptivePPO, SafeA2C; their defaults); `+guard`: `NonFiniteGuardCallback(on_nonfinite='rollback')` (each"
        " rollback restores the last healthy state and lowers the learning rate; after 3 the guard stops training and"
        " the run is evaluated as it stands); `+KL-lr`: `KLAdaptiveLRCallback()` with its defaults. The recommended"
        " stack is the `+KL-lr` variants: its targets are checked per task.",
        "Failed run: an exception in `learn()` or in the evaluation, or non-finite parameters at the end: the worst"
        " return in the worst-case tables, normalized score 0 in the shares, the IQM, the heatmaps and the profiles.",
        "Normalized score: (return - random) / (tuned - random); random: the mean return of a uniformly random policy"
        f" over {RANDOM_EPISODES} seeded episodes (with action masks: uniform among the allowed actions); tuned: the"
        " stock variant's mean return at factor 1 and the tuned ent_coef in this run. A cell (learning rate, ent_coef)"
        f" is 'at >= {REACH_THRESHOLD:.0%} of tuned' when its seed-mean score is >= {REACH_THRESHOLD}: the targets'"
        " 'tuned return kept' is the same statistic.",
    ]
    lines += _missing_lines(meta, runs)
    if meta.get("sessions", 1) > 1:
        commits = ", ".join(str(commit) for commit in dict.fromkeys(meta.get("commits", [])))
        lines.append(
            f"Resumed: run in {meta['sessions']} parts (interrupted, then continued), rows from commits {commits};"
            " the wall time is the sum of the parts."
        )
    return lines


def _missing_lines(meta: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    """A partial run's item: how many of the size's runs are in the JSONL, and which slices are missing."""
    planned = jobs(meta.get("size", "full"))
    done = {row_key(row) for row in runs}
    missing = [job for job in planned if job_key(job) not in done]
    if not missing:
        return []
    slices = Counter((job[0], job[3]) for job in missing)
    return [
        f"**Partial run: {len(planned) - len(missing)} of the {len(planned)} runs of this size are in the JSONL.**"
        f" Missing (task, ent_coef: runs): {'; '.join(f'{task}, {ent:g}: {n}' for (task, ent), n in slices.items())}."
        " Every table and score below is computed from the runs present; rerun the command to complete it."
    ]


def _describe(result: TaskResults, overrides: dict[str, Any] | None) -> str:
    """
    The task's entry and budget, how its learning rate and entropy coefficient are set, and its grid.

    :param overrides: settings the size changed (recorded in the meta row)
    """
    task = result.task
    learning_rate, ent_coef = tuned_settings(task)
    config = task_config(task)
    if "learning_rate" not in config.kwargs:
        source = f"{stock_class(task).__name__}'s default {learning_rate:g} (the entry sets none)"
    elif callable(learning_rate):
        source = f"lin_{initial_learning_rate(learning_rate):g} (initial value scaled, schedule kept linear)"
    else:
        source = f"{learning_rate:g} (constant)"
    rows = [row for variant in task.variants for row in result.rows(variant)]
    timesteps = max(row["timesteps"] for row in rows)
    seeds = sorted({row["seed"] for row in rows})
    return (
        f"{configs.describe_zoo(config, timesteps)} [{task.algo}]; tuned learning rate {source}, tuned ent_coef"
        f" {ent_coef:g}; factors {', '.join(f'x{factor:g}' for factor in result.factors)}; ent_coef"
        f" {', '.join(f'{ent:g}' for ent in result.ent_coefs)}; seeds {seeds}"
        + (f"; changed at this size: {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else "")
    )


def _task_section(result: TaskResults) -> list[str]:
    """A task's headline table, worst case per learning-rate factor, targets and heatmaps."""
    task = result.task
    at_tuned = result.cells[task.stock].get((1.0, result.tuned_ent_coef), [])
    n_valid = sum(not failed(row) for row in at_tuned)
    lines = [
        f"## {task.env_id} ({task.algo})",
        "",
        f"Peers: {', '.join(task.peer_variants)}; sb3-safe: {', '.join(task.safe)}. {task.note}",
        "",
        f"References: random policy {result.random:.1f}; tuned return {result.tuned:.1f} ({task.stock} at factor 1,"
        f" ent_coef {result.tuned_ent_coef:g}, mean of the {n_valid} run(s) with a valid return of {len(at_tuned)}).",
        "",
    ]
    if not result.normalizable:
        lines += [
            "**The tuned return does not exceed the random policy's at this budget: normalized scores, shares, IQM and"
            " the first two targets are not defined (n/a).**",
            "",
        ]
    iqms = iqm_intervals(result)
    lines += ["### Headline", "", *reports.table(HEADLINE_HEADER, [_headline(result, v, iqms) for v in task.variants])]
    seeds = max((len(rows) for cells in result.cells.values() for rows in cells.values()), default=0)
    lines += [
        "",
        "IQM over seeds x grid cells (the bootstrap resamples seeds within each cell"
        + ("; with one seed the interval is the point)." if seeds < 2 else ")."),
        "",
        *_worst_case(result),
        *_targets(result, iqms),
        f"![{task.env_id}]({SUITE}_{task.env_id}.png)",
        "",
        "Heatmaps: colour = mean final return over seeds (a failed run counted at the random policy's return), one"
        " colour scale per task; 'xN': N failed seeds; 'rN': N guard rollbacks; 'uN': N updates redone by the"
        " adaptive lr, in the cell's runs.",
        "",
    ]
    errors = [
        f"- {variant}: " + "; ".join(f"`{error}`" for error in sorted(messages))
        for variant in task.variants
        if (messages := {_error_text(row) for row in result.rows(variant) if failed(row)})
    ]
    if errors:
        lines += ["Failures (type: first line):", "", *errors, ""]
    return lines


def _headline(result: TaskResults, variant: str, iqms: dict[str, tuple[float, float, float]]) -> list[Any]:
    task, rows = result.task, result.rows(variant)
    if variant == task.stock:
        role = "peer (stock)"
    elif variant in task.peers:
        role = "peer"
    else:
        role = "sb3-safe, recommended" if variant in task.recommended else "sb3-safe"
    reached = cells_reached(result, variant)
    iqm = f"{iqms[variant][0]:.2f} [{iqms[variant][1]:.2f}, {iqms[variant][2]:.2f}]" if variant in iqms else "n/a"
    return [
        variant,
        role,
        f"{sum(failed(row) for row in rows)} of {len(rows)}",
        " / ".join(
            str(n)
            for n in (
                sum(bool(row["error"]) for row in rows),
                sum(not row["params_finite"] for row in rows),
                sum(bool(row.get("eval_error")) for row in rows),
            )
        ),
        _total(rows, "guard_rollbacks"),
        _total(rows, "guard_stopped"),
        _total(rows, "redone_updates"),
        _total(rows, "skipped_updates"),
        iqm,
        f"{reached[0]} of {reached[1]} ({reached[0] / reached[1]:.0%})" if reached else "n/a",
    ]


def _worst_case(result: TaskResults) -> list[str]:
    """Per factor, each variant's worst return, the best peer's, and whether each sb3-safe variant's is >= it."""
    task = result.task
    rows = []
    for factor in result.factors:
        best = best_peer_worst(result, factor)
        verdicts = [beats_best_peer(result, variant, factor) for variant in task.safe]
        rows.append(
            [
                f"x{factor:g}",
                *[_worst_text(result, variant, factor) for variant in task.variants],
                "n/a" if best is None else f"{best[0]}",
                *["n/a" if verdict is None else "yes" if verdict else "**no**" for verdict in verdicts],
            ]
        )
    header = [
        "lr factor",
        *[f"{variant} worst return" for variant in task.variants],
        "best peer",
        *[f"{variant} >= best peer?" for variant in task.safe],
    ]
    n_runs = len(result.ent_coefs) * max((len(rows) for rows in result.cells[task.stock].values()), default=0)
    return [
        "### Worst case per learning-rate factor",
        "",
        f"Minimum final return over ent_coef ({', '.join(f'{ent:g}' for ent in result.ent_coefs)}) and seeds;"
        " 'failed k of n': k runs without a valid return, which rank below any return (failed runs on both sides"
        " count as a tie). Best peer: the peer with the highest worst case at that factor.",
        "",
        *reports.table(header, rows),
        "",
        f"A minimum over {n_runs} run{'s' if n_runs != 1 else ''} per factor and variant: a single run decides it, so a"
        " 'no' or 'yes' between two close finite returns is within seed noise.",
        "",
    ]


def _worst_text(result: TaskResults, variant: str, factor: float) -> str:
    worst = worst_return(result, variant, factor)
    if worst is None:
        return "n/a"
    if math.isinf(worst):
        rows = [row for (f, _), cell in result.cells[variant].items() if f == factor for row in cell]
        return f"failed {sum(failed(row) for row in rows)} of {len(rows)}"
    return f"{worst:.1f}"


def _targets(result: TaskResults, iqms: dict[str, tuple[float, float, float]]) -> list[str]:
    """The recommended stack's targets, checked per recommended variant: met or missed by how much."""
    lines = [
        "### Targets of the recommended stack",
        "",
        f"Done when: IQM >= {TARGET_IQM}, >= {TARGET_SHARE:.0%} of the cells at >= {REACH_THRESHOLD:.0%} of the tuned"
        " return, worst case >= the best peer's at every learning-rate factor.",
        "",
    ]
    for variant in result.task.recommended:
        checked = targets(result, variant, iqms)
        met = sum(target.met is True for target in checked)
        lines.append(f"- **{variant}**: {met} of {len(checked)} met")
        lines += [f"  - {target.name}: {target.text}" for target in checked]
    return [*lines, ""]


def _total(rows: list[dict[str, Any]], key: str) -> int | str:
    """Sum of ``key`` over the rows, ``-`` where the variant does not record it (no guard, no adaptive lr)."""
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

#: Heatmap panels per row of the figure
PANELS_PER_ROW = 3


def plot_heatmaps(result: TaskResults, out: Path) -> None:
    """One panel per variant: rows ent_coef, columns learning-rate factor, colour the seed mean return."""
    plt = reports.pyplot()
    task = result.task
    grids = {variant: _heatmap(result, variant) for variant in task.variants}
    values = np.concatenate([grid[np.isfinite(grid)] for grid, _ in grids.values()])
    low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
    if high <= low:
        low, high = low - 1.0, high + 1.0
    n_rows = math.ceil(len(task.variants) / PANELS_PER_ROW)
    n_cols = min(len(task.variants), PANELS_PER_ROW)
    figure, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(1.5 + n_cols * (1.4 + 0.7 * len(result.factors)), n_rows * (1.6 + 0.9 * len(result.ent_coefs))),
        squeeze=False,
        layout="constrained",  # room for the shared colour bar
    )
    image = None
    for axis, variant in zip(axes.flat, task.variants, strict=False):
        grid, texts = grids[variant]
        image = axis.imshow(grid, vmin=low, vmax=high, cmap="viridis", aspect="auto", origin="lower")
        for (i, j), text in np.ndenumerate(texts):
            # Dark text on the bright end of viridis, white on the dark end
            bright = np.isfinite(grid[i, j]) and grid[i, j] > (low + high) / 2
            axis.text(j, i, text, ha="center", va="center", fontsize=7, color="black" if bright else "white")
        axis.set_xticks(range(len(result.factors)), [f"x{factor:g}" for factor in result.factors], fontsize=8)
        axis.set_yticks(range(len(result.ent_coefs)), [f"{ent:g}" for ent in result.ent_coefs], fontsize=8)
        axis.set(title=variant, xlabel="learning rate / tuned", ylabel="ent_coef")
        axis.title.set_fontsize(9)
    for axis in list(axes.flat)[len(task.variants) :]:
        axis.set_axis_off()
    assert image is not None
    figure.suptitle(f"{task.env_id}: final return over the grid (xN failed, rN rollbacks, uN redone)", fontsize=10)
    figure.colorbar(image, ax=axes, label="mean final return", shrink=0.9)
    figure.savefig(out / f"{SUITE}_{task.env_id}.png", dpi=100)
    plt.close(figure)


def _heatmap(result: TaskResults, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """(seed mean return, cell text) on the (ent_coef, factor) grid of one variant."""
    grid = np.full((len(result.ent_coefs), len(result.factors)), np.nan)
    texts = np.full(grid.shape, "", dtype=object)
    for (factor, ent_coef), rows in result.cells[variant].items():
        i, j = result.ent_coefs.index(ent_coef), result.factors.index(factor)
        # A failed run has no return: it counts as the random policy's, as in the aggregates
        grid[i, j] = np.mean([result.random if failed(row) else row["final_return"] for row in rows])
        counts = {
            "x": sum(failed(row) for row in rows),
            "r": sum(row.get("guard_rollbacks") or 0 for row in rows),
            "u": sum(row.get("redone_updates") or 0 for row in rows),
        }
        texts[i, j] = f"{grid[i, j]:.0f}" + "".join(f"\n{mark}{count}" for mark, count in counts.items() if count)
    return grid, texts


def plot_profiles(results: list[TaskResults], out: Path) -> None:
    """Performance profiles of the normalized scores, one panel per task (a note where they are not defined)."""
    plt = reports.pyplot()
    n = max(len(results), 1)
    figure, axes = plt.subplots(1, n, figsize=(6 * n, 4.5), squeeze=False)
    for axis, result in zip(axes[0], results, strict=False):
        axis.set_title(result.task.env_id)
        scores = {variant: result.score_matrix(variant) for variant in result.task.variants}
        scores = {variant: matrix for variant, matrix in scores.items() if matrix.size}
        if not result.normalizable or not scores:
            axis.text(0.5, 0.5, "tuned return <= random return:\nno normalized score", ha="center", va="center")
            axis.set_axis_off()
            continue
        top = max(1.25, max(float(np.max(matrix)) for matrix in scores.values()))
        aggregate.performance_profile(axis, scores, np.linspace(0.0, top, 61))
        axis.axvline(REACH_THRESHOLD, color="grey", linestyle=":", linewidth=1)
    reports.save_figure(figure, out / f"{SUITE}_profile.png")
