"""KLAdaptivePPO: beta rule, spaces, persistence, guarded steps, the reported Hopper failure, learning."""

import copy
import math
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from hypothesis import given
from hypothesis import strategies as st
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import CategoricalDistribution
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv, IdentityEnvMultiBinary, IdentityEnvMultiDiscrete, SimpleMultiObsEnv
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import VecNormalize

from sb3_safe import KLAdaptivePPO, SafeA2C, SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy
from sb3_safe.common.buffers import KLDictRolloutBuffer, KLRolloutBuffer
from sb3_safe.common.kl import analytic_kl, distribution_params, has_analytic_kl
from sb3_safe.common.updates import GuardedOptimizerStep
from sb3_safe.ppo_kl import adapt_kl_beta

TRAIN_KEYS = ["train/kl_beta", "train/kl", "train/skipped_updates", "train/log_ratio_clamped_fraction"]
PPO_KEYS = ["train/policy_gradient_loss", "train/value_loss", "train/entropy_loss", "train/approx_kl", "train/clip_fraction"]


class RecordTrainLogs(BaseCallback):
    """After each update phase: the logged train/ values and kl_beta (read at the next rollout start)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, float]] = []

    def _on_rollout_start(self) -> None:
        values = {key: value for key, value in self.logger.name_to_value.items() if key.startswith("train/")}
        if values:
            self.records.append(values)

    def _on_training_end(self) -> None:
        self._on_rollout_start()

    def _on_step(self) -> bool:
        return True


class RolloutKL(BaseCallback):
    """At each rollout end, before any update: the KL between the stored old parameters and the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.kls: list[float] = []

    def _on_rollout_end(self) -> None:
        model = self.model
        assert isinstance(model, KLAdaptivePPO)
        for data in model.rollout_buffer.get():  # the whole rollout in one batch
            model.policy.evaluate_actions(data.observations, model._actions(data))
            distribution = model.policy.action_dist
            if has_analytic_kl(distribution):
                self.kls.append(analytic_kl(data.old_dist_params, distribution).abs().max().item())
            else:
                assert data.old_dist_params.shape[1] == 0

    def _on_step(self) -> bool:
        return True


def params_finite(model: PPO) -> bool:
    return all(th.isfinite(param).all() for param in model.policy.parameters())


def test_adapt_kl_beta_follows_paper_rule() -> None:
    bounds = (1e-4, 1e3)
    assert adapt_kl_beta(1.0, 0.001, 0.01, 1.5, 2.0, bounds) == 0.5
    assert adapt_kl_beta(1.0, 0.1, 0.01, 1.5, 2.0, bounds) == 2.0
    assert adapt_kl_beta(1.0, 0.012, 0.01, 1.5, 2.0, bounds) == 1.0
    # The band [target / tolerance, target * tolerance] keeps beta, its ends included (strict inequalities)
    assert adapt_kl_beta(1.0, 0.01 / 1.5, 0.01, 1.5, 2.0, bounds) == 1.0
    assert adapt_kl_beta(1.0, 0.01 * 1.5, 0.01, 1.5, 2.0, bounds) == 1.0
    assert adapt_kl_beta(1.0, math.nan, 0.01, 1.5, 2.0, bounds) == 1.0
    assert adapt_kl_beta(800.0, 1.0, 0.01, 1.5, 2.0, bounds) == 1e3
    assert adapt_kl_beta(1.5e-4, 0.0, 0.01, 1.5, 2.0, bounds) == 1e-4


@given(
    kls=st.lists(st.floats(min_value=0.0) | st.just(math.nan), min_size=1, max_size=200),
    beta=st.floats(min_value=1e-4, max_value=1e3),
)
def test_adapt_kl_beta_never_leaves_bounds(kls: list[float], beta: float) -> None:
    for kl in kls:
        beta = adapt_kl_beta(beta, kl, 0.01, 1.5, 2.0, (1e-4, 1e3))
        assert 1e-4 <= beta <= 1e3


