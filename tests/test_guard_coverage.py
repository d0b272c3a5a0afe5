"""
Every bad value is caught before it is used, whatever its source: terminal observations, the first observation of
``learn()``, weights changed outside an optimizer step; KLAdaptivePPO's recorder keeps the acting pass's
distribution; one ExplorationWarning per collapse.
"""

import math
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    ConvertCallback,
    EvalCallback,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.envs import SimpleMultiObsEnv
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_safe import (
    KLAdaptivePPO,
    NonFiniteError,
    NonFiniteGuardCallback,
    NumericsMonitorCallback,
    SafeA2C,
    SafeMlpPolicy,
)
from sb3_safe.common import buffers
from sb3_safe.common.exploration import ExplorationWarning
from sb3_safe.common.guard.cadence import other_callbacks_may_write
from sb3_safe.common.kl import distribution_params


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the guard's report


class BlowUpEnv(gym.Env):
    """
    Random observations; at step ``nan_at`` (counted over all episodes, from 1) the episode ends with a NaN
    observation, by termination or by truncation; with ``nan_at_reset`` the first ``reset()`` returns a NaN.
    Episodes are otherwise truncated after 16 steps.
    """

    def __init__(
        self, nan_at: int | None = None, truncate: bool = False, nan_at_reset: bool = False, continuous: bool = False
    ) -> None:
        super().__init__()
        self.observation_space = spaces.Box(-5.0, 5.0, (3,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else spaces.Discrete(2)
        self.nan_at, self.truncate, self.nan_at_reset = nan_at, truncate, nan_at_reset
        self.total_steps = self.episode_steps = self.resets = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode_steps = 0
        self.resets += 1
        obs = self.np_random.normal(size=3).astype(np.float32)
        if self.nan_at_reset and self.resets == 1:
            obs[0] = np.nan
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.total_steps += 1
        self.episode_steps += 1
        obs = self.np_random.normal(size=3).astype(np.float32)
        terminated, truncated = False, self.episode_steps >= 16
        if self.total_steps == self.nan_at:
            obs[2] = np.nan
            terminated, truncated = not self.truncate, self.truncate
        return obs, float(self.np_random.normal()), terminated, truncated, {}


def two_envs(faulty: BlowUpEnv, continuous: bool = False) -> DummyVecEnv:
    """Env 0 healthy, env 1 the faulty one: the message must name env 1."""
    return DummyVecEnv([lambda: BlowUpEnv(continuous=continuous), lambda: faulty])


def small_sac(env: Any) -> SAC:
    return SAC("MlpPolicy", env, learning_starts=40, batch_size=16, policy_kwargs=dict(net_arch=[16]), seed=0)


def small_dqn(env: Any) -> DQN:
    return DQN("MlpPolicy", env, learning_starts=40, batch_size=16, train_freq=1, policy_kwargs=dict(net_arch=[16]), seed=0)


def replay_buffer_is_finite(model: BaseAlgorithm) -> bool:
    buffer = model.replay_buffer
    end = buffer.buffer_size if buffer.full else buffer.pos
    stored = [buffer.observations[:end], buffer.next_observations[:end], buffer.actions[:end], buffer.rewards[:end]]
    return all(np.isfinite(array).all() for array in stored)


def model_is_finite(model: BaseAlgorithm) -> bool:
    return all(bool(th.isfinite(tensor).all()) for tensor in model.policy.state_dict().values() if tensor.is_floating_point())


# ----- terminal observations -----


@pytest.mark.parametrize("make", [small_sac, small_dqn], ids=["SAC", "DQN"])
def test_nan_terminal_observation_raises_naming_it(make: Any) -> None:
    model = make(
        two_envs(BlowUpEnv(nan_at=60, continuous=True), continuous=True)
        if make is small_sac
        else two_envs(BlowUpEnv(nan_at=60))
    )
    with pytest.raises(NonFiniteError, match=r"terminal observation of env 1: 1 NaN, 0 inf of 3"):
        model.learn(400, callback=NonFiniteGuardCallback())
    assert model.num_timesteps == 120  # two envs: step 60 of env 1
    assert replay_buffer_is_finite(model)


@pytest.mark.parametrize("mode", ["stop", "rollback"])
@pytest.mark.parametrize("make", [small_sac, small_dqn], ids=["SAC", "DQN"])
def test_nan_terminal_observation_stops_cleanly_and_is_never_stored(make: Any, mode: str, tmp_path: Any) -> None:
    env = two_envs(BlowUpEnv(nan_at=60, continuous=make is small_sac), continuous=make is small_sac)
    model = make(env)
    guard = NonFiniteGuardCallback(on_nonfinite=mode, save_path=str(tmp_path / "healthy.zip"))
    model.learn(400, callback=guard)  # returns: no torch error from the NaN in a later sampled batch

    assert model.num_timesteps == 120 and guard.n_rollbacks == 0
    [event] = guard.events
    assert event.source == "environment" and event.action == "stop"
    assert "terminal observation of env 1" in event.message
    assert guard.stop_reason is not None and "environment data cannot be rolled back" in guard.stop_reason.lower()
    assert replay_buffer_is_finite(model)
    assert model_is_finite(type(model).load(tmp_path / "healthy.zip"))


@pytest.mark.parametrize("truncate", [False, True], ids=["terminated", "truncated"])
def test_ppo_nan_final_observation_is_reported_as_the_observation(truncate: bool) -> None:
    """On truncation PPO bootstraps from the final observation: the guard names it, not the reward it makes."""
    model = PPO(
        SafeMlpPolicy, two_envs(BlowUpEnv(nan_at=20, truncate=truncate)), n_steps=32, batch_size=32, n_epochs=1, seed=0
    )
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(256, callback=guard)

    [event] = guard.events
    assert event.source == "environment" and event.phase == "env step"
    assert [str(bad) for bad in event.nonfinite] == ["terminal observation of env 1: 1 NaN, 0 inf of 3"]
    assert model.num_timesteps == 40 and np.isfinite(model.rollout_buffer.rewards).all()


def test_nan_terminal_observation_under_vecnormalize_is_named() -> None:
    env = VecNormalize(two_envs(BlowUpEnv(nan_at=20, continuous=True), continuous=True))
    model = SAC("MlpPolicy", env, learning_starts=10, batch_size=8, policy_kwargs=dict(net_arch=[8]), seed=0)
    with pytest.raises(NonFiniteError, match=r"terminal observation of env 1: 1 NaN"):
        model.learn(100, callback=NonFiniteGuardCallback())
    assert np.isfinite(env.obs_rms.mean).all() and np.isfinite(env.obs_rms.var).all()


# ----- the first observation -----


def test_nan_first_observation_stops_before_the_policy_sees_it(tmp_path: Any) -> None:
    model = PPO(SafeMlpPolicy, DummyVecEnv([lambda: BlowUpEnv(nan_at_reset=True)]), n_steps=16, batch_size=16, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "healthy.zip"))
    model.learn(64, callback=guard)  # no "policy output mean ... from finite inputs" error

    [event] = guard.events
    assert event.source == "environment" and event.action == "stop" and model.num_timesteps == 0
    assert "first observation" in event.phase
    assert [str(bad) for bad in event.nonfinite] == ["observation of env 0: 1 NaN, 0 inf of 3"]
    assert "weights are probably NaN" not in event.message
    assert model_is_finite(PPO.load(tmp_path / "healthy.zip"))


def test_nan_first_observation_raises_naming_it_and_never_reaches_the_replay_buffer() -> None:
    model = small_dqn(DummyVecEnv([lambda: BlowUpEnv(nan_at_reset=True)]))
    with pytest.raises(NonFiniteError, match=r"first observation .*\n  observation of env 0: 1 NaN"):
        model.learn(64, callback=NonFiniteGuardCallback())
    model = small_dqn(DummyVecEnv([lambda: BlowUpEnv(nan_at_reset=True)]))
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(64, callback=guard)
    assert model.num_timesteps == 0 and model.replay_buffer.pos == 0 and guard.n_rollbacks == 0
    assert guard.stop_reason is not None and "environment data cannot be rolled back" in guard.stop_reason.lower()


def test_nan_first_observation_under_vecnormalize_is_blamed_on_the_environment() -> None:
    """
    Promise: a NaN the environment's reset() returned is the environment's fault, also under VecNormalize, whose
    statistics have absorbed it by then: the raw observation is named first, then the statistics it spoiled.
    """
    env = VecNormalize(DummyVecEnv([lambda: BlowUpEnv(nan_at_reset=True)]))
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[8]), seed=0)
    guard = NonFiniteGuardCallback()
    with pytest.raises(NonFiniteError, match="The environment produced it"):
        model.learn(32, callback=guard)

    [event] = guard.events
    assert event.source == "environment" and "first observation" in event.phase
    assert [bad.name for bad in event.nonfinite] == [
        "observation of env 0",
        "VecNormalize obs_rms.mean",
        "VecNormalize obs_rms.var",
    ]


