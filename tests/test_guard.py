"""Fault injection into real SB3 / sb3-contrib training runs, checked against NonFiniteGuardCallback."""

import csv
import json
import math
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import QRDQN, TQC, TRPO, MaskablePPO, RecurrentPPO
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EvalCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.save_util import recursive_getattr
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_safe import (
    KLAdaptivePPO,
    NonFiniteError,
    NonFiniteGuardCallback,
    NonFiniteGuardWarning,
    NumericsMonitorCallback,
    SafeA2C,
    SafeMlpPolicy,
)
from sb3_safe.common.callbacks import REPORT_FILENAME, ScaledSchedule
from sb3_safe.common.exploration import ExplorationWarning
from sb3_safe.common.guard import SnapshotStore, WatchedModel
from sb3_safe.common.schedules import apply_learning_rate_scale, learning_rate_scale


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a log folder the guard writes its report to the current directory: keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


def tiny() -> dict[str, Any]:
    """Small networks; a fresh dict each time, as SB3 algorithms add keys to ``policy_kwargs``."""
    return dict(net_arch=[16])


class FaultyEnv(gym.Env):
    """
    A small random-observation environment that returns a NaN observation or an inf reward
    at a chosen step (counted over all episodes, from 1).
    """

    def __init__(
        self,
        nan_obs_at: int | None = None,
        inf_reward_at: int | None = None,
        continuous: bool = False,
        obs_scale: float = 1.0,
    ):
        super().__init__()
        self.obs_scale = obs_scale
        self.observation_space = spaces.Box(-5.0, 5.0, (3,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else spaces.Discrete(2)
        self.nan_obs_at, self.inf_reward_at = nan_obs_at, inf_reward_at
        self.total_steps = 0
        self.episode_steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode_steps = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.total_steps += 1
        self.episode_steps += 1
        obs = (self.obs_scale * self.np_random.normal(size=3)).astype(np.float32)
        reward = float(self.np_random.normal())
        if self.total_steps == self.nan_obs_at:
            obs[1] = np.nan
        if self.total_steps == self.inf_reward_at:
            reward = math.inf
        return obs, reward, False, self.episode_steps >= 16, {}


class CorruptAfterOptimizerStep:
    """Corrupt a tensor right after chosen steps of an optimizer, as a diverging update would."""

    def __init__(self, model: BaseAlgorithm, optimizer: th.optim.Optimizer, at: set[int], corrupt: Callable[[], None]):
        self.model, self.at, self.corrupt = model, at, corrupt
        self.calls = 0
        self.timesteps: list[int] = []
        # Registered before learn(), so it runs before the guard's hook, like a real optimizer step would
        optimizer.register_step_post_hook(self)

    def __call__(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.calls += 1
        if self.calls in self.at:
            with th.no_grad():
                self.corrupt()
            self.timesteps.append(self.model.num_timesteps)


class CorruptAtTimestep(BaseCallback):
    """Corrupt the model or its environment right after the env step that reaches a given timestep."""

    def __init__(self, timestep: int, corrupt: Callable[[BaseAlgorithm], None]):
        super().__init__()
        self.timestep, self.corrupt = timestep, corrupt

    def _on_step(self) -> bool:
        if self.num_timesteps == self.timestep:
            with th.no_grad():
                self.corrupt(self.model)
        return True


def all_finite(model: BaseAlgorithm) -> bool:
    tensors = list(model.policy.state_dict().values())
    for name in model._get_torch_save_params()[0]:
        if name.endswith("optimizer"):
            optimizer = model.get_parameters()[name]
            tensors += [v for state in optimizer["state"].values() for v in state.values() if isinstance(v, th.Tensor)]
    return all(bool(th.isfinite(t).all()) for t in tensors)


def first_weight_nan(model: BaseAlgorithm) -> Callable[[], None]:
    def corrupt() -> None:
        model.policy.mlp_extractor.policy_net[0].weight[0, 0] = math.nan

    return corrupt


def small_ppo(env: Any = "CartPole-v1", device: str = "cpu", **kwargs: Any) -> PPO:
    return PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=2, seed=0, device=device, policy_kwargs=tiny(), **kwargs)


# ----- configuration -----


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(on_nonfinite="explode"), "on_nonfinite"),
        (dict(lr_decay=0.0), "lr_decay"),
        (dict(lr_decay=1.0), "lr_decay"),
        (dict(lr_decay=1.5), "lr_decay"),
        (dict(lr_decay=math.nan), "lr_decay"),
        (dict(max_rollbacks=-1), "max_rollbacks"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        NonFiniteGuardCallback(**kwargs)


# ----- healthy runs -----


def _algorithms() -> list[tuple[type[BaseAlgorithm], str, dict]]:
    off_policy: dict[str, Any] = dict(learning_starts=32, batch_size=16, buffer_size=500)
    return [
        (PPO, "Pendulum-v1", dict(n_steps=32, batch_size=32, n_epochs=2, policy_kwargs=tiny())),
        (A2C, "CartPole-v1", dict(n_steps=8, policy_kwargs=tiny())),
        (SAC, "Pendulum-v1", dict(off_policy, policy_kwargs=tiny())),
        (TD3, "Pendulum-v1", dict(off_policy, policy_kwargs=tiny())),
        (DDPG, "Pendulum-v1", dict(off_policy, policy_kwargs=tiny())),
        (DQN, "CartPole-v1", dict(off_policy, policy_kwargs=tiny(), target_update_interval=20)),
        (TRPO, "Pendulum-v1", dict(n_steps=32, batch_size=32, n_critic_updates=2, policy_kwargs=tiny())),
        (RecurrentPPO, "CartPole-v1", dict(n_steps=32, batch_size=32, n_epochs=2, policy_kwargs=dict(lstm_hidden_size=8))),
        (MaskablePPO, "CartPole-v1", dict(n_steps=32, batch_size=32, n_epochs=2, policy_kwargs=tiny())),
        (QRDQN, "CartPole-v1", dict(off_policy, policy_kwargs=dict(net_arch=[16], n_quantiles=5))),
        (TQC, "Pendulum-v1", dict(off_policy, policy_kwargs=dict(net_arch=[16], n_quantiles=5, n_critics=2))),
        (KLAdaptivePPO, "Pendulum-v1", dict(n_steps=32, batch_size=32, n_epochs=2, policy_kwargs=tiny())),
        (SafeA2C, "CartPole-v1", dict(n_steps=8, policy_kwargs=tiny())),
    ]


@pytest.mark.parametrize("algo, env_id, kwargs", _algorithms(), ids=lambda x: x.__name__ if isinstance(x, type) else "")
def test_guard_is_silent_and_changes_nothing_on_healthy_runs(algo: type[BaseAlgorithm], env_id: str, kwargs: dict) -> None:
    policy = "MlpLstmPolicy" if algo is RecurrentPPO else "MlpPolicy"

    def make_env() -> gym.Env:
        env = gym.make(env_id)
        # MaskablePPO needs masks; all actions allowed
        return ActionMasker(env, lambda _: np.ones(2, dtype=bool)) if algo is MaskablePPO else env

    plain = algo(policy, make_env(), seed=0, device="cpu", **kwargs).learn(96)
    model = algo(policy, make_env(), seed=0, device="cpu", **kwargs)
    optimizers = [recursive_getattr(model, name) for name in model._get_torch_save_params()[0] if name.endswith("optimizer")]
    hooks_before = [len(optimizer._optimizer_step_post_hooks) for optimizer in optimizers]
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(96, callback=guard)

    assert guard.events == [] and guard.stop_reason is None and guard.n_rollbacks == 0
    assert model.num_timesteps >= 96
    # The guard only reads (and copies): the run is identical to the unguarded one
    for (name, expected), actual in zip(plain.policy.state_dict().items(), model.policy.state_dict().values(), strict=True):
        assert th.equal(expected, actual), name
    # Its optimizer hooks are gone after learn() (safe policies keep their own)
    assert [len(optimizer._optimizer_step_post_hooks) for optimizer in optimizers] == hooks_before


# ----- NaN in a weight, produced by an update -----


def test_raise_names_the_weight_the_timestep_and_the_phase(device: str) -> None:
    model = small_ppo(device=device)
    injector = CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    with pytest.raises(NonFiniteError) as error:
        model.learn(256, callback=NonFiniteGuardCallback())
    message = str(error.value)
    assert injector.timesteps == [64]
    assert "policy.mlp_extractor.policy_net.0.weight: 1 NaN, 0 inf of 64" in message
    assert "timestep 64" in message and "optimizer step of policy.optimizer in train()" in message
    # Last healthy statistics and likely causes
    assert "Last healthy state (timestep 32): largest |param|" in message and "last grad norm" in message
    assert "learning rate" in message and "SafeMlpPolicy" in message


def test_a_weight_given_new_storage_mid_training_is_still_watched() -> None:
    model = small_ppo()
    weight = model.policy.mlp_extractor.policy_net[0].weight

    def new_storage(model: BaseAlgorithm) -> None:
        weight.data = weight.data.clone()  # e.g. a user's re-initialization; the optimizer keeps the Parameter

    replace = CorruptAtTimestep(40, new_storage)  # between the first and the second train()
    injector = CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    with pytest.raises(NonFiniteError) as error:
        model.learn(256, callback=[replace, NonFiniteGuardCallback()])
    assert injector.timesteps == [64]
    assert "timestep 64 (optimizer step of policy.optimizer in train())" in str(error.value)
    assert "policy.mlp_extractor.policy_net.0.weight: 1 NaN" in str(error.value)


def test_stop_saves_a_loadable_healthy_model(tmp_path: Any, device: str) -> None:
    model = small_ppo(device=device)
    CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "healthy.zip"))
    model.learn(256, callback=guard)  # ends cleanly

    assert model.num_timesteps < 256
    assert guard.stop_reason is not None and "policy.mlp_extractor.policy_net.0.weight" in guard.stop_reason
    assert "saved to" in guard.stop_reason
    loaded = PPO.load(tmp_path / "healthy.zip", device=device)
    assert all_finite(loaded) and all_finite(model)
    for expected, actual in zip(model.policy.state_dict().values(), loaded.policy.state_dict().values(), strict=True):
        assert th.equal(expected, actual)


