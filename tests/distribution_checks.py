"""
Statistical checks of a distribution against its own sampler, in the style of torch's distribution tests.

Each check compares a statistic of many independent samples with what the claim under test predicts, and fails when
the deviation is beyond the ``1 - ALPHA`` quantile of the statistic's sampling distribution (chi-square for counts,
normal for means of many samples, with the standard error estimated from the same samples). So every tolerance
is a sampling standard error times a quantile, none is picked by hand, and a passing claim fails with probability
ALPHA per check (seeds are fixed, so the suite is deterministic).
"""

import itertools
import math
from collections.abc import Callable

import numpy as np
import torch as th
from scipy import stats

#: False-alarm probability of one check, split over the components it tests (Bonferroni)
ALPHA = 1e-6
#: Gauss-Legendre nodes per bin when a log-density is integrated over a bin
QUADRATURE_NODES = 32
#: Smallest expected count of a chi-square category (smaller ones are pooled): the chi-square approximation holds
MIN_EXPECTED_COUNT = 5.0


def normal_threshold(n_components: int = 1) -> float:
    """Two-sided normal quantile at ``ALPHA`` shared by ``n_components`` tests."""
    return float(stats.norm.isf(ALPHA / (2 * n_components)))


def assert_mean_equals(
    samples: th.Tensor,
    expected: th.Tensor | float,
    what: str,
    scale: float = 1.0,
    standard_error: th.Tensor | None = None,
) -> None:
    """
    The mean of ``samples`` (``(n, ...)``, independent along the first dimension) equals ``expected`` within the
    normal quantile of its standard error, for every component, plus the float32 resolution of the quantity's size
    ``scale`` (e.g. ``1 / std`` for a score in the mean): float32 values are not more exact than that.

    :param standard_error: the exact standard error under the claim, where it is known (discrete distributions,
        whose rare actions a sample estimate misses); by default estimated from the samples
    """
    values = samples.detach().double().reshape(samples.shape[0], -1)
    expected_values = th.as_tensor(expected, dtype=th.float64, device=values.device).expand(values.shape[1])
    mean = values.mean(dim=0)
    if standard_error is None:
        standard_error = values.std(dim=0) / math.sqrt(values.shape[0])
    standard_error = standard_error.double().reshape(-1).to(values.device)
    resolution = 4 * th.finfo(th.float32).eps * (scale + expected_values.abs())
    tolerance = normal_threshold(values.shape[1]) * standard_error + resolution
    failed = ((mean - expected_values).abs() > tolerance).nonzero().flatten()[:5].tolist()
    assert not failed, (
        f"{what}: components {failed}: mean {mean[failed].tolist()} != expected {expected_values[failed].tolist()} "
        f"(standard error {standard_error[failed].tolist()})"
    )


def population_standard_error(values: th.Tensor, probabilities: th.Tensor, n_samples: int) -> th.Tensor:
    """
    Exact standard error of the mean of ``n_samples`` draws of a statistic of a discrete distribution, from its value
    at every action (``(n_actions, k)``) and the actions' probabilities.
    """
    values, probabilities = values.detach().double(), probabilities.detach().double()[:, None]
    mean = (probabilities * values).sum(dim=0)
    variance = (probabilities * (values - mean) ** 2).sum(dim=0)
    return (variance / n_samples).sqrt()


def assert_counts_fit(observed: np.ndarray, probabilities: np.ndarray, what: str) -> None:
    """
    Pearson's chi-square test that ``observed`` counts come from ``probabilities`` (which should sum to 1: a
    normalization error shows as a misfit; a remainder ``1 - sum`` is an extra category with no observations).
    """
    n_samples = observed.sum()
    probabilities = np.asarray(probabilities, dtype=np.float64)
    remainder = 1.0 - probabilities.sum()
    if remainder > 0:
        observed, probabilities = np.append(observed, 0), np.append(probabilities, remainder)
    expected = n_samples * probabilities
    small = expected < MIN_EXPECTED_COUNT
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    if len(expected) < 2:
        assert observed[0] == n_samples, f"{what}: all mass predicted in one category"
        return
    statistic = float(((observed - expected) ** 2 / np.maximum(expected, 1e-300)).sum())
    threshold = float(stats.chi2.isf(ALPHA, df=len(expected) - 1))
    assert statistic <= threshold, (
        f"{what}: chi-square {statistic:.1f} > {threshold:.1f}; "
        f"observed {observed.tolist()}, expected {expected.round(1).tolist()}"
    )