def test_beta_halves_when_kl_far_below_target() -> None:
    # learning_rate=0: the policy never changes, so the measured KL is 0 up to float32 rounding (the acting forward
    # pass and the update's pass see different batch shapes), far below the target
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", learning_rate=0.0, n_steps=32, batch_size=32, n_epochs=1, seed=0)
    logs = RecordTrainLogs()
    model.learn(32 * 18, callback=logs)
    betas = [record["train/kl_beta"] for record in logs.records]
    assert len(betas) == 18
    assert all(record["train/kl"] < 1e-7 for record in logs.records)
    expected = [max(0.5 ** (i + 1), 1e-4) for i in range(18)]
    assert betas == pytest.approx(expected, rel=1e-12)
    assert betas[-4:] == [1e-4] * 4  # clamped at the lower bound, not below


class PerturbPolicyDuringCollection(BaseCallback):
    """
    Changes the policy after every environment step, as a user callback may; at the rollout's end (before the
    update) checks the stored old parameters against the log-probs stored by the acting forward passes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.max_log_prob_error = math.inf
        self.max_change_since_acting = 0.0

    def _on_step(self) -> bool:
        with th.no_grad():
            for param in self.model.policy.action_net.parameters():
                # a different shift per action output: equal shifts of all logits would not change a categorical
                rows = th.arange(1, param.shape[0] + 1, dtype=param.dtype)
                param.add_(0.05 * rows.reshape(-1, *[1] * (param.dim() - 1)))
        return True

    def _on_rollout_end(self) -> None:
        data = next(self.model.rollout_buffer.get())
        with th.no_grad():
            current = distribution_params(self.model.policy.get_distribution(data.observations))
            stored_log_prob = log_prob_from_params(self.model.policy.action_dist, data.old_dist_params, data.actions)
        self.max_log_prob_error = (stored_log_prob - data.old_log_prob).abs().max().item()
        self.max_change_since_acting = (current - data.old_dist_params).abs().max().item()


def log_prob_from_params(distribution: Any, params: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """Log-probs of ``actions`` under the Gaussian or categorical distribution with ``params``."""
    if isinstance(distribution, CategoricalDistribution):
        return th.distributions.Categorical(logits=params).log_prob(actions.long().flatten())
    mean, log_std = params.chunk(2, dim=1)
    return distribution.proba_distribution(mean, log_std).log_prob(actions)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_old_params_come_from_the_forward_pass_that_acted(env_id: str) -> None:
    # The policy changes after every step; parameters recomputed after the rollout would not give the stored
    # log-probs of the steps before the last
    model = KLAdaptivePPO("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=0), n_steps=16, batch_size=32, seed=0)
    check = PerturbPolicyDuringCollection()
    model.learn(32, callback=check)
    assert check.max_change_since_acting > 0.1
    assert check.max_log_prob_error < 1e-5


def test_old_params_recomputed_with_a_warning_when_the_acting_pass_was_not_seen() -> None:
    """A collection loop that never runs the policy's forward pass (actions from ``predict``): the buffer computes them."""
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = KLAdaptivePPO("MlpPolicy", env, n_steps=16, batch_size=32, seed=0)
    buffer, obs = model.rollout_buffer, env.reset()
    buffer.reset()
    with pytest.warns(UserWarning, match="forward pass that chose these actions was not recorded"):
        for _ in range(16):
            actions, _ = model.predict(obs)  # _predict, not forward: the recording hook does not see it
            with th.no_grad():
                values, log_prob, _ = model.policy.evaluate_actions(th.as_tensor(obs), th.as_tensor(actions))
            buffer.add(obs, actions.reshape(-1, 1), np.zeros(2), np.zeros(2, dtype=bool), values, log_prob)
            obs, *_ = env.step(actions)
    data = next(buffer.get())
    log_prob = log_prob_from_params(model.policy.action_dist, data.old_dist_params, data.actions)
    # the policy did not change during collection: the recomputed parameters are the acting ones
    assert th.allclose(log_prob, data.old_log_prob, atol=1e-5)


