"""
Value-target normalization with preserved outputs (PopArt, van Hasselt et al. 2016, "Learning values across many
orders of magnitude"): the critic regresses returns scaled to zero mean and unit variance, so that the value loss,
and its share of the clipped gradient, no longer depends on the reward scale.

:class:`PopArtValueHead` takes the place of the policy's ``value_net`` (the last layer of the critic). It keeps the
running mean and variance of every return it was trained on (float64 buffers of the policy: saved with the model,
copied by the guard's snapshots and by the adaptive learning rate's undo record), and its output is the value in
reward units, so that everything SB3 computes from values (the values stored in the rollout buffer, the bootstrap
of truncated episodes, the last values of GAE) needs no change. ``train()`` reads the normalized output instead
(:func:`normalized_values`) and regresses it on the normalized returns (:meth:`PopArtValueHead.normalize`); the
advantages are divided by the same standard deviation (:meth:`PopArtValueHead.scale_advantages`), so that the policy
gradient of an algorithm that does not normalize them (A2C) is scale-free as well.

When the statistics change, the layer's weight and bias are rescaled so that the values in reward units stay what
they were (the paper's "preserving outputs precisely"), except at the first update: before it, with no return seen,
nothing is known of the reward's scale and the values in reward units are 0; from then on the layer's output is read
in normalized units. An untrained layer's output would otherwise be noise of a fixed size in reward units, which
swamps the first returns of tiny rewards and, bootstrapped from, stays in the statistics; with values of 0 the first
returns are the rewards' own, and training is equivariant to the reward's scale (the same updates at rewards x c, up
to rounding).
"""

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Literal, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import explained_variance
from stable_baselines3.common.vec_env import VecEnv, unwrap_vec_normalize
from torch import nn
from torch.nn import functional as F

from sb3_safe.common.numerics import DerivedOnChange, merge_moments_into

#: The least standard deviation the returns are scaled by: returns that are all equal scale to zero, not to inf
MIN_STD = 1e-8
#: The largest mean and scale of the returns applied in float32 (values of a few std then stay far inside float32's
#: range, and the output is float32 anyway); beyond it they are applied in float64
FLOAT32_LIMIT = 1e30
#: The names of the head's statistics buffers: statistics of the returns in reward units, not weights
STATISTICS = ("return_mean", "return_var", "return_count")
#: ``normalize_value``'s settings: ``"auto"`` is on unless the environment's rewards are normalized already
NormalizeValue = bool | Literal["auto"]


