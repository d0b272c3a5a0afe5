"""
KL divergence ``KL(pi_old || pi)`` between the policy that collected a rollout and the current policy.

The old policy is kept as a flat tensor of distribution parameters per sample (see :func:`distribution_params`),
so the rollout buffer stays small and the KL is analytic for:

- diagonal Gaussians (SB3's and :class:`~sb3_safe.common.distributions.BoundedDiagGaussianDistribution`):
  stored as ``(mean, log_std)``;
- gSDE (SB3's ``StateDependentNoiseDistribution`` and
  :class:`~sb3_safe.common.distributions.BoundedStateDependentNoiseDistribution`): at each state a diagonal Gaussian
  whose std comes from the features and the exploration matrix's log-std, stored as ``(mean, log_std)`` too;
- tanh-squashed Gaussians, with or without gSDE, stored as the pre-squash ``(mean, log_std)``: SB3's tanh is a
  bijection, so the KL is the pre-squash Gaussians' (KL is invariant under a bijection); sb3-safe's clips the
  pre-squash sample at ``+-PRESQUASH_BOUND`` (the limit actions carry the mass beyond), so the KL is the clipped
  Gaussians' (:func:`clipped_gaussian_kl`), less than the pre-squash Gaussians' where the limits carry mass;
- Categorical, MultiCategorical: stored as normalized log-probabilities;
- masked categoricals (sb3-contrib's maskable Categorical, MultiCategorical and Bernoulli, for ``MaskablePPO``, and
  their safe versions): stored as the masked, renormalized log-probabilities. The old and the new distribution of a
  sample share its mask, so this is the KL of the categoricals over the valid actions (a masked action's probability
  is exactly 0 in both);
- Bernoulli (MultiBinary): stored as logits.

Another distribution (a custom one) has no stored parameters; use :func:`approx_kl`, the non-negative estimator
``(ratio - 1) - log(ratio)`` of the same KL.

Every function here is finite and non-negative for all finite inputs, with either reduction: log-stds are clamped to
``[-LOG_STD_LIMIT, LOG_STD_LIMIT]`` and z-scores computed with :func:`~sb3_safe.common.distributions.standardize`, as
in ``distributions.py``; log-probabilities are floored at ``LOG_PROB_FLOOR``; so a sample's KL is at most about
``3e34`` per Gaussian dimension and ``1e30`` per categorical, and a batch mean divides before it sums.
"""

import functools
import math
from typing import Any, Literal

import numpy as np
import torch as th
from sb3_contrib.common.maskable.distributions import (
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
from torch.nn import functional as F

from sb3_safe.common.distributions import (
    DIFFERENCE_LIMIT,
    LOG_STD_LIMIT,
    PRESQUASH_BOUND,
    Z_SCORE_LIMIT,
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
    SquashedBoundedGaussianDistribution,
)

#: |log_ratio| above which it is clamped before ``exp``: ratios stay in [2e-9, 4.9e8]
LOG_RATIO_LIMIT = 20.0

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)

#: Log-probabilities are floored here (probability ``exp(-1e30)``, 0 in any float): a categorical's KL is then at most
#: about ``-LOG_PROB_FLOOR`` (the clamped Gaussian's z^2 is at most ``Z_SCORE_LIMIT ** 2``, alike), so sums over
#: sub-spaces and action dimensions stay finite; the lowest float32 itself would overflow in a sum of two
LOG_PROB_FLOOR = -1e30

#: ``"none"``: one value per sample (element-wise for :func:`gaussian_kl`); ``"batchmean"``: their sum divided by the
#: batch size (the first dimension), as in :func:`torch.nn.functional.kl_div`: the mean KL per sample, computed
#: without the per-sample tensor's graph nodes (a training loss needs only the mean)
Reduction = Literal["none", "batchmean"]

_GAUSSIANS = (DiagGaussianDistribution, StateDependentNoiseDistribution)
_CATEGORICALS = (
    CategoricalDistribution,
    MultiCategoricalDistribution,
    MaskableCategoricalDistribution,
    MaskableMultiCategoricalDistribution,  # sb3-contrib's MaskableBernoulliDistribution too: two outcomes per action
)


def has_analytic_kl(distribution: Distribution) -> bool:
    """
    Whether :func:`analytic_kl` supports this distribution (else use :func:`approx_kl`).

    :param distribution: an SB3, sb3-contrib or sb3-safe action distribution
    """
    return isinstance(distribution, (*_GAUSSIANS, *_CATEGORICALS, BernoulliDistribution))


def _gaussian(distribution: Distribution) -> tuple[th.Tensor, th.Tensor] | None:
    """The mean and log-std of a Gaussian family (diagonal, squashed or gSDE), else None."""
    if not isinstance(distribution, _GAUSSIANS):
        return None
    normal = distribution.distribution
    # The bounded log-std is the one the distribution uses; SB3's own is clamped to the range standardize supports
    # (SB3's gSDE: its Normal's std, sqrt(variance + epsilon), is the one its log_prob uses)
    if isinstance(distribution, BoundedDiagGaussianDistribution | BoundedStateDependentNoiseDistribution):
        return normal.mean, distribution.bounded_log_std
    return normal.mean, normal.scale.log().clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT)