@pytest.mark.parametrize("algo", [PPO, A2C, SAC, DQN, RecurrentPPO, KLAdaptivePPO, SafeA2C])
def test_rollback_recovers_and_lowers_the_learning_rate(algo: type[BaseAlgorithm], device: str) -> None:
    if algo in (PPO, A2C, RecurrentPPO, KLAdaptivePPO, SafeA2C):
        kwargs: dict = dict(n_steps=32, policy_kwargs=tiny())
        if algo not in (A2C, SafeA2C):
            kwargs.update(batch_size=32, n_epochs=2)
        if algo is RecurrentPPO:
            kwargs["policy_kwargs"] = dict(net_arch=[16], lstm_hidden_size=8)
    else:
        kwargs = dict(learning_starts=32, batch_size=16, buffer_size=500, policy_kwargs=tiny())
    policy = "MlpLstmPolicy" if algo is RecurrentPPO else "MlpPolicy"
    env_id = "Pendulum-v1" if algo is SAC else "CartPole-v1"
    model = algo(policy, env_id, seed=0, device=device, learning_rate=1e-3, **kwargs)
    optimizer = model.critic.optimizer if algo is SAC else model.policy.optimizer
    weight = next(p for p in optimizer.param_groups[0]["params"] if p.dim() == 2)

    def corrupt() -> None:
        weight[0, 0] = math.inf

    injector = CorruptAfterOptimizerStep(model, optimizer, {3}, corrupt)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(160, callback=guard)

    assert len(injector.timesteps) == 1 and injector.timesteps[0] < 160
    assert model.num_timesteps >= 160
    assert guard.n_rollbacks == 1 and guard.events[0].action == "rollback" and guard.stop_reason is None
    assert all_finite(model)
    optimizers = [model.actor.optimizer, model.critic.optimizer] if algo is SAC else [model.policy.optimizer]
    for opt in optimizers:
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5e-3)