def test_a_first_observation_spoiled_by_nonfinite_vecnormalize_statistics_is_named_as_normalized() -> None:
    """
    Promise: when the environment's first observation is finite but its normalization is not (VecNormalize statistics
    broken before learn(), e.g. loaded so), the fault is the normalization's, and the message names the statistics
    and the non-finite normalized observation, never the environment.
    """
    env = VecNormalize(DummyVecEnv([lambda: BlowUpEnv()]))
    env.obs_rms.mean[1] = np.nan
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[8]), seed=0)
    guard = NonFiniteGuardCallback()
    with pytest.raises(NonFiniteError, match=r"(?s)first observation.*normalized observation of env 0: 1 NaN"):
        model.learn(32, callback=guard)

    [event] = guard.events
    assert event.source == "normalization" and "first observation" in event.phase
    assert [bad.name for bad in event.nonfinite] == [
        "VecNormalize obs_rms.mean",
        "VecNormalize obs_rms.var",
        "normalized observation of env 0",
    ]


# ----- weights changed outside an optimizer step -----


class NaNInWeight(BaseCallback):
    """Write a NaN into a weight of ``network`` at the ``at``-th rollout start, or after the env step of ``timestep``."""

    def __init__(self, network: str, rollout: int | None = None, timestep: int | None = None) -> None:
        super().__init__()
        self.network, self.rollout, self.timestep = network, rollout, timestep
        self.rollouts = 0

    def _corrupt(self) -> None:
        weight = next(p for p in getattr(self.model.policy, self.network).parameters() if p.dim() == 2)
        with th.no_grad():
            weight[0, 0] = math.nan

    def _on_rollout_start(self) -> None:
        self.rollouts += 1
        if self.rollouts == self.rollout:
            self._corrupt()

    def _on_step(self) -> bool:
        if self.num_timesteps == self.timestep:
            self._corrupt()
        return True


