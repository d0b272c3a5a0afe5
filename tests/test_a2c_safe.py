"""SafeA2C: the softmax-NaN report replayed, guarded updates, spaces, save/load, Pong smoke test, learning check."""

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, SupportsFloat

import ale_py
import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from stable_baselines3 import A2C
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.torch_layers import NatureCNN
from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

from sb3_safe import SafeA2C
from sb3_safe.common.distributions import DEFAULT_LOGIT_BOUND, SafeCategoricalDistribution, min_action_probability
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy

gym.register_envs(ale_py)

FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    # Small networks: several threads only fight over the cores (10x slower on a loaded 2-core machine)
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


class BrightSideEnv(gym.Env):
    """
    Image task with two actions, like the softmax report's actor: pick the brighter half of a random image.

    :param reward_scale: reward for a right choice (minus it for a wrong one)
    :param size: image side, the smallest NatureCNN accepts
    :param ep_length: steps per episode
    """

    def __init__(self, reward_scale: float = 1.0, size: int = 36, ep_length: int = 20):
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(2)
        self.reward_scale = reward_scale
        self.size = size
        self.ep_length = ep_length

    def _observe(self) -> np.ndarray:
        image = self.np_random.integers(0, 128, (self.size, self.size, 3), dtype=np.uint8)
        self.bright_side = int(self.np_random.integers(2))
        half = self.size // 2
        image[:, self.bright_side * half : (self.bright_side + 1) * half] += 100
        return image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.n_steps = 0
        return self._observe(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = self.reward_scale if int(action) == self.bright_side else -self.reward_scale
        self.n_steps += 1
        return self._observe(), reward, False, self.n_steps >= self.ep_length, {}


class ConstantRewardWrapper(gym.RewardWrapper):
    """Replace every reward with ``reward`` (settable through ``VecEnv.set_attr``), e.g. inf or 1e20."""

    def __init__(self, env: gym.Env, reward: float = 1.0):
        super().__init__(env)
        self.constant_reward = reward

    def reward(self, reward: SupportsFloat) -> float:
        return self.constant_reward


def params_finite(model: A2C) -> bool:
    return all(bool(th.isfinite(param).all()) for param in model.policy.parameters())


def assert_valid_probabilities(probs: th.Tensor, n_actions: int) -> None:
    assert th.isfinite(probs).all()
    assert th.allclose(probs.sum(dim=-1), th.ones(probs.shape[0]), atol=1e-5)
    assert (probs >= min_action_probability(n_actions, DEFAULT_LOGIT_BOUND) * (1 - 1e-4)).all()


@pytest.mark.parametrize("normalize_value", [False, "auto"])
def test_softmax_report_replayed(normalize_value: bool | str) -> None:
    """
    The Keras report: RMSprop with a high learning rate, rewards far from normalized and no gradient clipping.

    Stock A2C's gradient norm overflows within a few updates; clipping to ``max_grad_norm=inf`` then scales the
    gradients by inf / inf = NaN, the weights become NaN and the next Categorical raises. SafeA2C with SB3's critic
    skips every such step and keeps a valid policy; with its default (the value targets normalized, as the rewards
    are not) no step overflows.
    """
    run: dict[str, Any] = dict(learning_rate=1e-2, max_grad_norm=float("inf"), seed=0, device="cpu")

    def make_env():
        return make_vec_env(BrightSideEnv, n_envs=2, seed=0, env_kwargs=dict(reward_scale=1e12))

    stock = A2C("CnnPolicy", make_env(), **run)
    with pytest.raises(ValueError, match="invalid values"):
        stock.learn(1000)
    assert not params_finite(stock)

    safe = SafeA2C("CnnPolicy", make_env(), normalize_value=normalize_value, **run)
    safe.learn(1000)
    assert safe.num_timesteps == 1000
    assert params_finite(safe)
    assert (safe.skipped_updates > 0) == (normalize_value is False)
    assert safe.logger.name_to_value["train/skipped_updates"] == safe.skipped_updates
    # train() has flattened the last rollout to (n_steps * n_envs, *obs_shape)
    observations = th.as_tensor(safe.rollout_buffer.observations)
    with th.no_grad():
        categorical = safe.policy.get_distribution(observations).distribution
    assert isinstance(categorical, th.distributions.Categorical)
    assert_valid_probabilities(categorical.probs, n_actions=2)


finite_logits = arrays(
    np.float32,
    st.tuples(st.integers(1, 4), st.integers(2, 6)),
    elements=st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32),
)


