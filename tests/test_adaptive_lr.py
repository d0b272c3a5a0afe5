"""KLAdaptiveLRCallback: the rule, the rollout KL it adapts on, the trust region, and how it composes with the guard."""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from recorders import RecordLearningRate
from rl_zoo3.utils import linear_schedule
from sb3_contrib import TRPO, MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_safe import KLAdaptiveLRCallback, KLAdaptivePPO, NonFiniteGuardCallback, SafeA2C, SafeMlpPolicy
from sb3_safe.common.adaptive_lr import (
    LOWEST_LEARNING_RATE,
    MEASURED_FIRST,
    MEASURED_SAMPLES,
    PPO_STYLE,
    KLTargets,
    learning_rate_factor,
)
from sb3_safe.common.guard.snapshot import SnapshotStore
from sb3_safe.common.schedules import ScaledSchedule, current_learning_rate, learning_rate_scale


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the guard's report


# ----- the rule -----


def test_no_change_inside_the_tolerance_at_kl_zero_and_at_non_finite_kl() -> None:
    for kl in (0.01, 0.02, 0.04, 0.0, math.nan, math.inf, -1.0):
        assert learning_rate_factor(kl, target=0.02, tolerance=2.0, max_step=2.0) == 1.0


def test_step_meets_the_target_where_kl_grows_like_lr_squared() -> None:
    # KL 4x target: the learning rate that halves the policy change meets it, KL / 4
    assert learning_rate_factor(0.08 + 1e-12, 0.02, 2.0, 4.0) == pytest.approx(0.5)
    assert learning_rate_factor(0.002, 0.02, 2.0, 4.0) == pytest.approx(math.sqrt(10))
    # limited to max_step either way
    assert learning_rate_factor(1e-9, 0.02, 2.0, 2.0) == 2.0
    assert learning_rate_factor(1e3, 0.02, 2.0, 2.0) == 0.5


