"""Safe policies and distributions for sb3-contrib's ``MaskablePPO`` (invalid action masking)."""

from sb3_safe.common.maskable.distributions import (
    SafeMaskableBernoulliDistribution,
    SafeMaskableCategoricalDistribution,
    SafeMaskableMultiCategoricalDistribution,
    make_safe_masked_distribution,
)
from sb3_safe.common.maskable.policies import (
    SafeMaskableActorCriticPolicy,
    SafeMaskableCnnPolicy,
    SafeMaskableMlpPolicy,
    SafeMaskableMultiInputPolicy,
)

__all__ = [
    "SafeMaskableActorCriticPolicy",
    "SafeMaskableBernoulliDistribution",
    "SafeMaskableCategoricalDistribution",
    "SafeMaskableCnnPolicy",
    "SafeMaskableMlpPolicy",
    "SafeMaskableMultiCategoricalDistribution",
    "SafeMaskableMultiInputPolicy",
    "make_safe_masked_distribution",
]
