"""
The fault locator: once a cheap check failed, which tensors hold NaN / inf, and where they came from.

Where a non-finite value came from decides what can be done about it. Only the model state (parameters, optimizer
state, gradients) and the normalization statistics can be repaired by restoring a snapshot; data from the
environment, or collected with a policy that already misbehaved, cannot.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch as th

from sb3_safe.common.guard.snapshot import Snapshot
from sb3_safe.common.guard.watch import Observation, WatchedModel
from sb3_safe.common.numerics import NonFiniteTensor, find_nonfinite

#: The sources of a non-finite value, and of a stall (training that runs but no longer learns)
MODEL, NORMALIZATION, ENVIRONMENT, ROLLOUT, STALL = "model", "normalization", "environment", "rollout", "stall"


class Fault(NamedTuple):
    """
    Non-finite values found by a check.

    :param source: :data:`MODEL`, :data:`NORMALIZATION`, :data:`ENVIRONMENT`, :data:`ROLLOUT` or :data:`STALL`
    :param phase: when in the training loop, e.g. ``optimizer step of policy.optimizer in train()``
    :param nonfinite: the non-finite tensors, most likely cause first
    """

    source: str
    phase: str
    nonfinite: list[NonFiniteTensor]


def _per_env(name: str, data: Observation) -> list[tuple[str, np.ndarray]]:
    """Split batched env data into one named entry per env (and per key for dict observations)."""
    if isinstance(data, dict):
        return [entry for key, value in data.items() for entry in _per_env(f"{name}[{key!r}]", value)]
    return [(f"{name} of env {i}", np.asarray(data[i])) for i in range(len(data))]


def _named_observation(name: str, observation: np.ndarray | dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """One env's observation, named (one entry per key of a dict observation)."""
    if isinstance(observation, dict):
        return [(f"{name}[{key!r}]", np.asarray(value)) for key, value in observation.items()]
    return [(name, np.asarray(observation))]


class FaultLocator:
    """
    The slow path of each check of :class:`~sb3_safe.common.guard.watch.WatchedModel`: name the bad tensors, with
    exact counts, and tell their source.

    :param watched: what the guard watches
    """

    def __init__(self, watched: WatchedModel) -> None:
        self.watched = watched

    def in_optimizer(self, optimizer: th.optim.Optimizer, phase: str) -> Fault:
        """
        Gradients first, then optimizer state, then parameters: the order in which a NaN spreads.

        :param optimizer: the optimizer whose step (or gradients) failed the check
        :param phase: e.g. ``optimizer step of policy.optimizer in train()``
        """
        params = self.watched.parameters(optimizer)
        named_params = [(self.watched.name_of(p), p) for p in params]
        grads = [(f"gradient of {name}", p.grad) for name, p in named_params if p.grad is not None]
        states = self.watched.optimizer_state(self.watched.optimizer_name(optimizer), optimizer, params)
        return Fault(MODEL, phase, find_nonfinite(grads + states + named_params))

    def in_copy(self, snapshot: Snapshot, phase: str) -> Fault:
        """
        :param snapshot: a copy of the model state that failed the full check
        :param phase: e.g. ``after train() (n_updates=3)``
        """
        return Fault(MODEL, phase, snapshot.flat.find_nonfinite())

    def in_live_model(self, phase: str) -> Fault:
        """
        Name what failed :meth:`~sb3_safe.common.guard.watch.WatchedModel.model_is_finite`: a parameter, buffer or
        torch variable changed outside an optimizer step (by a callback or user code between updates).

        :param phase: e.g. ``at the start of a rollout``
        """
        return Fault(MODEL, phase, find_nonfinite(self.watched.live_tensors()))

    def in_first_observation(self, observation: Observation) -> Fault:
        """
        :param observation: the observation ``learn()`` starts from (``model._last_obs``), which failed its check
        """
        venv = self.watched.vec_normalize
        raw = observation if venv is None else venv.get_original_obs()
        phase = "first observation of learn() (from env.reset())"
        from_env = find_nonfinite(_per_env("observation", raw))
        if from_env or venv is None:
            # VecNormalize.reset() has already updated its statistics with it
            return Fault(ENVIRONMENT, phase, from_env + (self._vec_normalize() if venv is not None else []))
        return Fault(
            NORMALIZATION, phase, self._vec_normalize() + find_nonfinite(_per_env("normalized observation", observation))
        )

    def in_vec_normalize(self, phase: str) -> Fault:
        """:param phase: e.g. ``after train() (n_updates=3)``"""
        return Fault(NORMALIZATION, phase, self._vec_normalize())

    def in_rollout_buffer(self, buffer: Any) -> Fault:
        """:param buffer: an on-policy rollout buffer that failed the end-of-rollout check"""
        named = self.watched.rollout_buffer_arrays(buffer)
        return Fault(ROLLOUT, "end of rollout (returns and advantages computed)", find_nonfinite(named))

    def in_step(
        self,
        new_obs: Observation,
        rewards: np.ndarray,
        actions: np.ndarray,
        terminal: Sequence[tuple[int, Observation]] = (),
    ) -> Fault:
        """
        Name the bad env data of a step, telling the environment's own output from the policy's actions and from
        normalization.

        :param new_obs: the (normalized) observations the step returned
        :param rewards: the (normalized) rewards
        :param actions: the actions sent to the env
        :param terminal: (env index, final observation) of the episodes that ended at this step
        """
        venv = self.watched.vec_normalize
        if venv is not None:
            raw_obs, raw_rewards = venv.get_original_obs(), venv.get_original_reward()
        else:
            raw_obs, raw_rewards = new_obs, rewards
        # VecNormalize keeps no original of a terminal observation; a NaN survives its normalization (inf is clipped)
        final = [entry for i, obs in terminal for entry in _named_observation(f"terminal observation of env {i}", obs)]
        from_env = find_nonfinite(_per_env("observation", raw_obs) + _per_env("reward", raw_rewards) + final)
        if from_env:
            if venv is not None:
                from_env += self._vec_normalize()
            return Fault(ENVIRONMENT, "env step", from_env)
        from_policy = find_nonfinite(_per_env("action", actions))
        if from_policy:
            return Fault(ROLLOUT, "env step (action sampled by the policy)", from_policy)
        # The environment's output and the actions are finite: the normalization statistics, or the data they made, are not
        named = _per_env("normalized observation", new_obs)
        normalized = find_nonfinite(named + _per_env("normalized reward", rewards))
        return Fault(NORMALIZATION, "env step", self._vec_normalize() + normalized)

    def _vec_normalize(self) -> list[NonFiniteTensor]:
        return find_nonfinite(self.watched.vec_normalize_arrays())
