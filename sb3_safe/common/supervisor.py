"""
One supervisor of each update per model: the sb3-safe callbacks on a model (:class:`~sb3_safe.NonFiniteGuardCallback`
and :class:`~sb3_safe.KLAdaptiveLRCallback`, also the one ``adaptive_lr=`` builds) judge an update in one fixed
order and undo it one way, whatever order they are given in.

SB3 runs ``train()`` between two callback events: the end of a rollout and the start of the next one (or the end of
``learn()``). Each sb3-safe callback forwards both events to the model's :class:`UpdateSupervisor`; the first to
arrive does the work for all of them:

- **before the update** (the rollout's end): the guards check what the update will read (the rollout buffer, the
  live model); then, if none of them stopped training, the adaptive learning rate takes its record of the state
  before the update (parameters, optimizer state, ``rollback_attributes``, update and skip counters, the
  learning-rate scale, the rollout buffer's state) that an undo restores; a schedule about to be read past the end
  of training (SB3's progress below 0) is read at progress 0 for this update, and named once;
- **after the update** (the next rollout's start, or the end of ``learn()``): if a guard stopped training or
  restored a state during the update (a rollback replaces the update), the adaptive learning rate's record is
  void and nothing is undone; otherwise the adaptive learning rate measures the update's KL and may undo and redo
  it (every redone optimizer step is checked by the guards' hooks like any other, and a fault there ends the
  redos); then the guards judge the kept update: stall accounting, and the full check whose passing copy becomes
  the healthy state a rollback or a stop restores. So the healthy state is always a kept update, never an undone
  one.

The learning rate has one owner, the scale (:mod:`sb3_safe.common.schedules`, a model attribute saved with it): KL
decisions, redos and rollbacks multiply it; the adaptive learning rate's bounds clamp the rate a step uses, never the
scale. ``model.learning_rate`` stays the configured one; the supervisor applies the scale to ``model.lr_schedule`` when
a ``learn()`` starts and before each update (``load()`` rebuilds the schedule without it).
"""

import warnings
import weakref
from typing import Any, Protocol

from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_safe.common.schedules import ReadFromZero, apply_learning_rate_scale

#: The schedules SB3's on-policy algorithms read at each update (``clip_range_vf`` may be None)
SCHEDULES = ("lr_schedule", "clip_range", "clip_range_vf")

_COLLECTING, _UPDATING, _ENDED = "collecting", "updating", "ended"


class Guard(Protocol):
    """What the supervisor asks of a guard (:class:`~sb3_safe.NonFiniteGuardCallback`)."""

    @property
    def stopping(self) -> bool:
        """Whether the guard is ending ``learn()`` with the model restored to its healthy state."""

    def check_rollout(self) -> None:
        """Before the update: check what it will read."""

    def judge_kept_update(self, at_end: bool) -> None:
        """After the update and any redo: stall accounting, the full check, the healthy state."""


class UpdateJudge(Protocol):
    """What the supervisor asks of the adaptive learning rate (:class:`~sb3_safe.KLAdaptiveLRCallback`)."""

    def prepare_update(self) -> None:
        """Before the update: take the record an undo restores."""

    def judge_update(self, at_end: bool) -> None:
        """After the update: measure, maybe undo and redo it, adapt the learning rate."""

    def discard_update(self) -> None:
        """After an update a guard rolled back or stopped: drop the record, judge nothing."""