def test_beta_doubles_when_kl_far_above_target() -> None:
    model = KLAdaptivePPO(
        "MlpPolicy", "CartPole-v1", learning_rate=1e-3, n_steps=32, batch_size=8, n_epochs=2, adaptive_kl_target=1e-9, seed=0
    )
    logs = RecordTrainLogs()
    model.learn(32 * 14, callback=logs)
    beta = 1.0
    for record in logs.records:
        assert record["train/kl"] > 1.5e-9
        beta = min(2 * beta, 1e3)
        assert record["train/kl_beta"] == beta
    assert beta == 1e3 and model.kl_beta == 1e3  # reached the upper bound and stayed there


ENV_CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "box": ("Pendulum-v1", {}),
    "box_squashed": ("Pendulum-v1", {"policy_kwargs": {"squash_output": True}}),
    "box_gsde": ("Pendulum-v1", {"use_sde": True}),
    "box_sb3_policy": ("Pendulum-v1", {"policy": ActorCriticPolicy}),
    "discrete": ("CartPole-v1", {}),
    "multidiscrete": (lambda: IdentityEnvMultiDiscrete(dim=2, ep_length=20), {}),
    "multibinary": (lambda: IdentityEnvMultiBinary(dim=3, ep_length=20), {}),
    "image": (lambda: FakeImageEnv(screen_height=36, screen_width=36, n_channels=1), {"policy": "CnnPolicy"}),
    "dict": (SimpleMultiObsEnv, {"policy": "MultiInputPolicy"}),
}


@pytest.mark.parametrize("case", list(ENV_CASES))
def test_spaces_train_and_log(case: str) -> None:
    env_id, kwargs = ENV_CASES[case]
    kwargs = dict(kwargs)
    policy = kwargs.pop("policy", "MlpPolicy")
    env = make_vec_env(env_id, n_envs=2, seed=0)
    model = KLAdaptivePPO(policy, env, n_steps=32, batch_size=16, n_epochs=2, seed=0, **kwargs)
    expected_policy = {
        "MlpPolicy": SafeActorCriticPolicy,
        "CnnPolicy": SafeCnnPolicy,
        "MultiInputPolicy": SafeMultiInputPolicy,
    }
    assert type(model.policy) is expected_policy.get(policy, policy)
    assert isinstance(model.rollout_buffer, KLDictRolloutBuffer if case == "dict" else KLRolloutBuffer)
    logs, rollout_kl = RecordTrainLogs(), RolloutKL()
    model.learn(128, callback=[logs, rollout_kl])
    assert len(logs.records) == 2
    for key in TRAIN_KEYS + PPO_KEYS:
        assert all(np.isfinite(record[key]) for record in logs.records), key
    assert params_finite(model)
    # the stored old parameters are those of the policy that acted (gSDE's too): KL 0 before the update
    assert len(rollout_kl.kls) == 2 and max(rollout_kl.kls) < 1e-5


def test_penalty_only_no_advantage_normalization_vecnormalize_and_early_stopping() -> None:
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = KLAdaptivePPO(
        "MlpPolicy",
        env,
        clip_range=None,
        normalize_advantage=False,
        target_kl=1e-9,
        n_steps=32,
        batch_size=16,
        n_epochs=5,
        seed=0,
    )
    logs = RecordTrainLogs()
    model.learn(128, callback=logs)
    assert all(record["train/clip_fraction"] == 0.0 and record["train/clip_range"] == math.inf for record in logs.records)
    # SB3's early stopping: each update phase stops in its first epoch
    assert model._n_updates == 2
    assert params_finite(model)