def assert_share_equals(hits: th.Tensor, probability: float, what: str) -> None:
    """The share of true values in ``hits`` (independent Bernoulli trials) equals ``probability`` (exact binomial test)."""
    n_hits, n_trials = int(hits.sum()), hits.numel()
    if probability <= 0.0 or probability >= 1.0:
        assert n_hits == round(probability * n_trials), f"{what}: {n_hits} of {n_trials} for probability {probability}"
        return
    p_value = stats.binomtest(n_hits, n_trials, probability).pvalue
    assert p_value >= ALPHA, f"{what}: {n_hits} of {n_trials} ({n_hits / n_trials:.5f}) for probability {probability:.5f}"


def _ordered(value: float) -> int:
    """float32 bit pattern of ``value``, made monotone over the reals."""
    bits = int(np.float32(value).view(np.int32))
    return bits if bits >= 0 else -(bits & 0x7FFFFFFF)


def float32_values(low: float, high: float) -> np.ndarray:
    """Every float32 value in ``[low, high)``, in order."""
    keys = np.arange(_ordered(low), _ordered(high), dtype=np.int64)
    return np.where(keys >= 0, keys, (-keys) | 0x80000000).astype(np.uint32).view(np.float32)


def bin_probabilities(log_prob: Callable[[th.Tensor], th.Tensor], edges: np.ndarray, device: str) -> np.ndarray:
    """
    Probability under ``exp(log_prob)`` of the float32 values in each bin ``[edges[k], edges[k + 1])``.

    A bin of few float32 values is summed value by value, each weighted by the width of the interval that rounds
    to it (this is where float32 quantization shows); a wide bin is integrated by Gauss-Legendre quadrature in
    float64, on float32 points.
    """
    nodes, weights = np.polynomial.legendre.leggauss(QUADRATURE_NODES)
    probabilities = []
    for low, high in itertools.pairwise(edges):
        if _ordered(high) - _ordered(low) <= 64 * QUADRATURE_NODES:
            values = float32_values(low, high)
            above, below = np.nextafter(values, np.float32(np.inf)), np.nextafter(values, np.float32(-np.inf))
            points, point_weights = values, (above.astype(np.float64) - below) / 2
        else:
            half_width, center = (high - low) / 2, (high + low) / 2
            points, point_weights = (center + half_width * nodes).astype(np.float32), half_width * weights
        density = log_prob(th.as_tensor(points.reshape(-1, 1), device=device)).detach().double().cpu().numpy()
        probabilities.append(float((np.exp(density) * point_weights).sum()))
    return np.array(probabilities)


def assert_sampler_matches_density(
    samples: th.Tensor,
    pilot: th.Tensor,
    log_prob: Callable[[th.Tensor], th.Tensor],
    atoms: dict[float, float],
    what: str,
    n_bins: int = 20,
) -> None:
    """
    One-dimensional samples fit ``exp(log_prob)``: one chi-square over the point masses ``atoms`` (value -> its
    log-prob), bins of the density between the smallest and largest value of an independent pilot sample, and the
    rest (values outside those bins, whose probability is what the atoms and bins leave: a normalization error
    shows there).

    :param samples: ``(n, 1)`` samples under test
    :param pilot: an independent sample of the same distribution, for the bin edges
    :param log_prob: the log-prob under test, evaluated on ``(m, 1)`` float32 points
    :param atoms: atom value -> its log-prob under test
    """
    values = samples.double().cpu().numpy().reshape(-1)
    pilot_values = pilot.double().cpu().numpy().reshape(-1)
    on_atom = np.isin(values, list(atoms))
    observed = [int((values == atom).sum()) for atom in atoms]
    probabilities = [math.exp(log_prob_value) for log_prob_value in atoms.values()]
    pilot_inside = pilot_values[~np.isin(pilot_values, list(atoms))]
    if len(np.unique(pilot_inside)) > 1:
        quantiles = np.quantile(pilot_inside, np.linspace(0, 1, n_bins + 1)).astype(np.float32)
        edges = np.unique(np.append(quantiles[:-1], np.nextafter(quantiles[-1], np.float32(np.inf))))
        inside = values[~on_atom]
        bins = np.searchsorted(edges.astype(np.float64), inside, side="right") - 1
        counts = np.bincount(bins[(bins >= 0) & (bins < len(edges) - 1)], minlength=len(edges) - 1)
        observed += [*counts.tolist(), len(inside) - int(counts.sum())]
        probabilities += bin_probabilities(log_prob, edges, str(samples.device)).tolist()
    else:  # (almost) everything on the atoms
        observed.append(int((~on_atom).sum()))
    # probabilities summing to more than 1 leave no rest, and show as too few observations in the chi-square
    rest = max(1.0 - sum(probabilities), 0.0)
    assert_counts_fit(np.array(observed), np.array([*probabilities, rest]), what)
