"""
Rollout buffers that also keep the parameters of the policy that collected the rollout, for an analytic
``KL(pi_old || pi)`` (see :mod:`sb3_safe.common.kl`).

The old parameters come from the forward pass that chose the actions: a forward hook on the policy records
the distribution it built (SB3's action distributions keep the last one), and ``add`` stores it with the step.
No extra actor pass per rollout, and the parameters are those of the policy that acted even if a callback
changes the policy during collection. The acting pass is the one computed from the step's observation that chose
its actions: where the policy ran once since the last ``add`` (no callback called it), that pass is checked for
this with the whole rollout at once, when it is complete; where it ran more often, ``add`` looks for it among the
passes at once. Where the acting forward pass was not seen (a custom collection loop), the parameters of that step
are computed from the current policy, with one warning. Memory: ``2 * action_dim`` floats per sample for Gaussians, the
number of logits for discrete actions, nothing for distributions without an analytic KL (custom ones).

The squashed action is all that is needed to recompute the squashed Gaussian's log-prob exactly
(:class:`~sb3_safe.common.distributions.SquashedBoundedGaussianDistribution` never inverts a saturated tanh),
so no pre-squash action is stored.
"""

import warnings
import weakref
from collections.abc import Generator
from typing import Any, NamedTuple, cast

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
#: Observations of at most this many values per env step are checked for the acting pass once per rollout (which
#: keeps a rollout of them alive until then); larger ones (images) at each ``add``, where the policy's pass is slower
BULK_CHECK_MAX_OBS_SIZE = 4096


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


def _rows_equal(recorded: th.Tensor, stored: np.ndarray) -> np.ndarray:
    """
    Which rows (steps) of ``recorded`` equal those of ``stored``, cast as the buffer cast them when it stored them;
    NaN equals NaN (a pass on a NaN observation was still computed from it: the guard reports the NaN itself).

    :param recorded: ``(steps, n_envs, ...)`` what the passes were computed from, or chose
    :param stored: ``(steps, n_envs, ...)`` what the buffer stored at those steps
    :return: ``(steps,)`` booleans
    """
    values = recorded.detach().cpu().numpy().astype(stored.dtype, copy=False).reshape(len(stored), -1)
    stored = stored.reshape(len(stored), -1)
    if values.shape != stored.shape:
        return np.zeros(len(stored), dtype=bool)
    same = values == stored
    if stored.dtype.kind == "f":
        same |= np.isnan(values) & np.isnan(stored)
    return same.all(axis=1)


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
        #: (buffer position, the step's observation, its only pass) for the steps whose pass is yet to be checked
        self._unchecked: list[tuple[int, Any, _RecordedPass]] = []
        self._warned_recomputed = False
        super().__init__(*args, **kwargs)
        shapes = self.obs_shape.values() if isinstance(self.obs_shape, dict) else [self.obs_shape]
        self._check_in_bulk = sum(int(np.prod(shape)) for shape in shapes) <= BULK_CHECK_MAX_OBS_SIZE

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
        self._passes, self._unchecked = [], []
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
            passes, self._passes = self._passes, []
            if len(passes) == 1 and self._check_in_bulk:
                # The policy ran once since the last add, most likely to act: checked with the whole rollout (for small
                # observations a check per step costs more than the pass it checks)
                self._unchecked.append((self.pos, obs, passes[0]))
                self._set_width(passes[0].dist_params.shape[-1])
            else:
                self._store_params([self.pos], self._acting_params(passes, obs, action)[None])
        super().add(obs, action, *args, **kwargs)

    def _set_width(self, width: int) -> None:
        """Size ``old_dist_params`` for parameters of ``width`` (known at the first step)."""
        if width != self.old_dist_params.shape[-1]:
            self.old_dist_params = np.zeros((self.buffer_size, self.n_envs, width), dtype=np.float32)

    def _store_params(self, positions: list[int], params: np.ndarray) -> None:
        """:param params: ``(len(positions), n_envs, width)`` old distribution parameters of the steps at ``positions``"""
        self._set_width(params.shape[-1])
        self.old_dist_params[positions] = params

    def _check_unchecked(self) -> None:
        """
        Check the passes ``add`` took unchecked, all at once: each must have been computed from the observation the
        buffer stored at its step and have chosen the actions stored there. A step whose pass was not the acting one
        (the policy ran for something else, and the acting pass was not recorded) gets its parameters from the
        current policy.
        """
        unchecked, self._unchecked = self._unchecked, []
        if not unchecked:
            return
        positions = [position for position, _, _ in unchecked]
        passes = [recorded for _, _, recorded in unchecked]
        params = th.stack([recorded.dist_params for recorded in passes]).cpu().numpy().reshape(len(passes), self.n_envs, -1)
        acting = _rows_equal(th.stack([recorded.actions for recorded in passes]), self.actions[positions])
        # A pass that ran at all was given the observations the policy takes: dicts exactly for a dict buffer
        if isinstance(self.observations, dict):
            for key, stored in self.observations.items():
                observations = [cast(TensorDict, recorded.observation)[key] for recorded in passes]
                acting &= _rows_equal(th.stack(observations), stored[positions])
        else:
            observations = [cast(th.Tensor, recorded.observation) for recorded in passes]
            acting &= _rows_equal(th.stack(observations), self.observations[positions])
        for row in np.flatnonzero(~acting):
            params[row] = self._current_params(unchecked[row][1])
        self._store_params(positions, params)

    def compute_returns_and_advantage(self, last_values: th.Tensor, dones: np.ndarray) -> None:
        # The last step of the rollout was added: the callbacks' rollout end (and the adaptive lr) read the parameters
        self._check_unchecked()
        super().compute_returns_and_advantage(last_values, dones)

    def _acting_params(self, passes: list[_RecordedPass], obs: Any, action: np.ndarray) -> np.ndarray:
        """
        The parameters recorded by the forward pass that chose ``action`` from ``obs``, else the current policy's.

        The acting pass is the latest one computed from this observation, with these actions: a callback that runs
        the policy (on the next observation, say) in between leaves a pass on another observation, and equal actions
        alone are a coincidence that discrete actions make common.

        :param passes: the passes recorded since the last ``add``, oldest first
        :return: ``(n_envs, width)`` parameters
        """
        assert self.policy is not None
        flat_action = np.asarray(action).reshape(-1)
        for by_value in (False, True):
            for recorded in reversed(passes):
                if _observation_matches(recorded.observation, obs, by_value) and np.array_equal(
                    recorded.actions.cpu().numpy().reshape(-1), flat_action
                ):
                    return recorded.dist_params.cpu().numpy().reshape(self.n_envs, -1)
        return self._current_params(obs)

    def _current_params(self, obs: Any) -> np.ndarray:
        """
        The current policy's parameters on ``obs``, for a step whose acting pass was not recorded (warned once).

        :return: ``(n_envs, width)`` parameters
        """
        assert self.policy is not None
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
            self._check_unchecked()
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