def test_rollback_decay_holds_under_a_schedule_and_survives_save_load(tmp_path: Any) -> None:
    schedule = LinearSchedule(1e-3, 1e-4, 1.0)
    model = small_ppo(learning_rate=schedule)
    CorruptAfterOptimizerStep(model, model.policy.optimizer, {3, 7}, first_weight_nan(model))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(192, callback=guard)

    assert guard.n_rollbacks == 2
    # The last train() ran after the last rollout, when progress_remaining was 1 - 192 / 192
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.25 * schedule(0.0))
    assert isinstance(model.lr_schedule, ScaledSchedule)
    assert model.learning_rate is schedule  # the configured rate stays the user's; the scale is kept beside it
    model.save(tmp_path / "model.zip")
    loaded = PPO.load(tmp_path / "model.zip", device="cpu")
    assert learning_rate_scale(loaded) == pytest.approx(0.25)
    # load() rebuilds lr_schedule from learning_rate: sb3-safe's callbacks and algorithms apply the scale at learn()
    apply_learning_rate_scale(loaded)
    assert loaded.lr_schedule(0.5) == pytest.approx(0.25 * schedule(0.5))


def test_max_rollbacks_zero_stops_at_the_first_fault() -> None:
    """
    Promise: ``max_rollbacks`` counts from 0 (>= 0 is accepted): rollback mode with none allowed stops at the first
    fault, with the healthy model restored, as stop mode does.
    """
    model = small_ppo()
    CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", max_rollbacks=0)
    model.learn(256, callback=guard)
    assert guard.n_rollbacks == 0 and guard.events[0].action == "stop" and model.num_timesteps < 256
    assert guard.stop_reason is not None and "max_rollbacks=0" in guard.stop_reason and all_finite(model)


def test_rollback_gives_way_to_stop_after_max_rollbacks() -> None:
    model = small_ppo()
    CorruptAfterOptimizerStep(model, model.policy.optimizer, set(range(3, 100)), first_weight_nan(model))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", max_rollbacks=2)
    model.learn(512, callback=guard)

    assert guard.n_rollbacks == 2
    assert [event.action for event in guard.events] == ["rollback", "rollback", "stop"]
    assert guard.stop_reason is not None and "max_rollbacks=2" in guard.stop_reason
    assert model.num_timesteps < 512 and all_finite(model)