def _categorical_log_probs(distribution: Distribution) -> list[th.Tensor] | None:
    """
    The normalized log-probabilities of each categorical of a discrete family, else None. torch normalizes a
    ``Categorical``'s logits; sb3-contrib's masking rebuilds it from the masked logits, so these are the masked,
    renormalized ones.
    """
    if isinstance(distribution, CategoricalDistribution | MaskableCategoricalDistribution):
        return [distribution.distribution.logits]
    if isinstance(distribution, MultiCategoricalDistribution):
        return [split.logits for split in distribution.distribution]
    if isinstance(distribution, MaskableMultiCategoricalDistribution):
        return [split.logits for split in distribution.distributions]
    return None


def distribution_params(distribution: Distribution) -> th.Tensor:
    """
    The parameters :func:`analytic_kl` needs, as one ``(batch, width)`` tensor.

    :param distribution: a distribution for which :func:`has_analytic_kl` is true, after ``proba_distribution`` (and
        ``apply_masking``, for a maskable one)
    :raises ValueError: for other distributions
    """
    gaussian = _gaussian(distribution)
    if gaussian is not None:
        # For a squashed Gaussian these are the pre-squash parameters
        return th.cat(gaussian, dim=1)
    log_probs = _categorical_log_probs(distribution)
    if log_probs is not None:
        return log_probs[0] if len(log_probs) == 1 else th.cat(log_probs, dim=1)
    if isinstance(distribution, BernoulliDistribution):
        return distribution.distribution.logits
    raise ValueError(f"No analytic KL for {type(distribution).__name__}; use approx_kl")


class _GaussianKL(th.autograd.Function):
    """
    The autograd function behind :func:`gaussian_kl`: the forward pass without autograd's bookkeeping and a
    backward pass of a few products, much cheaper than differentiating the formula op by op, which matters in
    every minibatch of a small policy.
    """

    @staticmethod
    def forward(
        ctx: Any, mean_p: th.Tensor, log_std_p: th.Tensor, mean_q: th.Tensor, log_std_q: th.Tensor, batchmean: bool
    ) -> th.Tensor:
        log_std_q = log_std_q.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT)
        inv_std_q = th.exp(-log_std_q)
        # standardize(), in place on fresh tensors; the difference clamp keeps inf out of the product
        z_score = (mean_p - mean_q).clamp_(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT).mul_(inv_std_q)
        z_score.clamp_(-Z_SCORE_LIMIT, Z_SCORE_LIMIT)
        # 2 * LOG_STD_LIMIT = 80 keeps expm1 below float32's maximum
        double_log_ratio = (log_std_p.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT) - log_std_q).mul_(2.0)
        double_log_ratio.clamp_(-2 * LOG_STD_LIMIT, 2 * LOG_STD_LIMIT)
        expm1_ratio = th.expm1(double_log_ratio)
        z_squared = z_score * z_score
        ctx.save_for_backward(z_score, inv_std_q, double_log_ratio, expm1_ratio)
        ctx.shapes = (mean_p.shape, log_std_p.shape, mean_q.shape, log_std_q.shape)
        # Rounding can make expm1(x) - x slightly negative for tiny x; the KL is >= 0
        kl = (z_squared + expm1_ratio).sub_(double_log_ratio).mul_(0.5).clamp_(min=0.0)
        ctx.scale = 1.0 / kl.shape[0] if batchmean else 1.0
        # Divided before the sum: a sum of many elements near their largest value (3e34) would overflow float32
        return kl.mul_(ctx.scale).sum() if batchmean else kl

    @staticmethod
    def backward(ctx: Any, grad: th.Tensor) -> tuple[th.Tensor | None, ...]:
        z_score, inv_std_q, double_log_ratio, expm1_ratio = ctx.saved_tensors
        needs = ctx.needs_input_grad
        # batchmean: every element's gradient is the scalar's divided by the batch size (broadcast below)
        grad = grad * ctx.scale
        # The KL's gradient: d/d mean_p = z / std_q = -d/d mean_q, d/d log_std_p = expm1(2d),
        # d/d log_std_q = -expm1(2d) - z^2; zero through a clamp that is active (extreme inputs), as autograd
        # would give, so an exploded mean or log-std gets no gradient from the penalty rather than a huge one.
        # (The clamp to >= 0 only absorbs rounding: the gradient passes it.)
        grad_z = grad * z_score * (z_score.abs() < Z_SCORE_LIMIT)
        grad_d = grad * expm1_ratio * (double_log_ratio.abs() < 2 * LOG_STD_LIMIT)
        grad_mean = grad_z * inv_std_q if needs[0] or needs[2] else None
        grads = (
            grad_mean if needs[0] else None,
            grad_d if needs[1] else None,
            -grad_mean if grad_mean is not None and needs[2] else None,
            -(grad_d + grad_z * z_score) if needs[3] else None,
        )
        # Inputs broadcast in the forward pass get their gradient summed back to their shape
        input_grads = tuple(
            g if g is None or g.shape == shape else g.sum_to_size(shape) for g, shape in zip(grads, ctx.shapes, strict=True)
        )
        return (*input_grads, None)


