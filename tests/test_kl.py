"""Analytic KL(pi_old || pi) of sb3_safe.common.kl: exactness, agreement with torch and Monte Carlo, finiteness."""

import math
from typing import Any

import numpy as np
import pytest
import torch as th
from hypothesis import given, settings
from hypothesis import strategies as st
from sb3_contrib.common.maskable.distributions import (
    MaskableBernoulliDistribution,
    MaskableCategoricalDistribution,
    MaskableMultiCategoricalDistribution,
)
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
    StateDependentNoiseDistribution,
)
from torch.distributions import Bernoulli, Categorical, Independent, kl_divergence

from sb3_safe.common.distributions import (
    DEFAULT_LOGIT_BOUND,
    LOG_STD_LIMIT,
    PRESQUASH_BOUND,
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
    bound_logits,
)
from sb3_safe.common.kl import (
    LOG_RATIO_LIMIT,
    analytic_kl,
    approx_kl,
    categorical_kl,
    clipped_gaussian_kl,
    distribution_params,
    gaussian_kl,
    has_analytic_kl,
)
from sb3_safe.common.maskable.distributions import (
    SafeMaskableBernoulliDistribution,
    SafeMaskableCategoricalDistribution,
    SafeMaskableMultiCategoricalDistribution,
)

BATCH = 4
ACTION_DIM = 3
NVEC = [3, 2, 4]
LATENT_DIM = 2  # gSDE's features
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
        expected = kl_divergence(Independent(old.distribution, 1), Independent(new.distribution, 1))
    elif family == "categorical":
        expected = kl_divergence(old.distribution, new.distribution)
    else:
        expected = kl_divergence(old.distribution, new.distribution).sum(dim=1)
    kl = analytic_kl(distribution_params(old), new)
    if family == "squashed":
        # The clip at +-PRESQUASH_BOUND hides what lies beyond it: at most the pre-squash Gaussians' KL (the exact value
        # is checked by test_clipped_gaussian_kl_matches_numerical_integration)
        assert th.all(kl <= expected * (1 + 1e-6)) and th.all(kl > 0)
    else:
        th.testing.assert_close(kl, expected, rtol=1e-5, atol=1e-6)


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


def _gsde_pair(cls: type, generator: th.Generator, **kwargs: Any) -> list[Any]:
    """Two gSDE distributions on the same features, as the policy builds them before and after an update."""
    latent = th.randn(BATCH, LATENT_DIM, generator=generator)
    return [
        cls(ACTION_DIM, **kwargs).proba_distribution(
            th.randn(BATCH, ACTION_DIM, generator=generator),
            -0.5 + 0.3 * th.randn(LATENT_DIM, ACTION_DIM, generator=generator),
            latent,
        )
        for _ in range(2)
    ]


@pytest.mark.parametrize("cls", [StateDependentNoiseDistribution, BoundedStateDependentNoiseDistribution])
@pytest.mark.parametrize("squash_output", [False, True])
def test_gsde_kl_is_the_kl_of_its_gaussians(cls: type, squash_output: bool) -> None:
    # gSDE's action at a state is the mean plus features @ exploration matrix: a diagonal Gaussian per state, whose
    # std (the one log_prob uses) is the Normal's; squashed, SB3's tanh is a bijection and sb3-safe's clips at the bound
    old, new = _gsde_pair(cls, th.Generator().manual_seed(6), squash_output=squash_output)
    assert has_analytic_kl(old)
    kl = analytic_kl(distribution_params(old), new)
    p, q = old.distribution, new.distribution
    if squash_output and cls is BoundedStateDependentNoiseDistribution:
        expected = clipped_gaussian_kl(p.mean, p.scale.log(), q.mean, q.scale.log()).sum(dim=1)
    else:
        expected = kl_divergence(Independent(p, 1), Independent(q, 1))
    th.testing.assert_close(kl, expected, rtol=1e-5, atol=1e-7)
    assert th.all(kl > 0)


