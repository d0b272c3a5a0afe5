"""
When the guard runs its full check of the model state, whose passing copy becomes the snapshot, and whether it
re-reads the live model at rollout boundaries.

The full check copies every stored tensor (networks, target networks, optimizer state), so it runs at update
boundaries, never inside ``train()``: at the start of ``learn()``, at the start of a rollout that follows an update,
and at the end of ``learn()`` if an update ran after the last check. Every optimizer step is checked in between by
the cheap in-place check of the parameters it changed, so the full check adds what no optimizer step touches:
optimizer state, target networks, buffers.

The full check costs about as much as one small gradient step. PPO-style algorithms (PPO, KLAdaptivePPO, TRPO,
RecurrentPPO, MaskablePPO) take many gradient steps per update, so the check runs after every update. Algorithms
that take a single gradient step per update (A2C, SafeA2C: one per rollout of a few steps) or update every few
environment steps (the off-policy algorithms) would pay a large share of each update for it: they are checked at
most every ``snapshot_every`` environment steps (default :data:`FEW_STEP_SNAPSHOT_EVERY`). That is also the rollback
granularity: a rollback restores a state at most that many steps old, always one that passed the full check.

Between full checks, what forward passes read (every parameter and buffer) is re-read in place at each rollout
start and end when other callbacks run in the same ``learn()`` (:func:`other_callbacks_may_write`): they are the code
that can change a weight outside an optimizer step, and these are the boundaries before the next forward pass of a
rollout and of ``train()``. This check is cheap (no copy); only the snapshot copy has a cadence.
"""

from stable_baselines3 import A2C
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    CheckpointCallback,
    ConvertCallback,
    EvalCallback,
    EveryNTimesteps,
    LogEveryNTimesteps,
    ProgressBarCallback,
    StopTrainingOnMaxEpisodes,
    StopTrainingOnNoModelImprovement,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

#: Environment steps between two full checks (and snapshots) of A2C and the off-policy algorithms, by default
FEW_STEP_SNAPSHOT_EVERY = 1000
#: Callbacks that never write into the model (exact classes: a subclass may); sb3-safe adds its own. Containers
#: (CallbackList, EvalCallback, EveryNTimesteps) are looked into
READ_ONLY_CALLBACKS: set[type[BaseCallback]] = {
    CheckpointCallback,
    EvalCallback,
    EveryNTimesteps,
    LogEveryNTimesteps,
    ProgressBarCallback,
    StopTrainingOnMaxEpisodes,
    StopTrainingOnNoModelImprovement,
    StopTrainingOnRewardThreshold,
}


def other_callbacks_may_write(root: BaseCallback | None, guard: BaseCallback) -> bool:
    """
    Whether code that may change the model outside an optimizer step runs in this ``learn()``: a callback other than
    ``guard`` and those of :data:`READ_ONLY_CALLBACKS`, or a function callback. Inside ``learn()`` nothing else
    does: the algorithm changes its networks by optimizer steps (checked one by one), and by target-network updates
    made of checked values.

    :param root: the callback ``learn()`` runs (its ``callback`` local), None if unknown
    :param guard: the guard asking
    """
    if root is None:
        return True
    pending = [root]
    while pending:
        callback = pending.pop()
        kind = type(callback)
        if callback is guard:
            continue
        if kind is CallbackList:
            pending += callback.callbacks  # type: ignore[attr-defined]
        elif kind is ConvertCallback:
            if callback.callback is not None:  # type: ignore[attr-defined]
                return True
        elif kind in READ_ONLY_CALLBACKS:
            children = (getattr(callback, "callback", None), getattr(callback, "callback_on_new_best", None))
            pending += [child for child in children if isinstance(child, BaseCallback)]
        else:
            return True
    return False


class FullCheckCadence:
    """
    Tell, from the model's update counter ``_n_updates`` and its timestep, whether the full check is due.

    :param snapshot_every: least number of environment steps between two full checks after updates; None: every
        update of PPO-style algorithms, every :data:`FEW_STEP_SNAPSHOT_EVERY` steps of A2C and off-policy ones
    """

    def __init__(self, snapshot_every: int | None = None) -> None:
        if snapshot_every is not None and (not isinstance(snapshot_every, int) or snapshot_every < 1):
            raise ValueError(f"snapshot_every must be None or an int >= 1 (environment steps), got {snapshot_every!r}")
        self.snapshot_every = snapshot_every
        self._checked_n_updates: int | None = None
        self._checked_timestep = 0
        self._interval_of: tuple[BaseAlgorithm, int] | None = None

    def interval(self, model: BaseAlgorithm) -> int:
        """
        The least number of environment steps between two full checks after updates for ``model`` (0: every update).

        :param model: the algorithm
        """
        if self.snapshot_every is not None:
            return self.snapshot_every
        # Asked at every rollout start (every step of DQN): the answer per model is kept
        if self._interval_of is None or self._interval_of[0] is not model:
            self._interval_of = (model, FEW_STEP_SNAPSHOT_EVERY if isinstance(model, OffPolicyAlgorithm | A2C) else 0)
        return self._interval_of[1]

    def due_at_rollout_start(self, model: BaseAlgorithm) -> bool:
        """
        Whether to check at the start of a rollout: after an update (always for algorithms that do not count them),
        once the interval has passed. Off-policy algorithms start rollouts without training in between while
        learning has not started.

        :param model: the algorithm
        """
        n_updates = getattr(model, "_n_updates", None)
        if n_updates is not None and n_updates == self._checked_n_updates:
            return False
        return model.num_timesteps - self._checked_timestep >= self.interval(model)

    def due_at_training_end(self, model: BaseAlgorithm) -> bool:
        """
        Whether to check at the end of ``learn()``: if an update ran after the last check (whatever the interval:
        the model handed back is checked).

        :param model: the algorithm
        """
        return getattr(model, "_n_updates", None) != self._checked_n_updates

    def passed(self, model: BaseAlgorithm) -> None:
        """
        Record a passed full check.

        :param model: the algorithm
        """
        self._checked_n_updates = getattr(model, "_n_updates", None)
        self._checked_timestep = model.num_timesteps
