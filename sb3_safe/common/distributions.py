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
import numbers
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
SelfBoundedSDE = TypeVar("SelfBoundedSDE", bound="BoundedStateDependentNoiseDistribution")
SelfSafeCategorical = TypeVar("SelfSafeCategorical", bound="SafeCategoricalDistribution")
SelfSafeMultiCategorical = TypeVar("SelfSafeMultiCategorical", bound="SafeMultiCategoricalDistribution")
SelfSafeBernoulli = TypeVar("SelfSafeBernoulli", bound="SafeBernoulliDistribution")

#: SAC's convention: std in [2e-9, 7.4]
DEFAULT_LOG_STD_RANGE = (-20.0, 2.0)
#: Largest accepted |bound| of ``log_std_range``: exp(40) ~ 2e17 keeps samples and their z-scores finite in float32
LOG_STD_LIMIT = 40.0
#: Bound on logits: every action keeps probability >= 1 / (1 + (n - 1) e^20) (2e-9 for two actions) and a
#: log-probability ratio stays below e^(20 + log n). 20 measured no better (one CPU, paired runs, final return 20 minus
#: 10: SafeA2C + adaptive lr on CartPole-v1 at lr x0.1-x3, 80 runs, +13 [-23, 48]; PPO + SafeMlpPolicy on Acrobot-v1,
#: 30 runs, -21 [-54, 5]; SafeA2C at the tuned settings, 13 seeds, mean 307 vs 321; benchmarks/results/robustness.md)
DEFAULT_LOGIT_BOUND = 10.0
#: Largest accepted ``logit_bound``
LOGIT_BOUND_LIMIT = 100.0
#: |z-score| above which a Gaussian log-prob is clamped (at -5e29 or below), so z^2 never overflows float32
Z_SCORE_LIMIT = 1e15
#: |value - mean| above which a z-score is clamped; DIFFERENCE_LIMIT * Z_SCORE_LIMIT and
#: DIFFERENCE_LIMIT * exp(LOG_STD_LIMIT) stay finite in float32
DIFFERENCE_LIMIT = 1e20
#: |u| at which the squashed Gaussian is clipped: pre-squash values beyond it give the limit actions +-1 exactly.
#: Below it one float32 step of the action spans at most 6e-6 in u (0.11 at u = 8, where float32 tanh saturates),
#: so the density at a stored action is the probability of that action for every std >= 1e-3
#: (benchmarks/results/squash_bound.md measures 3, 4, 5 and 6).
PRESQUASH_BOUND = 3.0
#: float32 tanh(PRESQUASH_BOUND): squashed actions are tanh(u) / TANH_BOUND, so the limits are exactly +-1
TANH_BOUND = float(np.float32(math.tanh(PRESQUASH_BOUND)))
#: Largest float32 below 1: the largest |action| that is not a limit action
INNER_LIMIT = float(np.nextafter(np.float32(1.0), np.float32(0.0)))

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
#: Where torch_exact_gaussian_log_prob takes Normal's arithmetic: its backward divides by the variance squared
_EXACT_LOG_STD_FLOOR = -20.0
_EXACT_Z_LIMIT = 1e4
_LOG_TANH_BOUND = math.log(TANH_BOUND)
#: gSDE noise variances (float64) outside these come from features that carry no usable noise
_SMALLEST_VARIANCE = math.exp(-2 * LOG_STD_LIMIT)
_LARGEST_VARIANCE = math.exp(2 * LOG_STD_LIMIT)
_SQRT_HALF = math.sqrt(0.5)
#: What a non-finite network output means, appended to the NonFiniteError the distributions raise
NONFINITE_OUTPUT_HINT = (
    "Either the observation it was computed from holds NaN/inf (an environment that blew up: "
    "NonFiniteGuardCallback checks every observation, terminal ones included, and names the env) or the "
    "network's weights are NaN/inf already (find them with NonFiniteGuardCallback or `sb3-safe doctor`). Likely "
    "causes: learning rate too high, unnormalized rewards or observations (use VecNormalize)."
)


