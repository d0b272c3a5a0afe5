"""
The exact mean ``KL(pi_old || pi)`` over a whole rollout, for any on-policy algorithm and policy: what
:class:`~sb3_safe.common.adaptive_lr.KLAdaptiveLRCallback` adapts the learning rate on.

A :class:`Rollout` holds the rollout buffer's arrays as they were collected, taken before ``train()``: SB3's
``RolloutBuffer.get()`` swaps and flattens them into new arrays, and the next rollout's ``reset()`` replaces them, so
the references keep one copy of the observations (and actions, action masks, LSTM states) in one order, on which
the old and the new distribution are compared. Nothing is copied.

The old distribution's parameters come from the buffer where it keeps them (:class:`~sb3_safe.common.buffers.
KLRolloutBuffer`: those of the pass that acted), else from one no-gradient pass before the update (with the
rollout's action masks, or its LSTM states). The KL is analytic (:func:`~sb3_safe.common.kl.analytic_kl`) for every
family of SB3, sb3-contrib and sb3-safe, gSDE and masked categoricals included; only a distribution without a closed
form (a custom one) falls back to the estimator :func:`~sb3_safe.common.kl.approx_kl` at the stored actions, from the
stored log-probabilities.
"""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.distributions import Distribution as SB3Distribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import obs_as_tensor
from torch.distributions import Distribution

from sb3_safe.common.kl import analytic_kl, approx_kl, distribution_params, has_analytic_kl

#: Samples per no-gradient pass over the rollout
BATCH_SIZE = 1024


def _flat(array: np.ndarray) -> np.ndarray:
    """``(n_steps, n_envs, ...)`` -> ``(n_steps * n_envs, ...)``: a view of a collected (contiguous) buffer array."""
    return array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])


@dataclass
class Rollout:
    """
    The arrays of one collected rollout, flat, in collection order (step-major), with what a distribution over
    them needs besides the observations.

    :param observations: ``(n, ...)`` arrays, or a dict of them
    :param actions: ``(n, action_dim)``
    :param log_probs: ``(n,)`` log-probabilities of the actions under the collecting policy
    :param old_params: ``(n, width)`` parameters of the collecting policy's distribution, if the buffer kept them
    :param action_masks: ``(n, mask_dims)`` (MaskablePPO), else None
    :param lstm_states: the actor's ``(hidden, cell)`` LSTM states before each step, ``(n_layers, n, hidden)`` each
        (RecurrentPPO), else None
    :param episode_starts: ``(n,)`` (RecurrentPPO), else None
    """

    observations: np.ndarray | dict[str, np.ndarray]
    actions: np.ndarray
    log_probs: np.ndarray
    old_params: np.ndarray | None = None
    action_masks: np.ndarray | None = None
    lstm_states: tuple[np.ndarray, np.ndarray] | None = None
    episode_starts: np.ndarray | None = None

    @classmethod
    def of(cls, buffer: RolloutBuffer) -> "Rollout":
        """
        :param buffer: a full rollout buffer, before ``train()`` reads it (``get()`` has not flattened it)
        :raises ValueError: if the buffer is not full, or was already flattened
        """
        if not buffer.full or buffer.generator_ready:
            raise ValueError("Rollout.of needs a full rollout buffer that get() has not read yet")
        observations = buffer.observations
        flat_obs = {key: _flat(value) for key, value in observations.items()} if isinstance(observations, dict) else None
        old_params = getattr(buffer, "old_dist_params", None)
        masks = getattr(buffer, "action_masks", None)
        hidden = getattr(buffer, "hidden_states_pi", None)
        lstm_states = None
        if hidden is not None:
            # (n_steps, n_layers, n_envs, hidden) -> (n_layers, n_steps * n_envs, hidden): every step a sequence of one
            lstm_states = tuple(
                np.swapaxes(states, 0, 1).reshape(states.shape[1], -1, states.shape[3])
                for states in (hidden, buffer.cell_states_pi)  # type: ignore[attr-defined]
            )
        return cls(
            observations=flat_obs if flat_obs is not None else _flat(observations),
            actions=_flat(buffer.actions),
            log_probs=buffer.log_probs.reshape(-1),
            old_params=_flat(old_params) if isinstance(old_params, np.ndarray) and old_params.shape[-1] > 0 else None,
            action_masks=_flat(masks) if isinstance(masks, np.ndarray) else None,
            lstm_states=lstm_states,
            episode_starts=buffer.episode_starts.reshape(-1) if hidden is not None else None,
        )

    def __len__(self) -> int:
        return len(self.actions)

    def batches(self, size: int = BATCH_SIZE) -> Iterator[slice]:
        """
        Consecutive slices covering the rollout.

        :param size: the length of each slice (the last may be shorter)
        """
        for start in range(0, len(self), size):
            yield slice(start, min(start + size, len(self)))


@contextlib.contextmanager
def _without_argument_validation() -> Iterator[None]:
    """
    torch's distributions validate their parameters at construction, a third of a small pass's cost; these passes
    only read the policy's outputs (a non-finite one gives a non-finite KL, which the callers treat as no
    information; the guard and the safe policies name it).
    """
    previous = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(previous)


