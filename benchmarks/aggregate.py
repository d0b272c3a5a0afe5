"""
Aggregate statistics for few-seed results, as recommended by Agarwal et al. 2021 ("Deep RL at the edge of the
statistical precipice") and computed with their library ``rliable``: the interquartile mean (IQM) with a
stratified bootstrap confidence interval, and performance profiles (the share of runs above each score).

Scores are normalized per task before they are pooled across tasks: ``(score - low) / (high - low)`` with the
task's reference scores (e.g. random and tuned return), so that a single IQM can summarize several tasks.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

#: Bootstrap resamples and confidence level of every interval in the reports
BOOTSTRAP_REPS = 2000
CONFIDENCE = 0.95


@contextmanager
def _seeded_bootstrap(seed: int = 0) -> Iterator[None]:
    # rliable passes a RandomState to arch's bootstrap, which arch (>= 7) deprecates with a FutureWarning per call;
    # arch's two-sample bootstrap also draws from numpy's global generator: seeded, so a report is reproducible
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
        yield


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of all entries of a ``(runs, tasks)`` score matrix (NaN entries dropped)."""
    from rliable import metrics

    return float(metrics.aggregate_iqm(scores[np.isfinite(scores)].reshape(-1, 1)))


def iqm_with_interval(scores: dict[str, np.ndarray], seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """
    IQM and its stratified bootstrap confidence interval per variant.

    :param scores: per variant, a ``(runs, tasks)`` matrix (rows: seeds; columns: tasks or grid cells)
    :return: per variant ``(iqm, low, high)``
    """
    from rliable import library

    intervals: dict[str, tuple[float, float, float]] = {}
    for name, matrix in scores.items():
        with _seeded_bootstrap(seed):
            point, interval = library.get_interval_estimates(
                {name: np.asarray(matrix, dtype=float)},
                lambda x: np.array([_iqm_of(x)]),
                reps=BOOTSTRAP_REPS,
                confidence_interval_size=CONFIDENCE,
                random_state=np.random.RandomState(seed),
            )
        intervals[name] = (float(point[name][0]), float(interval[name][0, 0]), float(interval[name][1, 0]))
    return intervals


def probability_of_improvement(better: np.ndarray, other: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """
    P(a run of ``better`` scores above a run of ``other`` on the same task), averaged over tasks, with its stratified
    bootstrap confidence interval (rliable's ``probability_of_improvement``: the Mann-Whitney U statistic per task;
    ties count one half). 0.5: no difference; the claim "no worse" holds where the interval's upper end is >= 0.5.

    :param better: ``(runs, tasks)`` scores of the variant tested
    :param other: ``(runs, tasks)`` scores of the reference, same tasks in the same columns
    :return: ``(probability, low, high)``
    """
    from rliable import library, metrics

    with _seeded_bootstrap(seed):
        point, interval = library.get_interval_estimates(
            {"pair": (np.asarray(better, dtype=float), np.asarray(other, dtype=float))},
            lambda x, y: np.array([metrics.probability_of_improvement(x, y)]),
            reps=BOOTSTRAP_REPS,
            confidence_interval_size=CONFIDENCE,
            random_state=np.random.RandomState(seed),
        )
    return float(point["pair"][0]), float(interval["pair"][0, 0]), float(interval["pair"][1, 0])


def iqm_ratio_with_interval(variant: np.ndarray, reference: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """
    The ratio of two IQMs, ``IQM(variant) / IQM(reference)``, with its stratified two-sample bootstrap confidence
    interval (each sample resampled on its own, as rliable resamples pairs).

    :param variant: ``(runs, tasks)`` scores of the variant tested
    :param reference: ``(runs, tasks)`` scores of the reference (positive IQM)
    :return: ``(ratio, low, high)``
    """
    from rliable import library

    with _seeded_bootstrap(seed):
        point, interval = library.get_interval_estimates(
            {"pair": (np.asarray(variant, dtype=float), np.asarray(reference, dtype=float))},
            lambda x, y: np.array([_iqm_of(x) / _iqm_of(y)]),
            reps=BOOTSTRAP_REPS,
            confidence_interval_size=CONFIDENCE,
            random_state=np.random.RandomState(seed),
        )
    return float(point["pair"][0]), float(interval["pair"][0, 0]), float(interval["pair"][1, 0])


def _iqm_of(matrix: np.ndarray) -> float:
    from rliable import metrics

    return float(metrics.aggregate_iqm(matrix))


def markdown_table(scores: dict[str, np.ndarray], digits: int = 1, label: str = "IQM") -> list[str]:
    """A table of IQM [95 % CI] per variant, with the number of runs pooled."""
    intervals = iqm_with_interval(scores)
    rows = [
        f"| {name} | {point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] | {np.asarray(scores[name]).size} |"
        for name, (point, low, high) in intervals.items()
    ]
    return [
        f"| variant | {label} [{CONFIDENCE:.0%} stratified bootstrap CI] | runs x tasks |",
        "|---|---|---|",
        *rows,
    ]


def performance_profile(
    axis: Any, scores: dict[str, np.ndarray], thresholds: np.ndarray, xlabel: str = "normalized score"
) -> None:
    """
    Draw performance profiles (share of runs with a score above each threshold) with their bootstrap bands.

    :param axis: a matplotlib axis
    :param scores: per variant, a ``(runs, tasks)`` matrix of normalized scores
    """
    from rliable import library, plot_utils

    with _seeded_bootstrap():
        profiles, bands = library.create_performance_profile(
            {name: np.asarray(matrix, dtype=float) for name, matrix in scores.items()}, thresholds, reps=BOOTSTRAP_REPS
        )
    plot_utils.plot_performance_profiles(
        profiles,
        thresholds,
        performance_profile_cis=bands,
        ax=axis,
        xlabel=xlabel,
        labelsize="medium",
        ticklabelsize="small",
        legend=True,
    )


def normalize(values: np.ndarray, low: float, high: float) -> np.ndarray:
    """``(values - low) / (high - low)``: 0 at ``low`` (e.g. a random policy), 1 at ``high`` (e.g. the tuned return)."""
    return (np.asarray(values, dtype=float) - low) / (high - low)