@pytest.mark.parametrize("algo", [A2C, SafeA2C])
def test_nan_weight_written_at_a_rollout_start_is_caught_before_the_forward_pass(algo: type, tmp_path: Any) -> None:
    model = algo("MlpPolicy", "CartPole-v1", n_steps=8, policy_kwargs=dict(net_arch=[16]), seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "healthy.zip"))
    # The 20th rollout starts at timestep 152: between two full checks (every 1,000 steps for A2C)
    model.learn(400, callback=[NaNInWeight("mlp_extractor", rollout=20), guard])  # no "Expected parameter logits"

    [event] = guard.events
    assert event.source == "model" and event.action == "stop" and event.timestep == 152
    assert "policy.mlp_extractor.policy_net.0.weight: 1 NaN" in event.message
    assert model_is_finite(model) and model_is_finite(algo.load(tmp_path / "healthy.zip"))


def test_nan_actor_weight_written_between_sac_updates_is_caught_before_train(tmp_path: Any) -> None:
    model = small_sac(DummyVecEnv([lambda: BlowUpEnv(continuous=True)]))
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "healthy.zip"))
    # Written after the env step: the next train() evaluates the actor first (no "Expected parameter loc")
    model.learn(200, callback=[NaNInWeight("actor", timestep=120), guard])

    [event] = guard.events
    assert event.source == "model" and event.action == "stop" and event.timestep == 120
    assert "policy.actor.latent_pi.0.weight: 1 NaN" in event.message
    assert model_is_finite(SAC.load(tmp_path / "healthy.zip"))


