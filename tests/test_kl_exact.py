"""
The KL that ``KLAdaptiveLRCallback`` measures is the exact KL(pi_old || pi_new) of the update, for every family.

Each case learns one update with a learning rate large enough that the KL is clearly nonzero, keeping a copy of the
policy and of the rollout's observations (masks, LSTM states) as they were before ``train()``. The callback's measured
KL of that update is then compared with Monte Carlo estimates of the true KL on the same observations, from 100,000
actions drawn from the old policy, spread evenly over the rollout's observations: the mean of
``log pi_old(a) - log pi_new(a)`` at them, and the same with a control variate. They must agree within 3 standard
errors.
"""

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import Distribution, StateDependentNoiseDistribution
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import obs_as_tensor

from sb3_safe import (
    KLAdaptiveLRCallback,
    KLAdaptivePPO,
    SafeMaskableMlpPolicy,
    SafeMlpLstmPolicy,
    SafeMlpPolicy,
)
from sb3_safe.common.distributions import BoundedStateDependentNoiseDistribution

#: Actions drawn from the old policy, in total over the rollout's observations
N_SAMPLES = 100_000
#: Observations per rollout
N_STEPS, N_ENVS = 128, 2
#: float32 rounding only, added to the statistical tolerance: log-probabilities of magnitude up to ~10 are rounded by up
#: to ~1e-6 each, in the Monte Carlo's log-ratios and in the analytic KL's terms (the smallest standard error here is
#: ~2e-6, the KLs 6e-4 to 0.13)
ROUNDING = 1e-6

SMALL_NET = dict(net_arch=[32, 32])
# one update of 8 epochs over the rollout at a rate that moves the policy visibly (measured KL 1e-3 to 0.1)
PPO_ARGS = dict(n_steps=N_STEPS, batch_size=64, n_epochs=8, learning_rate=3e-3, seed=0, device="cpu")


def _vec(env_id: str | Callable[[], gym.Env]) -> Any:
    return make_vec_env(env_id, n_envs=N_ENVS, seed=0)


def _masked(env: Callable[[], gym.Env]) -> Any:
    np.random.seed(0)  # sb3-contrib's masking envs draw their invalid actions from numpy's global generator
    return _vec(env)


CASES: dict[str, Callable[[], BaseAlgorithm]] = {
    "gaussian": lambda: PPO("MlpPolicy", _vec("Pendulum-v1"), policy_kwargs=SMALL_NET, **PPO_ARGS),
    "bounded-gaussian": lambda: PPO(SafeMlpPolicy, _vec("Pendulum-v1"), policy_kwargs=SMALL_NET, **PPO_ARGS),
    "squashed-gaussian": lambda: PPO(
        SafeMlpPolicy, _vec("Pendulum-v1"), policy_kwargs=dict(squash_output=True, **SMALL_NET), **PPO_ARGS
    ),
    "gsde": lambda: PPO("MlpPolicy", _vec("Pendulum-v1"), use_sde=True, policy_kwargs=SMALL_NET, **PPO_ARGS),
    "gsde-squashed": lambda: PPO(
        "MlpPolicy", _vec("Pendulum-v1"), use_sde=True, policy_kwargs=dict(squash_output=True, **SMALL_NET), **PPO_ARGS
    ),
    "bounded-gsde": lambda: PPO(SafeMlpPolicy, _vec("Pendulum-v1"), use_sde=True, policy_kwargs=SMALL_NET, **PPO_ARGS),
    "bounded-gsde-squashed": lambda: PPO(
        SafeMlpPolicy,
        _vec("Pendulum-v1"),
        use_sde=True,
        policy_kwargs=dict(squash_output=True, **SMALL_NET),
        **PPO_ARGS,
    ),
    # KLAdaptivePPO's buffer keeps the old parameters of the acting pass; A2C's update is measured on its train batch
    "kl-ppo-gsde": lambda: KLAdaptivePPO("MlpPolicy", _vec("Pendulum-v1"), use_sde=True, policy_kwargs=SMALL_NET, **PPO_ARGS),
    "a2c-gsde": lambda: A2C(
        "MlpPolicy", _vec("Pendulum-v1"), n_steps=N_STEPS, learning_rate=3e-2, use_sde=True, seed=0, device="cpu"
    ),
    "categorical": lambda: PPO("MlpPolicy", _vec("CartPole-v1"), policy_kwargs=SMALL_NET, **PPO_ARGS),
    "safe-categorical": lambda: PPO(SafeMlpPolicy, _vec("CartPole-v1"), policy_kwargs=SMALL_NET, **PPO_ARGS),
    "multicategorical": lambda: PPO(
        "MlpPolicy", _vec(lambda: IdentityEnvMultiDiscrete(3)), policy_kwargs=SMALL_NET, **PPO_ARGS
    ),
    "bernoulli": lambda: PPO("MlpPolicy", _vec(lambda: IdentityEnvMultiBinary(3)), policy_kwargs=SMALL_NET, **PPO_ARGS),
    "masked": lambda: MaskablePPO(
        "MlpPolicy", _masked(lambda: InvalidActionEnvDiscrete(dim=8, n_invalid_actions=4)), **PPO_ARGS
    ),
    "safe-masked": lambda: MaskablePPO(
        SafeMaskableMlpPolicy, _masked(lambda: InvalidActionEnvDiscrete(dim=8, n_invalid_actions=4)), **PPO_ARGS
    ),
    "masked-multicategorical": lambda: MaskablePPO(
        "MlpPolicy", _masked(lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2)), **PPO_ARGS
    ),
    "safe-masked-multicategorical": lambda: MaskablePPO(
        SafeMaskableMlpPolicy,
        _masked(lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2)),
        **PPO_ARGS,
    ),
    "masked-bernoulli": lambda: MaskablePPO(
        "MlpPolicy", _masked(lambda: InvalidActionEnvMultiBinary(dims=3, n_invalid_actions=1)), **PPO_ARGS
    ),
    "recurrent-gaussian": lambda: RecurrentPPO(
        "MlpLstmPolicy", _vec("Pendulum-v1"), policy_kwargs=dict(lstm_hidden_size=16, **SMALL_NET), **PPO_ARGS
    ),
    "recurrent-categorical": lambda: RecurrentPPO(
        "MlpLstmPolicy", _vec("CartPole-v1"), policy_kwargs=dict(lstm_hidden_size=16, **SMALL_NET), **PPO_ARGS
    ),
    "safe-recurrent-categorical": lambda: RecurrentPPO(
        SafeMlpLstmPolicy, _vec("CartPole-v1"), policy_kwargs=dict(lstm_hidden_size=16, **SMALL_NET), **PPO_ARGS
    ),
}


