"""
Learning-rate schedule scaling: one scale of the model's learning rate, which
:class:`~sb3_safe.common.adaptive_lr.KLAdaptiveLRCallback` adapts after each update and
:class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback` lowers at each rollback, and the bounds the adaptive
learning rate may clamp it into.

The configured learning rate is the user's: ``model.learning_rate`` is never replaced. The scale lives in a model
attribute (:data:`LEARNING_RATE_SCALE`, a float that ``model.save()`` stores with the model's other attributes) and
is applied to ``model.lr_schedule``, the schedule SB3 sets the optimizers from at every ``train()``, by wrapping it
in a :class:`ScaledSchedule`. ``load()`` (and ``_setup_model()``) rebuild ``lr_schedule`` from ``learning_rate``
without the scale: :func:`apply_learning_rate_scale` wraps it again, which every function here that reads the
learning rate does, as sb3-safe's callbacks do at the start of each ``learn()`` and sb3-safe's algorithms when they
set their schedule up. A scale of 1 without bounds leaves a model's ``lr_schedule`` as SB3 made it.

The bounds clamp the rate a step uses, never the scale: what is saved is what the decisions chose, and a schedule
that decays below the lower bound is held there without raising the scale. They belong to the adaptive learning
rate that set them, which sets them again at each ``learn()``: they are not saved.

A schedule is never read past its end: SB3's progress goes below 0 in the last rollout when the budget is not a
multiple of it, where rl-zoo's linear schedules turn negative (a step up the loss, an inverted clip range).
"""

import math
from collections.abc import Iterable

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import FloatSchedule

#: The model attribute holding the learning-rate scale (absent: 1); saved and loaded with the model
LEARNING_RATE_SCALE = "sb3_safe_lr_scale"


class ScaledSchedule:
    """
    A learning-rate schedule multiplied by a constant factor, optionally clamped into bounds.

    SB3 sets the optimizer learning rate from ``model.lr_schedule`` at every ``train()``, so scaling the schedule
    (rather than the optimizer) keeps a lowered learning rate for the rest of training, whatever the schedule.
    A module-level class, not a closure, so that ``model.save()`` can pickle it. It reads the schedule at progress
    0 past the end of training and is never negative.

    :param schedule: the schedule (or constant learning rate) to scale
    :param scale: the factor
    :param bounds: ``(lowest, highest)`` learning rate the schedule returns, or None
    """

    #: (the class attribute: schedules pickled before bounds existed have none)
    bounds: tuple[float, float] | None = None

    def __init__(self, schedule: Schedule | float, scale: float, bounds: tuple[float, float] | None = None) -> None:
        self.schedule = FloatSchedule(schedule)
        self.scale = scale
        self.bounds = bounds

    def unbounded(self, progress_remaining: float) -> float:
        """
        The scaled learning rate before the bounds clamp it (never negative).

        :param progress_remaining: SB3's progress remaining, from 1 to 0
        """
        return max(0.0, self.scale * self.schedule(max(progress_remaining, 0.0)))

    def __call__(self, progress_remaining: float) -> float:
        learning_rate = self.unbounded(progress_remaining)
        if self.bounds is not None:
            learning_rate = min(max(learning_rate, self.bounds[0]), self.bounds[1])
        return learning_rate

    def __repr__(self) -> str:
        bounds = "" if self.bounds is None else f", bounds={self.bounds}"
        return f"ScaledSchedule({self.schedule}, scale={self.scale}{bounds})"


class ReadFromZero:
    """
    A schedule read at progress 0 where SB3 would read it past the end of training (progress < 0).

    :param schedule: the schedule (or constant)
    """

    def __init__(self, schedule: Schedule | float) -> None:
        self.schedule = FloatSchedule(schedule)

    def __call__(self, progress_remaining: float) -> float:
        return self.schedule(max(progress_remaining, 0.0))

    def __repr__(self) -> str:
        return f"ReadFromZero({self.schedule})"


def scale_schedule(schedule: Schedule | float, factor: float) -> ScaledSchedule:
    """
    A new schedule equal to ``factor`` times ``schedule``, folding nested scalings into one (bounds kept).

    :param schedule: the schedule (or constant) to scale; left unchanged, as other objects may refer to it
    :param factor: the factor
    """
    while isinstance(schedule, FloatSchedule | ReadFromZero):
        schedule = schedule.value_schedule if isinstance(schedule, FloatSchedule) else schedule.schedule
    if isinstance(schedule, ScaledSchedule):
        return ScaledSchedule(schedule.schedule, schedule.scale * factor, schedule.bounds)
    return ScaledSchedule(schedule, factor)


def _without_read_from_zero(schedule: Schedule) -> Schedule:
    """``schedule`` without the ReadFromZero stand-ins put around it for an update past the end of training."""
    while isinstance(schedule, ReadFromZero):
        schedule = schedule.schedule
        if isinstance(schedule, FloatSchedule):  # ReadFromZero's own wrapper
            schedule = schedule.value_schedule
    return schedule


def _applied(model: BaseAlgorithm) -> ScaledSchedule | None:
    """
    The ScaledSchedule sb3-safe made ``model.lr_schedule`` (also behind a ReadFromZero stand-in), or None. A
    ScaledSchedule inside SB3's FloatSchedule came from ``learning_rate``: the user's (or a model saved when the
    scale was kept there), part of the configured schedule.
    """
    schedule = _without_read_from_zero(model.lr_schedule)
    return schedule if isinstance(schedule, ScaledSchedule) else None


