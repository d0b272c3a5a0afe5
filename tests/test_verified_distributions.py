"""
Verification suite: every distribution of ``sb3_safe.common.distributions`` against its own sampler.

For each family and a grid of regimes (tanh saturating in float32, huge means, stds at both ends of their range,
logits up to +-1e3, the limit actions), with fixed seeds and tolerances from sampling errors
(``distribution_checks``):

- the sampler agrees with ``log_prob`` (goodness of fit over bins, and the point masses at the squashed limits);
- the score ``d log_prob / d params`` has mean zero under the distribution's own samples (unbiased policy gradient);
- ``entropy()`` and its gradient agree with a Monte Carlo of ``-log_prob`` (reparameterized gradient for Gaussians,
  score-function gradient for discrete families) and, for the squashed Gaussian, with float64 quadrature;
- the analytic KL used by ``KLAdaptivePPO`` agrees with a Monte Carlo of ``log p - log q`` (for the squashed Gaussian
  also where the limits carry mass), with the same gradient, and is 0 with zero gradient at identical parameters.

Float32 limits the regimes (README, "Numerical guarantees"): a density is a probability only where float32 resolves
the std, i.e. std >= 1e-3 for the squashed Gaussian near its bound, and std >= ~1e4 ulps of the mean otherwise.
"""

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch as th
from distribution_checks import (
    assert_counts_fit,
    assert_mean_equals,
    assert_sampler_matches_density,
    assert_share_equals,
    population_standard_error,
)
from scipy import integrate

from sb3_safe.common.distributions import (
    PRESQUASH_BOUND,
    TANH_BOUND,
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
)
from sb3_safe.common.kl import analytic_kl, distribution_params

N_SAMPLES = 100_000
SEED = 0


@dataclass(frozen=True)
class Gaussian:
    """One continuous regime: a one-dimensional action, its pre-squash mean and log-std (before bounding)."""

    family: str  # "bounded", "squashed", "sde", "sde_squashed"
    mean: float
    log_std: float
    log_std_range: tuple[float, float] = (-20.0, 2.0)
    # gSDE only: the latent features the noise is computed from
    latent: tuple[float, ...] = (1.0, 2.0, 0.5, -1.0)

    @property
    def squashed(self) -> bool:
        return self.family in ("squashed", "sde_squashed")

    def __str__(self) -> str:
        return f"{self.family}(mean={self.mean:g}, log_std={self.log_std:g}, range={self.log_std_range})"

    def make(self, n_rows: int, device: str, mean_shift: float = 0.0, log_std_shift: float = 0.0):
        """The distribution with its parameters repeated over ``n_rows`` rows (leaves that require grad)."""
        mean = th.full((n_rows, 1), self.mean + mean_shift, device=device, requires_grad=True)
        if self.family in ("bounded", "squashed"):
            cls = SquashedBoundedGaussianDistribution if self.squashed else BoundedDiagGaussianDistribution
            log_std = th.full((n_rows, 1), self.log_std + log_std_shift, device=device, requires_grad=True)
            dist = cls(1, self.log_std_range).proba_distribution(mean, log_std)
            # The std is built from the clamped leaf as SB3 builds it (ones times its exp): the leaf's gradient is the
            # bounded log-std's inside the range, zero where the clamp is active
            dist.log_std_handle = log_std
            return dist
        dist = BoundedStateDependentNoiseDistribution(1, self.log_std_range, full_std=True, squash_output=self.squashed)
        matrix_log_std = th.full((len(self.latent), 1), self.log_std + log_std_shift, device=device, requires_grad=True)
        dist.latent_sde_dim = len(self.latent)
        # one exploration matrix per row: the rows are independent samples
        dist.sample_weights(matrix_log_std, batch_size=n_rows)
        latent = th.tensor([self.latent], device=device).repeat(n_rows, 1)
        return dist.proba_distribution(mean, matrix_log_std, latent)

    def sample(self, n_rows: int, device: str) -> th.Tensor:
        with th.no_grad():
            return self.make(n_rows, device).sample()


def log_std_handle(dist: Any) -> th.Tensor:
    """The log-std to differentiate by: the leaf given to a diagonal Gaussian, a gSDE distribution's bounded_log_std."""
    return dist.log_std_handle if hasattr(dist, "log_std_handle") else dist.bounded_log_std


