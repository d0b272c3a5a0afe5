"""
Running normalization of Box observations inside a safe policy (``normalize_observations=True``), what SB3's
``VecNormalize(norm_obs=True)`` does outside it, with the statistics in the policy: saved with the model, restored by
a rollback of the guard, and read by ``predict()`` wherever the model is loaded. Opt-in in the drop-in policies (their
default is SB3's computation, as is SafeA2C's), the default (``"auto"``) of KLAdaptivePPO, which sees its env.

The statistics take the observations of the rollouts only, never those of a ``forward`` call outside one, of
``predict``, evaluation or export. They are fixed from one rollout to the end of the update that trains on it, so that
the log-probabilities and values a rollout stores are those the update recomputes (the first ratio of PPO is exactly
1); the observations a rollout collects are folded in when the next rollout starts. Until then the statistics are mean
0 and variance 1: the observations pass clipped to ``[-clip, clip]``. A non-finite observation is never clipped
into a plausible value silently: a rollout's are named when the rollout ends (where the guard, if on, named it at
its step), any other reaches the network as NaN, whose output check names it, as without normalization.

A rollout step only copies its observations into a kept block; they join the pending statistics in one operation when
the rollout ends (:meth:`ObservationNormalizer.fold`, called by the policy), not one per step: a statistics update of a
few numbers is a handful of small tensor operations, which at every step cost a small network's training about a
tenth of its time. For the same reason :meth:`ObservationNormalizer.forward` reads a float32 shift and scale computed
once per change of the statistics.
"""

import math
import warnings
from typing import Any, Literal, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.vec_env import VecEnv, unwrap_vec_normalize
from torch import nn

from sb3_safe.common.numerics import DerivedOnChange, NonFiniteError, describe_nonfinite, is_finite, merge_moments_into

#: The least variance the observations are scaled by: a constant observation maps to zero, not to inf
MIN_VARIANCE = 1e-8
#: Normalized observations are clipped to [-CLIP, CLIP], as VecNormalize's default ``clip_obs``
CLIP = 10.0
#: The names of the normalizer's buffers: statistics of the observations in their own units, not weights
STATISTICS = ("obs_mean", "obs_var", "obs_count", "pending_mean", "pending_var", "pending_count")
#: Observation elements kept at most before they are folded in (4 MiB of float64: bounds the memory of a policy that
#: acts for long without training, e.g. in an evaluation loop that calls ``forward``)
KEPT_ELEMENTS = 2**19
#: The largest standard deviation normalized in float32: beyond it the float32 scale would lose precision (subnormal)
#: and ``obs - mean`` could overflow; wider statistics are applied in float64
FLOAT32_STD_LIMIT = 1e30


#: A safe policy's ``normalize_observations`` setting: True, False, or ``"auto"`` (decided from the observation space)
NormalizeObservations = bool | Literal["auto"]


def normalizable(observation_space: spaces.Space | None) -> bool:
    """
    :param observation_space: a policy's observation space
    :return: whether :class:`ObservationNormalizer` can normalize it: a Box that is not an image (of 3 dimensions,
        whatever its dtype: float images too, which a CNN reads whole, not per pixel)
    """
    return isinstance(observation_space, spaces.Box) and not is_image_space(observation_space, normalized_image=True)


def validate_normalize_observations(normalize_observations: Any, observation_space: spaces.Space | None) -> bool:
    """
    :param normalize_observations: a safe policy's ``normalize_observations`` argument
    :param observation_space: the policy's observation space
    :return: whether the policy normalizes its observations: ``normalize_observations``, checked; ``"auto"``: where
        the space is a Box that is not an image
    :raises ValueError: naming ``normalize_observations``, for a value other than True, False or ``"auto"``, or True
        with a space it cannot normalize (not a Box, or images)
    """
    if isinstance(normalize_observations, str) and normalize_observations == "auto":
        return normalizable(observation_space)
    if not isinstance(normalize_observations, bool | np.bool_):
        raise ValueError(f"normalize_observations must be True, False or 'auto', got {normalize_observations!r}")
    if normalize_observations and not normalizable(observation_space):
        raise ValueError(
            "normalize_observations=True needs a Box observation space that is not an image, got "
            f"{observation_space}: for Dict observations or images use VecNormalize(norm_obs=True, norm_obs_keys=...) "
            "or normalize_observations=False"
        )
    return bool(normalize_observations)


