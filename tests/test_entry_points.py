"""
Clear errors, or the expected behaviour, at the other entry points: checkpoints loaded across stock and safe
algorithms, safe policies given to algorithms they cannot serve, and non-numeric safe keywords.
"""

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, DQN, PPO, SAC, TD3
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import SimpleMultiObsEnv
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_safe import KLAdaptivePPO, SafeA2C, SafeMaskableMlpPolicy, SafeMlpLstmPolicy, SafeMlpPolicy
from sb3_safe.common.buffers import KLDictRolloutBuffer, KLRolloutBuffer
from sb3_safe.common.distributions import validate_log_std_range, validate_logit_bound
from sb3_safe.common.policies import PolicyAlgorithmMismatchError, SafeActorCriticPolicy, SafeMultiInputPolicy

SMALL = dict(n_steps=16, batch_size=16, n_epochs=1)
ACTOR_CRITIC = "SafeActorCriticPolicy serves PPO, A2C, KLAdaptivePPO, SafeA2C and TRPO, not"
MASKABLE = "SafeMaskableActorCriticPolicy serves MaskablePPO"


def _same_parameters(first: th.nn.Module, second: th.nn.Module) -> bool:
    one, other = first.state_dict(), second.state_dict()
    return one.keys() == other.keys() and all(th.equal(one[key], other[key]) for key in one)


def _adam_moments(optimizer: th.optim.Optimizer) -> list[th.Tensor]:
    return [state["exp_avg"] for state in optimizer.state_dict()["state"].values()]


def test_kl_adaptive_ppo_continues_a_ppo_checkpoint(tmp_path: Path) -> None:
    """KLAdaptivePPO.load(stock PPO zip): the safe policy with the same weights and Adam state, the KL buffer, training."""
    stock = PPO("MlpPolicy", "Pendulum-v1", **SMALL, policy_kwargs=dict(net_arch=[8]), seed=0).learn(16)
    stock.save(tmp_path / "ppo.zip")
    model = KLAdaptivePPO.load(tmp_path / "ppo", env=make_vec_env("Pendulum-v1", seed=0), device="cpu")
    assert type(model.policy) is SafeActorCriticPolicy and type(model.rollout_buffer) is KLRolloutBuffer
    assert _same_parameters(model.policy, stock.policy)
    moments = _adam_moments(model.policy.optimizer)
    assert moments and all(
        th.equal(mine, theirs) for mine, theirs in zip(moments, _adam_moments(stock.policy.optimizer), strict=True)
    )
    model.learn(32, reset_num_timesteps=False)
    assert model.num_timesteps == 48 and model.kl_beta != 1.0  # the penalty adapted after each update


def test_kl_adaptive_ppo_continues_a_dict_observation_checkpoint(tmp_path: Path) -> None:
    PPO("MultiInputPolicy", SimpleMultiObsEnv(), **SMALL).save(tmp_path / "ppo.zip")
    model = KLAdaptivePPO.load(tmp_path / "ppo.zip", env=SimpleMultiObsEnv(), device="cpu")
    assert type(model.policy) is SafeMultiInputPolicy and type(model.rollout_buffer) is KLDictRolloutBuffer
    model.learn(16)


def test_ppo_continues_a_kl_adaptive_ppo_checkpoint(tmp_path: Path) -> None:
    """PPO.load(KLAdaptivePPO zip).learn(): the buffer class is not saved, PPO builds its own."""
    KLAdaptivePPO("MlpPolicy", "Pendulum-v1", **SMALL).learn(16).save(tmp_path / "kl.zip")
    with zipfile.ZipFile(tmp_path / "kl.zip") as archive:
        assert "rollout_buffer_class" not in json.loads(archive.read("data"))
    model = PPO.load(tmp_path / "kl.zip", env=make_vec_env("Pendulum-v1"), device="cpu")
    assert type(model.rollout_buffer) is RolloutBuffer and isinstance(model.policy, SafeActorCriticPolicy)
    model.learn(32)
    # and back: KLAdaptivePPO builds its KL buffer again
    model.save(tmp_path / "ppo.zip")
    assert type(KLAdaptivePPO.load(tmp_path / "kl.zip", device="cpu").rollout_buffer) is KLRolloutBuffer


def test_kl_adaptive_ppo_refuses_a_foreign_buffer_in_one_line(tmp_path: Path) -> None:
    MaskablePPO("MlpPolicy", InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), **SMALL).save(tmp_path / "mask.zip")
    with pytest.raises(ValueError) as error:
        KLAdaptivePPO.load(tmp_path / "mask.zip", device="cpu")
    message = str(error.value)
    assert "KLAdaptivePPO needs a KLRolloutBuffer" in message and "rollout_buffer_class=MaskableRolloutBuffer" in message
    assert "model.set_parameters(path)" in message and "\n" not in message


def test_safe_a2c_continues_an_a2c_checkpoint(tmp_path: Path) -> None:
    """SafeA2C.load(stock A2C zip) no longer trains on with the stock policy."""
    stock = A2C("MlpPolicy", "CartPole-v1", n_steps=8, policy_kwargs=dict(net_arch=[8]), seed=0).learn(16)
    stock.save(tmp_path / "a2c.zip")
    model = SafeA2C.load(tmp_path / "a2c.zip", env=make_vec_env("CartPole-v1"), device="cpu")
    assert type(model.policy) is SafeActorCriticPolicy and model.policy.logit_bound is not None
    assert _same_parameters(model.policy, stock.policy)
    assert type(model.policy.optimizer) is th.optim.RMSprop
    model.learn(16)
    # from an open file too, left where it was for SB3's load
    buffer = io.BytesIO((tmp_path / "a2c.zip").read_bytes())
    assert type(SafeA2C.load(buffer, device="cpu").policy) is SafeActorCriticPolicy