def _configured_schedule(model: BaseAlgorithm) -> Schedule:
    """The model's learning-rate schedule before sb3-safe's scale and bounds (SB3's, from ``learning_rate``)."""
    applied = _applied(model)
    return applied.schedule if applied is not None else _without_read_from_zero(model.lr_schedule)


def learning_rate_scale(model: BaseAlgorithm) -> float:
    """
    The factor sb3-safe's scalings (KL decisions, redos, rollbacks) have applied to the model's configured learning
    rate so far (1.0 if none); saved with the model.

    :param model: the algorithm
    """
    return float(getattr(model, LEARNING_RATE_SCALE, 1.0))


def learning_rate_bounds(model: BaseAlgorithm) -> tuple[float, float] | None:
    """
    The bounds the model's learning rate is clamped into (set by an adaptive learning rate in this process), or None.

    :param model: the algorithm
    """
    applied = _applied(model)
    return None if applied is None else applied.bounds


def apply_learning_rate_scale(model: BaseAlgorithm) -> None:
    """
    Make ``model.lr_schedule`` the configured schedule times the saved scale (in its bounds), if it is not: after
    ``load()`` or ``_setup_model()`` rebuilt it from ``learning_rate``. A scale of 1 leaves SB3's schedule as it is.

    :param model: the algorithm
    """
    scale, applied = learning_rate_scale(model), _applied(model)
    if applied is None and scale != 1.0:
        model.lr_schedule = ScaledSchedule(_configured_schedule(model), scale)
    elif applied is not None and applied.scale != scale:
        model.lr_schedule = ScaledSchedule(applied.schedule, scale, applied.bounds)


def apply_learning_rate(model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer]) -> None:
    """
    Set the optimizers' learning rate to the schedule's at the current progress, as SB3 does at each ``train()``:
    for the rest of the current one.

    :param model: the algorithm
    :param optimizers: its optimizers
    """
    learning_rate = current_learning_rate(model)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate


def set_learning_rate_scale(model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer], scale: float) -> None:
    """
    Set the learning-rate scale of ``model`` for the rest of training, also across ``save`` / ``load``; the
    optimizers run at its new rate for the rest of the current update. ``model.learning_rate`` is left as it is.

    :param model: the algorithm; its :data:`LEARNING_RATE_SCALE` attribute is set and ``lr_schedule`` rebuilt
    :param optimizers: the optimizers whose current learning rate is set
    :param scale: the new scale, finite and >= 0
    """
    if not (math.isfinite(scale) and scale >= 0.0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    setattr(model, LEARNING_RATE_SCALE, float(scale))
    apply_learning_rate_scale(model)
    # SB3 re-applies the schedule at the next train(); this holds for the rest of the current one
    apply_learning_rate(model, optimizers)


def scale_learning_rate(model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer], factor: float) -> None:
    """
    Multiply the learning-rate scale of ``model`` by ``factor`` for the rest of training, also across ``save`` /
    ``load``; the optimizers run at its new rate for the rest of the current update.

    :param model: the algorithm (see :func:`set_learning_rate_scale`)
    :param optimizers: the optimizers whose current learning rate is set
    :param factor: the factor
    """
    set_learning_rate_scale(model, optimizers, learning_rate_scale(model) * factor)


def set_learning_rate_bounds(
    model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer], bounds: tuple[float, float] | None
) -> None:
    """
    Clamp the learning rate of ``model`` into ``bounds`` from now on (its scale unchanged), in this process; its
    ``lr_schedule`` becomes a :class:`ScaledSchedule` (which reads the schedule from 0 past the end of training) even
    where the bounds are None and the scale 1.

    :param model: the algorithm
    :param optimizers: its optimizers, set to the clamped rate if the bounds changed
    :param bounds: ``(lowest, highest)``, or None for none
    """
    applied = _applied(model)
    scale = learning_rate_scale(model)
    if applied is not None and applied.bounds == bounds and applied.scale == scale:
        return
    model.lr_schedule = ScaledSchedule(_configured_schedule(model), scale, bounds)
    apply_learning_rate(model, optimizers)


def current_learning_rate(model: BaseAlgorithm) -> float:
    """
    The learning rate the next ``train()`` will set: the (scaled, bounded) schedule at the current progress.

    :param model: the algorithm (its saved scale applied to its ``lr_schedule`` first, if it was not)
    """
    apply_learning_rate_scale(model)
    return float(model.lr_schedule(model._current_progress_remaining))


def configured_learning_rate(model: BaseAlgorithm) -> float:
    """
    The learning rate the model was configured with, at the start of its schedule: before sb3-safe's scale and bounds.

    :param model: the algorithm
    """
    return float(_configured_schedule(model)(1.0))


def scheduled_learning_rate(model: BaseAlgorithm) -> float:
    """
    The configured schedule's learning rate at the current progress (read at 0 past the end of training, never
    negative), before sb3-safe's scale and bounds: what a scale of 1 runs at.

    :param model: the algorithm
    """
    return max(0.0, float(_configured_schedule(model)(max(model._current_progress_remaining, 0.0))))


def unbounded_learning_rate(model: BaseAlgorithm) -> float:
    """
    :func:`current_learning_rate` before the bounds clamp it: what a change of the scale moves.

    :param model: the algorithm
    """
    apply_learning_rate_scale(model)
    applied = _applied(model)
    progress = model._current_progress_remaining
    return current_learning_rate(model) if applied is None else applied.unbounded(progress)