MASKED_FAMILIES = {
    "masked": lambda: MaskableCategoricalDistribution(5),
    "safe_masked": lambda: SafeMaskableCategoricalDistribution(5),
    "masked_multicategorical": lambda: MaskableMultiCategoricalDistribution(NVEC),
    "safe_masked_multicategorical": lambda: SafeMaskableMultiCategoricalDistribution(NVEC),
    "masked_bernoulli": lambda: MaskableBernoulliDistribution(ACTION_DIM),
    "safe_masked_bernoulli": lambda: SafeMaskableBernoulliDistribution(ACTION_DIM),
}


def _masked_dims(dist: Any) -> list[int]:
    return [dist.action_dim] if hasattr(dist, "action_dim") else list(dist.action_dims)


def _valid_in_each(mask_bits: th.Tensor, dims: list[int]) -> th.Tensor:
    """Masks from ``mask_bits``, with the first action of each sub-space made valid where none was."""
    splits = []
    for split in th.split(mask_bits, dims, dim=1):
        split = split.clone()
        split[:, 0] |= ~split.any(dim=1)
        splits.append(split)
    return th.cat(splits, dim=1)


@pytest.mark.parametrize("family", list(MASKED_FAMILIES))
def test_masked_kl_is_the_kl_of_the_renormalized_categoricals(family: str) -> None:
    # The old and new distribution of a sample share its mask: the KL of the categoricals over the valid actions,
    # whatever the logits of the masked ones
    generator = th.Generator().manual_seed(7)
    old, new = MASKED_FAMILIES[family](), MASKED_FAMILIES[family]()
    dims = _masked_dims(old)
    masks = _valid_in_each(th.rand(BATCH, sum(dims), generator=generator) < 0.5, dims)
    logits = [2.0 * th.randn(BATCH, sum(dims), generator=generator) for _ in range(2)]
    for dist, raw in zip((old, new), logits, strict=True):
        dist.proba_distribution(raw)
        dist.apply_masking(masks)
    assert has_analytic_kl(old)
    kl = analytic_kl(distribution_params(old), new)
    expected = th.zeros(BATCH)
    for old_logits, new_logits, mask in zip(*(th.split(t, dims, dim=1) for t in (*logits, masks)), strict=True):
        if isinstance(old, SafeMaskableMultiCategoricalDistribution | SafeMaskableCategoricalDistribution):
            old_logits, new_logits = (bound_logits(raw, DEFAULT_LOGIT_BOUND) for raw in (old_logits, new_logits))
        p, q = (Categorical(logits=raw.masked_fill(~mask, -math.inf)) for raw in (old_logits, new_logits))
        expected += kl_divergence(p, q).nan_to_num(0.0)  # a sub-space with one valid action: KL 0
    th.testing.assert_close(kl, expected, rtol=1e-5, atol=1e-7)
    assert th.all(kl >= 0) and kl.sum() > 0
    # a masked action's logit changes nothing
    new.proba_distribution(th.where(masks, logits[1], 50.0 * th.randn(BATCH, sum(dims), generator=generator)))
    new.apply_masking(masks)
    th.testing.assert_close(analytic_kl(distribution_params(old), new), kl, rtol=1e-6, atol=0)


def _clipped_kl_by_integration(mean_p: float, std_p: float, mean_q: float, std_q: float) -> float:
    """The KL of u ~ N clipped to +-PRESQUASH_BOUND: the density ratio integrated inside, the limits' masses."""
    p, q = (th.distributions.Normal(th.tensor(m, dtype=th.float64), s) for m, s in ((mean_p, std_p), (mean_q, std_q)))
    u = th.linspace(-PRESQUASH_BOUND, PRESQUASH_BOUND, 2_000_001, dtype=th.float64)
    log_p, log_q = p.log_prob(u), q.log_prob(u)
    inside = th.trapezoid(log_p.exp() * (log_p - log_q), u).item()
    bound = th.tensor(PRESQUASH_BOUND, dtype=th.float64)
    limits = [(1 - p.cdf(bound), 1 - q.cdf(bound)), (p.cdf(-bound), q.cdf(-bound))]
    return inside + sum(mass_p.item() * math.log(mass_p / mass_q) for mass_p, mass_q in limits if mass_p > 0)


