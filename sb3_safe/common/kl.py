"""
KL divergence ``KL(pi_old || pi)`` between the policy that collected a rollout and the current policy.

The old policy is kept as a flat tensor of distribution parameters per sample (see :func:`distribution_params`),
so the rollout buffer stays small and the KL is analytic for:

- diagonal Gaussians (SB3's and :class:`~sb3_safe.common.distributions.BoundedDiagGaussianDistribution`):
  stored as ``(mean, log_std)``;
- gSDE (SB3's ``StateDependentNoiseDistribution`` and
  :class:`~sb3_safe.common.distributions.BoundedStateDependentNoiseDistribution`): at each state a diagonal Gaussian
  whose std comes from the features and the exploration matrix's log-std, stored as ``(mean, log_std)`` too;
- tanh-squashed Gaussians (with or without gSDE): the KL of the pre-squash Gaussians, since KL is invariant under a
  bijection;
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

from typing import Any, Literal

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
    Z_SCORE_LIMIT,
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
)

#: |log_ratio| above which it is clamped before ``exp``: ratios stay in [2e-9, 4.9e8]
LOG_RATIO_LIMIT = 20.0

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
        # For the squashed Gaussian these are the pre-squash parameters: KL is invariant under tanh
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
        kl = gaussian_kl(old_mean, old_log_std, *gaussian, reduction=reduction)
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