def observations_normalized(env: VecEnv | None) -> bool:
    """
    :param env: an environment (None: none yet)
    :return: whether some wrapper of ``env`` is a ``VecNormalize`` with ``norm_obs=True``
    """
    vec_normalize = unwrap_vec_normalize(env) if env is not None else None
    return vec_normalize is not None and vec_normalize.norm_obs


def decide_normalize_observations(
    policy_class: type, policy_kwargs: dict[str, Any], env: VecEnv | None, default: NormalizeObservations
) -> dict[str, Any]:
    """
    A safe algorithm's ``policy_kwargs`` with ``normalize_observations`` decided: the algorithm's ``default`` where
    left out, and ``"auto"`` decided False where ``env`` normalizes the observations already
    (``VecNormalize(norm_obs=True)``): a second normalization of normalized observations only costs time. Otherwise
    left to the policy, which decides from its observation space. Called when the algorithm sets up its model,
    ``load()`` included: a checkpoint keeps what it saved decided, and the policy's ``load_state_dict`` matches the
    normalizer to the saved state either way.

    :param policy_class: the algorithm's policy class (a policy without the keyword is left alone)
    :param policy_kwargs: the algorithm's ``policy_kwargs`` (not modified)
    :param env: the algorithm's environment
    :param default: the algorithm's default setting
    """
    if "normalize_observations" not in getattr(policy_class, "safe_keywords", ()):
        return policy_kwargs
    setting = policy_kwargs.get("normalize_observations", default)
    auto = isinstance(setting, str) and setting == "auto"
    decided = False if auto and observations_normalized(env) else setting
    return {**policy_kwargs, "normalize_observations": decided}


def warn_if_normalized_twice(policy: Any, env: VecEnv | None) -> bool:
    """
    Warn, once per policy, where a policy that normalizes its observations runs in an env whose ``VecNormalize``
    normalizes them already (``norm_obs=True``): the second normalization changes what the policy sees and costs time.
    Called where sb3-safe sees the env: its algorithms' set-up, its callbacks at the start of training, the zoo command.

    :param policy: the model's policy
    :param env: the model's environment
    :return: whether the observations are normalized twice
    """
    twice = bool(getattr(policy, "normalize_observations", False)) and observations_normalized(env)
    if twice and not getattr(policy, "_normalized_twice_named", False):
        policy._normalized_twice_named = True
        warnings.warn(
            f"{type(policy).__name__} normalizes its observations (normalize_observations=True) and the env's "
            "VecNormalize(norm_obs=True) normalizes them already: they are normalized twice. Pass "
            "policy_kwargs=dict(normalize_observations=False), or VecNormalize(norm_obs=False)",
            stacklevel=2,
        )
    return twice


