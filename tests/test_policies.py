"""The safe policies as drop-ins for stock SB3 / sb3-contrib algorithms."""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import TRPO
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.envs import (
    FakeImageEnv,
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
    SimpleMultiObsEnv,
)
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy

from sb3_safe import NonFiniteError, SafeCnnPolicy, SafeMlpPolicy, SafeMultiInputPolicy
from sb3_safe.common.distributions import (
    BoundedDiagGaussianDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
)

ALGOS = {"ppo": PPO, "a2c": A2C, "trpo": TRPO}
SMALL = {
    "ppo": dict(n_steps=64, batch_size=32, n_epochs=2),
    "a2c": dict(n_steps=8),
    "trpo": dict(n_steps=64, batch_size=32, n_critic_updates=2, cg_max_steps=5),
}
ENVS = {
    "box": lambda: IdentityEnvBox(ep_length=20),
    "discrete": lambda: IdentityEnv(4, ep_length=20),
    "multidiscrete": lambda: IdentityEnvMultiDiscrete(3, ep_length=20),
    "multibinary": lambda: IdentityEnvMultiBinary(3, ep_length=20),
}
EXPECTED_DISTRIBUTION = {
    "box": BoundedDiagGaussianDistribution,
    "discrete": SafeCategoricalDistribution,
    "multidiscrete": SafeMultiCategoricalDistribution,
    "multibinary": SafeBernoulliDistribution,
}


def parameters_finite(model) -> bool:
    return all(bool(th.isfinite(parameter).all()) for parameter in model.policy.parameters())


def learn_save_load_predict(algo_name, policy, env, tmp_path, device="cpu", **policy_kwargs):
    algo = ALGOS[algo_name]
    model = algo(policy, env, seed=0, device=device, policy_kwargs=policy_kwargs, **SMALL[algo_name])
    model.learn(256)
    assert parameters_finite(model)
    path = tmp_path / f"{algo_name}.zip"
    model.save(path)
    loaded = algo.load(path, device=device)
    assert type(loaded.policy) is type(model.policy)
    observations = (
        np.stack([model.observation_space.sample() for _ in range(5)])
        if not isinstance(model.observation_space, spaces.Dict)
        else {key: np.stack([model.observation_space.sample()[key] for _ in range(5)]) for key in model.observation_space}
    )
    expected, _ = model.predict(observations, deterministic=True)
    actual, _ = loaded.predict(observations, deterministic=True)
    np.testing.assert_array_equal(actual, expected)
    assert model.action_space.contains(actual[0])
    return model, loaded


@pytest.mark.parametrize("algo_name", ALGOS)
@pytest.mark.parametrize("space", ENVS)
def test_mlp_policy_learns_saves_loads_predicts(algo_name, space, tmp_path, device):
    model, loaded = learn_save_load_predict(algo_name, SafeMlpPolicy, ENVS[space](), tmp_path, device)
    assert isinstance(model.policy.action_dist, EXPECTED_DISTRIBUTION[space])
    assert isinstance(loaded.policy.action_dist, EXPECTED_DISTRIBUTION[space])


@pytest.mark.parametrize("algo_name", ALGOS)
def test_squashed_policy_learns_saves_loads_predicts(algo_name, tmp_path, device):
    env = IdentityEnvBox(low=-2.0, high=3.0, ep_length=20)
    model, loaded = learn_save_load_predict(
        algo_name, SafeMlpPolicy, env, tmp_path, device, squash_output=True, log_std_range=(-5.0, 1.0)
    )
    for policy in (model.policy, loaded.policy):
        assert isinstance(policy.action_dist, SquashedBoundedGaussianDistribution)
        assert policy.squash_output
        assert policy.log_std_range == (-5.0, 1.0)