def gaussian_kl(
    mean_p: th.Tensor, log_std_p: th.Tensor, mean_q: th.Tensor, log_std_q: th.Tensor, reduction: Reduction = "none"
) -> th.Tensor:
    """
    Element-wise ``KL(N(mean_p, std_p) || N(mean_q, std_q))``, differentiable in all four arguments.

    Written as ``(z^2 + expm1(2d) - 2d) / 2`` with ``z = (mean_p - mean_q) / std_q`` and
    ``d = log_std_p - log_std_q``: exactly 0 for equal arguments, accurate for close ones, finite otherwise
    (log-stds, z and d are clamped as in :func:`~sb3_safe.common.distributions.standardize`, giving a finite
    lower bound of the true KL for extreme inputs, with zero gradient where z or d is clamped).

    :param mean_p: mean of the first Gaussian
    :param log_std_p: its log-std, inside ``[-LOG_STD_LIMIT, LOG_STD_LIMIT]`` (as :func:`analytic_kl` passes it;
        a value beyond is taken as the limit)
    :param mean_q: mean of the second Gaussian
    :param log_std_q: its log-std, likewise
    :param reduction: ``"none"``, or ``"batchmean"``: the sum of all elements divided by the first dimension's
        size (with ``(batch, action_dim)`` inputs: the mean over the batch of the KL summed over action dimensions)
    """
    return _GaussianKL.apply(mean_p, log_std_p, mean_q, log_std_q, _batchmean(reduction))


def _is_clipped(distribution: Distribution) -> bool:
    """Whether actions are sb3-safe's squashed Gaussian, whose limit actions carry the mass beyond the clip points."""
    if isinstance(distribution, BoundedStateDependentNoiseDistribution):
        return distribution.bijector is not None
    return isinstance(distribution, SquashedBoundedGaussianDistribution)


def _outward(like: th.Tensor, trailing_dims: int) -> th.Tensor:
    """``[1, -1]`` (upper clip point, lower) shaped to broadcast over ``trailing_dims`` more dimensions, made on
    ``like``'s device (a tensor copied from the host would synchronize a GPU)."""
    signs = 1.0 - 2.0 * th.arange(2, dtype=like.dtype, device=like.device)
    return signs.view(2, *[1] * trailing_dims)


#: Gauss-Legendre nodes for the interior integral where p is wide (exact for polynomials of degree 31): its density
#: then varies little between the clip points, whose z-scores are too close for the closed form's moments
_LEGENDRE_NODES = 16
#: The clip interval is short, for quadrature, where its half-width in p's z-scores is at most _SHORT_WIDTH and p's
#: log-density changes by at most 4 * _SHORT_SLOPE across it (16 nodes then err by ~1e-17, relative)
_SHORT_WIDTH = 1.0
_SHORT_SLOPE = 2.0
#: Where p's mean lies beyond a clip point whose z-score is beyond this, the interior's moments are taken about that
#: point, from the Mills ratio's continued fraction cut after _MILLS_TERMS terms (relative error < 2e-16 from 5 on; it
#: needs ~(18 / z)^2 terms). Nearer, the moments about p's mean cancel by at most ~z^4 / 2, measured < 6 ulps
_TAIL_Z = 5.0
_MILLS_TERMS = 24


@functools.cache
def _legendre(device: th.device) -> tuple[th.Tensor, th.Tensor]:
    """
    Gauss-Legendre nodes ``u_i`` on the clip interval ``[-PRESQUASH_BOUND, PRESQUASH_BOUND]``, and the weights ``(w_i
    u_i^k)`` for ``k = 0, 1, 2`` that make a function's moments in u from its values at them; made once per device (a
    tensor copied from the host on every call would synchronize a GPU).
    """
    nodes, weights = np.polynomial.legendre.leggauss(_LEGENDRE_NODES)
    nodes = PRESQUASH_BOUND * nodes
    moments = PRESQUASH_BOUND * weights * nodes ** np.arange(3)[:, None]
    return th.tensor(nodes, dtype=th.float64, device=device), th.tensor(moments, dtype=th.float64, device=device)


