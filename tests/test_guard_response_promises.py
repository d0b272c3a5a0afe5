"""
Promises of the guard's response policy (raise, stop or roll back): what a stop's message says and does not say,
how rollbacks to one healthy state compound, who is told of a restore, which ``save_path`` is refused, and that
a rolled-back step's dict observations are normalized again.
"""

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_safe import NonFiniteGuardCallback
from sb3_safe.common.guard.locate import MODEL
from sb3_safe.common.guard.response import Response
from sb3_safe.common.guard.snapshot import SnapshotStore
from sb3_safe.common.guard.watch import WatchedModel

pytestmark = pytest.mark.filterwarnings("ignore::sb3_safe.NonFiniteGuardWarning")


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the guard's report


class RandomEnv(gym.Env):
    """Random observations and rewards, a continuous action; episodes truncated after 16 steps."""

    def __init__(self, dict_observations: bool = False) -> None:
        super().__init__()
        box = spaces.Box(-5.0, 5.0, (3,), np.float32)
        self.observation_space: spaces.Space = (
            spaces.Dict({"a": box, "b": spaces.Box(-5.0, 5.0, (2,), np.float32)}) if dict_observations else box
        )
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.episode_steps = 0

    def _observation(self) -> Any:
        space = self.observation_space
        if isinstance(space, spaces.Dict):
            return {key: self.np_random.normal(size=box.shape).astype(np.float32) for key, box in space.items()}
        return self.np_random.normal(size=3).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.episode_steps = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.episode_steps += 1
        return self._observation(), float(self.np_random.normal()), False, self.episode_steps >= 16, {}


class CorruptAtTimestep(BaseCallback):
    """Run ``corrupt(model)`` right after the env step that reaches ``timestep``."""

    def __init__(self, timestep: int, corrupt: Any) -> None:
        super().__init__()
        self.timestep, self.corrupt = timestep, corrupt

    def _on_step(self) -> bool:
        if self.num_timesteps == self.timestep:
            self.corrupt(self.model)
        return True


def small_ppo(env: Any, n_epochs: int = 1, **kwargs: Any) -> PPO:
    return PPO(
        "MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=n_epochs, policy_kwargs=dict(net_arch=[16]), seed=0, **kwargs
    )


def first_weight(model: BaseAlgorithm) -> th.Tensor:
    return model.policy.mlp_extractor.policy_net[0].weight


def outcome(message: str) -> str:
    """The sentence saying what the guard did: the last line of an event's message."""
    return message.splitlines()[-1]


# ----- what a stop says -----


@pytest.mark.parametrize("fault", ["nan weight", "stall"])
def test_a_stop_in_stop_mode_gives_no_reason_for_not_rolling_back(fault: str) -> None:
    """
    Promise: only ``"rollback"`` mode explains why it stopped instead of rolling back; in ``"stop"`` mode, stopping is
    what was asked, so the stop's sentence gives no reason (no "rollbacks were used", no "a rollback cannot fix").
    """
    if fault == "stall":
        # Gradients clipped to nothing: the parameters never move, a stall after 4 updates
        model = small_ppo(RandomEnv(), max_grad_norm=0.0)
        guard = NonFiniteGuardCallback(on_nonfinite="stop", stall_updates=4)
    else:
        model = small_ppo(RandomEnv(), n_epochs=2)
        NaNAfterOptimizerStep(model.policy.optimizer, 3, first_weight(model))
        guard = NonFiniteGuardCallback(on_nonfinite="stop")
    model.learn(32 * 10, callback=guard)

    [event] = guard.events
    assert event.action == "stop" and event.source == ("stall" if fault == "stall" else MODEL)
    healthy = event.healthy["timestep"]
    assert outcome(event.message) == (
        f"Stopping training; the last healthy model (timestep {healthy}) was restored in memory."
    )


@pytest.mark.parametrize("vec_normalize", [True, False], ids=["VecNormalize", "plain"])
def test_a_stop_that_saves_says_where_the_vecnormalize_statistics_went(vec_normalize: bool, tmp_path: Any) -> None:
    """
    Promise: a stop that saves the healthy model says where it went and, with VecNormalize, where its statistics went
    (``<save_path without .zip>_vecnormalize.pkl``); without VecNormalize it says nothing of them.
    """
    env = DummyVecEnv([RandomEnv])
    model = small_ppo(VecNormalize(env) if vec_normalize else env, n_epochs=2)
    NaNAfterOptimizerStep(model.policy.optimizer, 3, first_weight(model))
    save_path = str(tmp_path / "healthy.zip")
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=save_path)
    model.learn(32 * 4, callback=guard)

    [event] = guard.events
    assert event.action == "stop"
    said = outcome(event.message)
    if vec_normalize:
        vec_path = str(tmp_path / "healthy_vecnormalize.pkl")
        assert guard.vec_normalize_path == vec_path
        assert said.endswith(f"was restored and saved to {save_path} (VecNormalize to {vec_path}).")
        VecNormalize.load(vec_path, DummyVecEnv([RandomEnv]))  # saved where it says
    else:
        assert said.endswith(f"was restored and saved to {save_path}.")
        assert "VecNormalize" not in said


