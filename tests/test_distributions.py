"""Numerical guarantees of the safe distributions, tried on extreme inputs."""

import math

import numpy as np
import pytest
import torch as th
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sb3_safe import NonFiniteError
from sb3_safe.common.distributions import (
    DEFAULT_LOGIT_BOUND,
    INNER_LIMIT,
    PRESQUASH_BOUND,
    TANH_BOUND,
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
    log_normal_cdf,
    min_action_probability,
)
from sb3_safe.common.distributions import squash as squash_actions

HUGE = float(np.float32(1e30))
EXTREMES = [0.0, 1e-30, 1.0, PRESQUASH_BOUND, 8.66, 9.0, 20.0, 1e4, 1e10, HUGE]
# Network outputs: anything finite up to +-1e30, with the extremes drawn often
network_output = st.one_of(
    st.sampled_from([sign * value for value in EXTREMES for sign in (1.0, -1.0)]),
    st.floats(-HUGE, HUGE, width=32),
)
# The log-std parameter itself may hold anything finite: the distribution clamps it
log_std_parameter = st.one_of(st.sampled_from([-HUGE, -40.0, -20.0, 0.0, 2.0, 40.0, HUGE]), st.floats(-HUGE, HUGE, width=32))
log_std_ranges = st.one_of(
    st.just((-20.0, 2.0)),
    st.just((-40.0, 40.0)),
    st.tuples(st.floats(-40.0, 39.0), st.floats(0.5, 10.0)).map(lambda pair: (pair[0], min(pair[0] + pair[1], 40.0))),
)
ACTION_DIM = 3
BATCH = 4


def all_finite(*tensors: th.Tensor) -> bool:
    return all(bool(th.isfinite(tensor).all()) for tensor in tensors)


def gaussian_inputs(mean_values: np.ndarray, log_std_values: np.ndarray) -> tuple[th.Tensor, th.Tensor]:
    mean = th.tensor(mean_values, dtype=th.float32).reshape(BATCH, ACTION_DIM).requires_grad_()
    log_std = th.tensor(log_std_values, dtype=th.float32).requires_grad_()
    return mean, log_std


mean_arrays = arrays(np.float32, BATCH * ACTION_DIM, elements=network_output)
log_std_arrays = arrays(np.float32, ACTION_DIM, elements=log_std_parameter)


@settings(max_examples=200, deadline=None)
@given(mean_arrays, log_std_arrays, log_std_ranges, arrays(np.float32, BATCH * ACTION_DIM, elements=network_output))
def test_bounded_gaussian_finite_for_extreme_inputs(mean_values, log_std_values, log_std_range, other_actions):
    mean, log_std = gaussian_inputs(mean_values, log_std_values)
    dist = BoundedDiagGaussianDistribution(ACTION_DIM, log_std_range).proba_distribution(mean, log_std)

    std = dist.distribution.stddev
    low, high = log_std_range
    # up to the float32 rounding of the bounds themselves
    assert bool((std >= math.exp(low) * (1 - 1e-5)).all()) and bool((std <= math.exp(high) * (1 + 1e-5)).all())

    actions = dist.sample()
    evaluated = th.cat([actions, th.tensor(other_actions).reshape(BATCH, ACTION_DIM)])
    log_prob = th.cat([dist.log_prob(actions), dist.log_prob(evaluated[BATCH:])])
    entropy = dist.entropy()
    (log_prob.sum() + entropy.sum()).backward()
    assert all_finite(actions, log_prob, entropy, mean.grad, log_std.grad)


