"""
A KL trust-region learning rate for any on-policy algorithm: :class:`KLAdaptiveLRCallback`.

The rule shared by rsl_rl, SBX, rl_games and skrl (divide the learning rate by 1.5 when the KL is above twice the
target, multiply it by 1.5 below half the target, clip it to [1e-5, 1e-2]) is applied here to the exact mean
``KL(pi_old || pi_new)`` over the whole rollout after each update (:mod:`sb3_safe.common.rollout_kl`), not to a
minibatch's ratio before its own step (which is 1, so its KL is ~0 and pushes the learning rate up on noise); its
step comes from the measured ratio rather than a fixed 1.5; and an update whose KL overshoots a hard bound is undone
(the parameters, optimizer state and ``rollback_attributes`` restored from a snapshot) and redone on the same rollout
at a lower learning rate: a trust region for algorithms that have none. The configured learning rate is the user's:
by default the callback lowers it and recovers it, never raises it above it (bounds that allow a raise are opt-in).
"""

import math
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch as th
from sb3_contrib import TRPO
from stable_baselines3 import A2C
from stable_baselines3.common.callbacks import BaseCallback, ConvertCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import MaybeCallback

from sb3_safe.common.guard.snapshot import SnapshotStore
from sb3_safe.common.guard.watch import WatchedModel
from sb3_safe.common.kl import distribution_params, has_analytic_kl
from sb3_safe.common.observation_norm import warn_if_normalized_twice
from sb3_safe.common.rollout_kl import Rollout, mean_kl, mean_kl_on_batch, old_distribution_params
from sb3_safe.common.schedules import (
    apply_learning_rate_scale,
    configured_learning_rate,
    current_learning_rate,
    learning_rate_scale,
    scheduled_learning_rate,
    set_learning_rate_bounds,
    set_learning_rate_scale,
    unbounded_learning_rate,
)
from sb3_safe.common.supervisor import UpdateSupervisor

#: The anchors' lower bound on the learning rate (rsl_rl, SBX): by default the floor of a cut (or the configured rate
#: where it is lower); with ``raise_above_configured`` the lower bound, the upper one the kind's (:class:`KLTargets`)
LOWEST_LEARNING_RATE = 1e-5
#: Optimizers whose step is the learning rate times the gradient, not normalized by the gradient's running size as
#: Adam's and RMSprop's: the rates that suit them can be far above the kinds' upper bounds (measured on MaskablePPO
#: with plain SGD at 0.3: held at 1e-3, the policy stayed random; ``benchmarks/results/stress.md``)
GRADIENT_SCALED_OPTIMIZERS: tuple[type[th.optim.Optimizer], ...] = (th.optim.SGD,)
#: A2C-style updates measured (and undone if they overshoot): one per this many collected samples, as a pass costs the
#: same for 5 samples as for 250; PPO-style updates are all measured. Measured against other rates in
#: ``benchmarks/results/robustness.md`` (notes)
MEASURED_SAMPLES = 256
#: The first updates a callback sees of a model are all measured: a configured learning rate far too high is met at once
MEASURED_FIRST = 8


def _check_bounds(lr_bounds: Any) -> tuple[float, float]:
    try:
        low, high = (float(bound) for bound in lr_bounds)
    except (TypeError, ValueError):
        raise ValueError(f"lr_bounds must be a pair (lowest, highest) of floats, got {lr_bounds!r}") from None
    if not 0.0 < low <= high < math.inf:
        raise ValueError(f"lr_bounds=(lowest, highest) needs 0 < lowest <= highest < inf, got {lr_bounds!r}")
    return low, high


