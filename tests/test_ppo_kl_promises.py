"""
KLAdaptivePPO's promises as a drop-in for SB3's PPO: SB3's and the documented defaults, settings refused where they
cannot work, the KL rollout buffer, the update's losses, clip fraction and early stopping as SB3's PPO computes them,
the modes it runs in, and the rollout KL that adapts beta (the exact mean of the analytic KL, or the sampled
estimate for a distribution without one).
"""

import ast
import copy
import inspect
import math
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.distributions import CategoricalDistribution, Distribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.utils import ConstantSchedule
from torch import nn

from sb3_safe import KLAdaptivePPO, SafeActorCriticPolicy
from sb3_safe.common.buffers import KLRolloutBuffer

DOCS = Path(__file__).parents[1] / "docs" / "guide" / "kl_ppo.md"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests write their checkpoints to the current directory: keep them out of the checkout."""
    monkeypatch.chdir(tmp_path)


def rollout_tensors(model: PPO) -> dict[str, th.Tensor]:
    """
    The rollout still in the buffer, one row a step: observations and actions as ``train()`` reads them, returns,
    old values, old log-probabilities and advantages in float64.
    """
    buffer = model.rollout_buffer
    rows = buffer.buffer_size * buffer.n_envs
    columns = {"returns": buffer.returns, "old_values": buffer.values, "old_log_prob": buffer.log_probs}
    columns["advantages"] = buffer.advantages
    tensors = {name: th.as_tensor(array.reshape(rows), dtype=th.float64) for name, array in columns.items()}
    tensors["observations"] = th.as_tensor(buffer.observations.reshape(rows, -1))
    tensors["actions"] = th.as_tensor(buffer.actions.reshape(rows)).long()
    return tensors


def zero_action_net(model: PPO) -> None:
    """A uniform categorical whatever the observation: log-probabilities exact in every pass, so each first ratio is 1."""
    with th.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.zero_()


def record_modes(model: PPO) -> list[tuple[bool, bool]]:
    """(training mode, gradients enabled) of every forward pass of the policy's action head from now on."""
    modes: list[tuple[bool, bool]] = []
    model.policy.action_net.register_forward_pre_hook(
        lambda module, _input: modes.append((module.training, th.is_grad_enabled()))
    )
    return modes


