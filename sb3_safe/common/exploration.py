"""
Exploration that collapsed or exploded without a NaN: a log-std parameter pinned at a bound of its range.

Bounded log-stds keep training finite, but a log-std that sits at the lower bound (std 2e-9 with SAC's -20) means
the policy no longer explores, and one at the upper bound means its actions are noise. Neither is an error, so
nothing else reports it. :class:`ExplorationWatch` counts consecutive updates during which an action dimension's
log-std sits at a bound and warns once, with an :class:`ExplorationWarning`, after ``patience`` of them;
:class:`~sb3_safe.common.callbacks.NumericsMonitorCallback` and
:class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback` run it after every update.
"""

import math
import warnings

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_safe.common.distributions import DEFAULT_LOG_STD_RANGE

#: Log-std range of policies without a ``log_std_range`` (SB3's own), also used by ``sb3-safe doctor``. Ceiling 5
#: (std 148): SB3 recommends actions scaled to [-1, 1], where nearly every action sampled with such a std is clipped
#: to a bound; it is 3 above the ceiling of sb3-safe's default range (SAC's 2, std 7.4), leaving room for wider
#: action spaces. Floor -20 (std 2e-9, SAC's): below float32's resolution near 1 (6e-8), sampling returns the mean.
STOCK_LOG_STD_RANGE = (DEFAULT_LOG_STD_RANGE[0], 5.0)
#: how close to a bound a log-std counts as sitting on it (the projection puts it exactly there)
AT_BOUND_TOLERANCE = 1e-3
#: consecutive updates at a bound before the warning
DEFAULT_PATIENCE = 50


class ExplorationWarning(UserWarning):
    """Issued once per training run when a log-std sits at a bound of its range for many consecutive updates."""


def policy_log_std(model: BaseAlgorithm) -> tuple[th.Tensor, tuple[float, float]] | None:
    """
    The policy's log-std parameter and its range (the policy's ``log_std_range``, else :data:`STOCK_LOG_STD_RANGE`),
    or None for policies without one (discrete actions).

    :param model: an SB3 / sb3-contrib algorithm
    """
    log_std = getattr(model.policy, "log_std", None)
    if not isinstance(log_std, th.Tensor):
        return None
    low, high = getattr(model.policy, "log_std_range", STOCK_LOG_STD_RANGE)
    return log_std, (float(low), float(high))


class ExplorationWatch:
    """
    Count consecutive updates during which some log-std entry sits at a bound; warn once after ``patience``.

    :param patience: consecutive updates at a bound before the warning
    """

    def __init__(self, patience: int = DEFAULT_PATIENCE):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience!r}")
        self.patience = patience
        #: consecutive updates (so far) with some entry at the lower / upper bound
        self.updates_at_low = self.updates_at_high = 0
        #: the warning's message, once it was issued
        self.message: str | None = None

    def after_update(self, model: BaseAlgorithm) -> float | None:
        """
        Look at the log-std after an update.

        :param model: the algorithm
        :return: the share of log-std entries at a bound (logged as ``train/log_std_at_bound_fraction``), or None
            for a policy without a log-std parameter
        """
        found = policy_log_std(model)
        if found is None:
            return None
        log_std, (low, high) = found
        # numpy on a view (a copy only from an accelerator): this runs after every update, and a handful of tiny
        # torch operations cost more than A2C's small updates can hide
        values = log_std.detach().cpu().numpy()
        at_low, at_high = values <= low + AT_BOUND_TOLERANCE, values >= high - AT_BOUND_TOLERANCE
        self.updates_at_low = self.updates_at_low + 1 if at_low.any() else 0
        self.updates_at_high = self.updates_at_high + 1 if at_high.any() else 0
        if self.message is None:
            for updates, at_bound, what, bound in (
                (self.updates_at_low, at_low, "collapsed", low),
                (self.updates_at_high, at_high, "exploded", high),
            ):
                if updates >= self.patience:
                    self.message = (
                        f"exploration {what} at log_std = {bound:g} (std {math.exp(bound):.3g}) in "
                        f"{int(at_bound.sum())} of {at_bound.size} log-std entries for {updates} updates, at "
                        f"timestep {model.num_timesteps}. Training stays finite, but "
                        + (
                            "the policy no longer explores: raise the lower bound of log_std_range, or ent_coef."
                            if what == "collapsed"
                            else "its actions are mostly noise: lower the upper bound of log_std_range, or ent_coef."
                        )
                    )
                    warnings.warn(self.message, ExplorationWarning, stacklevel=2)
                    break
        return float(np.mean(at_low | at_high))
