"""Drop-in sb3-contrib recurrent policies (for ``RecurrentPPO``) whose action distributions stay finite and valid."""

import warnings
from typing import Any, ClassVar

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.recurrent.policies import (
    RecurrentActorCriticCnnPolicy,
    RecurrentActorCriticPolicy,
    RecurrentMultiInputActorCriticPolicy,
)
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.torch_layers import CombinedExtractor, NatureCNN
from stable_baselines3.common.type_aliases import Schedule

from sb3_safe.common.policies import PolicyAlgorithmMismatchError, SafeActorCriticPolicy


class SafeRecurrentActorCriticPolicy(SafeActorCriticPolicy, RecurrentActorCriticPolicy):
    """
    sb3-contrib's ``RecurrentActorCriticPolicy`` (``RecurrentPPO``'s ``"MlpLstmPolicy"``) with the action
    distributions of :class:`~sb3_safe.common.policies.SafeActorCriticPolicy`: a bounded log-std (also with gSDE)
    projected into ``log_std_range`` after every step of the optimizer (also of the one sb3-contrib's constructor
    rebuilds for the LSTMs), ``squash_output`` without gSDE, bounded logits, and a
    :class:`sb3_safe.NonFiniteError` naming a non-finite network output.

    Accepts every ``RecurrentActorCriticPolicy`` keyword, plus ``log_std_range``, ``logit_bound``,
    ``squash_output`` and ``normalize_observations`` (see :class:`~sb3_safe.common.policies.SafeActorCriticPolicy`).
    The ``state_dict`` keys are those of sb3-contrib's policy, plus ``observation_normalizer.*`` where observations
    are normalized. :meth:`save` / :meth:`load` of the policy alone also restore the LSTM keywords
    (``lstm_hidden_size``, ``n_lstm_layers``, ``shared_lstm``, ``enable_critic_lstm``, ``lstm_kwargs``),
    which sb3-contrib's policy does not save.

    :param observation_space: the observation space (the algorithm passes it)
    :param action_space: the action space (the algorithm passes it)
    :param lr_schedule: the learning-rate schedule the optimizer starts from (the algorithm passes it)
    :param squash_output: Box actions: a tanh-squashed Gaussian, also without gSDE (see
        :class:`~sb3_safe.common.policies.SafeActorCriticPolicy`; mind the Box bounds, below)
    :param kwargs: ``log_std_range``, ``logit_bound`` and ``use_sde`` (see
        :class:`~sb3_safe.common.policies.SafeActorCriticPolicy`), and the other keywords of sb3-contrib's
        :sb3-contrib:`RecurrentActorCriticPolicy
        <modules/ppo_recurrent.html#sb3_contrib.common.recurrent.policies.RecurrentActorCriticPolicy>`, with their
        meaning there: ``lstm_hidden_size``, ``n_lstm_layers``, ``shared_lstm``, ``enable_critic_lstm``,
        ``lstm_kwargs``, ``net_arch``, ``activation_fn``, ``ortho_init``, ``log_std_init``, ``full_std``,
        ``use_expln``, ``features_extractor_class``, ``features_extractor_kwargs``, ``share_features_extractor``,
        ``normalize_images``, ``optimizer_class``, ``optimizer_kwargs``

    ``RecurrentPPO`` (sb3-contrib 2.9) clips the actions of its rollouts to the Box bounds without rescaling
    squashed actions to them, as ``predict`` and SB3's algorithms do: with ``squash_output`` the environment's
    Box should be ``[-1, 1]`` (gymnasium's ``RescaleAction`` wrapper), which a warning says otherwise.

    Given to an algorithm other than ``RecurrentPPO``, it raises
    :class:`~sb3_safe.common.policies.PolicyAlgorithmMismatchError` naming both: at construction for SAC, TD3,
    DQN and the like (they read parts it does not have), at the first forward pass for PPO, A2C and the other
    feed-forward on-policy algorithms (they build their policy with exactly RecurrentPPO's arguments, and call
    it without LSTM states).
    """

    served_algorithms: ClassVar[str] = "RecurrentPPO"

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        squash_output: bool = False,
        **kwargs: Any,
    ):
        unit_box = isinstance(action_space, spaces.Box) and np.all(action_space.low == -1) and np.all(action_space.high == 1)
        if squash_output and isinstance(action_space, spaces.Box) and not unit_box:
            warnings.warn(
                f"squash_output=True with the action space {action_space}: RecurrentPPO steps the environment "
                "with the squashed actions in [-1, 1] (clipped, not rescaled to the bounds; predict() rescales "
                "them). Rescale the environment's actions to [-1, 1] (gymnasium.wrappers.RescaleAction)."
            )
        super().__init__(observation_space, action_space, lr_schedule, squash_output=squash_output, **kwargs)

    def forward(  # type: ignore[override]
        self,
        obs: th.Tensor,
        lstm_states: RNNStates | None = None,
        episode_starts: th.Tensor | None = None,
        deterministic: bool = False,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, RNNStates]:
        """
        :param obs: the observations
        :param lstm_states: the LSTM states of the actor and the critic (RecurrentPPO passes them)
        :param episode_starts: whether each environment's episode starts at this step (resets its LSTM states)
        :param deterministic: take the most likely action instead of sampling
        """
        if lstm_states is None or episode_starts is None:
            raise PolicyAlgorithmMismatchError(
                f"{type(self).__name__} serves {self.served_algorithms}, not an algorithm that calls its policy "
                "without LSTM states (PPO, A2C, KLAdaptivePPO, SafeA2C, TRPO): give those sb3_safe.SafeMlpPolicy"
            )
        return super().forward(obs, lstm_states, episode_starts, deterministic)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            lstm_hidden_size=self.lstm_output_dim,
            n_lstm_layers=self.lstm_actor.num_layers,
            shared_lstm=self.shared_lstm,
            enable_critic_lstm=self.enable_critic_lstm,
            lstm_kwargs=self.lstm_kwargs,
        )
        return data


class SafeCnnLstmPolicy(SafeRecurrentActorCriticPolicy, RecurrentActorCriticCnnPolicy):
    """
    :class:`SafeRecurrentActorCriticPolicy` for image observations, with SB3's ``NatureCNN`` features extractor by
    default, like ``RecurrentActorCriticCnnPolicy`` (``"CnnLstmPolicy"``).

    :param args: the observation space, the action space and the learning-rate schedule, as for
        :class:`SafeRecurrentActorCriticPolicy`
    :param features_extractor_class: the network that turns images into features (SB3's ``NatureCNN``)
    :param kwargs: the keywords of :class:`SafeRecurrentActorCriticPolicy`
    """

    def __init__(self, *args: Any, features_extractor_class: type = NatureCNN, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


class SafeMultiInputLstmPolicy(SafeRecurrentActorCriticPolicy, RecurrentMultiInputActorCriticPolicy):
    """
    :class:`SafeRecurrentActorCriticPolicy` for Dict observations, with SB3's ``CombinedExtractor`` by default, like
    ``RecurrentMultiInputActorCriticPolicy`` (``"MultiInputLstmPolicy"``).

    :param args: the observation space, the action space and the learning-rate schedule, as for
        :class:`SafeRecurrentActorCriticPolicy`
    :param features_extractor_class: the network that turns each observation key into features and concatenates
        them (SB3's ``CombinedExtractor``)
    :param kwargs: the keywords of :class:`SafeRecurrentActorCriticPolicy`
    """

    def __init__(self, *args: Any, features_extractor_class: type = CombinedExtractor, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


SafeMlpLstmPolicy = SafeRecurrentActorCriticPolicy