def _mills_ratios(x: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """
    ``M1 / M0`` and ``M2 / M1`` for ``x >= _TAIL_Z``, with ``M_k = int_x^inf (t - x)^k phi(t) dt``: the continued
    fraction ``r_k = k / (x + r_(k+1))`` evaluated backward from its fixed point (stable; the direct ``1 / R(x) - x``
    with R the Mills ratio cancels by ``x^2``, its successor by ``x^4``).
    """
    start = _MILLS_TERMS + 1
    ratio = 2.0 * start / (x + th.sqrt(x.square() + 4.0 * start))
    for k in range(_MILLS_TERMS, 1, -1):
        ratio.add_(x).reciprocal_().mul_(k)
    return (x + ratio).reciprocal_(), ratio


def _may_hold(mask: th.Tensor) -> bool:
    """
    Whether some element of ``mask`` may be true: read on the CPU, where it costs nothing, so that a regime no element is
    in is not computed; assumed on other devices, where reading it would synchronize with the host.
    """
    return mask.device.type != "cpu" or bool(mask.any())


def _product_moment(
    u_moments: th.Tensor, slope: th.Tensor, offset: th.Tensor, other_slope: th.Tensor, other_offset: th.Tensor
) -> th.Tensor:
    """``int phi(z) (slope u + offset) (other_slope u + other_offset) dz`` from the moments ``int phi(z) u^k dz``."""
    return (
        slope * other_slope * u_moments[2]
        + (slope * other_offset + offset * other_slope) * u_moments[1]
        + offset * other_offset * u_moments[0]
    )


class _ClippedGaussianKL(th.autograd.Function):
    """
    The autograd function behind :func:`clipped_gaussian_kl`, in float64: the forward pass without autograd's
    bookkeeping and a backward pass from the derivatives below, much cheaper than differentiating its many small
    operations one by one in every minibatch.

    With ``upper`` and ``lower`` the clip points' z-scores under p (``upper_q``, ``lower_q`` under q), ``L(z)`` the log
    density ratio at z-score ``z``, ``P`` and ``Q`` a limit's mass under p and q, and ``M_k`` the standard normal's
    partial moments between ``lower`` and ``upper``:

    - ``dKL/d upper = phi(upper) (L(upper) - log(P / Q) - 1)`` (the integral's end moves, and the limit's mass with
      it), the opposite sign for ``lower``;
    - ``dKL/d upper_q = P phi(upper_q) / Q``, the opposite sign for ``lower_q``;
    - ``dKL/d delta = rho M1 + delta M0 = int phi z_q``, ``dKL/d d = exp(2d) M2 + rho delta M1 - M0 =
      int phi (rho z z_q - 1)`` (``z_q = rho z + delta``, q's z-score);

    then through the z-scores to the inputs, zero through a clamp that is active, as autograd would give.

    The interior integral ``int phi L`` and those two are evaluated in a form whose terms do not cancel: from p's
    moments in ``u`` by Gauss-Legendre quadrature where the clip interval is short in p's z-scores (p wide: ``M2`` is
    then ~``1e-51`` while ``M0`` and ``upper phi(upper)`` are ~``1e-17``, and ``exp(2d)`` up to ``1e69``); from the
    moments about the clip point nearer p's mean where that lies far in p's tail (there ``M1 ~ upper M0``); else from
    the moments about p's mean, grouped by clip point. The masses come from ``erfc`` and ``log_ndtr``, which keep their
    relative precision in the tails (torch's ``ndtr`` does not: it is 0 below ``z = -8.3``). Value and gradient are
    exactly 0 for equal distributions.
    """

    @staticmethod
    def forward(
        ctx: Any, mean_p: th.Tensor, log_std_p: th.Tensor, mean_q: th.Tensor, log_std_q: th.Tensor, batchmean: bool
    ) -> th.Tensor:
        inputs = (mean_p, log_std_p, mean_q, log_std_q)
        ctx.shapes = tuple(tensor.shape for tensor in inputs)
        ctx.dtypes = tuple(tensor.dtype for tensor in inputs)
        dtype = functools.reduce(th.promote_types, ctx.dtypes)
        broadcast = th.broadcast_tensors(*(tensor.double() for tensor in inputs))
        # index 0: p, 1: q
        means, log_stds = th.stack(broadcast[0::2]), th.stack(broadcast[1::2])
        clamped_log_stds = log_stds.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT)
        inv_stds = th.exp(-clamped_log_stds)
        # standardize() of the clip points (index 0: upper, 1: lower) under p and q, and of mean_p under q
        outward = _outward(means, means.dim() - 1)
        differences = PRESQUASH_BOUND * outward - means.unsqueeze(1)
        z_scores = (differences.clamp(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT) * inv_stds.unsqueeze(1)).clamp_(
            -Z_SCORE_LIMIT, Z_SCORE_LIMIT
        )
        mean_difference = means[0] - means[1]
        delta = mean_difference.clamp(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT).mul_(inv_stds[1])
        delta.clamp_(-Z_SCORE_LIMIT, Z_SCORE_LIMIT)
        double_log_ratio = (clamped_log_stds[0] - clamped_log_stds[1]).mul_(2.0)
        double_log_ratio.clamp_(-2 * LOG_STD_LIMIT, 2 * LOG_STD_LIMIT)
        rho = th.exp(0.5 * double_log_ratio)
        expm1_ratio = th.expm1(double_log_ratio)
        upper, lower = z_scores[0]
        # p's limit masses Phi(-upper), Phi(lower) and their complements Phi(upper), 1 - Phi(lower); the interior mass
        # as a difference of the smaller tails, so that it keeps its precision inside one tail
        outward_z = outward * z_scores[0]
        tails = th.special.erfc(th.cat([outward_z, -outward_z]).mul_(_SQRT_HALF)).mul_(0.5)
        masses_p, complements = tails[:2], tails[2:]
        mass = th.where(
            lower > 0.0,
            complements[1] - masses_p[0],
            th.where(upper < 0.0, complements[0] - masses_p[1], 1.0 - masses_p.sum(dim=0)),
        )
        # the inverse Mills ratios phi(z) / P at the clip points, under p and q, as sqrt(2 / pi) / erfcx(+-z / sqrt(2)):
        # finite (<= |z| + 1) where a limit's mass underflows, 0 where erfcx overflows; p's density is P times p's
        # (as P phi(z_q) / Q, in the gradient, is P times q's: both alike for equal distributions, bit for bit)
        mills = _SQRT_2_OVER_PI / th.special.erfcx(outward * z_scores * _SQRT_HALF)
        pdf = masses_p * mills[0]
        # the limits: log P(u >= bound) = log Phi(-upper), log P(u <= -bound) = log Phi(lower), under p and q
        log_masses = th.special.log_ndtr(-outward * z_scores)
        log_mass_ratios = log_masses[0] - log_masses[1]
        # q's z-scores of p's clip points: rho z + delta as documented, computed directly where no clamp tells them
        # apart (rho z + delta cancels where p is wide and its mean far from q's)
        free_q = (differences[1].abs() <= DIFFERENCE_LIMIT) & (z_scores[1].abs() < Z_SCORE_LIMIT)
        exact_q = free_q.all(dim=0) & (mean_difference.abs() <= DIFFERENCE_LIMIT) & (delta.abs() < Z_SCORE_LIMIT)
        exact_q &= double_log_ratio.abs() < 2 * LOG_STD_LIMIT
        clip_q = th.where(exact_q, z_scores[1], rho * z_scores[0] + delta)

        # The interior integral, and the moments the gradient takes: M1 = int phi z, and int phi (z_q - z), int phi z
        # (rho z_q - z), the parts of dKL/d delta and dKL/d d that vanish for equal distributions.
        # About p's mean, grouped by clip point: M2 = M0 + lower phi(lower) - upper phi(upper), M1 = phi(lower) -
        # phi(upper), the latter as phi of the nearer one times -expm1(-(upper^2 - lower^2) / 2)
        expm1_half_ratio = th.expm1(0.5 * double_log_ratio)
        inside = 0.5 * (expm1_ratio - double_log_ratio + delta.square()) * mass
        inside -= 0.5 * (outward * pdf * (expm1_ratio * z_scores[0] + 2.0 * rho * delta)).sum(dim=0)
        half_width = PRESQUASH_BOUND * inv_stds[0]
        spread = (2.0 * half_width * means[0].abs() * inv_stds[0]).neg_().expm1_().neg_()
        first = th.sign(-means[0]) * pdf.amax(dim=0) * spread
        first_gap = expm1_half_ratio * first + delta * mass
        second_gap = expm1_ratio * mass - (outward * pdf * (expm1_ratio * z_scores[0] + rho * delta)).sum(dim=0)

        # About the clip point nearer p's mean, where that lies far in p's tail: with t = |z| running from x there to y
        # at the other, I_k = int_x^y (t - x)^k phi(t) dt = A_k(x) - A_k(y) - ..., A_k(x) = int_x^inf (t - x)^k phi(t)
        tail = (lower > _TAIL_Z) | (upper < -_TAIL_Z)
        if _may_hold(tail):
            beyond_upper = upper < 0.0
            near, far = th.where(beyond_upper, -upper, lower), th.where(beyond_upper, -lower, upper)
            inward = 1.0 - 2.0 * beyond_upper.to(means.dtype)  # z - z_near = inward (t - x)
            near_z, near_q = th.where(beyond_upper, upper, lower), th.where(beyond_upper, clip_q[0], clip_q[1])
            # 1 - Phi(x), 1 - Phi(y)
            tails_near = th.stack(
                [th.where(beyond_upper, complements[0], complements[1]), th.where(beyond_upper, masses_p[1], masses_p[0])]
            )
            first_ratio, second_ratio = _mills_ratios(th.stack([near, far]).clamp_(min=_TAIL_Z))
            by_first = tails_near * first_ratio
            width = 2.0 * half_width
            moment_1 = by_first[0] - by_first[1] - width * tails_near[1]
            by_second = by_first * second_ratio
            moment_2 = by_second[0] - by_second[1] - 2.0 * width * by_first[1] - width.square() * tails_near[1]
            slope = rho * near_q - near_z  # L'(z) = rho z_q - z at the nearer clip point
            log_ratio_near = 0.5 * (near_q - near_z) * (near_q + near_z) - 0.5 * double_log_ratio
            inside = th.where(tail, log_ratio_near * mass + inward * slope * moment_1 + 0.5 * expm1_ratio * moment_2, inside)
            first = th.where(tail, near_z * mass + inward * moment_1, first)
            first_gap = th.where(tail, (near_q - near_z) * mass + inward * expm1_half_ratio * moment_1, first_gap)
            near_gap = near_z * slope * mass + inward * (slope + expm1_ratio * near_z) * moment_1 + expm1_ratio * moment_2
            second_gap = th.where(tail, near_gap, second_gap)

        # Quadrature in u where the clip interval is short in p's z-scores (no clamp is active for p there): p's partial
        # moments U_k = int phi(z) u^k dz, from phi at the nodes by one product with their weights; z, z_q - z, z_q + z
        # and rho z_q - z are affine in u (inf and NaN here are only of elements in the other regimes, not used)
        free_p = ((differences[0].abs() <= DIFFERENCE_LIMIT) & (z_scores[0].abs() < Z_SCORE_LIMIT)).all(dim=0)
        short = free_p & (half_width <= _SHORT_WIDTH) & (means[0].abs() * inv_stds[0] * half_width <= _SHORT_SLOPE)
        if _may_hold(short):
            nodes, node_moments = _legendre(means.device)
            offset = -means[0] * inv_stds[0]  # z = u / std_p + offset
            at_nodes = th.addcmul(offset.reshape(1, -1), nodes.view(-1, 1), inv_stds[0].reshape(1, -1))
            at_nodes = at_nodes.square_().mul_(-0.5).exp_()
            u_moments = (node_moments @ at_nodes).view(3, *offset.shape).mul_(inv_stds[0] * _INV_SQRT_2PI)
            # z_q - z = gap_slope u + gap_offset: the offset from q's own z-score where no clamp intervenes and its terms
            # are the smaller (means far from q's), else as documented (close distributions: both terms first order)
            gap_slope = expm1_half_ratio * inv_stds[0]
            by_mean = means[0] * gap_slope
            own_terms = (means * inv_stds).abs().sum(dim=0)
            own = exact_q & (own_terms < delta.abs() + by_mean.abs())
            gap_offset = th.where(own, means[0] * inv_stds[0] - means[1] * inv_stds[1], delta - by_mean)
            sum_slope, sum_offset = 2.0 * inv_stds[0] + gap_slope, 2.0 * offset + gap_offset  # z_q + z
            # rho z_q - z = expm1(d) z + rho (z_q - z)
            lift_slope = expm1_half_ratio * inv_stds[0] + rho * gap_slope
            lift_offset = expm1_half_ratio * offset + rho * gap_offset

            log_ratio = (
                0.5 * _product_moment(u_moments, gap_slope, gap_offset, sum_slope, sum_offset)
                - 0.5 * double_log_ratio * u_moments[0]
            )
            inside = th.where(short, log_ratio, inside)
            first = th.where(short, inv_stds[0] * u_moments[1] + offset * u_moments[0], first)
            first_gap = th.where(short, gap_slope * u_moments[1] + gap_offset * u_moments[0], first_gap)
            second_gap = th.where(short, _product_moment(u_moments, inv_stds[0], offset, lift_slope, lift_offset), second_gap)

        # Rounding can make the KL of (nearly) equal distributions slightly negative
        kl = inside.add_((masses_p * log_mass_ratios).sum(dim=0)).clamp_(min=0.0)
        ctx.save_for_backward(
            log_stds, inv_stds, differences, z_scores, mean_difference, delta, double_log_ratio, masses_p,
            log_mass_ratios, pdf, mills[1], clip_q, first, first_gap, second_gap,
        )  # fmt: skip
        ctx.scale = 1.0 / kl.shape[0] if batchmean else 1.0
        # batchmean: a float64 sum cannot overflow
        return kl.sum().mul_(ctx.scale).to(dtype) if batchmean else kl.to(dtype)

    @staticmethod
    def backward(ctx: Any, grad: th.Tensor) -> tuple[th.Tensor | None, ...]:
        (
            log_stds, inv_stds, differences, z_scores, mean_difference, delta, double_log_ratio, masses_p,
            log_mass_ratios, pdf, mills_q, clip_q, first, first_gap, second_gap,
        ) = ctx.saved_tensors  # fmt: skip
        grad = grad.double() * ctx.scale
        outward = _outward(delta, delta.dim())
        # where each clamp lets its input through (else no gradient): the z-scores' (for the means also their
        # differences'), delta's, 2d's and the log-stds'
        z_free = (differences.clamp(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT) * inv_stds.unsqueeze(1)).abs() <= Z_SCORE_LIMIT
        mean_free = z_free & (differences.abs() <= DIFFERENCE_LIMIT)
        inv_std_p, inv_std_q = inv_stds
        delta_free = (mean_difference.clamp(-DIFFERENCE_LIMIT, DIFFERENCE_LIMIT) * inv_std_q).abs() <= Z_SCORE_LIMIT
        delta_mean_free = delta_free & (mean_difference.abs() <= DIFFERENCE_LIMIT)
        clamped_log_stds = log_stds.clamp(-LOG_STD_LIMIT, LOG_STD_LIMIT)
        ratio_free = ((clamped_log_stds[0] - clamped_log_stds[1]) * 2.0).abs() <= 2 * LOG_STD_LIMIT
        # The chain rule through the z-scores (d/d mean = -1 / std, d/d log_std = -z), delta and d. dKL/d delta =
        # M1 + first_gap, dKL/d d = (M2 - M0) + second_gap, with M1 = -sum(outward phi), M2 - M0 = -sum(outward phi z)
        # over the clip points: those parts cancel against the clip points' own terms (up to the clamps' masks), so
        # that each gradient is exactly 0 for equal distributions (as it is) and nothing large cancels where p is wide
        needs = ctx.needs_input_grad
        grads: list[th.Tensor | None] = [None] * 4
        if needs[0] or needs[1]:  # the old distribution's parameters are usually constants
            # L(z) - log(P / Q) at p's clip points, L the log density ratio (z_q^2 - z^2) / 2 - d
            excess = 0.5 * (clip_q - z_scores[0]) * (clip_q + z_scores[0]) - 0.5 * double_log_ratio - log_mass_ratios
            by_clip = outward * pdf * excess
            by_delta = inv_std_q * delta_mean_free
            grads[0] = (by_delta - inv_std_p) * first + by_delta * first_gap - inv_std_p * (by_clip * mean_free[0]).sum(dim=0)
            by_log_std = second_gap * ratio_free - (by_clip * z_scores[0] * z_free[0]).sum(dim=0)
            by_log_std += (outward * pdf * z_scores[0]).sum(dim=0) * ~ratio_free
            grads[1] = by_log_std * (log_stds[0].abs() <= LOG_STD_LIMIT)
        if needs[2] or needs[3]:
            # P phi(z_q) / Q at q's clip points, less p's density there (M1's part of dKL/d delta)
            by_clip = outward * masses_p * mills_q
            by_mean = (by_clip * mean_free[1] - outward * pdf * delta_mean_free).sum(dim=0)
            grads[2] = -inv_std_q * (by_mean + first_gap * delta_mean_free)
            by_log_std = (by_clip * z_scores[1] * z_free[1] - outward * pdf * z_scores[0] * ratio_free).sum(dim=0)
            by_log_std = by_log_std + second_gap * ratio_free + (first + first_gap) * delta * delta_free
            grads[3] = -by_log_std * (log_stds[1].abs() <= LOG_STD_LIMIT)
        # Inputs broadcast in the forward pass get their gradient summed back to their shape
        return (
            *(
                (grad * g).sum_to_size(shape).to(dtype) if g is not None and needed else None
                for g, shape, dtype, needed in zip(grads, ctx.shapes, ctx.dtypes, needs[:4], strict=True)
            ),
            None,
        )


