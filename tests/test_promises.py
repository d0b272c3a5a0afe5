"""
Promises the library makes, each guarded by a test that fails when the code keeping it breaks.

Each test names its promise; the mutants of the library that it kills (measured by benchmarks/mutation.py, or by
hand for the four survivors of issue 41) are in benchmarks/results/mutation.md.
"""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from sb3_safe import KLAdaptivePPO, NonFiniteGuardCallback
from sb3_safe.common.distributions import DEFAULT_LOGIT_BOUND, SafeMultiCategoricalDistribution, min_action_probability
from sb3_safe.common.guard.locate import ROLLOUT

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
