"""
The parts of :class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback`, one responsibility each.

- :mod:`~sb3_safe.common.guard.watch`: what is watched (the tensors ``model.save()`` stores, VecNormalize, env
  step data, the rollout buffer), the optimizer hooks, and the cheap checks of all of these;
- :mod:`~sb3_safe.common.guard.snapshot`: the snapshot of the model state, captured and restored;
- :mod:`~sb3_safe.common.guard.cadence`: when the full check runs and, when it passes, commits a snapshot;
- :mod:`~sb3_safe.common.guard.locate`: the fault locator, which tensors are non-finite and from which source;
- :mod:`~sb3_safe.common.guard.response`: the response policy, raise, stop or roll back;
- :mod:`~sb3_safe.common.guard.report`: the event, its message, and where it goes (warning, logger, JSONL);
- :mod:`sb3_safe.common.schedules` (outside this package): the learning-rate scaling a rollback applies.

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
rate by ``lr_decay`` through :func:`~sb3_safe.common.schedules.scale_learning_rate` (the schedule, so that it holds
after SB3's next schedule update, and the optimizers, for the rest of the current ``train()``), and counts the
rollback on the model (``nonfinite_guard_rollbacks``). Counters are kept: ``num_timesteps``, ``_n_updates``,
skipped-step counts, the environment and its last observation. If the fault was in this env step's normalized data,
the callback normalizes it again with the restored statistics. Training goes on.
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