def test_nan_weight_between_updates_rolls_back_and_training_goes_on() -> None:
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, policy_kwargs=dict(net_arch=[16]), seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(400, callback=[NaNInWeight("mlp_extractor", rollout=20), guard])
    assert model.num_timesteps == 400 and guard.n_rollbacks == 1 and model_is_finite(model)


# ----- KLAdaptivePPO's recorder -----


class ReadsNextValue(BaseCallback):
    """A common pattern: read V(s') (and so run the policy) on the new observations at every step."""

    def _on_step(self) -> bool:
        with th.no_grad():
            self.model.policy(obs_as_tensor(self.locals["new_obs"], self.model.device))
        return True


class CompareStoredDistributions(BaseCallback):
    """At each rollout end (before the update), compare the stored old distributions with the policy's own."""

    def __init__(self) -> None:
        super().__init__()
        self.worst: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        if isinstance(buffer.observations, dict):
            observations = {
                key: th.as_tensor(value.reshape(-1, *buffer.obs_shape[key])) for key, value in buffer.observations.items()
            }
        else:
            observations = th.as_tensor(buffer.observations.reshape(-1, *buffer.obs_shape))
        with th.no_grad():
            expected = distribution_params(self.model.policy.get_distribution(observations)).numpy()
        stored = buffer.old_dist_params.reshape(len(expected), -1)
        self.worst.append(float(np.abs(stored - expected).max()))


def test_recorder_keeps_the_acting_pass_when_a_callback_calls_the_policy() -> None:
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0)
    with th.no_grad():  # distributions that differ a lot between observations, so a wrong row shows
        model.policy.action_net.weight.mul_(300.0)
    compare = CompareStoredDistributions()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "was not recorded ... computed from the current policy"
        model.learn(512, callback=[ReadsNextValue(), compare])
    assert len(compare.worst) == 8 and max(compare.worst) < 1e-5


@pytest.mark.parametrize("bulk_check_max_obs_size", [0, 10**6], ids=["checked at add", "checked per rollout"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "dict"])
def test_recorder_stores_the_acting_pass_of_every_step_without_callbacks(
    env_id: str, bulk_check_max_obs_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common case (the policy runs once per step, to act): small observations' passes are checked per rollout."""
    monkeypatch.setattr(buffers, "BULK_CHECK_MAX_OBS_SIZE", bulk_check_max_obs_size)
    env, policy = (SimpleMultiObsEnv(random_start=True), "MultiInputPolicy") if env_id == "dict" else (env_id, "MlpPolicy")
    model = KLAdaptivePPO(policy, env, n_steps=64, batch_size=64, n_epochs=1, seed=0)
    assert model.rollout_buffer._check_in_bulk == (bulk_check_max_obs_size > 0)
    with th.no_grad():
        model.policy.action_net.weight.mul_(300.0)
    compare = CompareStoredDistributions()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.learn(512, callback=compare)
    assert len(compare.worst) == 8 and max(compare.worst) < 1e-5


def test_recorder_replaces_a_single_pass_that_did_not_act() -> None:
    """One pass since the last add, computed from another observation: the rollout's check finds it and recomputes."""
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=4, batch_size=4, n_epochs=1, seed=0)
    with th.no_grad():
        model.policy.action_net.weight.mul_(300.0)
    buffer, policy = model.rollout_buffer, model.policy
    buffer.reset()
    acting_obs = np.array([[0.1, -0.2, 0.05, 0.3]], dtype=np.float32)
    for step in range(4):
        other_obs = th.full((1, 4), float(step + 1))
        with th.no_grad():
            actions, _, _ = policy(other_obs)  # the only pass since the last add, on another observation
        buffer.add(acting_obs, actions.numpy(), np.zeros(1), np.zeros(1), th.zeros(1), th.zeros(1))
    with pytest.warns(UserWarning, match="was not recorded"):
        buffer.compute_returns_and_advantage(th.zeros(1), np.zeros(1))
    with th.no_grad():
        expected = distribution_params(policy.get_distribution(th.as_tensor(acting_obs))).numpy()
    assert np.allclose(buffer.old_dist_params[:, 0], expected, atol=1e-6)
    with th.no_grad():
        wrong = distribution_params(policy.get_distribution(th.full((1, 4), 1.0))).numpy()
    assert not np.allclose(expected, wrong, atol=1e-3)  # the test would see a wrong row


