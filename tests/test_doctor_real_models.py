"""
No false alarm: every kind of model file the project writes, or loads from SB3 and sb3-contrib, is "Healthy" for
``sb3-safe doctor`` (its pickles name only allowed globals) and loads back with SB3's ``load``.
"""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch as th
from rl_zoo3.utils import linear_schedule
from sb3_contrib import TRPO, MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, DQN, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.envs import FakeImageEnv, IdentityEnvMultiBinary, IdentityEnvMultiDiscrete, SimpleMultiObsEnv
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.utils import FloatSchedule, LinearSchedule

from sb3_safe import KLAdaptivePPO, NonFiniteGuardCallback, SafeA2C, SafeMaskableMlpPolicy, SafeMlpLstmPolicy, SafeMlpPolicy
from sb3_safe.cli import main
from sb3_safe.common.schedules import ScaledSchedule, scale_learning_rate
from sb3_safe.doctor import EXIT_HEALTHY, diagnose


def small(**kwargs: object) -> dict[str, object]:
    """Fresh policy_kwargs each time: SB3's off-policy algorithms add use_sde to the dict they are given."""
    return dict(net_arch=[8], **kwargs)


ON_POLICY = dict(n_steps=16, batch_size=16, n_epochs=1)


def _rolled_back() -> BaseAlgorithm:
    """A model whose learning rate a rollback scaled: ScaledSchedule in lr_schedule and learning_rate."""
    model = KLAdaptivePPO("MlpPolicy", "Pendulum-v1", **ON_POLICY, policy_kwargs=small())
    scale_learning_rate(model, [model.policy.optimizer], 0.5)
    return model