def halfway_between_the_middle_two(values: th.Tensor) -> float:
    """The value halfway between the two middle ones of an even number of (distinct) values."""
    middle = values.sort().values[len(values) // 2 - 1 : len(values) // 2 + 1]
    assert middle[1] > middle[0]
    return middle.mean().item()


def record_steps(model: PPO) -> list[int]:
    """One entry for every step the policy's optimizer takes from now on."""
    steps: list[int] = []
    model.policy.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    return steps


# ----- drop-in defaults, documented defaults, refused settings -----


@pytest.mark.parametrize("method", ["learn", "load"])
def test_learn_and_load_default_to_sb3s_settings(method: str) -> None:
    """
    Promise: ``KLAdaptivePPO.learn`` and ``KLAdaptivePPO.load`` take SB3's arguments with SB3's defaults (logging
    interval, timestep reset, no progress bar, no system info, an environment reset), so swapping the class changes
    no call's meaning.
    """
    safe = inspect.signature(getattr(KLAdaptivePPO, method)).parameters
    stock = inspect.signature(getattr(PPO, method)).parameters
    shared = set(safe) & set(stock) - {"self", "tb_log_name"}  # the run is named after the class
    assert shared == set(stock) - {"self", "tb_log_name"}
    assert {name: safe[name].default for name in shared} == {name: stock[name].default for name in shared}


def documented_defaults() -> dict[str, Any]:
    """The defaults of the arguments table in docs/guide/kl_ppo.md, by argument name."""
    defaults: dict[str, Any] = {}
    for line in DOCS.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`(\w+)`", cells[0])
        values = [ast.literal_eval(value) for value in re.findall(r"`([^`]+)`", cells[1])]
        defaults.update(zip(names, values, strict=True))
    return defaults


def test_the_kl_settings_default_to_the_documented_values() -> None:
    """
    Promise (docs/guide/kl_ppo.md): the defaults are those documented, the PPO paper's d_targ 0.01 and its
    tolerance 1.5 and factor 2 among them.
    """
    documented = documented_defaults()
    assert {"adaptive_kl_target", "kl_adapt_tolerance", "kl_adapt_factor", "kl_beta_bounds"} <= set(documented)
    parameters = inspect.signature(KLAdaptivePPO.__init__).parameters
    assert {name: parameters[name].default for name in documented} == documented
    assert (documented["adaptive_kl_target"], documented["kl_adapt_tolerance"], documented["kl_adapt_factor"]) == (
        0.01,
        1.5,
        2.0,
    )


@pytest.mark.parametrize(
    ("setting", "name"),
    [
        ({"kl_beta_bounds": (1e-4, math.inf)}, "kl_beta_bounds"),
        ({"adaptive_kl_target": math.inf}, "adaptive_kl_target"),
        ({"kl_adapt_tolerance": math.inf}, "kl_adapt_tolerance"),
        ({"kl_adapt_factor": math.inf}, "kl_adapt_factor"),
        ({"kl_adapt_factor": 1.0}, "kl_adapt_factor"),
        ({"kl_adapt_factor": 0.5}, "kl_adapt_factor"),
    ],
)
def test_an_infinite_bound_or_a_factor_not_above_1_is_refused_naming_it(setting: dict[str, Any], name: str) -> None:
    """
    Promise: the penalty's settings are positive and finite (the highest beta too), the factor above 1 (at 1 beta
    never adapts, below 1 it runs the wrong way): any other is refused with a ValueError naming the argument.
    """
    with pytest.raises(ValueError, match=name):
        KLAdaptivePPO("MlpPolicy", "CartPole-v1", device="cpu", **setting)


# ----- the KL rollout buffer -----


class TaggedBuffer(KLRolloutBuffer):
    """A user's KLRolloutBuffer subclass."""


@pytest.mark.parametrize("buffer_class", [KLRolloutBuffer, TaggedBuffer])
def test_a_kl_rollout_buffer_class_given_is_the_one_used(buffer_class: type[KLRolloutBuffer]) -> None:
    """
    Promise: ``rollout_buffer_class`` accepts KLRolloutBuffer and its subclasses (named or the default one) and
    the model collects its rollouts in that class, keeping the old distribution parameters.
    """
    model = KLAdaptivePPO(
        "MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, rollout_buffer_class=buffer_class, device="cpu"
    )
    model.learn(16)
    assert type(model.rollout_buffer) is buffer_class
    assert model.rollout_buffer.old_dist_params.shape[-1] == 2  # CartPole's two log-probabilities


def test_stock_ppo_continues_a_checkpoint_with_its_own_buffer_and_a_chosen_buffer_is_kept() -> None:
    """
    Promise: ``PPO.load("kl_ppo.zip")`` trains on as PPO with SB3's own buffer (the default KL buffer is not saved),
    while a KLRolloutBuffer subclass the user chose is saved and ``KLAdaptivePPO.load`` collects in it again.
    """
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, device="cpu")
    model.learn(16)
    model.save("default.zip")
    stock = PPO.load("default.zip", env=model.get_env(), device="cpu")
    assert type(stock.rollout_buffer) is RolloutBuffer
    stock.learn(16)
    assert type(KLAdaptivePPO.load("default.zip", device="cpu").rollout_buffer) is KLRolloutBuffer

    chosen = KLAdaptivePPO(
        "MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, rollout_buffer_class=TaggedBuffer, device="cpu"
    )
    chosen.save("chosen.zip")
    assert type(KLAdaptivePPO.load("chosen.zip", device="cpu").rollout_buffer) is TaggedBuffer