@pytest.mark.parametrize(
    "mean_p, std_p, mean_q, std_q",
    [
        (0.0, 1.0, 0.1, 1.1),  # a little mass on the limits
        (2.5, 1.0, 2.8, 0.9),  # much of it on one limit
        (4.0, 0.5, 5.0, 0.5),  # nearly all: 0.13, where the pre-squash Gaussians' KL is 2
        (-3.0, 1.0, -2.0, 2.0),
        (0.0, 3.0, 0.5, 2.5),
        (0.3, 0.01, 0.31, 0.012),  # none: the pre-squash Gaussians' KL
        (10.0, 1.0, 20.0, 1.0),  # both beyond the same limit: 1.5e-10, where the Gaussians' KL is 50
    ],
)
def test_clipped_gaussian_kl_matches_numerical_integration(mean_p: float, std_p: float, mean_q: float, std_q: float) -> None:
    args = [th.tensor([value], dtype=th.float64) for value in (mean_p, math.log(std_p), mean_q, math.log(std_q))]
    expected = _clipped_kl_by_integration(mean_p, std_p, mean_q, std_q)
    assert clipped_gaussian_kl(*args).item() == pytest.approx(expected, rel=1e-7, abs=1e-15)
    # float32 inputs: computed in float64, rounded once
    assert clipped_gaussian_kl(*(arg.float() for arg in args)).item() == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_clipped_gaussian_kl_gradient_is_exact() -> None:
    generator = th.Generator().manual_seed(8)
    args = [(2.0 * th.randn(BATCH, ACTION_DIM, generator=generator, dtype=th.float64)).requires_grad_(True) for _ in range(4)]
    assert th.autograd.gradcheck(clipped_gaussian_kl, args)
    assert th.autograd.gradcheck(lambda *inputs: clipped_gaussian_kl(*inputs, reduction="batchmean"), args)


GAUSSIAN_KLS = {"gaussian": gaussian_kl, "clipped": clipped_gaussian_kl}


@pytest.mark.parametrize("alone", range(4), ids=["mean_p", "log_std_p", "mean_q", "log_std_q"])
@pytest.mark.parametrize("name", list(GAUSSIAN_KLS))
def test_a_kl_gradient_does_not_depend_on_which_arguments_require_one(name: str, alone: int) -> None:
    """
    Promise: gaussian_kl and clipped_gaussian_kl are differentiable in each of their four arguments: the gradient of
    one of them (the new distribution's mean or log-std, as in a KL penalty, or the old one's) is the same when it
    alone requires grad as when all four do, as autograd's is.
    """
    kl = GAUSSIAN_KLS[name]
    generator = th.Generator().manual_seed(3)
    values = [th.randn(BATCH, ACTION_DIM, generator=generator, dtype=th.float64) for _ in range(4)]
    every = [value.clone().requires_grad_(True) for value in values]
    expected = th.autograd.grad(kl(*every).sum(), every)[alone]
    args = [value.clone().requires_grad_(i == alone) for i, value in enumerate(values)]
    (got,) = th.autograd.grad(kl(*args).sum(), [args[alone]])
    assert th.allclose(got, expected, rtol=1e-12, atol=0.0)


# (mean_p, log_std_p, mean_q, log_std_q), and the arguments whose every clamp is active there
EXPLODED = {
    "gaussian: mean difference beyond the z-score limit": ("gaussian", (1e16, 0.0, 0.0, 0.0), {0, 2}),
    "gaussian: log-std ratio beyond expm1's range": ("gaussian", (0.0, LOG_STD_LIMIT, 0.0, -LOG_STD_LIMIT), {1}),
    "clipped: old log-std beyond its limit": ("clipped", (0.5, LOG_STD_LIMIT + 10.0, -0.3, 0.2), {1}),
    "clipped: old clip points beyond the z-score limit": ("clipped", (0.5, -LOG_STD_LIMIT - 5.0, -0.3, 0.2), {1}),
    "clipped: new log-std beyond its limit, delta beyond": ("clipped", (1.0, 0.0, 0.0, -LOG_STD_LIMIT - 5.0), {2, 3}),
}


