"""When the guard's full check (and its snapshot) runs: every PPO-style update, every ``snapshot_every`` steps otherwise."""

import math
from typing import Any

import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env

from sb3_safe import NonFiniteError, NonFiniteGuardCallback, SafeA2C
from sb3_safe.common.guard.cadence import FEW_STEP_SNAPSHOT_EVERY


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the guard's report


class NaNInWeightAt(BaseCallback):
    """Put a NaN into the critic's (SAC) or Q-network's (DQN) first weight right before the update at ``timestep``."""

    def __init__(self, timestep: int):
        super().__init__()
        self.timestep = timestep

    def _on_step(self) -> bool:
        if self.num_timesteps == self.timestep:
            policy = self.model.policy
            network = policy.critic if isinstance(self.model, SAC) else policy.q_net
            weight = next(p for p in network.parameters() if p.dim() == 2)
            with th.no_grad():
                weight[0, 0] = math.nan
        return True


def small_dqn() -> DQN:
    return DQN(
        "MlpPolicy", "CartPole-v1", learning_starts=100, batch_size=16, train_freq=1, policy_kwargs=dict(net_arch=[16]), seed=0
    )


@pytest.mark.parametrize("snapshot_every, restored", [(None, 1000), (300, 900), (1, 1199)])
def test_off_policy_rollback_restores_the_last_full_check(snapshot_every: int | None, restored: int) -> None:
    model = small_dqn()
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", snapshot_every=snapshot_every)
    # The NaN goes in after the env step of timestep 1200; the update that follows uses it and its step is caught
    model.learn(1250, callback=CallbackList([NaNInWeightAt(1200), guard]))

    assert guard.n_rollbacks == 1 and guard.events[0].timestep == 1200
    assert f"Rolled back to the state of timestep {restored} " in guard.events[0].message
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


def test_default_off_policy_granularity_is_documented_value() -> None:
    assert FEW_STEP_SNAPSHOT_EVERY == 1000
    assert "every 1,000 steps of A2C, SafeA2C and the off-policy algorithms" in " ".join(
        (NonFiniteGuardCallback.__doc__ or "").split()
    )


@pytest.mark.parametrize("algo", [DQN, SAC])
def test_the_nan_is_still_caught_at_the_optimizer_step_that_made_it(algo: type) -> None:
    # Between full checks, every optimizer step is checked: the NaN never reaches a forward pass unnoticed
    env_id = "CartPole-v1" if algo is DQN else "Pendulum-v1"
    model = algo("MlpPolicy", env_id, learning_starts=100, batch_size=16, policy_kwargs=dict(net_arch=[16]), seed=0)
    name = "policy.optimizer" if algo is DQN else "critic.optimizer"
    optimizer = model.policy.optimizer if algo is DQN else model.critic.optimizer
    network = model.policy.q_net if algo is DQN else model.critic
    NaNAfterOptimizerStep(optimizer, at=50, weight=next(network.parameters()))
    guard = NonFiniteGuardCallback()
    with pytest.raises(NonFiniteError, match=rf"\(optimizer step of {name} in train\(\)\)"):
        model.learn(400, callback=guard)
    timestep = guard.events[0].timestep
    assert 100 < timestep < FEW_STEP_SNAPSHOT_EVERY  # between two full checks


@pytest.mark.parametrize("algo", [A2C, SafeA2C])
def test_a2c_rollback_restores_the_last_full_check(algo: type) -> None:
    # 8 envs x 5 steps per update: the full check runs at the first rollout start at or past 1,000 steps (1,000)
    model = algo("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=0), policy_kwargs=dict(net_arch=[8]), seed=0)
    injected = [False]

    def corrupt(optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if model.num_timesteps >= 1400 and not injected[0]:
            injected[0] = True
            with th.no_grad():
                model.policy.action_net.weight[0, 0] = math.nan

    model.policy.optimizer.register_step_post_hook(corrupt)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(1600, callback=guard)

    assert guard.n_rollbacks == 1 and guard.events[0].timestep == 1400
    assert "Rolled back to the state of timestep 1000 " in guard.events[0].message
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


def test_on_policy_checks_after_every_update_by_default() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0)
    checked: list[int] = []
    guard = NonFiniteGuardCallback()
    model.learn(32)  # the guard below starts after one update
    original = guard._check_model

    def recording(phase: str, **kwargs: Any) -> None:
        checked.append(model.num_timesteps)
        original(phase, **kwargs)

    guard._check_model = recording  # type: ignore[method-assign]
    model.learn(160, callback=guard, reset_num_timesteps=False)
    assert checked == [32, 64, 96, 128, 160, 192]


@pytest.mark.parametrize("value", [0, -5, 2.5, "100"])
def test_invalid_snapshot_every_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(ValueError, match=r"snapshot_every must be None or an int >= 1"):
        NonFiniteGuardCallback(snapshot_every=value)