# ----- the update -----


def test_the_update_runs_in_training_mode_with_gradients() -> None:
    """
    Promise: ``train()`` runs the networks in training mode (dropout and batch norm behave as in training), although
    the rollout before it leaves them in evaluation mode.
    """
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=8, n_epochs=2, device="cpu")
    model.learn(16)
    model.policy.set_training_mode(False)  # as a rollout leaves it
    modes = record_modes(model)
    model.train()
    with_gradients = [training for training, grad in modes if grad]
    assert len(with_gradients) == 4 and all(with_gradients)  # 2 epochs of 2 minibatches


def test_the_logged_losses_are_ppos_clipped_formulas_on_the_minibatch() -> None:
    """
    Promise: the update's loss is PPO's (the surrogate with the ratio clipped to ``[1 - eps, 1 + eps]``, the value
    prediction clipped to ``clip_range_vf`` around the old value) plus ``beta`` times the mean KL, and it logs SB3's
    statistics of it (``train/approx_kl``: SB3's ``mean((ratio - 1) - log ratio)``, the clip fraction, the
    clip ranges): here one minibatch, computed by hand on the rollout with the policy before the update.
    """
    n_steps = 256
    model = KLAdaptivePPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=n_steps,
        batch_size=n_steps,
        n_epochs=1,
        learning_rate=0.01,
        clip_range_vf=0.2,
        normalize_value=False,
        seed=0,
        device="cpu",
    )
    model.learn(n_steps)  # a first update on this rollout: the policy no longer is the one that collected it
    data = rollout_tensors(model)
    with th.no_grad():
        values, log_prob, entropy = model.policy.evaluate_actions(data["observations"], data["actions"])
        new_log_probs = model.policy.get_distribution(data["observations"]).distribution.logits.double()
    values, log_prob, entropy = values.double().flatten(), log_prob.double(), entropy.double()
    log_ratio = log_prob - data["old_log_prob"]
    ratio = log_ratio.exp()
    # the clip ranges halfway between the middle moves: half of the ratios and of the values are clipped, none near the edge
    clip_range, clip_range_vf = (
        halfway_between_the_middle_two((ratio - 1).abs()),
        halfway_between_the_middle_two((values - data["old_values"]).abs()),
    )
    model.clip_range, model.clip_range_vf = ConstantSchedule(clip_range), ConstantSchedule(clip_range_vf)

    centered = data["advantages"] - data["advantages"].mean()
    advantages = centered / (centered.std() + 1e-8)
    assert ((advantages < 0) & (ratio < 1 - clip_range)).any()  # where the lower clip matters
    surrogate = th.min(advantages * ratio, advantages * ratio.clamp(1 - clip_range, 1 + clip_range))
    policy_loss = -surrogate.mean().item()
    predicted = data["old_values"] + (values - data["old_values"]).clamp(-clip_range_vf, clip_range_vf)
    value_loss = (data["returns"] - predicted).square().mean().item()
    old_log_probs = th.as_tensor(model.rollout_buffer.old_dist_params.reshape(n_steps, -1), dtype=th.float64)
    kl_penalty = model.kl_beta * (old_log_probs.exp() * (old_log_probs - new_log_probs)).sum(dim=1).mean().item()
    entropy_loss = -entropy.mean().item()
    expected = {
        "train/policy_gradient_loss": policy_loss,
        "train/value_loss": value_loss,
        "train/kl_penalty": kl_penalty,
        "train/entropy_loss": entropy_loss,
        "train/approx_kl": ((ratio - 1) - log_ratio).mean().item(),
        "train/clip_fraction": ((ratio - 1).abs() > clip_range).double().mean().item(),
        "train/loss": policy_loss + kl_penalty + 0.5 * value_loss,
        "train/clip_range": clip_range,
        "train/clip_range_vf": clip_range_vf,
    }

    model.train()
    logged = {key: model.logger.name_to_value[key] for key in expected}
    assert logged == pytest.approx(expected, rel=1e-4, abs=1e-6)