#: The defaults of each kind as docs/guide/adaptive_lr.md's table gives them (written out: the constants' values are
#: what is tested, not their names)
GUIDE_PPO_STYLE = KLTargets(target_kl=0.015, undo_above=6.0, highest_learning_rate=1e-3, raise_after=2, keep_redo_rate=True)
GUIDE_A2C_STYLE = KLTargets(target_kl=3e-3, undo_above=30.0, highest_learning_rate=1e-2, raise_after=1, keep_redo_rate=False)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16), GUIDE_PPO_STYLE),
        (lambda: A2C("MlpPolicy", "CartPole-v1", n_steps=8), GUIDE_A2C_STYLE),
        (lambda: SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8), GUIDE_A2C_STYLE),
        # KLAdaptivePPO's penalty and the learning rate aim at one target
        (
            lambda: KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, adaptive_kl_target=0.02),
            KLTargets(
                target_kl=0.02,
                undo_above=GUIDE_PPO_STYLE.undo_above,
                highest_learning_rate=GUIDE_PPO_STYLE.highest_learning_rate,
                raise_after=GUIDE_PPO_STYLE.raise_after,
                keep_redo_rate=GUIDE_PPO_STYLE.keep_redo_rate,
            ),
        ),
    ],
)
def test_defaults_follow_the_kind_of_algorithm_and_given_values_win(make: Any, expected: KLTargets) -> None:
    """
    Promise: a callback left at its defaults uses the values docs/guide/adaptive_lr.md's table gives for the kind of
    algorithm (PPO-style: many minibatch steps per update; A2C-style: one); values given to it win.
    """
    model = make()
    callback = KLAdaptiveLRCallback()
    model.learn(16, callback=callback)
    assert callback.targets == expected
    assert callback.bounds is None  # by default the configured rate is the highest, and nothing clamps it
    raising = KLAdaptiveLRCallback(raise_above_configured=True)  # the kind's bounds (opt-in)
    make().learn(16, callback=raising)
    assert raising.bounds == (LOWEST_LEARNING_RATE, expected.highest_learning_rate)
    # The guide's defaults of every kind
    settings = (callback.tolerance, callback.max_step, callback.window_steps, callback.max_redos, callback.trust_region)
    assert settings == (3.0, 2.0, 2048, 3, True)
    given = KLAdaptiveLRCallback(target_kl=0.5, undo_above=2.0, raise_after=3, lr_bounds=(1e-4, 0.1))
    make().learn(16, callback=given)
    assert given.targets == KLTargets(
        target_kl=0.5,
        undo_above=2.0,
        highest_learning_rate=expected.highest_learning_rate,
        raise_after=3,
        keep_redo_rate=expected.keep_redo_rate,
    )
    assert given.bounds == (1e-4, 0.1)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(target_kl=0.0), "target_kl"),
        (dict(target_kl="0.02"), "target_kl"),
        (dict(tolerance=1.0), "tolerance"),
        (dict(max_step=0.5), "max_step"),
        (dict(undo_above=True), "undo_above"),
        (dict(max_redos=-1), "max_redos"),
        (dict(window_steps=0), "window_steps"),
        (dict(raise_after=0), "raise_after"),
        (dict(raise_after=1.5), "raise_after"),
        (dict(lr_bounds=(1e-2, 1e-5)), "lr_bounds"),
        (dict(lr_bounds=(0.0, 1e-2)), "lr_bounds"),
        (dict(lr_bounds="small"), "lr_bounds"),
        (dict(raise_above_configured="yes"), "raise_above_configured"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        KLAdaptiveLRCallback(**kwargs)


@pytest.mark.parametrize(
    "make", [lambda: SAC("MlpPolicy", "Pendulum-v1"), lambda: TRPO("MlpPolicy", "Pendulum-v1", n_steps=64)]
)
def test_algorithms_without_gradient_steps_on_the_policy_are_refused(make: Any) -> None:
    with pytest.raises(TypeError, match=r"on-policy algorithms that take gradient steps .*got (SAC|TRPO)"):
        make().learn(64, callback=KLAdaptiveLRCallback())


# ----- the KL it adapts on -----


class RecordKL(BaseCallback):
    """The ``train/kl`` the callback logged at each update."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        value = self.logger.name_to_value.get("train/kl")
        if value is not None:
            self.values.append(value)


class AtRolloutEnd(BaseCallback):
    """``measure(model)`` at each rollout end, before the update."""

    def __init__(self, measure: Callable[[BaseAlgorithm], float]) -> None:
        super().__init__()
        self.measure = measure
        self.values: list[float] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.values.append(self.measure(self.model))


def models_at_zero_learning_rate() -> dict[str, BaseAlgorithm]:
    small = dict(net_arch=[16])
    return {
        "PPO-box": PPO(
            "MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), n_steps=32, batch_size=16, policy_kwargs=small
        ),
        "PPO-discrete": PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=32, batch_size=16),
        "PPO-gSDE": PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=16, use_sde=True, policy_kwargs=small),
        "A2C-safe-squashed": A2C(SafeMlpPolicy, "Pendulum-v1", policy_kwargs=dict(squash_output=True, net_arch=[16])),
        "KLAdaptivePPO": KLAdaptivePPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16),
        "SafeA2C": SafeA2C("MlpPolicy", make_vec_env("CartPole-v1", n_envs=3, seed=0)),
        "RecurrentPPO": RecurrentPPO(
            "MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=32, batch_size=16, policy_kwargs=small
        ),
        "MaskablePPO": MaskablePPO(
            "MlpPolicy", InvalidActionEnvDiscrete(dim=20, n_invalid_actions=10), n_steps=32, batch_size=16
        ),
    }


@pytest.mark.parametrize("name", list(models_at_zero_learning_rate()))
def test_kl_of_an_update_that_changes_nothing_is_zero(name: str) -> None:
    """Old and new distributions on the same observations in the same order: any mix-up would show as a KL > 0."""
    model = models_at_zero_learning_rate()[name]
    callback = KLAdaptiveLRCallback(lr_bounds=(1e-12, 1.0))
    record = RecordKL()
    for group in model.policy.optimizer.param_groups:
        group["lr"] = 0.0
    model.lr_schedule = ScaledSchedule(0.0, 1.0)
    model.learn(3 * model.n_steps * model.n_envs, callback=[callback, record])
    assert len(callback.history) == 3 and record.values
    assert all(kl == pytest.approx(0.0, abs=1e-6) for kl, _ in callback.history)


def test_a_decaying_schedule_runs_inside_the_bounds_and_the_saved_scale_is_what_the_decisions_chose() -> None:
    """rl-zoo's lin_7e-4 decays below the lower bound 1e-5 and is negative in the last rollout of a budget that is not a
    multiple of it (SB3's progress < 0). With the kind's bounds (``raise_above_configured``) every step runs inside
    them; the bound clamps the rate, never the scale: what is saved is what the KL decisions chose (issue 36, item 1:
    folded in, the clamp saved a scale of 28.6 where the decisions had chosen 6.6, and a second learn() trained above
    the upper bound)."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=5, learning_rate=linear_schedule(7e-4), seed=0)
    callback = KLAdaptiveLRCallback(trust_region=False, raise_above_configured=True)
    rates: list[float] = []
    model.learn(2_052, callback=[callback, RecordLearningRate(rates)])  # the last rollout ends at 2,055: progress < 0
    assert model._current_progress_remaining < 0  # SB3's, stock A2C: the callback read the schedule at 0
    low, high = callback.bounds
    assert len(rates) == 411 and all(low <= rate <= high for rate in rates)
    assert rates[-1] == pytest.approx(low)  # the schedule's tail, held at the bound
    chosen = math.prod(factor for _, factor in callback.decisions)
    assert learning_rate_scale(model) == pytest.approx(chosen)
    first = len(rates)  # (the first rate recorded is that of the last update before)
    model.learn(50, callback=[callback, RecordLearningRate(rates)])  # a new learn(): the schedule from its start
    progress = 1 - 5 / 50  # SB3 updates the progress before the first train()
    assert rates[first + 1] == pytest.approx(min(max(7e-4 * progress * learning_rate_scale(model), low), high))


def test_kl_after_a_real_update_matches_a_fresh_measurement() -> None:
    """The KL it logs is the mean KL between the policy before and after the update on the rollout."""
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=4, learning_rate=3e-3, seed=0)
    before: list[th.Tensor] = []

    class Before(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            buffer = self.model.rollout_buffer
            observations = th.as_tensor(buffer.observations.reshape(-1, 3))
            with th.no_grad():
                dist = self.model.policy.get_distribution(observations).distribution
            before[:] = [observations, dist.mean, dist.stddev]

    callback = KLAdaptiveLRCallback(tolerance=1e9, trust_region=False)  # measure only
    model.learn(64, callback=[Before(), callback])
    observations, mean, std = before
    with th.no_grad():
        new = model.policy.get_distribution(observations).distribution
    expected = th.distributions.kl_divergence(th.distributions.Normal(mean, std), new).sum(-1).mean().item()
    assert callback.history[0][0] == pytest.approx(expected, rel=1e-4) and expected > 0


# ----- adaptation, trust region, bounds -----


def test_learning_rate_far_too_high_starts_at_the_upper_bound_and_overshooting_updates_are_redone() -> None:
    """With the kind's bounds (opt-in ``raise_above_configured``), a configured rate above them starts at the upper one."""
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=128, batch_size=64, learning_rate=1.0, seed=0)
    # at 1e-2 this PPO's updates reach KL 0.005-0.03
    callback = KLAdaptiveLRCallback(target_kl=1e-3, raise_above_configured=True)
    model.learn(128 * 8, callback=callback)
    kls, learning_rates = zip(*callback.history, strict=True)
    low, high = LOWEST_LEARNING_RATE, PPO_STYLE.highest_learning_rate
    assert learning_rates[0] <= high  # the configured 1.0 never reached the optimizer
    assert all(low <= lr <= high for lr in learning_rates)
    assert callback.redone_updates > 0
    assert learning_rates[-1] < learning_rates[0]
    assert all(math.isfinite(kl) for kl in kls) and all(th.isfinite(p).all() for p in model.policy.parameters())


@pytest.mark.parametrize("raise_after", [1, 2, 3])
def test_a_raise_waits_for_raise_after_decisions_in_a_row_below_the_band(raise_after: int) -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, learning_rate=LOWEST_LEARNING_RATE, seed=0)
    # every KL far below; raising above the configured rate is opt-in
    callback = KLAdaptiveLRCallback(target_kl=0.5, raise_after=raise_after, window_steps=16, raise_above_configured=True)
    model.learn(16 * 6, callback=callback)
    factors = [factor for _, factor in callback.decisions]
    assert len(factors) == 6
    assert factors[: raise_after - 1] == [1.0] * (raise_after - 1) and all(f > 1.0 for f in factors[raise_after - 1 :])
    # each raise steps by the highest KL of its run of low decisions (the smallest factor)
    kls = [kl for kl, _ in callback.decisions]
    for i in range(raise_after - 1, 6):
        highest = max(kls[i - raise_after + 1 : i + 1])
        assert factors[i] == pytest.approx(learning_rate_factor(highest, 0.5, callback.tolerance, callback.max_step))


