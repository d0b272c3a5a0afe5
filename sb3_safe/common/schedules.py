"""
Learning-rate schedule scaling: one scale on the model's schedule, which
:class:`~sb3_safe.common.adaptive_lr.KLAdaptiveLRCallback` adapts after each update and
:class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback` lowers at each rollback.

SB3 sets the optimizer learning rate from ``model.lr_schedule`` at every ``train()``, so a learning rate changed in
the optimizers alone lasts until the next update. :func:`scale_learning_rate` scales the schedule itself, the
learning rate ``load()`` rebuilds the schedule from (so the scale is saved with the model), and the optimizers (for
the rest of the current update).
"""

from collections.abc import Iterable

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import FloatSchedule


class ScaledSchedule:
    """
    A learning-rate schedule multiplied by a constant factor.

    SB3 sets the optimizer learning rate from ``model.lr_schedule`` at every ``train()``, so scaling the schedule
    (rather than the optimizer) keeps a lowered learning rate for the rest of training, whatever the schedule.
    A module-level class, not a closure, so that ``model.save()`` can pickle it. It is never negative: SB3's progress
    goes below 0 in the last rollout when the budget is not a multiple of it, where rl-zoo's linear schedules turn
    negative (a step up the loss); scaled up (the adaptive lr holds a decayed schedule at its lower bound) that step
    would be as many times larger.

    :param schedule: the schedule (or constant learning rate) to scale
    :param scale: the factor
    """

    def __init__(self, schedule: Schedule | float, scale: float) -> None:
        self.schedule = FloatSchedule(schedule)
        self.scale = scale

    def __call__(self, progress_remaining: float) -> float:
        return max(0.0, self.scale * self.schedule(progress_remaining))

    def __repr__(self) -> str:
        return f"ScaledSchedule({self.schedule}, scale={self.scale})"


def scale_schedule(schedule: Schedule | float, factor: float) -> ScaledSchedule:
    """
    A new schedule equal to ``factor`` times ``schedule``, folding nested scalings into one.

    :param schedule: the schedule (or constant) to scale; left unchanged, as other objects may refer to it
    :param factor: the factor
    """
    scaled = _scaled(schedule)
    if scaled is not None:
        return ScaledSchedule(scaled.schedule, scaled.scale * factor)
    return ScaledSchedule(schedule, factor)


def _scaled(schedule: Schedule | float) -> ScaledSchedule | None:
    """The ScaledSchedule ``schedule`` is, or wraps (``load()`` rebuilds ``lr_schedule`` as a FloatSchedule of it)."""
    if isinstance(schedule, FloatSchedule):
        schedule = schedule.value_schedule
    return schedule if isinstance(schedule, ScaledSchedule) else None


def scale_learning_rate(model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer], factor: float) -> None:
    """
    Multiply the learning rate of ``model`` by ``factor`` for the rest of training, also across ``save`` / ``load``.

    :param model: the algorithm; its ``lr_schedule`` and ``learning_rate`` are replaced by scaled schedules
    :param optimizers: the optimizers whose current learning rate is scaled too
    :param factor: the factor
    """
    # lr_schedule drives train(); learning_rate is what load() rebuilds lr_schedule from
    model.lr_schedule = scale_schedule(model.lr_schedule, factor)
    model.learning_rate = scale_schedule(model.learning_rate, factor)
    # SB3 re-applies the schedule at the next train(); this holds for the rest of the current one
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] *= factor


def learning_rate_scale(model: BaseAlgorithm) -> float:
    """
    The factor sb3-safe's scalings have applied to the model's learning-rate schedule so far (1.0 if none).

    :param model: the algorithm
    """
    scaled = _scaled(model.lr_schedule)
    return 1.0 if scaled is None else scaled.scale


def current_learning_rate(model: BaseAlgorithm) -> float:
    """
    The learning rate the next ``train()`` will set: the (scaled) schedule at the current progress.

    :param model: the algorithm
    """
    return float(model.lr_schedule(model._current_progress_remaining))