def test_check_gradients_names_the_gradient_and_skips_the_step(device: str) -> None:
    model = small_ppo(device=device)
    weight = model.policy.action_net.weight
    backward_calls = [0]

    def poison(grad: th.Tensor) -> th.Tensor:
        backward_calls[0] += 1
        return grad * math.nan if backward_calls[0] == 3 else grad

    weight.register_hook(poison)
    with pytest.raises(NonFiniteError, match=r"gradient of policy\.action_net\.weight: 32 NaN, 0 inf of 32"):
        model.learn(256, callback=NonFiniteGuardCallback(check_gradients=True))

    backward_calls[0] = 0
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", check_gradients=True)
    model.learn(128, callback=guard)
    assert guard.n_rollbacks == 1 and "gradients before an optimizer step" in guard.events[0].phase
    assert all_finite(model)


def test_model_broken_before_learn_is_reported_at_start(tmp_path: Any) -> None:
    model = small_ppo()
    with th.no_grad():
        model.policy.value_net.bias.fill_(math.inf)
    with pytest.raises(NonFiniteError, match=r"timestep 0 \(at the start of learn\(\)\)"):
        model.learn(64, callback=NonFiniteGuardCallback())
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", save_path=str(tmp_path / "never.zip"))
    model.learn(64, callback=guard)
    assert guard.stop_reason is not None and "no healthy state was recorded" in guard.stop_reason
    assert not (tmp_path / "never.zip").exists()


# ----- Adam moments -----


def _corrupt_adam(optimizer_of: Callable[[BaseAlgorithm], th.optim.Optimizer], key: str) -> Callable[[BaseAlgorithm], None]:
    def corrupt(model: BaseAlgorithm) -> None:
        optimizer = optimizer_of(model)
        first = optimizer.param_groups[0]["params"][0]
        optimizer.state[first][key].view(-1)[0] = math.inf

    return corrupt


def test_inf_adam_moment_is_named(device: str) -> None:
    model = small_ppo(device=device)
    # Adam has state after the first train() (timestep 32); an inf second moment freezes the weight rather than
    # corrupting it, so the full check after the next train() (timestep 64) is what finds it
    injector = CorruptAtTimestep(40, _corrupt_adam(lambda m: m.policy.optimizer, "exp_avg_sq"))
    with pytest.raises(NonFiniteError) as error:
        model.learn(256, callback=CallbackList([injector, NonFiniteGuardCallback()]))
    message = str(error.value)
    assert "policy.optimizer.state[policy.mlp_extractor.policy_net.0.weight].exp_avg_sq: 0 NaN, 1 inf of 64" in message
    assert "timestep 64 (after train()" in message


@pytest.mark.parametrize("mode", ["stop", "rollback"])
def test_inf_adam_moment_in_sac_is_repaired(mode: str, tmp_path: Any) -> None:
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=32, batch_size=16, buffer_size=500, policy_kwargs=tiny(), seed=0)
    # exp_avg = inf turns the weight to -inf at the critic step right after the injection (timestep 40)
    injector = CorruptAtTimestep(40, _corrupt_adam(lambda m: m.critic.optimizer, "exp_avg"))
    guard = NonFiniteGuardCallback(on_nonfinite=mode, save_path=str(tmp_path / "sac.zip"))
    model.learn(80, callback=CallbackList([injector, guard]))

    assert guard.events[0].nonfinite[0].name.startswith("critic.optimizer.state[policy.critic.qf0.0.weight].exp_avg")
    assert all_finite(model)
    if mode == "stop":
        # Stopped at the first env step after the failed update
        assert model.num_timesteps == 41 and all_finite(SAC.load(tmp_path / "sac.zip", device="cpu"))
    else:
        assert model.num_timesteps == 80 and guard.n_rollbacks == 1
        for optimizer in (model.actor.optimizer, model.critic.optimizer, model.ent_coef_optimizer):
            assert optimizer.param_groups[0]["lr"] == pytest.approx(1.5e-4)


# ----- bad environment data -----


def test_nan_observation_is_blamed_on_the_environment() -> None:
    model = PPO("MlpPolicy", FaultyEnv(nan_obs_at=21), n_steps=32, batch_size=32, n_epochs=2, policy_kwargs=tiny(), seed=0)
    with pytest.raises(NonFiniteError) as error:
        model.learn(128, callback=NonFiniteGuardCallback())
    message = str(error.value)
    assert "timestep 21 (env step)" in message and "observation of env 0: 1 NaN, 0 inf of 3" in message
    assert "Environment data cannot be rolled back" in message