def test_a_lowering_acts_at_the_first_window_above_the_band() -> None:
    """Promise: a window whose KL is above the band lowers the learning rate at once (no waiting, unlike a raise)."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, learning_rate=1e-3, seed=0)
    # every KL far above the target, none undone; bounds the rate never reaches
    callback = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=1e12, raise_after=3, window_steps=16, lr_bounds=(1e-15, 1.0))
    model.learn(16 * 4, callback=callback)
    assert len(callback.decisions) == 4 and callback.redone_updates == 0
    for kl, factor in callback.decisions:
        assert factor < 1.0
        assert factor == pytest.approx(learning_rate_factor(kl, 1e-9, callback.tolerance, callback.max_step))


def test_a_raise_never_moves_the_scale_where_the_rate_is_held_at_the_upper_bound() -> None:
    """
    Promise: a decision moves the saved scale only as far as the rate in use can follow: a raise where the schedule
    lies above the upper bound (the rate in use is the bound) leaves the scale at 1, not lowered to the bound.
    """
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, learning_rate=0.1, seed=0)
    callback = KLAdaptiveLRCallback(target_kl=10.0, raise_after=1, window_steps=16, lr_bounds=(1e-5, 1e-3))
    model.learn(16 * 3, callback=callback)
    assert len(callback.decisions) == 3
    assert [factor for _, factor in callback.decisions] == [1.0, 1.0, 1.0]
    assert learning_rate_scale(model) == 1.0
    assert [learning_rate for _, learning_rate in callback.history] == [1e-3] * 3


@pytest.mark.parametrize("verbose", [0, 1])
def test_an_update_is_redone_up_to_max_redos_times_and_verbose_says_each(
    verbose: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Promise: an update still above ``undo_above`` x target after a redo is redone again, ``max_redos`` times at most."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, learning_rate=1e-3, seed=0)
    # a target no update meets, bounds the rate never reaches: every update redone max_redos times
    callback = KLAdaptiveLRCallback(
        target_kl=1e-30, undo_above=2.0, max_redos=3, window_steps=10**9, lr_bounds=(1e-30, 1.0), verbose=verbose
    )
    model.learn(16 * 2, callback=callback)
    assert callback.redone_updates == 3 * 2
    said = [line for line in capsys.readouterr().out.splitlines() if "update redone" in line]
    assert len(said) == (callback.redone_updates if verbose else 0)


def test_the_callback_changes_nothing_where_it_neither_redoes_nor_decides() -> None:
    """
    Promise: measuring is free of side effects: with no redo and no decision (a window longer than the run) training
    is the same as without the callback, gSDE's exploration noise included.
    """
    runs = []
    for callbacks in ([], [KLAdaptiveLRCallback(undo_above=1e12, window_steps=10**9, lr_bounds=(1e-12, 1.0))]):
        model = PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, use_sde=True, seed=0, device="cpu")
        model.learn(32 * 3, callback=callbacks)
        runs.append(th.nn.utils.parameters_to_vector(model.policy.parameters()).detach())
    assert th.equal(runs[0], runs[1])


def test_the_targets_of_a_kind_of_algorithm_are_constants() -> None:
    """Promise: the measured defaults (``KLTargets``) cannot be changed by accident through one callback's targets."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        PPO_STYLE.target_kl = 1.0  # type: ignore[misc]


