"""
Promises of sb3_safe.common.kl at the edges of its clamps: values and gradients as autograd gives them through the
documented formulas and clamps, non-negative where rounding cancels, finite for extreme float32 log-stds.
"""

import math
from collections.abc import Callable

import pytest
import torch as th
from hypothesis import given, settings
from hypothesis import strategies as st

from sb3_safe.common.distributions import DIFFERENCE_LIMIT, LOG_STD_LIMIT, PRESQUASH_BOUND, Z_SCORE_LIMIT
from sb3_safe.common.kl import approx_kl, categorical_kl, clamp_log_ratio, clipped_gaussian_kl, gaussian_kl

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _LogNdtr(th.autograd.Function):
    """``log Phi(z)`` whose derivative ``phi(z) / Phi(z)`` stays finite for z far below 0 (torch's gives inf there)."""

    @staticmethod
    def forward(ctx, z: th.Tensor) -> th.Tensor:  # type: ignore[override]
        ctx.save_for_backward(z)
        return th.special.log_ndtr(z)

    @staticmethod
    def backward(ctx, grad: th.Tensor) -> th.Tensor:  # type: ignore[override]
        (z,) = ctx.saved_tensors
        return grad * _SQRT_2_OVER_PI / th.special.erfcx(-z * math.sqrt(0.5))


def _standardize(values: th.Tensor, mean: th.Tensor, log_std: th.Tensor) -> th.Tensor:
    """The z-score with the clamps the module documents (those of standardize), differentiated by autograd."""
    return ((values - mean).clamp(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT) * th.exp(-log_std)).clamp(-Z_SCORE_LIMIT, Z_SCORE_LIMIT)


def _double_log_ratio(log_std_p: th.Tensor, log_std_q: th.Tensor) -> th.Tensor:
    """``2d = 2 (log_std_p - log_std_q)`` of the clamped log-stds, clamped to keep expm1(2d) finite in float32."""
    clamped = [log_std.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT) for log_std in (log_std_p, log_std_q)]
    return (2.0 * (clamped[0] - clamped[1])).clamp(-2 * LOG_STD_LIMIT, 2 * LOG_STD_LIMIT)


def _reference_gaussian_kl(mean_p: th.Tensor, log_std_p: th.Tensor, mean_q: th.Tensor, log_std_q: th.Tensor) -> th.Tensor:
    """gaussian_kl's docstring formula ``(z^2 + expm1(2d) - 2d) / 2`` with its clamps, op by op (float64)."""
    z = _standardize(mean_p, mean_q, log_std_q.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT))
    double_log_ratio = _double_log_ratio(log_std_p, log_std_q)
    return 0.5 * (z.square() + th.expm1(double_log_ratio) - double_log_ratio)


def _reference_clipped_kl(mean_p: th.Tensor, log_std_p: th.Tensor, mean_q: th.Tensor, log_std_q: th.Tensor) -> th.Tensor:
    """
    clipped_gaussian_kl's docstring formula, op by op (float64): the log density ratio
    ``((rho^2 - 1) z^2 + 2 rho delta z + delta^2) / 2 - d`` integrated over p between the clip points' z-scores, plus
    ``P log(P / Q)`` on each limit; the same clamps, so autograd gives the gradient the module promises.
    """
    log_std_p, log_std_q = (log_std.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT) for log_std in (log_std_p, log_std_q))
    bound = th.tensor(PRESQUASH_BOUND, dtype=th.float64)
    upper, lower = _standardize(bound, mean_p, log_std_p), _standardize(-bound, mean_p, log_std_p)
    upper_q, lower_q = _standardize(bound, mean_q, log_std_q), _standardize(-bound, mean_q, log_std_q)
    delta = _standardize(mean_p, mean_q, log_std_q)
    double_log_ratio = _double_log_ratio(log_std_p, log_std_q)
    rho = th.exp(0.5 * double_log_ratio)

    def pdf(z: th.Tensor) -> th.Tensor:
        return th.exp(-0.5 * z.square()) / math.sqrt(2.0 * math.pi)

    # the standard normal's partial moments between the clip points, the mass from the tail it lies in
    mass = th.where(
        lower > 0.0, th.special.ndtr(-lower) - th.special.ndtr(-upper), th.special.ndtr(upper) - th.special.ndtr(lower)
    )
    first = pdf(lower) - pdf(upper)
    second = mass + lower * pdf(lower) - upper * pdf(upper)
    inside = th.expm1(double_log_ratio) * second + 2.0 * rho * delta * first + (delta.square() - double_log_ratio) * mass
    limits = [(th.special.ndtr(-upper), _LogNdtr.apply(-upper), _LogNdtr.apply(-upper_q))]
    limits.append((th.special.ndtr(lower), _LogNdtr.apply(lower), _LogNdtr.apply(lower_q)))
    return 0.5 * inside + sum(mass_p * (log_p - log_q) for mass_p, log_p, log_q in limits)