def distribution(
    policy: ActorCriticPolicy,
    observations: th.Tensor | dict[str, th.Tensor],
    action_masks: np.ndarray | th.Tensor | None = None,
    lstm_states: tuple[th.Tensor, th.Tensor] | None = None,
    episode_starts: th.Tensor | None = None,
) -> SB3Distribution:
    """
    The policy's action distribution on a batch (with its action masks, or its LSTM states).

    :param policy: an SB3 / sb3-contrib actor-critic policy (plain, maskable or recurrent)
    :param observations: the batch, as tensors on the policy's device
    :param action_masks: MaskablePPO's masks of the batch
    :param lstm_states: RecurrentPPO's actor ``(hidden, cell)`` states before each sample
    :param episode_starts: RecurrentPPO's episode starts of the batch
    """
    if lstm_states is not None and episode_starts is not None:
        # sb3-contrib's recurrent policy: (distribution, new LSTM states)
        recurrent: Any = policy.get_distribution(observations, lstm_states, episode_starts)  # type: ignore[call-arg]
        return recurrent[0]
    if action_masks is not None:
        return policy.get_distribution(observations, action_masks=action_masks)  # type: ignore[call-arg]
    return policy.get_distribution(observations)


def _rollout_distribution(policy: ActorCriticPolicy, rollout: Rollout, batch: slice) -> SB3Distribution:
    """:func:`distribution` on a slice of the rollout."""
    device = policy.device
    if isinstance(rollout.observations, dict):
        obs: Any = {key: value[batch] for key, value in rollout.observations.items()}
    else:
        obs = rollout.observations[batch]
    lstm_states, starts = None, None
    if rollout.lstm_states is not None and rollout.episode_starts is not None:
        hidden, cell = (th.as_tensor(state[:, batch], device=device).contiguous() for state in rollout.lstm_states)
        lstm_states, starts = (hidden, cell), th.as_tensor(rollout.episode_starts[batch], device=device)
    masks = None if rollout.action_masks is None else rollout.action_masks[batch]
    return distribution(policy, obs_as_tensor(obs, device), masks, lstm_states, starts)


@th.no_grad()
def old_distribution_params(policy: ActorCriticPolicy, rollout: Rollout) -> th.Tensor | None:
    """
    The parameters of the policy's distribution over the rollout (call it before the update): the buffer's own if it
    kept them, else one no-gradient pass; None for a distribution without an analytic KL.

    :param policy: the policy, as it collected the rollout
    :param rollout: the rollout
    """
    if rollout.old_params is not None:
        return th.as_tensor(rollout.old_params, device=policy.device)
    if not has_analytic_kl(policy.action_dist):
        return None
    with _without_argument_validation():
        return th.cat([distribution_params(_rollout_distribution(policy, rollout, batch)) for batch in rollout.batches()])


def summed_kl(
    policy: ActorCriticPolicy,
    new: SB3Distribution,
    old_params: th.Tensor | None,
    actions: th.Tensor | np.ndarray,
    old_log_prob: th.Tensor | np.ndarray,
) -> float:
    """
    The sum over a batch of ``KL(pi_old || pi)``: analytic from the old parameters, else (None, or a family without a
    closed form) the estimator at the stored actions.

    :param policy: the policy (its action space says how actions are stored)
    :param new: the current distribution on the batch
    :param old_params: the old distribution's parameters on the batch, or None
    :param actions: the actions taken
    :param old_log_prob: their log-probabilities under the old policy
    """
    if old_params is not None and has_analytic_kl(new):
        return analytic_kl(old_params, new).sum().item()
    actions = th.as_tensor(actions, device=policy.device)
    if isinstance(policy.action_space, spaces.Discrete):
        actions = actions.long().flatten()
    log_ratio = new.log_prob(actions) - th.as_tensor(old_log_prob, device=policy.device).flatten()
    return approx_kl(log_ratio).sum().item()


@th.no_grad()
def mean_kl(policy: ActorCriticPolicy, rollout: Rollout, old_params: th.Tensor | None) -> float:
    """
    Mean ``KL(pi_old || pi)`` over the rollout, for the policy as it is now.

    :param policy: the updated policy
    :param rollout: the rollout the update was computed on
    :param old_params: :func:`old_distribution_params` before the update; None: the estimator at the stored actions
    """
    total = 0.0
    with _without_argument_validation():
        for batch in rollout.batches():
            new = _rollout_distribution(policy, rollout, batch)
            old = None if old_params is None else old_params[batch]
            total += summed_kl(policy, new, old, rollout.actions[batch], rollout.log_probs[batch])
    return total / len(rollout)


@th.no_grad()
def mean_kl_on_batch(policy: ActorCriticPolicy, batch: Any, old_params: th.Tensor | None) -> float:
    """
    Mean ``KL(pi_old || pi)`` on one of the rollout buffer's sample batches (what ``get()`` yielded to ``train()``).

    :param policy: the updated policy
    :param batch: SB3's ``RolloutBufferSamples`` (or the maskable / dict variants)
    :param old_params: the old distribution's parameters on the batch, or None for the estimator
    """
    with _without_argument_validation():
        new = distribution(policy, batch.observations, getattr(batch, "action_masks", None))
        return summed_kl(policy, new, old_params, batch.actions, batch.old_log_prob) / len(batch.actions)