class ObservationNormalizer(nn.Module):
    """
    ``(obs - mean) / sqrt(var)``, clipped to ``[-CLIP, CLIP]``, with running float64 statistics of the observations.

    :meth:`observe` keeps observations, :meth:`fold` adds those kept to the pending statistics, :meth:`commit` folds
    the pending statistics into the ones :meth:`forward` uses (the policy decides when: a rollout's observations,
    nothing else). What is saved is the statistics and the pending ones, not the observations kept and not yet
    folded. Non-finite observations never enter the statistics: :meth:`fold` names them, and outside a rollout
    :meth:`forward` passes them on as NaN, which the policy's output check names.

    :param shape: the shape of one observation
    """

    obs_mean: th.Tensor
    obs_var: th.Tensor
    obs_count: th.Tensor
    pending_mean: th.Tensor
    pending_var: th.Tensor
    pending_count: th.Tensor
    #: whether :meth:`forward` receives observations normalized already (an update's rollout, normalized once by
    #: :class:`~sb3_safe.common.normalized_rollout.NormalizedRollout`) and passes them on unchanged. A class attribute:
    #: a normalizer pickled before it has none
    passthrough = False

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        for prefix in ("obs", "pending"):
            self.register_buffer(f"{prefix}_mean", th.zeros(shape, dtype=th.float64))
            self.register_buffer(f"{prefix}_var", th.ones(shape, dtype=th.float64))
            self.register_buffer(f"{prefix}_count", th.zeros((), dtype=th.float64))
        self.shape = shape
        #: what forward applies: the float32 shift and scale (or the float64 std), and which of them
        self._shift_and_scale = DerivedOnChange(_shift_and_scale)
        #: observations observed and not yet folded into the pending statistics
        self.kept = KeptRows(shape)
        #: whether the observations :meth:`forward` receives are observed too (a rollout): a non-finite one is then
        #: named by :meth:`fold`, once per rollout, instead of by an operation more at every call
        self.observing = False
        #: whether the pending statistics are to be committed at the next observation (a rollout's first step)
        self.commit_due = False

    def forward(self, obs: th.Tensor) -> th.Tensor:
        """
        :param obs: a batch of observations, as the features extractor receives them (float)
        :return: :meth:`normalize` of them; unchanged while :attr:`passthrough`
        """
        return obs if self.passthrough else self.normalize(obs)

    def normalize(self, obs: th.Tensor) -> th.Tensor:
        """
        :param obs: a batch of observations (float)
        :return: the normalized observations, finite for any finite input and NaN where the input is not (except while
            :attr:`observing`: then clipped, and :meth:`fold` names them), in ``obs``'s dtype. For float32
            observations computed in float32 from the float64 statistics: a rounding of the mean of at most half a unit
            of the observations' own last place
        """
        derived = self.shift_and_scale()
        if obs.dtype == th.float32 and not derived.in_float64:
            normalized = obs.sub(derived.shift).mul_(derived.scale).clamp_(-CLIP, CLIP)
        else:
            normalized = ((obs.double() - self.obs_mean) / derived.std).clamp_(-CLIP, CLIP).to(obs.dtype)
        if self.observing:
            return normalized  # a rollout's observations: fold() checks them, once per rollout
        # The clip would turn an inf into a plausible 10: adding 0 * obs makes it NaN again, which the network's
        # output check names
        return normalized.add_(obs, alpha=0)

    def shift_and_scale(self) -> "_ShiftAndScale":
        """What :meth:`normalize` applies, derived once per change of the statistics (the same object until then)."""
        return self._shift_and_scale.get(self.obs_mean, self.obs_var)

    def features_extractor_pre_hook(self, module: nn.Module, args: tuple[th.Tensor, ...]) -> tuple[th.Tensor, ...]:
        """
        A forward pre-hook of a features extractor: it receives the normalized observations.

        :param module: the features extractor
        :param args: its positional arguments, the observations first
        :return: the arguments, the observations normalized
        """
        return (self.forward(args[0]), *args[1:])

    def observe(self, obs: th.Tensor) -> None:
        """
        Keep a batch of observations for the pending statistics (a copy, detached: the caller may reuse its array, and
        no gradient reaches the statistics).

        :param obs: observations, batch first
        """
        # Each operation counts at every step: the batch is reshaped only where it is not rows of one observation
        # already, detached only where it holds a gradient (a rollout's do not)
        rows = obs if obs.shape[1:] == self.shape else obs.reshape(-1, *self.shape)
        if rows.requires_grad:
            rows = rows.detach()
        if not self.kept.has_room_for(rows):
            self.fold()
        self.kept.add(rows)

    def fold(self) -> None:
        """
        Add the observations kept by :meth:`observe` to the pending statistics, in one update.

        :raises NonFiniteError: naming the observations, where a kept one holds NaN or inf (the statistics unchanged)
        """
        batch = self.kept.take()
        if batch is None:
            return
        if not is_finite(batch):
            bad_rows = (~th.isfinite(batch)).flatten(1).any(dim=1).nonzero().flatten()
            raise NonFiniteError(
                f"{describe_nonfinite('observations of the rollout', batch)}, in {bad_rows.numel()} of {len(batch)} "
                f"observed rows (the first: row {bad_rows[0].item()}, counted from the rollout's start, all envs of "
                "a step in a row): the environment returned them, and normalize_observations clipped them while "
                "acting. NonFiniteGuardCallback checks every observation at its step and names the env"
            )
        var, mean = th.var_mean(batch, dim=0, correction=0)
        merge_moments_into((self.pending_mean, self.pending_var, self.pending_count), mean, var, float(batch.shape[0]))

    def restored(self) -> None:
        """
        Statistics restored (a rollback of the guard, an undone update): forget the observations kept and not folded in
        (they belong to the steps undone), and, in a rollout, commit the restored pending statistics at its next step,
        as at its first.
        """
        self.kept.take()
        self.commit_due = self.observing

    def commit(self) -> None:
        """Fold the pending statistics (and what :meth:`observe` kept) into those :meth:`forward` uses, and start new
        pending ones."""
        self.fold()
        pending_count = self.pending_count.item()
        if pending_count == 0:
            return
        merge_moments_into((self.obs_mean, self.obs_var, self.obs_count), self.pending_mean, self.pending_var, pending_count)
        self.pending_mean.zero_()
        self.pending_var.fill_(1.0)
        self.pending_count.zero_()


