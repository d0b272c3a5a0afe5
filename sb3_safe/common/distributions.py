"""
Action distributions that stay finite and valid for every finite network output.

- :class:`BoundedDiagGaussianDistribution`: the std always lies in ``[exp(lo), exp(hi)]``.
- :class:`SquashedBoundedGaussianDistribution`: a tanh-squashed Gaussian for on-policy algorithms whose
  log-prob can be recomputed exactly from the squashed action alone (SB3's rollout buffer keeps nothing else).
- :class:`SafeCategoricalDistribution`, :class:`SafeMultiCategoricalDistribution`,
  :class:`SafeBernoulliDistribution`: logits bounded by ``c * tanh(z / c)``.

All of them subclass the matching SB3 distribution, so SB3's policies, algorithms and ``kl_divergence``
treat them as their parents.
"""

import math
from typing import Any, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
    StateDependentNoiseDistribution,
    sum_independent_dims,
)
from stable_baselines3.common.preprocessing import get_action_dim
from torch.distributions import Bernoulli, Categorical, Normal

from sb3_safe.common.numerics import check_finite

SelfBoundedDiagGaussian = TypeVar("SelfBoundedDiagGaussian", bound="BoundedDiagGaussianDistribution")
SelfSafeCategorical = TypeVar("SelfSafeCategorical", bound="SafeCategoricalDistribution")
SelfSafeMultiCategorical = TypeVar("SelfSafeMultiCategorical", bound="SafeMultiCategoricalDistribution")
SelfSafeBernoulli = TypeVar("SelfSafeBernoulli", bound="SafeBernoulliDistribution")

#: SAC's convention: std in [2e-9, 7.4]
DEFAULT_LOG_STD_RANGE = (-20.0, 2.0)
#: Largest accepted |bound| of ``log_std_range``: exp(40) ~ 2e17 keeps samples and their z-scores finite in float32
LOG_STD_LIMIT = 40.0
#: Bound on logits: learning on CartPole is unchanged, and every action keeps probability >= 1 / (1 + (n - 1) e^20)
DEFAULT_LOGIT_BOUND = 10.0
#: Largest accepted ``logit_bound``
LOGIT_BOUND_LIMIT = 100.0
#: |z-score| above which a Gaussian log-prob is clamped (at -5e29 or below), so z^2 never overflows float32
Z_SCORE_LIMIT = 1e15
#: |value - mean| above which a z-score is clamped; DIFFERENCE_LIMIT * Z_SCORE_LIMIT and
#: DIFFERENCE_LIMIT * exp(LOG_STD_LIMIT) stay finite in float32
DIFFERENCE_LIMIT = 1e20
#: Largest float32 below 1: tanh rounds to exactly 1.0 for |u| > ~9, and atanh(1.0) is inf
SQUASH_LIMIT = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
#: Pre-squash value of the squash limit, atanh(SQUASH_LIMIT) ~ 8.66 in float32
PRESQUASH_LIMIT = float(np.arctanh(np.float32(SQUASH_LIMIT)))

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)
_NONFINITE_OUTPUT_HINT = (
    "The policy network produced it from finite inputs, so its weights are probably NaN/inf already "
    "(find them with NonFiniteGuardCallback or `sb3-safe doctor`). Likely causes: learning rate too high, "
    "unnormalized rewards or observations (use VecNormalize)."
)