def _check_positive(name: str, value: float, above: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not above < value < math.inf:
        raise ValueError(f"{name} must be a finite number > {above:g}, got {value!r}")
    return float(value)


def learning_rate_factor(kl: float, target: float, tolerance: float, max_step: float) -> float:
    """
    The factor the learning rate is multiplied by after an update with mean KL ``kl``.

    Inside ``[target / tolerance, target * tolerance]``: 1 (no change on noise); outside: ``sqrt(target / kl)``,
    the factor that meets the target where the KL grows like the square of the learning rate (small updates),
    limited to ``[1 / max_step, max_step]``. A KL of 0 (the update changed nothing: every step skipped, a zero
    learning rate) or a non-finite one says nothing about the learning rate: 1.

    :param kl: mean KL(pi_old || pi_new) of the update
    :param target: the KL aimed at
    :param tolerance: > 1
    :param max_step: largest change per update, > 1
    """
    if not math.isfinite(kl) or kl <= 0.0 or target / tolerance <= kl <= target * tolerance:
        return 1.0
    return min(max(math.sqrt(target / kl), 1.0 / max_step), max_step)


@dataclass(frozen=True)
class KLTargets:
    """
    The defaults of one kind of algorithm, measured at rl-zoo's tuned settings
    (``benchmarks/results/adaptive_lr.md``).

    :param target_kl: mean KL per update aimed at
    :param undo_above: an update whose KL exceeds this multiple of ``target_kl`` is undone and redone
    :param highest_learning_rate: the default upper bound of the learning rate
    :param raise_after: the learning rate is raised only after this many decisions in a row below the band
    :param keep_redo_rate: after a redo the next updates run at the learning rate it was redone at (True) or at the
        one before it divided by ``max_step`` (False: the redo's cut holds for that update only)
    """

    target_kl: float
    undo_above: float
    highest_learning_rate: float
    raise_after: int
    keep_redo_rate: bool


#: No change of the learning rate while the KL is within this factor of the target
DEFAULT_TOLERANCE = 3.0
#: PPO-style algorithms (many minibatch steps per update, clipped): a target between the tuned settings' own KLs, so
#: that a sound rate is left alone; the upper bound rl-zoo's highest tuned PPO rate, as PPO's clipping can hide a rate
#: too high for the critic; a raise only after two low decisions in a row, as one noisy reading raised for good.
#: The measurements behind each value: ``benchmarks/results/adaptive_lr.md``, ``robustness.md``, ``critic.md``
PPO_STYLE = KLTargets(target_kl=0.015, undo_above=6.0, highest_learning_rate=1e-3, raise_after=2, keep_redo_rate=True)
#: A2C-style algorithms (one gradient step per update of a few steps): a target above the tuned KL, which is
#: heavy-tailed (aimed at it, the rate drifted below the tuned one); a redo's cut holds for that update only, as one
#: step overshoots by chance at a sound rate. The measurements: ``benchmarks/results/adaptive_lr.md``,
#: ``robustness.md``, ``learning.md``
ONE_STEP = KLTargets(target_kl=3e-3, undo_above=30.0, highest_learning_rate=1e-2, raise_after=1, keep_redo_rate=False)


def _default_highest_learning_rate(model: OnPolicyAlgorithm, defaults: KLTargets) -> float:
    """
    The kind's upper bound on the learning rate, or the configured rate where it is higher and the optimizer's step
    scales with the gradient (:data:`GRADIENT_SCALED_OPTIMIZERS`): the kinds' bounds are sized for Adam and RMSprop.

    :param model: the algorithm
    :param defaults: its kind's defaults
    """
    if isinstance(model.policy.optimizer, GRADIENT_SCALED_OPTIMIZERS):
        return max(defaults.highest_learning_rate, configured_learning_rate(model))
    return defaults.highest_learning_rate


class KLAdaptiveLRCallback(BaseCallback):
    """
    Adapt the learning rate of any on-policy algorithm (PPO, A2C, KLAdaptivePPO, SafeA2C, sb3-contrib's MaskablePPO
    and RecurrentPPO), with any policy, to the exact KL between the policy before and after each update.

    After each update phase the mean ``KL(pi_old || pi_new)`` over the whole rollout is measured (analytic for every
    distribution family: Gaussian, squashed, gSDE, categorical, masked, multi-categorical, Bernoulli) on the rollout's
    own observations, in collection order; A2C-style
    algorithms, whose updates are a few environment steps each, measure one update per :data:`MEASURED_SAMPLES`
    collected samples and the first :data:`MEASURED_FIRST` they see of a model (the others are neither measured nor
    undone). Then:

    - if it exceeds ``undo_above * target_kl``, the update is undone (policy, optimizer state, the algorithm's
      ``rollback_attributes``, update and skip counts restored, as the guard's rollback does) and redone on the same
      rollout with the learning rate times ``clip(sqrt(target / KL), 0.1, 0.5)``, at most ``max_redos`` times (not
      at the lowest learning rate: the redo would train at the same one); the next updates run at that rate
      (PPO-style) or at the rate before the redo divided by ``max_step``, never below the redo's (A2C-style);
    - once ``window_steps`` environment steps have passed since the last decision, the learning rate is multiplied
      by :func:`learning_rate_factor` of the mean KL per update over them (PPO's rollouts of 2,048 steps or more:
      every update; A2C's of 40: every 52 updates, whose single KLs are mostly noise); a raise waits for
      ``raise_after`` decisions in a row below ``target_kl / tolerance`` and steps by the highest of their KLs.

    **The configured learning rate is the user's.** By default the callback never raises the rate above the
    configured one (a schedule's value at the current progress) and clamps nothing before a KL was measured: the first
    update runs at exactly the configured rate, however high or low. It lowers the rate (a redo, a window above the
    band), never below :data:`LOWEST_LEARNING_RATE` (or the configured rate, where that is lower), and raises it back
    up to the configured rate at most. Raising above it is opt-in: ``lr_bounds=(lowest, highest)`` clamp the rate a
    step uses into them from the first update on and let decisions raise it up to ``highest``;
    ``raise_above_configured=True`` does so with the kind's bounds (PPO-style ``(1e-5, 1e-3)``, A2C-style
    ``(1e-5, 1e-2)``; plain SGD's upper bound at least the configured rate, :data:`GRADIENT_SCALED_OPTIMIZERS`). Bounds
    clamp the rate, never the scale: the saved scale is what the decisions, redos and rollbacks chose, and a decision
    moves the rate in use as far as the bounds let it.

    The learning rate has one scale (:mod:`sb3_safe.common.schedules`), which
    :class:`~sb3_safe.NonFiniteGuardCallback`'s rollbacks lower too: both act on the same learning rate. It is a model
    attribute saved with the model, applied to ``model.lr_schedule`` at the start of each ``learn()``;
    ``model.learning_rate`` stays what the user passed. A rollback brings the scale back to at most the healthy
    state's and lowers it by ``lr_decay``, and this callback adapts from there; without bounds, a scale above 1 (from an
    earlier ``learn()`` that raised it) is brought back to 1 at the start of ``learn()``, with a warning. With the guard
    on the same model, in either order, the two judge each update as one supervisor (:mod:`sb3_safe.common.supervisor`).

    Logged: ``train/learning_rate`` (SB3's, the learning rate of the kept update), ``train/kl`` (its mean KL),
    ``train/kl_window`` (the mean KL per update a decision was made on), ``train/lr_factor`` (the factor the judgement
    of the update applied to the learning rate: redos and decision; 1 if unchanged), ``train/lr_scale`` (the scale)
    and ``train/redone_updates`` (updates undone and redone so far in this ``learn()``). With ``verbose=1`` each change
    of the rate is printed with the KL that decided it.

    Why this design (``benchmarks/results/robustness.md`` and ``adaptive_lr.md`` measure it): the KL of the whole
    rollout after the update phase, because a minibatch's KL before its own step is ~0 and one pass over the rollout
    per epoch would cost about a third of an update; the step from the measured ratio, because the KL grows like the
    square of the learning rate for small updates, so one step lands near the target where the anchors' fixed 1.5
    needs many; undoing an update far above the target, because one update at a learning rate 100 times too high
    can move the policy so far (a KL of 15 on Pendulum-v1; a softmax saturated for good on CartPole-v1) that no
    later learning rate brings it back; never above the configured rate by default, because a tuned rate raised where
    its KL was low lost (rl-zoo's Walker2d-v5 rate raised 3.4x for 300k steps ended at 0.72x stock PPO's return,
    ``benchmarks/results/full_budget.md``), and where PPO's clipping holds the KL in range a rate too high for the
    critic is not seen by the KL; a raise only on evidence (PPO-style: two updates in a row below the band), because
    where the clipping holds the KL in the band nothing takes a raise on one noisy reading back. The defaults per kind
    of algorithm (:data:`PPO_STYLE`, :data:`ONE_STEP`) come from the tuned settings' own KLs, so that at a sound
    learning rate the callback changes little; A2C's sits above them (its learning rate drifted below the tuned one
    on the KLs' heavy tail).

    Works with the algorithms that take gradient steps on their policy (not TRPO, whose step is a line search in
    a KL trust region of its own). With KLAdaptivePPO two controllers see one signal: its adaptive penalty
    coefficient pulls the KL of each update towards ``adaptive_kl_target`` (changing when the KL leaves
    ``[target / 1.5, 1.5 target]``), this callback the learning rate. ``target_kl`` defaults to the same target, so
    they agree: the penalty does the fine control, the learning rate moves only outside ``[target / 3, 3 target]``
    and undoes updates beyond 6 times it. With a lower target of its own (a first version of this callback aimed
    at 0.03 on top of KLAdaptivePPO's default 0.01) the learning rate climbs to its upper bound while the penalty
    holds the KL down: measured on Pendulum-v1, 7.5x the tuned learning rate at the end of a tuned run.

    :param target_kl: the mean KL per update aimed at; None: KLAdaptivePPO's ``adaptive_kl_target``,
        :data:`ONE_STEP`'s for A2C and SafeA2C, :data:`PPO_STYLE`'s for the others
    :param tolerance: no change while the KL is within a factor ``tolerance`` of ``target_kl``; > 1
    :param max_step: the learning rate changes by at most this factor per decision; > 1
    :param undo_above: undo and redo an update whose KL exceeds this multiple of ``target_kl``; None: the kind's
        default (:data:`PPO_STYLE`, :data:`ONE_STEP`); > 1
    :param raise_after: decisions in a row below the band before a raise; None: the kind's default (PPO-style 2,
        A2C-style 1); an int >= 1
    :param trust_region: False: never undo an update (adapt only)
    :param max_redos: redos per update at most; an int >= 0
    :param window_steps: least number of environment steps between two decisions on the learning rate; an int >= 1
    :param lr_bounds: ``(lowest, highest)`` learning rate, ``0 < lowest <= highest < inf``: the rate each step uses
        is clamped into them from the first update on, and decisions may raise it up to ``highest``, above the
        configured rate. None (the default): no bounds; the rate stays at most the configured one (see above)
    :param raise_above_configured: True: without ``lr_bounds``, the kind's bounds (PPO-style ``(1e-5, 1e-3)``
        (:data:`PPO_STYLE`), A2C-style ``(1e-5, 1e-2)`` (:data:`ONE_STEP`), the upper one raised to the configured
        rate (the schedule's start) where it is higher and the optimizer is plain SGD
        (:data:`GRADIENT_SCALED_OPTIMIZERS`)), which clamp from the first update on and let decisions raise the rate
        up to the upper one: the default before 0.2.0. Given ``lr_bounds`` win. False (the default): never above the
        configured rate. True or False
    :param verbose: 1: print each change of the learning rate (redos and decisions) with the KL that decided it
    """

    def __init__(
        self,
        target_kl: float | None = None,
        tolerance: float = DEFAULT_TOLERANCE,
        max_step: float = 2.0,
        undo_above: float | None = None,
        raise_after: int | None = None,
        trust_region: bool = True,
        max_redos: int = 3,
        window_steps: int = 2048,
        lr_bounds: tuple[float, float] | None = None,
        raise_above_configured: bool = False,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        self.target_kl = None if target_kl is None else _check_positive("target_kl", target_kl)
        self.tolerance = _check_positive("tolerance", tolerance, above=1.0)
        self.max_step = _check_positive("max_step", max_step, above=1.0)
        self.undo_above = None if undo_above is None else _check_positive("undo_above", undo_above, above=1.0)
        self.trust_region = bool(trust_region)
        checked_ints = [("max_redos", max_redos, 0), ("window_steps", window_steps, 1)]
        if raise_after is not None:
            checked_ints.append(("raise_after", raise_after, 1))
        for name, value, least in checked_ints:
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        self.max_redos = max_redos
        self.raise_after = raise_after
        self.window_steps = window_steps
        self.lr_bounds = None if lr_bounds is None else _check_bounds(lr_bounds)
        if not isinstance(raise_above_configured, bool):
            raise ValueError(f"raise_above_configured must be True or False, got {raise_above_configured!r}")
        self.raise_above_configured = raise_above_configured
        #: the bounds the learning rate is clamped into in this learn(): ``lr_bounds``, the kind's with
        #: ``raise_above_configured``; None by default (the configured rate is the highest, no clamp)
        self.bounds: tuple[float, float] | None = None
        #: the settings in use in this learn(), defaults resolved for the algorithm
        self.targets = PPO_STYLE
        #: updates undone and redone in this learn()
        self.redone_updates = 0
        #: the factor the judgement of the current update applied to the learning rate (``train/lr_factor``)
        self._factor = 1.0
        #: (KL of the kept update, learning rate it used), one per update of this learn()
        self.history: list[tuple[float, float]] = []
        #: (mean KL per update of the window, factor applied to the scale), one per decision of this learn()
        self.decisions: list[tuple[float, float]] = []
        self._window: list[float] = []
        self._window_start = 0
        #: the window KLs of the last decisions, newest last (a raise needs ``raise_after`` of them below the band)
        self._recent_windows: deque[float] = deque(maxlen=1)
        self._snapshots: SnapshotStore | None = None
        self._pending: _PendingUpdate | None = None
        #: updates of the model this callback saw (across learn() calls that continue it), and the model
        self._updates = 0
        self._counted_model: OnPolicyAlgorithm | None = None
        self._measure_every = 1
        self._train_batch: TrainBatchRecorder | None = None
        self._supervisor: UpdateSupervisor

    def _on_training_start(self) -> None:
        model = self.model
        if not isinstance(model, OnPolicyAlgorithm) or isinstance(model, TRPO):
            raise TypeError(
                f"KLAdaptiveLRCallback adapts the learning rate of on-policy algorithms that take gradient steps on "
                f"their policy (PPO, A2C, KLAdaptivePPO, SafeA2C, MaskablePPO, RecurrentPPO), got {type(model).__name__}"
            )
        warn_if_normalized_twice(model.policy, model.get_env())
        one_step = isinstance(model, A2C)
        defaults = ONE_STEP if one_step else PPO_STYLE
        # KLAdaptivePPO's penalty aims at its own target: the same one, so the two controllers agree
        default_target = getattr(model, "adaptive_kl_target", defaults.target_kl)
        self.targets = KLTargets(
            target_kl=default_target if self.target_kl is None else self.target_kl,
            undo_above=defaults.undo_above if self.undo_above is None else self.undo_above,
            highest_learning_rate=defaults.highest_learning_rate,
            raise_after=defaults.raise_after if self.raise_after is None else self.raise_after,
            keep_redo_rate=defaults.keep_redo_rate,
        )
        self._recent_windows = deque(maxlen=self.targets.raise_after)
        if self.lr_bounds is not None:
            self.bounds = self.lr_bounds
        elif self.raise_above_configured:
            self.bounds = (LOWEST_LEARNING_RATE, _default_highest_learning_rate(model, defaults))
        else:
            self.bounds = None
            self._bring_a_raised_scale_back(model)
        # Bounds clamp the rate each step uses (also of a configured rate far too high, before the first update); by
        # default there are none: the first update runs at the configured rate (times a rollback's or a cut's scale)
        set_learning_rate_bounds(model, [model.policy.optimizer], self.bounds)
        self.redone_updates = 0
        self.history, self.decisions, self._window = [], [], []
        self._window_start = model.num_timesteps
        self._pending = None
        same_model = self._counted_model is model
        if not same_model:  # a learn() that continues counts on: no new first updates
            self._updates, self._counted_model = 0, model
        store = self._snapshots
        if not self.trust_region:
            self._snapshots = None
        elif store is None or not same_model or not store.watched.resolves_to_the_same(model):
            # Resolving what to snapshot costs about a millisecond: once per model, not per learn() of it
            self._snapshots = SnapshotStore(model, WatchedModel(model), restorable=True, lean=True)
        if self._train_batch is not None:
            self._train_batch.detach()  # of a learn() that ended with an exception
        self._train_batch = TrainBatchRecorder(model) if one_step else None
        # A2C's updates are a few env steps each: one in MEASURED_SAMPLES / rollout size is measured, PPO's every one
        rollout_size = model.n_steps * model.n_envs
        self._measure_every = max(1, math.ceil(MEASURED_SAMPLES / rollout_size)) if one_step else 1
        self._supervisor = UpdateSupervisor.of(model)
        self._supervisor.join(self, self.locals.get("callback"))

    def _bring_a_raised_scale_back(self, model: OnPolicyAlgorithm) -> None:
        """
        By default the rate never runs above the configured one: a scale above 1 (raised by an earlier ``learn()`` with
        ``lr_bounds`` or ``raise_above_configured``, saved with the model) is brought back to 1, and said so.
        """
        scale = learning_rate_scale(model)
        if scale <= 1.0:
            return
        message = (
            f"KLAdaptiveLRCallback: the learning-rate scale {scale:.4g} (raised above the configured rate by an "
            f"earlier learn() with lr_bounds or raise_above_configured) is brought back to 1, the configured rate: "
            f"pass raise_above_configured=True or lr_bounds to keep raising it."
        )
        warnings.warn(message, UserWarning, stacklevel=2)
        set_learning_rate_scale(model, [model.policy.optimizer], 1.0)
        self.logger.record("train/lr_scale", 1.0)

    def _on_step(self) -> bool:
        return True

    @property
    def _algorithm(self) -> OnPolicyAlgorithm:
        """The model, checked to be on-policy at the start of ``learn()``; its policy an actor-critic policy."""
        return cast(OnPolicyAlgorithm, self.model)

    # SB3 calls train() right after the rollout end and the next rollout starts right after it (or learn() ends): the
    # update is prepared at the one event and judged at the other, through the model's supervisor (which orders this
    # callback's work with the guard's, whatever the order of the callbacks)

    def _on_rollout_end(self) -> None:
        self._supervisor.rollout_end()

    def _on_rollout_start(self) -> None:
        self._supervisor.after_update()

    def _on_training_end(self) -> None:
        self._supervisor.after_update(at_end=True)
        if self._train_batch is not None:
            self._train_batch.detach()

    # ----- one update (called by the supervisor) -----

    def prepare_update(self) -> None:
        """Before ``train()``: the record of the state an undo of the update restores (for the updates measured)."""
        model = self._algorithm
        scheduled = self._updates % self._measure_every == 0
        self._updates += 1
        if not scheduled and self._updates > MEASURED_FIRST:
            return  # neither measured nor undone: nothing to prepare
        rollout, old_params = None, None
        if self._train_batch is None:
            rollout = Rollout.of(model.rollout_buffer)
            old_params = old_distribution_params(model.policy, rollout)
        else:
            self._train_batch.arm()
        self._pending = _PendingUpdate(
            rollout=rollout,
            old_params=old_params,
            buffer_state=dict(model.rollout_buffer.__dict__),
            snapshot=self._take_snapshot(),
            scheduled=scheduled,
        )

    def discard_update(self) -> None:
        """The update was rolled back or training is stopping (by a guard): nothing to judge, nothing to undo."""
        self._pending = None

    def judge_update(self, at_end: bool) -> None:
        """
        After ``train()``: measure the KL, undo and redo an overshooting update, adapt the next learning rate.

        :param at_end: at the end of ``learn()`` (else at the start of the next rollout, which SB3 has set up)
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return  # not an update measured (or learn() ended inside the rollout)
        self._factor = 1.0
        try:
            self._judge(pending, at_end)
        finally:
            # Every change of the rate is logged with the KL it was decided on (train/kl, train/kl_window)
            self.logger.record("train/lr_factor", self._factor)
            self.logger.record("train/lr_scale", learning_rate_scale(self._algorithm))
            self.logger.record("train/redone_updates", self.redone_updates)

    def _judge(self, pending: "_PendingUpdate", at_end: bool) -> None:
        """:meth:`judge_update`'s work on the update ``pending`` records."""
        model = self._algorithm
        kl = self._measure(pending)
        if kl is None:
            return
        learning_rate = first_rate = self._step_learning_rate()
        target, undo_above = self.targets.target_kl, self.targets.undo_above
        redone = False
        for _ in range(self.max_redos):
            if pending.snapshot is None or not kl > undo_above * target:
                break
            cut = self._limited(min(max(math.sqrt(target / kl), 0.1), 0.5))
            if cut >= 1.0:
                break  # at the lowest learning rate already: a redo would train at the same one
            self.redone_updates += 1
            redone = True
            self._redo(pending, cut, kl)
            if self._supervisor.stopping or self._supervisor.restored:
                # A guard rolled the redo back or stopped training: this update is no longer the one measured; the
                # redo trained the policy all the same
                if not at_end:
                    _set_up_rollout(model)
                return
            kl = self._measure(pending)
            learning_rate = self._step_learning_rate()
            if kl is None:
                break
        if redone:
            if not at_end:
                _set_up_rollout(model)
            if not self.targets.keep_redo_rate and learning_rate > 0.0:
                # The cut holds for that update only: the next ones run at the rate before it divided by max_step,
                # or at the redo's where that is higher (a max_step above 2: a cut of 0.5 lowers less than it)
                self._scale(
                    max(1.0, first_rate / (self.max_step * learning_rate)),
                    f"the redo's cut holds for that update only, the next ones run at {first_rate:.3g} / {self.max_step:g}",
                )
        if kl is None:
            return
        self.history.append((kl, learning_rate))
        self.logger.record("train/kl", kl)
        if pending.scheduled:  # the window's mean is over updates on schedule, not the first ones of a model
            self._window.append(kl)
        if self._window and model.num_timesteps - self._window_start >= self.window_steps:
            window_kl = sum(self._window) / len(self._window)
            factor = self._decide(window_kl)
            low, high = target / self.tolerance, target * self.tolerance
            where = "above" if window_kl > high else "below"
            updates = f"{len(self._window)} update" + ("s" if len(self._window) > 1 else "")
            reason = f"mean KL {window_kl:.3g} over {updates}, {where} [{low:.3g}, {high:.3g}]"
            self.decisions.append((window_kl, self._scale(factor, reason)))
            self.logger.record("train/kl_window", window_kl)
            self._window, self._window_start = [], model.num_timesteps

    def _step_learning_rate(self) -> float:
        """The learning rate the last optimizer step ran at (train() set it from the schedule)."""
        return float(self._algorithm.policy.optimizer.param_groups[0]["lr"])

    def _limited(self, factor: float) -> float:
        """The factor :meth:`_scale` would apply to the scale for ``factor`` (see :meth:`_new_scale`)."""
        scale = learning_rate_scale(self._algorithm)
        return self._new_scale(factor) / scale if scale > 0.0 else 1.0

    def _new_scale(self, factor: float) -> float:
        """
        The scale that moves the rate a step uses by ``factor`` as far as the callback lets it.

        By default (no bounds): never above the configured rate (the schedule's value at this progress: a scale of at
        most 1), and a cut never below :data:`LOWEST_LEARNING_RATE` (or the configured rate, where it is lower); the
        rate is not clamped otherwise. With bounds (``lr_bounds``, ``raise_above_configured``): the rate in use is the
        schedule's clamped into them, a decision acts on it (a configured rate far too high is lowered at once) and
        never moves the scale where the rate cannot follow (a lowering at the lower bound, a raise at the upper one),
        so that no clamp is folded into the saved scale without a decision.
        """
        model = self._algorithm
        scale = learning_rate_scale(model)
        rate = unbounded_learning_rate(model)
        if rate <= 0.0 or factor == 1.0:
            return scale  # the schedule is at 0: a scale moves nothing
        if self.bounds is None:
            if factor > 1.0:
                return max(min(scale * factor, 1.0), scale)
            floor = min(LOWEST_LEARNING_RATE / scheduled_learning_rate(model), 1.0)
            return min(max(scale * factor, floor), scale)
        low, high = self.bounds
        moved = min(max(min(max(rate, low), high) * factor, low), high) / rate
        return scale * (max(moved, 1.0) if factor > 1.0 else min(moved, 1.0))

    def _scale(self, factor: float, reason: str) -> float:
        """
        Multiply the learning-rate scale by ``factor``, as far as :meth:`_new_scale` lets the rate move; say so (at
        ``verbose`` >= 1) with ``reason``, the measured KL that decided it; return the factor applied.
        """
        model = self._algorithm
        scale, new_scale = learning_rate_scale(model), self._new_scale(factor)
        if new_scale == scale:
            return 1.0
        before = current_learning_rate(model)
        set_learning_rate_scale(model, [model.policy.optimizer], new_scale)
        applied = new_scale / scale
        self._factor *= applied
        if self.verbose >= 1:
            after = current_learning_rate(model)
            print(f"KLAdaptiveLRCallback: {reason}: learning rate x {applied:.3g} ({before:.3g} -> {after:.3g})")
        return applied

    def _take_snapshot(self) -> SnapshotStore | None:
        """The state to undo an update to, if the trust region is on and the state is finite (else the guard's job)."""
        store = self._snapshots
        if store is None:
            return None
        snapshot, finite = store.copy_and_test()
        if not finite:
            return None
        store.commit(snapshot)
        return store

    def _measure(self, pending: "_PendingUpdate") -> float | None:
        """The mean KL of the update just made, or None if it cannot be known (A2C's step was skipped)."""
        policy = self._algorithm.policy
        if pending.rollout is not None:
            return mean_kl(policy, pending.rollout, pending.old_params)
        assert self._train_batch is not None
        recorded = self._train_batch.recorded
        if recorded is None:
            return None
        batch, old_params = recorded
        return mean_kl_on_batch(policy, batch, old_params)

    def _decide(self, window_kl: float) -> float:
        """
        The factor for the learning rate after a window with mean KL ``window_kl``: a lowering at once, a raise only
        after ``raise_after`` windows in a row below the band, by the smallest of their factors (their highest KL).
        """
        self._recent_windows.append(window_kl)
        target = self.targets.target_kl
        factors = [learning_rate_factor(kl, target, self.tolerance, self.max_step) for kl in self._recent_windows]
        if factors[-1] < 1.0:
            return factors[-1]
        if len(factors) < self.targets.raise_after or min(factors) <= 1.0:
            return 1.0
        return min(factors)

    def _redo(self, pending: "_PendingUpdate", cut: float, kl: float) -> None:
        """
        Undo the update (the record's whole state, counters too), cut the learning rate, train on the same rollout.

        :param pending: the record of the update
        :param cut: the factor for the learning rate (:meth:`_limited`)
        :param kl: the update's mean KL, which decided the redo
        """
        model = self._algorithm
        assert pending.snapshot is not None
        pending.snapshot.restore()
        target = self.targets.target_kl
        self._scale(cut, f"KL {kl:.3g} > {self.targets.undo_above:g} x target {target:.3g}, update redone")
        if self._train_batch is not None:
            self._train_batch.arm()
        # The buffer as train() first read it (get() and the next reset() put new arrays in place of these)
        buffer = model.rollout_buffer
        current = dict(buffer.__dict__)
        buffer.__dict__.update(pending.buffer_state)
        try:
            model.train()
        finally:
            buffer.__dict__.clear()
            buffer.__dict__.update(current)


def _set_up_rollout(model: OnPolicyAlgorithm) -> None:
    """
    Set the next rollout up again as SB3 did before a redo trained the policy (evaluation mode, gSDE's noise): the
    rollout has started (this runs at its start) and collects with what the redo left.
    """
    model.policy.set_training_mode(False)
    if model.use_sde:
        model.policy.reset_noise(model.env.num_envs if model.env is not None else 1)


class TrainBatchRecorder:
    """
    For algorithms that take one gradient step on the whole rollout per update (A2C, SafeA2C): the batch ``train()``
    reads from the rollout buffer and the distribution it computes on it before its step, which is the old
    distribution on that batch, in that order; the KL then needs one pass after the update, not two.

    The buffer's ``get`` is wrapped (an instance attribute, removed by :meth:`detach`; the rollout buffer is not
    saved with the model) and the policy optimizer gets a step pre-hook.

    :param model: the algorithm
    """

    def __init__(self, model: OnPolicyAlgorithm) -> None:
        self.model = model
        self.recorded: tuple[Any, th.Tensor | None] | None = None
        self._armed = False
        self._batch: Any = None
        buffer = model.rollout_buffer
        self._get = buffer.get
        buffer.get = self._recording_get  # type: ignore[method-assign, assignment]
        self._hook = model.policy.optimizer.register_step_pre_hook(self._before_step)

    def arm(self) -> None:
        """Record the next update's first step."""
        self._armed, self.recorded, self._batch = True, None, None

    def _recording_get(self, batch_size: int | None = None) -> Iterator[Any]:
        for batch in self._get(batch_size):
            self._batch = batch
            yield batch

    def _before_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self._armed or self._batch is None:
            return
        self._armed = False
        buffer = self.model.rollout_buffer
        if len(self._batch.actions) != buffer.buffer_size * buffer.n_envs:
            return  # not the whole rollout: nothing to measure on
        dist = self.model.policy.action_dist
        old_params = distribution_params(dist).detach() if has_analytic_kl(dist) else None
        self.recorded = (self._batch, old_params)

    def detach(self) -> None:
        """Unwrap the buffer's ``get`` and remove the hook."""
        self.model.rollout_buffer.__dict__.pop("get", None)
        self._hook.remove()


@dataclass
class _PendingUpdate:
    """What the judgement of an update needs, taken at the rollout end before it."""

    #: the rollout's arrays and the old distribution on them (PPO-style); None: A2C-style (TrainBatchRecorder)
    rollout: Rollout | None
    old_params: th.Tensor | None
    #: the rollout buffer's attributes (array references, position, flags) before train() read it
    buffer_state: dict[str, Any]
    snapshot: SnapshotStore | None
    #: measured on schedule (every ``MEASURED_SAMPLES``), not as one of the first updates the callback sees of a model
    scheduled: bool


def check_adaptive_lr(settings: dict[str, Any] | None) -> dict[str, Any] | None:
    """
    Check an algorithm's ``adaptive_lr`` setting (:class:`KLAdaptiveLRCallback`'s keyword arguments, or None) now
    rather than at the first ``learn()``.

    :param settings: the keyword arguments, or None
    :return: a copy of them
    :raises ValueError: naming ``adaptive_lr`` and the bad argument
    """
    if settings is None:
        return None
    if not isinstance(settings, dict):
        raise ValueError(f"adaptive_lr must be None or a dict of KLAdaptiveLRCallback arguments, got {settings!r}")
    try:
        KLAdaptiveLRCallback(**settings)
    except (TypeError, ValueError) as error:
        raise ValueError(f"adaptive_lr: {error}") from None
    return dict(settings)


#: The model attribute keeping the callback ``adaptive_lr=`` builds, across ``learn()`` calls (not saved)
ADAPTIVE_LR_CALLBACK = "_adaptive_lr_callback"


def with_adaptive_lr(model: OnPolicyAlgorithm, callback: MaybeCallback) -> MaybeCallback:
    """
    ``callback`` plus the model's :class:`KLAdaptiveLRCallback` made from its ``adaptive_lr`` setting (none if None),
    for ``learn()``: one callback per model, so that a ``learn()`` that continues it counts on, as a callback the
    user passes to each ``learn()`` does.

    The model's saved learning-rate scale is applied to its schedule here too (``load()`` rebuilt the schedule from
    the configured ``learning_rate``, without it), so that sb3-safe's algorithms keep the scale of a rollback or of
    this callback in a ``learn()`` without sb3-safe's callbacks.

    :param model: an algorithm with an ``adaptive_lr`` setting (KLAdaptivePPO, SafeA2C)
    :param callback: what ``learn()`` was given
    """
    apply_learning_rate_scale(model)
    settings = getattr(model, "adaptive_lr", None)
    if settings is None:
        return callback
    kept = getattr(model, ADAPTIVE_LR_CALLBACK, None)
    if kept is None or kept[0] != settings:  # built again when the setting was changed
        kept = (dict(settings), KLAdaptiveLRCallback(**settings))
        setattr(model, ADAPTIVE_LR_CALLBACK, kept)
    if callback is None:
        callbacks: list[BaseCallback] = []
    elif isinstance(callback, list):
        callbacks = list(callback)
    elif isinstance(callback, BaseCallback):
        callbacks = [callback]
    else:
        callbacks = [ConvertCallback(callback)]
    return [*callbacks, kept[1]]
