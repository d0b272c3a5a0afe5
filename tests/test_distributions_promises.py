"""
Documented promises of sb3_safe.common.distributions that the extreme-input tests do not pin down: the documented
defaults and limits, the censored mass at the squash bound, gSDE's state-dependent noise and its fallback to fresh
noise, argument validation and its messages.
"""

import math

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Distribution

from sb3_safe.common.distributions import (
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
    gaussian_log_prob,
    make_safe_distribution,
    squash,
    validate_log_std_range,
    validate_logit_bound,
)

# The documented values (module docstrings and comments): the tests hard-code them so a changed constant shows
DOCUMENTED_LOG_STD_RANGE = (-20.0, 2.0)  # "SAC's convention: std in [2e-9, 7.4]"
DOCUMENTED_LOG_STD_LIMIT = 40.0  # "-40 <= lo < hi <= 40"
DOCUMENTED_LOGIT_BOUND = 10.0  # "probability >= 1 / (1 + (n - 1) e^20)"
DOCUMENTED_LOGIT_BOUND_LIMIT = 100.0  # "a float in (0, 100]"
DOCUMENTED_PRESQUASH_BOUND = 3.0  # "clipped at |u| = 3", measured in benchmarks/results/squash_bound.md
DOCUMENTED_LOG_PROB_FLOOR = -5e29  # "clamped (at -5e29 or below)": -0.5 * Z_SCORE_LIMIT^2 with Z_SCORE_LIMIT = 1e15


def standard_normal_cdf(value: float) -> float:
    return 0.5 * math.erfc(-value / math.sqrt(2.0))


def gsde(
    log_noise_std: float,
    log_std_range: tuple[float, float],
    batch: int = 1,
    action_dim: int = 2,
    mean_scale: float = 1.0,
    **kwargs,
) -> tuple[BoundedStateDependentNoiseDistribution, th.Tensor, th.Tensor]:
    """
    A gSDE distribution with one feature ``exp(log_noise_std)`` per row and unit exploration std, so the std of the
    state-dependent noise is ``exp(log_noise_std)`` in every action dimension, and means in ``[-mean_scale,
    mean_scale]``. Returns it with its mean and features.
    """
    dist = BoundedStateDependentNoiseDistribution(action_dim, log_std_range, full_std=True, **kwargs)
    dist.latent_sde_dim = 1
    log_std = th.zeros(1, action_dim)
    dist.sample_weights(log_std, batch_size=1)
    mean = th.linspace(-mean_scale, mean_scale, batch * action_dim).reshape(batch, action_dim)
    latent = th.full((batch, 1), math.exp(log_noise_std))
    dist.proba_distribution(mean, log_std, latent)
    return dist, mean, latent


# ---------------------------------------------------------------------------------------------- documented defaults