def test_a_redone_update_is_the_kept_one_and_the_next_rollout_is_collected_normally() -> None:
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=16, learning_rate=5e-3, seed=0)
    callback = KLAdaptiveLRCallback(target_kl=1e-5, undo_above=2.0, max_redos=2)
    model.learn(16 * 10, callback=callback)
    assert callback.redone_updates > 0
    assert model.num_timesteps == 160 and model._n_updates == 10  # an undone update is not counted
    buffer = model.rollout_buffer
    assert buffer.full and np.isfinite(buffer.returns).all()


def test_a2c_style_updates_are_measured_on_schedule_and_first_ones() -> None:
    """Rollouts of 8 samples: one update in MEASURED_SAMPLES / 8 is measured, and the first MEASURED_FIRST updates the
    callback sees of a model; a learn() that continues the model continues the schedule."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=0)
    callback = KLAdaptiveLRCallback(trust_region=False)
    every = MEASURED_SAMPLES // 8
    model.learn(8 * (2 * every + 1), callback=callback)  # updates 0 to 2 x every
    assert len(callback.history) == MEASURED_FIRST + 2  # 0 to 7, every, 2 x every
    model.learn(8 * 2 * every, callback=callback, reset_num_timesteps=False)  # updates 2 x every + 1 to 4 x every
    assert len(callback.history) == 2  # 3 x every, 4 x every
    fresh = KLAdaptiveLRCallback(trust_region=False)
    model.learn(8 * MEASURED_FIRST, callback=fresh, reset_num_timesteps=False)
    assert len(fresh.history) == MEASURED_FIRST
    ppo = PPO("MlpPolicy", "CartPole-v1", n_steps=8, batch_size=8, n_epochs=1, seed=0)
    callback = KLAdaptiveLRCallback(trust_region=False)
    ppo.learn(8 * 12, callback=callback)
    assert len(callback.history) == 12  # PPO-style: every update


@pytest.mark.parametrize("replace_policy", [False, True])
@pytest.mark.parametrize("algorithm", [A2C, SafeA2C, PPO])
def test_an_undone_update_restores_the_state_before_it(
    algorithm: type[BaseAlgorithm], replace_policy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the redo starts from is the policy and optimizer state of the rollout end, also in a second learn() with
    the same callback, and there of a policy assigned in between (what to snapshot is resolved again)."""
    batch_size = dict(batch_size=16) if algorithm is PPO else {}
    model = algorithm("MlpPolicy", "CartPole-v1", n_steps=16, learning_rate=5e-3, seed=0, **batch_size)
    before: list[dict[str, th.Tensor]] = []
    restored: list[tuple[int, dict[str, th.Tensor]]] = []

    def state() -> dict[str, th.Tensor]:
        tensors = {f"param.{name}": p.detach().clone() for name, p in model.policy.named_parameters()}
        for i, entry in enumerate(model.policy.optimizer.state.values()):
            tensors.update({f"state.{i}.{key}": value.clone() for key, value in entry.items()})
        return tensors

    original_restore = SnapshotStore.restore

    def restore(store: SnapshotStore) -> None:
        original_restore(store)
        restored.append((len(before) - 1, state()))  # the update of the last rollout end

    monkeypatch.setattr(SnapshotStore, "restore", restore)
    # every update overshoots and is redone (bounds wide enough that the rate can always be lowered)
    callback = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, max_redos=1, window_steps=10**9, lr_bounds=(1e-12, 1.0))
    record = AtRolloutEnd(lambda _: before.append(state()) or 0.0)
    model.learn(16 * 3, callback=[record, callback])
    if replace_policy:
        model.policy = algorithm("MlpPolicy", "CartPole-v1", n_steps=16, learning_rate=5e-3, seed=1, **batch_size).policy
    model.learn(16 * 3, callback=[record, callback], reset_num_timesteps=False)
    assert len(restored) >= 2
    assert any(update >= 3 for update, _ in restored)
    for update, after_restore in restored:
        expected = before[update]
        assert after_restore.keys() == expected.keys()
        assert all(th.equal(after_restore[key], expected[key]) for key in expected)


