"""
KLAdaptiveLRCallback's promises at their edges (issue 41): the arguments it accepts, how a decision and a redo move
the learning rate, which updates it measures, and what it leaves as it found it.

Where a test needs a KL of a chosen value, the rollout KL the callback measures is replaced by a script of values
(:func:`scripted_kl`): the rule is then tested on exact inputs; the measurement itself is tested on real updates.
"""

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch as th
from adaptive_lr_scripts import SMALL, scripted_kl, small_ppo
from faults import NaNAfterOptimizerStep
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_zoo3.utils import linear_schedule
from stable_baselines3 import A2C
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import sb3_safe.common.adaptive_lr as adaptive_lr
from sb3_safe import KLAdaptiveLRCallback, KLAdaptivePPO, NonFiniteGuardCallback, NonFiniteGuardWarning, SafeA2C
from sb3_safe.common.adaptive_lr import MEASURED_FIRST, MEASURED_SAMPLES, learning_rate_factor
from sb3_safe.common.guard.watch import WatchedModel
from sb3_safe.common.schedules import learning_rate_scale, scale_learning_rate


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the guard's report


class CountSteps(BaseCallback):
    """Counts the environment steps it is called at."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def _on_step(self) -> bool:
        self.steps += 1
        return True


# ----- the arguments -----


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr_bounds=(1e-3, 1e-3)),  # lowest == highest: a fixed learning rate
        dict(tolerance=1.5),  # any tolerance above 1
        dict(undo_above=1.5),  # any multiple above 1
        dict(max_redos=0),  # adapt, never redo
        dict(window_steps=1),  # a decision after every update
        dict(raise_after=1),
    ],
)
def test_arguments_at_the_edges_of_their_documented_ranges_are_accepted(kwargs: dict[str, Any]) -> None:
    """Promise: ``0 < lowest <= highest < inf``, ``tolerance > 1``, ``undo_above > 1``, ``max_redos >= 0``,
    ``window_steps >= 1``: each value at the edge of its range is accepted and kept."""
    callback = KLAdaptiveLRCallback(**kwargs)
    name, value = next(iter(kwargs.items()))
    assert getattr(callback, name) == value


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(lr_bounds=(1e-5, math.inf)), "lr_bounds"),
        (dict(target_kl=math.inf), "target_kl"),
        (dict(max_step=math.inf), "max_step"),
        (dict(undo_above=1.0), "undo_above"),  # undoing updates at the target itself
        (dict(undo_above=0.5), "undo_above"),
        (dict(window_steps=0), "window_steps"),
    ],
)
def test_arguments_beyond_their_documented_ranges_are_refused(kwargs: dict[str, Any], argument: str) -> None:
    """Promise: a bound, target or factor that is infinite, or an undo threshold not above the target, is refused by
    name at construction (not met as a learning rate of inf or an update undone at the target)."""
    with pytest.raises(ValueError, match=argument):
        KLAdaptiveLRCallback(**kwargs)


def test_a_callback_that_has_seen_no_learn_has_undone_and_decided_nothing() -> None:
    """Promise: ``redone_updates``, ``history`` and ``decisions`` count what this callback did: nothing yet."""
    callback = KLAdaptiveLRCallback()
    assert callback.redone_updates == 0 and callback.history == [] and callback.decisions == []


def test_max_redos_zero_adapts_but_never_undoes() -> None:
    """Promise: ``max_redos`` bounds the redos per update; at 0 an update far above the target is kept."""
    model = small_ppo()
    callback = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=0, window_steps=16, lr_bounds=(1e-12, 1.0))
    model.learn(16 * 3, callback=callback)
    assert callback.redone_updates == 0 and len(callback.history) == 3
    assert all(factor < 1.0 for _, factor in callback.decisions)  # still adapted: lowered at each decision


def test_the_default_callback_is_silent_about_its_redos(capsys: pytest.CaptureFixture[str]) -> None:
    """Promise: ``verbose`` 0 by default; only ``verbose=1`` prints each redo."""
    model = small_ppo()
    callback = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=1, lr_bounds=(1e-12, 1.0))
    model.learn(16 * 2, callback=callback)
    assert callback.redone_updates == 2
    assert "redone" not in capsys.readouterr().out


# ----- the trust region -----


def test_an_update_exactly_at_the_undo_threshold_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Promise: an update is undone if its KL *exceeds* ``undo_above * target_kl``; one at it is kept, one just above
    it is redone."""
    threshold = 2.0 * 0.5  # exact in floating point
    for kl, redone in ((threshold, 0), (math.nextafter(threshold, math.inf), 1)):
        scripted_kl(monkeypatch, [kl, 1e-3])
        callback = KLAdaptiveLRCallback(target_kl=0.5, undo_above=2.0, max_redos=1, window_steps=10**9)
        small_ppo().learn(16, callback=callback)
        assert callback.redone_updates == redone


