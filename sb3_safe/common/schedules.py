"""
Learning-rate schedule scaling: one scale on the model's schedule, which
:class:`~sb3_safe.common.adaptive_lr.KLAdaptiveLRCallback` adapts after each update and
:class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback` lowers at each rollback, and the bounds the adaptive
learning rate keeps it in.

SB3 sets the optimizer learning rate from ``model.lr_schedule`` at every ``train()``, so a learning rate changed in
the optimizers alone lasts until the next update. :func:`scale_learning_rate` scales the schedule itself, the
learning rate ``load()`` rebuilds the schedule from (so the scale is saved with the model), and the optimizers (for
the rest of the current update). The bounds clamp the rate a step uses, never the scale: what is saved is what the
decisions chose, and a schedule that decays below the lower bound is held there without raising the scale.

A schedule is never read past its end: SB3's progress goes below 0 in the last rollout when the budget is not a
multiple of it, where rl-zoo's linear schedules turn negative (a step up the loss, an inverted clip range).
"""

from collections.abc import Iterable

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import FloatSchedule


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
    scaled = _scaled(schedule)
    if scaled is not None:
        return ScaledSchedule(scaled.schedule, scaled.scale * factor, scaled.bounds)
    return ScaledSchedule(_read_as_given(schedule), factor)


def bound_schedule(schedule: Schedule | float, bounds: tuple[float, float] | None) -> ScaledSchedule:
    """
    A new schedule equal to ``schedule`` clamped into ``bounds`` (its scale kept).

    :param schedule: the schedule (or constant); left unchanged
    :param bounds: ``(lowest, highest)``, or None for no bounds
    """
    scaled = _scaled(schedule)
    if scaled is not None:
        return ScaledSchedule(scaled.schedule, scaled.scale, bounds)
    return ScaledSchedule(_read_as_given(schedule), 1.0, bounds)


def _read_as_given(schedule: Schedule | float) -> Schedule | float:
    """``schedule`` without a ReadFromZero around it (a ScaledSchedule reads from zero by itself)."""
    return schedule.schedule if isinstance(schedule, ReadFromZero) else schedule


def _scaled(schedule: Schedule | float) -> ScaledSchedule | None:
    """
    The ScaledSchedule ``schedule`` is, or wraps (``load()`` rebuilds ``lr_schedule`` as a FloatSchedule of it; the
    update past the end of training reads it through a ReadFromZero, which a ScaledSchedule does by itself).
    """
    while isinstance(schedule, FloatSchedule | ReadFromZero):
        schedule = schedule.value_schedule if isinstance(schedule, FloatSchedule) else schedule.schedule
    return schedule if isinstance(schedule, ScaledSchedule) else None


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


def scale_learning_rate(model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer], factor: float) -> None:
    """
    Multiply the learning-rate schedule of ``model`` by ``factor`` for the rest of training, also across ``save`` /
    ``load``; the optimizers run at its new rate for the rest of the current update.

    :param model: the algorithm; its ``lr_schedule`` and ``learning_rate`` are replaced by scaled schedules
    :param optimizers: the optimizers whose current learning rate is set
    :param factor: the factor
    """
    # lr_schedule drives train(); learning_rate is what load() rebuilds lr_schedule from
    model.lr_schedule = scale_schedule(model.lr_schedule, factor)
    model.learning_rate = scale_schedule(model.learning_rate, factor)
    # SB3 re-applies the schedule at the next train(); this holds for the rest of the current one
    apply_learning_rate(model, optimizers)


def set_learning_rate_bounds(
    model: BaseAlgorithm, optimizers: Iterable[th.optim.Optimizer], bounds: tuple[float, float]
) -> None:
    """
    Clamp the learning rate of ``model`` into ``bounds`` from now on (its scale unchanged), also across ``save`` /
    ``load``.

    :param model: the algorithm
    :param optimizers: its optimizers, set to the clamped rate
    :param bounds: ``(lowest, highest)``
    """
    if learning_rate_bounds(model) != bounds:
        model.lr_schedule = bound_schedule(model.lr_schedule, bounds)
        model.learning_rate = bound_schedule(model.learning_rate, bounds)
        apply_learning_rate(model, optimizers)


def learning_rate_bounds(model: BaseAlgorithm) -> tuple[float, float] | None:
    """
    The bounds the model's learning-rate schedule clamps into, or None.

    :param model: the algorithm
    """
    scaled = _scaled(model.lr_schedule)
    return None if scaled is None else scaled.bounds


def learning_rate_scale(model: BaseAlgorithm) -> float:
    """
    The factor sb3-safe's scalings have applied to the model's learning-rate schedule so far (1.0 if none).

    :param model: the algorithm
    """
    scaled = _scaled(model.lr_schedule)
    return 1.0 if scaled is None else scaled.scale


def current_learning_rate(model: BaseAlgorithm) -> float:
    """
    The learning rate the next ``train()`` will set: the (scaled, bounded) schedule at the current progress.

    :param model: the algorithm
    """
    return float(model.lr_schedule(model._current_progress_remaining))


def configured_learning_rate(model: BaseAlgorithm) -> float:
    """
    The learning rate the model was configured with, at the start of its schedule: before sb3-safe's scale and bounds.

    :param model: the algorithm
    """
    scaled = _scaled(model.lr_schedule)
    schedule = model.lr_schedule if scaled is None else scaled.schedule
    return float(schedule(1.0))


def unbounded_learning_rate(model: BaseAlgorithm) -> float:
    """
    :func:`current_learning_rate` before the bounds clamp it: what a change of the scale moves.

    :param model: the algorithm
    """
    scaled = _scaled(model.lr_schedule)
    progress = model._current_progress_remaining
    return current_learning_rate(model) if scaled is None else scaled.unbounded(progress)