def validate_log_std_range(log_std_range: tuple[float, float]) -> tuple[float, float]:
    """
    Check ``log_std_range`` and return it as a tuple of floats.

    :param log_std_range: ``(lo, hi)`` with ``-40 <= lo < hi <= 40``
    :raises ValueError: naming ``log_std_range`` and the allowed values
    """
    try:
        low, high = (float(bound) for bound in log_std_range)
    except (TypeError, ValueError):
        raise ValueError(f"log_std_range must be a pair (lo, hi) of floats, got {log_std_range!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"log_std_range must be finite, got {log_std_range!r}")
    if not -LOG_STD_LIMIT <= low < high <= LOG_STD_LIMIT:
        raise ValueError(
            f"log_std_range=(lo, hi) needs {-LOG_STD_LIMIT:g} <= lo < hi <= {LOG_STD_LIMIT:g}, got {log_std_range!r}"
        )
    return low, high


def validate_logit_bound(logit_bound: float | None) -> float | None:
    """
    Check ``logit_bound`` and return it as a float (or None: unbounded logits, as in SB3).

    :param logit_bound: ``None`` or a float in ``(0, 100]``
    :raises ValueError: naming ``logit_bound`` and the allowed values
    """
    if logit_bound is None:
        return None
    try:
        bound = float(logit_bound)
    except (TypeError, ValueError):
        raise ValueError(f"logit_bound must be None or a float in (0, {LOGIT_BOUND_LIMIT:g}], got {logit_bound!r}") from None
    if not 0.0 < bound <= LOGIT_BOUND_LIMIT:  # also rejects NaN
        raise ValueError(f"logit_bound must be None or a float in (0, {LOGIT_BOUND_LIMIT:g}], got {logit_bound!r}")
    return bound


def bound_logits(logits: th.Tensor, bound: float | None) -> th.Tensor:
    """
    Smoothly map logits into ``(-bound, bound)`` with ``bound * tanh(logits / bound)``.

    Close to the identity for ``|logits| << bound``; its gradient is finite (zero when saturated) for every
    finite input.

    :param logits: raw network output
    :param bound: the bound, or None to return ``logits`` unchanged
    """
    if bound is None:
        return logits
    return bound * th.tanh(logits / bound)


def min_action_probability(n_actions: int, bound: float) -> float:
    """
    The smallest probability a categorical over ``n_actions`` with logits bounded by ``bound`` can give.

    One logit at ``-bound`` and all others at ``+bound``: ``1 / (1 + (n - 1) e^(2 bound))``. For a Bernoulli
    (MultiBinary) dimension the other logit is fixed at 0, which is ``n_actions=2`` with half the bound.

    :param n_actions: number of actions of the categorical
    :param bound: the logit bound
    """
    return 1.0 / (1.0 + (n_actions - 1) * math.exp(2.0 * bound))


def standardize(values: th.Tensor, mean: th.Tensor, log_std: th.Tensor) -> th.Tensor:
    """
    The z-score ``(values - mean) / std``, finite with finite gradients for all finite inputs.

    Exact while ``|values - mean| <= DIFFERENCE_LIMIT`` and ``|z| <= Z_SCORE_LIMIT``; clamped beyond. The two
    clamps keep every intermediate of the backward pass (``difference * grad``, ``1 / std``) below float32's
    maximum, which dividing by the std, or multiplying an unclamped difference, would not.

    :param values: where to evaluate
    :param mean: Gaussian mean
    :param log_std: Gaussian log standard deviation, inside ``[-40, 40]``
    """
    difference = (values - mean).clamp(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT)
    return (difference * th.exp(-log_std)).clamp(-Z_SCORE_LIMIT, Z_SCORE_LIMIT)


def gaussian_log_prob(values: th.Tensor, mean: th.Tensor, log_std: th.Tensor) -> th.Tensor:
    """
    Element-wise log-density of a Gaussian, finite (with finite gradients) for all finite inputs.

    Exact where :func:`standardize` is; elsewhere at most -5e29.

    :param values: where to evaluate the density
    :param mean: Gaussian mean
    :param log_std: Gaussian log standard deviation (already bounded)
    """
    return -0.5 * standardize(values, mean, log_std).square() - log_std - _LOG_SQRT_2PI


def log_tanh_jacobian(presquash: th.Tensor) -> th.Tensor:
    """
    ``log(1 - tanh(u)^2)``, computed as ``2 * (log 2 - u - softplus(-2u))``: exact and finite for every finite u.

    :param presquash: the Gaussian sample ``u`` before tanh
    """
    return 2.0 * (math.log(2.0) - presquash - th.nn.functional.softplus(-2.0 * presquash))


def log_normal_cdf(z_score: th.Tensor) -> th.Tensor:
    """
    ``log Phi(z)`` with finite values and gradients for every finite z.

    ``th.special.log_ndtr`` has the right values but its gradient is 0, inf or wrong for z below about -1e4;
    here the left tail is ``log(erfcx(-z / sqrt(2)) / 2) - z^2 / 2``, whose gradient is about ``-z``.

    :param z_score: standardized value
    """
    left = z_score.clamp(max=0.0)
    right = z_score.clamp(min=0.0)
    left_tail = th.log(0.5 * th.special.erfcx(-left * _SQRT_HALF)) - 0.5 * left.square()
    right_side = th.log1p(-0.5 * th.special.erfc(right * _SQRT_HALF))
    return th.where(z_score < 0, left_tail, right_side)


def squashed_gaussian_log_prob(actions: th.Tensor, mean: th.Tensor, log_std: th.Tensor) -> th.Tensor:
    """
    Element-wise log-prob of squashed actions ``a = tanh(u)``, ``u ~ N(mean, exp(log_std))``, as a function of ``a``
    alone (see :class:`SquashedBoundedGaussianDistribution`): the exact density inside ``+-SQUASH_LIMIT``, the
    censored mass ``P(|u| >= atanh(SQUASH_LIMIT))`` on the limits (actions beyond them count as on them).

    :param actions: squashed actions in ``[-1, 1]``
    :param mean: pre-squash Gaussian mean
    :param log_std: pre-squash Gaussian log standard deviation, inside ``[-40, 40]``
    """
    squashed = actions.clamp(-SQUASH_LIMIT, SQUASH_LIMIT)
    presquash = th.atanh(squashed)
    log_density = gaussian_log_prob(presquash, mean, log_std) - log_tanh_jacobian(presquash)
    # censored mass: log P(u >= u_max) = log Phi(-z(u_max)), log P(u <= -u_max) = log Phi(z(-u_max))
    z_upper = standardize(th.full_like(mean, PRESQUASH_LIMIT), mean, log_std)
    z_lower = standardize(th.full_like(mean, -PRESQUASH_LIMIT), mean, log_std)
    return th.where(
        squashed >= SQUASH_LIMIT,
        log_normal_cdf(-z_upper),
        th.where(squashed <= -SQUASH_LIMIT, log_normal_cdf(z_lower), log_density),
    )


class BoundedDiagGaussianDistribution(DiagGaussianDistribution):
    """
    Diagonal Gaussian whose std is always inside ``[exp(lo), exp(hi)]``, whatever the log-std parameter holds.

    The log-std is clamped where it is used; the policy also projects the parameter back into the range after
    each optimizer step, so the clamp never becomes a dead zone with zero gradient.

    :param action_dim: dimension of the action space
    :param log_std_range: ``(lo, hi)`` bounds of the log standard deviation
    """

    def __init__(self, action_dim: int, log_std_range: tuple[float, float] = DEFAULT_LOG_STD_RANGE):
        super().__init__(action_dim)
        self.log_std_range = validate_log_std_range(log_std_range)
        self.bounded_log_std: th.Tensor

    def proba_distribution(
        self: SelfBoundedDiagGaussian, mean_actions: th.Tensor, log_std: th.Tensor
    ) -> SelfBoundedDiagGaussian:
        """
        Create the distribution given its parameters (mean, log-std).

        :param mean_actions: network output, the Gaussian mean
        :param log_std: log standard deviation, clamped to ``log_std_range``
        :raises NonFiniteError: if the mean or the log-std holds NaN or inf
        """
        check_finite("policy output mean", mean_actions, _NONFINITE_OUTPUT_HINT)
        check_finite("policy log_std", log_std, _NONFINITE_OUTPUT_HINT)
        self.bounded_log_std = log_std.clamp(*self.log_std_range).expand_as(mean_actions)
        self.distribution = Normal(mean_actions, self.bounded_log_std.exp(), validate_args=False)
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        return sum_independent_dims(gaussian_log_prob(actions, self.distribution.mean, self.bounded_log_std))


class SquashedBoundedGaussianDistribution(BoundedDiagGaussianDistribution):
    """
    Tanh-squashed Gaussian with bounded std, for on-policy algorithms (PPO, A2C, TRPO) without gSDE.

    Actions ``a = tanh(u)`` lie in ``[-SQUASH_LIMIT, SQUASH_LIMIT]`` (the policy rescales them to the Box
    bounds). The log-prob is a function of ``a`` alone, so the value computed when acting equals the one
    recomputed from the squashed action that SB3's rollout buffer stores (PPO's first ratio is 1):

    - inside the limits: the exact density ``N(atanh(a); mean, std) / (1 - a^2)``, with a stable Jacobian;
    - at the limits (tanh saturated in float32, where ``atanh`` cannot recover ``u``): the probability mass
      ``P(u >= atanh(SQUASH_LIMIT))`` (resp. ``<=``) of the censored Gaussian, as in clipped-action policy
      gradients (Fujita & Maeda, 2018). Finite, and its gradient moves the mean the right way.

    Both branches are finite, with finite gradients, for every finite mean and any log-std parameter; actions
    outside the limits (e.g. exactly +-1) are treated as on the limits.
    KL divergences are those of the pre-squash Gaussians (KL is invariant under the bijection).

    :param action_dim: dimension of the action space
    :param log_std_range: ``(lo, hi)`` bounds of the log standard deviation
    """

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        return sum_independent_dims(squashed_gaussian_log_prob(actions, self.distribution.mean, self.bounded_log_std))

    def entropy(self) -> th.Tensor:
        """
        Single-sample estimate of the squashed distribution's entropy: the Gaussian entropy plus
        ``E[log(1 - tanh(u)^2)]`` at a fresh reparameterized sample (there is no closed form).
        """
        presquash = th.atanh(th.tanh(self.distribution.rsample()).clamp(-SQUASH_LIMIT, SQUASH_LIMIT))
        return sum_independent_dims(self.distribution.entropy() + log_tanh_jacobian(presquash))

    def sample(self) -> th.Tensor:
        return th.tanh(self.distribution.rsample()).clamp(-SQUASH_LIMIT, SQUASH_LIMIT)

    def mode(self) -> th.Tensor:
        return th.tanh(self.distribution.mean).clamp(-SQUASH_LIMIT, SQUASH_LIMIT)


class BoundedStateDependentNoiseDistribution(StateDependentNoiseDistribution):
    """
    gSDE distribution whose exploration std is computed from a log-std clamped to ``log_std_range``, and whose
    log-probs use the finite Gaussian density and, with ``squash_output``, the squashed log-prob of
    :func:`squashed_gaussian_log_prob` (SB3's ``atanh`` of a clipped action disagrees with the sampled one
    once tanh saturates).

    :param action_dim: dimension of the action space
    :param log_std_range: ``(lo, hi)`` bounds of the log standard deviation
    :param kwargs: SB3's gSDE options (``full_std``, ``use_expln``, ``squash_output``, ...)
    """

    def __init__(self, action_dim: int, log_std_range: tuple[float, float] = DEFAULT_LOG_STD_RANGE, **kwargs: Any):
        super().__init__(action_dim, **kwargs)
        self.log_std_range = validate_log_std_range(log_std_range)

    def get_std(self, log_std: th.Tensor) -> th.Tensor:
        check_finite("policy log_std", log_std, _NONFINITE_OUTPUT_HINT)
        return super().get_std(log_std.clamp(*self.log_std_range))

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        mean = self.distribution.mean
        # the std mixes the exploration matrix with the latent features: bound it to what standardize supports
        log_std = self.distribution.stddev.log().clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT)
        if self.bijector is not None:
            return sum_independent_dims(squashed_gaussian_log_prob(actions, mean, log_std))
        return sum_independent_dims(gaussian_log_prob(actions, mean, log_std))