# ----- how rollbacks compound -----


def test_rollbacks_to_one_healthy_state_compound_the_decay() -> None:
    """
    Promise: a rollback never raises the learning rate. Two rollbacks in one ``train()`` restore the same healthy
    state, recorded before the first lowered the rate: each multiplies the rate by ``lr_decay``, so the second
    leaves ``lr_decay ** 2`` of it, not the healthy state's rate times ``lr_decay`` again.
    """
    model = small_ppo(RandomEnv(), n_epochs=4, learning_rate=1e-3)
    weight = first_weight(model)
    # Optimizer steps 3 and 4 of the first train() (4 steps): no full check, hence no new healthy state, between them
    NaNAfterOptimizerStep(model.policy.optimizer, 3, weight)
    NaNAfterOptimizerStep(model.policy.optimizer, 4, weight)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", lr_decay=0.5)
    model.learn(32, callback=guard)

    assert [event.action for event in guard.events] == ["rollback", "rollback"]
    assert guard.events[0].healthy["timestep"] == guard.events[1].healthy["timestep"] == 0  # one healthy state
    for event in guard.events:
        assert "multiplied the learning rate by 0.5 " in outcome(event.message)
    assert model.lr_schedule(1.0) == pytest.approx(0.25e-3)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.25e-3)
    assert th.isfinite(weight).all()


# ----- who is told of a restore -----


def _response(mode: str, on_restore: Any, healthy: bool = True) -> Response:
    model = small_ppo(RandomEnv())
    watched = WatchedModel(model)
    snapshots = SnapshotStore(model, watched, restorable=True)
    if healthy:
        snapshot, finite = snapshots.copy_and_test()
        assert finite
        snapshots.commit(snapshot)
    return Response(model, watched, snapshots, mode, 0.5, 3, None, on_restore=on_restore)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["rollback", "stop"])
def test_on_restore_is_called_when_a_rollback_or_stop_restored_a_state(mode: str) -> None:
    """
    Promise: ``on_restore`` (the supervisor's note that the update in progress was replaced) is called once per
    rollback or stop that restored the healthy state, and never when there was none to restore.
    """
    calls: list[str] = []
    response = _response(mode, lambda: calls.append(mode))
    assert response.respond(MODEL)[0] == mode
    assert calls == [mode]

    untold: list[str] = []
    assert _response(mode, lambda: untold.append(mode), healthy=False).respond(MODEL)[0] == "stop"
    assert untold == []


@pytest.mark.parametrize("mode", ["rollback", "stop"])
def test_without_on_restore_a_restore_still_succeeds(mode: str) -> None:
    """Promise: ``on_restore`` is optional: without it a rollback or stop restores and reports as usual."""
    response = _response(mode, None)
    action, said = response.respond(MODEL)
    assert action == mode and said.startswith("Rolled back" if mode == "rollback" else "Stopping training")


# ----- settings -----


@pytest.mark.parametrize("save_path", [5, 1.5, ["healthy.zip"]])
def test_a_save_path_that_is_not_a_path_is_refused_naming_it(save_path: Any) -> None:
    """Promise: a ``save_path`` that is not a str or os.PathLike fails at construction with a ValueError naming it."""
    with pytest.raises(ValueError, match=r"save_path must be None or a file path, got "):
        NonFiniteGuardCallback(on_nonfinite="stop", save_path=save_path)


# ----- a rolled-back step's dict observations -----


def test_a_rollback_renormalizes_the_dict_observations_of_the_step() -> None:
    """
    Promise: when a step's observations were normalized with non-finite VecNormalize statistics and the guard rolls
    them back, every key of a Dict observation is normalized again, in place, with the restored statistics: the
    policy acts on finite observations and training goes on.
    """

    def nan_obs_mean(model: BaseAlgorithm) -> None:
        venv = model.get_vec_normalize_env()
        assert venv is not None
        venv.obs_rms["a"].mean[1] = math.nan

    env = VecNormalize(DummyVecEnv([lambda: RandomEnv(dict_observations=True)]))
    model = PPO("MultiInputPolicy", env, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[16]), seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    seen: list[dict[str, np.ndarray]] = []

    class RecordLastObs(BaseCallback):
        """What the policy acts on next, after the guard (listed before it) handled the step."""

        def _on_step(self) -> bool:
            seen.append({key: value.copy() for key, value in self.locals["new_obs"].items()})
            return True

    model.learn(64, callback=[CorruptAtTimestep(21, nan_obs_mean), guard, RecordLastObs()])

    assert guard.n_rollbacks == 1 and guard.events[0].source == "normalization" and model.num_timesteps == 64
    assert len(seen) == 64 and all(np.isfinite(obs[key]).all() for obs in seen for key in obs)