def test_safe_checkpoints_keep_their_policy(tmp_path: Path) -> None:
    """A SafeA2C checkpoint built with SB3's policy keeps it; the caller's custom_objects win."""
    SafeA2C(ActorCriticPolicy, "CartPole-v1", n_steps=8).save(tmp_path / "safe_a2c.zip")
    assert type(SafeA2C.load(tmp_path / "safe_a2c.zip", device="cpu").policy) is ActorCriticPolicy
    A2C("MlpPolicy", "CartPole-v1", n_steps=8).save(tmp_path / "a2c.zip")
    chosen = SafeA2C.load(tmp_path / "a2c.zip", device="cpu", custom_objects={"policy_class": ActorCriticPolicy})
    assert type(chosen.policy) is ActorCriticPolicy


@pytest.mark.parametrize(
    "algorithm, policy, env, expected",
    [
        (SAC, SafeMlpPolicy, "Pendulum-v1", f"{ACTOR_CRITIC} SAC"),
        (TD3, SafeMlpPolicy, "Pendulum-v1", f"{ACTOR_CRITIC} SAC, TD3"),
        (DQN, SafeMlpPolicy, "CartPole-v1", f"{ACTOR_CRITIC} DQN"),
        (RecurrentPPO, SafeMlpPolicy, "CartPole-v1", f"{ACTOR_CRITIC} RecurrentPPO"),
        (PPO, SafeMaskableMlpPolicy, "CartPole-v1", f"{MASKABLE}, not an algorithm that builds its policy with use_sde"),
        (A2C, SafeMaskableMlpPolicy, "CartPole-v1", MASKABLE),
        (DQN, SafeMaskableMlpPolicy, "CartPole-v1", f"{MASKABLE}, not DQN"),
        (SAC, SafeMlpLstmPolicy, "Pendulum-v1", "SafeRecurrentActorCriticPolicy serves RecurrentPPO, not SAC"),
    ],
)  # fmt: skip
def test_a_safe_policy_given_to_an_algorithm_it_cannot_serve(algorithm, policy, env, expected: str) -> None:
    with pytest.raises(PolicyAlgorithmMismatchError) as error:
        algorithm(policy, env)
    assert isinstance(error.value, TypeError)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)


def test_a_recurrent_safe_policy_in_a_feed_forward_algorithm_fails_at_its_first_step() -> None:
    """
    PPO builds its policy with exactly RecurrentPPO's arguments and reads nothing of it: the mismatch shows at the
    first forward pass, before any step is taken or any update made.
    """
    model = PPO(SafeMlpLstmPolicy, "CartPole-v1", **SMALL)
    with pytest.raises(PolicyAlgorithmMismatchError, match="serves RecurrentPPO, not an algorithm that calls its policy"):
        model.learn(16)
    assert model.num_timesteps == 0


def test_the_attributes_stay_attributes() -> None:
    """hasattr and getattr with a default keep their meaning (the error is an AttributeError too)."""
    policy = PPO(SafeMlpPolicy, "CartPole-v1", **SMALL).policy
    assert not hasattr(policy, "actor") and getattr(policy, "q_net", None) is None
    recurrent = RecurrentPPO(SafeMlpLstmPolicy, "CartPole-v1", **SMALL).policy
    assert isinstance(recurrent.lstm_actor, th.nn.LSTM)
    with pytest.raises(AttributeError, match="no attribute 'no_such_part'"):
        _ = policy.no_such_part


@pytest.mark.parametrize("bound", ["10", True, np.True_, [10.0], th.tensor(10.0)])
def test_logit_bound_must_be_a_number(bound: object) -> None:
    expected = "logit_bound must be None or a float in (0, 100], got"
    with pytest.raises(ValueError, match=r"logit_bound must be None or a float in \(0, 100\], got"):
        validate_logit_bound(bound)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as error:
        KLAdaptivePPO("MlpPolicy", "CartPole-v1", **SMALL, policy_kwargs=dict(logit_bound=bound))
    assert str(error.value).startswith(expected)
    with pytest.raises(ValueError, match="logit_bound must be"):
        MaskablePPO(
            SafeMaskableMlpPolicy, InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), policy_kwargs=dict(logit_bound=bound)
        )


@pytest.mark.parametrize("log_std_range", [("1", "2"), (True, 2.0), (-1.0, False), "12", (-1.0,)])
def test_log_std_range_must_be_numbers(log_std_range: object) -> None:
    with pytest.raises(ValueError, match=r"log_std_range must be a pair \(lo, hi\) of floats, got"):
        validate_log_std_range(log_std_range)  # type: ignore[arg-type]


def test_numbers_of_any_kind_are_still_accepted() -> None:
    assert validate_logit_bound(5) == 5.0 and validate_logit_bound(np.float32(2.5)) == 2.5
    assert validate_logit_bound(None) is None
    assert validate_log_std_range((-3, 1)) == (-3.0, 1.0)
    assert validate_log_std_range(np.array([-2.0, 0.5])) == (-2.0, 0.5)
    assert validate_log_std_range([np.int64(-4), np.float32(1.0)]) == (-4.0, 1.0)


def test_dict_rollout_buffer_is_replaced_too() -> None:
    """SB3's own buffer classes are what a stock checkpoint holds; KLAdaptivePPO swaps them for its KL buffers."""
    model = KLAdaptivePPO("MultiInputPolicy", SimpleMultiObsEnv(), **SMALL, _init_setup_model=False)
    model.rollout_buffer_class = DictRolloutBuffer  # as load() restores a PPO checkpoint's attribute
    model._setup_model()
    assert type(model.rollout_buffer) is KLDictRolloutBuffer