class SafeCategoricalDistribution(CategoricalDistribution):
    """
    Categorical distribution over logits bounded by ``logit_bound * tanh(logits / logit_bound)``.

    Every action keeps probability >= :func:`min_action_probability`; log-probs, entropy and gradients are
    finite for every finite network output.

    :param action_dim: number of actions
    :param logit_bound: the bound, or None for SB3's unbounded logits
    """

    def __init__(self, action_dim: int, logit_bound: float | None = DEFAULT_LOGIT_BOUND):
        super().__init__(action_dim)
        self.logit_bound = validate_logit_bound(logit_bound)

    def proba_distribution(self: SelfSafeCategorical, action_logits: th.Tensor) -> SelfSafeCategorical:
        check_finite("policy output logits", action_logits, _NONFINITE_OUTPUT_HINT)
        self.distribution = Categorical(logits=bound_logits(action_logits, self.logit_bound), validate_args=False)
        return self


class SafeMultiCategoricalDistribution(MultiCategoricalDistribution):
    """
    MultiCategorical distribution whose logits are bounded as in :class:`SafeCategoricalDistribution`.

    :param action_dims: number of actions of each discrete sub-space
    :param logit_bound: the bound, or None for SB3's unbounded logits
    """

    def __init__(self, action_dims: list[int], logit_bound: float | None = DEFAULT_LOGIT_BOUND):
        super().__init__(action_dims)
        self.logit_bound = validate_logit_bound(logit_bound)

    def proba_distribution(self: SelfSafeMultiCategorical, action_logits: th.Tensor) -> SelfSafeMultiCategorical:
        check_finite("policy output logits", action_logits, _NONFINITE_OUTPUT_HINT)
        bounded = bound_logits(action_logits, self.logit_bound)
        self.distribution = [
            Categorical(logits=split, validate_args=False) for split in th.split(bounded, list(self.action_dims), dim=1)
        ]
        return self