@dataclass
class OldPolicy:
    """The policy as it collected the rollout, with what its distribution on each collected step needs."""

    policy: ActorCriticPolicy
    observations: np.ndarray
    action_masks: np.ndarray | None
    #: the actor's (hidden, cell) states before each step, ``(n_layers, n, hidden)``, and the episode starts
    lstm_states: tuple[np.ndarray, np.ndarray] | None
    episode_starts: np.ndarray | None


def copy_of(policy: ActorCriticPolicy) -> ActorCriticPolicy:
    """
    ``copy.deepcopy`` of the policy. gSDE's distribution keeps tensors computed from the log-std (the exploration
    matrix and the Normal it was drawn from), which deepcopy refuses (not graph leaves): those are copied detached.
    """
    memo: dict[int, Any] = {}
    pending: list[Any] = [policy.action_dist]
    while pending:
        for value in vars(pending.pop()).values():
            if isinstance(value, th.Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach().clone()
            elif isinstance(value, th.distributions.Distribution):
                pending.append(value)
    return copy.deepcopy(policy, memo)


class KeepOldPolicy(BaseCallback):
    """At each rollout end (before ``train()``): a copy of the policy and of the rollout's arrays, step-major."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[OldPolicy] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer

        def flat(array: np.ndarray) -> np.ndarray:  # (n_steps, n_envs, ...) -> (n_steps * n_envs, ...)
            return array.reshape(-1, *array.shape[2:]).copy()

        masks = getattr(buffer, "action_masks", None)
        lstm_states, starts = None, None
        if hasattr(buffer, "hidden_states_pi"):
            # (n_steps, n_layers, n_envs, hidden) -> (n_layers, n_steps * n_envs, hidden)
            lstm_states = tuple(
                np.swapaxes(states, 0, 1).reshape(states.shape[1], -1, states.shape[3]).copy()
                for states in (buffer.hidden_states_pi, buffer.cell_states_pi)
            )
            starts = buffer.episode_starts.reshape(-1).copy()
        masks = flat(masks) if isinstance(masks, np.ndarray) else None
        self.kept.append(OldPolicy(copy_of(self.model.policy), flat(buffer.observations), masks, lstm_states, starts))


def distribution_on(policy: ActorCriticPolicy, old: OldPolicy, repeats: int) -> Distribution:
    """The policy's distribution on the rollout's steps, each repeated ``repeats`` times (consecutive rows)."""
    observations = obs_as_tensor(np.repeat(old.observations, repeats, axis=0), policy.device)
    if old.lstm_states is not None and old.episode_starts is not None:
        hidden, cell = (th.as_tensor(np.repeat(state, repeats, axis=1)) for state in old.lstm_states)
        starts = th.as_tensor(np.repeat(old.episode_starts, repeats))
        return policy.get_distribution(observations, (hidden, cell), starts)[0]  # type: ignore[call-arg]
    if old.action_masks is not None:
        return policy.get_distribution(observations, action_masks=np.repeat(old.action_masks, repeats, axis=0))  # type: ignore[call-arg]
    return policy.get_distribution(observations)


@th.no_grad()
def old_log_ratios(old: OldPolicy, new_policy: ActorCriticPolicy) -> th.Tensor:
    """
    ``log pi_old(a) - log pi_new(a)`` at ``N_SAMPLES`` actions drawn from the old policy, the same number at each of
    the rollout's steps: ``(n_steps, repeats)``.
    """
    n_steps = len(old.observations)
    repeats = math.ceil(N_SAMPLES / n_steps)
    old_dist = distribution_on(old.policy, old, repeats)
    if isinstance(old_dist, StateDependentNoiseDistribution):
        # gSDE's action at a state is its mean plus the features times an exploration matrix: one fresh matrix per
        # sample draws from the policy's distribution at that state (a rollout reuses one for many steps)
        old_dist.sample_weights(old.policy.log_std, batch_size=n_steps * repeats)
    if isinstance(old_dist, StateDependentNoiseDistribution) and old_dist.bijector is not None:
        if isinstance(old_dist, BoundedStateDependentNoiseDistribution):
            actions = old_dist.sample()
            log_ratio = old_dist.log_prob(actions) - distribution_on(new_policy, old, repeats).log_prob(actions)
        else:
            # SB3's tanh squashing is a bijection whose Jacobian cancels in the ratio: the ratio of the pre-squash
            # densities (SB3's log_prob would invert float32 tanh, which saturates)
            presquash = old_dist.distribution.mean + old_dist.get_noise(old_dist._latent_sde)
            new_normal = distribution_on(new_policy, old, repeats).distribution
            log_ratio = (old_dist.distribution.log_prob(presquash) - new_normal.log_prob(presquash)).sum(dim=1)
    else:
        actions = old_dist.sample()
        log_ratio = old_dist.log_prob(actions) - distribution_on(new_policy, old, repeats).log_prob(actions)
    return log_ratio.double().reshape(n_steps, repeats)


def mean_and_standard_error(per_step: th.Tensor) -> tuple[float, float]:
    """The mean of ``(n_steps, repeats)`` samples and its standard error (stratified: the variance within each step)."""
    return per_step.mean().item(), math.sqrt(per_step.var(dim=1).mean().item() / per_step.numel())


@pytest.mark.parametrize("case", list(CASES))
def test_measured_kl_is_the_true_kl(case: str) -> None:
    model = CASES[case]()
    keep = KeepOldPolicy()
    # Measure only (no update undone, no rate changed); the first rollout's update
    adaptive = KLAdaptiveLRCallback(trust_region=False, tolerance=1e9)
    model.learn(N_STEPS * N_ENVS, callback=[keep, adaptive])
    assert len(keep.kept) == 1 and len(adaptive.history) == 1
    measured = adaptive.history[-1][0]
    log_ratio = old_log_ratios(keep.kept[-1], model.policy)
    # Two unbiased estimates of the KL from the same samples: the mean log-ratio, and the mean of
    # (r - 1) - log r with r = pi_new / pi_old, whose control variate r - 1 has mean 0 under pi_old (the actions were
    # drawn from it, independently at every step) and makes the standard error about 30x smaller at these KLs
    plain, plain_error = mean_and_standard_error(log_ratio)
    controlled, standard_error = mean_and_standard_error(th.expm1(-log_ratio) + log_ratio)
    print(f"{case}: measured {measured:.6g}, Monte Carlo {controlled:.6g} +- {standard_error:.2g}", end=" ")
    print(f"(without the control variate {plain:.6g} +- {plain_error:.2g})")
    assert controlled > 10 * standard_error  # the update moved the policy measurably
    assert abs(measured - controlled) <= 3 * standard_error + ROUNDING, (measured, controlled, standard_error)
    assert abs(measured - plain) <= 3 * plain_error + ROUNDING, (measured, plain, plain_error)