@pytest.mark.parametrize("algo_name", ALGOS)
def test_cnn_policy_on_images(algo_name, tmp_path):
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    model, _ = learn_save_load_predict(algo_name, SafeCnnPolicy, env, tmp_path, logit_bound=5.0)
    assert isinstance(model.policy, ActorCriticCnnPolicy)
    assert model.policy.action_dist.logit_bound == 5.0


@pytest.mark.parametrize("algo_name", ALGOS)
def test_multi_input_policy_on_dict_observations(algo_name, tmp_path):
    model, _ = learn_save_load_predict(algo_name, SafeMultiInputPolicy, SimpleMultiObsEnv(random_start=False), tmp_path)
    assert isinstance(model.policy, MultiInputActorCriticPolicy)


def test_gsde_std_is_bounded():
    """gSDE keeps SB3's squashing; its std is computed from a clamped log-std."""
    model = PPO(SafeMlpPolicy, "Pendulum-v1", use_sde=True, n_steps=64, batch_size=32, seed=0)
    with th.no_grad():
        model.policy.log_std.fill_(1e30)
    std = model.policy.action_dist.get_std(model.policy.log_std)
    assert bool(th.isfinite(std).all())
    assert std.max().item() <= np.exp(2.0) * (1 + 1e-5)


def test_vanilla_checkpoint_loads_into_safe_policy(tmp_path):
    vanilla = PPO("MlpPolicy", "Pendulum-v1", seed=1)
    safe = PPO(SafeMlpPolicy, "Pendulum-v1", seed=2)
    # SB3's keys by default
    assert not safe.policy.normalize_observations and list(safe.policy.state_dict()) == list(vanilla.policy.state_dict())
    # "auto" adds the statistics of the observations it normalizes
    auto = PPO(SafeMlpPolicy, "Pendulum-v1", seed=2, policy_kwargs=dict(normalize_observations="auto"))
    auto_keys = list(auto.policy.state_dict())
    assert [key for key in auto_keys if not key.startswith("observation_normalizer.")] == list(vanilla.policy.state_dict())
    assert auto.policy.normalize_observations and len(auto_keys) == len(vanilla.policy.state_dict()) + 6
    safe = auto
    vanilla.save(tmp_path / "vanilla.zip")
    safe.set_parameters(str(tmp_path / "vanilla.zip"))
    # Trained on raw observations: loaded without the normalizer "auto" installed
    assert not safe.policy.normalize_observations and list(safe.policy.state_dict()) == list(vanilla.policy.state_dict())
    observations = np.stack([safe.observation_space.sample() for _ in range(8)])
    np.testing.assert_allclose(
        safe.predict(observations, deterministic=True)[0], vanilla.predict(observations, deterministic=True)[0]
    )


def test_log_std_parameter_holding_extremes_gives_std_in_range():
    model = PPO(SafeMlpPolicy, "Pendulum-v1", policy_kwargs=dict(log_std_range=(-3.0, 0.5)))
    observation = th.as_tensor(model.observation_space.sample()[None])
    for extreme in (1e30, -1e30):
        with th.no_grad():
            model.policy.log_std.fill_(extreme)
        std = model.policy.get_distribution(observation).distribution.stddev
        assert np.exp(-3.0) * (1 - 1e-6) <= std.min().item() <= std.max().item() <= np.exp(0.5) * (1 + 1e-6)


def test_log_std_parameter_is_projected_back_into_range_by_training(device):
    """A huge learning rate pushes the log-std against its bounds; the parameter never leaves them."""
    model = A2C(SafeMlpPolicy, "Pendulum-v1", learning_rate=3.0, n_steps=5, seed=0, device=device)
    model.learn(500)
    low, high = model.policy.log_std_range
    log_std = model.policy.log_std.detach()
    assert bool(((log_std >= low) & (log_std <= high)).all())
    assert parameters_finite(model)


class NormalEnv4D(gym.Env):
    """The report's shape: 3-dim observation, 4-dim Box action; reward for large actions drives the log-std."""

    observation_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._steps = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action):
        self._steps += 1
        reward = float(np.abs(action).sum())
        return self.np_random.normal(size=3).astype(np.float32), reward, False, self._steps >= 50, {}


