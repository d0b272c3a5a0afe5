"""
The statistics of the robustness map (:mod:`benchmarks.robustness`, its grid in :mod:`benchmarks.robustness_grid`):
a task's runs on its grid, normalized scores, the share of cells at the tuned return, the worst case per
learning-rate factor against the best peer's, and the done-when targets checked for the recommended stack.
"""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks import aggregate
from benchmarks.robustness_grid import Task, random_return, tuned_settings

#: A grid cell (seed mean of normalized scores) "is at the tuned return" from this score on
REACH_THRESHOLD = 0.9
#: The recommended stack's targets: IQM of the normalized scores, share of cells at REACH_THRESHOLD
TARGET_IQM = 0.85
TARGET_SHARE = 0.75

#: (lr factor, ent_coef) -> runs of that cell (one per seed)
Cells = dict[tuple[float, float], list[dict[str, Any]]]


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
    :param tuned_ent_coef: the entry's entropy coefficient
    :param random: mean return of a random policy (normalized score 0)
    :param tuned: the stock variant's mean return at factor 1 and the tuned ent_coef (normalized score 1; NaN if it
        has no valid run there)
    """

    task: Task
    cells: dict[str, Cells]
    factors: list[float]
    ent_coefs: list[float]
    tuned_ent_coef: float
    random: float
    tuned: float

    @property
    def normalizable(self) -> bool:
        """Whether the tuned return is above the random one: otherwise a normalized score means nothing."""
        return math.isfinite(self.tuned) and self.tuned > self.random

    def rows(self, variant: str) -> list[dict[str, Any]]:
        """All runs of a variant."""
        return [row for rows in self.cells[variant].values() for row in rows]

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
        seeds = max((len(rows) for cells in self.cells.values() for rows in cells.values()), default=0)
        columns = [
            [self.score(row) for row in sorted(rows, key=lambda row: row["seed"])]
            for _, rows in sorted(self.cells[variant].items())
            if len(rows) == seeds
        ]
        return np.array(columns, dtype=float).T.reshape(seeds, len(columns))


def task_results(task: Task, runs: list[dict[str, Any]]) -> TaskResults:
    """Arrange a task's runs by variant and cell and compute its reference returns."""
    rows = [row for row in runs if row["task"] == task.env_id]
    cells: dict[str, Cells] = {variant: {} for variant in task.variants}
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
# Shares, IQM, worst cases
# --------------------------------------------------------------------------------------------------------------


def cells_reached(result: TaskResults, variant: str) -> tuple[int, int] | None:
    """
    (cells whose seed-mean normalized score is >= REACH_THRESHOLD, cells run); None where the score is not defined
    (the tuned return does not beat the random one) or the variant has no runs.
    """
    scores = result.cell_scores(variant)
    if not result.normalizable or not scores:
        return None
    return sum(score >= REACH_THRESHOLD for score in scores.values()), len(scores)


def iqm_intervals(result: TaskResults) -> dict[str, tuple[float, float, float]]:
    """Per variant with complete cells, (IQM, CI low, CI high) of its normalized scores; empty if not defined."""
    if not result.normalizable:
        return {}
    scores = {variant: result.score_matrix(variant) for variant in result.task.variants}
    return aggregate.iqm_with_interval({variant: matrix for variant, matrix in scores.items() if matrix.size})


def worst_return(result: TaskResults, variant: str, factor: float) -> float | None:
    """
    The minimum final return over ent_coef and seeds at ``factor``: -inf when a run there failed (a failed run
    ranks below any return), None when the variant has no run at ``factor``.
    """
    rows = [row for (f, _), cell in result.cells[variant].items() if f == factor for row in cell]
    if not rows:
        return None
    return float("-inf") if any(failed(row) for row in rows) else min(float(row["final_return"]) for row in rows)