# ----- exploration -----


def test_one_exploration_warning_per_collapse_with_the_guard_and_the_monitor(tmp_path: Any) -> None:
    model = A2C(SafeMlpPolicy, "Pendulum-v1", n_steps=4, learning_rate=0.0, seed=0, policy_kwargs=dict(log_std_init=-20.0))
    guard, monitor = NonFiniteGuardCallback(collapse_patience=40), NumericsMonitorCallback(collapse_patience=40)
    with pytest.warns(ExplorationWarning) as warned:
        model.learn(200, callback=[guard, monitor])
    messages = [str(w.message) for w in warned if issubclass(w.category, ExplorationWarning)]
    assert len(messages) == 1 and "for 40 environment steps" in messages[0]


@pytest.mark.parametrize("algo, n_steps", [(A2C, 4), (PPO, 64)])
def test_collapse_patience_counts_environment_steps_for_every_algorithm(algo: type, n_steps: int) -> None:
    """The same patience means the same amount of training whatever the rollout length (it counted updates)."""
    kwargs = dict(batch_size=64, n_epochs=1) if algo is PPO else {}
    policy_kwargs = dict(log_std_init=-20.0)
    model = algo(
        SafeMlpPolicy, "Pendulum-v1", n_steps=n_steps, learning_rate=0.0, seed=0, policy_kwargs=policy_kwargs, **kwargs
    )
    guard = NonFiniteGuardCallback(collapse_patience=256)
    with pytest.warns(ExplorationWarning, match=r"for (\d+) environment steps, at timestep \1\b") as warned:
        model.learn(320, callback=guard)
    [message] = [str(w.message) for w in warned if issubclass(w.category, ExplorationWarning)]
    timestep = int(message.split("at timestep ")[1].split(".")[0])
    # looked at once per twentieth of the patience at most, at rollout ends
    assert 256 <= timestep <= 256 + 256 // 20 + n_steps


# ----- where a stop saves -----


def test_save_path_that_cannot_be_written_fails_at_construction(tmp_path: Any) -> None:
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(ValueError, match=r"save_path='.*afile/healthy' cannot be written: .*afile is a file"):
        NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "afile" / "healthy"))
    with pytest.raises(ValueError, match=r"save_path must be a file path .*got a folder"):
        NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path))
    # Permission bits let root write anywhere; /proc refuses any new file anyway (issue 37: it was accepted)
    with pytest.raises(ValueError, match=r"save_path='/proc/nope/x' cannot be written: /proc refuses a new file"):
        NonFiniteGuardCallback(on_nonfinite="stop", save_path="/proc/nope/x")
    NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "new" / "folders" / "healthy.zip"))  # created


def test_a_failed_save_does_not_hide_the_fault(tmp_path: Any) -> None:
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, policy_kwargs=dict(net_arch=[16]), seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "later" / "healthy.zip"))
    (tmp_path / "later").write_text("the folder became a file after the guard was built")
    NaNAfterOptimizerStep(model.policy.optimizer, at=3, weight=model.policy.action_net.weight)
    model.learn(400, callback=guard)  # no NotADirectoryError traceback

    [event] = guard.events
    assert "policy.action_net.weight: 1 NaN" in event.message
    assert f"restored in memory; saving it to {tmp_path / 'later' / 'healthy.zip'} failed" in event.message
    assert model_is_finite(model)


# ----- when the live model is re-read -----


def test_only_other_callbacks_make_the_guard_reread_the_model() -> None:
    """Inside learn() only callbacks change a weight outside an optimizer step; SB3's own never do."""
    guard = NonFiniteGuardCallback()
    eval_env = DummyVecEnv([lambda: BlowUpEnv()])
    read_only = [
        guard,
        CallbackList([guard, ConvertCallback(None), NumericsMonitorCallback()]),
        CallbackList([guard, EvalCallback(eval_env, callback_on_new_best=StopTrainingOnRewardThreshold(1.0))]),
    ]
    assert not any(other_callbacks_may_write(root, guard) for root in read_only)
    writing = [
        None,  # unknown
        CallbackList([guard, NaNInWeight("mlp_extractor")]),
        ConvertCallback(lambda locals_, globals_: True),
        CallbackList([guard, EvalCallback(eval_env, callback_after_eval=NaNInWeight("mlp_extractor"))]),
    ]
    assert all(other_callbacks_may_write(root, guard) for root in writing)