@settings(max_examples=25, deadline=None)
@given(ratio=st.floats(6.01, 1e6), learning_rate=st.floats(1e-5, 1e-2))
def test_a_redo_cuts_the_learning_rate_by_the_square_root_of_the_measured_ratio(ratio: float, learning_rate: float) -> None:
    """Promise: an update above ``undo_above`` (PPO-style: 6) x target is redone at its learning rate times
    ``clip(sqrt(target / KL), 0.1, 0.5)``."""
    target = 0.015
    with pytest.MonkeyPatch.context() as patch:
        scripted_kl(patch, [ratio * target, target])  # the redo lands on the target
        callback = KLAdaptiveLRCallback(target_kl=target, max_redos=1, window_steps=10**9, lr_bounds=(1e-12, 1.0))
        small_ppo(learning_rate=learning_rate).learn(16, callback=callback)
    assert callback.redone_updates == 1
    [(kl, used)] = callback.history
    cut = min(max(math.sqrt(target / (ratio * target)), 0.1), 0.5)
    assert kl == target and used == pytest.approx(learning_rate * cut)


def test_a_redo_whose_step_is_skipped_ends_the_redos() -> None:
    """
    Promise: an A2C-style redo whose step SafeA2C skips (a non-finite loss) has no KL to judge: the redos end there
    (no further undo on a KL that cannot be known) and the update is not recorded.
    """
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8, policy_kwargs=dict(SMALL), seed=0, device="cpu")

    class CorruptRolloutBeforeRedo(BaseCallback):
        """The first rollout's returns (which the redo reads again) turn NaN after its first update."""

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            if not hasattr(self, "returns"):
                self.returns = self.model.rollout_buffer.returns

        def _on_rollout_start(self) -> None:
            if hasattr(self, "returns"):
                self.returns[:] = np.nan

    # every update overshoots; bounds the rate never reaches: each is redone max_redos times unless a redo ends it
    callback = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=3, window_steps=10**9, lr_bounds=(1e-12, 1.0))
    model.learn(8 * 2, callback=[CorruptRolloutBeforeRedo(), callback])  # the 1st update judged at the 2nd rollout
    assert model.skipped_updates == 1  # the 1st update's first redo
    assert callback.redone_updates == 1 + 3  # then the 2nd update's 3
    assert len(callback.history) == 1  # the 2nd update's


