"""
The response policy: what the guard does about a located fault (raise, stop or roll back), and doing it.
"""

import os
import tempfile
from collections.abc import Callable
from typing import Any, Literal, get_args

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.type_aliases import RolloutReturn

from sb3_safe.common.guard.locate import ENVIRONMENT, MODEL, NORMALIZATION, STALL
from sb3_safe.common.guard.snapshot import SnapshotStore
from sb3_safe.common.guard.watch import WatchedModel
from sb3_safe.common.schedules import learning_rate_scale, scale_learning_rate

#: What the guard does on a non-finite value
OnNonFinite = Literal["raise", "stop", "rollback"]
ON_NONFINITE_MODES: tuple[OnNonFinite, ...] = get_args(OnNonFinite)
#: Model attribute counting the guard's rollbacks; saved with the model, so max_rollbacks holds across resumed runs
ROLLBACKS_ATTRIBUTE = "nonfinite_guard_rollbacks"
#: The sources a restored snapshot repairs
RESTORABLE = (MODEL, NORMALIZATION)


def check_settings(on_nonfinite: str, lr_decay: float, max_rollbacks: int, save_path: str | None = None) -> None:
    """
    Raise a ``ValueError`` naming the first bad setting of the response.

    :param on_nonfinite: one of :data:`ON_NONFINITE_MODES`
    :param lr_decay: factor in (0, 1)
    :param max_rollbacks: >= 0
    :param save_path: None, or a file path whose folder exists or can be created
    """
    if on_nonfinite not in ON_NONFINITE_MODES:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE_MODES}, got {on_nonfinite!r}")
    if not 0.0 < lr_decay < 1.0:
        raise ValueError(f"lr_decay must be in (0, 1), got {lr_decay!r}")
    if max_rollbacks < 0:
        raise ValueError(f"max_rollbacks must be >= 0, got {max_rollbacks!r}")
    if save_path is not None:
        _check_save_path(save_path)


def _check_save_path(save_path: str) -> None:
    """A stop saves when training has already gone wrong: a path that cannot be written must fail now, not then."""
    if not isinstance(save_path, str | os.PathLike) or not str(save_path):
        raise ValueError(f"save_path must be None or a file path, got {save_path!r}")
    path = os.path.abspath(save_path)
    if os.path.isdir(path):
        raise ValueError(
            f"save_path must be a file path (e.g. {os.path.join(save_path, 'healthy.zip')}), got a folder: {save_path!r}"
        )
    folder = os.path.dirname(path)
    # The nearest existing ancestor decides: SB3's save creates the missing folders below it
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"save_path={save_path!r} cannot be written: {folder} is a file, not a folder")
    try:  # (permission bits say too little: root passes them, /proc and read-only mounts refuse anyway)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        refused = f"{folder} refuses a new file ({error.strerror})"
        raise ValueError(f"save_path={save_path!r} cannot be written: {refused}") from None


def vec_normalize_path(save_path: str | None) -> str | None:
    """
    Where a stop saves the VecNormalize statistics: ``<save_path without .zip>_vecnormalize.pkl``.

    :param save_path: where a stop saves the model, or None
    """
    if save_path is None:
        return None
    base = save_path[:-4] if save_path.endswith(".zip") else save_path
    return f"{base}_vecnormalize.pkl"