def test_reported_a2c_scale_crash_is_reproduced_and_fixed():
    """SB3 A2C with MlpPolicy raises `Expected parameter scale` at a high learning rate; the safe policy does not."""
    vanilla = A2C("MlpPolicy", NormalEnv4D(), learning_rate=3.0, seed=0)
    with pytest.raises(ValueError, match="Expected parameter scale"):
        vanilla.learn(1000)

    safe = A2C(SafeMlpPolicy, NormalEnv4D(), learning_rate=3.0, seed=0)
    safe.learn(1000)
    assert safe.num_timesteps >= 1000
    assert parameters_finite(safe)


class ForwardEvaluateConsistency(BaseCallback):
    """At each rollout end, recompute log-probs of the stored (squashed) actions as PPO's first epoch will."""

    def __init__(self):
        super().__init__()
        self.max_difference = 0.0
        self.n_saturated = 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        observations = th.as_tensor(buffer.observations.reshape(-1, *buffer.obs_shape))
        actions = th.as_tensor(buffer.actions.reshape(-1, buffer.action_dim))
        with th.no_grad():
            _, log_prob, _ = self.model.policy.evaluate_actions(observations, actions)
        stored = th.as_tensor(buffer.log_probs.reshape(-1))
        self.max_difference = max(self.max_difference, (log_prob - stored).abs().max().item())
        self.n_saturated += int((actions.abs() >= 1.0 - 1e-6).sum())


@pytest.mark.parametrize("use_sde", [False, True])
@pytest.mark.parametrize("algo", [PPO, A2C])
def test_squashed_log_prob_from_stored_action_matches_forward_when_saturated(algo, use_sde):
    """Stock PPO/A2C store only the squashed action; the recomputed log-prob still equals forward's (also gSDE)."""
    model = algo(SafeMlpPolicy, "Pendulum-v1", n_steps=128, seed=0, use_sde=use_sde, policy_kwargs=dict(squash_output=True))
    with th.no_grad():
        # push the mean deep into tanh saturation (|mean| >= 20) with a small std
        model.policy.action_net.bias.fill_(25.0)
        model.policy.log_std.fill_(-4.0)
    callback = ForwardEvaluateConsistency()
    model.learn(256, callback=callback)
    assert callback.n_saturated > 0
    assert callback.max_difference <= 1e-3
    assert parameters_finite(model)


def test_nonfinite_weights_raise_named_error_instead_of_torch_validation(device):
    model = PPO(SafeMlpPolicy, "CartPole-v1", n_steps=32, batch_size=32, device=device)
    with th.no_grad():
        model.policy.action_net.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="policy output logits: 1 NaN, 0 inf of 2"):
        model.policy.predict(np.zeros(4, dtype=np.float32))