@pytest.mark.parametrize("max_step", [2.0, 20.0])
@pytest.mark.parametrize("algorithm", [A2C, PPO])
def test_a_redo_cut_holds_for_the_next_updates_only_where_the_kind_keeps_it(
    algorithm: type[BaseAlgorithm], max_step: float
) -> None:
    batch_size = dict(batch_size=16) if algorithm is PPO else {}
    model = algorithm("MlpPolicy", "CartPole-v1", n_steps=16, learning_rate=5e-3, seed=0, **batch_size)
    # updates overshoot 2 x 1e-5 and are redone once; no decision on a window; bounds the rate never reaches
    callback = KLAdaptiveLRCallback(
        target_kl=1e-5, undo_above=2.0, max_redos=1, window_steps=10**9, lr_bounds=(1e-12, 1.0), max_step=max_step
    )
    rates = AtRolloutEnd(current_learning_rate)
    model.learn(16 * 5, callback=[callback, rates])
    starts = rates.values
    kept = [learning_rate for _, learning_rate in callback.history]
    assert len(kept) == len(starts) == 5 and callback.redone_updates >= 2
    keeps = callback.targets.keep_redo_rate
    assert keeps is (algorithm is PPO)
    for start, used, next_start in zip(starts, kept, starts[1:], strict=False):
        if used == start:  # not redone (or at the lower bound already): no change
            assert next_start == start
            continue
        assert used <= start * 0.5 * (1 + 1e-9)  # the redo's cut: by 2 at least
        # A2C-style: the rate before the redo divided by max_step, never below the redo's (max_step 20: a cut of at
        # least 0.1 lowers less than it)
        assert next_start == pytest.approx(used if keeps else max(used, start / max_step))


