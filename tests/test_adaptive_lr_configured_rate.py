"""
The configured learning rate is the user's (issue 63, point 2): by default KLAdaptiveLRCallback never raises the rate
above the configured one (a schedule's value at that progress) and never clamps it before a measured KL says so; it
lowers the rate on overshoot and recovers up to it. Raising is opt-in (``lr_bounds``, ``raise_above_configured``).
``model.learning_rate`` stays what the user passed; the scale the callback and the guard's rollback share lives in a
model attribute, saved with the model.

Where a test needs a KL of a chosen value, the rollout KL the callback measures is replaced by a script of values.
"""

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch as th
from adaptive_lr_scripts import SMALL, scripted_kl, small_ppo
from faults import NaNAfterOptimizerStep
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_zoo3.utils import linear_schedule
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import FloatSchedule

from sb3_safe import KLAdaptiveLRCallback, KLAdaptivePPO, NonFiniteGuardCallback, NonFiniteGuardWarning
from sb3_safe.common.adaptive_lr import LOWEST_LEARNING_RATE, MEASURED_SAMPLES
from sb3_safe.common.schedules import ScaledSchedule, learning_rate_scale, scale_learning_rate


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the guard's report


class StepRates:
    """Each optimizer step's learning rate and SB3's progress remaining when it ran (a step pre-hook)."""

    def __init__(self, model: BaseAlgorithm) -> None:
        self.model = model
        self.steps: list[tuple[float, float]] = []
        model.policy.optimizer.register_step_pre_hook(self)

    def __call__(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.steps.append((float(optimizer.param_groups[0]["lr"]), self.model._current_progress_remaining))


class RecordLogged(BaseCallback):
    """What the callback logged under ``key`` for each judged update (read at each rollout end, before the dump)."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.values: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        value = self.logger.name_to_value.get(self.key)
        if value is not None:
            self.values.append(value)


# ----- the default: never above the configured rate, never clamped before a measured KL -----


@pytest.mark.parametrize(
    "make, configured",
    [
        (lambda: small_ppo(3e-3), 3e-3),  # above the old PPO-style upper bound 1e-3
        (lambda: small_ppo(1e-6), 1e-6),  # below the old lower bound 1e-5
        (lambda: small_ppo(linear_schedule(3e-3)), 3e-3 * (1 - 16 / 64)),  # SB3 updates the progress before train()
        (lambda: A2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=3e-2, policy_kwargs=dict(SMALL)), 3e-2),
    ],
)
def test_the_first_update_runs_at_exactly_the_configured_rate(make: Callable[[], BaseAlgorithm], configured: float) -> None:
    """Promise: by default nothing clamps the configured rate before a KL was measured: the first step runs at it."""
    model = make()
    rates = StepRates(model)
    model.learn(model.n_steps * 4, callback=KLAdaptiveLRCallback())
    assert rates.steps[0][0] == pytest.approx(configured, rel=1e-12)
    if not callable(model.learning_rate):
        assert rates.steps[0][0] == configured  # exactly: a scale of 1.0 times the configured float


@settings(max_examples=8, deadline=None)
@given(
    learning_rate=st.floats(1e-6, 5e-3),
    linear=st.booleans(),
    raise_after=st.integers(1, 3),
    max_step=st.floats(1.5, 8.0),
    low_kl=st.floats(1e-9, 1e-3),
)
def test_a_low_kl_never_raises_the_rate_above_the_configured_one(
    learning_rate: float, linear: bool, raise_after: int, max_step: float, low_kl: float
) -> None:
    """
    Promise: by default, with every KL far below the target, the rate of every step stays at most the configured
    one (a schedule's value at that step's progress), and it is the configured one: nothing lowers it either.
    """
    configured = linear_schedule(learning_rate) if linear else learning_rate
    with pytest.MonkeyPatch.context() as patch:
        scripted_kl(patch, [low_kl])
        model = small_ppo(configured)
        rates = StepRates(model)
        callback = KLAdaptiveLRCallback(target_kl=0.1, raise_after=raise_after, max_step=max_step, window_steps=16)
        model.learn(16 * 6, callback=callback)
    schedule = FloatSchedule(configured)
    assert len(rates.steps) == 6 and len(callback.decisions) == 6
    assert all(rate == schedule(progress) for rate, progress in rates.steps)
    assert learning_rate_scale(model) == 1.0


@pytest.mark.parametrize("algorithm", [A2C, PPO])
def test_real_low_kls_never_raise_a_decaying_schedule(algorithm: type[BaseAlgorithm]) -> None:
    """Promise: the same on real updates (no script), A2C-style and PPO-style, with rl-zoo's linear schedule."""
    # A2C-style: rollouts of MEASURED_SAMPLES, so that every update is measured and decided on
    n_steps, extra = (16, dict(batch_size=16, n_epochs=1)) if algorithm is PPO else (MEASURED_SAMPLES, {})
    model = algorithm("MlpPolicy", "CartPole-v1", n_steps=n_steps, learning_rate=linear_schedule(1e-4), seed=0, **extra)
    rates = StepRates(model)
    callback = KLAdaptiveLRCallback(target_kl=0.5, raise_after=1, window_steps=n_steps)  # every KL far below
    model.learn(n_steps * 6, callback=callback)
    assert len(callback.decisions) == 6
    assert all(0.0 <= rate <= linear_schedule(1e-4)(progress) for rate, progress in rates.steps)


def test_an_overshoot_cuts_and_low_kls_recover_the_configured_rate_but_never_beyond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    Promise: the trust region and the lowering stay: an update far above the target is redone at a lower rate, a
    window above the band lowers it; then windows below the band raise it back up to the configured rate, not above.
    """
    target = 0.015
    # the 1st update overshoots (redone, landing on the target), the 2nd is above the band, then all far below
    scripted_kl(monkeypatch, [100 * target, target, 5 * target, *[target / 100] * 10])
    configured = 2e-4  # (below the old default's upper bound 1e-3, which it raised to)
    model = small_ppo(configured)
    callback = KLAdaptiveLRCallback(target_kl=target, raise_after=1, window_steps=16)
    model.learn(16 * 10, callback=callback)
    used = [rate for _, rate in callback.history]
    assert callback.redone_updates == 1 and used[0] == pytest.approx(configured * 0.1)  # the redo's cut holds
    assert used[1] == used[0] and used[2] == pytest.approx(used[1] / 2)  # lowered by the window above the band
    assert max(used) <= configured and used[-1] == configured  # recovered, exactly, and held there
    raises = [factor for _, factor in callback.decisions if factor > 1.0]
    assert raises and learning_rate_scale(model) == 1.0
    assert [factor for _, factor in callback.decisions][-2:] == [1.0, 1.0]  # at the configured rate: no raise


def test_cuts_stop_at_the_floor_or_at_a_configured_rate_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Promise: a cut never lowers the rate below 1e-5, or below the configured rate where that is lower."""
    for configured, floor in ((1e-4, LOWEST_LEARNING_RATE), (1e-6, 1e-6)):
        scripted_kl(monkeypatch, [1e3])  # every update far above the target
        model = small_ppo(configured)
        callback = KLAdaptiveLRCallback(target_kl=1e-3, window_steps=16)
        model.learn(16 * 8, callback=callback)
        used = [rate for _, rate in callback.history]
        assert min(used) == pytest.approx(floor) and all(rate >= floor * (1 - 1e-12) for rate in used)


# ----- raising above the configured rate is opt-in -----


@pytest.mark.parametrize(
    "kwargs, highest",
    [
        (dict(lr_bounds=(1e-5, 1e-3)), 1e-3),
        (dict(raise_above_configured=True), 1e-3),  # the PPO-style kind's upper bound
        (dict(raise_above_configured=True, lr_bounds=(1e-5, 4e-4)), 4e-4),  # given bounds win
    ],
)
def test_explicit_bounds_and_the_opt_in_raise_above_the_configured_rate(
    kwargs: dict[str, Any], highest: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted_kl(monkeypatch, [1e-6])  # every KL far below the target
    model = small_ppo(1e-4)
    callback = KLAdaptiveLRCallback(target_kl=0.015, raise_after=1, window_steps=16, **kwargs)
    model.learn(16 * 12, callback=callback)
    used = [rate for _, rate in callback.history]
    assert used[0] == 1e-4 and used[-1] == pytest.approx(highest) and learning_rate_scale(model) > 1.0
    assert callback.bounds == (LOWEST_LEARNING_RATE, highest) and callback.raise_above_configured is kwargs.get(
        "raise_above_configured", False
    )


def test_the_opt_in_clamps_as_before_from_the_start() -> None:
    """Promise: ``raise_above_configured=True`` keeps the kind's bounds, which clamp from the first update on."""
    model = small_ppo(3e-3)
    rates = StepRates(model)
    model.learn(16, callback=KLAdaptiveLRCallback(raise_above_configured=True))
    assert rates.steps[0][0] == 1e-3


@pytest.mark.parametrize("value", ["yes", 1, None, 0.0])
def test_raise_above_configured_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ValueError, match=r"raise_above_configured must be True or False"):
        KLAdaptiveLRCallback(raise_above_configured=value)


def test_a_scale_raised_by_an_earlier_opt_in_is_brought_back_to_the_configured_rate_and_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Promise: by default the rate never runs above the configured one, also after an opt-in learn() raised it."""
    scripted_kl(monkeypatch, [1e-6])
    model = small_ppo(1e-4)
    model.learn(16 * 4, callback=KLAdaptiveLRCallback(raise_after=1, window_steps=16, raise_above_configured=True))
    assert learning_rate_scale(model) > 1.0
    rates = StepRates(model)
    with pytest.warns(UserWarning, match=r"brought back to 1, the configured rate"):
        model.learn(16, callback=KLAdaptiveLRCallback(), reset_num_timesteps=False)
    assert learning_rate_scale(model) == 1.0 and rates.steps[0][0] == 1e-4


# ----- model.learning_rate is the user's; the scale is a saved attribute -----


@pytest.mark.parametrize("configured", [3e-4, linear_schedule(3e-4)])
def test_learning_rate_stays_the_users_object_after_learn_a_rollback_and_save_load(configured: Any, tmp_path: Any) -> None:
    """
    Promise: ``model.learning_rate`` is what the user passed, after a learn() with cuts, after a guard's rollback,
    and (equal) after save and load; the scale they chose is kept beside it and survives save / load.
    """
    model = small_ppo(configured, n_steps=32, batch_size=32, n_epochs=2)
    adaptive = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=1, window_steps=32)  # cuts
    model.learn(32 * 2, callback=adaptive)
    assert adaptive.redone_updates > 0 and learning_rate_scale(model) < 1.0
    assert model.learning_rate is configured
    NaNAfterOptimizerStep(model.policy.optimizer, at=3, weight=model.policy.action_net.weight)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", lr_decay=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        model.learn(32 * 2, callback=guard, reset_num_timesteps=False)
    assert guard.n_rollbacks == 1 and model.learning_rate is configured
    scale = learning_rate_scale(model)
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model", device="cpu")
    schedule = FloatSchedule(configured)
    assert not isinstance(loaded.learning_rate, ScaledSchedule)
    assert all(FloatSchedule(loaded.learning_rate)(p) == schedule(p) for p in (1.0, 0.5, 0.0))
    assert learning_rate_scale(loaded) == scale


@pytest.mark.parametrize("continue_with", ["adaptive", "guard", "own algorithm"])
def test_the_scale_survives_save_load_and_a_continued_learn(continue_with: str, tmp_path: Any) -> None:
    """
    Promise: a loaded model continues at the configured rate times the saved scale: with the adaptive learning rate,
    with the guard alone, and in sb3-safe's own algorithms without any callback; ``learning_rate`` stays the
    configured value.
    """
    algorithm = KLAdaptivePPO if continue_with == "own algorithm" else PPO
    kwargs = dict(n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=SMALL, seed=0, device="cpu")
    model = algorithm("MlpPolicy", "CartPole-v1", learning_rate=2e-4, **kwargs)
    scale_learning_rate(model, [model.policy.optimizer], 0.25)  # as a rollback or a cut leaves it
    model.save(tmp_path / "model")
    loaded = algorithm.load(tmp_path / "model", device="cpu", env=model.get_env())
    assert loaded.learning_rate == 2e-4 and learning_rate_scale(loaded) == 0.25
    rates = StepRates(loaded)
    callback = {
        "adaptive": [KLAdaptiveLRCallback(trust_region=False, window_steps=10**9)],
        "guard": [NonFiniteGuardCallback()],
        "own algorithm": [],
    }[continue_with]
    loaded.learn(16 * 2, callback=callback, reset_num_timesteps=False)
    assert [rate for rate, _ in rates.steps] == [2e-4 * 0.25] * 2
    assert loaded.learning_rate == 2e-4 and learning_rate_scale(loaded) == 0.25


# ----- every change is logged with its KL -----


def test_every_change_of_the_rate_is_logged_and_said_with_its_kl(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """
    Promise: each redo and each decision that changes the rate is printed (``verbose=1``) with the KL it was decided
    on, and logged: ``train/lr_factor`` (the factor this update's judgement applied, 1 if none) beside ``train/kl``,
    ``train/kl_window`` and ``train/lr_scale``.
    """
    target = 0.015
    kls = [100 * target, target, 10 * target, target, target / 100, target / 100, target]
    scripted_kl(monkeypatch, kls)
    model = small_ppo(1e-4)
    callback = KLAdaptiveLRCallback(target_kl=target, raise_after=1, window_steps=16, verbose=1)
    factors = RecordLogged("train/lr_factor")
    model.learn(16 * 6, callback=[callback, factors])
    said = [line for line in capsys.readouterr().out.splitlines() if "learning rate x" in line]
    changes = callback.redone_updates + sum(1 for _, factor in callback.decisions if factor != 1.0)
    assert changes >= 3 and len(said) == changes
    assert "KL 1.5 > 6 x target 0.015, update redone" in said[0]
    assert all("KL" in line and "->" in line for line in said)
    # one logged factor per judged update but the last (learn() ends before a dump); their product is the scale
    assert len(factors.values) == len(callback.history) - 1 and any(f != 1.0 for f in factors.values)
    logged = math.prod(factors.values) * callback.decisions[-1][1]
    assert logged == pytest.approx(learning_rate_scale(model))
