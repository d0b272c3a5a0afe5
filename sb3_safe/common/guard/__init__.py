"""
The parts of :class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback`, one responsibility each.

- :mod:`~sb3_safe.common.guard.watch`: what is watched (the tensors ``model.save()`` stores, VecNormalize, env
  step data, the rollout buffer), the optimizer hooks, and the cheap checks of all of these;
- :mod:`~sb3_safe.common.guard.snapshot`: the snapshot of the model state, captured and restored;
- :mod:`~sb3_safe.common.guard.cadence`: when the full check runs and, when it passes, commits a snapshot;
- :mod:`~sb3_safe.common.guard.locate`: the fault locator, which tensors are non-finite and from which source;
- :mod:`~sb3_safe.common.guard.response`: the response policy, raise, stop or roll back;
- :mod:`~sb3_safe.common.guard.stall`: training that runs but no longer learns (every step skipped, a non-finite
  loss, parameters that do not move);
- :mod:`~sb3_safe.common.guard.report`: the event, its message, and where it goes (warning, logger, JSONL);
- :mod:`sb3_safe.common.schedules` (outside this package): the learning-rate scaling a rollback applies;
- :mod:`sb3_safe.common.supervisor` (outside this package): the one supervisor of each update that the guard and
  :class:`~sb3_safe.KLAdaptiveLRCallback` share on a model.

The callback builds the parts at the start of each ``learn()`` and calls them from SB3's callback events.

**One optimizer step.** The optimizer step runs inside ``train()``; the guard's step post-hook (attached by
:class:`~sb3_safe.common.guard.watch.WatchedModel`) then runs the cheap check of the parameters that optimizer
updated: one reduction, read in place, nothing copied. If it passes, that is all. If not, the
:class:`~sb3_safe.common.guard.locate.FaultLocator` names the bad tensors (gradients, then optimizer state, then
parameters: the order in which a NaN spreads) as a :class:`~sb3_safe.common.guard.locate.Fault` of source
``"model"``; the :class:`~sb3_safe.common.guard.response.Response` decides (raise, stop or roll back) and acts; the
event is reported; ``"raise"`` then raises :class:`~sb3_safe.NonFiniteError` out of the step. With
``check_gradients=True`` a step pre-hook does the same with the gradients, before the step. After the whole
update phase, at the next rollout start, the full check copies every stored tensor into the spare
:class:`~sb3_safe.common.guard.snapshot.Snapshot` and tests the copy; when it and VecNormalize are finite, the copy
is committed as the healthy snapshot.

**One rollback.** The response restores the healthy snapshot (tensors, optimizer state and hyperparameters,
VecNormalize statistics, the algorithm's ``rollback_attributes``; gradients are cleared), multiplies the learning
rate by ``lr_decay`` through :func:`~sb3_safe.common.schedules.scale_learning_rate` (the scale saved on the model
and applied to its schedule, so that it holds after SB3's next schedule update, and the optimizers, for the rest of
the current ``train()``; ``model.learning_rate`` stays the configured one), and counts the rollback on the model
(``nonfinite_guard_rollbacks``). The update and skipped-step counts are restored with the state (they count the kept
updates); ``num_timesteps``, the environment and its last observation are kept. If the fault was in this env step's
normalized data, the callback normalizes it again with the restored statistics. Training goes on.

**One update with the adaptive learning rate** (guard and :class:`~sb3_safe.KLAdaptiveLRCallback` on one model, in
either order, or ``adaptive_lr=`` plus the guard). Both forward their events to the model's
:class:`~sb3_safe.common.supervisor.UpdateSupervisor`, which runs them in one order. At the rollout's end the guard
checks the rollout buffer (a bad value stops training: data cannot be rolled back), then the adaptive learning rate
records the state before the update (parameters, optimizer state, ``rollback_attributes`` with the skip counts,
``_n_updates``, the learning-rate scale, the rollout buffer's arrays). ``train()`` runs; each optimizer step is
checked by the guard's hook, which may roll back (to its healthy state, a kept update) or stop right there, and
tells the supervisor. At the next rollout's start: if the guard restored a state, the record is dropped and nothing
is redone (a redo would undo the rollback); otherwise the adaptive learning rate measures the update's KL and may
undo it (restoring the record, counters too) and redo it at a lower rate, each redone step checked by the guard's
hook as any other. Only then does the guard judge the kept update: a stall is counted, and the full check, when
due, copies the state and commits it as the healthy one. So a rollback never restores an undone update, a stop keeps
in memory the state it saved, and the rate after a rollback is the schedule's (its scale times ``lr_decay``, inside
the adaptive learning rate's bounds), not one an optimizer held from before a redo.
"""

from sb3_safe.common.guard.cadence import FullCheckCadence
from sb3_safe.common.guard.locate import ENVIRONMENT, MODEL, NORMALIZATION, ROLLOUT, Fault, FaultLocator
from sb3_safe.common.guard.report import REPORT_FILENAME, GuardEvent, NonFiniteGuardWarning
from sb3_safe.common.guard.response import ON_NONFINITE_MODES, ROLLBACKS_ATTRIBUTE, OnNonFinite, Response
from sb3_safe.common.guard.snapshot import Snapshot, SnapshotStore
from sb3_safe.common.guard.watch import WatchedModel

__all__ = [
    "ENVIRONMENT",
    "MODEL",
    "NORMALIZATION",
    "ON_NONFINITE_MODES",
    "REPORT_FILENAME",
    "ROLLBACKS_ATTRIBUTE",
    "ROLLOUT",
    "Fault",
    "FaultLocator",
    "FullCheckCadence",
    "GuardEvent",
    "NonFiniteGuardWarning",
    "OnNonFinite",
    "Response",
    "Snapshot",
    "SnapshotStore",
    "WatchedModel",
]