class PopArtValueHead(nn.Module):
    """
    The critic's last linear layer, its outputs in normalized units, de-normalized with running statistics of the
    returns (PopArt).

    The weight and bias are the replaced layer's own parameters (the same tensors: the policy's optimizer keeps
    them); the statistics are float64 buffers ``return_mean``, ``return_var`` and ``return_count``, the exact mean
    and (population) variance of every return given to :meth:`update`. Since each return is among the statistics,
    its normalized value is at most ``sqrt(return_count)`` in magnitude (Samuelson's inequality), so the regression
    target is finite for any finite return.

    :param linear: the layer it replaces (``policy.value_net``)
    """

    return_mean: th.Tensor
    return_var: th.Tensor
    return_count: th.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        device = linear.weight.device
        # Before the first update: mean 0, std 1 (normalized targets are the returns), values in reward units 0
        self.register_buffer("return_mean", th.zeros(linear.out_features, dtype=th.float64, device=device))
        self.register_buffer("return_var", th.ones(linear.out_features, dtype=th.float64, device=device))
        self.register_buffer("return_count", th.zeros((), dtype=th.float64, device=device))
        #: whether :meth:`forward` returns normalized values (inside :func:`normalized_values`) or values in reward units
        self.normalized_output = False
        #: what forward scales the normalized values by: the returns' std, 0 before the first update
        self._output_scale = DerivedOnChange(_output_scale)

    @property
    def return_std(self) -> th.Tensor:
        """The standard deviation the returns are scaled by (float64), at least :data:`MIN_STD`."""
        return self.output_scale().std

    def output_scale(self) -> "_OutputScale":
        """What :meth:`forward` scales by, derived once per change of the statistics (the same object until then)."""
        return self._output_scale.get(self.return_mean, self.return_var, self.return_count)

    def forward(self, latent: th.Tensor) -> th.Tensor:
        """
        :param latent: the critic's latent features
        :return: the values in reward units, or normalized inside :func:`normalized_values`
        """
        normalized = F.linear(latent, self.weight, self.bias)
        if self.normalized_output:
            return normalized
        # Derived once per change of the statistics: a value per rollout step costs one operation, not a dozen
        output = self.output_scale()
        if normalized.dtype == th.float32 and not output.in_float64:
            return th.addcmul(output.mean, normalized, output.scale)
        # In float64: statistics near float32's range must not overflow on the way
        return th.addcmul(self.return_mean, normalized.double(), output.scale64).to(normalized.dtype)

    def normalize(self, values: th.Tensor) -> th.Tensor:
        """
        Values or returns in reward units, in the units of the normalized output (computed in float64).

        :param values: values or returns in reward units
        :return: the normalized values, in the dtype of ``values``
        """
        return ((values.double() - self.return_mean) / self.return_std).to(values.dtype)

    def scale_advantages(self, advantages: th.Tensor) -> th.Tensor:
        """
        Advantages in reward units divided by the returns' standard deviation (computed in float64), as in
        multi-task PopArt (Hessel et al. 2019): the policy gradient is then scale-free too, where advantages are not
        normalized per batch (A2C's default); not centered, so A2C's gradient keeps its direction.

        :param advantages: advantages in reward units
        :return: the scaled advantages, in the dtype of ``advantages``
        """
        return (advantages.double() / self.return_std).to(advantages.dtype)

    @th.no_grad()
    def update(self, returns: th.Tensor | np.ndarray) -> None:
        """
        Add a rollout's returns to the statistics and rescale the layer so that its values in reward units stay the
        same (from the second update on). A batch with a non-finite return leaves everything unchanged: the loss it
        gives is not finite, and its step is skipped, but the statistics of the other returns stay usable.

        Updated in place: snapshots (the guard's, the adaptive learning rate's) copy and restore these very tensors.

        :param returns: the returns of the rollout (the value targets), any shape
        """
        batch = th.as_tensor(returns, device=self.return_mean.device).reshape(-1, self.out_features).double()
        if batch.numel() == 0 or not bool(th.isfinite(batch).all()):
            return
        had_returns = self.return_count.item() > 0
        old_mean, old_std = self.return_mean.clone(), self.return_std
        var, mean = th.var_mean(batch, dim=0, correction=0)
        merge_moments_into((self.return_mean, self.return_var, self.return_count), mean, var, float(batch.shape[0]))
        if had_returns:
            new_std = self.return_std
            # sigma' (W' h + b') + mu' = sigma (W h + b) + mu
            self.weight.copy_(self.weight.double() * (old_std / new_std)[:, None])
            if self.bias is not None:
                self.bias.copy_((self.bias.double() * old_std + old_mean - self.return_mean) / new_std)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _return_std(return_var: th.Tensor) -> th.Tensor:
    return return_var.clamp(min=0.0).sqrt().clamp(min=MIN_STD)


class _OutputScale(NamedTuple):
    #: the returns' mean and the scale of the normalized values (0 before the first update), in float32
    mean: th.Tensor
    scale: th.Tensor
    #: the scale in float64, for statistics beyond :data:`FLOAT32_LIMIT`
    scale64: th.Tensor
    in_float64: bool
    #: the returns' standard deviation (float64), what targets and advantages are divided by
    std: th.Tensor


def _output_scale(return_mean: th.Tensor, return_var: th.Tensor, return_count: th.Tensor) -> _OutputScale:
    std = _return_std(return_var)
    scale = std if return_count.item() > 0 else th.zeros_like(std)
    in_float64 = th.maximum(scale, return_mean.abs()).max().item() > FLOAT32_LIMIT
    return _OutputScale(return_mean.float(), scale.float(), scale, in_float64, std)


def install_value_normalization(policy: ActorCriticPolicy) -> PopArtValueHead:
    """
    Put a :class:`PopArtValueHead` in place of ``policy.value_net`` (a linear layer), keeping its parameters (and so
    the optimizer's hold on them, the parameters' order and their names in the state dict). Idempotent.

    :param policy: an actor-critic policy whose ``value_net`` is an ``nn.Linear``
    :return: the head
    """
    value_net = policy.value_net
    if isinstance(value_net, PopArtValueHead):
        return value_net
    if not isinstance(value_net, nn.Linear):
        raise ValueError(
            f"normalize_value=True needs the policy's value_net to be an nn.Linear (SB3's actor-critic policies), got "
            f"{type(value_net).__name__}"
        )
    head = PopArtValueHead(value_net)
    # The policy's annotation says nn.Linear; the head is a module in its place with the same parameters
    policy.value_net = head  # type: ignore[assignment]
    return head