def test_invalid_arguments_name_themselves() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kl_beta_bounds": (1.0, 0.5)}, "kl_beta_bounds"),
        ({"kl_beta_bounds": (0.0, 1.0)}, "kl_beta_bounds"),
        ({"initial_kl_beta": 1e4}, "initial_kl_beta"),
        ({"adaptive_kl_target": 0.0}, "adaptive_kl_target"),
        ({"kl_adapt_tolerance": 1.0}, "kl_adapt_tolerance"),
        ({"kl_adapt_factor": math.nan}, "kl_adapt_factor"),
        ({"rollout_buffer_class": KLRolloutBuffer.__mro__[1]}, "rollout_buffer_class"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            KLAdaptivePPO("MlpPolicy", "CartPole-v1", **kwargs)


def test_save_load_keeps_beta_and_arguments(tmp_path) -> None:
    model = KLAdaptivePPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=32,
        batch_size=16,
        n_epochs=1,
        adaptive_kl_target=0.02,
        initial_kl_beta=3.0,
        kl_beta_bounds=(1e-3, 1e2),
        kl_adapt_tolerance=1.3,
        kl_adapt_factor=1.7,
        seed=0,
    )
    model.learn(96)
    assert model.kl_beta != 3.0
    model.save(tmp_path / "model.zip")
    loaded = KLAdaptivePPO.load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", seed=1))
    assert loaded.kl_beta == model.kl_beta
    for name in ("adaptive_kl_target", "kl_beta_bounds", "kl_adapt_tolerance", "kl_adapt_factor"):
        assert getattr(loaded, name) == getattr(model, name), name
    assert loaded.kl_beta_bounds == (1e-3, 1e2)
    assert type(loaded.policy) is SafeActorCriticPolicy
    logs = RecordTrainLogs()
    beta = loaded.kl_beta
    loaded.learn(96, callback=logs, reset_num_timesteps=False)
    assert len(logs.records) == 3
    for record in logs.records:  # keeps adapting by the rule, from the saved beta
        beta = adapt_kl_beta(beta, record["train/kl"], 0.02, 1.3, 1.7, (1e-3, 1e2))
        assert record["train/kl_beta"] == beta
    assert params_finite(loaded)


class NaNRewardEnv(gym.Env):
    """A tiny episodic env whose reward is NaN at one global step (here: the first step of the second rollout)."""

    def __init__(self, nan_step: int) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.nan_step = nan_step
        self.n_steps = 0
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action: int):
        reward = math.nan if self.n_steps == self.nan_step else float(action)
        self.n_steps += 1
        self.t += 1
        return self.observation_space.sample(), reward, self.t >= 10, False, {}


class RecordingGuard(GuardedOptimizerStep):
    """The shared guard, recording parameters and Adam state before and after each call."""

    def __init__(self) -> None:
        super().__init__("recording")
        self.records: list[tuple[dict, dict, th.Tensor | None]] = []

    def __call__(self, optimizer, loss, parameters, max_grad_norm):
        parameters = list(parameters)
        before = self._snapshot(optimizer, parameters)
        grad_norm = super().__call__(optimizer, loss, parameters, max_grad_norm)
        self.records.append((before, self._snapshot(optimizer, parameters), grad_norm))
        return grad_norm

    @staticmethod
    def _snapshot(optimizer, parameters) -> dict:
        return {"params": [p.detach().clone() for p in parameters], "adam": copy.deepcopy(optimizer.state_dict()["state"])}