def test_default_log_std_range_is_sacs() -> None:
    """Promise: by default the std of a bounded Gaussian lies in [e^-20, e^2] (SAC's convention) and reaches both ends."""
    dist = BoundedDiagGaussianDistribution(2)
    dist.proba_distribution(th.zeros(1, 2), th.tensor([-1e6, 1e6]))
    low, high = DOCUMENTED_LOG_STD_RANGE
    assert th.allclose(dist.distribution.stddev, th.tensor([[math.exp(low), math.exp(high)]]), rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("n_actions", [2, 5])
def test_default_logit_bound_gives_the_documented_minimum_probability(n_actions: int) -> None:
    """
    Promise: with the default bound every action keeps probability >= 1 / (1 + (n - 1) e^20), attained when one
    logit is at the bottom and all others at the top; a Bernoulli outcome keeps >= 1 / (1 + e^10).
    """
    smallest = 1.0 / (1.0 + (n_actions - 1) * math.exp(2.0 * DOCUMENTED_LOGIT_BOUND))
    logits = th.full((1, n_actions), 1e6, dtype=th.float64)
    logits[0, -1] = -1e6
    categorical = SafeCategoricalDistribution(n_actions).proba_distribution(logits)
    assert math.isclose(categorical.distribution.probs[0, -1].item(), smallest, rel_tol=1e-9)
    multi = SafeMultiCategoricalDistribution([n_actions, n_actions]).proba_distribution(th.cat([logits, logits], 1))
    assert math.isclose(multi.log_prob(th.tensor([[n_actions - 1.0] * 2])).item(), 2 * math.log(smallest), rel_tol=1e-9)

    bernoulli = SafeBernoulliDistribution(2).proba_distribution(th.tensor([[1e6, -1e6]], dtype=th.float64))
    least_likely = bernoulli.log_prob(th.tensor([[0.0, 1.0]], dtype=th.float64)).item()
    assert math.isclose(least_likely, -2.0 * math.log1p(math.exp(DOCUMENTED_LOGIT_BOUND)), rel_tol=1e-9)


def test_box_without_options_gets_the_plain_bounded_gaussian() -> None:
    """Promise: make_safe_distribution, like SB3's make_proba_distribution, squashes and uses gSDE only when asked."""
    box = spaces.Box(-1.0, 1.0, (3,))
    assert type(make_safe_distribution(box)) is BoundedDiagGaussianDistribution
    assert type(make_safe_distribution(box, squash_output=True)) is SquashedBoundedGaussianDistribution
    assert type(make_safe_distribution(box, use_sde=True)) is BoundedStateDependentNoiseDistribution


def test_gsde_options_reach_the_distribution() -> None:
    """Promise: dist_kwargs are SB3's gSDE options and are passed on to the gSDE distribution."""
    box = spaces.Box(-1.0, 1.0, (3,))
    options = {"full_std": False, "use_expln": True, "squash_output": True, "learn_features": True}
    dist = make_safe_distribution(box, log_std_range=(-5.0, 1.0), use_sde=True, dist_kwargs=options)
    assert isinstance(dist, BoundedStateDependentNoiseDistribution)
    assert (dist.full_std, dist.use_expln, dist.learn_features) == (False, True, True)
    assert dist.bijector is not None and dist.log_std_range == (-5.0, 1.0)


# ------------------------------------------------------------------------------------------ argument validation


@pytest.mark.parametrize("log_std_range", [3.0, None, 2])
def test_a_log_std_range_that_is_not_a_pair_is_a_value_error(log_std_range: object) -> None:
    """Promise: validate_log_std_range raises ValueError naming log_std_range for anything that is not a pair."""
    with pytest.raises(ValueError, match=r"log_std_range must be a pair \(lo, hi\) of floats"):
        validate_log_std_range(log_std_range)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "log_std_range", [(float("nan"), 1.0), (0.0, float("nan")), (-float("inf"), 1.0), (0.0, float("inf"))]
)
def test_a_non_finite_log_std_bound_is_named_as_such(log_std_range: tuple[float, float]) -> None:
    """Promise: either bound being NaN or inf is rejected with the message that says the range must be finite."""
    with pytest.raises(ValueError, match="log_std_range must be finite"):
        validate_log_std_range(log_std_range)


def test_log_std_range_limits_are_inclusive_and_documented() -> None:
    """Promise: -40 <= lo < hi <= 40 is accepted (both ends included), anything wider is rejected saying so."""
    limit = DOCUMENTED_LOG_STD_LIMIT
    assert validate_log_std_range((-limit, limit)) == (-limit, limit)
    message = r"log_std_range=\(lo, hi\) needs -40 <= lo < hi <= 40, got"
    for wider in [(-limit - 0.5, 0.0), (0.0, limit + 0.5)]:
        with pytest.raises(ValueError, match=message):
            validate_log_std_range(wider)


def test_logit_bound_limit_is_inclusive_and_documented() -> None:
    """Promise: logit_bound may be any float in (0, 100], 100 included; above it is rejected saying so."""
    assert validate_logit_bound(DOCUMENTED_LOGIT_BOUND_LIMIT) == DOCUMENTED_LOGIT_BOUND_LIMIT
    with pytest.raises(ValueError, match=r"logit_bound must be None or a float in \(0, 100\], got 100.5"):
        validate_logit_bound(DOCUMENTED_LOGIT_BOUND_LIMIT + 0.5)