class SafeBernoulliDistribution(BernoulliDistribution):
    """
    Independent Bernoulli distributions (MultiBinary) whose logits are bounded, so each outcome keeps
    probability >= ``1 / (1 + e^bound)``.

    :param action_dims: number of binary actions
    :param logit_bound: the bound, or None for SB3's unbounded logits
    """

    def __init__(self, action_dims: int, logit_bound: float | None = DEFAULT_LOGIT_BOUND):
        super().__init__(action_dims)
        self.logit_bound = validate_logit_bound(logit_bound)

    def proba_distribution(self: SelfSafeBernoulli, action_logits: th.Tensor) -> SelfSafeBernoulli:
        check_finite("policy output logits", action_logits, _NONFINITE_OUTPUT_HINT)
        self.distribution = Bernoulli(logits=bound_logits(action_logits, self.logit_bound), validate_args=False)
        return self


def make_safe_distribution(
    action_space: spaces.Space,
    log_std_range: tuple[float, float] = DEFAULT_LOG_STD_RANGE,
    logit_bound: float | None = DEFAULT_LOGIT_BOUND,
    squash_output: bool = False,
    use_sde: bool = False,
    dist_kwargs: dict[str, Any] | None = None,
) -> Distribution:
    """
    The safe counterpart of SB3's ``make_proba_distribution``.

    :param action_space: the action space
    :param log_std_range: ``(lo, hi)`` bounds of the log-std (Box actions)
    :param logit_bound: logit bound (Discrete, MultiDiscrete, MultiBinary actions), None for unbounded
    :param squash_output: tanh-squashed Gaussian (Box actions, without gSDE)
    :param use_sde: generalized State-Dependent Exploration (Box actions)
    :param dist_kwargs: SB3's gSDE options
    """
    if isinstance(action_space, spaces.Box):
        action_dim = get_action_dim(action_space)
        if use_sde:
            return BoundedStateDependentNoiseDistribution(action_dim, log_std_range, **(dist_kwargs or {}))
        if squash_output:
            return SquashedBoundedGaussianDistribution(action_dim, log_std_range)
        return BoundedDiagGaussianDistribution(action_dim, log_std_range)
    if isinstance(action_space, spaces.Discrete):
        return SafeCategoricalDistribution(int(action_space.n), logit_bound)
    if isinstance(action_space, spaces.MultiDiscrete):
        return SafeMultiCategoricalDistribution(list(action_space.nvec), logit_bound)
    if isinstance(action_space, spaces.MultiBinary):
        assert isinstance(action_space.n, int), "Multi-dimensional MultiBinary action space is not supported"
        return SafeBernoulliDistribution(action_space.n, logit_bound)
    raise NotImplementedError(
        f"Unsupported action space {type(action_space).__name__}: sb3-safe supports Box, Discrete, MultiDiscrete "
        "and MultiBinary, as SB3 does."
    )