#: (model, timesteps to train before saving)
MODELS: dict[str, Callable[[], tuple[BaseAlgorithm, int]]] = {
    "PPO net_arch dict, ReLU, RMSprop with kwargs": lambda: (
        PPO(
            "MlpPolicy",
            "Pendulum-v1",
            **ON_POLICY,
            policy_kwargs=dict(
                net_arch=dict(pi=[8], vf=[8]),
                activation_fn=th.nn.ReLU,
                optimizer_class=th.optim.RMSprop,
                optimizer_kwargs=dict(alpha=0.9),
            ),
        ),
        16,
    ),
    "PPO gSDE, squash_output, LinearSchedule, a features extractor class": lambda: (
        PPO(
            "MlpPolicy",
            "Pendulum-v1",
            **ON_POLICY,
            use_sde=True,
            learning_rate=LinearSchedule(1e-3, 1e-4, 0.5),
            policy_kwargs=small(squash_output=True, features_extractor_class=FlattenExtractor),
        ),
        16,
    ),
    "PPO MultiInputPolicy": lambda: (PPO("MultiInputPolicy", SimpleMultiObsEnv(), **ON_POLICY), 16),
    "A2C with rl_zoo3's lin_ schedule": lambda: (
        A2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=linear_schedule(7e-4), policy_kwargs=small()),
        16,
    ),
    "KLAdaptivePPO squash_output, log_std_range, Tanh, ScaledSchedule": lambda: (
        KLAdaptivePPO(
            "MlpPolicy",
            "Pendulum-v1",
            **ON_POLICY,
            learning_rate=ScaledSchedule(3e-4, 0.5),
            policy_kwargs=small(squash_output=True, log_std_range=(-3.0, 1.0), activation_fn=th.nn.Tanh),
        ),
        16,
    ),
    "KLAdaptivePPO discrete, logit_bound": lambda: (
        KLAdaptivePPO("MlpPolicy", "CartPole-v1", **ON_POLICY, policy_kwargs=small(logit_bound=5.0)),
        16,
    ),
    "KLAdaptivePPO MultiDiscrete": lambda: (KLAdaptivePPO("MlpPolicy", IdentityEnvMultiDiscrete(2, 2), **ON_POLICY), 16),
    "KLAdaptivePPO MultiBinary": lambda: (KLAdaptivePPO("MlpPolicy", IdentityEnvMultiBinary(2), **ON_POLICY), 16),
    "KLAdaptivePPO CnnPolicy": lambda: (
        KLAdaptivePPO("CnnPolicy", FakeImageEnv(screen_height=36, screen_width=36), n_steps=8, batch_size=8, n_epochs=1),
        8,
    ),
    "KLAdaptivePPO after a rollback": lambda: (_rolled_back(), 16),
    "KLAdaptivePPO trained with NonFiniteGuardCallback": lambda: (
        KLAdaptivePPO("MlpPolicy", "Pendulum-v1", **ON_POLICY, policy_kwargs=small()),
        -16,  # negative: learn with the guard
    ),
    "SafeA2C RMSpropTFLike, huber, FloatSchedule": lambda: (
        SafeA2C(
            "MlpPolicy",
            "Pendulum-v1",
            n_steps=8,
            use_rms_prop_tf_like=True,
            value_loss="huber",
            learning_rate=FloatSchedule(1e-3),
            policy_kwargs=small(),
        ),
        16,
    ),
    "SafeA2C with SB3's policy": lambda: (SafeA2C(ActorCriticPolicy, "CartPole-v1", n_steps=8, policy_kwargs=small()), 16),
    "TRPO SafeMlpPolicy": lambda: (TRPO(SafeMlpPolicy, "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=small()), 16),
    "TRPO": lambda: (TRPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, policy_kwargs=small()), 16),
    "MaskablePPO SafeMaskableMlpPolicy": lambda: (
        MaskablePPO(SafeMaskableMlpPolicy, InvalidActionEnvDiscrete(dim=10, n_invalid_actions=3), **ON_POLICY),
        16,
    ),
    "MaskablePPO": lambda: (MaskablePPO("MlpPolicy", InvalidActionEnvDiscrete(dim=10, n_invalid_actions=3), **ON_POLICY), 16),
    "RecurrentPPO SafeMlpLstmPolicy": lambda: (
        RecurrentPPO(SafeMlpLstmPolicy, "Pendulum-v1", **ON_POLICY, policy_kwargs=small(lstm_hidden_size=8)),
        16,
    ),
    "RecurrentPPO": lambda: (
        RecurrentPPO("MlpLstmPolicy", "CartPole-v1", **ON_POLICY, policy_kwargs=small(lstm_hidden_size=8)),
        16,
    ),
    "SAC gSDE": lambda: (
        SAC("MlpPolicy", "Pendulum-v1", use_sde=True, learning_starts=8, batch_size=8, buffer_size=64, policy_kwargs=small()),
        16,
    ),
    "TD3 action noise": lambda: (
        TD3(
            "MlpPolicy",
            "Pendulum-v1",
            action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)),
            learning_starts=8,
            batch_size=8,
            buffer_size=64,
            policy_kwargs=small(),
        ),
        16,
    ),
    "DQN": lambda: (
        DQN("MlpPolicy", "CartPole-v1", learning_starts=8, batch_size=8, buffer_size=64, policy_kwargs=small()),
        16,
    ),
}


@pytest.mark.parametrize("name", MODELS)
def test_real_model_files_are_healthy(name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model, timesteps = MODELS[name]()
    if timesteps < 0:
        model.learn(-timesteps, callback=NonFiniteGuardCallback())
    else:
        model.learn(timesteps)
    model.save(tmp_path / "model.zip")
    assert main(["doctor", str(tmp_path / "model.zip")]) == EXIT_HEALTHY
    out = capsys.readouterr().out
    assert "Healthy: all" in out and "UNSAFE" not in out and "Not checked" not in out
    report = diagnose(tmp_path / "model.zip")
    assert (
        report.unsafe == []
        and report.unchecked == []
        and report.policy_class == (f"{type(model.policy).__module__}.{type(model.policy).__name__}")
    )
    # and the file is one SB3 loads
    assert type(type(model).load(tmp_path / "model.zip", device="cpu").policy) is type(model.policy)
