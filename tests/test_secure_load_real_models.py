"""
No loss of any real model: every kind of file the project writes (every algorithm of SB3 and sb3-contrib and
sb3-safe's, safe and stock policies, gSDE, squashed outputs, schedules, VecNormalize statistics, replay buffers)
loads with ``sb3_safe.load`` into the model SB3's ``load`` builds: the same parameters, the same predictions on 100
observations, the same attributes; and training continues. (Models saved by ``sb3-safe train`` and rl_zoo3's own
``train``: tests/test_secure_load_zoo.py.)
"""

import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import ARS, QRDQN, TQC, CrossQ, RecurrentPPO
from stable_baselines3 import DDPG, HerReplayBuffer
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.envs import BitFlippingEnv
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from test_doctor_real_models import MODELS, small

import sb3_safe
from sb3_safe import NonFiniteGuardCallback

OFF_POLICY = dict(learning_starts=8, batch_size=8, buffer_size=64)

#: The models of tests/test_doctor_real_models.py, and the algorithms it leaves out
ALL_MODELS: dict[str, Callable[[], tuple[BaseAlgorithm, int]]] = {
    **MODELS,
    "ARS": lambda: (ARS("LinearPolicy", "Pendulum-v1", n_delta=2), 16),
    "ARS MlpPolicy, CartPole": lambda: (ARS("MlpPolicy", "CartPole-v1", n_delta=2, policy_kwargs=small()), 16),
    "CrossQ": lambda: (CrossQ("MlpPolicy", "Pendulum-v1", **OFF_POLICY, policy_kwargs=small()), 16),
    "TQC gSDE": lambda: (TQC("MlpPolicy", "Pendulum-v1", use_sde=True, **OFF_POLICY, policy_kwargs=small()), 16),
    "QR-DQN": lambda: (QRDQN("MlpPolicy", "CartPole-v1", **OFF_POLICY, policy_kwargs=small()), 16),
    "DDPG": lambda: (DDPG("MlpPolicy", "Pendulum-v1", **OFF_POLICY, policy_kwargs=small()), 16),
}


@contextmanager
def _without_full_unpicklers() -> Iterator[None]:
    """Inside: pickle's and cloudpickle's loaders fail, so what loads here comes through sb3-safe's readers."""

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("a full unpickler was called")

    saved = pickle.load, pickle.loads, cloudpickle.loads
    pickle.load = pickle.loads = cloudpickle.loads = refuse
    try:
        yield
    finally:
        pickle.load, pickle.loads, cloudpickle.loads = saved


def secure_load(algorithm: type[BaseAlgorithm], path: Path, **kwargs: Any) -> BaseAlgorithm:
    """``sb3_safe.load``, checked to use no full unpickler."""
    with _without_full_unpicklers():
        return sb3_safe.load(algorithm, path, **kwargs)


def _observations(space: spaces.Space, n: int) -> Any:
    """``n`` observations of ``space``, batched as ``predict`` takes them."""
    space.seed(0)
    samples = [space.sample() for _ in range(n)]
    if isinstance(space, spaces.Dict):
        return {key: np.stack([sample[key] for sample in samples]) for key in space.spaces}
    return np.stack(samples)