@pytest.mark.parametrize("case", list(EXPLODED))
def test_an_exploded_argument_gets_zero_gradient_from_the_kl(case: str) -> None:
    """
    Promise (the docstrings of gaussian_kl and clipped_gaussian_kl): where an argument only passes clamps that are
    active (a mean difference or z-score beyond its limit, a log-std beyond +-LOG_STD_LIMIT, a log-std ratio beyond
    expm1's float32 range), its gradient is 0, as autograd's through a clamp; every gradient stays finite, never a
    huge or NaN one.
    """
    name, values, clamped = EXPLODED[case]
    args = [th.tensor([value], dtype=th.float64, requires_grad=True) for value in values]
    grads = th.autograd.grad(GAUSSIAN_KLS[name](*args).sum(), args)
    assert all(th.isfinite(grad).all() for grad in grads), grads
    assert [i for i, grad in enumerate(grads) if grad.item() == 0.0 and i in clamped] == sorted(clamped), grads


@pytest.mark.parametrize("log_stds", [(-40.0, 40.0), (-30.0, 10.0), (-5.0, 5.0), (-4.5, -5.0)])
def test_the_clipped_kl_is_the_gaussian_kl_where_no_mass_is_clipped(log_stds: tuple[float, float]) -> None:
    """
    Promise: where the first distribution puts no mass beyond the clip points, the clipped Gaussians' KL is the
    pre-squash Gaussians' KL (clipped_gaussian_kl integrates it between the clip points), computed with the same
    clamps: the same finite value even where the log-std ratio saturates.
    """
    args = [th.tensor([value], dtype=th.float64) for value in (0.3, log_stds[0], 0.1, log_stds[1])]
    assert clipped_gaussian_kl(*args).item() == pytest.approx(gaussian_kl(*args).item(), rel=1e-9)


@pytest.mark.parametrize("at", [-LOG_STD_LIMIT, LOG_STD_LIMIT])
def test_the_clipped_kl_gradient_at_the_log_std_limit_is_the_one_just_inside(at: float) -> None:
    """
    Promise: a log-std exactly at +-LOG_STD_LIMIT is inside the range the KL is exact on: its gradient is the one an
    ulp inside (a clamp passes its own bounds, as autograd's), not the zero of an active clamp.
    """
    inside = at - math.copysign(1e-7, at)

    def gradient(log_std_q: float) -> float:
        log_std = th.tensor([log_std_q], dtype=th.float64, requires_grad=True)
        args = [th.tensor([value], dtype=th.float64) for value in (0.1, at - math.copysign(1.0, at), 0.1)]
        kl = clipped_gaussian_kl(args[0], args[1], args[2], log_std)
        return th.autograd.grad(kl.sum(), log_std)[0].item()

    assert gradient(at) != 0.0 and gradient(at) == pytest.approx(gradient(inside), rel=1e-5)


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


#: Every finite float32, drawn as float64 and rounded: no draw is rejected (width=32 rejected most draws of the list)
float32_range = st.floats(min_value=-float(th.finfo(th.float32).max), max_value=float(th.finfo(th.float32).max))

#: Every family analytic_kl supports, as the policies build them; the stock ones from SB3's and sb3-contrib's classes
PROPERTY_FAMILIES = [
    *FAMILIES,
    "sb3_categorical",
    "sb3_multicategorical",
    "sb3_bernoulli",
    "gsde",
    "bounded_gsde",
    "bounded_gsde_squashed",
    *MASKED_FAMILIES,
]
#: Stock families with unbounded logits or stds: finite, non-negative values, but no promise on gradients
UNBOUNDED_FAMILIES = [
    "sb3_categorical",
    "sb3_multicategorical",
    "sb3_bernoulli",
    "gsde",
    "masked",
    "masked_multicategorical",
    "masked_bernoulli",
]
#: (reduction, rows): per sample on two rows, and the batch mean of two rows and of the two tiled to 20,000, where a sum
#: of per-sample KLs near their largest value overflows float32 unless the mean divides first
REDUCTIONS = [("none", 2), ("batchmean", 2), ("batchmean", 20_000)]
WIDTH = 2 * sum(NVEC)