def test_learning_rate_scale_is_saved_with_the_model(tmp_path: Any) -> None:
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=1e-4, seed=0)
    model.learn(8 * 20, callback=KLAdaptiveLRCallback(target_kl=0.05, window_steps=8, raise_above_configured=True))
    scale = learning_rate_scale(model)
    assert scale > 1.0  # tiny KLs at 1e-4: raised
    model.save(tmp_path / "a2c")
    loaded = A2C.load(tmp_path / "a2c")
    assert loaded.learning_rate == 1e-4 and learning_rate_scale(loaded) == pytest.approx(scale)  # beside, not in it
    assert current_learning_rate(loaded) == pytest.approx(1e-4 * scale)


def test_a_guard_rollback_restores_at_most_the_healthy_learning_rate_then_lowers_it() -> None:
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=1e-5, seed=0)
    adaptive = KLAdaptiveLRCallback(target_kl=0.05, window_steps=32, raise_above_configured=True)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", lr_decay=0.5)
    scales_at = AtRolloutEnd(learning_rate_scale)
    # 10 epochs x 1 minibatch per update: the 45th optimizer step is in the 5th update
    NaNAfterOptimizerStep(model.policy.optimizer, at=45, weight=model.policy.action_net.weight)
    model.learn(32 * 8, callback=[scales_at, guard, adaptive])
    scales = scales_at.values
    assert guard.n_rollbacks == 1
    # The guard's snapshot is from the start of the failed update: the scale it had then, halved; the adaptation
    # after that update starts from there
    healthy_scale = scales[4]
    assert max(scales) > 1.0 and scales[5] <= healthy_scale * 0.5 * adaptive.max_step * (1 + 1e-9)
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