@settings(max_examples=200, deadline=None)
@given(
    mean_arrays, log_std_arrays, log_std_ranges, arrays(np.float32, BATCH * ACTION_DIM, elements=st.floats(-1, 1, width=32))
)
def test_squashed_gaussian_finite_for_extreme_inputs(mean_values, log_std_values, log_std_range, other_actions):
    mean, log_std = gaussian_inputs(mean_values, log_std_values)
    dist = SquashedBoundedGaussianDistribution(ACTION_DIM, log_std_range).proba_distribution(mean, log_std)

    actions = dist.sample()
    assert bool((actions.abs() <= 1.0).all())
    # the sample, arbitrary actions, and actions exactly at and just inside the bounds
    bounds = th.tensor([[1.0, -1.0, INNER_LIMIT], [-INNER_LIMIT, 0.0, 0.999]]).repeat(2, 1)
    evaluated = [actions, th.tensor(other_actions).reshape(BATCH, ACTION_DIM), bounds, dist.mode()]
    log_prob = th.cat([dist.log_prob(batch) for batch in evaluated])
    entropy = dist.entropy()
    (log_prob.sum() + entropy.sum()).backward()
    assert all_finite(actions, log_prob, entropy, mean.grad, log_std.grad)


LATENT_DIM = 4


@settings(max_examples=200, deadline=None)
@given(
    mean_arrays,
    arrays(np.float32, LATENT_DIM * ACTION_DIM, elements=log_std_parameter),
    arrays(np.float32, BATCH * LATENT_DIM, elements=network_output),
    log_std_ranges,
    st.booleans(),
    st.booleans(),
)
def test_gsde_finite_with_the_action_std_in_range(mean_values, log_std_values, latent_values, log_std_range, squash, expln):
    """gSDE: for any finite mean, exploration log-std and features, the action std is inside the range, and samples,
    log-probs, entropy and gradients are finite."""
    mean = th.tensor(mean_values).reshape(BATCH, ACTION_DIM).requires_grad_()
    log_std = th.tensor(log_std_values).reshape(LATENT_DIM, ACTION_DIM).requires_grad_()
    latent = th.tensor(latent_values).reshape(BATCH, LATENT_DIM)
    dist = BoundedStateDependentNoiseDistribution(
        ACTION_DIM, log_std_range, full_std=True, squash_output=squash, use_expln=expln
    )
    dist.latent_sde_dim = LATENT_DIM
    dist.sample_weights(log_std, batch_size=BATCH)
    dist.proba_distribution(mean, log_std, latent)

    std = dist.distribution.stddev
    low, high = log_std_range
    assert bool((std >= math.exp(low) * (1 - 1e-5)).all()) and bool((std <= math.exp(high) * (1 + 1e-5)).all())
    actions = dist.sample()
    log_prob = th.cat([dist.log_prob(actions), dist.log_prob(dist.mode())])
    entropy = dist.entropy()
    (log_prob.sum() + entropy.sum()).backward()
    assert all_finite(actions, log_prob, entropy, mean.grad, log_std.grad)


@pytest.mark.parametrize("squash", [True, False])
def test_the_gsde_mode_is_the_deterministic_action(squash: bool) -> None:
    """
    Promise: the deterministic action of a gSDE policy (``mode()``) is the mean of its Gaussian, squashed by tanh into
    the action bounds when the policy squashes its output (sb3-safe's squash, as the samples are), the mean itself when
    it does not.
    """
    mean = th.tensor([[-3.0, 0.5], [2.0, -0.1]])
    dist = BoundedStateDependentNoiseDistribution(2, squash_output=squash, full_std=True)
    dist.latent_sde_dim = 3
    log_std = th.zeros(3, 2)
    dist.sample_weights(log_std, batch_size=2)
    dist.proba_distribution(mean, log_std, th.ones(2, 3))
    assert th.equal(dist.mode(), squash_actions(mean) if squash else mean)