@pytest.mark.parametrize(
    "env, policy_kwargs, argument",
    [
        ("Pendulum-v1", dict(log_std_range=(2, -5)), "log_std_range"),
        ("Pendulum-v1", dict(log_std_range=(float("-inf"), 2.0)), "log_std_range"),
        ("CartPole-v1", dict(logit_bound=0.0), "logit_bound"),
        ("CartPole-v1", dict(logit_bound=-2.0), "logit_bound"),
        ("CartPole-v1", dict(squash_output=True), "squash_output"),
    ],
)
def test_invalid_settings_fail_at_construction(env, policy_kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        PPO(SafeMlpPolicy, env, policy_kwargs=policy_kwargs)


def test_squash_output_needs_finite_box_bounds():
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    with pytest.raises(ValueError, match="squash_output"):
        SafeMlpPolicy(unbounded, unbounded, lambda _: 1e-3, squash_output=True)


def test_policy_classes_subclass_their_sb3_counterparts():
    assert issubclass(SafeMlpPolicy, ActorCriticPolicy)
    assert issubclass(SafeCnnPolicy, ActorCriticCnnPolicy)
    assert issubclass(SafeMultiInputPolicy, MultiInputActorCriticPolicy)


def optimizer_foreach(model) -> bool | None:
    return model.policy.optimizer.param_groups[0].get("foreach")


@pytest.mark.parametrize("algo_name", ["ppo", "a2c"])
def test_foreach_optimizer_trains_bit_identically_to_torch_cpu_default(algo_name):
    # sb3-safe's default (foreach) against torch's CPU default (one parameter at a time): same numbers, not close ones
    models = {}
    for foreach in (True, False):
        models[foreach] = ALGOS[algo_name](
            SafeMlpPolicy,
            IdentityEnvBox(ep_length=20),
            seed=0,
            policy_kwargs={} if foreach else torch_default_optimizer(algo_name),
            **SMALL[algo_name],
        ).learn(512)
    assert optimizer_foreach(models[True]) is True
    assert optimizer_foreach(models[False]) is False
    assert models[True].policy.optimizer_kwargs == {**models[False].policy.optimizer_kwargs, "foreach": True}
    with_foreach, with_loop = (model.policy.state_dict() for model in (models[True], models[False]))
    assert all(th.equal(with_foreach[key], with_loop[key]) for key in with_loop)
    moments = [
        th.equal(state_a[key], state_b[key])
        for state_a, state_b in zip(
            models[True].policy.optimizer.state.values(), models[False].policy.optimizer.state.values(), strict=True
        )
        for key in state_a
    ]
    assert moments and all(moments)


def torch_default_optimizer(algo_name: str) -> dict:
    # SB3's default optimizer (PPO: Adam, A2C: RMSprop; A2C replaces optimizer_kwargs unless optimizer_class is
    # given) with torch's CPU default implementation
    if algo_name == "ppo":
        return dict(optimizer_kwargs=dict(eps=1e-5, foreach=False))
    return dict(optimizer_class=th.optim.RMSprop, optimizer_kwargs=dict(alpha=0.99, eps=1e-5, weight_decay=0, foreach=False))


@pytest.mark.parametrize(
    "optimizer_kwargs, expected_foreach",
    [(dict(foreach=False), False), (dict(fused=True), None), (dict(foreach=None), None), (dict(fused=False), True)],
)
def test_users_optimizer_implementation_choice_is_kept(optimizer_kwargs, expected_foreach, tmp_path):
    model = PPO(SafeMlpPolicy, IdentityEnvBox(ep_length=20), seed=0, policy_kwargs=dict(optimizer_kwargs=optimizer_kwargs))
    assert optimizer_foreach(model) is expected_foreach
    assert model.policy.optimizer.param_groups[0]["fused"] is optimizer_kwargs.get("fused")
    model.save(tmp_path / "model.zip")
    assert optimizer_foreach(PPO.load(tmp_path / "model.zip")) is expected_foreach


def test_optimizer_without_foreach_option_is_built_as_given():
    model = PPO(SafeMlpPolicy, IdentityEnvBox(ep_length=20), seed=0, policy_kwargs=dict(optimizer_class=th.optim.LBFGS))
    assert isinstance(model.policy.optimizer, th.optim.LBFGS)
    assert "foreach" not in model.policy.optimizer_kwargs


@pytest.mark.parametrize(
    "env, policy_kwargs, argument",
    [("CartPole-v1", dict(log_std_range=(-5.0, 1.0)), "log_std_range"), ("Pendulum-v1", dict(logit_bound=5.0), "logit_bound")],
)
def test_arguments_without_effect_for_the_action_space_warn(env, policy_kwargs, argument):
    with pytest.warns(UserWarning, match=f"{argument}=.* has no effect"):
        PPO(SafeMlpPolicy, env, policy_kwargs=policy_kwargs)