BOUND = PRESQUASH_BOUND
GAUSSIANS = [
    Gaussian("bounded", 0.0, 0.0),
    Gaussian("bounded", 0.0, -20.0),  # the smallest std: float32 resolves it around 0
    Gaussian("bounded", 3.0, math.log(0.05)),
    Gaussian("bounded", 10.0, 2.0),
    Gaussian("bounded", -25.0, 0.0),
    Gaussian("bounded", 1e4, 0.0),
    Gaussian("bounded", 0.5, 30.0),  # log-std parameter beyond the range: the std is exp(2)
    Gaussian("bounded", 0.5, -30.0, (-3.0, 1.0)),  # below the range: exp(-3)
    Gaussian("squashed", 0.0, 0.0),
    Gaussian("squashed", 0.0, -20.0),
    Gaussian("squashed", 0.0, 2.0),  # wide: both limits carry mass
    Gaussian("squashed", 2.9, math.log(0.1)),  # close to the bound: density and limit
    Gaussian("squashed", BOUND, math.log(1e-3)),  # half of it on the limit, at the smallest std float32 resolves
    Gaussian("squashed", 8.5, math.log(0.1)),  # float32 tanh saturating: all on the limit
    Gaussian("squashed", 8.56, math.log(0.05)),
    Gaussian("squashed", 10.0, 0.0),
    Gaussian("squashed", 12.0, 0.0),
    Gaussian("squashed", -25.0, 0.0),
    Gaussian("squashed", 1e4, -20.0),
    Gaussian("squashed", -1e4, 2.0),
    Gaussian("sde", 0.0, -1.0),
    Gaussian("sde", 3.0, -1.0, (-1.0, 0.0), latent=(1e3, 1e3, 1e3, 1e3)),  # noise std 2e3 bounded to exp(0)
    Gaussian("sde", -2.0, -1.0, (-1.0, 0.0), latent=(0.0, 0.0, 0.0, 0.0)),  # no noise from features: exp(-1)
    Gaussian("sde", 1e4, 0.0, latent=(3.0, 0.0, 0.0, 4.0)),
    Gaussian("sde_squashed", 0.0, -1.0),
    Gaussian("sde_squashed", 2.9, math.log(0.05), latent=(1.0, 0.0, 0.0, 0.0)),
    Gaussian("sde_squashed", 8.5, -1.0),
]


@pytest.fixture(params=GAUSSIANS, ids=str)
def gaussian(request) -> Gaussian:
    return request.param


