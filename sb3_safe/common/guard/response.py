"""
The response policy: what the guard does about a located fault (raise, stop or roll back), and doing it.
"""

from typing import Any, Literal, get_args

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_safe.common.guard.locate import MODEL, NORMALIZATION
from sb3_safe.common.guard.snapshot import SnapshotStore
from sb3_safe.common.guard.watch import WatchedModel
from sb3_safe.common.schedules import scale_learning_rate

#: What the guard does on a non-finite value
OnNonFinite = Literal["raise", "stop", "rollback"]
ON_NONFINITE_MODES: tuple[OnNonFinite, ...] = get_args(OnNonFinite)
#: Model attribute counting the guard's rollbacks; saved with the model, so max_rollbacks holds across resumed runs
ROLLBACKS_ATTRIBUTE = "nonfinite_guard_rollbacks"
#: The sources a restored snapshot repairs
RESTORABLE = (MODEL, NORMALIZATION)


def check_settings(on_nonfinite: str, lr_decay: float, max_rollbacks: int) -> None:
    """
    Raise a ``ValueError`` naming the first bad setting of the response.

    :param on_nonfinite: one of :data:`ON_NONFINITE_MODES`
    :param lr_decay: factor in (0, 1)
    :param max_rollbacks: >= 0
    """
    if on_nonfinite not in ON_NONFINITE_MODES:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE_MODES}, got {on_nonfinite!r}")
    if not 0.0 < lr_decay < 1.0:
        raise ValueError(f"lr_decay must be in (0, 1), got {lr_decay!r}")
    if max_rollbacks < 0:
        raise ValueError(f"max_rollbacks must be >= 0, got {max_rollbacks!r}")


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
    ) -> None:
        self.model = model
        self.watched = watched
        self.snapshots = snapshots
        self.on_nonfinite = on_nonfinite
        self.lr_decay = lr_decay
        self.max_rollbacks = max_rollbacks
        self.save_path = save_path
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
        if self.on_nonfinite == "rollback" and source not in RESTORABLE:
            reason = "rollback cannot repair this data"
        elif self.on_nonfinite == "rollback" and has_healthy:
            reason = f"all max_rollbacks={self.max_rollbacks} rollbacks were used"
        return "stop", self._stop(reason)

    def _rollback(self) -> str:
        healthy = self.snapshots.healthy
        assert healthy is not None
        self.snapshots.restore()
        self.n_rollbacks += 1
        setattr(self.model, ROLLBACKS_ATTRIBUTE, self.n_rollbacks)
        scale_learning_rate(self.model, (optimizer for _, optimizer in self.watched.optimizers), self.lr_decay)
        return (
            f"Rolled back to the state of timestep {healthy.timestep} and multiplied the learning rate by "
            f"{self.lr_decay} (rollback {self.n_rollbacks} of at most {self.max_rollbacks})."
        )

    def _stop(self, reason: str) -> str:
        self.stopping = True
        why = f" ({reason})" if reason else ""
        healthy = self.snapshots.healthy
        if healthy is None:
            return f"Stopping training{why}; no healthy state was recorded, so the model is left as it is."
        self.snapshots.restore()
        where = "restored in memory"
        if self.save_path is not None:
            self.model.save(self.save_path)
            where = f"restored and saved to {self.save_path}"
            venv = self.watched.vec_normalize
            if venv is not None:
                vec_path = vec_normalize_path(self.save_path)
                assert vec_path is not None
                venv.save(vec_path)
                where += f" (VecNormalize to {vec_path})"
        return f"Stopping training{why}; the last healthy model (timestep {healthy.timestep}) was {where}."


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