@pytest.mark.parametrize("algo", [PPO, DQN, QRDQN])
def test_rollback_cannot_repair_env_data_so_it_stops(algo: type[BaseAlgorithm], tmp_path: Any) -> None:
    kwargs = dict(n_steps=16, batch_size=16) if algo is PPO else dict(learning_starts=8, batch_size=8, buffer_size=100)
    model = algo("MlpPolicy", FaultyEnv(nan_obs_at=30), policy_kwargs=tiny(), seed=0, **kwargs)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", save_path=str(tmp_path / "healthy"))
    model.learn(128, callback=guard)

    assert guard.n_rollbacks == 0 and [event.action for event in guard.events] == ["stop"]
    assert guard.stop_reason is not None and "environment data cannot be rolled back" in guard.stop_reason
    assert model.num_timesteps == 30
    assert all_finite(algo.load(tmp_path / "healthy.zip", device="cpu"))


def test_huge_finite_observations_are_not_reported() -> None:
    # Squares of 1e30 overflow float32: the cheap per-step test fails, the exact search must clear it
    model = PPO("MlpPolicy", FaultyEnv(obs_scale=1e30), n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=tiny(), seed=0)
    guard = NonFiniteGuardCallback()
    model.learn(32, callback=guard)
    assert guard.events == [] and model.num_timesteps == 32


def test_inf_reward_names_the_env() -> None:
    env = DummyVecEnv([lambda i=i: FaultyEnv(inf_reward_at=5 if i == 3 else None) for i in range(4)])
    model = A2C("MlpPolicy", env, n_steps=4, policy_kwargs=tiny(), seed=0)
    with pytest.raises(NonFiniteError) as error:
        model.learn(128, callback=NonFiniteGuardCallback())
    assert "timestep 20 (env step)" in str(error.value)
    assert "reward of env 3: 0 NaN, 1 inf of 1" in str(error.value)


def test_nan_observation_under_vecnormalize_stops_and_saves_healthy_statistics(tmp_path: Any) -> None:
    env = VecNormalize(DummyVecEnv([lambda: FaultyEnv(nan_obs_at=40, continuous=True)]))
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=tiny(), seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "model.zip"))
    model.learn(128, callback=guard)

    event = guard.events[0]
    assert event.source == "environment" and event.nonfinite[0].name == "observation of env 0"
    # VecNormalize already absorbed the NaN: the stop restored its statistics from the last healthy check
    assert np.isfinite(env.obs_rms.mean).all() and np.isfinite(env.obs_rms.var).all()
    saved = VecNormalize.load(guard.vec_normalize_path, DummyVecEnv([lambda: FaultyEnv(continuous=True)]))
    assert np.array_equal(saved.obs_rms.var, env.obs_rms.var)
    # Beside the model, named after it, as documented: <save_path without .zip>_vecnormalize.pkl
    assert guard.vec_normalize_path == str(tmp_path / "model_vecnormalize.pkl")


# ----- VecNormalize statistics -----


def _inf_obs_variance(model: BaseAlgorithm) -> None:
    model.get_vec_normalize_env().obs_rms.var[2] = math.inf


def test_inf_vecnormalize_variance_is_named() -> None:
    env = VecNormalize(DummyVecEnv([lambda: FaultyEnv()]))
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=tiny(), seed=0)
    with pytest.raises(NonFiniteError) as error:
        model.learn(128, callback=[CorruptAtTimestep(21, _inf_obs_variance), NonFiniteGuardCallback()])
    assert "timestep 21 (env step)" in str(error.value)
    assert "VecNormalize obs_rms.var: 0 NaN, 1 inf of 3" in str(error.value)


def test_inf_vecnormalize_variance_rolls_back_with_eval_callback_and_monitor(tmp_path: Any) -> None:
    env = VecNormalize(DummyVecEnv([lambda: FaultyEnv(continuous=True)]))
    eval_env = VecNormalize(DummyVecEnv([lambda: Monitor(FaultyEnv(continuous=True))]), training=False)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=tiny(), seed=0, learning_rate=1e-3)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    callbacks = [
        CorruptAtTimestep(21, _inf_obs_variance),
        EvalCallback(eval_env, eval_freq=16, n_eval_episodes=1),
        NumericsMonitorCallback(),
        guard,
    ]
    model.learn(96, callback=CallbackList(callbacks))

    assert model.num_timesteps == 96 and guard.n_rollbacks == 1
    assert guard.events[0].source == "normalization"
    assert np.isfinite(env.obs_rms.var).all() and np.isfinite(eval_env.obs_rms.var).all()
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)
    # Machine-readable report next to the logs
    lines = (tmp_path / REPORT_FILENAME).read_text().splitlines()
    report = json.loads(lines[0])
    assert len(lines) == 1 and report["action"] == "rollback" and report["timestep"] == 21
    assert report["nonfinite"][0] == {"name": "VecNormalize obs_rms.var", "n_nan": 0, "n_inf": 1, "numel": 3}
    # Guard and monitor keys in SB3's logger output
    with open(tmp_path / "progress.csv") as file:
        rows = list(csv.DictReader(file))

    def column(key: str) -> list[float]:
        return [float(row[key]) for row in rows if row.get(key)]

    assert max(column("guard/rollbacks")) == 1
    for key in ("train/log_std_min", "train/log_std_max", "train/param_max_abs", "train/grad_norm"):
        assert column(key) and np.isfinite(column(key)).all(), key
    # First record: end of the first rollout, before any update, so the initial policy
    initial = PPO("MlpPolicy", env, n_steps=16, batch_size=16, policy_kwargs=tiny(), seed=0).policy
    assert column("train/log_std_min")[0] == column("train/log_std_max")[0] == 0.0
    assert column("train/param_max_abs")[0] == pytest.approx(max(p.abs().max().item() for p in initial.parameters()))