@settings(max_examples=100, deadline=None)
@given(
    st.floats(-PRESQUASH_BOUND, PRESQUASH_BOUND),
    st.floats(-3.0, 3.0),
    st.floats(-3.0, 1.0),
)
def test_squashed_log_prob_is_the_exact_density_inside_the_limits(presquash, mean_value, log_std_value):
    """Inside the limits the log-prob is the change-of-variables density, computed here in float64."""
    float32_action = float(np.float32(math.tanh(presquash) / TANH_BOUND))
    mean, log_std = th.tensor([[mean_value]]), th.tensor([log_std_value])
    dist = SquashedBoundedGaussianDistribution(1).proba_distribution(mean, log_std)
    if abs(float32_action) >= 1.0:
        return  # rounds onto the limit: covered by the censored-mass test
    rounded_presquash = math.atanh(float32_action * TANH_BOUND)
    std = math.exp(log_std_value)
    expected = (
        -0.5 * ((rounded_presquash - mean_value) / std) ** 2
        - log_std_value
        - 0.5 * math.log(2 * math.pi)
        - math.log1p(-((float32_action * TANH_BOUND) ** 2))
        + math.log(TANH_BOUND)
    )
    actual = dist.log_prob(th.tensor([[float32_action]])).item()
    assert actual == pytest.approx(expected, abs=2e-3, rel=1e-4)


@pytest.mark.parametrize("mean_value", [-30.0, -5.0, 0.0, 2.9, 3.0, 8.0, 8.66, 20.0, 1e6])
@pytest.mark.parametrize("log_std_value", [-20.0, -2.0, 0.0, 2.0])
def test_squashed_log_prob_at_the_limit_is_the_censored_mass(mean_value, log_std_value):
    """At the limit action, exp(log_prob) = P(u >= PRESQUASH_BOUND), and raising the mean raises it."""
    mean = th.tensor([[mean_value]], requires_grad=True)
    dist = SquashedBoundedGaussianDistribution(1).proba_distribution(mean, th.tensor([log_std_value]))
    log_prob = dist.log_prob(th.tensor([[1.0]]))
    z_score = (PRESQUASH_BOUND - mean_value) / math.exp(log_std_value)
    expected = th.special.log_ndtr(th.tensor(-z_score, dtype=th.float64)).item()
    assert log_prob.item() == pytest.approx(expected, rel=1e-4, abs=1e-6)
    log_prob.sum().backward()
    assert mean.grad.item() >= 0.0 and math.isfinite(mean.grad.item())


@pytest.mark.parametrize("z_score", [-1e15, -1e10, -1e6, -40.0, -5.0, 0.0, 5.0, 40.0, 1e15])
def test_log_normal_cdf_matches_float64_and_has_the_tail_gradient(z_score):
    z = th.tensor(z_score, requires_grad=True)
    value = log_normal_cdf(z)
    value.backward()
    expected = th.special.log_ndtr(th.tensor(z_score, dtype=th.float64)).item()
    assert value.item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # d/dz log Phi(z) = phi(z) / Phi(z), about -z in the left tail
    if z_score < -10:
        assert z.grad.item() == pytest.approx(-z_score, rel=1e-3)
    assert math.isfinite(z.grad.item())


logit_bounds = st.one_of(st.sampled_from([0.1, 1.0, 10.0, 100.0]), st.floats(0.01, 100.0))


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 18), arrays(np.float32, 18 * BATCH, elements=network_output), logit_bounds)
def test_safe_categorical_keeps_minimum_probability(n_actions, logit_values, bound):
    logits = th.tensor(logit_values[: n_actions * BATCH]).reshape(BATCH, n_actions).requires_grad_()
    dist = SafeCategoricalDistribution(n_actions, bound).proba_distribution(logits)
    every_action = th.arange(n_actions).repeat_interleave(BATCH)
    log_prob = dist.distribution.log_prob(every_action.reshape(n_actions, BATCH)).T
    entropy = dist.entropy()
    (log_prob.sum() + entropy.sum()).backward()
    assert all_finite(log_prob, entropy, logits.grad)
    # in log-space: the minimum underflows float32 for large bounds
    log_minimum = -math.log1p((n_actions - 1) * math.exp(2 * bound))
    assert log_prob.min().item() >= log_minimum - 1e-4 * max(1.0, abs(log_minimum))
    assert bool((entropy >= -1e-6).all())
    assert bool((dist.sample() < n_actions).all())


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, (BATCH, 2 + 3 + 4), elements=network_output), logit_bounds)
def test_safe_multicategorical_and_bernoulli_finite(logit_values, bound):
    logits = th.tensor(logit_values).requires_grad_()
    multi = SafeMultiCategoricalDistribution([2, 3, 4], bound).proba_distribution(logits)
    binary = SafeBernoulliDistribution(9, bound).proba_distribution(logits)
    log_prob = multi.log_prob(multi.sample()) + binary.log_prob(th.ones(BATCH, 9)) + binary.log_prob(th.zeros(BATCH, 9))
    entropy = multi.entropy() + binary.entropy()
    (log_prob.sum() + entropy.sum()).backward()
    assert all_finite(log_prob, entropy, logits.grad)
    # each binary outcome keeps probability >= 1 / (1 + e^bound)
    per_dim = binary.distribution.log_prob(th.zeros(BATCH, 9))
    assert per_dim.min().item() >= -math.log1p(math.exp(bound)) - 1e-4 * max(1.0, bound)


