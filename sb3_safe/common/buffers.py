"""
Rollout buffers that also keep the parameters of the policy that collected the rollout, for an analytic
``KL(pi_old || pi)`` (see :mod:`sb3_safe.common.kl`).

The old parameters are computed once per rollout, when SB3 calls ``compute_returns_and_advantage`` right after
the last environment step: the policy is then still the one that acted (and in eval mode), and rollout-end
callbacks, which may change it, have not run yet. That is one batched forward pass of the actor over the
rollout, instead of one more per environment step. Memory: ``2 * action_dim`` floats per sample for Gaussians,
the number of logits for discrete actions, nothing for distributions without an analytic KL (gSDE).

The squashed action is all that is needed to recompute the squashed Gaussian's log-prob exactly
(:class:`~sb3_safe.common.distributions.SquashedBoundedGaussianDistribution` never inverts a saturated tanh),
so no pre-squash action is stored.
"""

from collections.abc import Generator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import TensorDict
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecNormalize

from sb3_safe.common.kl import distribution_params, has_analytic_kl

#: Observations per forward pass when computing the old parameters (bounds memory with image observations)
_CHUNK_SIZE = 1024


class KLRolloutBufferSamples(NamedTuple):
    observations: th.Tensor
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    #: ``(batch, width)`` parameters of the old policy; width 0 without an analytic KL
    old_dist_params: th.Tensor


class KLDictRolloutBufferSamples(NamedTuple):
    observations: TensorDict
    actions: th.Tensor
    old_values: th.Tensor
    old_log_prob: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    #: ``(batch, width)`` parameters of the old policy; width 0 without an analytic KL
    old_dist_params: th.Tensor


class KLRolloutBuffer(RolloutBuffer):
    """
    SB3's ``RolloutBuffer`` that also stores the old policy's distribution parameters.

    Takes SB3's ``RolloutBuffer`` arguments; the algorithm must call :meth:`attach_policy` before the first rollout.
    """

    old_dist_params: np.ndarray

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.policy: ActorCriticPolicy | None = None
        super().__init__(*args, **kwargs)

    def attach_policy(self, policy: ActorCriticPolicy) -> None:
        """
        :param policy: the policy that collects the rollouts
        """
        self.policy = policy

    def reset(self) -> None:
        super().reset()
        self.old_dist_params = np.zeros((self.buffer_size, self.n_envs, 0), dtype=np.float32)

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        super().compute_returns_and_advantage(last_values, dones)
        self.old_dist_params = self._compute_old_dist_params()

    def _observation_chunk(self, start: int, stop: int) -> th.Tensor | TensorDict:
        return obs_as_tensor(self.observations[start:stop].reshape(-1, *self.obs_shape), self.device)

    @th.no_grad()
    def _compute_old_dist_params(self) -> np.ndarray:
        if self.policy is None:
            raise RuntimeError(f"{type(self).__name__}.attach_policy(policy) must be called before collecting rollouts")
        if not has_analytic_kl(self.policy.action_dist):
            return np.zeros((self.buffer_size, self.n_envs, 0), dtype=np.float32)
        steps_per_chunk = max(1, _CHUNK_SIZE // self.n_envs)
        chunks = []
        for start in range(0, self.buffer_size, steps_per_chunk):
            stop = min(start + steps_per_chunk, self.buffer_size)
            distribution = self.policy.get_distribution(self._observation_chunk(start, stop))
            chunks.append(distribution_params(distribution).cpu().numpy().reshape(stop - start, self.n_envs, -1))
        return np.concatenate(chunks).astype(np.float32, copy=False)

    def get(self, batch_size: int | None = None) -> Generator[KLRolloutBufferSamples, None, None]:  # type: ignore[override]
        if not self.generator_ready:
            self.old_dist_params = self.swap_and_flatten(self.old_dist_params)
        yield from super().get(batch_size)  # type: ignore[misc]

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> KLRolloutBufferSamples:
        samples = super()._get_samples(batch_inds, env)
        return KLRolloutBufferSamples(*samples, old_dist_params=self.to_torch(self.old_dist_params[batch_inds]))


class KLDictRolloutBuffer(KLRolloutBuffer, DictRolloutBuffer):  # type: ignore[misc]  # get() yields the Dict samples
    """
    SB3's ``DictRolloutBuffer`` that also stores the old policy's distribution parameters.

    Takes SB3's ``DictRolloutBuffer`` arguments; the algorithm must call :meth:`attach_policy` before the first
    rollout.
    """

    observation_space: spaces.Dict
    obs_shape: dict[str, tuple[int, ...]]
    observations: dict[str, np.ndarray]

    def _observation_chunk(self, start: int, stop: int) -> th.Tensor | TensorDict:
        return obs_as_tensor(
            {key: obs[start:stop].reshape(-1, *self.obs_shape[key]) for key, obs in self.observations.items()}, self.device
        )

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> KLDictRolloutBufferSamples:
        samples = DictRolloutBuffer._get_samples(self, batch_inds, env)
        return KLDictRolloutBufferSamples(*samples, old_dist_params=self.to_torch(self.old_dist_params[batch_inds]))
