"""
The four failures a review measured on sb3-safe 1abf277 (issue "Verified distributions"), one test each: every test
here failed there and passes now. They use only public names that existed then.
"""

import math

import numpy as np
import pytest
import torch as th
from distribution_checks import assert_mean_equals, assert_share_equals
from sb3_contrib import TRPO
from scipy import integrate
from stable_baselines3 import A2C, PPO

from sb3_safe import NonFiniteError, SafeMlpPolicy
from sb3_safe.common.distributions import SquashedBoundedGaussianDistribution

N_SAMPLES = 100_000
#: largest float32 below 1: a squashed action at or beyond it is a limit action (then and now)
LARGEST_INNER_ACTION = float(np.nextafter(np.float32(1.0), np.float32(0.0)))


def squashed(mean: float, std: float, n_rows: int) -> tuple[SquashedBoundedGaussianDistribution, th.Tensor]:
    mean_tensor = th.full((n_rows, 1), mean, requires_grad=True)
    dist = SquashedBoundedGaussianDistribution(1).proba_distribution(mean_tensor, th.full((1,), math.log(std)))
    return dist, mean_tensor


@pytest.mark.parametrize("mean, std", [(8.56, 0.05), (8.5, 0.1)])
def test_saturated_squashed_gaussian_puts_on_the_limit_the_mass_its_log_prob_gives_it(mean, std):
    """Then: 97.5 % of the samples on the limit, exp(log_prob(limit)) = 0.0185 (65 % vs 0.050)."""
    th.manual_seed(0)
    dist, _ = squashed(mean, std, N_SAMPLES)
    with th.no_grad():
        samples = dist.sample()
        limit_probability = dist.log_prob(th.ones(1, 1))[0].exp().item()
    assert_share_equals(samples >= LARGEST_INNER_ACTION, limit_probability, "share of samples on the upper limit")


def test_saturated_squashed_gaussian_score_has_mean_zero():
    """Then: the score d log p / d mean averaged over the policy's own samples was ~7 (mean 8.5, std 0.1)."""
    th.manual_seed(0)
    dist, mean = squashed(8.5, 0.1, N_SAMPLES)
    samples = dist.sample().detach()
    scores = th.autograd.grad(dist.log_prob(samples).sum(), mean)[0]
    assert_mean_equals(scores, 0.0, "score in the mean", scale=1 / 0.1)


def test_saturated_squashed_entropy_gradient_pulls_the_mean_back():
    """Then: at mean 10, std 1 the entropy estimate's gradient in the mean was ~-0.3 instead of E[-2 tanh(u)] ~ -2."""
    th.manual_seed(0)
    dist, mean = squashed(10.0, 1.0, N_SAMPLES)
    gradient = th.autograd.grad(dist.entropy().sum(), mean)[0]
    expected = integrate.quad(lambda eps: -2 * math.tanh(10.0 + eps) * math.exp(-0.5 * eps**2), -40, 40)[0]
    assert_mean_equals(gradient, expected / math.sqrt(2 * math.pi), "entropy gradient in the mean")


def test_gsde_nan_weights_raise_nonfinite_error():
    """Then: torch's `Expected parameter loc ...` ValueError, the error the package says it replaces."""
    model = PPO(SafeMlpPolicy, "Pendulum-v1", use_sde=True, n_steps=64, batch_size=32)
    with th.no_grad():
        model.policy.action_net.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="policy output mean"):
        model.policy.predict(np.zeros(3, dtype=np.float32))


def test_gsde_action_std_is_inside_log_std_range():
    """Then: log_std_range=(-1, 0) with ReLU features gave an action std of 4.7e3."""
    model = PPO(
        SafeMlpPolicy,
        "Pendulum-v1",
        use_sde=True,
        n_steps=64,
        batch_size=32,
        seed=0,
        policy_kwargs=dict(log_std_range=(-1.0, 0.0), activation_fn=th.nn.ReLU),
    )
    observations = th.as_tensor(np.random.default_rng(0).uniform(-1e3, 1e3, size=(256, 3)), dtype=th.float32)
    with th.no_grad():
        std = model.policy.get_distribution(observations).distribution.stddev
    assert math.exp(-1.0) * (1 - 1e-6) <= std.min().item() and std.max().item() <= 1.0 + 1e-6


def test_log_std_projection_survives_optimizer_replacement():
    """Then: the projection hook lived on the optimizer built in _build; a replaced optimizer left the log-std at 50."""
    model = A2C(SafeMlpPolicy, "Pendulum-v1", seed=0, policy_kwargs=dict(log_std_range=(-5.0, 1.0)))
    policy = model.policy
    policy.optimizer = th.optim.SGD(policy.parameters(), lr=1.0)
    policy.optimizer.zero_grad()
    policy.log_std.grad = th.full_like(policy.log_std, -50.0)
    policy.optimizer.step()
    assert bool((policy.log_std <= 1.0).all())
    # and in training, with an optimizer replaced like sb3-contrib's recurrent policy does
    model = A2C(
        SafeMlpPolicy, "Pendulum-v1", learning_rate=3.0, n_steps=5, seed=0, policy_kwargs=dict(log_std_range=(-5.0, 1.0))
    )
    model.policy.optimizer = th.optim.RMSprop(model.policy.parameters(), lr=3.0)
    model.learn(500)
    assert bool(((model.policy.log_std >= -5.0) & (model.policy.log_std <= 1.0)).all())


def test_trpo_line_search_evaluates_projected_log_std():
    """Then: TRPO's line search set the parameters directly and evaluated them with the log-std out of range."""
    model = TRPO(
        SafeMlpPolicy,
        "Pendulum-v1",
        n_steps=256,
        batch_size=128,
        seed=0,
        policy_kwargs=dict(log_std_range=(-0.5, -0.49), log_std_init=-0.495),
    )
    seen = []
    get_distribution = model.policy.get_distribution

    def recording(observations):
        distribution = get_distribution(observations)
        seen.append(model.policy.log_std.detach().clone())
        return distribution

    model.policy.get_distribution = recording
    model.learn(512)
    assert len(seen) > 2
    assert all(bool(((log_std >= -0.5) & (log_std <= -0.49)).all()) for log_std in seen)