def test_torch_argument_validation_is_off() -> None:
    """
    Promise (stated in sb3_safe.common.maskable.distributions, "as in the other safe distributions"): the torch
    distributions are built with argument validation off whatever torch's default, so rollout passes skip its cost
    (and its host synchronisation) and no constraint error can come from float rounding.
    """
    previous = Distribution._validate_args
    Distribution.set_default_validate_args(True)
    try:
        gaussians = [
            BoundedDiagGaussianDistribution(2).proba_distribution(th.zeros(1, 2), th.zeros(2)),
            SquashedBoundedGaussianDistribution(2).proba_distribution(th.zeros(1, 2), th.zeros(2)),
            gsde(0.0, DOCUMENTED_LOG_STD_RANGE)[0],
        ]
        discrete = [
            SafeCategoricalDistribution(3).proba_distribution(th.zeros(1, 3)),
            SafeBernoulliDistribution(3).proba_distribution(th.zeros(1, 3)),
        ]
        torch_distributions = [dist.distribution for dist in gaussians + discrete]
        torch_distributions += SafeMultiCategoricalDistribution([2, 3]).proba_distribution(th.zeros(1, 5)).distribution
    finally:
        Distribution.set_default_validate_args(previous)
    assert all(torch_dist._validate_args is False for torch_dist in torch_distributions)


# ---------------------------------------------------------------------------------------- Gaussian and squashing


def test_gaussian_log_prob_floor_is_the_documented_one() -> None:
    """
    Promise: the Gaussian log-density is exact up to |z| = 1e15 and clamped beyond, at -5e29 - log_std - log sqrt(2 pi):
    every value at or beyond the limit gets exactly that floor (float64, where the floor is resolved).
    """
    values = th.tensor([1e15, -1e15, 2e15, -3e17, 1e25, -1e300], dtype=th.float64)
    log_prob = gaussian_log_prob(values, th.zeros_like(values), th.zeros_like(values))
    floor = th.tensor(DOCUMENTED_LOG_PROB_FLOOR - 0.5 * math.log(2 * math.pi), dtype=th.float64)
    assert th.equal(log_prob, floor.expand_as(values))


@settings(max_examples=200, deadline=None)
@given(st.floats(-DOCUMENTED_PRESQUASH_BOUND, DOCUMENTED_PRESQUASH_BOUND, width=32, exclude_max=True, exclude_min=True))
def test_only_presquash_values_at_the_bound_give_limit_actions(presquash: float) -> None:
    """
    Promise: squash gives the limit actions +-1 exactly when |u| >= 3, and strictly inner actions otherwise, in float32
    and float64.
    """
    for dtype in (th.float32, th.float64):
        inner = squash(th.tensor([presquash], dtype=dtype))
        assert bool((inner.abs() < 1.0).all()), (presquash, inner)
        at_bound = squash(th.tensor([-3.0, 3.0, -3.5, 3.5, -1e30, 1e30], dtype=dtype))
        assert th.equal(at_bound, th.tensor([-1.0, 1.0] * 3, dtype=dtype))


def test_limit_actions_carry_the_censored_mass_beyond_three() -> None:
    """
    Promise: each limit action of the squashed Gaussian carries the censored mass P(u >= 3) resp. P(u <= -3): exactly
    in its log-prob, and in the sampler's frequencies (statistical check, 5 sigma).
    """
    mean, log_std = th.tensor([[0.0, 1.0]]), th.zeros(2)
    dist = SquashedBoundedGaussianDistribution(1)
    for column, mean_value in enumerate(mean[0].tolist()):
        dist.proba_distribution(mean[:, column : column + 1], log_std[:1])
        upper = standard_normal_cdf(mean_value - DOCUMENTED_PRESQUASH_BOUND)
        lower = standard_normal_cdf(-DOCUMENTED_PRESQUASH_BOUND - mean_value)
        log_probs = dist.log_prob(th.tensor([[1.0], [-1.0]]))
        assert th.allclose(log_probs, th.tensor([math.log(upper), math.log(lower)]), rtol=1e-5)

        th.manual_seed(column)
        n_samples = 200_000
        dist.proba_distribution(mean[:, column : column + 1].expand(n_samples, 1), log_std[:1])
        samples = dist.sample()
        for action, mass in [(1.0, upper), (-1.0, lower)]:
            frequency = (samples == action).double().mean().item()
            assert abs(frequency - mass) <= 5.0 * math.sqrt(mass * (1 - mass) / n_samples) + 1e-6, (action, frequency)


# ----------------------------------------------------------------------------------------------------------- gSDE

log_noise_stds = st.one_of(st.sampled_from([-39.5, -30.0, -1.0, -0.5, 0.0, 0.5, 1.0, 30.0, 39.5]), st.floats(-39.5, 39.5))


