"""The safe recurrent policies (sb3-contrib's RecurrentPPO), the guard with them, and the ppo_lstm zoo configuration."""

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import rl_zoo3
import rl_zoo3.train
import torch as th
import yaml
from faults import NaNAfterOptimizerStep
from gymnasium import spaces
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.policies import (
    RecurrentActorCriticCnnPolicy,
    RecurrentActorCriticPolicy,
    RecurrentMultiInputActorCriticPolicy,
)
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.envs import (
    FakeImageEnv,
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
    SimpleMultiObsEnv,
)
from zoo_entries import assert_policy_default_observations

from sb3_safe import (
    NonFiniteError,
    NonFiniteGuardCallback,
    NonFiniteGuardWarning,
    SafeCnnLstmPolicy,
    SafeMlpLstmPolicy,
    SafeMultiInputLstmPolicy,
)
from sb3_safe.common.distributions import (
    BoundedDiagGaussianDistribution,
    BoundedStateDependentNoiseDistribution,
    SafeBernoulliDistribution,
    SafeCategoricalDistribution,
    SafeMultiCategoricalDistribution,
    SquashedBoundedGaussianDistribution,
)
from sb3_safe.common.policies import SafeDistributionMixin
from sb3_safe.zoo import CONFIG_DIR, PACKAGED_BY_DEFAULT, config_path, train

# Small LSTMs and networks: a fresh dict each time, as SB3 algorithms add keys to ``policy_kwargs``
SMALL = dict(n_steps=32, batch_size=32, n_epochs=2)
ENVS = {
    "box": lambda: IdentityEnvBox(ep_length=20),
    "discrete": lambda: IdentityEnv(4, ep_length=20),
    # one-hot observations: sb3-contrib's LSTM rejects the numpy int size of a MultiDiscrete observation space
    "multidiscrete": lambda: gym.wrappers.FlattenObservation(IdentityEnvMultiDiscrete(3, ep_length=20)),
    "multibinary": lambda: IdentityEnvMultiBinary(3, ep_length=20),
}
EXPECTED_DISTRIBUTION = {
    "box": BoundedDiagGaussianDistribution,
    "discrete": SafeCategoricalDistribution,
    "multidiscrete": SafeMultiCategoricalDistribution,
    "multibinary": SafeBernoulliDistribution,
}
GUARD = {"sb3_safe.NonFiniteGuardCallback": {"on_nonfinite": "rollback"}}
ZOO_DIR = Path(rl_zoo3.__file__).parent / "hyperparams"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a log folder the guard writes its report to the current directory: keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


def tiny(**kwargs: Any) -> dict[str, Any]:
    return dict(lstm_hidden_size=8, net_arch=[16], **kwargs)


def parameters_finite(model: Any) -> bool:
    return all(bool(th.isfinite(parameter).all()) for parameter in model.policy.parameters())


def observations_of(model: Any, n: int = 5) -> Any:
    space = model.observation_space
    if isinstance(space, spaces.Dict):
        samples = [space.sample() for _ in range(n)]
        return {key: np.stack([sample[key] for sample in samples]) for key in space}
    return np.stack([space.sample() for _ in range(n)])


def assert_loaded_predicts_the_same(model: Any, path: Path, device: str = "cpu") -> Any:
    model.save(path)
    loaded = RecurrentPPO.load(path, device=device)
    assert type(loaded.policy) is type(model.policy)
    observations = observations_of(model)
    starts = np.ones(5, dtype=bool)
    expected, expected_state = model.predict(observations, episode_start=starts, deterministic=True)
    actual, actual_state = loaded.predict(observations, episode_start=starts, deterministic=True)
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_allclose(actual_state[0], expected_state[0], rtol=1e-6)
    # and the next step, from the returned LSTM states
    expected, _ = model.predict(observations, state=expected_state, deterministic=True)
    actual, _ = loaded.predict(observations, state=actual_state, deterministic=True)
    np.testing.assert_array_equal(actual, expected)
    return loaded


# ----- RecurrentPPO with the safe policies -----