def _assert_same_state(expected: Any, actual: Any, where: str) -> None:
    """State dicts (and optimizer state dicts): the same keys, equal tensors and values."""
    if isinstance(expected, th.Tensor):
        assert isinstance(actual, th.Tensor) and expected.dtype == actual.dtype and th.equal(expected, actual), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and list(expected) == list(actual), where
        for key in expected:
            _assert_same_state(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert type(expected) is type(actual) and len(expected) == len(actual), where
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            _assert_same_state(left, right, f"{where}[{index}]")
    else:
        assert expected == actual, where


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def assert_same_model(expected: BaseAlgorithm, actual: BaseAlgorithm) -> None:
    """The same class, policy, parameters (optimizers included), attributes and predictions on 100 observations."""
    assert type(actual) is type(expected) and type(actual.policy) is type(expected.policy)
    _assert_same_state(expected.get_parameters(), actual.get_parameters(), "parameters")
    assert set(vars(actual)) == set(vars(expected))
    for key, value in vars(expected).items():
        if _plain(value):
            assert vars(actual)[key] == value, key
        elif callable(value) and key in ("lr_schedule", "clip_range", "clip_range_vf"):
            assert [value(progress) for progress in (1.0, 0.5, 0.0)] == [vars(actual)[key](p) for p in (1.0, 0.5, 0.0)]
    observations = _observations(expected.observation_space, 100)
    predicted = expected.predict(observations, deterministic=True)[0]
    assert np.array_equal(predicted, actual.predict(observations, deterministic=True)[0])


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_model_loads_as_sb3_loads_it_and_trains_on(name: str, tmp_path: Path) -> None:
    model, timesteps = ALL_MODELS[name]()
    if timesteps < 0:
        model.learn(-timesteps, callback=NonFiniteGuardCallback())
    else:
        model.learn(timesteps)
    model.save(tmp_path / "model.zip")
    algorithm = type(model)
    stock = algorithm.load(tmp_path / "model.zip", device="cpu")
    secure = secure_load(algorithm, tmp_path / "model.zip", device="cpu")
    assert_same_model(stock, secure)
    # With an environment, as training continues
    env = model.get_env()
    continued = secure_load(algorithm, tmp_path / "model.zip", env=env, device="cpu")
    before = continued.num_timesteps
    continued.learn(abs(timesteps), reset_num_timesteps=False)
    assert continued.num_timesteps > before


def test_a_stock_checkpoint_continues_as_the_safe_algorithm_loads_it(tmp_path: Path) -> None:
    """KLAdaptivePPO.load of a PPO file swaps in the safe policy (sb3_safe.common.checkpoints): so does sb3_safe.load."""
    from stable_baselines3 import A2C, PPO

    PPO("MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=small()).save(tmp_path / "ppo.zip")
    A2C("MlpPolicy", "CartPole-v1", n_steps=8, policy_kwargs=small()).save(tmp_path / "a2c.zip")
    for algorithm, path in ((sb3_safe.KLAdaptivePPO, "ppo.zip"), (sb3_safe.SafeA2C, "a2c.zip")):
        stock = algorithm.load(tmp_path / path, device="cpu")
        assert isinstance(stock.policy, sb3_safe.SafeActorCriticPolicy)
        assert_same_model(stock, secure_load(algorithm, tmp_path / path, device="cpu"))


def test_tensors_go_to_the_device(device: str, tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    PPO("MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=small()).learn(16).save(tmp_path / "model.zip")
    secure = secure_load(PPO, tmp_path / "model.zip", device=device)
    assert secure.device.type == device and all(param.device.type == device for param in secure.policy.parameters())
    assert_same_model(PPO.load(tmp_path / "model.zip", device=device), secure)


def test_vec_normalize_statistics(tmp_path: Path) -> None:
    env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), clip_obs=5.0, gamma=0.9)
    env.reset()
    for _ in range(20):
        env.step(np.array([env.action_space.sample()]))
    env.save(tmp_path / "vecnormalize.pkl")
    stock = VecNormalize.load(str(tmp_path / "vecnormalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    with _without_full_unpicklers():
        secure = sb3_safe.load_vec_normalize(tmp_path / "vecnormalize.pkl", DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    assert set(vars(secure)) == set(vars(stock))
    for name in ("mean", "var", "count"):
        assert np.array_equal(getattr(secure.obs_rms, name), getattr(stock.obs_rms, name))
        assert np.array_equal(getattr(secure.ret_rms, name), getattr(stock.ret_rms, name))
    assert (secure.clip_obs, secure.gamma, secure.training, secure.norm_reward) == (5.0, 0.9, True, True)
    observations = np.random.default_rng(0).normal(size=(100, 3)).astype(np.float32)
    assert np.array_equal(secure.normalize_obs(observations), stock.normalize_obs(observations))
    secure.reset()
    secure.step(np.array([secure.action_space.sample()]))  # it wraps the new environment


def _with_buffer(make: Callable[[], BaseAlgorithm], tmp_path: Path) -> None:
    model = make()
    model.learn(24)
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    stock, secure = make(), make()
    stock.load_replay_buffer(tmp_path / "buffer.pkl")
    with _without_full_unpicklers():
        sb3_safe.load_replay_buffer(secure, tmp_path / "buffer.pkl")
    assert type(secure.replay_buffer) is type(stock.replay_buffer)
    assert set(vars(secure.replay_buffer)) == set(vars(stock.replay_buffer))
    for key, value in vars(stock.replay_buffer).items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, vars(secure.replay_buffer)[key]), key
        elif isinstance(value, dict) and all(isinstance(item, np.ndarray) for item in value.values()):
            assert all(np.array_equal(item, vars(secure.replay_buffer)[key][name]) for name, item in value.items()), key
        elif _plain(value):
            assert vars(secure.replay_buffer)[key] == value, key
    secure.learn(8, reset_num_timesteps=False)


def test_replay_buffers(tmp_path: Path) -> None:
    from stable_baselines3 import SAC

    _with_buffer(lambda: SAC("MlpPolicy", "Pendulum-v1", **OFF_POLICY, policy_kwargs=small()), tmp_path)
    _with_buffer(
        lambda: TQC(
            "MultiInputPolicy",
            BitFlippingEnv(n_bits=4, continuous=True),
            replay_buffer_class=HerReplayBuffer,
            replay_buffer_kwargs=dict(n_sampled_goal=2),
            **OFF_POLICY,
            policy_kwargs=small(),
        ),
        tmp_path,
    )


def test_recurrent_predictions_carry_the_same_state(tmp_path: Path) -> None:
    model = RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=small(lstm_hidden_size=8))
    model.save(tmp_path / "model.zip")
    stock = RecurrentPPO.load(tmp_path / "model.zip", device="cpu")
    secure = secure_load(RecurrentPPO, tmp_path / "model.zip", device="cpu")
    observations = _observations(stock.observation_space, 10)
    stock_state = secure_state = None
    for observation in observations:
        stock_action, stock_state = stock.predict(observation[None], state=stock_state, deterministic=True)
        secure_action, secure_state = secure.predict(observation[None], state=secure_state, deterministic=True)
        assert np.array_equal(stock_action, secure_action)
