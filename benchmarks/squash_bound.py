"""
Where to clip the squashed Gaussian: the bias of its score at the bound, measured for bounds 3, 4, 5 and 6.

``python -m benchmarks.squash_bound [--samples N]`` writes ``benchmarks/results/squash_bound.md``.

The squashed Gaussian (``sb3_safe.common.distributions.squash``) clips ``u`` at ``+-bound``; the limit actions carry
the censored mass, inside the density is evaluated at the stored float32 action. One float32 step of the action
spans ``2^-24 / (1 - tanh(u)^2)`` in ``u``, so near the bound the density at a stored action is the probability of
that action only while the std is well above that step. The measurement: mean ``u = bound`` (half of the mass on
the limit, half in the coarsest cells), stds from 1e-1 to 1e-4; the score in the mean and in the log-std averaged
over the distribution's own samples must be 0. Reported as ``mean / standard error`` (|z| > 5 is a bias, not noise).
"""

import argparse
import contextlib
import math
import platform
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch as th

from sb3_safe.common import distributions

BOUNDS = (3.0, 4.0, 5.0, 6.0)
STDS = (1e-1, 1e-2, 1e-3, 1e-4)


@contextlib.contextmanager
def squash_bound(bound: float) -> Iterator[None]:
    """Use another clipping bound for the duration (the library's is a module constant)."""
    saved = distributions.PRESQUASH_BOUND, distributions.TANH_BOUND, distributions._LOG_TANH_BOUND
    tanh_bound = float(np.float32(math.tanh(bound)))
    distributions.PRESQUASH_BOUND, distributions.TANH_BOUND = bound, tanh_bound
    distributions._LOG_TANH_BOUND = math.log(tanh_bound)
    try:
        yield
    finally:
        distributions.PRESQUASH_BOUND, distributions.TANH_BOUND, distributions._LOG_TANH_BOUND = saved


def score_z(bound: float, std: float, n_samples: int) -> tuple[float, float]:
    """z-scores of the mean score in the mean and in the log-std, at mean = bound."""
    th.manual_seed(0)
    mean = th.full((n_samples, 1), bound, requires_grad=True)
    log_std = th.full((n_samples, 1), math.log(std), requires_grad=True)
    dist = distributions.SquashedBoundedGaussianDistribution(1, (-20.0, 2.0)).proba_distribution(mean, log_std)
    samples = dist.sample().detach()
    scores = th.autograd.grad(dist.log_prob(samples).sum(), [mean, log_std])
    z_values = []
    for score in scores:
        values = score.double().reshape(-1)
        z_values.append(values.mean().item() / (values.std().item() / math.sqrt(n_samples)))
    return z_values[0], z_values[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=400_000)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    th.set_num_threads(1)
    lines = [
        "# Squashed Gaussian: where to clip u",
        "",
        f"Command: `python -m benchmarks.squash_bound --samples {args.samples}`; "
        f"{platform.processor() or platform.machine()}, torch {th.__version__}, float32.",
        "",
        "z-scores of the mean score (mean / standard error) under the distribution's own samples, mean u = bound "
        "(half of the mass on the limit action). Unbiased: |z| below ~5 (the suite's checks use 5.3 for two "
        "components at false-alarm rate 1e-6).",
        "",
        "| bound | tanh(bound) | float32 step in u at the bound | "
        + " | ".join(f"std {std:g}: z mean, z log-std" for std in STDS)
        + " |",
        "|---|---|---|" + "---|" * len(STDS),
    ]
    for bound in BOUNDS:
        cell = 2.0**-24 / (1 - math.tanh(bound) ** 2)
        with squash_bound(bound):
            cells = [score_z(bound, std, args.samples) for std in STDS]
        shown = " | ".join(f"{z_mean:+.1f}, {z_log_std:+.1f}" for z_mean, z_log_std in cells)
        lines.append(f"| {bound:g} | {math.tanh(bound):.5f} | {cell:.1e} | {shown} |")
        print(lines[-1], flush=True)
    lines += [
        "",
        "Reading: the log-std score is biased once the std is within ~10 float32 steps of u at the bound; the smaller "
        "the bound, the finer the steps. sb3-safe clips at 3 (`PRESQUASH_BOUND`): exact down to the smallest std in "
        "this table, while tanh(3) = 0.995 keeps nearly all of tanh's range (actions are divided by tanh(3), so the "
        "limit actions are exactly the Box bounds). Past the table the step keeps growing (0.13 in u at a bound of 8, by "
        "the same measure), and float32 tanh rounds onto 1 from u ~ 8.5, where a stored action no longer tells u apart.",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "squash_bound.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
