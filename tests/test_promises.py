"""
Promises the library makes, each guarded by a test that fails when the code keeping it breaks.

Each test names its promise; the mutants of the library that it kills (measured by benchmarks/mutation.py, or by
hand for the four survivors of issue 41) are in benchmarks/results/mutation.md.
"""

import inspect
import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from sb3_safe import KLAdaptivePPO, NonFiniteGuardCallback, SafeA2C
from sb3_safe.common.distributions import DEFAULT_LOGIT_BOUND, SafeMultiCategoricalDistribution, min_action_probability
from sb3_safe.common.guard.locate import ROLLOUT
from sb3_safe.common.policies import SafeActorCriticPolicy

# ----- safe logits -----


@pytest.mark.parametrize("bound", [DEFAULT_LOGIT_BOUND, 2.0])
def test_every_split_of_a_multicategorical_keeps_the_minimum_probability(bound: float) -> None:
    """
    Promise: every action of every sub-space of a ``SafeMultiCategoricalDistribution`` keeps probability
    >= ``min_action_probability(n, bound)``, as a single safe categorical does, whatever the logits.
    """
    action_dims = [3, 2, 4]
    # One dominant logit per split (the issue's [100, 0, 0]), and one smallest among large ones
    logits = th.tensor(
        [
            [100.0, 0.0, 0.0, 0.0, 100.0, 100.0, 0.0, 0.0, 0.0],
            [-100.0, 100.0, 100.0, -1e6, 1e6, -1e4, 1e4, 1e4, 1e4],
        ]
    )
    dist = SafeMultiCategoricalDistribution(action_dims, bound).proba_distribution(logits)
    assert len(dist.distribution) == len(action_dims)
    for n_actions, split in zip(action_dims, dist.distribution, strict=True):
        # in log-space, relative: the minimum underflows a plain comparison for large bounds
        log_minimum = -math.log1p((n_actions - 1) * math.exp(2 * bound))
        assert split.logits.min().item() >= log_minimum * (1 + 1e-5), n_actions
    # and as the algorithms read it: the log-prob of the least likely joint action
    least_likely = th.stack([split.probs.argmin(dim=1) for split in dist.distribution], dim=1)
    joint_minimum = sum(math.log(min_action_probability(n, bound)) for n in action_dims)
    assert (dist.log_prob(least_likely) >= joint_minimum * (1 + 1e-5)).all()


# ----- KLAdaptivePPO's loss -----