@pytest.mark.parametrize("space", ENVS)
def test_mlp_lstm_policy_learns_saves_loads_predicts(space: str, tmp_path: Path, device: str):
    model = RecurrentPPO(SafeMlpLstmPolicy, ENVS[space](), seed=0, device=device, policy_kwargs=tiny(), **SMALL)
    # sb3-contrib 2.9's RecurrentPPO cannot train on MultiBinary actions, with its own policy too: its buffer gives
    # them to the distribution as int8, which torch's Bernoulli.log_prob rejects
    model.learn(128 if space != "multibinary" else 0)
    assert parameters_finite(model)
    loaded = assert_loaded_predicts_the_same(model, tmp_path / "model.zip", device)
    for policy in (model.policy, loaded.policy):
        assert isinstance(policy.action_dist, EXPECTED_DISTRIBUTION[space])


def test_log_std_stays_in_range_with_a_huge_learning_rate(device: str):
    """RecurrentActorCriticPolicy.__init__ replaces the optimizer built in _build: the projection holds on the new one."""
    model = RecurrentPPO(
        SafeMlpLstmPolicy, "Pendulum-v1", learning_rate=3.0, seed=0, device=device, policy_kwargs=tiny(), **SMALL
    )
    optimized = {p for group in model.policy.optimizer.param_groups for p in group["params"]}
    assert optimized == set(model.policy.parameters())  # the rebuilt optimizer, with the LSTM weights
    assert model.policy.optimizer.param_groups[0]["foreach"] is True
    model.learn(512)
    low, high = model.policy.log_std_range
    log_std = model.policy.log_std.detach()
    assert bool(((log_std >= low) & (log_std <= high)).all())
    assert parameters_finite(model)
    # any step of the optimizer projects the parameter back
    with th.no_grad():
        model.policy.log_std.fill_(100.0)
    model.policy.optimizer.zero_grad()
    model.policy.log_std.sum().mul(0.0).backward()
    model.policy.optimizer.step()
    assert bool((model.policy.log_std == high).all())


def test_squash_output_without_gsde_rescales_to_the_bounds(tmp_path: Path):
    model = RecurrentPPO(
        SafeMlpLstmPolicy,
        IdentityEnvBox(low=-1.0, high=1.0, ep_length=20),
        seed=0,
        policy_kwargs=tiny(squash_output=True, log_std_range=(-5.0, 1.0)),
        **SMALL,
    )
    model.learn(128)
    assert parameters_finite(model)
    loaded = assert_loaded_predicts_the_same(model, tmp_path / "model.zip")
    for policy in (model.policy, loaded.policy):
        assert isinstance(policy.action_dist, SquashedBoundedGaussianDistribution)
        assert policy.squash_output and policy.log_std_range == (-5.0, 1.0)
    actions = model.rollout_buffer.actions
    assert actions.min() >= -1.0 and actions.max() <= 1.0