def clipped_gaussian_kl(
    mean_p: th.Tensor, log_std_p: th.Tensor, mean_q: th.Tensor, log_std_q: th.Tensor, reduction: Reduction = "none"
) -> th.Tensor:
    """
    Element-wise KL of sb3-safe's squashed Gaussians (:func:`~sb3_safe.common.distributions.squash`): ``u ~ N(mean,
    std)`` clipped to ``+-PRESQUASH_BOUND``, whose limit actions carry the mass beyond. tanh is a bijection inside,
    so the KL is that of the clipped Gaussians: the pre-squash Gaussians' KL integrated between the clip points, plus
    ``P_p log(P_p / P_q)`` for the mass ``P`` on each limit. Less than the pre-squash Gaussians' KL by what clipping
    hides (e.g. about 0 for two means far beyond the same limit).

    With ``z = (u - mean_p) / std_p``, ``log p(u) - log q(u) = ((rho^2 - 1) z^2 + 2 rho delta z + delta^2) / 2 - d``
    (``d = log_std_p - log_std_q``, ``rho = exp(d)``, ``delta = (mean_p - mean_q) / std_q``), so the integral takes the
    standard normal's partial moments between the clip points' z-scores. Computed in float64, in forms whose terms do
    not cancel (see ``tests/test_kl_accuracy.py``, against mpmath): within a few ulps of what float64 resolves, eps
    times the size of the terms ``P log P``, ``P log Q``, ``p log p``, ``p log q`` and of their sensitivity to the clip
    points' z-scores, delta and d. That is a relative error of a few ulps, except where those terms cancel, as they do
    to first order for close distributions (an absolute error of a few ulps of the limits' ``P log P`` there), and
    below ~1e-270, where p's interior mass underflows. With the clamps of :func:`gaussian_kl`: finite, with finite
    gradients, for all finite inputs.

    :param mean_p: pre-squash mean of the first distribution
    :param log_std_p: its pre-squash log-std, inside ``[-LOG_STD_LIMIT, LOG_STD_LIMIT]`` (a value beyond is taken as
        the limit)
    :param mean_q: pre-squash mean of the second distribution
    :param log_std_q: its pre-squash log-std, likewise
    :param reduction: as for :func:`gaussian_kl`
    """
    return _ClippedGaussianKL.apply(mean_p, log_std_p, mean_q, log_std_q, _batchmean(reduction))