def test_a_redo_a_guard_rolls_back_is_not_judged() -> None:
    """
    Promise: if a guard rolls the redo back (a NaN in a redone step), the update is no longer the one measured:
    no further redo, and its KL is not recorded.
    """
    model = small_ppo(n_steps=32, batch_size=32, n_epochs=2)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    adaptive = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=2, window_steps=10**9, lr_bounds=(1e-12, 1.0))
    # Each update: 2 steps, then 2 redos of 2 steps: the NaN in the first redo of the 2nd update
    NaNAfterOptimizerStep(model.policy.optimizer, at=6 + 3, weight=model.policy.action_net.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        model.learn(32 * 3, callback=[guard, adaptive])
    assert guard.n_rollbacks == 1
    assert adaptive.redone_updates == 2 + 1 + 2  # the 2nd update's first redo was rolled back: not redone again
    assert len(adaptive.history) == 2  # the 1st and 3rd updates


def test_the_policy_is_left_as_train_left_it_after_a_redo_at_the_end_of_learn() -> None:
    """
    Promise: a redo of the last update (``at_end``) does not set up a next rollout that SB3 will not collect: the
    policy stays in training mode, as ``train()`` leaves it without the callback.
    """
    model = small_ppo()
    callback = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=1, lr_bounds=(1e-12, 1.0))
    model.learn(16 * 2, callback=callback)
    assert callback.redone_updates == 2
    baseline = small_ppo()
    baseline.learn(16 * 2)
    assert model.policy.training is baseline.policy.training is True


# ----- decisions -----


def test_decisions_lower_at_once_and_raise_only_after_raise_after_low_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Promise: a window above the band lowers the learning rate by its own factor at once; a raise waits for
    ``raise_after`` windows in a row below the band and steps by the smallest of their factors; any window that is
    not below the band (in it or above it) holds a raise back.
    """
    target, tolerance, max_step = 0.01, 2.0, 4.0
    low_a, low_b, low_c = target / 2.25, target / 4, target / 9  # factors 1.5, 2, 3: all below the band
    high_a, high_b = target * 16, target * 4  # factors 0.25, 0.5
    kls = [low_a, high_a, low_b, low_c, high_b, low_c, low_b, target, low_b]
    scripted_kl(monkeypatch, kls)
    callback = KLAdaptiveLRCallback(
        target_kl=target,
        tolerance=tolerance,
        max_step=max_step,
        undo_above=1e12,
        raise_after=2,
        window_steps=16,
        lr_bounds=(1e-12, 1.0),
    )
    small_ppo(learning_rate=1e-3).learn(16 * len(kls), callback=callback)
    factor = [learning_rate_factor(kl, target, tolerance, max_step) for kl in kls]
    expected = [
        1.0,  # a first low window: a raise waits for a second
        factor[1],  # lowered at once
        1.0,  # low after high: not two low ones in a row
        min(factor[2], factor[3]),  # two low ones: the smaller factor (the higher KL)
        factor[4],  # lowered at once, whatever came before
        1.0,
        min(factor[5], factor[6]),
        1.0,  # in the band
        1.0,  # low after one in the band
    ]
    assert [kl for kl, _ in callback.decisions] == kls
    assert [f for _, f in callback.decisions] == pytest.approx(expected)
    assert learning_rate_scale(callback.model) == pytest.approx(math.prod(expected))


@pytest.mark.parametrize(
    "learning_rate, kl_over_target",
    [
        (0.1, 1.0),  # schedule above the upper bound, a KL in the band: no decision
        (0.1, 1.5),  # schedule above the upper bound, a KL in the band (above the target)
        (1e-7, 5.0),  # schedule below the lower bound, a lowering: the rate in use cannot go lower
        (1e-7, 1.0),
    ],
)
def test_the_scale_moves_only_where_the_rate_in_use_can_follow(
    learning_rate: float, kl_over_target: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Promise: the bounds (here the kind's, ``raise_above_configured``) clamp the rate a step uses, never the scale; a
    decision moves the scale only as far as the rate in use can move, so that no clamp is folded into the saved
    scale without a decision.
    """
    target = 0.015
    scripted_kl(monkeypatch, [kl_over_target * target])
    model = small_ppo(learning_rate=learning_rate)
    callback = KLAdaptiveLRCallback(
        target_kl=target, undo_above=1e12, raise_after=1, window_steps=16, raise_above_configured=True
    )
    model.learn(16 * 3, callback=callback)
    assert [f for _, f in callback.decisions] == [1.0] * 3
    assert learning_rate_scale(model) == 1.0
    low, high = callback.bounds
    assert [used for _, used in callback.history] == [min(max(learning_rate, low), high)] * 3