def rewards_normalized(env: VecEnv | None) -> bool:
    """
    :param env: an environment (None: none yet)
    :return: whether some wrapper of ``env`` is a ``VecNormalize`` with ``norm_reward=True`` (its rewards are then
        scaled to a unit return already)
    """
    vec_normalize = unwrap_vec_normalize(env) if env is not None else None
    return vec_normalize is not None and vec_normalize.norm_reward


def check_normalize_value(normalize_value: Any) -> NormalizeValue:
    """
    :param normalize_value: a safe algorithm's ``normalize_value`` argument
    :return: it, checked
    :raises ValueError: if it is not True, False or ``"auto"``
    """
    if normalize_value is True or normalize_value is False or normalize_value == "auto":
        return normalize_value
    raise ValueError(f"normalize_value must be True, False or 'auto', got {normalize_value!r}")


def resolve_normalize_value(normalize_value: NormalizeValue, env: VecEnv | None) -> bool:
    """
    Whether to normalize the value targets: ``"auto"`` is on, except where the rewards are normalized already
    (:func:`rewards_normalized`): PopArt on top of ``VecNormalize(norm_reward=True)`` learned worse on Acrobot-v1
    (SafeA2C at the tuned settings, KLAdaptivePPO at a too-high learning rate), where alone each learns
    (``benchmarks/results/learning.md``).

    :param normalize_value: True, False or ``"auto"``
    :param env: the environment the model trains on (decided once, when the model is set up)
    """
    if normalize_value == "auto":
        return env is not None and not rewards_normalized(env)
    return bool(normalize_value)


def install_saved_value_normalization(policy: ActorCriticPolicy, state_dict: Mapping[str, Any]) -> None:
    """
    Put a :class:`PopArtValueHead` in place of ``policy.value_net`` if ``state_dict`` (the policy's, about to be
    loaded) holds its statistics: so that any algorithm, stock PPO included, loads a checkpoint of a model trained
    with ``normalize_value`` (the head's values are in reward units; without ``normalize_value`` its statistics
    stay as saved).

    :param policy: the policy the state dict is loaded into
    :param state_dict: the state dict
    """
    if value_head(policy) is None and "value_net.return_mean" in state_dict:
        install_value_normalization(policy)


def value_head(policy: nn.Module) -> PopArtValueHead | None:
    """
    :param policy: a policy
    :return: its :class:`PopArtValueHead`, or None without value normalization
    """
    head = getattr(policy, "value_net", None)
    return head if isinstance(head, PopArtValueHead) else None


@contextlib.contextmanager
def normalized_values(policy: nn.Module) -> Iterator[None]:
    """
    Inside, the policy's values (``evaluate_actions``, ``predict_values``, ``forward``) are normalized, as the loss
    needs them; nothing changes for a policy without :class:`PopArtValueHead`.

    :param policy: a policy
    """
    head = value_head(policy)
    if head is None:
        yield
        return
    head.normalized_output = True
    try:
        yield
    finally:
        head.normalized_output = False


def record_value_statistics(model: BaseAlgorithm, head: PopArtValueHead) -> None:
    """
    Log the statistics the returns are normalized with: ``train/return_mean`` and ``train/return_std``.

    :param model: the algorithm
    :param head: its policy's value head
    """
    model.logger.record("train/return_mean", head.return_mean.mean().item())
    model.logger.record("train/return_std", head.return_std.mean().item())


def explained_variance_float64(values: np.ndarray, returns: np.ndarray) -> float:
    """
    SB3's ``explained_variance`` of the rollout's values for its returns, computed in float64: the variance of
    float32 returns beyond ~1e19 overflows float32 (a NaN in the log).

    :param values: the rollout buffer's values
    :param returns: the rollout buffer's returns
    """
    return float(explained_variance(values.astype(np.float64).flatten(), returns.astype(np.float64).flatten()))