def best_peer_worst(result: TaskResults, factor: float) -> tuple[str, float] | None:
    """The peer with the highest worst case at ``factor`` and that worst case; None if no peer ran there."""
    worsts = [(peer, worst) for peer in result.task.peer_variants if (worst := worst_return(result, peer, factor)) is not None]
    return max(worsts, key=lambda item: item[1]) if worsts else None


def beats_best_peer(result: TaskResults, variant: str, factor: float) -> bool | None:
    """
    Whether the variant's worst case at ``factor`` is >= the best peer's (failed runs on both sides: a tie, so
    yes); None when either has no run there.
    """
    worst, best = worst_return(result, variant, factor), best_peer_worst(result, factor)
    if worst is None or best is None:
        return None
    return worst >= best[1]


# --------------------------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """
    One done-when target of a variant.

    :param name: what is checked
    :param met: True / False; None where it is not defined
    :param text: ``met (...)``, ``missed by X (...)`` or ``n/a (...)`` with the numbers
    """

    name: str
    met: bool | None
    text: str


def targets(result: TaskResults, variant: str, iqms: dict[str, tuple[float, float, float]]) -> list[Target]:
    """
    The recommended stack's targets for one variant: IQM >= TARGET_IQM, >= TARGET_SHARE of the cells at REACH_THRESHOLD of the
    tuned return, and a worst case >= the best peer's at every learning-rate factor.

    :param iqms: :func:`iqm_intervals` of the task
    """
    return [_iqm_target(result, variant, iqms), _share_target(result, variant), _worst_case_target(result, variant)]


def _iqm_target(result: TaskResults, variant: str, iqms: dict[str, tuple[float, float, float]]) -> Target:
    name = f"IQM >= {TARGET_IQM}"
    if variant not in iqms:
        reason = "tuned return not above random" if not result.normalizable else "no complete cell"
        return Target(name, None, f"n/a ({reason})")
    point, low, high = iqms[variant]
    numbers = f"IQM {point:.2f} [{low:.2f}, {high:.2f}]"
    if point >= TARGET_IQM:
        return Target(name, True, f"met ({numbers})")
    return Target(name, False, f"missed by {TARGET_IQM - point:.2f} ({numbers})")


def _share_target(result: TaskResults, variant: str) -> Target:
    name = f">= {TARGET_SHARE:.0%} of cells at >= {REACH_THRESHOLD:.0%} of the tuned return"
    reached = cells_reached(result, variant)
    if reached is None:
        reason = "tuned return not above random" if not result.normalizable else "no runs"
        return Target(name, None, f"n/a ({reason})")
    count, total = reached
    numbers = f"{count} of {total} cells, {count / total:.0%}"
    if count / total >= TARGET_SHARE:
        return Target(name, True, f"met ({numbers})")
    needed = math.ceil(TARGET_SHARE * total - 1e-9)
    return Target(
        name,
        False,
        f"missed by {(TARGET_SHARE - count / total) * 100:.0f} percentage points ({numbers}; {needed} needed)",
    )


def _worst_case_target(result: TaskResults, variant: str) -> Target:
    name = "worst case >= the best peer's at every learning-rate factor"
    verdicts = {factor: beats_best_peer(result, variant, factor) for factor in result.factors}
    compared = [factor for factor, verdict in verdicts.items() if verdict is not None]
    if not compared:
        return Target(name, None, "n/a (no factor with runs of both)")
    below = [factor for factor in compared if not verdicts[factor]]
    if not below:
        return Target(name, True, f"met (at {len(compared)} of {len(compared)} factors)")
    misses = []
    for factor in below:
        worst = worst_return(result, variant, factor)
        best = best_peer_worst(result, factor)
        assert worst is not None and best is not None
        peer, peer_worst = best
        if math.isinf(worst):
            misses.append(f"x{factor:g}: failed runs, {peer}'s worst {peer_worst:.1f}")
        else:
            misses.append(f"x{factor:g} by {peer_worst - worst:.1f} ({worst:.1f} vs {peer}'s {peer_worst:.1f})")
    return Target(name, False, f"missed at {len(below)} of {len(compared)} factors: " + "; ".join(misses))