class KeptRows:
    """
    Observation rows copied into one float64 block, allocated once: a step costs one copy and no allocation (a plain
    object, not a module: its counter changes at every step, and a module's attribute assignment is slow).

    :param shape: the shape of one observation
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        #: rows a block holds, unless one batch is larger
        self.capacity = max(1, KEPT_ELEMENTS // max(1, math.prod(shape)))
        self.block: th.Tensor | None = None
        #: how many rows of the block are kept
        self.count = 0

    def has_room_for(self, rows: th.Tensor) -> bool:
        """
        :param rows: a batch of observations, batch first
        :return: whether :meth:`add` can copy them into the current block
        """
        block = self.block
        return block is not None and block.device == rows.device and self.count + rows.shape[0] <= block.shape[0]

    def add(self, rows: th.Tensor) -> None:
        """
        Copy rows in: where there is no room, a new block (a larger one for a larger batch) replaces the current one,
        which must then be empty.

        :param rows: a batch of observations, batch first
        """
        if not self.has_room_for(rows):
            assert self.count == 0, "take() the kept rows before adding rows without room"
            rows_held = max(self.capacity, rows.shape[0])
            self.block = th.empty((rows_held, *self.shape), dtype=th.float64, device=rows.device)
        assert self.block is not None
        self.block[self.count : self.count + rows.shape[0]].copy_(rows)
        self.count += rows.shape[0]

    def take(self) -> th.Tensor | None:
        """
        Hand over the kept rows: none are kept after.

        :return: the kept rows (a view of the block, valid until the next :meth:`add`), None if none
        """
        if self.block is None or self.count == 0:
            return None
        rows = self.block[: self.count]
        self.count = 0
        return rows


class _ShiftAndScale(NamedTuple):
    shift: th.Tensor
    scale: th.Tensor
    #: the statistics' std, for the float64 formula
    std: th.Tensor
    in_float64: bool


def _shift_and_scale(mean: th.Tensor, var: th.Tensor) -> _ShiftAndScale:
    std = th.sqrt(var.clamp(min=MIN_VARIANCE))
    return _ShiftAndScale(mean.float(), (1.0 / std).float(), std, bool(std.max() > FLOAT32_STD_LIMIT))