def test_step_check_works_without_an_actions_local() -> None:
    # A custom algorithm's collect loop may not name its actions `actions`: the guard still checks the env data
    model = small_ppo()
    model.set_logger(configure(None, []))
    guard = NonFiniteGuardCallback()
    guard.init_callback(model)
    guard.on_training_start({}, {})
    guard.update_locals({"new_obs": np.zeros((1, 4), np.float32), "rewards": np.zeros(1, np.float32)})
    assert guard.on_step()
    guard.update_locals({"new_obs": np.full((1, 4), np.nan, np.float32), "rewards": np.zeros(1, np.float32)})
    with pytest.raises(NonFiniteError, match="observation of env 0: 4 NaN"):
        guard.on_step()


def test_rollback_restores_kl_beta_adapted_by_the_failed_update() -> None:
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=2, seed=0, device="cpu")
    train = model.train
    beta_before, beta_after = [], []

    def failing_second_update() -> None:
        beta_before.append(model.kl_beta)
        train()
        beta_after.append(model.kl_beta)
        if len(beta_after) == 2:  # adapted to a diverged KL, with a diverged weight
            model.kl_beta = 77.0
            with th.no_grad():
                model.policy.action_net.weight[0, 0] = math.nan

    model.train = failing_second_update
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(32 * 4, callback=guard)

    assert guard.n_rollbacks == 1 and len(beta_before) == 4
    # the third update starts from the beta of the last healthy state, the first update's
    assert beta_before[2] == beta_after[0] != 77.0


def fail_the_second_update(model: PPO, change: Callable[[], object] = lambda: None) -> list[int]:
    """
    Make ``model``'s second update fail: after it, ``change()`` and a NaN in a weight.

    :return: the timestep of each update run, as they run
    """
    train, updates = model.train, []

    def train_then_fail() -> None:
        train()
        updates.append(model.num_timesteps)
        if len(updates) == 2:
            change()
            with th.no_grad():
                model.policy.action_net.weight[0, 0] = math.nan

    model.train = train_then_fail  # type: ignore[method-assign]
    return updates


def test_rollback_restores_the_optimizer_hyperparameters_but_not_the_learning_rate() -> None:
    """
    Promise: a rollback restores each optimizer as it was at the last healthy state, its hyperparameters included
    (here Adam's eps and betas, changed by the failed update), except the learning rate, which the schedule's scale
    owns (lowered by ``lr_decay``).
    """
    model = small_ppo()
    optimizer = model.policy.optimizer
    healthy = {key: optimizer.param_groups[0][key] for key in ("eps", "betas")}
    updates = fail_the_second_update(model, lambda: optimizer.param_groups[0].update(eps=0.25, betas=(0.5, 0.5)))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(32 * 3, callback=guard)

    assert guard.n_rollbacks == 1 and len(updates) == 3
    assert {key: optimizer.param_groups[0][key] for key in healthy} == healthy
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 3e-4)


def test_rollback_restores_the_optimizer_state_of_the_last_healthy_state() -> None:
    """
    Promise: a rollback restores each optimizer's state (Adam's step counts and moments) as it was at the last healthy
    state: not the failed update's, and not an empty state, which would restart Adam's moments and bias correction.
    """
    model = small_ppo()
    optimizer = model.policy.optimizer
    fail_the_second_update(model)
    failing_train, after_each_update = model.train, []

    def train_and_record() -> None:
        failing_train()
        state = optimizer.state_dict()["state"]
        after_each_update.append({index: {k: v.clone() for k, v in entry.items()} for index, entry in state.items()})

    model.train = train_and_record  # type: ignore[method-assign]
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    with pytest.warns(NonFiniteGuardWarning, match="Rolled back to the state of timestep 32"):
        model.learn(64, callback=guard)  # the second and last update fails: the model ends rolled back to the first

    assert guard.n_rollbacks == 1 and len(after_each_update) == 2
    healthy, restored = after_each_update[0], optimizer.state_dict()["state"]
    assert healthy and restored.keys() == healthy.keys()
    for index, entry in healthy.items():
        assert restored[index].keys() == entry.keys()
        assert all(th.equal(restored[index][key], value) for key, value in entry.items())
    assert not th.equal(after_each_update[1][0]["exp_avg"], healthy[0]["exp_avg"])  # the failed update changed it