def _value_and_gradients(kl: Callable[..., th.Tensor], values: tuple[float, ...]) -> tuple[float, list[float]]:
    """The KL of one-element float64 arguments and its gradient in each of them."""
    args = [th.tensor([value], dtype=th.float64, requires_grad=True) for value in values]
    out = kl(*args).sum()
    return out.item(), [grad.item() for grad in th.autograd.grad(out, args)]


# (mean_p, log_std_p, mean_q, log_std_q): each puts one of the backward pass's clamps inside, beyond or exactly on its
# bound, where p (or q) has mass on the limits so that the clamped term counts
CLIPPED_CASES = {
    "p clipped, q's clip points beyond the z-score limit": (0.0, 0.0, 0.0, -LOG_STD_LIMIT),
    "p clipped, q so narrow that 2d saturates": (0.0, 0.0, 0.1, -35.0),
    "p's clip points beyond the z-score limit, q's inside": (1e16, 0.0, 0.0, 0.0),
    "q's upper clip point exactly at the z-score limit": (0.0, 0.0, PRESQUASH_BOUND - Z_SCORE_LIMIT, 0.0),
    "q's clip differences and the mean difference exactly at their limit": (0.0, 0.0, -DIFFERENCE_LIMIT, 12.0),
    "delta exactly at the z-score limit": (0.0, 0.0, -Z_SCORE_LIMIT, 0.0),
    "2d exactly at its limit": (0.3, -30.0, 0.1, 10.0),
    "2d beyond its lower limit": (0.3, -30.0, 0.1, 20.0),
    "2d beyond its upper limit": (0.3, 5.0, 0.1, -LOG_STD_LIMIT),
    "2d inside, |d| above 80 / 3": (0.3, -10.0, 0.1, 20.0),
    "2d inside, |d| above 20": (0.3, -5.0, 0.1, 20.0),
    "p's log-std exactly at -LOG_STD_LIMIT": (0.3, -LOG_STD_LIMIT, 0.1, -10.0),
    "moderate, both clipped": (0.5, 0.3, -0.4, 0.1),
}


@pytest.mark.parametrize("case", list(CLIPPED_CASES))
def test_clipped_kl_and_its_gradient_are_autograds_through_the_formula_at_every_clamp(case: str) -> None:
    """
    Promise (clipped_gaussian_kl, _ClippedGaussianKL): the value is the documented integral with the documented
    clamps, and the hand-written gradient is autograd's through it: zero through a clamp that is active, passing a
    clamp whose input is exactly on its bound, each clip point's and each distribution's terms kept apart.
    """
    values = CLIPPED_CASES[case]
    value, gradients = _value_and_gradients(clipped_gaussian_kl, values)
    expected_value, expected_gradients = _value_and_gradients(_reference_clipped_kl, values)
    assert value == pytest.approx(expected_value, rel=1e-9, abs=1e-300)
    assert all(math.isfinite(gradient) for gradient in gradients), gradients
    assert gradients == pytest.approx(expected_gradients, rel=1e-6, abs=1e-300), (gradients, expected_gradients)


# (mean_p, log_std_p, mean_q, log_std_q) where gaussian_kl's clamps are inactive (the gradient is exact there) or
# active (the value is the clamped formula's, the gradient through the saturated term 0)
GAUSSIAN_CASES = {
    "2d = 50: expm1(2d) large, but inside its clamp": (0.3, 25.0, 0.1, 0.0),
    "2d = -70": (0.3, -35.0, 0.1, 0.0),
    "2d beyond its upper limit": (0.3, 30.0, 0.1, -20.0),
    "2d beyond its lower limit": (0.3, -30.0, 0.1, 30.0),
    "z beyond its limit": (1e16, 0.0, 0.0, 0.0),
}


@pytest.mark.parametrize("case", list(GAUSSIAN_CASES))
def test_gaussian_kl_and_its_gradient_are_autograds_through_the_formula(case: str) -> None:
    """
    Promise (gaussian_kl): ``(z^2 + expm1(2d) - 2d) / 2`` with z and 2d clamped as documented, and the gradient
    autograd gives through it: exact while a clamp is inactive (however large expm1(2d) is), zero through an active
    one.
    """
    values = GAUSSIAN_CASES[case]
    value, gradients = _value_and_gradients(gaussian_kl, values)
    expected_value, expected_gradients = _value_and_gradients(_reference_gaussian_kl, values)
    assert value == pytest.approx(expected_value, rel=1e-12)
    assert gradients == pytest.approx(expected_gradients, rel=1e-10, abs=1e-300), (gradients, expected_gradients)