def test_a_decision_when_a_decaying_schedule_has_reached_zero_moves_nothing() -> None:
    """
    Promise: with bounds (here the kind's, ``raise_above_configured``) the tail of a decaying schedule is held at the
    lower bound; a decision made where the schedule is at 0 (the last update of a budget that is a multiple of the
    rollout) leaves the scale alone, as no scale moves it.
    """
    model = small_ppo(learning_rate=linear_schedule(1e-3))
    # every window far below: raises
    callback = KLAdaptiveLRCallback(target_kl=0.5, raise_after=1, window_steps=16, raise_above_configured=True)
    model.learn(16 * 3, callback=callback)
    assert model._current_progress_remaining == 0.0
    factors = [f for _, f in callback.decisions]
    assert len(factors) == 3 and all(f > 1.0 for f in factors[:2]) and factors[2] == 1.0
    assert callback.history[-1][1] == callback.bounds[0]
    assert learning_rate_scale(model) == pytest.approx(factors[0] * factors[1])


def test_a_window_continuing_a_learn_counts_from_where_it_started() -> None:
    """
    Promise: a decision once ``window_steps`` environment steps have passed since the last one, also in a
    ``learn()`` that continues the timestep count.
    """
    model = small_ppo()
    callback = KLAdaptiveLRCallback(window_steps=32, trust_region=False)
    model.learn(16 * 4, callback=callback)
    assert len(callback.decisions) == 2
    model.learn(16 * 4, callback=callback, reset_num_timesteps=False)
    assert len(callback.history) == 4 and len(callback.decisions) == 2


# ----- which updates are measured -----


@pytest.mark.parametrize("n_steps, n_envs", [(8, 4), (4, 8), (32, 8), (128, 4)])
def test_a2c_style_updates_are_measured_once_per_measured_samples_whatever_the_envs(n_steps: int, n_envs: int) -> None:
    """
    Promise: A2C-style algorithms measure one update per ``MEASURED_SAMPLES`` collected samples (over all envs), and
    the first ``MEASURED_FIRST``; rollouts of that many samples or more: every update.
    """
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
    model = A2C("MlpPolicy", env, n_steps=n_steps, policy_kwargs=dict(SMALL), seed=0, device="cpu")
    callback = KLAdaptiveLRCallback(trust_region=False)
    updates = MEASURED_FIRST + 4
    model.learn(n_steps * n_envs * updates, callback=callback)
    every = max(1, math.ceil(MEASURED_SAMPLES / (n_steps * n_envs)))
    expected = sum(1 for update in range(updates) if update < MEASURED_FIRST or update % every == 0)
    assert len(callback.history) == expected


def test_an_a2c_update_kl_is_the_exact_kl_on_its_rollout() -> None:
    """Promise: the KL is analytic for every distribution family, A2C-style too (not an estimate from log-probs)."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=3e-3, policy_kwargs=dict(SMALL), seed=0, device="cpu")
    before: list[th.Tensor] = []

    class Before(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            observations = th.as_tensor(self.model.rollout_buffer.observations.reshape(-1, 4))
            with th.no_grad():
                probs = self.model.policy.get_distribution(observations).distribution.probs
            before[:] = [observations, probs]

    callback = KLAdaptiveLRCallback(tolerance=1e9, trust_region=False)  # measure only
    model.learn(8, callback=[Before(), callback])
    observations, old = before
    with th.no_grad():
        new = model.policy.get_distribution(observations).distribution.probs
    expected = (old * (old.log() - new.log())).sum(-1).mean().item()
    assert expected > 0 and callback.history[0][0] == pytest.approx(expected, rel=1e-4)


# ----- what it keeps across learn() -----


def test_what_to_snapshot_is_resolved_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Promise: resolving what an undo restores happens once per model, not per ``learn()`` of it; again for another
    model, after a policy is assigned, and when the trust region is turned on after a ``learn()`` without it.
    """
    resolved: list[Any] = []

    def counting(model: Any) -> WatchedModel:
        resolved.append(model)
        return WatchedModel(model)

    monkeypatch.setattr(adaptive_lr, "WatchedModel", counting)
    model = small_ppo()
    callback = KLAdaptiveLRCallback()
    model.learn(16, callback=callback)
    model.learn(16, callback=callback, reset_num_timesteps=False)
    assert resolved == [model]
    model.policy = small_ppo(seed=1).policy
    model.learn(16, callback=callback, reset_num_timesteps=False)
    other = small_ppo()
    other.learn(16, callback=callback)
    assert resolved == [model, model, other]
    adapt_only = KLAdaptiveLRCallback(trust_region=False)
    model.learn(16, callback=adapt_only)
    adapt_only.trust_region = True
    model.learn(16, callback=adapt_only, reset_num_timesteps=False)
    assert resolved == [model, model, other, model]


