"""
The snapshot: a copy of the model state, taken by a passed full check, that a stop or a rollback restores.

Capturing and restoring live here; *when* the guard checks and commits a snapshot is decided elsewhere
(:mod:`sb3_safe.common.guard.cadence` and the callback).
"""

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.running_mean_std import RunningMeanStd

from sb3_safe.common.guard.watch import WatchedModel
from sb3_safe.common.numerics import FlatCopy
from sb3_safe.common.schedules import apply_learning_rate, learning_rate_scale

#: What counts the updates a state has seen: restored with it, so that the counts describe the kept updates
COUNTERS = ("_n_updates",)


def _copy_obs_rms(obs_rms: RunningMeanStd | dict[str, RunningMeanStd]) -> RunningMeanStd | dict[str, RunningMeanStd]:
    if isinstance(obs_rms, dict):
        return {key: rms.copy() for key, rms in obs_rms.items()}
    return obs_rms.copy()


@dataclass
class Snapshot:
    """
    A copy of the model state: the tensors (one flat copy, which is also what the full check tests), and what is
    not a tensor, filled in by :meth:`capture` once the copy passed.

    :param flat: the copy of every tensor ``model.save()`` stores
    :param signature: the :meth:`~sb3_safe.common.guard.watch.WatchedModel.signature` the copy was laid out for
    """

    flat: FlatCopy
    signature: tuple[tuple[int, int], ...]
    optimizer_states: list[dict[th.Tensor, dict[str, Any]]] = field(default_factory=list)
    param_groups: list[list[dict[str, Any]]] = field(default_factory=list)
    vec_normalize: tuple[Any, RunningMeanStd, np.ndarray] | None = None
    timestep: int = 0
    grad_norm: float | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    #: the learning-rate schedule's scale (see :mod:`sb3_safe.common.schedules`) when the snapshot was taken
    lr_scale: float = 1.0

    def capture(self, model: BaseAlgorithm, watched: WatchedModel, restorable: bool = True, lean: bool = False) -> None:
        """
        Complete a snapshot whose tensors were just copied: what is not a tensor, and statistics.

        :param model: the algorithm
        :param watched: what the guard watches in it
        :param restorable: False to keep only the statistics an error message needs (the snapshot is never restored)
        :param lean: only what an update (``train()``) changes, for undoing one: no statistics, no VecNormalize
        """
        self.timestep = model.num_timesteps
        if not lean:
            self.grad_norm = watched.gradient_norm()
        if not restorable:
            return
        self.lr_scale = learning_rate_scale(model)
        self.optimizer_states = [
            {param: dict(state) for param, state in optimizer.state.items()} for _, optimizer in watched.optimizers
        ]
        self.param_groups = [
            [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
            for _, optimizer in watched.optimizers
        ]
        venv = watched.vec_normalize
        if venv is not None and not lean:
            self.vec_normalize = (_copy_obs_rms(venv.obs_rms), venv.ret_rms.copy(), venv.returns.copy())
        names = [*getattr(model, "rollback_attributes", ()), *(name for name in COUNTERS if hasattr(model, name))]
        self.attributes = {name: copy.deepcopy(getattr(model, name)) for name in names}

    def restore(self, model: BaseAlgorithm, watched: WatchedModel) -> None:
        """
        Write the snapshot back into the live model, its optimizers, VecNormalize and ``rollback_attributes``.

        :param model: the algorithm
        :param watched: what the guard watches in it
        """
        self.flat.restore()
        for normalizer in watched.observation_normalizers:
            normalizer.restored()
        saved = zip(watched.optimizers, self.optimizer_states, self.param_groups, strict=True)
        for (_, optimizer), states, groups in saved:
            # State entries created after the snapshot are dropped: the optimizer re-creates them lazily
            optimizer.state.clear()
            for param, state in states.items():
                # Its tensors are the live ones, which the flat copy just restored
                optimizer.state[param] = dict(state)
            for group, hyperparameters in zip(optimizer.param_groups, groups, strict=True):
                # Not the learning rate: the schedule's scale owns it (set below), a rollback or a redo changes it
                group.update({key: value for key, value in hyperparameters.items() if key != "lr"})
            # Gradients of the failed step must not leak into the next one
            optimizer.zero_grad(set_to_none=True)
        if self.vec_normalize is not None:
            obs_rms, ret_rms, returns = self.vec_normalize
            watched.vec_normalize.obs_rms = _copy_obs_rms(obs_rms)
            watched.vec_normalize.ret_rms = ret_rms.copy()
            watched.vec_normalize.returns = returns.copy()
        for name, value in self.attributes.items():
            setattr(model, name, copy.deepcopy(value))
        apply_learning_rate(model, [optimizer for _, optimizer in watched.optimizers])

    def statistics(self, watched: WatchedModel) -> dict[str, Any]:
        """
        What the snapshot says about the state it copied: timestep, largest |param| and its name, last gradient norm,
        log-std range (where the policy has one).

        :param watched: what the guard watches (for the names of parameters and log-stds)
        """
        stats: dict[str, Any] = {"timestep": self.timestep}
        largest = self.flat.largest(set(watched.param_names.values()))
        if largest is not None:
            stats["largest_abs_param_name"], stats["largest_abs_param"] = largest
        stats["grad_norm"] = self.grad_norm
        log_stds = [self.flat.get(name) for name in watched.log_std_names]
        values = [t for t in log_stds if t is not None]
        if values:
            stats["log_std_min"] = min(t.min().item() for t in values)
            stats["log_std_max"] = max(t.max().item() for t in values)
        return stats


class SnapshotStore:
    """
    The last healthy snapshot, and a spare one that the next full check copies into: two buffers, swapped at each
    passed check, so a check allocates nothing unless the set of tensors changed.

    :param model: the algorithm
    :param watched: what the guard watches in it
    :param restorable: False when no snapshot will ever be restored (``on_nonfinite="raise"``): each keeps only
        the tensors and the statistics an error message needs
    :param lean: snapshots of only what an update changes (see :meth:`Snapshot.capture`)
    """

    def __init__(self, model: BaseAlgorithm, watched: WatchedModel, restorable: bool, lean: bool = False) -> None:
        self.model = model
        self.watched = watched
        self.restorable = restorable
        self.lean = lean
        #: the snapshot of the last passed full check, or None before the first
        self.healthy: Snapshot | None = None
        self._spare: Snapshot | None = None

    def copy_and_test(self) -> tuple[Snapshot, bool]:
        """
        Copy the live tensors into the spare snapshot and test the copy (the full check of the model state).

        :return: the spare snapshot, to :meth:`commit` if the rest of the check passes, and whether it is all finite
        """
        for normalizer in self.watched.observation_normalizers:
            # Observations kept outside the normalizer's tensors join them, so that the copy holds every one
            normalizer.fold()
        signature = self.watched.signature()
        if self._spare is None or self._spare.signature != signature:
            self._spare = Snapshot(FlatCopy(self.watched.state_tensors()), signature)
        return self._spare, self._spare.flat.update()

    def commit(self, snapshot: Snapshot) -> None:
        """
        Make a copy that passed the check the healthy snapshot; the previous one becomes the spare.

        :param snapshot: the snapshot :meth:`copy_and_test` returned
        """
        snapshot.capture(self.model, self.watched, self.restorable, self.lean)
        self._spare, self.healthy = self.healthy, snapshot

    def restore(self) -> None:
        """Restore the healthy snapshot, if there is one."""
        if self.healthy is None:
            return
        self.healthy.restore(self.model, self.watched)
        # The spare copy may point at optimizer-state tensors that were just dropped
        self._spare = None

    def healthy_statistics(self) -> dict[str, Any]:
        """:meth:`Snapshot.statistics` of the healthy snapshot; {} if there is none."""
        return {} if self.healthy is None else self.healthy.statistics(self.watched)