@pytest.mark.parametrize("log_stds", [(LOG_STD_LIMIT, -LOG_STD_LIMIT), (-LOG_STD_LIMIT, LOG_STD_LIMIT), (1e30, -1e30)])
def test_gaussian_and_clipped_kls_are_finite_for_the_most_distant_float32_log_stds(log_stds: tuple[float, float]) -> None:
    """
    Promise (module docstring): finite for all finite inputs, in float32 too: a log-std ratio of e^80 (or any
    beyond) is clamped so that expm1(2d) stays below float32's maximum; the value is the float64 one rounded.
    """
    values = (0.5, log_stds[0], -0.5, log_stds[1])
    for kl in (gaussian_kl, clipped_gaussian_kl):
        single = kl(*(th.tensor([value], dtype=th.float32) for value in values))
        double = kl(*(th.tensor([value], dtype=th.float64) for value in values))
        assert th.isfinite(single).all() and single.item() >= 0.0, (kl, single)
        assert single.item() == pytest.approx(double.item(), rel=1e-6)


def _close_pairs(generator: th.Generator, rows: int, scale: float) -> tuple[th.Tensor, th.Tensor]:
    """Standard normal float64 values and the same values plus ``scale`` times standard normal noise."""
    values = th.randn(rows, generator=generator, dtype=th.float64)
    return values, values + scale * th.randn(rows, generator=generator, dtype=th.float64)


def test_clipped_kl_of_nearly_equal_distributions_is_non_negative_and_tiny() -> None:
    """
    Promise (module docstring, clipped_gaussian_kl): non-negative; its terms cancel to first order for close
    distributions, where float64 rounding leaves the sum slightly on either side of the true (tiny) KL: never below 0.
    """
    generator = th.Generator().manual_seed(0)
    mean_p, mean_q = _close_pairs(generator, 4096, 1e-12)
    log_std_p, log_std_q = _close_pairs(generator, 4096, 1e-12)
    kl = clipped_gaussian_kl(3.0 * mean_p, log_std_p, 3.0 * mean_q, log_std_q)
    assert (kl >= 0.0).all() and (kl <= 1e-14).all(), kl.min()


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.integers(min_value=2, max_value=8), st.sampled_from([1e-7, 1e-6, 1e-5]), st.integers(0, 2**31 - 1))
def test_categorical_kl_of_nearly_equal_distributions_is_non_negative(actions: int, scale: float, seed: int) -> None:
    """
    Promise (categorical_kl, module docstring): non-negative with either reduction; float32 rounding of nearly equal
    log-probabilities makes kl_div's sum slightly negative about half the time, and the result must still be >= 0 and
    close to the float64 KL.
    """
    generator = th.Generator().manual_seed(seed)
    logits = th.randn(64, actions, generator=generator, dtype=th.float64)
    log_p = th.log_softmax(logits, dim=-1)
    log_q = th.log_softmax(logits + scale * th.randn(64, actions, generator=generator, dtype=th.float64), dim=-1)
    exact = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    kl = categorical_kl(log_p.float(), log_q.float())
    assert (kl >= 0.0).all(), kl.min()
    assert th.allclose(kl.double(), exact, rtol=0.0, atol=1e-6)
    for row in range(64):  # a batch of one: its mean is its KL, computed by the batchmean path
        mean = categorical_kl(log_p[row : row + 1].float(), log_q[row : row + 1].float(), reduction="batchmean")
        assert mean.item() >= 0.0 and mean.item() == pytest.approx(exact[row].item(), abs=1e-6)


def test_clamped_log_ratios_keep_the_ratio_in_its_documented_range() -> None:
    """
    Promise (LOG_RATIO_LIMIT): a log-ratio is clamped before exp so that ratios stay in [2e-9, 4.9e8]; one whose ratio
    lies well inside that range passes unchanged (approx_kl is exact there).
    """
    extreme = th.tensor([-1e30, -1e3, -25.0, 25.0, 1e3, 1e30])
    ratios = clamp_log_ratio(extreme).double().exp()
    assert (ratios >= 2e-9).all() and (ratios <= 4.9e8).all(), ratios
    inside = th.tensor([math.log(2.5e-9), -19.5, 0.0, 19.5, math.log(4.5e8)], dtype=th.float64)
    assert th.equal(clamp_log_ratio(inside), inside)
    assert th.allclose(approx_kl(inside), th.expm1(inside) - inside, rtol=1e-12, atol=0.0)