def _batchmean(reduction: Reduction) -> bool:
    if reduction not in ("none", "batchmean"):
        raise ValueError(f"reduction must be 'none' or 'batchmean', got {reduction!r}")
    return reduction == "batchmean"


def _batch_mean(per_sample: th.Tensor) -> th.Tensor:
    """The mean over the first dimension, divided before it sums: the sum of large finite values can overflow."""
    return per_sample.div(per_sample.shape[0]).sum(dim=0)


def categorical_kl(log_p: th.Tensor, log_q: th.Tensor, reduction: Reduction = "none") -> th.Tensor:
    """
    ``KL(p || q)`` of categoricals over the last dimension, from normalized log-probabilities.

    Both are floored at ``LOG_PROB_FLOOR`` first: every term is then finite and terms with ``p = 0`` count 0, also
    where a log-probability is -inf (SB3's unbounded logits can give that); a KL is at most about ``-LOG_PROB_FLOOR``.
    Inputs above the floor are unchanged. One ``kl_div``: this runs in every minibatch, where each small operation
    costs its dispatch.

    :param log_p: log-probabilities of p
    :param log_q: log-probabilities of q
    :param reduction: ``"none"``: one KL per sample (all dimensions but the last); ``"batchmean"``: their sum
        divided by the size of the first dimension
    """
    log_q, log_p = log_q.clamp(min=LOG_PROB_FLOOR), log_p.clamp(min=LOG_PROB_FLOOR)
    terms = F.kl_div(log_q, log_p, reduction="none", log_target=True)
    # Rounding can make a KL of (nearly) equal distributions slightly negative
    if _batchmean(reduction):
        # Divided before the sum, which a batch of KLs near the largest one would overflow
        return terms.div_(terms.shape[0]).sum().clamp(min=0.0)
    return terms.sum(dim=-1).clamp(min=0.0)