def test_a_restored_state_reports_no_gradient_norm_until_an_update_makes_one() -> None:
    """
    Promise: a restore drops the gradients of the failed step, as if no backward pass had run, so that a report never
    gives a gradient norm that no update of the restored state produced: unknown until the next update (here the
    state a rollback at the end of one learn() left, checked at the start of the next).
    """
    model = small_ppo()
    fail_the_second_update(model)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(64, callback=guard)
    assert guard.n_rollbacks == 1 and all_finite(model)
    del model.train  # the algorithm's own train() again
    CorruptAfterOptimizerStep(model, model.policy.optimizer, {1}, first_weight_nan(model))
    with pytest.raises(NonFiniteError) as error:
        model.learn(64, callback=NonFiniteGuardCallback(), reset_num_timesteps=False)
    assert "Last healthy state (timestep 64)" in str(error.value)
    assert "last grad norm unknown" in str(error.value)


def test_an_error_names_the_gradient_norm_and_log_std_range_of_the_last_healthy_state() -> None:
    """
    Promise: a guard error describes the last healthy state: its timestep, the gradient norm of its last update and,
    for a policy with a log-std, the range of the log-std (the usual suspects of a divergence), as they were then.
    """
    model = small_ppo("Pendulum-v1")
    optimizer = model.policy.optimizer
    seen: list[tuple[float, float, float]] = []

    def record(optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        log_std = model.policy.log_std.detach()
        seen.append((float(th.linalg.vector_norm(th.cat([g.flatten() for g in grads]))), log_std.min().item(),
                     log_std.max().item()))  # fmt: skip

    optimizer.register_step_post_hook(record)
    CorruptAfterOptimizerStep(model, optimizer, {3}, first_weight_nan(model))
    with pytest.raises(NonFiniteError) as error:
        model.learn(256, callback=NonFiniteGuardCallback())
    message = str(error.value)
    grad_norm, low, high = seen[1]  # the last step of the first update, the last healthy state (timestep 32)
    assert "Last healthy state (timestep 32)" in message
    found = re.search(r"last grad norm ([0-9.e+-]+), log-std range \[([0-9.e+-]+), ([0-9.e+-]+)\]", message)
    assert found is not None, message
    assert float(found[1]) == pytest.approx(grad_norm, rel=1e-3)
    # Written with 3 significant digits; the first update moved the log-std off its initial 0
    assert (float(found[2]), float(found[3])) == pytest.approx((low, high), rel=1e-2) and low != 0.0


def test_resumed_run_keeps_the_rollback_budget_and_count(tmp_path: Any) -> None:
    model = small_ppo()
    CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    model.learn(128, callback=NonFiniteGuardCallback(on_nonfinite="rollback", max_rollbacks=1))
    model.save(tmp_path / "model.zip")

    loaded = PPO.load(tmp_path / "model.zip", env=model.get_env(), device="cpu")
    assert loaded.nonfinite_guard_rollbacks == 1
    CorruptAfterOptimizerStep(loaded, loaded.policy.optimizer, {3}, first_weight_nan(loaded))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", max_rollbacks=1)
    loaded.learn(128, callback=guard, reset_num_timesteps=False)

    assert guard.n_rollbacks == 1 and [event.action for event in guard.events] == ["stop"]
    assert guard.stop_reason is not None and "max_rollbacks=1" in guard.stop_reason


@pytest.mark.parametrize("report_dir", [False, True])
def test_stop_and_rollback_warn_without_a_log_folder_or_verbose_and_write_the_report_where_asked(
    report_dir: bool, tmp_path: Any
) -> None:
    """With SB3's default verbose=0 and no logger folder, a stop is not silent: a warning and a reason; the report
    file only where asked (report_dir) or where the logger writes files, never in the current directory."""
    env = FaultyEnv(inf_reward_at=30)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, seed=0, device="cpu", policy_kwargs=tiny())
    guard = NonFiniteGuardCallback(on_nonfinite="stop", report_dir=str(tmp_path / "reports") if report_dir else None)
    with pytest.warns(NonFiniteGuardWarning, match="reward of env 0") as warned:
        model.learn(2000, callback=guard)
    guard_warnings = [warning for warning in warned if issubclass(warning.category, NonFiniteGuardWarning)]
    assert model.num_timesteps < 2000 and len(guard_warnings) == 1
    assert guard.stop_reason is not None and str(guard_warnings[0].message) == guard.stop_reason
    assert not (tmp_path / REPORT_FILENAME).exists()  # the current directory
    if report_dir:
        report = tmp_path / "reports" / REPORT_FILENAME
        assert [json.loads(line)["action"] for line in report.read_text().splitlines()] == ["stop"]
    else:
        assert guard.report_folder is None

    model = small_ppo()
    CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    with pytest.warns(NonFiniteGuardWarning, match="Rolled back"):
        model.learn(128, callback=NonFiniteGuardCallback(on_nonfinite="rollback"))