@settings(max_examples=200, deadline=None)
@given(logits=finite_logits, logit_bound=st.floats(0.1, 100.0))
def test_safe_categorical_property(logits: np.ndarray, logit_bound: float) -> None:
    """For any finite logits: every log-prob >= log(documented minimum), finite entropy, finite gradients."""
    n_actions = logits.shape[1]
    raw = th.as_tensor(logits).requires_grad_(True)
    dist = SafeCategoricalDistribution(n_actions, logit_bound=logit_bound).proba_distribution(raw)
    all_actions = th.arange(n_actions).unsqueeze(1).expand(n_actions, logits.shape[0])
    log_probs = th.stack([dist.log_prob(actions) for actions in all_actions])
    # In log space: the minimum underflows float32 for bounds above ~44
    log_min = -math.log1p((n_actions - 1) * math.exp(2 * logit_bound))
    assert (log_probs >= log_min - 1e-4 * abs(log_min) - 1e-5).all()
    entropy = dist.entropy()
    assert th.isfinite(entropy).all()
    (log_probs.sum() + entropy.sum()).backward()
    assert raw.grad is not None and th.isfinite(raw.grad).all()


@settings(max_examples=100, deadline=None)
@given(logits=finite_logits)
def test_safe_categorical_default_bound_probabilities(logits: np.ndarray) -> None:
    """With the default bound the minimum (2e-9 for two actions) is a float32 number, so probabilities reach it."""
    dist = SafeCategoricalDistribution(logits.shape[1]).proba_distribution(th.as_tensor(logits))
    assert_valid_probabilities(dist.distribution.probs, n_actions=logits.shape[1])


def test_guarded_update_leaves_params_and_optimizer_state() -> None:
    """An inf reward gives a non-finite loss: the step is skipped, weights and RMSprop state unchanged (the statistics
    of the observations, which the rollouts update, aside)."""
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0, wrapper_class=ConstantRewardWrapper)
    model = SafeA2C("MlpPolicy", env, seed=0, device="cpu", policy_kwargs=dict(normalize_observations="auto"))
    model.learn(100)
    assert model.skipped_updates == 0
    params = {name: value.clone() for name, value in model.policy.state_dict().items()}
    observations_seen = params.pop("observation_normalizer.obs_count").item()
    square_avgs = [state["square_avg"].clone() for state in model.policy.optimizer.state.values()]
    assert len(square_avgs) > 0

    env.set_attr("constant_reward", math.inf)
    model.learn(3 * model.n_steps * env.num_envs, reset_num_timesteps=False)
    assert model.skipped_updates == 3
    assert model.logger.name_to_value["train/skipped_updates"] == 3
    saved_now = model.policy.state_dict()
    assert saved_now.pop("observation_normalizer.obs_count").item() > observations_seen
    assert all(th.equal(params[name], value) for name, value in saved_now.items() if not name.startswith("observation_"))
    after = [state["square_avg"] for state in model.policy.optimizer.state.values()]
    assert all(th.equal(before, now) for before, now in zip(square_avgs, after, strict=True))
    assert all(param.grad is None or not param.grad.any() for param in model.policy.parameters())

    env.set_attr("constant_reward", 1.0)
    model.learn(model.n_steps * env.num_envs, reset_num_timesteps=False)
    assert model.skipped_updates == 3
    assert not all(th.equal(params[name], value) for name, value in model.policy.state_dict().items())


def test_huber_value_loss_finite_for_huge_returns() -> None:
    """
    SB3's critic (``normalize_value=False``), returns ~1e20: the MSE overflows float32 (step skipped), the Huber loss
    stays finite and the step is taken.
    """
    losses = {}
    for value_loss in ("mse", "huber"):
        env = make_vec_env(
            "CartPole-v1", n_envs=2, seed=0, wrapper_class=ConstantRewardWrapper, wrapper_kwargs=dict(reward=1e20)
        )
        model = SafeA2C(
            "MlpPolicy", env, value_loss=value_loss, normalize_advantage=True, seed=0, device="cpu", normalize_value=False
        )
        initial = [param.clone() for param in model.policy.parameters()]
        model.learn(4 * model.n_steps * env.num_envs)
        assert model.rollout_buffer.returns.max() > 1e20
        assert params_finite(model)
        moved = not all(th.equal(before, now) for before, now in zip(initial, model.policy.parameters(), strict=True))
        losses[value_loss] = (model.logger.name_to_value["train/value_loss"], model.skipped_updates, moved)

    mse_loss, mse_skipped, mse_moved = losses["mse"]
    assert math.isinf(mse_loss) and mse_skipped == 4 and not mse_moved
    huber_loss, huber_skipped, huber_moved = losses["huber"]
    assert math.isfinite(huber_loss) and huber_loss > 1e19
    assert huber_skipped == 0 and huber_moved


