"""
Promises of :mod:`sb3_safe.common.updates`, the update-step logic that KLAdaptivePPO and SafeA2C share: the guarded
step clips what it says it clips, advantage scaling keeps the advantages' order and scale, nothing is logged where no
logging was asked for. Each test names its promise (the mutants it kills are in benchmarks/results/mutation.md).
"""

import warnings

import gymnasium as gym
import pytest
import torch as th
from stable_baselines3.common.logger import configure

from sb3_safe import KLAdaptivePPO, SafeA2C
from sb3_safe.common.updates import GuardedOptimizerStep, SkippedUpdateWarning, normalize_advantages


@pytest.mark.parametrize("max_grad_norm", [1.0, None])
def test_the_guarded_step_clips_the_gradient_to_max_grad_norm_and_only_then(max_grad_norm: float | None) -> None:
    """
    Promise: the guarded step clips the global L2 norm of the gradients to ``max_grad_norm`` (None: no clipping) and
    returns the norm before clipping, as SB3's ``clip_grad_norm_`` step does.
    """
    weight = th.nn.Parameter(th.zeros(2))
    optimizer = th.optim.SGD([weight], lr=1.0)
    loss = (weight * th.tensor([6.0, 8.0])).sum()  # gradient (6, 8): norm 10
    grad_norm = GuardedOptimizerStep()(optimizer, loss, [weight], max_grad_norm)
    assert grad_norm is not None and float(grad_norm) == pytest.approx(10.0)
    # SGD at lr 1 moves by the (clipped) gradient
    expected = th.tensor([-0.6, -0.8]) if max_grad_norm is not None else th.tensor([-6.0, -8.0])
    assert th.allclose(weight.detach(), expected)


@pytest.mark.parametrize(
    "advantages",
    [
        [1.0, 2.0, 3.0, 10.0],  # mean far from 0
        [-300.0, 100.0],  # two samples, std far from 1
        [1e-6, 3e-6, 2e-6],  # std (1e-6) of the scale of epsilon (1e-8) x 100
        [0.0, 1e-8],  # std (7e-9) below epsilon (1e-8)
    ],
)
def test_normalized_advantages_have_zero_mean_unit_scale_and_keep_their_order(advantages: list[float]) -> None:
    """
    Promise: ``normalize_advantages`` centers a minibatch's advantages and divides them by their standard deviation
    plus a small epsilon: zero mean, unit standard deviation (less where the deviation is below epsilon's scale, never
    more), the order of the advantages kept (a better action never becomes a worse one), finite.
    """
    values = th.tensor(advantages, dtype=th.float32)
    normalized = normalize_advantages(values)
    assert th.isfinite(normalized).all()
    assert float(normalized.mean()) == pytest.approx(0.0, abs=1e-5)
    std = float(normalized.std())
    assert std <= 1.0 + 1e-5
    if float(values.std()) > 1e-3:
        assert std == pytest.approx(1.0, abs=1e-5)
    assert th.equal(th.argsort(normalized), th.argsort(values))


@pytest.mark.parametrize("advantages", [[3.5], [-1e30], [7.0, 7.0, 7.0]])
def test_a_batch_of_one_is_returned_unchanged_and_zero_variance_gives_zeros(advantages: list[float]) -> None:
    """
    Promise: ``normalize_advantages`` is safe for a minibatch of one (returned unchanged, as SB3's PPO does: a
    standard deviation of one sample is NaN) and for zero variance (the centered advantages, all zero).
    """
    values = th.tensor(advantages)
    normalized = normalize_advantages(values)
    expected = values if len(advantages) == 1 else th.zeros_like(values)
    assert th.equal(normalized, expected)


def test_no_log_interval_writes_nothing_when_learn_ends(tmp_path) -> None:
    """
    Promise: with ``log_interval=None`` (no logging asked for) learn() writes nothing, not even the statistics of the
    last update that it writes when learn() ends otherwise (they stay readable in ``logger.name_to_value``).
    """
    model = SafeA2C("MlpPolicy", "Pendulum-v1", n_steps=8, seed=0, device="cpu", policy_kwargs=dict(net_arch=[8]))
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(16, log_interval=None)
    assert (tmp_path / "progress.csv").read_text() == ""
    assert "train/skipped_updates" in model.logger.name_to_value


class HugeRewards(gym.RewardWrapper):
    """CartPole-v1 with rewards of 1e38: the returns overflow float32."""

    def reward(self, reward: float) -> float:
        return float(reward) * 1e38


@pytest.mark.parametrize(
    ("algo", "kwargs"),
    [(SafeA2C, dict(n_steps=5)), (KLAdaptivePPO, dict(n_steps=64, batch_size=64, n_epochs=1))],
)
def test_a_run_whose_updates_skip_every_step_is_named(algo: type, kwargs: dict) -> None:
    """
    Promise: a safe algorithm whose update skips every gradient step (rewards of 1e38, without the guard) says so in
    a warning naming the algorithm, the skipped steps and the likely cause, once per run of such updates; the
    parameters did not change. A healthy run warns nothing.
    """
    model = algo("MlpPolicy", HugeRewards(gym.make("CartPole-v1")), seed=0, **kwargs)
    before = [param.detach().clone() for param in model.policy.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(2 * kwargs["n_steps"])
    named = [warning for warning in caught if issubclass(warning.category, SkippedUpdateWarning)]
    assert model.skipped_updates == 2
    assert len(named) == 1
    message = str(named[0].message)
    assert algo.__name__ in message and "skipped every gradient step" in message and "1e38" in message
    assert all(th.equal(old, new) for old, new in zip(before, model.policy.parameters(), strict=True))

    healthy = algo("MlpPolicy", "CartPole-v1", seed=0, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedUpdateWarning)
        healthy.learn(2 * kwargs["n_steps"])
    assert healthy.skipped_updates == 0