def test_lr_x100_on_pendulum_ends_finite_and_learning() -> None:
    """rl-zoo's Pendulum-v1 PPO settings (without gSDE, 2 envs) at 100 times its learning rate, 40k steps."""
    kwargs: dict[str, Any] = dict(
        n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, batch_size=64, clip_range=0.2, learning_rate=0.1, seed=0
    )
    results = {}
    for adaptive in (False, True):
        model = PPO(SafeMlpPolicy, make_vec_env("Pendulum-v1", n_envs=2, seed=0), **kwargs)
        callbacks: list[BaseCallback] = [NonFiniteGuardCallback(on_nonfinite="rollback")]
        if adaptive:
            callbacks.append(KLAdaptiveLRCallback())
        model.learn(40_960, callback=callbacks)
        assert all(th.isfinite(p).all() for p in model.policy.parameters())
        results[adaptive], _ = evaluate_policy(model, make_vec_env("Pendulum-v1", seed=1), n_eval_episodes=5)
    # Random actions: about -1,200; -1,454 without the callback. With it (issue 63: the configured rate is not clamped
    # before a KL is measured) the first update runs at 0.1 and is redone at 0.01, where the KL is in the band; later
    # windows cut it to 1.3e-3: measured -135 at 40k steps (starting at the old upper bound 1e-3 instead: -138)
    assert results[True] > -500 and results[True] > results[False] + 500


# ----- as an option of sb3-safe's algorithms -----


@pytest.mark.parametrize("algo", [KLAdaptivePPO, SafeA2C])
def test_adaptive_lr_option_adapts_every_learn_and_is_saved(algo: type, tmp_path: Any) -> None:
    kwargs = dict(n_steps=16, batch_size=16) if algo is KLAdaptivePPO else dict(n_steps=8)
    # far above these updates' KL: raised at every decision (raising above the configured rate is opt-in)
    settings = dict(target_kl=0.5, window_steps=8, raise_above_configured=True)
    # from the lowest rate, so that the first learn's raises (x2 per decision) stay under the upper bound
    model = algo("MlpPolicy", "CartPole-v1", learning_rate=LOWEST_LEARNING_RATE, adaptive_lr=settings, seed=0, **kwargs)
    model.learn(64)
    first = learning_rate_scale(model)
    assert first > 1.0
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=make_vec_env("CartPole-v1"))
    assert loaded.adaptive_lr == settings and learning_rate_scale(loaded) == pytest.approx(first)
    loaded.learn(64, reset_num_timesteps=False)  # a resumed run adapts on from the saved scale
    assert learning_rate_scale(loaded) > first


@pytest.mark.parametrize("settings", [dict(target_kl=-1.0), dict(no_such_argument=1), "0.03"])
def test_bad_adaptive_lr_option_fails_at_construction(settings: Any) -> None:
    with pytest.raises(ValueError, match="adaptive_lr"):
        SafeA2C("MlpPolicy", "CartPole-v1", adaptive_lr=settings)