def test_squash_output_warns_when_recurrent_ppo_cannot_rescale():
    """RecurrentPPO steps the env with the squashed actions in [-1, 1]: other Box bounds would not be reached."""
    with pytest.warns(UserWarning, match="RescaleAction"):
        RecurrentPPO(SafeMlpLstmPolicy, "Pendulum-v1", policy_kwargs=tiny(squash_output=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RecurrentPPO(SafeMlpLstmPolicy, IdentityEnvBox(low=-1.0, high=1.0), policy_kwargs=tiny(squash_output=True))


@pytest.mark.parametrize("squash_output", [False, True])
def test_gsde_std_is_bounded(squash_output: bool):
    model = RecurrentPPO(
        SafeMlpLstmPolicy,
        IdentityEnvBox(low=-1.0, high=1.0, ep_length=20),
        use_sde=True,
        seed=0,
        policy_kwargs=tiny(squash_output=squash_output, log_std_range=(-3.0, 0.5)),
        **SMALL,
    )
    assert isinstance(model.policy.action_dist, BoundedStateDependentNoiseDistribution)
    assert (model.policy.action_dist.bijector is not None) is squash_output
    model.learn(64)
    with th.no_grad():
        model.policy.log_std.fill_(1e30)
    std = model.policy.action_dist.get_std(model.policy.log_std)
    assert bool(th.isfinite(std).all()) and std.max().item() <= np.exp(0.5) * (1 + 1e-5)
    model.learn(64, reset_num_timesteps=False)
    assert parameters_finite(model)


def test_logit_bound_is_used_and_saved(tmp_path: Path):
    model = RecurrentPPO(SafeMlpLstmPolicy, IdentityEnv(4, ep_length=20), seed=0, policy_kwargs=tiny(logit_bound=2.0), **SMALL)
    assert model.policy.action_dist.logit_bound == 2.0
    with th.no_grad():
        model.policy.action_net.bias.copy_(th.tensor([1e6, -1e6, 0.0, 0.0]))
    # the recurrent signature: (observation, lstm states, episode starts)
    distribution, _ = model.policy.get_distribution(th.tensor([2]), (th.zeros(1, 1, 8), th.zeros(1, 1, 8)), th.ones(1))
    # bounded logits: the least likely action keeps its minimum probability
    assert distribution.distribution.probs.min().item() >= 1.0 / (1.0 + 3.0 * np.exp(4.0)) * (1 - 1e-5)
    loaded = assert_loaded_predicts_the_same(model, tmp_path / "model.zip")
    assert loaded.policy.action_dist.logit_bound == 2.0


@pytest.mark.parametrize(
    "env, weight, output",
    [
        ("Pendulum-v1", "action_net.weight", "policy output mean: 1 NaN, 0 inf of 1"),
        ("CartPole-v1", "action_net.weight", "policy output logits: 1 NaN, 0 inf of 2"),
        ("CartPole-v1", "lstm_actor.weight_hh_l0", "policy output logits: 2 NaN, 0 inf of 2"),
    ],
)
def test_nonfinite_weights_raise_named_error(env: str, weight: str, output: str, device: str):
    model = RecurrentPPO(SafeMlpLstmPolicy, env, device=device, policy_kwargs=tiny(), **SMALL)
    with th.no_grad():
        model.policy.get_parameter(weight).view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match=re.escape(output)):
        model.predict(model.observation_space.sample())


def test_state_dict_keys_equal_the_stock_policys_and_checkpoints_load(tmp_path: Path):
    stock = RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", seed=1)
    safe = RecurrentPPO(SafeMlpLstmPolicy, "Pendulum-v1", seed=2)
    safe_keys = [key for key in safe.policy.state_dict() if not key.startswith("observation_normalizer.")]
    assert list(stock.policy.state_dict()) == safe_keys
    stock.save(tmp_path / "stock.zip")
    safe.set_parameters(str(tmp_path / "stock.zip"))
    assert not safe.policy.normalize_observations
    observations = observations_of(safe, 8)
    np.testing.assert_allclose(
        safe.predict(observations, deterministic=True)[0], stock.predict(observations, deterministic=True)[0], rtol=1e-6
    )


def test_policy_save_load_restores_every_keyword(tmp_path: Path):
    kwargs = dict(
        log_std_range=(-4.0, 1.0),
        squash_output=True,
        lstm_hidden_size=8,
        n_lstm_layers=2,
        shared_lstm=True,
        enable_critic_lstm=False,
        lstm_kwargs=dict(dropout=0.0),
        net_arch=[16],
    )
    model = RecurrentPPO(SafeMlpLstmPolicy, IdentityEnvBox(low=-1.0, high=1.0), policy_kwargs=kwargs, **SMALL)
    saved = model.policy._get_constructor_parameters()
    for key, value in kwargs.items():
        assert saved[key] == value, key
    model.policy.save(str(tmp_path / "policy.pt"))
    loaded = SafeMlpLstmPolicy.load(str(tmp_path / "policy.pt"))
    assert loaded._get_constructor_parameters().keys() == saved.keys()
    for key, value in kwargs.items():
        assert loaded._get_constructor_parameters()[key] == value, key
    assert isinstance(loaded.action_dist, SquashedBoundedGaussianDistribution)
    # the whole model too
    model.learn(32)
    again = RecurrentPPO.load(_saved(model, tmp_path / "model.zip"))
    for key, value in kwargs.items():
        assert again.policy._get_constructor_parameters()[key] == value, key


def _saved(model: Any, path: Path) -> Path:
    model.save(path)
    return path


def test_cnn_lstm_policy_on_images():
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    model = RecurrentPPO(SafeCnnLstmPolicy, env, seed=0, policy_kwargs=dict(lstm_hidden_size=8, logit_bound=4.0), **SMALL)
    model.learn(32)
    assert isinstance(model.policy, RecurrentActorCriticCnnPolicy)
    assert model.policy.action_dist.logit_bound == 4.0 and parameters_finite(model)


def test_multi_input_lstm_policy_on_dict_observations():
    model = RecurrentPPO(
        SafeMultiInputLstmPolicy, SimpleMultiObsEnv(random_start=False), seed=0, policy_kwargs=tiny(), **SMALL
    )
    model.learn(32)
    assert isinstance(model.policy, RecurrentMultiInputActorCriticPolicy) and parameters_finite(model)


@pytest.mark.parametrize(
    "env, policy_kwargs, argument",
    [
        ("Pendulum-v1", dict(log_std_range=(2, -5)), "log_std_range"),
        ("CartPole-v1", dict(logit_bound=0.0), "logit_bound"),
        ("CartPole-v1", dict(squash_output=True), "squash_output"),
    ],
)
def test_invalid_settings_fail_at_construction(env: str, policy_kwargs: dict, argument: str):
    with pytest.raises(ValueError, match=argument):
        RecurrentPPO(SafeMlpLstmPolicy, env, policy_kwargs=policy_kwargs)


def test_policy_classes_subclass_their_sb3_contrib_counterparts():
    assert issubclass(SafeMlpLstmPolicy, RecurrentActorCriticPolicy)
    assert issubclass(SafeCnnLstmPolicy, RecurrentActorCriticCnnPolicy)
    assert issubclass(SafeMultiInputLstmPolicy, RecurrentMultiInputActorCriticPolicy)
    for policy in (SafeMlpLstmPolicy, SafeCnnLstmPolicy, SafeMultiInputLstmPolicy):
        assert issubclass(policy, SafeDistributionMixin)


# ----- the non-finite guard with RecurrentPPO -----


class LstmStatesWatch(BaseCallback):
    """Whether the LSTM states were finite at every rollout start (the ones carried over) and after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.finite_at_rollout_start: list[bool] = []
        self.finite_at_steps = True

    @staticmethod
    def _finite(states: Any) -> bool:
        return all(bool(th.isfinite(tensor).all()) for pair in (states.pi, states.vf) for tensor in pair)

    def _on_rollout_start(self) -> None:
        self.finite_at_rollout_start.append(self._finite(self.model._last_lstm_states))

    def _on_step(self) -> bool:
        self.finite_at_steps = self.finite_at_steps and self._finite(self.locals["lstm_states"])
        return True


@pytest.mark.parametrize("weight", ["lstm_actor.weight_hh_l0", "lstm_critic.weight_ih_l0", "action_net.weight"])
def test_guard_rolls_back_a_nan_weight_and_lstm_states_stay_finite(weight: str):
    model = RecurrentPPO(SafeMlpLstmPolicy, "CartPole-v1", seed=0, policy_kwargs=tiny(), **SMALL)
    corrupt = NaNAfterOptimizerStep(model.policy.optimizer, at=3, weight=model.policy.get_parameter(weight))
    guard, watch = NonFiniteGuardCallback(on_nonfinite="rollback"), LstmStatesWatch()
    with pytest.warns(NonFiniteGuardWarning, match=re.escape(f"policy.{weight}: 1 NaN")):
        model.learn(256, callback=CallbackList([guard, watch]))
    assert [event.action for event in guard.events] == ["rollback"]
    assert guard.stop_reason is None and model.num_timesteps == 256
    assert corrupt.calls > 3  # optimizer steps after the rollback
    assert parameters_finite(model)
    # the rollouts after the rollback start from, and produce, finite LSTM states
    assert len(watch.finite_at_rollout_start) == 8 and all(watch.finite_at_rollout_start)
    assert watch.finite_at_steps
    assert LstmStatesWatch._finite(model._last_lstm_states)


# ----- zoo configuration -----


def test_ppo_lstm_config_is_rl_zoos_with_safe_policies_and_the_guard():
    """
    Every rl-zoo ppo_lstm entry, cited above it, with its values: the policy changes and the guard is added; no entry
    sets normalize_observations (the recurrent policies' default, False: only VecNormalize normalizes, as in the zoo).
    """
    text = config_path("ppo_lstm").read_text()
    ours = yaml.safe_load(text)
    zoo = yaml.safe_load((ZOO_DIR / "ppo_lstm.yml").read_text())
    assert list(ours) == list(zoo)
    citations = re.findall(r'^# zoo: (\w+)\.yml "([^"]+)".*\n(?:#.*\n)*([\w-]+):', text, re.M)
    assert [(zoo_file, zoo_entry) for zoo_file, zoo_entry, _ in citations] == [("ppo_lstm", entry) for entry in zoo]
    assert [entry for _, _, entry in citations] == list(zoo)
    policies = {"MlpPolicy": "sb3_safe.SafeMlpLstmPolicy"}  # the zoo's "default": a policy RecurrentPPO lacks
    for entry in zoo:
        mine, theirs = dict(ours[entry]), dict(zoo[entry])
        assert mine.pop("callback") == [GUARD], entry
        policy = theirs.pop("policy")
        assert mine.pop("policy") == policies.get(policy, f"sb3_safe.Safe{policy}"), entry
        assert_policy_default_observations(mine)
        assert mine == theirs, entry


def test_sb3_safe_train_uses_the_packaged_ppo_lstm_config(tmp_path: Path):
    assert "ppo_lstm" in PACKAGED_BY_DEFAULT and config_path("ppo_lstm") == CONFIG_DIR / "ppo_lstm.yml"
    args = ["--algo", "ppo_lstm", "--env", "CartPole-v1", "-n", "256", "-f", str(tmp_path), "--seed", "0"]
    args += ["--eval-freq", "-1", "--verbose", "0"]
    assert train(args, report=False) is None
    run = tmp_path / "ppo_lstm" / "CartPole-v1_1"
    model = RecurrentPPO.load(run / "CartPole-v1.zip", device="cpu")
    assert type(model.policy) is SafeMlpLstmPolicy and model.num_timesteps == 256
    assert not model.policy.normalize_observations and not hasattr(model.policy, "observation_normalizer")
    saved_args = yaml.load((run / "CartPole-v1" / "args.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert saved_args["conf_file"] == str(config_path("ppo_lstm"))
    # CartPole-v1 has no entry: rl_zoo3 took "default"
    config = yaml.load((run / "CartPole-v1" / "config.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert config["policy"] == "sb3_safe.SafeMlpLstmPolicy" and config["callback"] == [GUARD]


def test_stock_rl_zoo3_train_reads_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    args = ["--algo", "ppo_lstm", "--env", "CartPoleNoVel-v1", "-n", "256", "-f", str(tmp_path), "--seed", "0"]
    args += ["--eval-freq", "-1", "--verbose", "0", "--conf-file", str(config_path("ppo_lstm"))]
    args += ["--hyperparams", "n_envs:1", "policy_kwargs:dict(lstm_hidden_size=8)"]
    monkeypatch.setattr(sys, "argv", ["python -m rl_zoo3.train", *args])
    rl_zoo3.train.train()
    model = RecurrentPPO.load(tmp_path / "ppo_lstm" / "CartPoleNoVel-v1_1" / "CartPoleNoVel-v1.zip", device="cpu")
    assert type(model.policy) is SafeMlpLstmPolicy and model.num_timesteps == 256
    assert model.policy.lstm_output_dim == 8
