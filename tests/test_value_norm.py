"""
Value-target normalization (PopArt, ``normalize_value=True``) in KLAdaptivePPO and SafeA2C: the numerical promises
(statistics, preserved outputs, a finite loss at any reward scale) and the state promises (saved, rolled back,
undone with a redo, nothing changed when off).
"""

import json
import math
import zipfile
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecNormalize
from torch import nn
from torch.nn import functional as F

import sb3_safe
from sb3_safe import KLAdaptiveLRCallback, KLAdaptivePPO, NonFiniteGuardCallback, SafeA2C
from sb3_safe.common.numerics import note_restore
from sb3_safe.common.value_norm import PopArtValueHead, install_value_normalization, normalized_values, value_head

ALGORITHMS = [
    pytest.param(SafeA2C, dict(n_steps=8), id="SafeA2C"),
    pytest.param(KLAdaptivePPO, dict(n_steps=32, batch_size=16, n_epochs=2), id="KLAdaptivePPO"),
]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard writes its reports to the current directory: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


class ScaledRewardEnv(gym.Env):
    """
    Random observations, rewards ``scale * (1 + action + noise)`` (rounded to float32, as the rollout buffer stores
    them), episodes of 16 steps ended by truncation (so SB3 bootstraps from the values of terminal observations).
    """

    def __init__(self, scale: float = 1.0, continuous: bool = False) -> None:
        super().__init__()
        self.scale = scale
        self.observation_space = spaces.Box(-5.0, 5.0, (3,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else spaces.Discrete(2)
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        base = 1.0 + float(np.asarray(action).reshape(-1)[0]) + 0.1 * float(self.np_random.normal())
        reward = float(np.float32(self.scale * base))
        return self.np_random.normal(size=3).astype(np.float32), reward, False, self.steps >= 16, {}


def make_model(algo: type, kwargs: dict[str, Any], scale: float = 1.0, n_envs: int = 2, **extra: Any) -> Any:
    env = DummyVecEnv([lambda: ScaledRewardEnv(scale)] * n_envs)
    return algo("MlpPolicy", env, seed=0, policy_kwargs=dict(net_arch=[16]), normalize_value=True, **kwargs, **extra)


def statistics(model: Any) -> tuple[float, float, float]:
    head = value_head(model.policy)
    assert head is not None
    return head.return_mean.item(), head.return_var.item(), head.return_count.item()


class ReturnsRecorder(BaseCallback):
    """The rollout buffer's returns at each rollout end (what the next update adds to the statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.returns: list[np.ndarray] = []
        self.statistics: list[tuple[float, float, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.returns.append(self.model.rollout_buffer.returns.astype(np.float64).copy())
        self.statistics.append(statistics(self.model))


def linear_head(in_features: int, seed: int) -> PopArtValueHead:
    th.manual_seed(seed)
    return PopArtValueHead(nn.Linear(in_features, 1))


# ----- the numerical promises -----

#: Batches of returns of one scale: float32 values (as the buffer holds them) of magnitude up to ~1e33
returns_batches = st.tuples(
    st.integers(-6, 30),
    st.lists(st.lists(st.floats(-100.0, 100.0, allow_nan=False, width=32), min_size=1, max_size=40), min_size=1, max_size=5),
)


@settings(max_examples=100, deadline=None)
@given(batches=returns_batches)
def test_statistics_are_the_float64_mean_and_variance_of_every_return(batches: tuple[int, list[list[float]]]) -> None:
    exponent, values = batches
    head = linear_head(4, 0)
    arrays = [(np.asarray(batch, dtype=np.float64) * 10.0**exponent).astype(np.float32) for batch in values]
    for array in arrays:
        head.update(array)
    everything = np.concatenate(arrays).astype(np.float64)
    assert head.return_count.item() == len(everything)
    scale = 10.0**exponent
    assert head.return_mean.item() == pytest.approx(everything.mean(), rel=1e-9, abs=1e-12 * scale)
    assert head.return_var.item() == pytest.approx(everything.var(), rel=1e-7, abs=1e-12 * scale**2)


def test_values_follow_the_statistics_however_they_are_written() -> None:
    """The de-normalizing scale forward applies follows the statistics: an update, a rollback's write outside
    autograd's version counters, a load, a move to float64."""
    head = linear_head(3, 0)
    latent = th.ones(2, 3)
    assert th.equal(head(latent), th.zeros(2, 1))  # before the first update: values of 0
    head.update(np.array([1.0, 3.0]))  # mean 2, std 1 (the first update keeps the layer)
    normalized = F.linear(latent, head.weight, head.bias).double()
    assert th.allclose(head(latent).double(), normalized + 2.0)
    saved = {name: tensor.clone() for name, tensor in head.state_dict().items()}
    head.return_var.data.fill_(4.0)  # as the guard's FlatCopy.restore writes, and says
    note_restore()
    assert th.allclose(head(latent).double(), 2 * normalized + 2.0)
    head.load_state_dict(saved)
    assert th.allclose(head(latent).double(), normalized + 2.0)
    head.double()
    assert head(latent.double()).dtype == th.float64 and th.allclose(head(latent.double()), normalized + 2.0)


@settings(max_examples=100, deadline=None)
@given(
    exponent=st.integers(-6, 30),
    first=st.lists(st.floats(-100.0, 100.0, width=32), min_size=2, max_size=30),
    second=st.lists(st.floats(-100.0, 100.0, width=32), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_popart_preserves_the_values_when_the_statistics_change(
    exponent: int, first: list[float], second: list[float], seed: int
) -> None:
    """After the first update (which only sets the statistics), each update rescales the layer so that the values in
    reward units stay what they were, up to float32 rounding of the weights and of the values."""
    head = linear_head(8, seed)
    scale = 10.0**exponent
    head.update((np.asarray(first) * scale).astype(np.float32))
    latent = th.randn(64, 8, generator=th.Generator().manual_seed(seed))
    with th.no_grad():
        before = head(latent).double()
        head.update((np.asarray(second) * scale).astype(np.float32))
        after = head(latent).double()
    normalized = (before - head.return_mean) / head.return_std
    # Relative to the value (its float32 rounding) and to the new std times the normalized value (the weights')
    tolerance = 1e-6 * before.abs() + 1e-5 * head.return_std * (1.0 + normalized.abs())
    assert bool(((after - before).abs() <= tolerance).all())


@settings(max_examples=100, deadline=None)
@given(
    exponent=st.integers(-4, 34),
    rewards=st.lists(st.floats(-2.0, 2.0, width=32), min_size=2, max_size=64),
    updates=st.integers(1, 4),
)
def test_the_normalized_value_loss_is_finite_for_any_reward_scale(exponent: int, rewards: list[float], updates: int) -> None:
    """Returns up to ~1e35 (squared: far beyond float32): the normalized targets stay within sqrt(count) (Samuelson's
    inequality), so the value loss, its gradient and the de-normalized values stay finite."""
    head = linear_head(4, exponent)
    latent = th.randn(len(rewards), 4, generator=th.Generator().manual_seed(0))
    returns = th.tensor(np.asarray(rewards) * 10.0**exponent, dtype=th.float32)
    for index in range(updates):
        head.update(returns * (index + 1))
    targets = head.normalize(returns)
    assert bool(targets.abs().max() <= math.sqrt(head.return_count.item()) + 1e-3)
    with normalized_values(nn.ModuleDict(dict(value_net=head))):
        values = head(latent)
    loss = F.mse_loss(values.flatten(), targets)
    loss.backward()
    assert math.isfinite(loss.item()) and head.weight.grad is not None and bool(th.isfinite(head.weight.grad).all())
    with th.no_grad():
        assert bool(th.isfinite(head(latent)).all())


def test_a_batch_with_a_non_finite_return_leaves_the_statistics_and_the_layer_unchanged() -> None:
    head = linear_head(4, 0)
    head.update(np.array([1.0, 2.0, 3.0], np.float32))
    state = {key: value.clone() for key, value in head.state_dict().items()}
    head.update(np.array([1.0, np.inf, 3.0], np.float32))
    head.update(np.array([np.nan], np.float32))
    assert all(th.equal(state[key], value) for key, value in head.state_dict().items())


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e6, 1e30])
def test_training_at_any_reward_scale_skips_no_step(algo: type, kwargs: dict[str, Any], scale: float) -> None:
    """Rewards up to 1e30 (the squared error of the raw returns overflows float32 from ~1.8e19): no step skipped,
    the logged (normalized) value loss finite, the values in reward units."""
    model = make_model(algo, kwargs, scale)
    model.learn(4 * kwargs["n_steps"] * 2)
    assert model.skipped_updates == 0
    assert math.isfinite(model.logger.name_to_value["train/value_loss"])
    assert model.logger.name_to_value["train/return_mean"] == pytest.approx(statistics(model)[0])
    observations = th.as_tensor(np.random.default_rng(0).normal(size=(8, 3)), dtype=th.float32)
    with th.no_grad():
        values = model.policy.predict_values(observations)
    # Rewards of about scale per step over 16 steps: values of that order, not of normalized units
    assert bool(th.isfinite(values).all()) and float(values.abs().mean()) > scale


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
@pytest.mark.parametrize("scale", [1e-4, 1e6, 1e30])
def test_training_is_equivariant_to_the_reward_scale(algo: type, kwargs: dict[str, Any], scale: float) -> None:
    """The promise behind "learns at any reward scale": with the same seed, rewards x ``scale`` give the same updates
    as rewards x 1 (the policy's parameters and the normalized critic, up to float32 rounding), and statistics and
    values in reward units times ``scale``. Broken when any part of training sees the reward's units: e.g. the first
    rollout's values (the untrained critic's output, noise of a fixed size) swamping tiny rewards."""
    # Each built right before it learns: the seed sets torch's global generator, which sampling draws from
    models = [make_model(algo, kwargs, factor).learn(4 * kwargs["n_steps"] * 2) for factor in (1.0, scale)]
    reference, scaled = (dict(model.policy.named_parameters()) for model in models)
    for name, parameter in reference.items():
        assert th.allclose(scaled[name], parameter, rtol=1e-3, atol=1e-5), name
    mean, var, count = statistics(models[1])
    assert count == statistics(models[0])[2]
    assert mean == pytest.approx(statistics(models[0])[0] * scale, rel=1e-4)
    assert var == pytest.approx(statistics(models[0])[1] * scale**2, rel=1e-3)
    observations = th.as_tensor(np.random.default_rng(3).normal(size=(8, 3)), dtype=th.float32)
    with th.no_grad():
        values = [model.policy.predict_values(observations).double() for model in models]
    assert th.allclose(values[1], values[0] * scale, rtol=1e-3)


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
def test_values_are_in_reward_units_wherever_sb3_reads_them(algo: type, kwargs: dict[str, Any]) -> None:
    """forward, predict_values and evaluate_actions (what collect_rollouts stores, bootstraps truncated episodes
    from, and GAE's last values) de-normalize; only inside normalized_values (train()'s loss) they are normalized."""
    model = make_model(algo, kwargs, scale=1e6)
    model.learn(2 * kwargs["n_steps"] * 2)
    head = value_head(model.policy)
    assert head is not None and head.return_std.item() > 1e5
    observations = th.as_tensor(np.random.default_rng(1).normal(size=(5, 3)), dtype=th.float32)
    actions = th.zeros(5, dtype=th.long)
    with th.no_grad():
        _, forward_values, _ = model.policy(observations)
        predicted = model.policy.predict_values(observations)
        evaluated, _, _ = model.policy.evaluate_actions(observations, actions)
        with normalized_values(model.policy):
            normalized = model.policy.predict_values(observations)
    assert th.allclose(forward_values, predicted) and th.allclose(evaluated, predicted)
    assert th.allclose(head.normalize(predicted), normalized, atol=1e-4)
    assert not head.normalized_output


# ----- the state promises -----


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
def test_statistics_are_saved_and_loaded_with_the_model(algo: type, kwargs: dict[str, Any], tmp_path: Any) -> None:
    model = make_model(algo, kwargs, scale=1e30)
    model.learn(3 * kwargs["n_steps"] * 2)
    model.save(tmp_path / "model.zip")
    loaded = algo.load(tmp_path / "model.zip", env=model.get_env())
    assert loaded.normalize_value and isinstance(loaded.policy.value_net, PopArtValueHead)
    assert statistics(loaded) == statistics(model) and statistics(model)[2] == 3 * kwargs["n_steps"] * 2
    observations = th.as_tensor(np.random.default_rng(2).normal(size=(6, 3)), dtype=th.float32)
    with th.no_grad():
        assert th.equal(loaded.policy.predict_values(observations), model.policy.predict_values(observations))
    # The optimizer still steps the head's parameters (the same tensors as the policy's value_net)
    optimized = {id(p) for group in loaded.policy.optimizer.param_groups for p in group["params"]}
    assert {id(loaded.policy.value_net.weight), id(loaded.policy.value_net.bias)} <= optimized
    loaded.learn(kwargs["n_steps"] * 2)
    assert statistics(loaded)[2] == 4 * kwargs["n_steps"] * 2


class KeptStatistics(BaseCallback):
    """The statistics at each rollout start (after the guard before it judged the update), by timestep."""

    def __init__(self) -> None:
        super().__init__()
        self.by_timestep: dict[int, tuple[float, float, float]] = {}

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        self.by_timestep[self.model.num_timesteps] = statistics(self.model)


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
def test_a_rollback_restores_the_statistics(algo: type, kwargs: dict[str, Any]) -> None:
    """A NaN written into the weights by the 3rd update's first optimizer step: the guard restores the state after
    the 2nd update (a full check at every update), the statistics included (they had already taken in the 3rd
    rollout's returns)."""
    model = make_model(algo, kwargs)
    rollout = kwargs["n_steps"] * 2
    steps_per_update = 1 if algo is SafeA2C else kwargs["n_epochs"] * (rollout // kwargs["batch_size"])
    NaNAfterOptimizerStep(model.policy.optimizer, 2 * steps_per_update + 1, model.policy.action_net.weight)
    kept, recorder = KeptStatistics(), ReturnsRecorder()
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", snapshot_every=1)
    model.learn(3 * rollout, callback=[guard, kept, recorder])
    assert guard.n_rollbacks == 1 and guard.events[0].healthy["timestep"] == 2 * rollout
    assert statistics(model) == kept.by_timestep[2 * rollout]
    # The third update had added its rollout's returns before the NaN: the rollback took them out again
    assert statistics(model)[2] == 2 * rollout
    two = np.concatenate([returns.ravel() for returns in recorder.returns[:2]])
    assert statistics(model)[0] == pytest.approx(two.mean(), rel=1e-9)


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
def test_a_redo_of_the_adaptive_lr_counts_each_rollout_once(algo: type, kwargs: dict[str, Any]) -> None:
    """Every update is undone and redone (a KL target of 1e-9): the undo restores the statistics, so the redo adds
    the rollout's returns to them once, not twice."""
    model = make_model(algo, kwargs)
    adaptive = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=1, window_steps=10**9, lr_bounds=(1e-12, 1.0))
    recorder = ReturnsRecorder()
    model.learn(3 * kwargs["n_steps"] * 2, callback=[adaptive, recorder])
    assert adaptive.redone_updates == 3
    everything = np.concatenate([returns.ravel() for returns in recorder.returns])
    mean, var, count = statistics(model)
    assert count == len(everything)
    assert mean == pytest.approx(everything.mean(), rel=1e-9) and var == pytest.approx(everything.var(), rel=1e-7)


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
def test_composes_with_vec_normalize(algo: type, kwargs: dict[str, Any]) -> None:
    """Rewards x1e30 under VecNormalize(norm_reward=True): the statistics are those of the returns of the rewards the
    algorithm sees (VecNormalize's), the guard's rollbacks and checks have nothing to do."""
    env = VecNormalize(DummyVecEnv([lambda: ScaledRewardEnv(1e30)] * 2), norm_reward=True)
    model = algo("MlpPolicy", env, seed=0, policy_kwargs=dict(net_arch=[16]), normalize_value=True, **kwargs)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(3 * kwargs["n_steps"] * 2, callback=guard)
    mean, var, _ = statistics(model)
    assert not guard.events and model.skipped_updates == 0
    assert abs(mean) < 1e3 and 0.0 < var < 1e6


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
@pytest.mark.parametrize(
    ("wrap", "normalized"),
    [
        pytest.param(lambda env: env, True, id="plain"),
        pytest.param(lambda env: VecNormalize(env, norm_reward=True), False, id="VecNormalize"),
        pytest.param(lambda env: VecNormalize(env, norm_reward=False), True, id="VecNormalize-observations-only"),
        pytest.param(lambda env: VecFrameStack(VecNormalize(env), 2), False, id="VecNormalize-inside-another-wrapper"),
    ],
)
def test_auto_normalizes_the_values_unless_the_rewards_are_normalized_already(
    algo: type, kwargs: dict[str, Any], wrap: Any, normalized: bool
) -> None:
    """
    Promise of the default ``normalize_value="auto"``: PopArt is on, except under ``VecNormalize(norm_reward=True)``
    anywhere in the wrapper chain (rewards scaled to a unit return already, where PopArt on top learned worse); the
    decision is saved with the model as a bool.
    """
    model = algo("MlpPolicy", wrap(DummyVecEnv([lambda: ScaledRewardEnv()])), seed=0, **kwargs)
    assert model.normalize_value is normalized
    assert (value_head(model.policy) is not None) is normalized
    model.save("model.zip")
    with zipfile.ZipFile("model.zip") as archive:
        assert json.loads(archive.read("data"))["normalize_value"] is normalized


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
def test_off_the_policy_is_sb3s(algo: type, kwargs: dict[str, Any]) -> None:
    """With normalize_value=False (and raw observations) the value head is the nn.Linear SB3 built and the state dict
    has SB3's keys (the trained parameters were checked bit-identical to the code before normalize_value, for the same
    seed)."""
    env = DummyVecEnv([lambda: ScaledRewardEnv()])
    raw = dict(normalize_observations=False)
    model = algo("MlpPolicy", env, seed=0, normalize_value=False, policy_kwargs=raw, **kwargs)
    assert model.normalize_value is False
    assert type(model.policy.value_net) is nn.Linear and value_head(model.policy) is None
    stock = PPO("MlpPolicy", env, seed=0)
    assert model.policy.state_dict().keys() == stock.policy.state_dict().keys()


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
@pytest.mark.parametrize("setting", ["yes", 1, None, "True"])
def test_a_setting_other_than_true_false_or_auto_is_refused(algo: type, kwargs: dict[str, Any], setting: Any) -> None:
    with pytest.raises(ValueError, match=r"normalize_value must be True, False or 'auto', got "):
        algo("MlpPolicy", DummyVecEnv([lambda: ScaledRewardEnv()]), normalize_value=setting, **kwargs)


def _drop_saved_setting(path: str, key: str) -> None:
    """Rewrite a saved model as a checkpoint from before ``key`` existed (its data entry without it)."""
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    del data[key]
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)


@pytest.mark.parametrize(("algo", "kwargs"), ALGORITHMS)
@pytest.mark.parametrize("loader", ["algorithm", "sb3_safe.load"])
def test_a_checkpoint_from_before_normalize_value_loads_with_sb3s_critic(
    algo: type, kwargs: dict[str, Any], loader: str
) -> None:
    """
    Promise: a checkpoint saved before normalize_value existed (no such setting, no statistics in its state dict)
    loads as it was trained, with SB3's critic, although the default now turns the normalization on for its env.
    """
    model = algo("MlpPolicy", DummyVecEnv([lambda: ScaledRewardEnv()]), seed=0, normalize_value=False, **kwargs)
    model.learn(kwargs["n_steps"])
    model.save("old.zip")
    _drop_saved_setting("old.zip", "normalize_value")
    env = DummyVecEnv([lambda: ScaledRewardEnv()])
    loaded = algo.load("old.zip", env=env) if loader == "algorithm" else sb3_safe.load(algo, "old.zip", env=env)
    assert loaded.normalize_value is False and type(loaded.policy.value_net) is nn.Linear
    observations = th.as_tensor(np.random.default_rng(0).normal(size=(4, 3)), dtype=th.float32)
    with th.no_grad():
        assert th.equal(loaded.policy.predict_values(observations), model.policy.predict_values(observations))
    loaded.learn(kwargs["n_steps"])


@pytest.mark.parametrize(
    ("algo", "kwargs", "stock"),
    [(SafeA2C, dict(n_steps=8), A2C), (KLAdaptivePPO, dict(n_steps=32, batch_size=16, n_epochs=2), PPO)],
)
def test_stock_sb3_loads_and_trains_on_a_checkpoint_with_the_statistics(
    algo: type, kwargs: dict[str, Any], stock: type
) -> None:
    """
    Promise (drop-in both ways): SB3's own PPO / A2C load a checkpoint trained with normalize_value, its value head
    and statistics included (the safe policy puts the head in place when its state dict has them), give the same
    values and train on (in reward units, the statistics then kept as saved).
    """
    model = make_model(algo, kwargs, scale=1e3)
    model.learn(2 * kwargs["n_steps"] * 2)
    model.save("safe.zip")
    stock = A2C if algo is SafeA2C else PPO
    loaded = stock.load("safe.zip", env=model.get_env())
    assert isinstance(loaded.policy.value_net, PopArtValueHead) and statistics(loaded) == statistics(model)
    observations = th.as_tensor(np.random.default_rng(1).normal(size=(4, 3)), dtype=th.float32)
    with th.no_grad():
        assert th.equal(loaded.policy.predict_values(observations), model.policy.predict_values(observations))
    before = loaded.policy.value_net.weight.detach().clone()
    loaded.learn(kwargs["n_steps"] * 2)
    assert not th.equal(loaded.policy.value_net.weight, before) and statistics(loaded) == statistics(model)
    assert all(th.isfinite(param).all() for param in loaded.policy.parameters())


def test_install_keeps_the_parameters_their_order_and_names() -> None:
    model = SafeA2C("MlpPolicy", DummyVecEnv([lambda: ScaledRewardEnv()]), seed=0)
    before = list(model.policy.named_parameters())
    head = install_value_normalization(model.policy)
    assert install_value_normalization(model.policy) is head
    after = list(model.policy.named_parameters())
    assert [(name, id(param)) for name, param in before] == [(name, id(param)) for name, param in after]
    assert {"value_net.return_mean", "value_net.return_var", "value_net.return_count"} <= model.policy.state_dict().keys()


def test_cartpole_learns_with_rewards_times_1e6() -> None:
    """rl-zoo's CartPole-v1 settings for A2C (8 envs, ent_coef 0), rewards x1e6: with the normalization SafeA2C learns
    as at the task's own scale (without it the critic lags 1e5 times behind the returns: see the reward-scale map)."""

    class Times1e6(gym.RewardWrapper):
        def reward(self, reward: float) -> float:
            return reward * 1e6

    env = make_vec_env("CartPole-v1", n_envs=8, seed=0, wrapper_class=Times1e6)
    model = SafeA2C("MlpPolicy", env, ent_coef=0.0, seed=0, device="cpu", normalize_value=True)
    model.learn(12_000)
    after, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=100), n_eval_episodes=10)
    assert isinstance(after, float) and after > 150