class Response:
    """
    Raise, stop or roll back, for one ``learn()``.

    A rollback restores the healthy snapshot, multiplies the learning rate by ``lr_decay`` (scaling the schedule,
    see :mod:`sb3_safe.common.schedules`) and counts itself on the model; a stop restores the healthy snapshot,
    saves it if asked, and sets :attr:`stopping`, which the callback turns into the end of ``learn()``.

    :param model: the algorithm
    :param watched: what the guard watches in it
    :param snapshots: the snapshot store to restore from
    :param on_nonfinite: ``"raise"``, ``"stop"`` or ``"rollback"``
    :param lr_decay: factor applied to the learning rate at each rollback
    :param max_rollbacks: rollbacks allowed over the model's whole training before stopping instead
    :param save_path: where a stop saves the restored model, or None
    :param on_restore: called when a rollback or a stop restored a state (the update in progress is replaced)
    """

    def __init__(
        self,
        model: BaseAlgorithm,
        watched: WatchedModel,
        snapshots: SnapshotStore,
        on_nonfinite: OnNonFinite,
        lr_decay: float,
        max_rollbacks: int,
        save_path: str | None,
        on_restore: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        self.watched = watched
        self.snapshots = snapshots
        self.on_nonfinite = on_nonfinite
        self.lr_decay = lr_decay
        self.max_rollbacks = max_rollbacks
        self.save_path = save_path
        self.on_restore = on_restore
        #: rollbacks over the model's whole training, read back from the model
        self.n_rollbacks = int(getattr(model, ROLLBACKS_ATTRIBUTE, 0))
        #: whether a stop ends ``learn()`` (from the next env step on)
        self.stopping = False

    def respond(self, source: str) -> tuple[str, str]:
        """
        Decide and act on non-finite values from ``source``.

        :param source: where they came from (see :mod:`sb3_safe.common.guard.locate`)
        :return: the action (``"raise"``, ``"stop"`` or ``"rollback"``) and a sentence saying what was done; the
            caller raises
        """
        if self.on_nonfinite == "raise":
            return "raise", "Pass on_nonfinite='rollback' or 'stop' to recover instead of raising."
        has_healthy = self.snapshots.healthy is not None
        if self.on_nonfinite == "rollback" and source in RESTORABLE and has_healthy and self.n_rollbacks < self.max_rollbacks:
            return "rollback", self._rollback()
        reason = ""
        if self.on_nonfinite == "rollback" and source == ENVIRONMENT:
            reason = "environment data cannot be rolled back"
        elif self.on_nonfinite == "rollback" and source == STALL:
            reason = "a rollback cannot fix a stall"
        elif self.on_nonfinite == "rollback" and source not in RESTORABLE:
            reason = "data already collected cannot be rolled back"
        elif self.on_nonfinite == "rollback" and has_healthy:
            reason = f"all max_rollbacks={self.max_rollbacks} rollbacks were used"
        return "stop", self._stop(reason)

    def _rollback(self) -> str:
        healthy = self.snapshots.healthy
        assert healthy is not None
        self.snapshots.restore()
        self._restored()
        self.n_rollbacks += 1
        setattr(self.model, ROLLBACKS_ATTRIBUTE, self.n_rollbacks)
        # At most the healthy state's learning rate (an adaptive learning rate may have raised it since), times
        # lr_decay; never above the current one, so that rollbacks to one snapshot compound
        factor = min(1.0, healthy.lr_scale / learning_rate_scale(self.model)) * self.lr_decay
        scale_learning_rate(self.model, (optimizer for _, optimizer in self.watched.optimizers), factor)
        return (
            f"Rolled back to the state of timestep {healthy.timestep} and multiplied the learning rate by "
            f"{factor:.4g} (rollback {self.n_rollbacks} of at most {self.max_rollbacks})."
        )

    def _stop(self, reason: str) -> str:
        self.stopping = True
        why = f" ({reason})" if reason else ""
        healthy = self.snapshots.healthy
        if healthy is None:
            return f"Stopping training{why}; no healthy state was recorded, so the model is left as it is."
        self.snapshots.restore()
        self._restored()
        where = "restored in memory"
        if self.save_path is not None:
            where = self._save(self.save_path)
        return f"Stopping training{why}; the last healthy model (timestep {healthy.timestep}) was {where}."

    def _restored(self) -> None:
        if self.on_restore is not None:
            self.on_restore()

    def _save(self, save_path: str) -> str:
        """Save the restored model (and VecNormalize); a failure is reported in the message, never hides the fault."""
        venv = self.watched.vec_normalize
        vec_path = vec_normalize_path(save_path)
        try:
            self.model.save(save_path)
            if venv is not None:
                assert vec_path is not None
                venv.save(vec_path)
        except OSError as error:
            return f"restored in memory; saving it to {save_path} failed ({type(error).__name__}: {error})"
        where = f"restored and saved to {save_path}"
        return where + (f" (VecNormalize to {vec_path})" if venv is not None else "")


class EndCollection:
    """
    Stands in for ``model.collect_rollouts`` (an instance attribute, removed at the end of ``learn()``) once a stop was
    decided at the start of ``learn()``: SB3's ``learn()`` then ends before its first rollout, as when ``on_step``
    returns False, without the forward pass that would use the bad value (the first observation, or a model that was
    broken before ``learn()``). Later stops need none: the next env step returns False, and the forward pass before
    it uses the restored healthy model.

    :param off_policy: whether the algorithm is off-policy (its ``collect_rollouts`` returns a ``RolloutReturn``)
    """

    def __init__(self, off_policy: bool) -> None:
        self.off_policy = off_policy

    def __call__(self, *args: Any, **kwargs: Any) -> bool | RolloutReturn:
        return RolloutReturn(0, 0, continue_training=False) if self.off_policy else False


def renormalize_step(venv: Any, new_obs: np.ndarray | dict[str, np.ndarray], rewards: np.ndarray) -> None:
    """
    Normalize a step's data again, in place, with restored statistics: the observation is the next one the policy
    acts on (and, in a recurrent policy, feeds its LSTM state), the reward goes into the rollout buffer.

    :param venv: the VecNormalize wrapper, its statistics restored by a rollback
    :param new_obs: the step's normalized observations (the ``new_obs`` local of ``collect_rollouts``)
    :param rewards: the step's normalized rewards (the ``rewards`` local)
    """
    normalized = venv.normalize_obs(venv.get_original_obs())
    if isinstance(new_obs, dict):
        for key in new_obs:
            new_obs[key][...] = normalized[key]
    else:
        new_obs[...] = normalized
    rewards[...] = venv.normalize_reward(venv.get_original_reward())
