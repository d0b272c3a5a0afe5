"""
Maskable action distributions (sb3-contrib's, for ``MaskablePPO``) over bounded logits.

The network's logits are first bounded as in :class:`sb3_safe.common.distributions.SafeCategoricalDistribution`
(``c * tanh(z / c)``, :func:`~sb3_safe.common.distributions.bound_logits`), then the mask is applied as sb3-contrib
applies it (invalid logits replaced by ``-1e8``). With the bound, the masked logits lie at least ``1e8 - c`` below every
valid one, so for every finite network output and every mask with a valid action:

- a masked action has probability exactly 0 (``exp(-1e8)`` is 0 in float32 and float64);
- each of the ``n_valid`` valid actions of a categorical keeps probability at least
  ``min_action_probability(n_valid, c)`` (:func:`~sb3_safe.common.distributions.min_action_probability`);
- log-probs of valid actions, the entropy and their gradients are finite;
- torch's argument validation is off (``validate_args=False``, as in the other safe distributions), so no
  ``Simplex()`` error can come from float32 probabilities that do not sum to 1 exactly over many actions.

With ``logit_bound=None`` (sb3-contrib's raw logits) none of this holds: a valid logit below ``-1e8`` leaves the
masked actions more likely than it.

A non-finite network output raises :class:`~sb3_safe.common.numerics.NonFiniteError` naming it, and a mask that
allows no action (of a categorical, of a sub-space) raises ``ValueError``: sb3-contrib would then sample any action,
the masked ones included.
"""

from typing import TypeVar

import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import (
    MaskableCategorical,
    MaskableCategoricalDistribution,
    MaskableDistribution,
    MaskableMultiCategoricalDistribution,
    MaybeMasks,
)

from sb3_safe.common.distributions import (
    DEFAULT_LOGIT_BOUND,
    NONFINITE_OUTPUT_HINT,
    bound_logits,
    validate_logit_bound,
)
from sb3_safe.common.numerics import check_finite

SelfSafeMaskableCategorical = TypeVar("SelfSafeMaskableCategorical", bound="SafeMaskableCategoricalDistribution")
SelfSafeMaskableMultiCategorical = TypeVar(
    "SelfSafeMaskableMultiCategorical", bound="SafeMaskableMultiCategoricalDistribution"
)


def safe_logits(action_logits: th.Tensor, logit_bound: float | None) -> th.Tensor:
    """
    The network's logits, checked for NaN / inf and bounded (:func:`~sb3_safe.common.distributions.bound_logits`).

    :param action_logits: raw network output
    :param logit_bound: the bound, or None for sb3-contrib's raw logits
    :raises NonFiniteError: naming ``policy output logits``
    """
    check_finite("policy output logits", action_logits, NONFINITE_OUTPUT_HINT)
    return bound_logits(action_logits, logit_bound)


def check_action_masks(masks: MaybeMasks, action_dims: list[int]) -> th.Tensor | None:
    """
    The masks as a boolean tensor of shape ``(batch, sum(action_dims))``, after checking that each categorical
    (each sub-space of a MultiDiscrete, each binary of a MultiBinary) has a valid action in every row.

    :param masks: sb3-contrib's masks (True: valid), of any shape with ``sum(action_dims)`` entries per row; or None
    :param action_dims: number of actions of each categorical
    :return: the masks, or None for None (no masking)
    :raises ValueError: naming the first rows and sub-spaces where no action is valid
    """
    if masks is None:
        return None
    masks_tensor = th.as_tensor(masks, dtype=th.bool).reshape(-1, sum(action_dims))
    valid = th.stack([split.any(dim=1) for split in th.split(masks_tensor, action_dims, dim=1)], dim=1)
    if not bool(valid.all()):
        empty = (~valid).nonzero().tolist()
        where = ", ".join(f"row {row} sub-space {space}" for row, space in empty[:5])
        more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        raise ValueError(
            f"action mask allows no action at {where}{more} (action dims {action_dims}): every categorical needs "
            "at least one valid action; otherwise masked actions would be sampled"
        )
    return masks_tensor


