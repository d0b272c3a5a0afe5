"""
The callbacks users import: :class:`NonFiniteGuardCallback`, which detects, explains and recovers from NaN / inf in
the training of any SB3 model, :class:`NumericsMonitorCallback`, which logs the numbers that announce a
divergence, and :class:`~sb3_safe.common.adaptive_lr.KLAdaptiveLRCallback`, a KL trust-region learning rate. The
guard composes the parts of :mod:`sb3_safe.common.guard`, whose docstring walks through one optimizer step and one
rollback.
"""

import math
from typing import Any

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from torch.utils.hooks import RemovableHandle

from sb3_safe.common.adaptive_lr import KLAdaptiveLRCallback
from sb3_safe.common.exploration import DEFAULT_PATIENCE, ExplorationWatch, shared_watch
from sb3_safe.common.guard import report
from sb3_safe.common.guard.cadence import READ_ONLY_CALLBACKS, FullCheckCadence, other_callbacks_may_write
from sb3_safe.common.guard.locate import ENVIRONMENT, MODEL, NORMALIZATION, ROLLOUT, STALL, Fault, FaultLocator
from sb3_safe.common.guard.report import REPORT_FILENAME, GuardEvent, NonFiniteGuardWarning
from sb3_safe.common.guard.response import (
    ON_NONFINITE_MODES,
    ROLLBACKS_ATTRIBUTE,
    EndCollection,
    OnNonFinite,
    Response,
    check_settings,
    renormalize_step,
    vec_normalize_path,
)
from sb3_safe.common.guard.snapshot import SnapshotStore
from sb3_safe.common.guard.stall import DEFAULT_STALL_UPDATES, StallWatch, logged_nonfinite_losses
from sb3_safe.common.guard.watch import WatchedModel
from sb3_safe.common.numerics import GradientNorm, NonFiniteError, TrainingStalledError
from sb3_safe.common.observation_norm import warn_if_normalized_twice
from sb3_safe.common.schedules import ScaledSchedule, current_learning_rate, scale_schedule
from sb3_safe.common.supervisor import UpdateSupervisor

__all__ = [
    "ENVIRONMENT",
    "MODEL",
    "NORMALIZATION",
    "ON_NONFINITE_MODES",
    "REPORT_FILENAME",
    "ROLLBACKS_ATTRIBUTE",
    "ROLLOUT",
    "GuardEvent",
    "KLAdaptiveLRCallback",
    "NonFiniteGuardCallback",
    "NonFiniteGuardWarning",
    "NumericsMonitorCallback",
    "OnNonFinite",
    "ScaledSchedule",
    "scale_schedule",
]