def test_policy_aliases_and_stock_policies() -> None:
    assert SafeA2C.policy_aliases == {
        "MlpPolicy": SafeActorCriticPolicy,
        "CnnPolicy": SafeCnnPolicy,
        "MultiInputPolicy": SafeMultiInputPolicy,
    }
    model = SafeA2C(ActorCriticPolicy, "CartPole-v1", n_steps=8, seed=0, device="cpu")
    assert type(model.policy) is ActorCriticPolicy
    model.learn(64)
    assert model.logger.name_to_value["train/logit_max"] > 0


def test_logit_max_is_the_raw_logit() -> None:
    """``train/logit_max`` is the largest |logit| before the bound: here far above a small bound."""
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=0, device="cpu", policy_kwargs=dict(logit_bound=0.5))
    action_net = model.policy.action_net
    assert isinstance(action_net, th.nn.Linear)
    with th.no_grad():
        action_net.weight.mul_(1e3)
    model.learn(8)
    # The rollout is still in the buffer: recompute what train() saw, then train() on it again
    observations = th.as_tensor(model.rollout_buffer.observations.reshape(-1, 4))
    with th.no_grad():
        features = model.policy.extract_features(observations)
        assert isinstance(features, th.Tensor)
        expected = action_net(model.policy.mlp_extractor.forward_actor(features)).abs().max().item()
    model.train()
    assert expected > 0.5
    assert model.logger.name_to_value["train/logit_max"] == pytest.approx(expected)


def test_box_logs_bounded_log_std() -> None:
    model = SafeA2C("MlpPolicy", "Pendulum-v1", n_steps=8, seed=0, device="cpu", policy_kwargs=dict(log_std_range=(-1.0, 0.5)))
    with th.no_grad():
        model.policy.log_std.copy_(th.tensor([5.0]))
    model.learn(8)
    logged = model.logger.name_to_value
    # projected to 0.5 before the rollout, then one update (the clamp is no dead zone)
    assert logged["train/log_std_min"] == logged["train/log_std_max"]
    assert -1.0 <= logged["train/log_std_max"] <= 0.5 and logged["train/log_std_max"] == pytest.approx(0.5, abs=0.05)
    assert "train/logit_max" not in logged
    assert logged["train/std"] == pytest.approx(math.exp(logged["train/log_std_max"]))


@pytest.mark.parametrize(
    "env_class, n_logits",
    [
        (lambda: IdentityEnvMultiDiscrete(dim=3), 3 + 3),  # MultiDiscrete([3, 3])
        (lambda: IdentityEnvMultiBinary(dim=3), 3),
    ],
    ids=["MultiDiscrete", "MultiBinary"],
)
def test_multidiscrete_and_multibinary(env_class: Any, n_logits: int) -> None:
    env = make_vec_env(env_class, n_envs=2, seed=0)
    model = SafeA2C("MlpPolicy", env, n_steps=8, seed=0, device="cpu")
    assert model.policy.action_net.out_features == n_logits
    model.learn(160)
    assert params_finite(model)
    assert math.isfinite(model.logger.name_to_value["train/logit_max"])
    observations = env.reset()
    assert isinstance(observations, np.ndarray)
    actions, _ = model.predict(observations)
    assert len(actions) == 2
    assert all(env.action_space.contains(action) for action in actions)