def _build(family: str, raw: th.Tensor) -> Distribution:
    """
    A distribution of ``family`` with parameters from ``raw`` (rows, WIDTH), as the policies build them: the first
    columns are the means (or logits), then log-stds (or gSDE's features); gSDE's log-std matrix comes from the last
    columns of the first row, masks from the signs of the second half of the columns.
    """
    means, log_stds = raw[:, :ACTION_DIM], raw[:, ACTION_DIM : 2 * ACTION_DIM]
    if family in ("gaussian", "squashed"):
        cls = BoundedDiagGaussianDistribution if family == "gaussian" else SquashedBoundedGaussianDistribution
        return cls(ACTION_DIM).proba_distribution(means, log_stds)
    if family == "sb3_gaussian":
        # SB3's own Gaussian has no bound, and the KL reaches its log-std through log(std), whose gradient divides by
        # the std: a z-score of 1e15 (where our clamp starts) then overflows for std < exp(-8). Its gradients are
        # finite for moderate log-stds; the bounded distributions' for any parameter.
        return DiagGaussianDistribution(ACTION_DIM).proba_distribution(means, log_stds.clamp(-5.0, 5.0))
    if family in ("gsde", "bounded_gsde", "bounded_gsde_squashed"):
        latent = raw[:, ACTION_DIM : ACTION_DIM + LATENT_DIM]
        log_std_matrix = raw[0, WIDTH - LATENT_DIM * ACTION_DIM :].reshape(LATENT_DIM, ACTION_DIM)
        if family == "gsde":
            # SB3's gSDE: exp of an extreme log-std parameter is inf or 0, and features of 0 times an inf std are NaN
            # before the KL is reached; moderate parameters, any features
            return StateDependentNoiseDistribution(ACTION_DIM).proba_distribution(
                means, log_std_matrix.clamp(-5.0, 5.0), latent
            )
        dist = BoundedStateDependentNoiseDistribution(ACTION_DIM, squash_output=family == "bounded_gsde_squashed")
        return dist.proba_distribution(means, log_std_matrix, latent)
    if family in ("categorical", "sb3_categorical"):
        cls = SafeCategoricalDistribution if family == "categorical" else CategoricalDistribution
        return cls(5).proba_distribution(raw[:, :5])
    if family in ("multicategorical", "sb3_multicategorical"):
        cls = SafeMultiCategoricalDistribution if family == "multicategorical" else MultiCategoricalDistribution
        return cls(NVEC).proba_distribution(raw[:, : sum(NVEC)])
    if family in ("bernoulli", "sb3_bernoulli"):
        cls = SafeBernoulliDistribution if family == "bernoulli" else BernoulliDistribution
        return cls(ACTION_DIM).proba_distribution(raw[:, :ACTION_DIM])
    masked = MASKED_FAMILIES[family]()
    dims = _masked_dims(masked)
    masked.proba_distribution(raw[:, : sum(dims)])
    masked.apply_masking(_valid_in_each(raw[:, WIDTH - sum(dims) :].detach() > 0, dims))
    return masked


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(PROPERTY_FAMILIES),
    reduction_rows=st.sampled_from(REDUCTIONS),
    values=st.lists(float32_range, min_size=2 * 2 * WIDTH, max_size=2 * 2 * WIDTH),
)
def test_kl_finite_non_negative_with_finite_gradients_for_extreme_parameters(
    family: str, reduction_rows: tuple[str, int], values: list[float]
) -> None:
    reduction, rows = reduction_rows
    raw = th.tensor(values, dtype=th.float32).reshape(2, 2, WIDTH).repeat(1, rows // 2, 1)  # (old/new, rows, width)
    if family in MASKED_FAMILIES:
        raw[1, :, WIDTH // 2 :] = raw[0, :, WIDTH // 2 :]  # old and new share the masks
    new_raw = raw[1].clone().requires_grad_(True)
    old, new = _build(family, raw[0]), _build(family, new_raw)
    kl = analytic_kl(distribution_params(old).detach(), new, reduction=reduction)  # type: ignore[arg-type]
    assert th.isfinite(kl).all() and (kl >= 0).all(), kl
    if family in UNBOUNDED_FAMILIES:
        return  # gradients: promised for sb3-safe's distributions and SB3's Gaussian (above)
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