def test_nan_loss_skips_one_step_leaving_params_and_adam_state() -> None:
    n_steps, batch_size = 64, 16
    model = KLAdaptivePPO(
        "MlpPolicy", NaNRewardEnv(nan_step=n_steps), n_steps=n_steps, batch_size=batch_size, n_epochs=1, seed=0
    )
    model.guarded_step = RecordingGuard()
    logs = RecordTrainLogs()
    model.learn(2 * n_steps, callback=logs)
    records = model.guarded_step.records
    assert len(records) == 2 * n_steps // batch_size
    skipped = [i for i, (_, _, grad_norm) in enumerate(records) if grad_norm is None]
    assert len(skipped) == 1 and skipped[0] >= n_steps // batch_size  # one minibatch of the second rollout
    assert model.guarded_step.n_skipped == 1
    assert [record["train/skipped_updates"] for record in logs.records] == [0, 1]
    before, after, _ = records[skipped[0]]
    assert before["adam"]  # Adam state exists (steps were taken in the first rollout) and is unchanged
    for old, new in zip(before["params"], after["params"], strict=True):
        assert th.equal(old, new)
    assert before["adam"].keys() == after["adam"].keys()
    for key, state in before["adam"].items():
        for name, value in state.items():
            assert th.equal(value, after["adam"][key][name]), (key, name)
    # the other steps of that phase did update the parameters
    taken_before, taken_after, _ = records[-1 if skipped[0] != len(records) - 1 else 0]
    assert any(not th.equal(a, b) for a, b in zip(taken_before["params"], taken_after["params"], strict=True))
    assert params_finite(model)


def _buffer_ratio_deviation(model: BaseAlgorithm) -> float:
    """max |ratio - 1| over the current rollout: stored log-probs vs the policy's log-probs of the stored actions."""
    assert isinstance(model, PPO)
    buffer = model.rollout_buffer
    observations = th.as_tensor(buffer.observations.reshape(-1, buffer.observations.shape[-1]))
    actions = th.as_tensor(buffer.actions.reshape(-1, buffer.actions.shape[-1]))
    with th.no_grad():
        try:
            _, log_prob, _ = model.policy.evaluate_actions(observations, actions)
        except ValueError:  # torch refuses a Normal with NaN parameters
            return math.nan
    return (th.exp(log_prob - th.as_tensor(buffer.log_probs.reshape(-1))) - 1).abs().max().item()


class FirstEpochRatio(BaseCallback):
    """The ratio deviation before each update phase, and after each optimizer step of the first epoch."""

    def __init__(self, steps_per_epoch: int) -> None:
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self.before_update: list[float] = []
        self.first_epoch: list[float] = []

    def _on_training_start(self) -> None:
        self.model.policy.optimizer.register_step_post_hook(self._after_step)

    def _after_step(self, *args) -> None:
        if len(self.first_epoch) < self.steps_per_epoch:
            self.first_epoch.append(_buffer_ratio_deviation(self.model))

    def _on_rollout_end(self) -> None:
        self.before_update.append(_buffer_ratio_deviation(self.model))

    def _on_step(self) -> bool:
        return True


def _hopper(algorithm: type[PPO], mean: float, log_std_init: float, **kwargs) -> PPO:
    model = algorithm(
        "MlpPolicy",
        "Hopper-v5",
        n_steps=HOPPER_STEPS,
        batch_size=HOPPER_BATCH,
        n_epochs=10,
        seed=0,
        device="cpu",
        policy_kwargs=dict(squash_output=True, log_std_init=log_std_init),
        **kwargs,
    )
    with th.no_grad():
        model.policy.action_net.bias.fill_(mean)  # type: ignore[operator]  # push the pre-squash mean into tanh saturation
    return model


HOPPER_STEPS, HOPPER_BATCH = 128, 16