class SafeMaskableCategoricalDistribution(MaskableCategoricalDistribution):
    """
    sb3-contrib's maskable categorical (Discrete actions) over bounded logits.

    :param action_dim: number of actions
    :param logit_bound: the bound, or None for sb3-contrib's raw logits
    """

    def __init__(self, action_dim: int, logit_bound: float | None = DEFAULT_LOGIT_BOUND):
        super().__init__(action_dim)
        self.logit_bound = validate_logit_bound(logit_bound)

    def proba_distribution(self: SelfSafeMaskableCategorical, action_logits: th.Tensor) -> SelfSafeMaskableCategorical:
        logits = safe_logits(action_logits.view(-1, self.action_dim), self.logit_bound)
        self.distribution = MaskableCategorical(logits=logits, validate_args=False)
        return self

    def apply_masking(self, masks: MaybeMasks) -> None:
        self.distribution.apply_masking(check_action_masks(masks, [self.action_dim]))


class SafeMaskableMultiCategoricalDistribution(MaskableMultiCategoricalDistribution):
    """
    sb3-contrib's maskable multi-categorical (MultiDiscrete actions) over bounded logits.

    :param action_dims: number of actions of each discrete sub-space
    :param logit_bound: the bound, or None for sb3-contrib's raw logits
    """

    def __init__(self, action_dims: list[int], logit_bound: float | None = DEFAULT_LOGIT_BOUND):
        super().__init__([int(dim) for dim in action_dims])
        self.logit_bound = validate_logit_bound(logit_bound)

    def proba_distribution(
        self: SelfSafeMaskableMultiCategorical, action_logits: th.Tensor
    ) -> SelfSafeMaskableMultiCategorical:
        logits = safe_logits(action_logits.view(-1, sum(self.action_dims)), self.logit_bound)
        self.distributions = [
            MaskableCategorical(logits=split, validate_args=False) for split in th.split(logits, self.action_dims, dim=1)
        ]
        return self

    def apply_masking(self, masks: MaybeMasks) -> None:
        super().apply_masking(check_action_masks(masks, self.action_dims))


class SafeMaskableBernoulliDistribution(SafeMaskableMultiCategoricalDistribution):
    """
    sb3-contrib's maskable MultiBinary distribution over bounded logits: as in sb3-contrib, a categorical over
    ``{0, 1}`` with two logits per binary action (the mask has two entries per binary action), so each outcome
    that is valid keeps probability at least ``min_action_probability(2, logit_bound) = 1 / (1 + e^(2 c))``.

    :param action_dim: number of binary actions
    :param logit_bound: the bound, or None for sb3-contrib's raw logits
    """

    def __init__(self, action_dim: int, logit_bound: float | None = DEFAULT_LOGIT_BOUND):
        super().__init__([2] * action_dim, logit_bound)


def make_safe_masked_distribution(
    action_space: spaces.Space, logit_bound: float | None = DEFAULT_LOGIT_BOUND
) -> MaskableDistribution:
    """
    The safe counterpart of sb3-contrib's ``make_masked_proba_distribution``.

    :param action_space: a Discrete, MultiDiscrete or MultiBinary action space
    :param logit_bound: the logit bound, None for unbounded
    """
    if isinstance(action_space, spaces.Discrete):
        return SafeMaskableCategoricalDistribution(int(action_space.n), logit_bound)
    if isinstance(action_space, spaces.MultiDiscrete):
        return SafeMaskableMultiCategoricalDistribution(list(action_space.nvec), logit_bound)
    if isinstance(action_space, spaces.MultiBinary):
        assert isinstance(action_space.n, int), "Multi-dimensional MultiBinary action space is not supported"
        return SafeMaskableBernoulliDistribution(action_space.n, logit_bound)
    raise NotImplementedError(
        f"Unsupported action space {type(action_space).__name__} for action masking: sb3-contrib's maskable policies "
        "support Discrete, MultiDiscrete and MultiBinary."
    )