def test_a_function_callback_writing_a_weight_is_caught_before_train() -> None:
    def nan_in_value_net(locals_: dict, globals_: dict) -> bool:
        if locals_["self"].num_timesteps == 100:
            with th.no_grad():
                locals_["self"].policy.value_net.weight[0, 0] = math.nan
        return True

    model = A2C("MlpPolicy", "CartPole-v1", n_steps=10, policy_kwargs=dict(net_arch=[16]), seed=0)
    guard = NonFiniteGuardCallback()
    with pytest.raises(NonFiniteError, match=r"at the end of a rollout, before train\(\): changed outside an optimizer"):
        model.learn(400, callback=CallbackList([ConvertCallback(nan_in_value_net), guard]))
    assert "policy.value_net.weight: 1 NaN" in guard.events[0].message and guard.events[0].timestep == 100


@settings(max_examples=300, deadline=None)
@given(
    n_steps=st.integers(1, 6),
    n_envs=st.integers(1, 3),
    gae_lambda=st.sampled_from([0.0, 0.5, 0.95, 1.0]),
    gamma=st.sampled_from([0.0, 0.9, 0.99, 1.0]),
    where=st.sampled_from(["rewards", "values", "last_values"]),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
    done_pattern=st.integers(0, 2**18 - 1),
    position=st.integers(0, 2**16),
    magnitude=st.sampled_from([1.0, 1e30, 1e37]),
)
def test_sb3_gae_carries_any_nonfinite_reward_or_value_into_a_return(
    n_steps: int,
    n_envs: int,
    gae_lambda: float,
    gamma: float,
    where: str,
    bad: float,
    done_pattern: int,
    position: int,
    magnitude: float,
) -> None:
    """Why the guard reads only the returns and log-probs of a buffer no other callback wrote: in SB3's own GAE, a
    non-finite reward, value or bootstrap value leaves a non-finite return, whatever the dones, gamma and lambda."""
    buffer = RolloutBuffer(
        n_steps, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), n_envs=n_envs, gamma=gamma, gae_lambda=gae_lambda
    )
    rng = np.random.default_rng(position)
    for step in range(n_steps):
        starts = np.array([(done_pattern >> (step * n_envs + env)) & 1 for env in range(n_envs)], dtype=np.float32)
        buffer.add(
            np.zeros((n_envs, 1), np.float32),
            np.zeros((n_envs, 1)),
            (rng.standard_normal(n_envs) * magnitude).astype(np.float32),
            starts,
            th.as_tensor(rng.standard_normal(n_envs) * magnitude, dtype=th.float32),
            th.zeros(n_envs),
        )
    last_values = th.as_tensor(rng.standard_normal(n_envs), dtype=th.float32)
    dones = np.array([(done_pattern >> (17 - env)) & 1 for env in range(n_envs)], dtype=np.float32)
    if where == "last_values":  # multiplied by 0 after a done: NaN then
        last_values[position % n_envs] = bad
    else:
        getattr(buffer, where).reshape(-1)[position % (n_steps * n_envs)] = bad
    with np.errstate(all="ignore"):
        buffer.compute_returns_and_advantage(last_values, dones)
    assert not np.isfinite(buffer.returns).all()


class _WriteIntoTheRolloutBuffer(BaseCallback):
    """A callback that writes a non-finite value into one array of the rollout buffer after SB3 computed the returns."""

    def __init__(self, array: str) -> None:
        super().__init__()
        self.array = array

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        getattr(self.model.rollout_buffer, self.array)[1, 0] = np.inf


@pytest.mark.parametrize("array", ["rewards", "values", "advantages", "returns", "log_probs"])
def test_a_callback_that_writes_into_the_rollout_buffer_has_every_array_checked(array: str) -> None:
    """Where another callback may write, the returns no longer imply the rest: the guard reads all five arrays."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=4, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="raise")
    with pytest.raises(NonFiniteError, match=rf"(?s)end of rollout.*{array}"):
        model.learn(8, callback=[_WriteIntoTheRolloutBuffer(array), guard])
    assert model.num_timesteps == 4
