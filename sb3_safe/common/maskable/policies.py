"""Drop-in sb3-contrib maskable policies (for ``MaskablePPO``) whose action distributions stay finite and valid."""

from typing import Any, ClassVar

from gymnasium import spaces
from sb3_contrib.common.maskable.policies import (
    MaskableActorCriticCnnPolicy,
    MaskableActorCriticPolicy,
    MaskableMultiInputActorCriticPolicy,
)
from stable_baselines3.common.torch_layers import CombinedExtractor, NatureCNN
from stable_baselines3.common.type_aliases import Schedule

from sb3_safe.common.distributions import DEFAULT_LOGIT_BOUND
from sb3_safe.common.maskable.distributions import make_safe_masked_distribution
from sb3_safe.common.observation_norm import NormalizeObservations
from sb3_safe.common.policies import PolicyAlgorithmMismatchError, SafeDistributionMixin


class SafeMaskableActorCriticPolicy(SafeDistributionMixin, MaskableActorCriticPolicy):
    """
    sb3-contrib's ``MaskableActorCriticPolicy`` (``MaskablePPO``'s ``"MlpPolicy"``) with logits bounded before the
    mask is applied, so that masked actions have probability exactly 0 and every valid action keeps at least
    ``min_action_probability(n_valid, logit_bound)`` (see :mod:`sb3_safe.common.maskable.distributions`).

    Accepts every ``MaskableActorCriticPolicy`` keyword, plus:

    :param observation_space: the observation space (the algorithm passes it)
    :param action_space: the action space (the algorithm passes it)
    :param lr_schedule: the learning-rate schedule the optimizer starts from (the algorithm passes it)
    :param logit_bound: logits are mapped smoothly into ``(-logit_bound, logit_bound)`` before masking.
        ``None`` keeps sb3-contrib's raw logits.
    :param normalize_observations: normalize Box observations with running statistics kept in the policy (see
        :class:`~sb3_safe.common.policies.SafeActorCriticPolicy`)
    :param kwargs: the other keywords of sb3-contrib's :sb3-contrib:`MaskableActorCriticPolicy
        <modules/ppo_mask.html#sb3_contrib.common.maskable.policies.MaskableActorCriticPolicy>`, with their meaning
        there: ``net_arch``, ``activation_fn``, ``ortho_init``, ``features_extractor_class``,
        ``features_extractor_kwargs``, ``share_features_extractor``, ``normalize_images``, ``optimizer_class``,
        ``optimizer_kwargs``

    A non-finite network output raises :class:`sb3_safe.NonFiniteError` naming it; a mask without a valid action
    raises ``ValueError``. The ``state_dict`` keys are those of sb3-contrib's policy, plus ``observation_normalizer.*``
    where observations are normalized (see :class:`~sb3_safe.common.policies.SafeActorCriticPolicy`).

    Given to an algorithm other than ``MaskablePPO``, it raises
    :class:`~sb3_safe.common.policies.PolicyAlgorithmMismatchError` naming both when the algorithm builds it:
    MaskablePPO builds its policy without ``use_sde``, which every SB3 on-policy algorithm and SAC pass; DQN and
    TD3 read parts it does not have.
    """

    safe_keywords: ClassVar[tuple[str, ...]] = ("logit_bound", "normalize_observations")
    served_algorithms: ClassVar[str] = "MaskablePPO"

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        logit_bound: float | None = DEFAULT_LOGIT_BOUND,
        normalize_observations: NormalizeObservations = False,
        **kwargs: Any,
    ):
        if "use_sde" in kwargs:
            # MaskableActorCriticPolicy has no use_sde (sb3-contrib's would fail on it with a bare TypeError)
            raise PolicyAlgorithmMismatchError(
                f"{type(self).__name__} serves {self.served_algorithms}, not an algorithm that builds its policy "
                "with use_sde (PPO, A2C, KLAdaptivePPO, SafeA2C, TRPO, RecurrentPPO, SAC): give those "
                'sb3_safe.SafeMlpPolicy (SAC its own "MlpPolicy")'
            )
        # Action masking is for discrete actions only: no log-std, no squashing
        self._init_safe_arguments(
            action_space,
            logit_bound=logit_bound,
            observation_space=observation_space,
            normalize_observations=normalize_observations,
        )
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def _set_safe_action_dist(self) -> None:
        self.action_dist = make_safe_masked_distribution(self.action_space, self.logit_bound)


class SafeMaskableCnnPolicy(SafeMaskableActorCriticPolicy, MaskableActorCriticCnnPolicy):
    """
    :class:`SafeMaskableActorCriticPolicy` for image observations, with SB3's ``NatureCNN`` features extractor by
    default, like ``MaskableActorCriticCnnPolicy`` (``"CnnPolicy"``).

    :param args: the observation space, the action space and the learning-rate schedule, as for
        :class:`SafeMaskableActorCriticPolicy`
    :param features_extractor_class: the network that turns images into features (SB3's ``NatureCNN``)
    :param kwargs: the keywords of :class:`SafeMaskableActorCriticPolicy`
    """

    def __init__(self, *args: Any, features_extractor_class: type = NatureCNN, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


class SafeMaskableMultiInputPolicy(SafeMaskableActorCriticPolicy, MaskableMultiInputActorCriticPolicy):
    """
    :class:`SafeMaskableActorCriticPolicy` for Dict observations, with SB3's ``CombinedExtractor`` by default, like
    ``MaskableMultiInputActorCriticPolicy`` (``"MultiInputPolicy"``).

    :param args: the observation space, the action space and the learning-rate schedule, as for
        :class:`SafeMaskableActorCriticPolicy`
    :param features_extractor_class: the network that turns each observation key into features and concatenates
        them (SB3's ``CombinedExtractor``)
    :param kwargs: the keywords of :class:`SafeMaskableActorCriticPolicy`
    """

    def __init__(self, *args: Any, features_extractor_class: type = CombinedExtractor, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


SafeMaskableMlpPolicy = SafeMaskableActorCriticPolicy