class NonFiniteGuardCallback(BaseCallback):
    """
    Detect, explain and recover from NaN / inf anywhere in the training of any SB3 model.

    What is checked, and when:

    - at the start of ``learn()``: the first observation (what ``env.reset()`` returned), before any forward pass
      uses it, then every tensor that ``model.save()`` would store and the VecNormalize statistics;
    - at every environment step: the new observations, the final observations of the episodes that ended
      (``infos[i]["terminal_observation"]``, which ``new_obs`` does not hold: SB3 stores them in replay buffers and
      bootstraps from them on truncation), rewards, (continuous) actions and the VecNormalize variances, before
      they are stored or used;
    - after every optimizer step (a step post-hook): the parameters it updated, so a NaN is caught at the
      update that made it, before the next forward pass fails inside torch;
    - at the start and end of every rollout, when other callbacks run in the same ``learn()`` (the only code that
      can change a weight outside an optimizer step there): every parameter and buffer the forward passes read,
      in place, so a weight changed between updates is caught before the next rollout's or ``train()``'s first
      forward pass (callbacks run in list order: put the guard last to see what the others did);
    - after every update phase (``train()``) of PPO-style algorithms (many gradient steps per update), every
      ``snapshot_every`` steps (1,000 by default) of A2C and the off-policy algorithms (one or a few gradient steps
      per update), and at the end of ``learn()``: the full check, of every tensor that ``model.save()`` would store
      (all networks, target networks, optimizer state such as Adam moments) and the VecNormalize statistics;
    - at the end of each on-policy rollout: the rollout buffer (rewards, values, returns, advantages, log-probs; of
      these, the returns and log-probs where no other callback may write: SB3's GAE makes them imply the rest);
    - optionally (``check_gradients=True``) the gradients before every optimizer step.

    Each check is one reduction over its arrays or tensors, small ones packed together first (see
    :mod:`sb3_safe.common.numerics`); the bad values are located and named only when a check fails. A passed full
    check copies the state first, so the copy is also the snapshot to roll back to: only that copy has a cadence.
    Environment data cannot be rolled back: a bad observation or reward stops training (in ``"rollback"`` mode
    too) before it is stored, and a bad first observation ends ``learn()`` before its first rollout.

    What a rollback restores, and what it keeps:

    - restored, as of the last passed check: every tensor that ``model.save()`` stores (networks, optimizer
      state), the optimizers' hyperparameters, the VecNormalize statistics, and the algorithm's own update state
      named in its ``rollback_attributes`` (``KLAdaptivePPO``'s ``kl_beta``, which the failed update may have
      adapted to a diverged KL);
    - restored too: ``_n_updates`` and the skipped-step counts of sb3-safe's algorithms (they count the kept
      updates);
    - kept: ``num_timesteps``, the environment and its last observation, the lowered learning rate and the rollback
      count. These two are stored on the model (the learning-rate scale in ``sb3_safe_lr_scale``, beside the
      configured ``learning_rate``, which stays the user's; the count in ``nonfinite_guard_rollbacks``), so they
      survive ``save`` / ``load`` and a resumed ``learn()``: a resumed run does not get a fresh ``max_rollbacks``
      budget.

    A run that no longer learns is a fault too: ``stall_updates`` updates in a row whose optimizer steps were all
    skipped, whose logged loss was not finite, or that left the parameters unchanged at a positive learning rate give
    one stall event naming what was measured (e.g. the largest |return| of the rollouts) and the fix; it raises
    :class:`~sb3_safe.TrainingStalledError` in ``"raise"`` mode and stops otherwise (a rollback cannot fix it).

    With :class:`~sb3_safe.KLAdaptiveLRCallback` on the same model (or ``adaptive_lr=``), in either order, the two
    judge each update as one supervisor (:mod:`sb3_safe.common.supervisor`): the guard's healthy state is always an
    update the adaptive learning rate kept, and nothing it undoes is an update a rollback replaced.

    :param on_nonfinite: ``"raise"``: raise :class:`~sb3_safe.NonFiniteError`;
        ``"stop"``: restore the last healthy state, save it to ``save_path`` and end ``learn()`` cleanly;
        ``"rollback"``: restore the last healthy state, multiply the learning rate by ``lr_decay`` for the rest
        of training, and go on; bad data from the environment, or ``max_rollbacks`` exceeded, stop instead.
    :param save_path: where ``"stop"`` saves the last healthy model (a ``.zip``); VecNormalize statistics go
        next to it as ``<save_path without .zip>_vecnormalize.pkl``. None: restore it in memory only.
    :param lr_decay: factor in (0, 1) applied to the learning rate at each rollback
    :param max_rollbacks: rollbacks allowed over the model's whole training (also across ``save`` / ``load``)
        before the guard stops training instead
    :param check_gradients: also check the gradients before every optimizer step
    :param report_dir: folder for the JSON-lines event report (``nonfinite_guard.jsonl``);
        None: the logger's folder when the logger writes files there, else no report file (the events are in the
        warnings, the logger's output and :attr:`events`)
    :param collapse_patience: environment steps with a log-std at a bound of its range before an
        :class:`~sb3_safe.common.exploration.ExplorationWarning` (finite, but no longer exploring, or only noise);
        environment steps mean the same amount of training for every algorithm, where updates do not
    :param stall_updates: updates in a row that do not train (every optimizer step skipped, a non-finite loss logged,
        or the parameters unchanged at a positive learning rate) before the guard reports a stall, a fault no
        non-finite parameter shows: ``"raise"`` raises :class:`~sb3_safe.TrainingStalledError`, ``"stop"`` and
        ``"rollback"`` stop (a rollback cannot fix it). None: never
    :param snapshot_every: least number of environment steps between two full checks of the model state, each
        passing one being the snapshot a rollback or stop restores: the rollback granularity. None: after every
        update of PPO-style algorithms (PPO, KLAdaptivePPO, TRPO, RecurrentPPO, MaskablePPO); every 1,000 steps of
        A2C, SafeA2C and the off-policy algorithms, whose updates are one or a few gradient steps (each optimizer
        step is still checked)
    :param verbose: kept for SB3's callback signature: every event is reported whatever its value, as a
        :class:`NonFiniteGuardWarning`, a logger WARNING and a line of the JSON-lines report (in ``"raise"`` mode by
        the exception and the JSON-lines report: one message per event)

    After ``learn()`` returns, :attr:`events` lists what happened and :attr:`stop_reason` says why training was
    stopped (None if it was not).
    """

    def __init__(
        self,
        on_nonfinite: OnNonFinite = "raise",
        save_path: str | None = None,
        lr_decay: float = 0.5,
        max_rollbacks: int = 3,
        check_gradients: bool = False,
        report_dir: str | None = None,
        collapse_patience: int = DEFAULT_PATIENCE,
        stall_updates: int | None = DEFAULT_STALL_UPDATES,
        snapshot_every: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        check_settings(on_nonfinite, lr_decay, max_rollbacks, save_path)
        self.stall_updates = stall_updates
        self._stall = StallWatch(stall_updates)
        self.on_nonfinite = on_nonfinite
        self.save_path = save_path
        self.lr_decay = lr_decay
        self.max_rollbacks = max_rollbacks
        self.check_gradients = check_gradients
        self.report_dir = report_dir
        #: warns once per collapse when a log-std sits at a bound of its range for ``collapse_patience`` env steps
        self.exploration = ExplorationWatch(collapse_patience)
        # Public results (and n_rollbacks)
        self.events: list[GuardEvent] = []
        self.stop_reason: str | None = None
        # The parts (see sb3_safe.common.guard), built at training start from the settings above
        self._watched: WatchedModel
        self._snapshots: SnapshotStore
        self._locator: FaultLocator
        self._response: Response | None = None
        self._cadence = FullCheckCadence(snapshot_every)
        self._others_may_write = True
        #: optimizers whose parameters' storage was checked since the last rollout end
        self._storage_checked: set[int] = set()
        self._hooks: list[RemovableHandle] = []
        self._events_at_start = 0
        self._supervisor: UpdateSupervisor
        #: whether the supervisor judged an update since the last rollout end
        self._judged = False

    @property
    def n_rollbacks(self) -> int:
        """Rollbacks over the model's whole training, also across ``save`` / ``load`` (0 before ``learn()``)."""
        return 0 if self._response is None else self._response.n_rollbacks

    @property
    def stopping(self) -> bool:
        """Whether a stop ends ``learn()``: from now on the model is kept at its restored healthy state."""
        return self._response is not None and self._response.stopping

    # ----- SB3 callback events -----

    def _on_training_start(self) -> None:
        warn_if_normalized_twice(self.model.policy, self.model.get_env())
        self._detach_hooks()  # of a learn() that ended with an exception
        self._watched = watched = WatchedModel(self.model)
        self._hooks = watched.attach_hooks(
            self._after_optimizer_step, self._before_optimizer_step if self.check_gradients else None
        )
        self._snapshots = SnapshotStore(self.model, watched, restorable=self.on_nonfinite != "raise")
        self._locator = FaultLocator(watched)
        self._supervisor = UpdateSupervisor.of(self.model)
        self._supervisor.join(self, self.locals.get("callback"))
        self._response = Response(
            self.model,
            watched,
            self._snapshots,
            self.on_nonfinite,
            self.lr_decay,
            self.max_rollbacks,
            self.save_path,
            on_restore=self._supervisor.note_restore,
        )
        self._stall = StallWatch(self.stall_updates)  # (the count of updates in a row that stalled is the model's)
        self._events_at_start = len(self.events)
        self._storage_checked.clear()
        self._others_may_write = other_callbacks_may_write(self.locals.get("callback"), self)
        self.exploration = shared_watch(self.model, self.exploration)
        first_obs = self.model._last_obs
        if first_obs is None or watched.observation_is_finite(first_obs):
            self._check_model("at the start of learn()")
        else:
            # The environment's fault, not the model's: keep the model as the healthy state a stop saves
            self._check_model("at the start of learn()", report=False)
            self._handle(self._locator.in_first_observation(first_obs))
        if self.stopping:
            # No env step comes before the first rollout's forward pass, which would use what was found
            off_policy = isinstance(self.model, OffPolicyAlgorithm)
            setattr(self.model, "collect_rollouts", EndCollection(off_policy))  # noqa: B010  (BaseAlgorithm has none)
        self.exploration.after_update(self.model)

    def _on_rollout_start(self) -> None:
        # After an update the supervisor calls judge_kept_update (once the adaptive learning rate judged it)
        self._supervisor.after_update()
        if self.stopping:
            self._snapshots.restore()
        elif not self._judged:
            self._check_live_model("at the start of a rollout")

    def _on_step(self) -> bool:
        if self.stopping:
            return False
        locals_, watched = self.locals, self._watched
        new_obs, rewards, actions = locals_["new_obs"], locals_["rewards"], watched.step_actions(locals_)
        # The VecEnv reset the envs whose episode ended: their final observations are only in the infos
        terminal = watched.terminal_observations(locals_.get("infos", ()))
        if watched.step_is_finite(new_obs, rewards, actions, terminal):
            return True  # (at nearly every step)
        fault = self._locator.in_step(new_obs, rewards, actions, terminal)
        self._handle(fault)
        if fault.source == NORMALIZATION and not self.stopping:  # rolled back
            renormalize_step(watched.vec_normalize, new_obs, rewards)
        return not self.stopping

    def _on_rollout_end(self) -> None:
        if self._others_may_write:
            # Only other callbacks can give a parameter new storage inside learn() (optimizer steps, rollbacks and
            # undos write in place): without them, once per learn() is enough
            self._storage_checked.clear()
        self._supervisor.rollout_end()  # calls check_rollout, before the adaptive learning rate's record
        at_bound = self.exploration.after_update(self.model)
        if at_bound is not None:
            self.logger.record("train/log_std_at_bound_fraction", at_bound)
        report.record_counts(self.logger, len(self.events), self.n_rollbacks)

    def _on_training_end(self) -> None:
        self._supervisor.after_update(at_end=True)
        if self.stopping:
            self._snapshots.restore()
        elif self._cadence.due_at_training_end(self.model):
            self._check_model("after the last train() of learn()")
        self._detach_hooks()
        # Only the stand-in the guard installed on this model is removed
        if isinstance(self.model.__dict__.get("collect_rollouts"), EndCollection):
            del self.model.__dict__["collect_rollouts"]
        if len(self.events) > self._events_at_start:
            # SB3 dumps before train(), so without this the last events would never reach the log files
            report.record_counts(self.logger, len(self.events), self.n_rollbacks)
            self.logger.dump(self.num_timesteps)

    # ----- around one update (called by the supervisor, see sb3_safe.common.supervisor) -----

    def check_rollout(self) -> None:
        """Before ``train()``: what the update will read (the rollout buffer, and what other callbacks changed)."""
        self._judged = False
        self._stall.before_update(self.model)
        if self.stopping:
            return
        # After the last value prediction: what a callback changed in the rollout
        self._check_live_model("at the end of a rollout, before train()")
        buffer = getattr(self.model, "rollout_buffer", None)
        if (
            buffer is not None
            and not self.stopping
            and not self._watched.rollout_buffer_is_finite(buffer, not self._others_may_write)
        ):
            self._handle(self._locator.in_rollout_buffer(buffer))

    def judge_kept_update(self, at_end: bool) -> None:
        """
        After ``train()`` and any redo of it: whether training stalls, then the full check (when due), whose passing
        copy is the healthy state.

        :param at_end: at the end of ``learn()`` (else at the start of the next rollout)
        """
        self._judged = True
        if self.stopping:
            self._snapshots.restore()
            return
        stalled = self._stall.after_update(self.model, self.logger)
        if stalled is not None:
            self._report_stall(stalled)
            return
        if at_end and self._cadence.due_at_training_end(self.model):
            self._check_model("after the last train() of learn()", after_update=True)
        elif not at_end and self._cadence.due_at_rollout_start(self.model):
            self._check_model(f"after train() (n_updates={getattr(self.model, '_n_updates', None)})", after_update=True)
        elif not at_end:
            self._check_live_model("at the start of a rollout")

    def _report_stall(self, what: str) -> None:
        self._handle(Fault(STALL, what, logged_nonfinite_losses(self.logger)), measured=self._stall.measured())

    # ----- optimizer hooks -----

    def _after_optimizer_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._stall.steps += 1
        if self.stopping:
            # Training is ending at the next env step; keep the rest of this train() from changing the model
            self._snapshots.restore()
            return
        # An optimizer step updates in place: new storage can only come from code between two train() calls
        check_storage = id(optimizer) not in self._storage_checked
        self._storage_checked.add(id(optimizer))
        if not self._watched.parameters_are_finite(optimizer, check_storage):
            phase = f"optimizer step of {self._watched.optimizer_name(optimizer)} in train()"
            self._handle(self._locator.in_optimizer(optimizer, phase))

    def _before_optimizer_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._watched.gradients_are_finite(optimizer):
            phase = f"gradients before an optimizer step of {self._watched.optimizer_name(optimizer)} in train()"
            self._handle(self._locator.in_optimizer(optimizer, phase))
            # Rollback or stop restored the model and cleared the gradients: this step is now a no-op

    def _detach_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ----- the full check -----

    def _check_model(self, phase: str, report: bool = True, after_update: bool = False) -> None:
        """
        Check every stored tensor and the VecNormalize statistics; when healthy, keep them as the snapshot.

        :param phase: when, for the report
        :param report: False to only commit a healthy state, reporting nothing (another fault is being reported)
        :param after_update: after updates: also count whether they changed the parameters (a stall if not)
        """
        snapshot, finite = self._snapshots.copy_and_test()
        if not finite:
            if report:
                self._handle(self._locator.in_copy(snapshot, phase))
        elif not self._watched.vec_normalize_is_finite():
            if report:
                self._handle(self._locator.in_vec_normalize(phase))
        else:
            healthy = self._snapshots.healthy
            stalled = None
            if after_update and healthy is not None:
                unchanged = snapshot.flat.equal_to(healthy.flat, self._watched.parameter_names)
                stalled = self._stall.after_full_check(unchanged, current_learning_rate(self.model))
            self._snapshots.commit(snapshot)
            self._cadence.passed(self.model)
            if stalled is not None:
                self._report_stall(stalled)

    def _check_live_model(self, phase: str) -> None:
        """
        The cheap check of what forward passes read, between full checks: catches what another callback changed
        outside an optimizer step (nothing else in ``learn()`` can; without other callbacks there is nothing to catch).
        """
        if self._others_may_write and not self._watched.model_is_finite():
            self._handle(self._locator.in_live_model(f"{phase}: changed outside an optimizer step"))

    # ----- reacting -----

    def _handle(self, fault: Fault, measured: str = "") -> None:
        """Respond to non-finite values or a stall (raise, stop or roll back) and report it."""
        assert self._response is not None
        source, phase, nonfinite = fault
        healthy = self._snapshots.healthy_statistics()
        event = GuardEvent(self.model.num_timesteps, phase, source, nonfinite, healthy, measured=measured)
        event.action, outcome = self._response.respond(source)
        event.message = report.compose(event, outcome)
        self.events.append(event)
        report.record_counts(self.logger, len(self.events), self.n_rollbacks)
        report.publish(event, self.logger, self.report_dir)
        if event.action == "raise":
            self._detach_hooks()
            raise (TrainingStalledError if source == STALL else NonFiniteError)(event.message)
        if event.action == "stop":
            self.stop_reason = event.message

    @property
    def vec_normalize_path(self) -> str | None:
        """Where ``"stop"`` saves the VecNormalize statistics, next to ``save_path``."""
        return vec_normalize_path(self.save_path)

    @property
    def report_folder(self) -> str | None:
        """
        Where ``nonfinite_guard.jsonl`` goes: ``report_dir``, else the logger's folder if the logger writes files
        there (SB3's default logger has a temporary folder it writes nothing to); None: no report file.
        """
        return report.report_folder(self.report_dir, self.logger)


class NumericsMonitorCallback(BaseCallback):
    """
    Log the numbers that announce a divergence before it happens, at the end of each rollout:
    ``train/log_std_min`` and ``train/log_std_max`` (policies with a ``log_std`` parameter),
    ``train/param_max_abs`` (largest |parameter|), ``train/grad_norm`` (L2 norm of the gradients of the
    last optimizer step) and ``train/log_std_at_bound_fraction`` (share of log-std entries at a bound of the range;
    after ``collapse_patience`` environment steps with one at a bound, an
    :class:`~sb3_safe.common.exploration.ExplorationWarning` says that exploration collapsed or exploded; with the
    guard in the same ``learn()`` both share one watch, so one collapse gives one warning).
    They go to SB3's logger, hence to stdout, CSV and TensorBoard.
    Use with :class:`NonFiniteGuardCallback`, which logs ``guard/events`` and ``guard/rollbacks``.

    :param collapse_patience: environment steps with a log-std at a bound before the warning
    :param verbose: Verbosity level: 0 for no output, 1 for info messages
    """

    def __init__(self, collapse_patience: int = DEFAULT_PATIENCE, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.exploration = ExplorationWatch(collapse_patience)

    def _on_training_start(self) -> None:
        self.exploration = shared_watch(self.model, self.exploration)
        self.exploration.after_update(self.model)
        self._params: list[th.Tensor] = [p for p in self.model.policy.parameters() if p.is_floating_point()]
        self._gradient_norm = GradientNorm(self._params)
        log_std = getattr(self.model.policy, "log_std", None)
        self._log_std: th.Tensor | None = log_std if isinstance(log_std, th.Tensor) else None

    def _on_step(self) -> bool:
        return True

    @th.no_grad()
    def _on_rollout_end(self) -> None:
        record = self.logger.record
        if self._log_std is not None:
            low, high = th.aminmax(self._log_std)
            record("train/log_std_min", low.item())
            record("train/log_std_max", high.item())
        if self._params:
            record("train/param_max_abs", th.nn.utils.get_total_norm(self._params, norm_type=math.inf).item())
        grad_norm = self._gradient_norm()
        if grad_norm is not None:
            record("train/grad_norm", grad_norm)
        at_bound = self.exploration.after_update(self.model)
        if at_bound is not None:
            record("train/log_std_at_bound_fraction", at_bound)


# Neither writes into the model: another guard or a monitor in the same learn() needs no re-reads of the model
READ_ONLY_CALLBACKS.update({NonFiniteGuardCallback, NumericsMonitorCallback})
# It writes into the model only to undo an update, back to a state that was checked finite
READ_ONLY_CALLBACKS.add(KLAdaptiveLRCallback)
