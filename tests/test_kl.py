"""Analytic KL(pi_old || pi) of sb3_safe.common.kl: exactness, agreement with torch and Monte Carlo, finiteness."""

import math
from typing import Any

import numpy as np
import pytest
import torch as th
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.distributions import DiagGaussianDistribution, Distribution, StateDependentNoiseDistribution
from torch.distributions import Bernoulli, Categorical, Independent, kl_divergence

from sb3_safe.common.distributions import (
    BoundedDiagGaussianDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
)
from sb3_safe.common.kl import (
    LOG_RATIO_LIMIT,
    analytic_kl,
    approx_kl,
    categorical_kl,
    distribution_params,
    gaussian_kl,
    has_analytic_kl,
)

BATCH = 4
ACTION_DIM = 3
NVEC = [3, 2, 4]
N_MC = 200_000


def make_pair(family: str, generator: th.Generator, scale: float = 1.0) -> list[Any]:
    """Two distributions of ``family`` with random parameters, as the policy builds them (old, new)."""

    def params(width: int) -> th.Tensor:
        return scale * th.randn(BATCH, width, generator=generator)

    pair: list[Any] = []
    for _ in range(2):
        dist: Distribution
        if family == "gaussian":
            dist = BoundedDiagGaussianDistribution(ACTION_DIM).proba_distribution(params(ACTION_DIM), 0.5 * params(ACTION_DIM))
        elif family == "sb3_gaussian":
            dist = DiagGaussianDistribution(ACTION_DIM).proba_distribution(params(ACTION_DIM), 0.5 * params(ACTION_DIM))
        elif family == "squashed":
            # means and stds small enough that tanh rarely saturates, so the MC estimate sees the density
            dist = SquashedBoundedGaussianDistribution(ACTION_DIM).proba_distribution(
                0.5 * params(ACTION_DIM), -1.0 + 0.3 * params(ACTION_DIM)
            )
        elif family == "categorical":
            dist = SafeCategoricalDistribution(5).proba_distribution(params(5))
        elif family == "multicategorical":
            dist = SafeMultiCategoricalDistribution(NVEC).proba_distribution(params(sum(NVEC)))
        else:
            dist = SafeBernoulliDistribution(ACTION_DIM).proba_distribution(params(ACTION_DIM))
        pair.append(dist)
    return pair


FAMILIES = ["gaussian", "sb3_gaussian", "squashed", "categorical", "multicategorical", "bernoulli"]


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_matches_monte_carlo(family: str) -> None:
    generator = th.Generator().manual_seed(0)
    old, new = make_pair(family, generator)
    kl = analytic_kl(distribution_params(old), new)
    # the same distributions on the batch tiled N_MC times: one draw from each copy of old
    old_rep, new_rep = make_pair(family, th.Generator().manual_seed(0))
    for dist, source in ((old_rep, old), (new_rep, new)):
        _repeat_parameters(dist, source, N_MC)
    th.manual_seed(1)
    flat = old_rep.sample()
    log_ratio = (old_rep.log_prob(flat) - new_rep.log_prob(flat)).reshape(N_MC, BATCH)
    monte_carlo = log_ratio.mean(dim=0)
    standard_error = log_ratio.std(dim=0) / math.sqrt(N_MC)
    assert th.all((kl - monte_carlo).abs() <= 5 * standard_error + 1e-4), (kl, monte_carlo, standard_error)
    assert th.all(kl > 0)


def _repeat_parameters(dist, source, repeats: int) -> None:
    """Rebuild ``dist`` with the parameters of ``source`` tiled ``repeats`` times along the batch."""
    if isinstance(source, DiagGaussianDistribution):
        log_std = (
            source.bounded_log_std if isinstance(source, BoundedDiagGaussianDistribution) else source.distribution.scale.log()
        )
        dist.proba_distribution(source.distribution.mean.repeat(repeats, 1), log_std.repeat(repeats, 1))
    elif isinstance(source, SafeMultiCategoricalDistribution):
        logits = th.cat([split.logits for split in source.distribution], dim=1)
        dist.distribution = [Categorical(logits=split) for split in th.split(logits.repeat(repeats, 1), NVEC, dim=1)]
    elif isinstance(source, SafeCategoricalDistribution):
        dist.distribution = Categorical(logits=source.distribution.logits.repeat(repeats, 1))
    else:
        dist.distribution = Bernoulli(logits=source.distribution.logits.repeat(repeats, 1))


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_of_identical_distributions_is_zero(family: str) -> None:
    old, _ = make_pair(family, th.Generator().manual_seed(2), scale=3.0)
    assert th.equal(analytic_kl(distribution_params(old), old), th.zeros(BATCH))