@settings(max_examples=60, deadline=None)
@given(log_noise_stds, st.sampled_from([DOCUMENTED_LOG_STD_RANGE, (-40.0, 40.0), (-3.0, 5.0)]))
def test_gsde_noise_is_the_features_times_the_exploration_matrix(
    log_noise_std: float, log_std_range: tuple[float, float]
) -> None:
    """
    Promise: for features whose noise std lies within [e^-40, e^40] (what any log_std_range can express), gSDE's action
    is the mean plus SB3's state-dependent noise, the features times the exploration matrix, rescaled to the bounded
    std; the same features give the same action until the exploration matrix is resampled.
    """
    dist, mean, latent = gsde(log_noise_std, log_std_range, batch=3)
    noise_std = float(latent[0, 0])  # unit exploration std: the noise std is the feature
    bounded_std = min(max(noise_std, math.exp(log_std_range[0])), math.exp(log_std_range[1]))
    assert th.allclose(dist.distribution.stddev, th.full_like(mean, bounded_std), rtol=1e-5, atol=0.0)
    expected = mean.double() + dist.get_noise(latent).double() * (bounded_std / noise_std)
    actions = dist.sample()
    assert th.allclose(actions.double(), expected, rtol=1e-5, atol=1e-6 * bounded_std)
    assert th.equal(dist.sample(), actions)


def test_gsde_noise_at_the_largest_variance_is_still_state_dependent() -> None:
    """Promise: the usable noise variances include their upper end e^80 itself (std e^40, the top of any range)."""
    largest = math.exp(2 * DOCUMENTED_LOG_STD_LIMIT)
    first = math.sqrt(largest)
    while first * first >= largest:
        first = float(np.nextafter(first, 0.0))
    second = math.sqrt(largest - first * first)
    assert first * first + second * second == largest  # features whose float64 variance is exactly e^80
    dist = BoundedStateDependentNoiseDistribution(1, (-40.0, 40.0), full_std=True)
    dist.latent_sde_dim = 2
    log_std = th.zeros(2, 1, dtype=th.float64)
    dist.sample_weights(log_std)
    latent = th.tensor([[first, second]], dtype=th.float64)
    dist.proba_distribution(th.zeros(1, 1, dtype=th.float64), log_std, latent)
    actions = dist.sample()
    assert th.allclose(actions, dist.get_noise(latent), rtol=1e-9)
    assert th.equal(dist.sample(), actions)


@pytest.mark.parametrize("log_noise_std", [-60.0, -40.5, 40.5, 44.0])
def test_gsde_features_beyond_any_std_range_give_fresh_noise_of_the_bounded_std(log_noise_std: float) -> None:
    """
    Promise: features whose noise std lies outside [e^-40, e^40] carry no usable noise: fresh Gaussian noise of the
    bounded std is drawn at every sample (statistical check of its std, 5 sigma), never the features' own noise.
    """
    th.manual_seed(0)
    n_samples = 4000
    dist, mean, _ = gsde(log_noise_std, DOCUMENTED_LOG_STD_RANGE, batch=n_samples, action_dim=1, mean_scale=0.0)
    bounded_std = math.exp(min(max(log_noise_std, DOCUMENTED_LOG_STD_RANGE[0]), DOCUMENTED_LOG_STD_RANGE[1]))
    first, second = dist.sample(), dist.sample()
    assert not bool((first == second).any())
    noise = (first - mean).double() / bounded_std
    assert abs(noise.std().item() - 1.0) < 5.0 / math.sqrt(2 * n_samples)
    assert abs(noise.mean().item()) < 5.0 / math.sqrt(n_samples)


@pytest.mark.parametrize("learn_features", [False, True])
def test_gsde_features_get_gradients_only_when_learned(learn_features: bool) -> None:
    """Promise (SB3's learn_features): gradients reach the gSDE features only with learn_features=True."""
    dist = BoundedStateDependentNoiseDistribution(2, full_std=True, learn_features=learn_features)
    dist.latent_sde_dim = 3
    log_std = th.zeros(3, 2, requires_grad=True)
    dist.sample_weights(log_std)
    latent = th.tensor([[0.5, -1.0, 2.0]], requires_grad=True)
    dist.proba_distribution(th.zeros(1, 2), log_std, latent)
    dist.log_prob(th.tensor([[0.3, -0.7]])).sum().backward()
    if learn_features:
        assert latent.grad is not None and bool((latent.grad != 0).any())
    else:
        assert latent.grad is None