class UpdateSupervisor:
    """
    The one supervisor of a model's updates (see the module's docstring): get it with :meth:`of`.

    :param model: the algorithm (held weakly: the supervisor lives as long as the model)
    """

    def __init__(self, model: BaseAlgorithm) -> None:
        self._model = weakref.ref(model)
        self.guards: list[Guard] = []
        self.judges: list[UpdateJudge] = []
        #: whether a guard restored a state (rolled back or stopped) since the last rollout end
        self.restored = False
        self._phase = _ENDED
        self._learn: object | None = None
        self._replaced_schedules: dict[str, Any] = {}
        self._named_past_end: set[str] = set()

    @classmethod
    def of(cls, model: BaseAlgorithm) -> "UpdateSupervisor":
        """
        The model's supervisor (created at the first call).

        :param model: the algorithm
        """
        supervisor = _SUPERVISORS.get(model)
        if supervisor is None:
            supervisor = _SUPERVISORS[model] = cls(model)
        return supervisor

    @property
    def model(self) -> BaseAlgorithm:
        model = self._model()
        assert model is not None
        return model

    @property
    def stopping(self) -> bool:
        """Whether a guard is ending ``learn()``."""
        return any(guard.stopping for guard in self.guards)

    def join(self, participant: Guard | UpdateJudge, learn: object) -> None:
        """
        Register a callback for this ``learn()`` (from its ``_on_training_start``).

        :param participant: a guard or an adaptive learning rate
        :param learn: what identifies this ``learn()``: the callback object SB3 runs (its ``callback`` local)
        """
        if self._phase == _ENDED or learn is not self._learn:
            self._restore_schedules()
            self.guards, self.judges, self.restored = [], [], False
            self._learn, self._phase = learn, _COLLECTING
            apply_learning_rate_scale(self.model)  # a loaded model's schedule was rebuilt without its saved scale
        members: list[Any] = self.judges if hasattr(participant, "judge_update") else self.guards
        if participant not in members:
            members.append(participant)

    def note_restore(self) -> None:
        """A guard restored a state (a rollback, or a stop): the update in progress is not the one recorded."""
        self.restored = True

    # ----- the two events around train() -----

    def rollout_end(self) -> None:
        """Before the update (each participant's ``_on_rollout_end``; the first call does the work)."""
        if self._phase != _COLLECTING:
            return
        self._phase, self.restored = _UPDATING, False
        apply_learning_rate_scale(self.model)  # (a no-op unless something rebuilt lr_schedule since)
        for guard in self.guards:
            guard.check_rollout()
        if self.judges and not self.stopping:
            for judge in self.judges:
                judge.prepare_update()
        self._read_schedules_from_zero_past_the_end()

    def after_update(self, at_end: bool = False) -> None:
        """
        After the update (each participant's ``_on_rollout_start`` and ``_on_training_end``; the first call does the
        work).

        :param at_end: called at the end of ``learn()``
        """
        if self._phase != _UPDATING:
            if at_end:
                self._phase = _ENDED
            return
        self._phase = _ENDED if at_end else _COLLECTING
        try:
            for judge in self.judges:
                if self.stopping or self.restored:
                    judge.discard_update()
                else:
                    judge.judge_update(at_end)
            for guard in self.guards:
                guard.judge_kept_update(at_end)
        finally:
            self._restore_schedules()

    # ----- schedules past the end of training -----

    def _read_schedules_from_zero_past_the_end(self) -> None:
        """
        SB3 computes the progress of the coming update as ``1 - num_timesteps / total``: below 0 when the last rollout
        ends past the budget, where a linear schedule turns negative (a learning rate that climbs the loss, a clip
        range that inverts the clip). Read them at 0 for this update; name each that would have gone negative, once.
        """
        model = self.model
        total = getattr(model, "_total_timesteps", 0)
        if not total or model.num_timesteps <= total or getattr(model, "reads_schedules_from_zero", False):
            return  # (sb3-safe's algorithms clamp their progress at 0 themselves)
        progress = 1.0 - model.num_timesteps / total
        for name in SCHEDULES:
            schedule = getattr(model, name, None)
            if not callable(schedule):
                continue
            self._replaced_schedules[name] = schedule
            setattr(model, name, ReadFromZero(schedule))
            value = float(schedule(progress))
            if value < 0.0 and name not in self._named_past_end:
                self._named_past_end.add(name)
                message = (
                    f"{type(model).__name__}.{name} {schedule} is {value:.3g} at progress {progress:.4g}: the last rollout"
                    f" ends at timestep {model.num_timesteps}, past the budget {total} (not a multiple of the rollout"
                    f" size), where SB3 reads schedules below progress 0. sb3-safe reads it at progress 0"
                    f" ({float(schedule(0.0)):.3g}) instead."
                )
                warnings.warn(message, UserWarning, stacklevel=2)

    def _restore_schedules(self) -> None:
        if not self._replaced_schedules:
            return  # (after nearly every update)
        model = self._model()
        if model is not None:
            for name, schedule in self._replaced_schedules.items():
                if isinstance(getattr(model, name, None), ReadFromZero):
                    setattr(model, name, schedule)
        self._replaced_schedules = {}


_SUPERVISORS: "weakref.WeakKeyDictionary[BaseAlgorithm, UpdateSupervisor]" = weakref.WeakKeyDictionary()