def stock_and_safe_with_exact_first_ratios(**settings: Any) -> list[PPO]:
    """
    Stock PPO and KLAdaptivePPO (SB3's critic) on CartPole-v1, 64 steps per rollout, ``settings`` added, their action
    nets zeroed: every log-probability is exact, so each update's first ratios are exactly 1.
    """
    models = []
    for algo, kwargs in ((PPO, {}), (KLAdaptivePPO, dict(normalize_value=False))):
        model = algo(SafeActorCriticPolicy, "CartPole-v1", n_steps=64, seed=0, device="cpu", **settings, **kwargs)
        zero_action_net(model)
        models.append(model)
    return models


def test_a_ratio_on_the_clip_edge_is_not_counted_as_clipped() -> None:
    """
    Promise: ``train/clip_fraction`` counts the ratios strictly outside ``[1 - eps, 1 + eps]``, as SB3's PPO: at
    ``clip_range=0`` the first minibatch's ratios, all exactly 1 (a policy whose log-probabilities are exact), lie on
    the edge and none is clipped; and without ``clip_range_vf`` no value clip range is logged, as in SB3.
    """
    logs = []
    for model in stock_and_safe_with_exact_first_ratios(batch_size=64, n_epochs=1, clip_range=0.0):
        model.learn(64)
        logs.append(dict(model.logger.name_to_value))
    assert logs[1]["train/clip_fraction"] == logs[0]["train/clip_fraction"] == 0.0
    assert "train/clip_range_vf" not in logs[0] and "train/clip_range_vf" not in logs[1]


def test_target_kl_stops_the_update_at_the_first_minibatch_above_1_5_times_it(capsys: pytest.CaptureFixture[str]) -> None:
    """
    Promise: SB3's early stopping: a minibatch whose approximate KL is above ``1.5 * target_kl`` ends the update
    before its step, and no further minibatch or epoch runs; a KL exactly at it (here 0, at ``target_kl=0``: the
    first minibatch's ratios are all exactly 1) does not stop it. ``verbose=0`` prints nothing.
    """
    counts = []
    for model in stock_and_safe_with_exact_first_ratios(batch_size=8, n_epochs=4, learning_rate=0.01, target_kl=0.0):
        modes = record_modes(model)
        steps = record_steps(model)
        model.learn(64)
        minibatches = sum(grad for _, grad in modes)  # the update's passes (the rollout's and the KL's have none)
        counts.append((minibatches, len(steps), model._n_updates))
    # the first minibatch (KL 0) steps, the second (KL > 0) stops the update: one epoch counted
    assert counts[1] == counts[0] == (2, 1, 1)
    assert capsys.readouterr().out == ""


# ----- the rollout KL that adapts beta -----


class DropoutExtractor(BaseFeaturesExtractor):
    """The flattened observation through dropout: a policy whose outputs differ between training and evaluation."""

    def __init__(self, observation_space: gym.Space) -> None:
        super().__init__(observation_space, get_flattened_obs_dim(observation_space))
        self.dropout = nn.Dropout(0.5)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.dropout(th.flatten(observations, start_dim=1))


def test_the_rollout_kl_is_measured_in_evaluation_mode_without_autograd() -> None:
    """
    Promise: the KL that adapts beta compares the old policy with the new one as the rollouts act with it (evaluation
    mode: a policy with dropout that did not change measures 0), in a pass that builds no autograd graph.
    """
    model = KLAdaptivePPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=64,
        batch_size=32,
        n_epochs=1,
        learning_rate=0.0,  # the update leaves the policy as it collected the rollout
        policy_kwargs=dict(features_extractor_class=DropoutExtractor, ortho_init=False),
        seed=0,
        device="cpu",
    )
    model.learn(64)
    modes = record_modes(model)
    model.train()
    assert model.logger.name_to_value["train/kl"] == pytest.approx(0.0, abs=1e-6)  # rounding: batches of other sizes
    measuring = [grad for training, grad in modes if not training]
    assert measuring and not any(measuring)