class LowerStoredLogProbs(BaseCallback):
    """Lower every stored log-prob by ``shift`` once the rollout is complete: an old log-prob that diverged."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift

    def _on_rollout_end(self) -> None:
        assert isinstance(self.model, OnPolicyAlgorithm)
        self.model.rollout_buffer.log_probs -= self.shift

    def _on_step(self) -> bool:
        return True


def test_a_diverged_stored_log_prob_leaves_the_loss_finite_and_skips_no_step() -> None:
    """
    Promise (KLAdaptivePPO): ``log_ratio`` is clamped before ``exp``, so even a stored log-prob 100 below the policy's
    (``exp(100)`` overflows float32) gives a finite loss: every optimizer step is taken, and the clamp is reported in
    ``train/log_ratio_clamped_fraction``.
    """
    model = KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu")
    model.learn(64, callback=LowerStoredLogProbs(100.0))
    logged = model.logger.name_to_value
    assert model.skipped_updates == 0 and model.guarded_step.n_taken == 4
    assert math.isfinite(logged["train/loss"]) and math.isfinite(logged["train/policy_gradient_loss"])
    assert logged["train/log_ratio_clamped_fraction"] > 0.5
    assert all(th.isfinite(param).all() for param in model.policy.parameters())


def _rollout_kl_after_one_update(kl_beta: float) -> float:
    """The KL of the whole rollout after one update of the penalty-only variant at a fixed beta."""
    model = KLAdaptivePPO(
        "MlpPolicy",
        "CartPole-v1",
        learning_rate=3e-3,
        n_steps=128,
        batch_size=32,
        n_epochs=8,
        clip_range=None,  # penalty only: the clipped surrogate would also keep the policy near the old one
        initial_kl_beta=kl_beta,
        kl_beta_bounds=(kl_beta, kl_beta),
        seed=0,
        device="cpu",
    )
    model.learn(128)
    return model.logger.name_to_value["train/kl"]


def test_the_kl_penalty_pulls_the_policy_toward_the_old_one() -> None:
    """
    Promise (KLAdaptivePPO): ``beta * mean KL(pi_old || pi)`` is a term of the loss whose gradient pulls the policy
    back toward the policy that collected the rollout: the same update moves the policy far less at a large beta.
    """
    weak, strong = _rollout_kl_after_one_update(1e-4), _rollout_kl_after_one_update(100.0)
    assert weak > 1e-3  # the update does move the policy
    assert strong < weak / 100, (strong, weak)


# ----- the guard's end-of-rollout check -----


class HugeRewardsEnv(gym.Env):
    """Rewards of 3e38 (finite, as every step check sees them) from global step ``from_step`` on: returns overflow."""

    def __init__(self, from_step: int) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.from_step = from_step
        self.n_steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int):
        reward = 3e38 if self.n_steps >= self.from_step else 1.0
        self.n_steps += 1
        return np.full(2, 0.5, np.float32), reward, False, False, {}


def test_a_nonfinite_return_is_named_as_rollout_data_and_stops_in_rollback_mode() -> None:
    """
    Promise (NonFiniteGuardCallback): returns and advantages that overflow from finite rewards are found at the end of
    the rollout, before ``train()`` reads them, named as the rollout buffer's, and stop training in ``"rollback"``
    mode (collected data cannot be rolled back), with the model at its last healthy state.
    """
    n_steps = 32
    model = PPO("MlpPolicy", HugeRewardsEnv(from_step=n_steps + 8), n_steps=n_steps, batch_size=n_steps, n_epochs=1, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    model.learn(4 * n_steps, callback=guard)
    assert [(event.source, event.action) for event in guard.events] == [(ROLLOUT, "stop")] and guard.n_rollbacks == 0
    event = guard.events[0]
    names = {bad.name for bad in event.nonfinite}
    assert {"rollout buffer returns", "rollout buffer advantages"} <= names
    assert "rollout buffer returns" in event.message and "data already collected cannot be rolled back" in event.message
    assert guard.stop_reason == event.message
    # stopped before the second update (at the next env step): the first one is the healthy state kept
    assert model._n_updates == 1 and model.num_timesteps < 3 * n_steps
    assert all(th.isfinite(param).all() for param in model.policy.parameters())


# ----- drop-in replacements -----


@pytest.mark.parametrize(("safe_class", "stock_class"), [(KLAdaptivePPO, PPO), (SafeA2C, A2C)])
def test_the_safe_algorithms_default_to_sb3s_settings(safe_class: type, stock_class: type) -> None:
    """
    Promise: ``KLAdaptivePPO`` and ``SafeA2C`` are drop-in replacements: every argument they share with SB3's PPO / A2C
    has SB3's default (a user who swaps the class keeps rl-zoo's and SB3's tuning).
    """
    safe = inspect.signature(safe_class.__init__).parameters
    stock = inspect.signature(stock_class.__init__).parameters
    shared = set(safe) & set(stock) - {"self", "policy", "env"}
    assert len(shared) > 15
    assert {name: safe[name].default for name in shared} == {name: stock[name].default for name in shared}


def _early_stops(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Early stopping")]


def _assert_same_training(models: list, logs: list[dict], keys: tuple[str, ...], rtol: float, atol: float) -> None:
    """The stock and the safe model (in that order) hold the same parameters and logged the same ``keys``."""
    stock, safe = models
    for (name, stock_parameter), safe_parameter in zip(stock.policy.named_parameters(), safe.policy.parameters(), strict=True):
        th.testing.assert_close(safe_parameter, stock_parameter, rtol=rtol, atol=atol, msg=name)
    for key in keys:
        assert logs[1][key] == pytest.approx(logs[0][key], rel=1e-4, abs=1e-6), key


def test_kl_adaptive_ppo_at_a_negligible_beta_takes_ppos_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """
    Promise: KLAdaptivePPO's loss is PPO's clipped surrogate (ratio ``exp(log_prob - old_log_prob)``, clipped to
    ``[1 - eps, 1 + eps]``) plus the KL penalty, with SB3's entropy and value terms and early stopping: at a negligible
    beta, with SB3's critic (``normalize_value=False``), it takes the steps of SB3's PPO with the same policy, seed and
    (default) settings.
    """
    models, logs, steps = [], [], []
    negligible_beta = dict(initial_kl_beta=1e-30, kl_beta_bounds=(1e-30, 1e-30), normalize_value=False)
    for algo, kwargs in ((PPO, {}), (KLAdaptivePPO, negligible_beta)):
        # Built just before it learns: the seed is global, a second construction would reseed the first one's rollout
        model = algo(
            SafeActorCriticPolicy,
            "Pendulum-v1",
            n_steps=128,
            batch_size=64,
            ent_coef=0.01,
            target_kl=0.002,
            seed=3,
            device="cpu",
            verbose=1,
            **kwargs,
        )
        # One update phase: later ones would compare rollouts that rounding (1e-10 here) has made differ
        model.learn(128)
        models.append(model)
        logs.append(dict(model.logger.name_to_value))
        steps.append(_early_stops(capsys.readouterr().out))
    keys = ("train/entropy_loss", "train/policy_gradient_loss", "train/value_loss", "train/clip_fraction")
    _assert_same_training(models, logs, keys, rtol=1e-5, atol=1e-7)
    # verbose=1 says where the KL stopped the epochs, as SB3's PPO does
    assert steps[0] and steps[1] == steps[0]


def test_safe_a2c_takes_a2cs_steps() -> None:
    """
    Promise: SafeA2C's loss is A2C's (policy gradient, the entropy of the action distribution, the value loss; SB3's
    default settings): with SB3's critic (``normalize_value=False``) and raw observations (the drop-in policy's
    default), the same policy and seed it takes A2C's steps where nothing is non-finite.
    """
    models, logs = [], []
    raw = dict(normalize_value=False, policy_kwargs=dict(normalize_observations=False))
    for algo, kwargs in ((A2C, {}), (SafeA2C, raw)):
        model = algo(SafeActorCriticPolicy, "Pendulum-v1", ent_coef=0.01, seed=3, device="cpu", **kwargs)
        model.learn(50)
        models.append(model)
        logs.append(dict(model.logger.name_to_value))
    _assert_same_training(models, logs, ("train/entropy_loss", "train/policy_loss", "train/value_loss"), rtol=1e-4, atol=1e-5)