def test_reported_failure_replayed_on_hopper_stock_ppo() -> None:
    """
    The user's setup with stock SB3: squashed Gaussian on Hopper (SB3 squashes only with gSDE), many epochs on
    small minibatches, pre-squash mean 12 with a small std: every action component saturates to exactly 1.0.

    SB3's TanhBijector evaluates the density at atanh(1 - eps) ~ 8.3 instead of at the sampled u ~ 12, dozens of
    std away: the stored log-probs (consistent with the recomputed ones before the update) are the density of a
    point the policy never sampled, so sensitive to the weights that the ratio leaves 1 within the first epoch
    and the weights turn NaN.
    """
    stock = _hopper(PPO, mean=12.0, log_std_init=-3.0, use_sde=True)
    ratio = FirstEpochRatio(HOPPER_STEPS // HOPPER_BATCH)
    with pytest.raises(ValueError, match="invalid values"):
        stock.learn(4 * HOPPER_STEPS, callback=ratio)
    assert (np.abs(stock.rollout_buffer.actions) == 1.0).all()
    assert ratio.before_update[0] < 1e-2
    assert not all(dev < 2.0 for dev in ratio.first_epoch)  # ratio far from 1 (or NaN) in the first epoch
    assert not params_finite(stock)


@pytest.mark.parametrize("mean", [12.0, 3.0])
def test_reported_failure_replayed_on_hopper_kl_adaptive_ppo(mean: float) -> None:
    """
    The same setup with KLAdaptivePPO: mean 12 (all saturated, as for stock PPO) and mean 3, the squashed
    Gaussian's clipping bound (partly saturated, so the censored and the density branches of the log-prob both get
    gradients). The log-prob is recomputed from the stored squashed action alone: the first ratio is 1 and the weights
    stay finite.
    """
    model = _hopper(KLAdaptivePPO, mean=mean, log_std_init=-3.0 if mean > 10 else -2.0)
    ratio = FirstEpochRatio(HOPPER_STEPS // HOPPER_BATCH)
    logs = RecordTrainLogs()
    model.learn(3 * HOPPER_STEPS, callback=[ratio, logs])
    saturated = (np.abs(model.rollout_buffer.actions) >= np.float32(1.0) - np.finfo(np.float32).eps).mean()
    assert 0.2 < saturated < 1.0 if mean < 10 else saturated == 1.0
    assert len(ratio.before_update) == 3 and max(ratio.before_update) < 1e-3
    assert all(np.isfinite(dev) and dev < 2.0 for dev in ratio.first_epoch)
    if mean < 10:  # gradients flow: the policy does move within the first epoch
        assert max(ratio.first_epoch) > 1e-3
    assert params_finite(model)
    assert all(record["train/skipped_updates"] == 0 and np.isfinite(record["train/kl"]) for record in logs.records)


def test_learns_cartpole() -> None:
    # rl-zoo's tuned CartPole-v1 hyperparameters (hyperparams/ppo.yml), short budget
    env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
    model = KLAdaptivePPO(
        "MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, learning_rate=1e-3, seed=0
    )
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=1)
    before, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=False)
    model.learn(20_000)
    after, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=False)
    assert isinstance(before, float) and isinstance(after, float)
    assert after > max(4 * before, 100.0), (before, after)
    assert model.guarded_step.n_skipped == 0


@pytest.mark.parametrize(
    "algo, kwargs, key",
    [
        (KLAdaptivePPO, dict(n_steps=64, batch_size=32, n_epochs=1), "train/kl_beta"),
        (SafeA2C, dict(n_steps=8), "train/skipped_updates"),
    ],
)
def test_last_update_statistics_are_written_when_learn_ends(algo, kwargs, key, tmp_path):
    """SB3 writes the logger before train(): without the final write, a one-update run logs no train/ key."""
    model = algo("MlpPolicy", "Pendulum-v1", seed=0, device="cpu", **kwargs)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(kwargs["n_steps"])
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    assert key in header and "train/n_updates" in header


def test_policy_with_the_recording_hook_pickles_and_copies_detached_from_the_buffer() -> None:
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0)
    copies = [copy.deepcopy(model.policy), pickle.loads(pickle.dumps(model.policy))]
    for policy in copies:
        policy(th.zeros((3, 4)))
        assert model.rollout_buffer._passes == []  # a copy's forward passes do not reach the live buffer
    model.policy(th.zeros((1, 4)))
    assert len(model.rollout_buffer._passes) == 1
