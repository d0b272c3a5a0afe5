"""
Running normalization of Box observations inside a safe policy (``normalize_observations=True``), what SB3's
``VecNormalize(norm_obs=True)`` does outside it, with the statistics in the policy: saved with the model, restored by
a rollback of the guard, and read by ``predict()`` wherever the model is loaded.

The statistics are fixed from one rollout to the end of the update that trains on it, so that the log-probabilities
and values a rollout stores are those the update recomputes (the first ratio of PPO is exactly 1), and the observations
a rollout collects are folded in when the next rollout starts. Until the first rollout is folded in, the statistics
are mean 0 and variance 1: the observations pass clipped to ``[-clip, clip]`` (the first rollout of observations in
raw units of 1e11 then saturates nothing beyond the clip).

A rollout step only keeps a copy of its observations; they join the pending statistics in one operation when the
rollout ends (:meth:`ObservationNormalizer.fold`, called by the policy), not one per step: a statistics update of a
few numbers is a dozen small tensor operations, which at every step cost a small network's training about a tenth of
its time.
"""

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space
from torch import nn

from sb3_safe.common.numerics import merge_moments_into

#: The least variance the observations are scaled by: a constant observation maps to zero, not to inf
MIN_VARIANCE = 1e-8
#: Normalized observations are clipped to [-CLIP, CLIP], as VecNormalize's default ``clip_obs``
CLIP = 10.0
#: The names of the normalizer's buffers: statistics of the observations in their own units, not weights
STATISTICS = ("obs_mean", "obs_var", "obs_count", "pending_mean", "pending_var", "pending_count")
#: Batches of observations kept at most before they are folded in (bounds the memory of a policy that acts for long
#: without training, e.g. in an evaluation loop that calls ``forward``)
FOLD_EVERY = 1024


def validate_normalize_observations(normalize_observations: Any, observation_space: spaces.Space | None) -> bool:
    """
    :param normalize_observations: a safe policy's ``normalize_observations`` argument
    :param observation_space: the policy's observation space
    :return: ``normalize_observations``, checked
    :raises ValueError: naming ``normalize_observations``, for a value other than True or False, or True with a space
        it cannot normalize (not a Box, or images)
    """
    if not isinstance(normalize_observations, bool | np.bool_):
        raise ValueError(f"normalize_observations must be True or False, got {normalize_observations!r}")
    if normalize_observations and (not isinstance(observation_space, spaces.Box) or is_image_space(observation_space)):
        raise ValueError(
            "normalize_observations=True needs a Box observation space that is not an image, got "
            f"{observation_space}: for Dict observations or images use VecNormalize(norm_obs=True, norm_obs_keys=...) "
            "or normalize_observations=False"
        )
    return bool(normalize_observations)


class ObservationNormalizer(nn.Module):
    """
    ``(obs - mean) / sqrt(var)``, clipped to ``[-CLIP, CLIP]``, with running float64 statistics of the observations.

    :meth:`observe` keeps observations, :meth:`fold` adds those kept to the pending statistics (also before the
    buffers are saved), :meth:`commit` folds the pending statistics into the ones :meth:`forward` uses. Non-finite
    observations are left out of the statistics (the guard names them).

    :param shape: the shape of one observation
    """

    obs_mean: th.Tensor
    obs_var: th.Tensor
    obs_count: th.Tensor
    pending_mean: th.Tensor
    pending_var: th.Tensor
    pending_count: th.Tensor

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        for prefix in ("obs", "pending"):
            self.register_buffer(f"{prefix}_mean", th.zeros(shape, dtype=th.float64))
            self.register_buffer(f"{prefix}_var", th.ones(shape, dtype=th.float64))
            self.register_buffer(f"{prefix}_count", th.zeros((), dtype=th.float64))
        #: observations observed and not yet folded into the pending statistics (float64 copies, batch first)
        self.unfolded: list[th.Tensor] = []
        # What is saved (model.save(), a checkpoint mid-rollout) includes every observation observed
        self.register_state_dict_pre_hook(_fold_before_saving)

    def forward(self, obs: th.Tensor) -> th.Tensor:
        """
        :param obs: a batch of observations, as the features extractor receives them (float)
        :return: the normalized observations, finite for any finite or infinite input, in ``obs``'s dtype
        """
        scaled = (obs.double() - self.obs_mean) / th.sqrt(self.obs_var.clamp(min=MIN_VARIANCE))
        return scaled.clamp(-CLIP, CLIP).to(obs.dtype)

    def features_extractor_pre_hook(self, module: nn.Module, args: tuple[th.Tensor, ...]) -> tuple[th.Tensor, ...]:
        """
        A forward pre-hook of a features extractor: it receives the normalized observations.

        :param module: the features extractor
        :param args: its positional arguments, the observations first
        :return: the arguments, the observations normalized
        """
        return (self(args[0]), *args[1:])

    def observe(self, obs: th.Tensor) -> None:
        """
        Keep a batch of observations for the pending statistics (a copy, detached: the caller may reuse its array, and
        no gradient reaches the statistics).

        :param obs: observations, batch first
        """
        self.unfolded.append(obs.detach().to(th.float64, copy=True).reshape(-1, *self.obs_mean.shape))
        if len(self.unfolded) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Add the observations kept by :meth:`observe` to the pending statistics, in one update."""
        if not self.unfolded:
            return
        batch = th.cat(self.unfolded)
        self.unfolded.clear()
        if not bool(th.isfinite(batch).all()):
            batch = batch[th.isfinite(batch).flatten(1).all(dim=1)]
            if len(batch) == 0:
                return
        var, mean = th.var_mean(batch, dim=0, correction=0)
        merge_moments_into((self.pending_mean, self.pending_var, self.pending_count), mean, var, float(len(batch)))

    def commit(self) -> None:
        """Fold the pending statistics (and what :meth:`observe` kept) into those :meth:`forward` uses, and start new
        pending ones."""
        self.fold()
        if self.pending_count.item() == 0:
            return
        pending = (self.pending_mean, self.pending_var, self.pending_count)
        merge_moments_into((self.obs_mean, self.obs_var, self.obs_count), *pending)
        self.pending_mean.zero_()
        self.pending_var.fill_(1.0)
        self.pending_count.zero_()


def _fold_before_saving(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    """A state-dict pre-hook (a function, so the module stays picklable): what is saved includes every observation."""
    assert isinstance(module, ObservationNormalizer)
    module.fold()