def test_the_adaptive_lr_option_keeps_the_callbacks_given_to_learn() -> None:
    """Promise: ``adaptive_lr=`` adds its callback to what ``learn()`` is given, which still runs."""
    model = KLAdaptivePPO(
        "MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, adaptive_lr={}, policy_kwargs=SMALL, seed=0, device="cpu"
    )
    counted = CountSteps()
    model.learn(32, callback=counted)
    assert counted.steps == 32
    model.learn(32, callback=[counted], reset_num_timesteps=False)
    assert counted.steps == 64
    model.learn(32)  # and nothing else without them
    assert model.num_timesteps == 32


@pytest.mark.parametrize(
    ("optimizer_class", "learning_rate", "highest"),
    [
        (th.optim.SGD, 0.3, 0.3),  # a plain-SGD rate above the kind's bound is the bound
        (th.optim.SGD, linear_schedule(0.05), 0.05),  # of a schedule, its start
        (th.optim.SGD, 1e-4, 1e-3),  # never below the kind's bound
        (th.optim.Adam, 0.3, 1e-3),  # Adam's step does not scale with the gradient: the kind's bound
        (th.optim.RMSprop, 0.3, 1e-3),
    ],
)
def test_the_default_upper_bound_is_the_configured_rate_for_plain_sgd(
    optimizer_class: type[th.optim.Optimizer], learning_rate: Any, highest: float
) -> None:
    """Promise: the kind's bounds (``raise_above_configured``) reach up to a plain-SGD configured rate."""
    model = small_ppo(learning_rate, policy_kwargs=dict(SMALL, optimizer_class=optimizer_class))
    callback = KLAdaptiveLRCallback(raise_above_configured=True)
    model.learn(16, callback=callback)
    assert callback.bounds == (adaptive_lr.LOWEST_LEARNING_RATE, highest)
    assert model.policy.optimizer.param_groups[0]["lr"] <= highest


def test_plain_sgd_trains_at_its_configured_rate_and_its_bound_stays_the_configured_one() -> None:
    model = small_ppo(0.05, policy_kwargs=dict(SMALL, optimizer_class=th.optim.SGD))
    callback = KLAdaptiveLRCallback(trust_region=False, raise_above_configured=True)
    model.learn(16, callback=callback)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    # The scale lowered (a guard's rollback, a decision): the bound is still the configured rate, not the scaled one
    scale_learning_rate(model, [model.policy.optimizer], 0.25)
    model.learn(16, callback=callback, reset_num_timesteps=False)
    assert callback.bounds == (adaptive_lr.LOWEST_LEARNING_RATE, 0.05)


def test_explicit_bounds_hold_for_plain_sgd_too() -> None:
    model = small_ppo(0.3, policy_kwargs=dict(SMALL, optimizer_class=th.optim.SGD))
    callback = KLAdaptiveLRCallback(lr_bounds=(1e-4, 2e-2))
    model.learn(16, callback=callback)
    assert callback.bounds == (1e-4, 2e-2)
    assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(2e-2)
