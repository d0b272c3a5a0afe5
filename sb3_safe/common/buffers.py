"""
Rollout buffers that also keep the parameters of the policy that collected the rollout, for an analytic
``KL(pi_old || pi)`` (see :mod:`sb3_safe.common.kl`).

The old parameters come from the forward pass that chose the actions: a forward hook on the policy records
the distribution it built (SB3's action distributions keep the last one), and ``add`` stores it with the step.
No extra actor pass per rollout, and the parameters are those of the policy that acted even if a callback
changes the policy during collection. Where the acting forward pass was not seen (a callback called the
policy between the step and ``add``, or a custom collection loop), ``add`` computes the parameters from the
current policy for that step and warns once. Memory: ``2 * action_dim`` floats per sample for Gaussians, the
number of logits for discrete actions, nothing for distributions without an analytic KL (gSDE).

The squashed action is all that is needed to recompute the squashed Gaussian's log-prob exactly
(:class:`~sb3_safe.common.distributions.SquashedBoundedGaussianDistribution` never inverts a saturated tanh),
so no pre-squash action is stored.
"""

import warnings
import weakref
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

#: Forward passes kept between two ``add`` calls (the acting one and those of callbacks); older ones are dropped
_RECORDED_PASSES = 8


class _RecordedPass(NamedTuple):
    """What one forward pass of the collecting policy was computed from, and what it gave."""

    observation: th.Tensor | TensorDict
    actions: th.Tensor
    dist_params: th.Tensor


class _ActingDistributionRecorder:
    """
    Forward hook of the collecting policy: keeps the input observation, the actions and the distribution parameters
    of each pass for the buffer's next ``add``. Holds the buffer weakly (a replaced buffer must not stay alive
    through the policy); a pickled or deep-copied policy gets a recorder attached to no buffer.

    :param buffer: the buffer to record for; None: record nothing
    """

    def __init__(self, buffer: "KLRolloutBuffer | None" = None) -> None:
        self._buffer = None if buffer is None else weakref.ref(buffer)

    def __call__(self, policy: ActorCriticPolicy, inputs: Any, outputs: tuple[th.Tensor, ...]) -> None:
        buffer = None if self._buffer is None else self._buffer()
        if buffer is not None and inputs:
            passes = buffer._passes
            if len(passes) >= _RECORDED_PASSES:
                del passes[0]
            passes.append(_RecordedPass(inputs[0], outputs[0].detach(), distribution_params(policy.action_dist).detach()))

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return type(self), ()


def _is_same_memory(tensor: th.Tensor, array: np.ndarray) -> bool:
    """Whether ``tensor`` was made from ``array`` without a copy (``obs_as_tensor`` on the CPU): the same values."""
    return (
        tensor.device.type == "cpu"
        and tuple(tensor.shape) == array.shape
        and tensor.data_ptr() == array.__array_interface__["data"][0]
    )


def _observation_matches(recorded: th.Tensor | TensorDict, obs: np.ndarray | dict[str, np.ndarray], by_value: bool) -> bool:
    """Whether a pass was computed from ``obs``: by memory (cheap), or by value (a copy to the host)."""
    if isinstance(recorded, dict) or isinstance(obs, dict):
        if not (isinstance(recorded, dict) and isinstance(obs, dict)) or recorded.keys() != obs.keys():
            return False
        return all(_observation_matches(recorded[key], obs[key], by_value) for key in obs)
    array = np.asarray(obs)
    if not by_value:
        return _is_same_memory(recorded, array)
    return tuple(recorded.shape) == array.shape and np.array_equal(recorded.detach().cpu().numpy(), array)


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
        #: the policy's forward passes since the last ``add``, oldest first
        self._passes: list[_RecordedPass] = []
        self._warned_recomputed = False
        super().__init__(*args, **kwargs)

    def attach_policy(self, policy: ActorCriticPolicy) -> None:
        """
        Record the distribution of every forward pass of ``policy`` (the pass that chooses the actions).

        :param policy: the policy that collects the rollouts
        """
        self.policy = policy
        if has_analytic_kl(policy.action_dist):
            policy.register_forward_hook(_ActingDistributionRecorder(self))

    def reset(self) -> None:
        super().reset()
        self._passes = []
        width = self.old_dist_params.shape[-1] if hasattr(self, "old_dist_params") else 0
        self.old_dist_params = np.zeros((self.buffer_size, self.n_envs, width), dtype=np.float32)

    def add(self, obs: Any, action: np.ndarray, *args: Any, **kwargs: Any) -> None:
        if self.policy is None:
            raise RuntimeError(
                f"{type(self).__name__}.attach_policy(policy) must be called before collecting rollouts: an algorithm "
                "other than KLAdaptivePPO was given this buffer (a KLAdaptivePPO checkpoint saved before sb3-safe 0.2 "
                "names it: load it with KLAdaptivePPO.load, or with PPO.load(path, "
                "custom_objects={'rollout_buffer_class': None}))"
            )
        if has_analytic_kl(self.policy.action_dist):
            params = self._acting_params(obs, action)
            if params.shape[-1] != self.old_dist_params.shape[-1]:  # first step: the width is known now
                self.old_dist_params = np.zeros((self.buffer_size, self.n_envs, params.shape[-1]), dtype=np.float32)
            self.old_dist_params[self.pos] = params
        super().add(obs, action, *args, **kwargs)

    def _acting_params(self, obs: Any, action: np.ndarray) -> np.ndarray:
        """
        The parameters recorded by the forward pass that chose ``action`` from ``obs``, else the current policy's.

        The acting pass is the latest one computed from this observation, with these actions: a callback that runs
        the policy (on the next observation, say) in between leaves a pass on another observation, and equal actions
        alone are a coincidence that discrete actions make common.
        """
        assert self.policy is not None
        passes, self._passes = self._passes, []
        flat_action = np.asarray(action).reshape(-1)
        for by_value in (False, True):
            for recorded in reversed(passes):
                if _observation_matches(recorded.observation, obs, by_value) and np.array_equal(
                    recorded.actions.cpu().numpy().reshape(-1), flat_action
                ):
                    return recorded.dist_params.cpu().numpy().reshape(self.n_envs, -1)
        if not self._warned_recomputed:
            warnings.warn(
                "The forward pass that chose these actions was not recorded (a callback called the policy between "
                "the environment step and the rollout buffer's add(), or collect_rollouts does not call the policy); "
                "the old distribution parameters of such steps are computed from the current policy.",
                stacklevel=2,
            )
            self._warned_recomputed = True
        with th.no_grad():
            distribution = self.policy.get_distribution(obs_as_tensor(obs, self.device))
            return distribution_params(distribution).cpu().numpy().reshape(self.n_envs, -1)

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

    def _get_samples(  # type: ignore[override]
        self, batch_inds: np.ndarray, env: VecNormalize | None = None
    ) -> KLDictRolloutBufferSamples:
        samples = DictRolloutBuffer._get_samples(self, batch_inds, env)
        return KLDictRolloutBufferSamples(*samples, old_dist_params=self.to_torch(self.old_dist_params[batch_inds]))