def test_save_load_predict(tmp_path: Path) -> None:
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = SafeA2C(
        "MlpPolicy",
        env,
        use_rms_prop_tf_like=True,
        value_loss="huber",
        seed=0,
        device="cpu",
        policy_kwargs=dict(logit_bound=5.0),
    )
    model.learn(200)
    model.guarded_step.n_skipped = 2  # as if two steps had been skipped: the count must survive
    observations = env.reset()
    assert isinstance(observations, np.ndarray)
    actions, _ = model.predict(observations, deterministic=True)
    model.save(tmp_path / "model.zip")

    loaded = SafeA2C.load(tmp_path / "model.zip", env=env, device="cpu")
    assert isinstance(loaded.policy, SafeActorCriticPolicy)
    assert loaded.policy.logit_bound == 5.0
    assert isinstance(loaded.policy.optimizer, RMSpropTFLike)
    assert loaded.policy.optimizer.defaults["eps"] == 1e-5
    assert loaded.value_loss == "huber"
    assert loaded.skipped_updates == 2
    loaded_state = loaded.policy.state_dict()
    assert loaded_state.keys() == model.policy.state_dict().keys()
    assert all(th.equal(param, loaded_state[name]) for name, param in model.policy.state_dict().items())
    assert np.array_equal(loaded.predict(observations, deterministic=True)[0], actions)
    loaded.learn(100, reset_num_timesteps=False)
    assert params_finite(loaded)


def test_argument_validation() -> None:
    with pytest.raises(ValueError, match="value_loss"):
        SafeA2C("MlpPolicy", "CartPole-v1", value_loss="l1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="use_rms_prop_tf_like"):
        SafeA2C("MlpPolicy", "CartPole-v1", use_rms_prop_tf_like=True, use_rms_prop=False)
    with pytest.raises(ValueError, match="optimizer_class"):
        SafeA2C("MlpPolicy", "CartPole-v1", use_rms_prop_tf_like=True, policy_kwargs=dict(optimizer_class=th.optim.Adam))
    # The rl-zoo way, through policy_kwargs, selects it too
    model = SafeA2C(
        "MlpPolicy", "CartPole-v1", policy_kwargs=dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(eps=1e-5))
    )
    assert isinstance(model.policy.optimizer, RMSpropTFLike)


def test_subproc_vec_env() -> None:
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0, vec_env_cls=SubprocVecEnv)
    try:
        model = SafeA2C("MlpPolicy", env, n_steps=8, seed=0, device="cpu")
        model.learn(160)
        assert model.num_timesteps == 160
        assert model.rollout_buffer.observations.shape == (8 * 2, 4)  # flattened by train()
        assert params_finite(model)
    finally:
        env.close()


def test_pong_smoke() -> None:
    """PongNoFrameskip-v4 through SB3's Atari wrappers and 4-frame stacking, rl-zoo's A2C Atari settings."""
    n_envs, n_steps = 2, 5
    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=n_envs, seed=0), n_stack=4)
    # rl-zoo hyperparams/a2c.yml, atari: ent_coef 0.01, vf_coef 0.25, RMSpropTFLike(eps=1e-5) (n_envs 16 there)
    model = SafeA2C(
        "CnnPolicy", env, n_steps=n_steps, ent_coef=0.01, vf_coef=0.25, use_rms_prop_tf_like=True, seed=0, device="cpu"
    )
    initial = [param.clone() for param in model.policy.parameters()]
    model.set_logger(configure(folder=None, format_strings=[]))
    model.learn(2 * n_steps * n_envs)

    assert isinstance(model.policy.features_extractor, NatureCNN)
    assert isinstance(model.policy.optimizer, RMSpropTFLike)
    assert model.observation_space.shape == (4, 84, 84)  # channel-first after SB3's automatic VecTransposeImage
    assert model.rollout_buffer.observations.shape == (n_steps * n_envs, 4, 84, 84)  # flattened by train()
    assert model.policy.action_net.out_features == 6
    assert model._n_updates == 2 and model.skipped_updates == 0
    assert params_finite(model)
    assert not all(th.equal(before, now) for before, now in zip(initial, model.policy.parameters(), strict=True))
    assert math.isfinite(model.logger.name_to_value["train/logit_max"])
    observations = env.reset()
    assert isinstance(observations, np.ndarray)
    actions, _ = model.predict(observations)
    assert actions.shape == (n_envs,)
    env.close()


def test_cartpole_learns() -> None:
    """
    rl-zoo's CartPole-v1 settings (8 envs, ent_coef 0) with SB3's critic and observations, 20k steps: the stochastic
    policy's return clearly improves. (With the defaults, the normalized critic and observations, see
    ``test_value_norm.py``.)
    """
    env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=100)
    raw = dict(normalize_observations=False)
    model = SafeA2C("MlpPolicy", env, ent_coef=0.0, seed=0, device="cpu", normalize_value=False, policy_kwargs=raw)
    before, _ = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=False)
    model.learn(20_000)
    after, _ = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=False)
    assert isinstance(before, float) and isinstance(after, float)
    assert before < 40
    assert after > 150 and after > 4 * before