def _is_number(value: Any) -> bool:
    """A real number (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def validate_log_std_range(log_std_range: tuple[float, float]) -> tuple[float, float]:
    """
    Check ``log_std_range`` and return it as a tuple of floats.

    :param log_std_range: ``(lo, hi)`` with ``-40 <= lo < hi <= 40``
    :raises ValueError: naming ``log_std_range`` and the allowed values
    """
    try:
        bounds = tuple(log_std_range)
    except TypeError:
        bounds = ()
    # Numbers only: float("2") and float(True) would silently accept a string or a bool
    if len(bounds) != 2 or not all(_is_number(bound) for bound in bounds):
        raise ValueError(f"log_std_range must be a pair (lo, hi) of floats, got {log_std_range!r}")
    low, high = float(bounds[0]), float(bounds[1])
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
    # Numbers only: float("10") and float(True) would silently accept a string or a bool
    if not _is_number(logit_bound):
        raise ValueError(f"logit_bound must be None or a float in (0, {LOGIT_BOUND_LIMIT:g}], got {logit_bound!r}")
    bound = float(logit_bound)
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


def torch_exact_gaussian_log_prob(values: th.Tensor, normal: Normal, log_std: th.Tensor) -> th.Tensor:
    """
    :func:`gaussian_log_prob` with ``torch.distributions.Normal.log_prob``'s arithmetic (SB3's) wherever it and its
    gradient are finite: bit for bit the stock value there (TRPO's conjugate-gradient solve amplifies any rounding
    difference), :func:`gaussian_log_prob` elsewhere.

    Normal's backward divides by the variance squared, which float32 holds down to a log-std of about -20; with the
    z-score within :data:`_EXACT_Z_LIMIT` every intermediate stays finite. Where that holds for every element (a
    healthy run) it is ``normal.log_prob`` itself; otherwise each element takes its branch, the inputs of the branch
    not taken replaced (by 0), so that its gradient is zero, never NaN.

    :param values: where to evaluate the density
    :param normal: the Gaussian, its scale ``exp(log_std)``
    :param log_std: its log standard deviation (already bounded)
    """
    difference = values - normal.loc
    exact = (log_std >= _EXACT_LOG_STD_FLOOR) & (difference.abs() <= _EXACT_Z_LIMIT * normal.scale)
    if bool(exact.all()):
        return normal.log_prob(values)  # no bound binds (a healthy run): SB3's computation, nothing else
    exact_difference = th.where(exact, difference, 0.0)
    scale = th.where(exact, normal.scale, 1.0)
    # As Normal.log_prob computes it
    stock = -(exact_difference**2) / (2 * scale**2) - scale.log() - math.log(math.sqrt(2 * math.pi))
    return th.where(exact, stock, gaussian_log_prob(values, normal.loc, log_std))


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


def squash(presquash: th.Tensor) -> th.Tensor:
    """
    Squashed actions ``tanh(u) / tanh(PRESQUASH_BOUND)`` in ``[-1, 1]``, with ``u`` clipped to ``+-PRESQUASH_BOUND``.

    The limit actions ``+-1`` are taken exactly when ``|u| >= PRESQUASH_BOUND`` (values just below the bound that
    float32 would round onto the limit are kept at ``INNER_LIMIT``), so their probability is exactly the censored
    Gaussian mass that :func:`squashed_gaussian_log_prob` gives them.

    :param presquash: Gaussian samples ``u``
    """
    inner = (th.tanh(presquash) / TANH_BOUND).clamp(-INNER_LIMIT, INNER_LIMIT)
    limit = th.ones_like(presquash)
    return th.where(presquash >= PRESQUASH_BOUND, limit, th.where(presquash <= -PRESQUASH_BOUND, -limit, inner))


def squashed_gaussian_log_prob(actions: th.Tensor, mean: th.Tensor, log_std: th.Tensor) -> th.Tensor:
    """
    Element-wise log-prob of actions ``a = squash(u)``, ``u ~ N(mean, exp(log_std))`` (see :func:`squash`), as a
    function of ``a`` alone: the exact density ``N(u) * tanh(PRESQUASH_BOUND) / (1 - tanh(u)^2)`` with
    ``u = atanh(a * tanh(PRESQUASH_BOUND))`` strictly inside ``+-1``, and the censored mass
    ``P(u >= PRESQUASH_BOUND)`` (resp. ``P(u <= -PRESQUASH_BOUND)``) at the limits (actions beyond count as on them).

    :param actions: squashed actions in ``[-1, 1]``
    :param mean: pre-squash Gaussian mean
    :param log_std: pre-squash Gaussian log standard deviation, inside ``[-40, 40]``
    """
    presquash = th.atanh(actions.clamp(-INNER_LIMIT, INNER_LIMIT) * TANH_BOUND)
    log_density = gaussian_log_prob(presquash, mean, log_std) - log_tanh_jacobian(presquash) + _LOG_TANH_BOUND
    # censored mass: log P(u >= bound) = log Phi(-z(bound)), log P(u <= -bound) = log Phi(z(-bound))
    z_upper = standardize(th.full_like(mean, PRESQUASH_BOUND), mean, log_std)
    z_lower = standardize(th.full_like(mean, -PRESQUASH_BOUND), mean, log_std)
    return th.where(
        actions >= 1.0,
        log_normal_cdf(-z_upper),
        th.where(actions <= -1.0, log_normal_cdf(z_lower), log_density),
    )


def squashed_gaussian_entropy(normal: Normal) -> th.Tensor:
    """
    Element-wise single-sample estimate of the differential entropy of ``tanh(u) / tanh(PRESQUASH_BOUND)`` for
    ``u ~ normal`` (the squashed Gaussian before clipping at the limits): the Gaussian entropy plus
    ``log(1 - tanh(u)^2) - log(tanh(PRESQUASH_BOUND))`` at a fresh reparameterized ``u``.

    There is no closed form. The estimate is unbiased, and so is its gradient: ``-2 E[tanh(u)]`` for the mean,
    which pulls a saturated mean back when an entropy bonus is used (the entropy of the clipped distribution,
    nearly all of it on a limit action, would not). It differs from ``-E[log_prob]`` by the share of the limits.

    :param normal: the pre-squash Gaussian
    """
    return normal.entropy() + log_tanh_jacobian(normal.rsample()) - _LOG_TANH_BOUND


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
        check_finite("policy output mean", mean_actions, NONFINITE_OUTPUT_HINT)
        check_finite("policy log_std", log_std, NONFINITE_OUTPUT_HINT)
        bounded = log_std.clamp(*self.log_std_range)
        self.bounded_log_std = bounded.expand_as(mean_actions)
        # The std as SB3's DiagGaussianDistribution builds it (ones times exp): the same gradients, summed the same way
        self.distribution = Normal(mean_actions, th.ones_like(mean_actions) * bounded.exp(), validate_args=False)
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """
        :param actions: the actions whose log-probability to compute
        """
        return sum_independent_dims(torch_exact_gaussian_log_prob(actions, self.distribution, self.bounded_log_std))


class SquashedBoundedGaussianDistribution(BoundedDiagGaussianDistribution):
    """
    Tanh-squashed Gaussian with bounded std, for on-policy algorithms (PPO, A2C, TRPO) without gSDE.

    Actions ``a = tanh(u) / tanh(PRESQUASH_BOUND)`` with ``u`` clipped to ``+-PRESQUASH_BOUND`` (:func:`squash`) lie in
    ``[-1, 1]`` (the policy rescales them to the Box bounds). The limit actions ``+-1`` carry the censored mass
    ``P(|u| >= PRESQUASH_BOUND)``, as in clipped-action policy gradients (Fujita & Maeda, 2018); inside, the density
    is the change-of-variables density with a stable Jacobian. The log-prob is a function of ``a`` alone
    (:func:`squashed_gaussian_log_prob`), so the value computed when acting equals the one recomputed from the
    squashed action that SB3's rollout buffer stores (PPO's first ratio is 1), and it is the probability of the
    stored float32 action: the bound sits where float32 actions still resolve ``u`` finely (float32 tanh rounds
    onto 1 from ``u ~ 8.5``, past which a density at the stored action means nothing).

    Log-probs are finite, with finite gradients, for every finite mean and any log-std parameter; actions beyond
    the limits count as on them. :meth:`entropy` estimates the entropy of the squashed Gaussian before clipping
    (:func:`squashed_gaussian_entropy`). SB3's and torch's KL divergences of it are those of the pre-squash Gaussians:
    exact while the limits carry no mass, an upper bound otherwise (clipping can only lose information);
    :func:`sb3_safe.common.kl.analytic_kl` gives the exact one (:func:`~sb3_safe.common.kl.clipped_gaussian_kl`).

    :param action_dim: dimension of the action space
    :param log_std_range: ``(lo, hi)`` bounds of the log standard deviation
    """

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """
        :param actions: the squashed actions whose log-probability to compute
        """
        return sum_independent_dims(squashed_gaussian_log_prob(actions, self.distribution.mean, self.bounded_log_std))

    def entropy(self) -> th.Tensor:
        return sum_independent_dims(squashed_gaussian_entropy(self.distribution))

    def sample(self) -> th.Tensor:
        return squash(self.distribution.rsample())

    def mode(self) -> th.Tensor:
        return squash(self.distribution.mean)


class BoundedStateDependentNoiseDistribution(StateDependentNoiseDistribution):
    """
    gSDE distribution (SB3's ``StateDependentNoiseDistribution``) whose per-dimension action std is always inside
    ``[exp(lo), exp(hi)]``.

    The action noise is the latent features times the exploration matrix, as in SB3, with the std that gives,
    ``sqrt(latent^2 @ sigma^2)``; where that std leaves the range the noise is rescaled to the bounded std, so
    the sampler and :meth:`log_prob` agree for every std (SB3 adds 1e-6 to the variance in the log-prob only).
    Where the features give no noise at all (all zero, or overflowing), fresh Gaussian noise of the bounded std is
    used. The exploration matrix's own log-std parameter is clamped to the same range (with ``use_expln`` as SB3).
    With ``squash_output`` actions are squashed as in :class:`SquashedBoundedGaussianDistribution`, with the same
    log-prob and entropy estimate. A non-finite mean or latent raises :class:`~sb3_safe.common.numerics.NonFiniteError`.

    :param action_dim: dimension of the action space
    :param log_std_range: ``(lo, hi)`` bounds of the per-dimension action log standard deviation
    :param kwargs: SB3's gSDE options (``full_std``, ``use_expln``, ``squash_output``, ...)
    """

    def __init__(self, action_dim: int, log_std_range: tuple[float, float] = DEFAULT_LOG_STD_RANGE, **kwargs: Any):
        super().__init__(action_dim, **kwargs)
        self.log_std_range = validate_log_std_range(log_std_range)
        self.bounded_log_std: th.Tensor
        self._noise_scale: th.Tensor
        self._fresh_noise: th.Tensor

    def get_std(self, log_std: th.Tensor) -> th.Tensor:
        """
        :param log_std: the log-std parameter of the exploration matrix, clamped to ``log_std_range``
        """
        check_finite("policy log_std", log_std, NONFINITE_OUTPUT_HINT)
        return super().get_std(log_std.clamp(*self.log_std_range))

    def proba_distribution(
        self: SelfBoundedSDE, mean_actions: th.Tensor, log_std: th.Tensor, latent_sde: th.Tensor
    ) -> SelfBoundedSDE:
        """
        Create the distribution given its parameters.

        :param mean_actions: network output, the Gaussian mean
        :param log_std: log-std parameter of the exploration matrix, clamped to ``log_std_range``
        :param latent_sde: the latent features the noise is computed from
        :raises NonFiniteError: if the mean, the latent features or the log-std holds NaN or inf
        """
        check_finite("policy output mean", mean_actions, NONFINITE_OUTPUT_HINT)
        check_finite("policy gSDE features", latent_sde, NONFINITE_OUTPUT_HINT)
        self._latent_sde = latent_sde if self.learn_features else latent_sde.detach()
        # float64: the gradient of log(variance) passes through 1 / variance, which overflows float32 for tiny stds
        variance = th.mm(self._latent_sde.double() ** 2, self.get_std(log_std.double()) ** 2)
        # where the features give no usable noise (zero, underflowing or overflowing variance), fresh noise is drawn
        self._fresh_noise = ~((variance >= _SMALLEST_VARIANCE) & (variance <= _LARGEST_VARIANCE))
        noise_log_std = (0.5 * th.log(variance.clamp(_SMALLEST_VARIANCE, _LARGEST_VARIANCE))).to(mean_actions.dtype)
        self.bounded_log_std = noise_log_std.clamp(*self.log_std_range)
        with th.no_grad():
            self._noise_scale = th.exp(self.bounded_log_std - noise_log_std)
        self.distribution = Normal(mean_actions, self.bounded_log_std.exp(), validate_args=False)
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        mean = self.distribution.mean
        if self.bijector is not None:
            return sum_independent_dims(squashed_gaussian_log_prob(actions, mean, self.bounded_log_std))
        return sum_independent_dims(gaussian_log_prob(actions, mean, self.bounded_log_std))

    def entropy(self) -> th.Tensor:
        if self.bijector is not None:
            return sum_independent_dims(squashed_gaussian_entropy(self.distribution))
        return sum_independent_dims(self.distribution.entropy())

    def sample(self) -> th.Tensor:
        noise = self.get_noise(self._latent_sde) * self._noise_scale
        fresh = self._fresh_noise | ~th.isfinite(noise)
        if bool(fresh.any()):
            noise = th.where(fresh, th.randn_like(noise) * self.distribution.stddev, noise)
        actions = self.distribution.mean + noise
        return squash(actions) if self.bijector is not None else actions

    def mode(self) -> th.Tensor:
        mean = self.distribution.mean
        return squash(mean) if self.bijector is not None else mean


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
        """
        :param action_logits: the logits of each action, bounded before use
        """
        check_finite("policy output logits", action_logits, NONFINITE_OUTPUT_HINT)
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
        """
        :param action_logits: the logits of every discrete sub-space, concatenated, bounded before use
        """
        check_finite("policy output logits", action_logits, NONFINITE_OUTPUT_HINT)
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
        """
        :param action_logits: the logit of each binary dimension, bounded before use
        """
        check_finite("policy output logits", action_logits, NONFINITE_OUTPUT_HINT)
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