@pytest.mark.parametrize("callback_class", [NonFiniteGuardCallback, NumericsMonitorCallback])
def test_exploration_collapse_is_reported_once(callback_class: type, tmp_path: Any) -> None:
    """A log-std pinned at its lower bound is finite, but the policy no longer explores: both callbacks say so once."""
    model = A2C(SafeMlpPolicy, "Pendulum-v1", n_steps=4, learning_rate=0.0, seed=0, policy_kwargs=dict(log_std_init=-20.0))
    model.set_logger(configure(str(tmp_path), ["csv"]))
    callback = callback_class(collapse_patience=3)
    with pytest.warns(
        ExplorationWarning, match=r"exploration collapsed at log_std = -20 \(std 2.06e-09\) in 1 of 1"
    ) as warned:
        model.learn(64, callback=callback, log_interval=1)
    assert sum(issubclass(warning.category, ExplorationWarning) for warning in warned) == 1
    assert callback.exploration.message is not None
    fractions = [row.split(",") for row in (tmp_path / "progress.csv").read_text().splitlines()]
    column = fractions[0].index("train/log_std_at_bound_fraction")
    assert {float(row[column]) for row in fractions[1:] if row[column]} == {1.0}


@pytest.mark.parametrize("algo", [PPO, RecurrentPPO])
def test_rollback_of_nan_normalization_renormalizes_the_step_it_made(algo: type[BaseAlgorithm]) -> None:
    """The observation normalized with the bad statistics is the next one the policy acts on (and feeds its LSTM)."""

    def nan_obs_mean(model: BaseAlgorithm) -> None:
        model.get_vec_normalize_env().obs_rms.mean[1] = math.nan

    env = VecNormalize(DummyVecEnv([lambda: FaultyEnv(continuous=True)]))
    policy = "MlpLstmPolicy" if algo is RecurrentPPO else "MlpPolicy"
    kwargs = dict(net_arch=[16], lstm_hidden_size=8) if algo is RecurrentPPO else tiny()
    model = algo(policy, env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=kwargs, seed=0, device="cpu")
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(96, callback=[CorruptAtTimestep(21, nan_obs_mean), guard])

    assert model.num_timesteps == 96 and guard.n_rollbacks == 1 and guard.events[0].source == "normalization"
    assert np.isfinite(model._last_obs).all() and all_finite(model)
    if algo is RecurrentPPO:
        assert all(bool(th.isfinite(state).all()) for states in model._last_lstm_states for state in states)


def test_a_weight_given_new_storage_between_two_learn_calls_is_still_watched() -> None:
    """Without other callbacks the storage is read once per learn(): a user's re-initialization between two calls."""
    model = small_ppo()
    guard = NonFiniteGuardCallback()
    model.learn(64, callback=guard)
    weight = model.policy.mlp_extractor.policy_net[0].weight
    weight.data = weight.data.clone()
    injector = CorruptAfterOptimizerStep(model, model.policy.optimizer, {3}, first_weight_nan(model))
    with pytest.raises(NonFiniteError) as error:
        model.learn(256, callback=guard, reset_num_timesteps=False)
    assert injector.timesteps == [128]
    assert "policy.mlp_extractor.policy_net.0.weight: 1 NaN" in str(error.value)


def test_a_restore_brings_back_the_statistics_and_drops_the_observations_kept_since() -> None:
    """The safe policy keeps a rollout's observations outside its tensors until the rollout ends: snapshots, taken at
    rollout boundaries, copy the statistics and the pending ones; a restore brings them back, forgets the observations
    kept since (they belong to undone steps) and, in a rollout, has its next step commit the restored pending ones."""
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=4, seed=0, policy_kwargs=dict(normalize_observations=True))
    normalizer = model.policy.observation_normalizer
    store = SnapshotStore(model, WatchedModel(model), restorable=True)
    normalizer.observe(th.ones(3, 4))
    normalizer.fold()
    for _ in range(3):  # copies into new buffers first; from the third on a spare is reused
        snapshot, finite = store.copy_and_test()
        assert finite
        store.commit(snapshot)
    normalizer.observe(th.full((2, 4), 5.0))
    normalizer.fold()
    normalizer.observe(th.full((2, 4), 7.0))
    normalizer.observing = True
    store.restore()
    assert normalizer.kept.count == 0 and normalizer.commit_due
    assert normalizer.pending_count.item() == 3 and normalizer.pending_mean.tolist() == [1.0] * 4