@pytest.mark.parametrize("family", FAMILIES)
def test_kl_matches_torch(family: str) -> None:
    old, new = make_pair(family, th.Generator().manual_seed(3), scale=2.0)
    if family == "multicategorical":
        expected = sum(kl_divergence(p, q) for p, q in zip(old.distribution, new.distribution, strict=True))
    elif family in ("gaussian", "sb3_gaussian", "squashed"):
        # the squashed one: KL of the pre-squash Gaussians, which is the KL of the squashed distributions
        expected = kl_divergence(Independent(old.distribution, 1), Independent(new.distribution, 1))
    elif family == "categorical":
        expected = kl_divergence(old.distribution, new.distribution)
    else:
        expected = kl_divergence(old.distribution, new.distribution).sum(dim=1)
    th.testing.assert_close(analytic_kl(distribution_params(old), new), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_batchmean_is_the_mean_of_the_per_sample_kls_with_the_same_gradient(family: str) -> None:
    # The training loss takes the fused batch mean; it must be the per-sample KLs' mean, value and gradient
    generator = th.Generator().manual_seed(4)
    old, _ = make_pair(family, generator, scale=2.0)
    raw = (2.0 * th.randn(BATCH, 2 * sum(NVEC), generator=generator)).requires_grad_(True)
    results = []
    for reduction in ("none", "batchmean"):
        new = make_pair(family, generator)[1]
        _rebuild_from(new, raw)
        kl = analytic_kl(distribution_params(old), new, reduction=reduction)
        mean = kl.mean() if reduction == "none" else kl
        (gradient,) = th.autograd.grad(mean, raw)
        results.append((mean, gradient))
    (mean_none, gradient_none), (mean_fused, gradient_fused) = results
    assert mean_fused.shape == () and mean_none > 0
    th.testing.assert_close(mean_fused, mean_none, rtol=1e-6, atol=0)
    assert gradient_none.abs().sum() > 0
    th.testing.assert_close(gradient_fused, gradient_none, rtol=1e-5, atol=1e-7)


def _rebuild_from(dist: Any, raw: th.Tensor) -> None:
    """Give ``dist`` parameters taken from the columns of ``raw`` (differentiable)."""
    if isinstance(dist, DiagGaussianDistribution):
        dist.proba_distribution(raw[:, :ACTION_DIM], 0.5 * raw[:, ACTION_DIM : 2 * ACTION_DIM])
    elif isinstance(dist, SafeCategoricalDistribution):
        dist.proba_distribution(raw[:, :5])
    elif isinstance(dist, SafeMultiCategoricalDistribution):
        dist.proba_distribution(raw[:, : sum(NVEC)])
    else:
        dist.proba_distribution(raw[:, :ACTION_DIM])


def test_unknown_reduction_is_refused() -> None:
    old, new = make_pair("gaussian", th.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="reduction must be 'none' or 'batchmean', got 'mean'"):
        analytic_kl(distribution_params(old), new, reduction="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reduction"):
        categorical_kl(th.zeros(2, 3), th.zeros(2, 3), reduction="sum")  # type: ignore[arg-type]


def test_gsde_has_no_analytic_kl() -> None:
    dist = StateDependentNoiseDistribution(ACTION_DIM)
    assert not has_analytic_kl(dist)
    with pytest.raises(ValueError, match="approx_kl"):
        distribution_params(dist)


def test_gaussian_kl_is_accurate_for_close_distributions() -> None:
    # d = 1e-4: KL = (expm1(2d) - 2d) / 2 ~ d^2, which exp(2d) - 1 - 2d in float32 would lose to rounding
    kl = gaussian_kl(th.zeros(1), th.tensor([1e-4]), th.zeros(1), th.zeros(1))
    assert kl.item() == pytest.approx(1e-8, rel=1e-3)


@pytest.mark.parametrize("broadcast_log_std", [False, True])
def test_gaussian_kl_gradient_is_exact(broadcast_log_std: bool) -> None:
    # The hand-written backward against finite differences, and against autograd through torch's own KL
    generator = th.Generator().manual_seed(0)
    shapes = [(BATCH, ACTION_DIM)] * 4
    if broadcast_log_std:  # a state-independent log-std, as SB3's policies have
        shapes[3] = (ACTION_DIM,)
    args = [th.randn(*shape, generator=generator, dtype=th.float64).requires_grad_(True) for shape in shapes]
    assert th.autograd.gradcheck(gaussian_kl, args)
    assert th.autograd.gradcheck(lambda *inputs: gaussian_kl(*inputs, reduction="batchmean"), args)

    weights = th.rand(BATCH, ACTION_DIM, generator=generator, dtype=th.float64)
    ours = th.autograd.grad((weights * gaussian_kl(*args)).sum(), args)
    mean_p, log_std_p, mean_q, log_std_q = args
    reference = kl_divergence(
        th.distributions.Normal(mean_p, log_std_p.exp()), th.distributions.Normal(mean_q, log_std_q.exp())
    )
    expected = th.autograd.grad((weights * reference).sum(), args)
    for got, want in zip(ours, expected, strict=True):
        assert got.shape == want.shape and th.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_categorical_kl_gradient_is_exact() -> None:
    generator = th.Generator().manual_seed(0)
    logits = [th.randn(BATCH, 5, generator=generator, dtype=th.float64).requires_grad_(True) for _ in range(2)]

    def kl_of_logits(logits_p: th.Tensor, logits_q: th.Tensor) -> th.Tensor:
        return categorical_kl(th.log_softmax(logits_p, -1), th.log_softmax(logits_q, -1))

    assert th.autograd.gradcheck(kl_of_logits, logits)
    ours = th.autograd.grad(kl_of_logits(*logits).sum(), logits)
    reference = kl_divergence(Categorical(logits=logits[0]), Categorical(logits=logits[1]))
    expected = th.autograd.grad(reference.sum(), logits)
    for got, want in zip(ours, expected, strict=True):
        assert th.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_categorical_kl_of_impossible_actions_is_finite() -> None:
    # SB3's unbounded logits can give log-probabilities of -inf: p = 0 terms count 0, q = 0 terms stay finite
    log_p = th.tensor([[0.0, -math.inf], [-math.log(2), -math.log(2)]])
    log_q = th.tensor([[-math.inf, 0.0], [0.0, -math.inf]], requires_grad=True)
    kl = categorical_kl(log_p, log_q)
    kl.sum().backward()
    assert th.isfinite(kl).all() and log_q.grad is not None and th.isfinite(log_q.grad).all()


extreme_floats = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    values=st.lists(extreme_floats, min_size=2 * 2 * sum(NVEC), max_size=2 * 2 * sum(NVEC)),
)
def test_kl_finite_non_negative_with_finite_gradients_for_extreme_parameters(family: str, values: list[float]) -> None:
    raw = th.tensor(values, dtype=th.float32).reshape(2, 2, sum(NVEC))  # (old/new, batch of 2, width)
    new_raw = raw[1].clone().requires_grad_(True)
    old: Distribution
    new: Distribution
    if family in ("gaussian", "sb3_gaussian", "squashed"):
        cls = {
            "gaussian": BoundedDiagGaussianDistribution,
            "sb3_gaussian": DiagGaussianDistribution,
            "squashed": SquashedBoundedGaussianDistribution,
        }[family]
        # SB3's own Gaussian has no bound, and the KL reaches its log-std through log(std), whose gradient divides by
        # the std: a z-score of 1e15 (where our clamp starts) then overflows for std < exp(-8). Its gradients are
        # finite for moderate log-stds; the bounded distributions' for any parameter.
        log_std_limit = 5.0 if family == "sb3_gaussian" else 1e30
        old = cls(ACTION_DIM).proba_distribution(
            raw[0, :, :ACTION_DIM], raw[0, :, ACTION_DIM : 2 * ACTION_DIM].clamp(-log_std_limit, log_std_limit)
        )
        new = cls(ACTION_DIM).proba_distribution(
            new_raw[:, :ACTION_DIM], new_raw[:, ACTION_DIM : 2 * ACTION_DIM].clamp(-log_std_limit, log_std_limit)
        )
    elif family == "categorical":
        old = SafeCategoricalDistribution(5).proba_distribution(raw[0, :, :5])
        new = SafeCategoricalDistribution(5).proba_distribution(new_raw[:, :5])
    elif family == "multicategorical":
        old = SafeMultiCategoricalDistribution(NVEC).proba_distribution(raw[0])
        new = SafeMultiCategoricalDistribution(NVEC).proba_distribution(new_raw)
    else:
        old = SafeBernoulliDistribution(ACTION_DIM).proba_distribution(raw[0, :, :ACTION_DIM])
        new = SafeBernoulliDistribution(ACTION_DIM).proba_distribution(new_raw[:, :ACTION_DIM])
    kl = analytic_kl(distribution_params(old).detach(), new)
    assert th.isfinite(kl).all() and (kl >= 0).all(), kl
    kl.sum().backward()
    assert new_raw.grad is not None and th.isfinite(new_raw.grad).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=16))
def test_approx_kl_finite_and_non_negative(log_ratios: list[float]) -> None:
    log_ratio = th.tensor(log_ratios, dtype=th.float32)
    estimate = approx_kl(log_ratio)
    assert th.isfinite(estimate).all() and (estimate >= 0).all()
    # exact where no clamping happens
    inside = log_ratio.abs() <= LOG_RATIO_LIMIT
    exact = log_ratio[inside].double().numpy()
    np.testing.assert_allclose(estimate[inside].numpy(), np.expm1(exact) - exact, rtol=1e-4, atol=1e-6)