def bernoulli_kl(logits_p: th.Tensor, logits_q: th.Tensor) -> th.Tensor:
    """
    Element-wise ``KL(Bernoulli(p) || Bernoulli(q))`` from logits, in log-space.

    :param logits_p: logits of p
    :param logits_q: logits of q
    """
    log_p = th.stack([F.logsigmoid(-logits_p), F.logsigmoid(logits_p)], dim=-1)
    log_q = th.stack([F.logsigmoid(-logits_q), F.logsigmoid(logits_q)], dim=-1)
    return categorical_kl(log_p, log_q)


def analytic_kl(old_params: th.Tensor, distribution: Distribution, reduction: Reduction = "none") -> th.Tensor:
    """
    ``KL(pi_old || pi)`` per sample, summed over action dimensions.

    :param old_params: ``(batch, width)`` parameters of the old policy, from :func:`distribution_params`
    :param distribution: the current distribution on the same observations (gradients flow through it); a maskable
        one with the same masks as the old one
    :param reduction: ``"none"``: the ``(batch,)`` per-sample KLs; ``"batchmean"``: their mean (a scalar)
    :return: finite and >= 0
    """
    batchmean = _batchmean(reduction)
    gaussian = _gaussian(distribution)
    if gaussian is not None:
        old_mean, old_log_std = old_params.chunk(2, dim=1)
        kl_of = clipped_gaussian_kl if _is_clipped(distribution) else gaussian_kl
        kl = kl_of(old_mean, old_log_std, *gaussian, reduction=reduction)
        return kl if batchmean else kl.sum(dim=1)
    log_probs = _categorical_log_probs(distribution)
    if log_probs is not None and len(log_probs) == 1:
        return categorical_kl(old_params, log_probs[0], reduction=reduction)
    if log_probs is not None:
        splits = zip(old_params.split([new.shape[-1] for new in log_probs], dim=1), log_probs, strict=True)
        per_sample = th.stack([categorical_kl(old, new) for old, new in splits], dim=1).sum(dim=1)
    elif isinstance(distribution, BernoulliDistribution):
        per_sample = bernoulli_kl(old_params, distribution.distribution.logits).sum(dim=1)
    else:
        raise ValueError(f"No analytic KL for {type(distribution).__name__}; use approx_kl")
    return _batch_mean(per_sample) if batchmean else per_sample


def clamp_log_ratio(log_ratio: th.Tensor) -> th.Tensor:
    """
    ``log_ratio`` clamped to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]``, so that ``exp`` of it is finite.

    :param log_ratio: ``log pi(a|s) - log pi_old(a|s)``
    """
    return log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def approx_kl(log_ratio: th.Tensor) -> th.Tensor:
    """
    The estimator ``(ratio - 1) - log(ratio)`` of ``KL(pi_old || pi)`` on samples from ``pi_old``, per sample.

    Non-negative, unbiased and low-variance (Schulman, "Approximating KL divergence", 2020); finite, since
    ``log_ratio`` is clamped first.

    :param log_ratio: ``log pi(a|s) - log pi_old(a|s)`` at the stored actions
    """
    clamped = clamp_log_ratio(log_ratio)
    return (th.expm1(clamped) - clamped).clamp(min=0.0)