def test_the_rollout_kl_is_the_exact_mean_of_the_analytic_kl_over_the_rollout() -> None:
    """
    Promise: ``train/kl``, the KL that adapts beta, is the mean of the analytic ``KL(pi_old || pi)`` over every
    sample of the rollout (also one measured in several batches, not a mean of the batches' means): here computed
    by hand from a copy of the policy that collected it.
    """
    n_steps = 1100  # two measuring batches of unequal sizes
    model = KLAdaptivePPO(
        "MlpPolicy", "CartPole-v1", n_steps=n_steps, batch_size=100, n_epochs=2, learning_rate=3e-3, seed=0, device="cpu"
    )
    old_policy = copy.deepcopy(model.policy)
    model.learn(n_steps)
    observations = rollout_tensors(model)["observations"]
    with th.no_grad():
        old, new = (
            policy.get_distribution(observations).distribution.logits.double() for policy in (old_policy, model.policy)
        )
    expected = (old.exp() * (old - new)).sum(dim=1).mean().item()
    assert expected > 1e-4
    assert model.logger.name_to_value["train/kl"] == pytest.approx(expected, rel=1e-4)


class UnlistedCategorical(Distribution):
    """SB3's categorical under a class of its own: a custom distribution, one without an analytic KL in sb3-safe."""

    def __init__(self, action_dim: int) -> None:
        super().__init__()
        self.action_dim = action_dim

    proba_distribution_net = CategoricalDistribution.proba_distribution_net
    proba_distribution = CategoricalDistribution.proba_distribution
    log_prob = CategoricalDistribution.log_prob
    entropy = CategoricalDistribution.entropy
    sample = CategoricalDistribution.sample
    mode = CategoricalDistribution.mode
    actions_from_params = CategoricalDistribution.actions_from_params
    log_prob_from_params = CategoricalDistribution.log_prob_from_params


class UnlistedPolicy(ActorCriticPolicy):
    """SB3's policy for a discrete action space, acting with :class:`UnlistedCategorical`."""

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        self.action_dist = UnlistedCategorical(int(self.action_space.n))

    def _get_action_dist_from_latent(self, latent_pi: th.Tensor) -> Distribution:
        return self.action_dist.proba_distribution(action_logits=self.action_net(latent_pi))


def test_without_an_analytic_kl_the_rollout_kl_is_the_mean_sampled_estimate() -> None:
    """
    Promise: for a distribution without an analytic KL (a custom one) the KL that adapts beta is the mean over the
    rollout of the estimator ``(ratio - 1) - log(ratio)`` at the stored actions, ``ratio = pi(a|s) / pi_old(a|s)``.
    """
    n_steps = 63
    model = KLAdaptivePPO(
        UnlistedPolicy,
        "CartPole-v1",
        n_steps=n_steps,
        batch_size=21,
        n_epochs=2,
        learning_rate=3e-3,
        normalize_value=False,
        seed=0,
        device="cpu",
    )
    model.learn(n_steps)
    assert model.rollout_buffer.old_dist_params.shape[-1] == 0
    data = rollout_tensors(model)
    model.policy.set_training_mode(False)
    with th.no_grad():
        _, log_prob, _ = model.policy.evaluate_actions(data["observations"], data["actions"])
    log_ratio = log_prob.double() - data["old_log_prob"]
    expected = (th.expm1(log_ratio) - log_ratio).mean().item()
    assert expected > 1e-5
    assert model.logger.name_to_value["train/kl"] == pytest.approx(expected, rel=1e-4)
    assert np.isfinite(model.kl_beta)
