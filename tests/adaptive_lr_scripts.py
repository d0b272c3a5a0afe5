"""Shared by the adaptive learning rate's tests: a tiny PPO and a scripted rollout KL."""

from collections.abc import Iterator
from typing import Any

import pytest
from stable_baselines3 import PPO

import sb3_safe.common.adaptive_lr as adaptive_lr

#: Copied where an A2C gets it: SB3's A2C writes its RMSprop into the policy_kwargs dict it is given
SMALL = dict(net_arch=[16])


def small_ppo(learning_rate: Any = 1e-3, **kwargs: Any) -> PPO:
    """A PPO whose update is one minibatch step on 16 samples (the KL is scripted or tiny: what it learns is moot)."""
    settings: dict[str, Any] = dict(n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=SMALL, seed=0, device="cpu")
    settings.update(kwargs)
    return PPO("MlpPolicy", "CartPole-v1", learning_rate=learning_rate, **settings)


def scripted_kl(monkeypatch: pytest.MonkeyPatch, values: list[float]) -> list[float]:
    """Make the rollout KL of the i-th measurement ``values[i]`` (the last one repeated); return the list consumed."""
    script: Iterator[float] = iter(values)
    measured: list[float] = []

    def mean_kl(*_: Any) -> float:
        measured.append(next(script, values[-1]))
        return measured[-1]

    monkeypatch.setattr(adaptive_lr, "mean_kl", mean_kl)
    return measured
