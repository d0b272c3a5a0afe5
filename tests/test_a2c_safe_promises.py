"""
SafeA2C's promises as a drop-in for SB3's A2C: SB3's defaults and RMSprop settings, the entropy estimate without an
analytical entropy, what the update logs and the mode it runs in, schedules past the end of the budget, and older
checkpoints loading as they were trained.
"""

import inspect
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch as th
from recorders import RecordLearningRate
from rl_zoo3.utils import linear_schedule
from stable_baselines3 import A2C
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from torch import nn

from sb3_safe import NonFiniteGuardCallback, SafeA2C


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard writes its reports, and the tests their checkpoints, to the current directory: keep them out."""
    monkeypatch.chdir(tmp_path)


def rollout_tensors(model: SafeA2C) -> tuple[th.Tensor, th.Tensor]:
    """The (flat) observations and actions of the rollout still in the buffer, one row a step, as ``train()`` reads them."""
    buffer = model.rollout_buffer
    n_rows = buffer.buffer_size * buffer.n_envs
    return th.as_tensor(buffer.observations.reshape(n_rows, -1)), th.as_tensor(buffer.actions.reshape(n_rows, -1))


# ----- drop-in defaults -----


@pytest.mark.parametrize("method", ["learn", "load"])
def test_learn_and_load_default_to_sb3s_settings(method: str) -> None:
    """
    Promise: ``SafeA2C.learn`` and ``SafeA2C.load`` take SB3's arguments with SB3's defaults (logging interval, timestep
    reset, no progress bar, no system info, an environment reset), so swapping the class changes no call's meaning.
    """
    safe = inspect.signature(getattr(SafeA2C, method)).parameters
    stock = inspect.signature(getattr(A2C, method)).parameters
    shared = set(safe) & set(stock) - {"self", "tb_log_name"}  # the run is named after the class
    assert shared == set(stock) - {"self", "tb_log_name"}
    assert {name: safe[name].default for name in shared} == {name: stock[name].default for name in shared}


def test_the_tensorflow_like_rmsprop_has_a2cs_rmsprop_settings() -> None:
    """
    Promise: ``use_rms_prop_tf_like=True`` changes only where RMSprop's epsilon sits: its smoothing constant, epsilon
    and weight decay are those of the RMSprop SB3's A2C builds.
    """
    safe = SafeA2C("MlpPolicy", "CartPole-v1", use_rms_prop_tf_like=True, rms_prop_eps=1e-4, seed=0, device="cpu")
    stock = A2C("MlpPolicy", "CartPole-v1", rms_prop_eps=1e-4, seed=0, device="cpu")
    assert isinstance(safe.policy.optimizer, RMSpropTFLike)
    assert isinstance(stock.policy.optimizer, th.optim.RMSprop)
    settings = ("alpha", "eps", "weight_decay")
    safe_settings = {key: safe.policy.optimizer.defaults[key] for key in settings}
    assert safe_settings == {key: stock.policy.optimizer.defaults[key] for key in settings}


# ----- the update -----


def test_without_an_analytical_entropy_the_entropy_loss_is_the_mean_log_prob() -> None:
    """
    Promise: where the action distribution has no analytical entropy (SB3's squashed gSDE), the entropy is estimated
    as ``-mean(log_prob)``, as SB3's A2C does: the logged entropy loss (minus the entropy) is ``mean(log_prob)``.
    """
    model = SafeA2C(
        ActorCriticPolicy,
        "Pendulum-v1",
        n_steps=16,
        use_sde=True,
        policy_kwargs=dict(squash_output=True),
        seed=0,
        device="cpu",
    )
    model.learn(16)
    # The rollout is still in the buffer: what the next train() computes its loss on
    observations, actions = rollout_tensors(model)
    with th.no_grad():
        _, log_prob, entropy = model.policy.evaluate_actions(observations, actions)
    assert entropy is None
    expected = log_prob.mean().item()
    assert abs(expected) > 1e-2
    model.train()
    assert model.logger.name_to_value["train/entropy_loss"] == pytest.approx(expected, rel=1e-5)


def test_the_update_runs_in_training_mode() -> None:
    """
    Promise: ``train()`` runs the networks in training mode (dropout and batch norm behave as in training), although
    the rollout before it leaves them in evaluation mode.
    """
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=0, device="cpu")
    model.learn(8)
    model.policy.set_training_mode(False)  # as a rollout leaves it
    modes: list[bool] = []
    model.policy.mlp_extractor.register_forward_pre_hook(lambda module, _input: modes.append(module.training))
    model.train()
    assert modes and all(modes)


def test_a_stock_policy_logs_its_log_std_as_it_is() -> None:
    """
    Promise: with SB3's policy (no ``log_std_range``) SafeA2C trains and logs the log-std the policy uses, unclamped.
    """
    model = SafeA2C(ActorCriticPolicy, "Pendulum-v1", n_steps=8, seed=0, device="cpu")
    with th.no_grad():
        model.policy.log_std.fill_(5.0)
    model.learn(8)
    logged = model.logger.name_to_value
    log_std = model.policy.log_std.detach()
    assert log_std.min().item() > 4.0
    assert logged["train/log_std_min"] == pytest.approx(log_std.min().item())
    assert logged["train/log_std_max"] == pytest.approx(log_std.max().item())


def test_a_safe_policy_logs_the_log_std_in_use_whatever_the_parameter_holds() -> None:
    """
    Promise: for the safe policies the logged log-std is the one their distribution uses, clamped to
    ``log_std_range``, also where the parameter is outside it (here written by a hook after the optimizer step).
    """
    model = SafeA2C("MlpPolicy", "Pendulum-v1", n_steps=8, seed=0, device="cpu", policy_kwargs=dict(log_std_range=(-1.0, 0.5)))
    model.learn(8)

    def push_out_of_range(*_: object) -> None:
        with th.no_grad():
            model.policy.log_std.fill_(5.0)

    model.policy.optimizer.register_step_post_hook(push_out_of_range)
    model.train()
    assert model.policy.log_std.min().item() == 5.0
    logged = model.logger.name_to_value
    assert logged["train/log_std_min"] == logged["train/log_std_max"] == 0.5


# ----- schedules past the end of the budget -----


def test_past_the_end_of_the_budget_the_schedules_are_read_at_0_and_nothing_is_named() -> None:
    """
    Promise: SafeA2C reads its schedules at progress 0 where the last rollout ends past the budget (SB3 reads them
    below 0, where a linear schedule is negative) by itself: the guard has nothing to stand in for, and names nothing.
    """
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=linear_schedule(1e-3), seed=0, device="cpu")
    rates: list[float] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The 4th rollout ends 3 steps past the budget
        model.learn(8 * 4 - 3, callback=[NonFiniteGuardCallback(), RecordLearningRate(rates)])
    assert model.num_timesteps == 32
    assert len(rates) == 4 and rates[-1] == 0.0
    assert all(rate >= 0.0 for rate in rates)
    assert [str(w.message) for w in caught if "past the budget" in str(w.message)] == []


# ----- older checkpoints -----


def test_a_checkpoint_from_before_normalize_value_loads_with_sb3s_critic() -> None:
    """
    Promise: a SafeA2C checkpoint saved before ``normalize_value`` existed (no such setting in its data) loads as it
    was trained, with SB3's critic, although the default now turns the normalization on for its environment.
    """
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8, normalize_value=False, seed=0, device="cpu")
    model.learn(8)
    model.save("old.zip")
    with zipfile.ZipFile("old.zip") as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(entries["data"])
    del data["normalize_value"]
    entries["data"] = json.dumps(data).encode()
    with zipfile.ZipFile("old.zip", "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)

    loaded = SafeA2C.load("old.zip", env=model.get_env(), device="cpu")
    assert loaded.normalize_value is False and type(loaded.policy.value_net) is nn.Linear
    observations = th.as_tensor(np.random.default_rng(0).normal(size=(4, 4)), dtype=th.float32)
    with th.no_grad():
        assert th.equal(loaded.policy.predict_values(observations), model.policy.predict_values(observations))
    loaded.learn(8)