def test_min_action_probability_is_attained():
    bound = 3.0
    logits = th.tensor([[-1e6, 1e6, 1e6, 1e6]])
    dist = SafeCategoricalDistribution(4, bound).proba_distribution(logits)
    assert dist.distribution.probs[0, 0].item() == pytest.approx(min_action_probability(4, bound), rel=1e-4)


def test_default_logit_bound_barely_changes_typical_logits():
    """For |logits| <= 3 (CartPole's range) the default bound moves no probability by more than 0.02."""
    logits = th.linspace(-3, 3, 7).reshape(1, 7)
    safe = SafeCategoricalDistribution(7).proba_distribution(logits).distribution.probs
    plain = th.softmax(logits, dim=-1)
    assert th.allclose(safe, plain, atol=0.02)
    assert not th.allclose(safe, plain, atol=1e-3)  # the bound is active, not a no-op


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 18), arrays(np.float32, (2, 18 * BATCH), elements=network_output))
def test_default_logit_bound_keeps_probability_ratios_finite(n_actions, logit_values):
    """At the default bound, exp(log p_new - log p_old) of any action is finite in float32 for any two finite logits."""
    old, new = (
        SafeCategoricalDistribution(n_actions).proba_distribution(
            th.tensor(values[: n_actions * BATCH]).reshape(BATCH, n_actions)
        )
        for values in logit_values
    )
    every_action = th.arange(n_actions).repeat_interleave(BATCH).reshape(n_actions, BATCH)
    log_ratio = new.distribution.log_prob(every_action) - old.distribution.log_prob(every_action)
    assert log_ratio.abs().max().item() <= 2 * DEFAULT_LOGIT_BOUND + math.log(n_actions) + 1e-3
    assert bool(th.isfinite(th.exp(log_ratio)).all())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_network_outputs_raise_named_errors(bad):
    finite = th.zeros(2, 3)
    broken = finite.clone()
    broken[1, 2] = bad
    with pytest.raises(NonFiniteError, match="mean: "):
        BoundedDiagGaussianDistribution(3).proba_distribution(broken, th.zeros(3))
    with pytest.raises(NonFiniteError, match="log_std: "):
        SquashedBoundedGaussianDistribution(3).proba_distribution(finite, th.tensor([0.0, bad, 0.0]))
    with pytest.raises(NonFiniteError, match="logits: "):
        SafeCategoricalDistribution(3).proba_distribution(broken)
    with pytest.raises(NonFiniteError, match="logits: "):
        SafeBernoulliDistribution(3).proba_distribution(broken)


@pytest.mark.parametrize(
    "log_std_range", [(2.0, -5.0), (0.0, 0.0), (float("nan"), 2.0), (-20.0, float("inf")), (-50.0, 2.0), (1.0,), "ab"]
)
def test_invalid_log_std_range_is_rejected(log_std_range):
    with pytest.raises(ValueError, match="log_std_range"):
        BoundedDiagGaussianDistribution(2, log_std_range)


@pytest.mark.parametrize("logit_bound", [0.0, -1.0, float("nan"), float("inf"), 1000.0, "big"])
def test_invalid_logit_bound_is_rejected(logit_bound):
    with pytest.raises(ValueError, match="logit_bound"):
        SafeCategoricalDistribution(2, logit_bound)