def test_sampler_matches_log_prob(gaussian: Gaussian, device: str) -> None:
    th.manual_seed(SEED)
    samples, pilot = gaussian.sample(N_SAMPLES, device), gaussian.sample(N_SAMPLES // 5, device)
    with th.no_grad():
        dist = gaussian.make(1, device)
        atoms = {limit: dist.log_prob(th.tensor([[limit]], device=device)).item() for limit in (-1.0, 1.0)}

        def log_prob(points: th.Tensor) -> th.Tensor:
            return gaussian.make(len(points), device).log_prob(points)

        assert bool(th.isfinite(samples).all())
        assert_sampler_matches_density(samples, pilot, log_prob, atoms if gaussian.squashed else {}, str(gaussian))
    if gaussian.squashed:
        for limit, log_prob_value in atoms.items():
            assert_share_equals(samples == limit, math.exp(log_prob_value), f"{gaussian}: share on the limit {limit}")


def gradients(output: th.Tensor, inputs: list[th.Tensor], retain_graph: bool = False) -> th.Tensor:
    """Gradients of ``output`` for each input, side by side (zeros for an input it does not use)."""
    grads = th.autograd.grad(output, inputs, retain_graph=retain_graph, allow_unused=True)
    return th.cat([th.zeros_like(x) if g is None else g for g, x in zip(grads, inputs, strict=True)], dim=1)


def score_scale(dist) -> float:
    """Size of a score: 1 / std for the mean, 1 for the log-std."""
    return max(1.0, 1.0 / dist.distribution.stddev.min().item())


def test_score_has_mean_zero(gaussian: Gaussian, device: str) -> None:
    th.manual_seed(SEED)
    samples = gaussian.sample(N_SAMPLES, device)
    dist = gaussian.make(N_SAMPLES, device)
    scores = th.autograd.grad(dist.log_prob(samples).sum(), [dist.distribution.loc, log_std_handle(dist)])
    assert all(bool(th.isfinite(score).all()) for score in scores)
    assert_mean_equals(th.cat(scores, dim=1), 0.0, f"{gaussian}: score (mean, log-std)", score_scale(dist))


def squashed_entropy_reference(mean: float, std: float) -> tuple[float, float, float]:
    """Entropy of tanh(u) / tanh(bound), u ~ N(mean, std), and its derivatives in mean and log-std, by quadrature."""

    def expect(function) -> float:
        return integrate.quad(lambda eps: function(mean + std * eps, eps) * math.exp(-0.5 * eps**2), -40, 40, limit=400)[
            0
        ] / math.sqrt(2 * math.pi)

    log_jacobian = expect(lambda u, eps: 2 * (math.log(2) - u - np.logaddexp(0.0, -2 * u)))
    value = math.log(std) + 0.5 * math.log(2 * math.pi * math.e) + log_jacobian - math.log(TANH_BOUND)
    return value, expect(lambda u, eps: -2 * math.tanh(u)), 1 + expect(lambda u, eps: -2 * math.tanh(u) * std * eps)


def test_entropy_and_its_gradient(gaussian: Gaussian, device: str) -> None:
    th.manual_seed(SEED)
    dist = gaussian.make(N_SAMPLES, device)
    params = [dist.distribution.loc, log_std_handle(dist)]
    entropy = dist.entropy()
    entropy_gradients = gradients(entropy.sum(), params, retain_graph=True)
    # Monte Carlo of -log_prob at reparameterized samples
    with th.no_grad():
        limits = [dist.log_prob(th.tensor([[limit]], device=device))[0].exp().item() for limit in (-1.0, 1.0)]
    presquash = dist.distribution.rsample()
    actions = th.tanh(presquash) / TANH_BOUND if gaussian.squashed else presquash
    negative_log_prob = -dist.log_prob(actions)
    mc_gradients = gradients(negative_log_prob.sum(), params)
    if gaussian.squashed:
        std = dist.distribution.stddev[0, 0].item()
        value, mean_gradient, log_std_gradient = squashed_entropy_reference(dist.distribution.loc[0, 0].item(), std)
        if gaussian.log_std < gaussian.log_std_range[0] or gaussian.log_std > gaussian.log_std_range[1]:
            log_std_gradient = 0.0  # the clamp is active
        assert_mean_equals(entropy, value, f"{gaussian}: entropy vs quadrature")
        assert_mean_equals(entropy_gradients, th.tensor([mean_gradient, log_std_gradient]), f"{gaussian}: entropy gradient")
    if not gaussian.squashed or sum(limits) * N_SAMPLES < 1e-3:  # the limits carry no mass: -log_prob is the entropy
        assert_mean_equals(negative_log_prob, entropy.mean(), f"{gaussian}: entropy vs -log_prob")
        assert_mean_equals(mc_gradients - entropy_gradients, 0.0, f"{gaussian}: entropy gradient vs -log_prob's")


KL_PAIRS = [
    (Gaussian("bounded", 0.0, 0.0), 0.5, -0.3),
    (Gaussian("bounded", 3.0, math.log(0.05)), 0.02, 0.2),
    (Gaussian("bounded", 1e4, 0.0), 1.0, 0.5),
    (Gaussian("squashed", 0.0, math.log(0.5)), 0.3, -0.2),
    (Gaussian("squashed", -1.0, 0.0), 0.5, 0.3),  # the limits carry some mass
    (Gaussian("squashed", 8.5, math.log(0.1)), -0.1, 0.2),  # all on the limit: the actions' KL is about 0
]


@pytest.mark.parametrize("regime, mean_shift, log_std_shift", KL_PAIRS, ids=[str(pair[0]) for pair in KL_PAIRS])
def test_analytic_kl_matches_monte_carlo(regime: Gaussian, mean_shift: float, log_std_shift: float, device: str) -> None:
    th.manual_seed(SEED)
    samples = regime.sample(N_SAMPLES, device)
    with th.no_grad():
        old = regime.make(N_SAMPLES, device)
        old_params, old_log_prob = distribution_params(old), old.log_prob(samples)
    new = regime.make(N_SAMPLES, device, mean_shift, log_std_shift)
    new_params = [new.distribution.loc, log_std_handle(new)]
    kl = analytic_kl(old_params, new)
    kl_gradients = th.cat(th.autograd.grad(kl.sum(), new_params, retain_graph=True), dim=1)
    new_log_prob = new.log_prob(samples)
    mc_gradients = -th.cat(th.autograd.grad(new_log_prob.sum(), new_params), dim=1)
    monte_carlo = old_log_prob - new_log_prob.detach()
    # the squashed Gaussian's too where the limits carry mass: the KL of the clipped Gaussians, which clipping makes
    # smaller than the pre-squash Gaussians'
    assert_mean_equals(monte_carlo, kl.mean(), f"{regime}: KL vs Monte Carlo")
    assert_mean_equals(mc_gradients - kl_gradients, 0.0, f"{regime}: KL gradient vs Monte Carlo")


@pytest.mark.parametrize("regime", [pair[0] for pair in KL_PAIRS], ids=str)
def test_kl_of_identical_parameters_is_zero_with_zero_gradient(regime: Gaussian, device: str) -> None:
    with th.no_grad():
        old_params = distribution_params(regime.make(8, device))
    new = regime.make(8, device)
    kl = analytic_kl(old_params, new)
    gradients = th.autograd.grad(kl.sum(), [new.distribution.loc, log_std_handle(new)])
    assert bool((kl == 0).all()) and all(bool((gradient == 0).all()) for gradient in gradients)


@dataclass(frozen=True)
class Discrete:
    """One discrete regime: a family and its raw network output (one row)."""

    family: str  # "categorical", "multicategorical", "bernoulli"
    logits: tuple[float, ...]
    logit_bound: float | None = 10.0
    action_dims: tuple[int, ...] = ()

    def __str__(self) -> str:
        shown = self.logits if len(self.logits) <= 6 else f"{len(self.logits)} logits"
        return f"{self.family}({shown}, bound={self.logit_bound})"

    def make(self, n_rows: int, device: str, shift: float = 0.0):
        logits = th.tensor([self.logits], device=device).repeat(n_rows, 1) + shift
        logits.requires_grad_()
        if self.family == "categorical":
            dist = SafeCategoricalDistribution(len(self.logits), self.logit_bound)
        elif self.family == "multicategorical":
            dist = SafeMultiCategoricalDistribution(list(self.action_dims), self.logit_bound)
        else:
            dist = SafeBernoulliDistribution(len(self.logits), self.logit_bound)
        return dist.proba_distribution(logits), logits

    def support(self, device: str) -> th.Tensor:
        """Every action, one per row."""
        if self.family == "categorical":
            return th.arange(len(self.logits), device=device, dtype=th.float32)
        sizes = self.action_dims if self.family == "multicategorical" else (2,) * len(self.logits)
        return th.tensor(list(itertools.product(*(range(size) for size in sizes))), device=device, dtype=th.float32)


_RANDOM_LOGITS = tuple(float(value) for value in np.random.default_rng(0).normal(scale=300.0, size=200))
DISCRETES = [
    Discrete("categorical", (0.0, 0.0, 0.0)),
    Discrete("categorical", (1e3, -1e3, 0.0)),  # bounded: the unlikely actions keep their minimum probability
    Discrete("categorical", (5.0, 4.0, -3.0), None),
    Discrete("categorical", _RANDOM_LOGITS),  # 200 actions, logits up to +-1e3
    Discrete("multicategorical", (1e3, 0.0, -1e3, 2.0, -2.0), action_dims=(3, 2)),
    Discrete("bernoulli", (1e3, -1e3, 0.5)),
    Discrete("bernoulli", (3.0, -1.0), None),
]


@pytest.fixture(params=DISCRETES, ids=str)
def discrete(request) -> Discrete:
    return request.param


def support_statistics(discrete: Discrete, device: str):
    """Every action, its probability and its score (one row per action)."""
    support = discrete.support(device)
    dist, logits = discrete.make(len(support), device)
    log_prob = dist.log_prob(support)
    scores = th.autograd.grad(log_prob.sum(), logits)[0]
    return support, log_prob.detach(), scores


def observed_counts(discrete: Discrete, samples: th.Tensor, support: th.Tensor) -> np.ndarray:
    if discrete.family == "categorical":
        return th.bincount(samples.long(), minlength=len(support)).cpu().numpy()
    codes = {tuple(action): index for index, action in enumerate(support.long().tolist())}
    return np.bincount([codes[tuple(action)] for action in samples.long().tolist()], minlength=len(support))


def test_discrete_sampler_matches_log_prob(discrete: Discrete, device: str) -> None:
    th.manual_seed(SEED)
    with th.no_grad():
        samples = discrete.make(N_SAMPLES, device)[0].sample()
    support, log_prob, _ = support_statistics(discrete, device)
    assert_counts_fit(observed_counts(discrete, samples, support), log_prob.exp().double().cpu().numpy(), str(discrete))


def test_discrete_score_has_mean_zero(discrete: Discrete, device: str) -> None:
    th.manual_seed(SEED)
    dist, logits = discrete.make(N_SAMPLES, device)
    samples = dist.sample()
    scores = th.autograd.grad(dist.log_prob(samples).sum(), logits)[0]
    assert bool(th.isfinite(scores).all())
    _, log_prob, support_scores = support_statistics(discrete, device)
    standard_error = population_standard_error(support_scores, log_prob.exp(), N_SAMPLES)
    assert_mean_equals(scores, 0.0, f"{discrete}: score", standard_error=standard_error)


def test_discrete_entropy_and_its_gradient(discrete: Discrete, device: str) -> None:
    th.manual_seed(SEED)
    dist, logits = discrete.make(N_SAMPLES, device)
    entropy = dist.entropy()
    entropy_gradient = th.autograd.grad(entropy.sum(), logits, retain_graph=True)[0]
    samples = dist.sample()
    log_prob = dist.log_prob(samples)
    scores = th.autograd.grad(log_prob.sum(), logits)[0]
    _, support_log_prob, support_scores = support_statistics(discrete, device)
    probabilities = support_log_prob.exp()
    entropy_error = population_standard_error(-support_log_prob[:, None], probabilities, N_SAMPLES)
    assert_mean_equals(-log_prob, entropy.mean(), f"{discrete}: entropy vs -log_prob", standard_error=entropy_error)
    # score-function gradient of E[-log p]: -E[(1 + log p) d log p]
    mc_gradient = -(1 + log_prob.detach())[:, None] * scores
    gradient_error = population_standard_error(-(1 + support_log_prob)[:, None] * support_scores, probabilities, N_SAMPLES)
    assert_mean_equals(
        mc_gradient, entropy_gradient.mean(dim=0), f"{discrete}: entropy gradient", standard_error=gradient_error
    )


def test_discrete_kl_matches_monte_carlo(discrete: Discrete, device: str) -> None:
    th.manual_seed(SEED)
    perturbation = th.linspace(-1.0, 1.0, len(discrete.logits), device=device)

    def moved(n_rows: int):
        """The distribution after a fixed perturbation of the logits, and the logits (leaves)."""
        dist, logits = discrete.make(n_rows, device)
        return dist.proba_distribution(logits + perturbation), logits

    with th.no_grad():
        old = discrete.make(N_SAMPLES, device)[0]
        samples, old_params = old.sample(), distribution_params(old)
        old_log_prob = old.log_prob(samples)
    new, logits = moved(N_SAMPLES)
    kl = analytic_kl(old_params, new)
    kl_gradient = th.autograd.grad(kl.sum(), logits, retain_graph=True)[0]
    new_log_prob = new.log_prob(samples)
    mc_gradient = -th.autograd.grad(new_log_prob.sum(), logits)[0]
    # exact standard errors, from every action's log-probs and scores under both distributions
    support, support_old_log_prob, _ = support_statistics(discrete, device)
    support_new, support_logits = moved(len(support))
    support_new_log_prob = support_new.log_prob(support)
    support_new_scores = th.autograd.grad(support_new_log_prob.sum(), support_logits)[0]
    probabilities = support_old_log_prob.exp()
    kl_error = population_standard_error(
        (support_old_log_prob - support_new_log_prob.detach())[:, None], probabilities, N_SAMPLES
    )
    gradient_error = population_standard_error(-support_new_scores, probabilities, N_SAMPLES)
    assert_mean_equals(
        old_log_prob - new_log_prob.detach(), kl.mean(), f"{discrete}: KL vs Monte Carlo", standard_error=kl_error
    )
    assert_mean_equals(
        mc_gradient, kl_gradient.mean(dim=0), f"{discrete}: KL gradient vs Monte Carlo", standard_error=gradient_error
    )
    # identical parameters: zero, with zero gradient up to float32 rounding of the normalized probabilities
    same, same_logits = discrete.make(8, device)
    zero = analytic_kl(old_params[:8], same)
    zero_gradient = th.autograd.grad(zero.sum(), same_logits)[0]
    assert bool((zero == 0).all()) and bool((zero_gradient.abs() <= 4 * th.finfo(th.float32).eps).all())
