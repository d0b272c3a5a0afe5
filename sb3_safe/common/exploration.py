"""
Exploration that collapsed or exploded without a NaN: a log-std parameter pinned at a bound of its range.

Bounded log-stds keep training finite, but a log-std that sits at the lower bound (std 2e-9 with SAC's -20) means
the policy no longer explores, and one at the upper bound means its actions are noise. Neither is an error, so
nothing else reports it. :class:`ExplorationWatch` counts the environment steps during which an action dimension's
log-std sits at a bound and warns once per collapse, with an :class:`ExplorationWarning`, after ``patience`` steps;
:class:`~sb3_safe.common.callbacks.NumericsMonitorCallback` and
:class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback` run it after every update, sharing one watch per model.
"""

import math
import warnings
import weakref

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
#: How often the log-std is looked at, per patience (a warning comes at most a twentieth of the patience late)
LOOKS_PER_PATIENCE = 20
#: environment steps at a bound before the warning: 10,000 steps with a std of 2e-9 (or of 7.4 for actions in
#: [-1, 1]) is no exploration phase; short enough to warn within the budgets of small tasks (Pendulum: 20,000)
DEFAULT_PATIENCE = 10_000


class ExplorationWarning(UserWarning):
    """Issued once per collapse (or explosion) when a log-std sits at a bound of its range for many environment steps."""


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
    Count how long some log-std entry has sat at a bound, in environment steps; warn once per collapse (or explosion)
    after ``patience`` steps.

    Environment steps mean the same amount of training for every algorithm, where updates do not (A2C updates every
    5 steps, PPO every 2,048). The log-std is looked at by :meth:`after_update` at rollout boundaries, at most once
    per :data:`LOOKS_PER_PATIENCE`-th of the patience, so a streak is counted from the first look that found it at
    the bound. Every callback that watches one model shares one
    watch (:func:`shared_watch`), so two callbacks give one warning.

    :param patience: environment steps at a bound before the warning
    """

    def __init__(self, patience: int = DEFAULT_PATIENCE):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"collapse_patience must be an int >= 1 (environment steps), got {patience!r}")
        self.patience = patience
        #: the timestep since which some entry sits at the lower / upper bound, or None
        self.low_since: int | None = None
        self.high_since: int | None = None
        #: the last warning's message, once one was issued
        self.message: str | None = None
        self._warned = {"collapsed": False, "exploded": False}
        self._last_look: tuple[int, float | None] | None = None

    def after_update(self, model: BaseAlgorithm) -> float | None:
        """
        Look at the log-std (after an update, and at the start of ``learn()``).

        :param model: the algorithm
        :return: the share of log-std entries at a bound (logged as ``train/log_std_at_bound_fraction``), or None
            for a policy without a log-std parameter
        """
        timestep = model.num_timesteps
        # Another callback already looked at this point of training, or a look is not due: one per twentieth of the
        # patience is enough to count it (A2C and DQN run this every few steps; even finding no log-std costs)
        if self._last_look is not None and timestep - self._last_look[0] < max(1, self.patience // LOOKS_PER_PATIENCE):
            return self._last_look[1]
        found = policy_log_std(model)
        if found is None:
            self._last_look = (timestep, None)
            return None
        log_std, (low, high) = found
        # numpy on a view (a copy only from an accelerator): this runs after every update, and a handful of tiny
        # torch operations cost more than A2C's small updates can hide
        values = log_std.detach().cpu().numpy()
        at_low, at_high = values <= low + AT_BOUND_TOLERANCE, values >= high - AT_BOUND_TOLERANCE
        self.low_since = self._streak(self.low_since, bool(at_low.any()), "collapsed", timestep)
        self.high_since = self._streak(self.high_since, bool(at_high.any()), "exploded", timestep)
        for since, at_bound, what, bound in (
            (self.low_since, at_low, "collapsed", low),
            (self.high_since, at_high, "exploded", high),
        ):
            if since is not None and not self._warned[what] and timestep - since >= self.patience:
                self._warned[what] = True
                self.message = (
                    f"exploration {what} at log_std = {bound:g} (std {math.exp(bound):.3g}) in "
                    f"{int(at_bound.sum())} of {at_bound.size} log-std entries for {timestep - since} environment "
                    f"steps, at timestep {timestep}. Training stays finite, but "
                    + (
                        "the policy no longer explores: raise the lower bound of log_std_range, or ent_coef."
                        if what == "collapsed"
                        else "its actions are mostly noise: lower the upper bound of log_std_range, or ent_coef."
                    )
                )
                warnings.warn(self.message, ExplorationWarning, stacklevel=2)
        fraction = float(np.mean(at_low | at_high))
        self._last_look = (timestep, fraction)
        return fraction

    def _streak(self, since: int | None, at_bound: bool, what: str, timestep: int) -> int | None:
        """The new start of a streak at a bound; leaving the bound ends the collapse (a later one warns again)."""
        if not at_bound:
            self._warned[what] = False
            return None
        return timestep if since is None else since


#: One watch per model, shared by the callbacks that watch it (weakly: a model that is gone takes its watch along)
_WATCHES: "weakref.WeakKeyDictionary[BaseAlgorithm, ExplorationWatch]" = weakref.WeakKeyDictionary()


def shared_watch(model: BaseAlgorithm, watch: ExplorationWatch) -> ExplorationWatch:
    """
    The model's one exploration watch: ``watch`` if the model has none yet, else the existing one, which then warns
    at the smaller of the two patiences.

    :param model: the algorithm
    :param watch: the watch a callback would use on its own
    """
    existing = _WATCHES.setdefault(model, watch)
    existing.patience = min(existing.patience, watch.patience)
    return existing
