"""
The recommended stack as one supervisor (issue 36): the guard and the adaptive learning rate on one model judge each
update in one order, whatever order they are given in; each test reproduces one item of the issue's review, and
fails on the code before the supervisor (commit 8938b37).
"""

import math
import re
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from faults import NaNAfterOptimizerStep
from rl_zoo3.utils import linear_schedule
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import LinearSchedule

from sb3_safe import (
    KLAdaptiveLRCallback,
    KLAdaptivePPO,
    NonFiniteGuardCallback,
    NonFiniteGuardWarning,
    SafeA2C,
    SafeMlpPolicy,
    TrainingStalledError,
)
from sb3_safe.common.adaptive_lr import MEASURED_FIRST
from sb3_safe.common.guard.response import Response
from sb3_safe.common.guard.stall import logged_nonfinite_losses
from sb3_safe.common.schedules import current_learning_rate


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a log folder the guard writes its report to the current directory: keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


def parameters(model: BaseAlgorithm) -> dict[str, th.Tensor]:
    return {name: p.detach().clone() for name, p in model.policy.named_parameters()}


def equal(a: dict[str, th.Tensor], b: dict[str, th.Tensor]) -> bool:
    return a.keys() == b.keys() and all(th.equal(a[key], b[key]) for key in a)


class KeptStates(BaseCallback):
    """The parameters at each rollout start, after the sb3-safe callbacks before it judged the update."""

    def __init__(self) -> None:
        super().__init__()
        self.states: list[dict[str, th.Tensor]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        self.states.append(parameters(self.model))


def redo_every_update(**kwargs: Any) -> KLAdaptiveLRCallback:
    """Every update overshoots its target and is undone and redone once, at rates the bounds let fall."""
    return KLAdaptiveLRCallback(
        target_kl=1e-9, undo_above=2.0, max_redos=1, window_steps=10**9, lr_bounds=(1e-12, 1.0), **kwargs
    )


# ----- item 2: a redo when the schedule has reached 0 -----


def test_an_a2c_redo_after_a_rollback_at_the_end_of_a_decayed_schedule_does_not_divide_by_zero() -> None:
    """The last rollout ends past the budget (the schedule at 0), the guard rolls back a NaN of its last update to
    its healthy state of timestep 0, whose KL to the state before the update is large."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=32, learning_rate=linear_schedule(7e-4), seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    adaptive = KLAdaptiveLRCallback(undo_above=2.0)
    NaNAfterOptimizerStep(model.policy.optimizer, at=8, weight=model.policy.action_net.weight)  # the last update
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        model.learn(250, callback=[guard, adaptive])  # 8 updates, the last one past 250
    assert guard.n_rollbacks == 1 and model.num_timesteps == 256
    assert all(th.isfinite(p).all() for p in model.policy.parameters())


# ----- item 3: guard first, adaptive learning rate second (the order adaptive_lr= builds) -----


def test_a_rollback_after_a_redo_restores_the_kept_update_and_the_schedules_rate() -> None:
    """(a) the guard's healthy state is the redone update, never the undone one; (b) the rate after the rollback is
    the schedule's (its scale times lr_decay), not the optimizer's from before the redo's cut."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=4, learning_rate=5e-4, seed=0)
    kept = KeptStates()
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    restored: list[dict[str, th.Tensor]] = []
    rates_after: list[tuple[float, float]] = []
    rollback = Response._rollback

    def recording_rollback(response: Response) -> str:
        message = rollback(response)
        restored.append(parameters(model))
        rates_after.append((model.policy.optimizer.param_groups[0]["lr"], current_learning_rate(model)))
        return message

    NaNAfterOptimizerStep(model.policy.optimizer, at=4 * 4 + 4 * 3 + 2, weight=model.policy.action_net.weight)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        patch.setattr(Response, "_rollback", recording_rollback)
        model.learn(32 * 6, callback=[guard, redo_every_update(), kept])
    assert guard.n_rollbacks == 1 and len(restored) == 1
    # The NaN is in the 4th update (after 4 steps of each of 3 redone updates... the 1st, 2nd and 3rd kept ones)
    assert equal(restored[0], kept.states[3])
    optimizer_rate, scheduled_rate = rates_after[0]
    assert optimizer_rate == pytest.approx(scheduled_rate)


@pytest.mark.parametrize("first", ["guard", "adaptive"])
def test_a_stop_in_the_last_update_keeps_in_memory_the_model_it_saved(first: str, tmp_path: Any) -> None:
    """(c) The adaptive learning rate does not redo an update the guard stopped in: the model in memory equals the
    saved healthy.zip and the last kept state."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=2, learning_rate=5e-4, seed=0)
    kept = KeptStates()
    guard = NonFiniteGuardCallback(on_nonfinite="stop", save_path=str(tmp_path / "healthy.zip"))
    adaptive = redo_every_update()
    callbacks = [guard, adaptive] if first == "guard" else [adaptive, guard]
    NaNAfterOptimizerStep(model.policy.optimizer, at=2 * 2 * 3 + 1, weight=model.policy.action_net.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        model.learn(32 * 4, callback=[*callbacks, kept])  # the NaN in the 4th and last update
    assert guard.stop_reason is not None
    saved = PPO.load(tmp_path / "healthy.zip")
    assert equal(parameters(model), parameters(saved))
    assert equal(parameters(model), kept.states[-1])  # the 3rd update, as kept


# ----- item 4: an A2C-style redo after a rollback -----


@pytest.mark.parametrize("first", ["guard", "adaptive"])
def test_a_rollback_is_not_undone_by_a_redo_of_the_update_it_replaced(first: str) -> None:
    """The KL against the restored state is not an update's: nothing is redone, the rolled-back update ends at the
    restored state, and the rollback's lower rate holds (a redo's rule had set it back to half the rate before)."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=5e-3, seed=0)
    # The guard's healthy state is that of timestep 0 (a full check every 1,000 steps): far from the state before the
    # update it rolls back
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", lr_decay=0.1)
    adaptive = KLAdaptiveLRCallback(undo_above=2.0, window_steps=10**9)  # an update whose KL jumps is redone
    callbacks = [guard, adaptive] if first == "guard" else [adaptive, guard]
    kept = KeptStates()
    rates: list[float] = []

    class Rates(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:
            rates.append(current_learning_rate(self.model))

    NaNAfterOptimizerStep(model.policy.optimizer, at=8, weight=model.policy.action_net.weight)  # redone steps count
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        model.learn(8 * 10, callback=[*callbacks, kept, Rates()])
    assert guard.n_rollbacks == 1
    rolled_back = guard.events[0].timestep // 8  # rates[k], kept.states[k]: at the start of rollout k, after update k
    assert 2 <= rolled_back <= 8
    assert equal(kept.states[rolled_back], kept.states[0])  # the state of timestep 0, as the message says
    assert rates[rolled_back] <= rates[rolled_back - 1] * 0.1 * (1 + 1e-9)


# ----- items 6 and 7: a redo at the start of a rollout, a redo at the lower bound -----


def test_a_redo_leaves_the_next_rollout_in_evaluation_mode_with_gsde_noise_of_the_kept_policy() -> None:
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, use_sde=True, learning_rate=1e-3, seed=0)
    seen: list[tuple[bool, bool]] = []

    class FirstStep(BaseCallback):
        def _on_step(self) -> bool:
            if self.n_calls == 1 or self.model.num_timesteps % 32 == 1:
                policy = self.model.policy
                std = policy.action_dist.get_std(policy.log_std)
                seen.append((policy.training, th.equal(policy.action_dist.weights_dist.scale, std)))
            return True

    adaptive = redo_every_update()
    model.learn(32 * 4, callback=[adaptive, FirstStep()])
    assert adaptive.redone_updates == 3
    assert seen == [(False, True)] * 4


def test_a_redo_draws_the_next_rollouts_gsde_noise_for_every_env() -> None:
    """
    Promise: after a redo the next rollout is set up as SB3 sets it up, from the kept policy: gSDE's exploration noise
    drawn again with one exploration matrix per env (here 2), not one matrix shared by all of them.
    """
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, use_sde=True, learning_rate=1e-3, seed=0)
    seen: list[int] = []

    class FirstStep(BaseCallback):
        def _on_step(self) -> bool:
            if self.n_calls % 16 == 1:  # the first step of each rollout
                seen.append(len(self.model.policy.action_dist.exploration_matrices))
            return True

    adaptive = redo_every_update()
    model.learn(32 * 4, callback=[adaptive, FirstStep()])
    assert adaptive.redone_updates == 3
    assert seen == [2] * 4


def test_no_redo_at_the_lowest_learning_rate() -> None:
    """A redo at the lower bound would train again at the same rate (and say "at a lower lr")."""
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=1e-3, seed=0)
    adaptive = KLAdaptiveLRCallback(target_kl=1e-9, undo_above=2.0, lr_bounds=(1e-3, 1e-2), window_steps=10**9)
    model.learn(8 * 6, callback=adaptive)
    assert adaptive.redone_updates == 0 and len(adaptive.history) == 6


# ----- item 8: counters describe the kept updates; adaptive_lr= keeps one callback -----


def test_a_callback_given_another_model_measures_that_models_first_updates() -> None:
    """
    Promise: the first MEASURED_FIRST updates a callback sees of a model are all measured (a configured learning rate
    far too high is met at once), also when the callback trained another model before (its count starts again; a
    learn() that continues the same model counts on).
    """
    adaptive = KLAdaptiveLRCallback()
    A2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=0).learn(8 * 10, callback=adaptive)
    A2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=1).learn(8 * 10, callback=adaptive)
    # its first 8 updates measured, then one in 32 (256 samples / 8 per update): updates 9 and 10 are not
    assert len(adaptive.history) == MEASURED_FIRST == 8


class InfReturnAtRolloutEnd(BaseCallback):
    """Another callback's bug: an inf written into the rollout buffer's returns at the end of the ``at``-th rollout."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.rollouts = at, 0

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.rollouts += 1
        if self.rollouts == self.at:
            self.model.rollout_buffer.returns[1, 0] = np.inf


def test_an_update_a_guard_stopped_at_the_rollouts_end_is_not_one_of_the_first_measured() -> None:
    """
    Promise: when a guard stops training at a rollout's end (before the update), the adaptive learning rate takes no
    record of that update, which is never kept: it counts the updates the model kept (its ``_n_updates``), so a
    learn() that resumes the stopped model measures its first MEASURED_FIRST kept updates, not one fewer.
    """
    model = A2C("MlpPolicy", "CartPole-v1", n_steps=8, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", snapshot_every=8)  # the healthy state: after each update
    adaptive = KLAdaptiveLRCallback()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the guard's NonFiniteGuardWarning, numpy's on the inf
        model.learn(8 * 10, callback=[InfReturnAtRolloutEnd(at=3), guard, adaptive])
    assert guard.stop_reason is not None and guard.events[0].source == "rollout"
    assert model._n_updates == 2 and len(adaptive.history) == 2  # the 3rd update was stopped before it ran
    model.learn(8 * 10, callback=[guard, adaptive], reset_num_timesteps=False)  # 10 updates
    # the model's 3rd to 8th kept updates measured (then one per 256 samples, i.e. 32 updates): 9 and 10 are not
    assert model._n_updates == 12 and len(adaptive.history) == MEASURED_FIRST - 2


def test_a_redo_restores_the_update_and_skip_counters() -> None:
    model = SafeA2C("MlpPolicy", "CartPole-v1", n_steps=8, learning_rate=1e-3, seed=0)
    adaptive = redo_every_update()
    model.learn(8 * 12, callback=adaptive)
    assert adaptive.redone_updates == 8  # the first 8 updates are measured (then one per 256 samples)
    assert model._n_updates == 12 and model.guarded_step.n_taken == 12 and model.skipped_updates == 0


@pytest.mark.parametrize("algo", [SafeA2C, KLAdaptivePPO])
def test_adaptive_lr_option_keeps_one_callback_across_learn_calls(algo: type[BaseAlgorithm]) -> None:
    """A learn() that continues a model counts on: its first updates were measured in the first learn()."""
    kwargs = dict(n_steps=8) if algo is SafeA2C else dict(n_steps=16, batch_size=16)
    model = algo("MlpPolicy", "CartPole-v1", adaptive_lr=dict(trust_region=False), seed=0, **kwargs)
    model.learn(8 * 16)
    callback = model._adaptive_lr_callback[1]
    model.learn(8 * 17, reset_num_timesteps=False)
    assert model._adaptive_lr_callback[1] is callback
    if algo is SafeA2C:  # updates 16 to 32 of 8 samples: the 32nd is measured, the first 8 were in the first learn()
        assert len(callback.history) == 1


# ----- item 10: no negative learning rate or clip range past the end of a schedule -----


@pytest.mark.parametrize("algo", ["KLAdaptivePPO", "PPO+guard", "PPO+adaptive"])
def test_no_update_runs_at_a_negative_learning_rate_or_clip_range(algo: str) -> None:
    """rl-zoo's kl_ppo / ppo CartPole-v1 schedules (lin_) with a budget that is not a multiple of the rollout: SB3's
    progress is below 0 in the last update, where they are negative (the Quickstart's last update climbed the loss
    with an inverted clip). The guard and the adaptive lr read them at 0, and name each schedule once."""
    kwargs = dict(n_steps=32, batch_size=32, learning_rate=linear_schedule(1e-3), clip_range=linear_schedule(0.2), seed=0)
    seen: list[tuple[float, float]] = []

    class Recorder(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:
            values = self.logger.name_to_value
            if "train/clip_range" in values:
                seen.append((self.model.policy.optimizer.param_groups[0]["lr"], values["train/clip_range"]))

        def _on_training_end(self) -> None:
            self._on_rollout_start()

    if algo == "KLAdaptivePPO":
        model: BaseAlgorithm = KLAdaptivePPO("MlpPolicy", "CartPole-v1", **kwargs)
        callbacks: list[BaseCallback] = [NonFiniteGuardCallback(), Recorder()]
    else:
        model = PPO("MlpPolicy", "CartPole-v1", **kwargs)
        extra = NonFiniteGuardCallback() if algo == "PPO+guard" else KLAdaptiveLRCallback(trust_region=False)
        callbacks = [extra, Recorder()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * 4 - 5, callback=callbacks)  # the 4th rollout ends 5 steps past the budget
    assert model.num_timesteps == 128 and len(seen) == 4
    assert all(rate >= 0.0 and clip >= 0.0 for rate, clip in seen)
    assert seen[-1][1] == 0.0  # lin_0.2 at progress 0
    named = [w for w in caught if "past the budget" in str(w.message)]
    # sb3-safe's own algorithms read the progress at 0, and the adaptive lr's scaled schedule reads from 0 itself:
    # nothing to name there
    expected = {"KLAdaptivePPO": set(), "PPO+guard": {"PPO.lr_schedule", "PPO.clip_range"}, "PPO+adaptive": {"PPO.clip_range"}}
    assert [str(w.message).split()[0] for w in named] == sorted(expected[algo], reverse=True)


def test_a_schedule_that_ends_at_zero_is_not_named_past_the_end() -> None:
    """
    Promise: only a schedule that would turn negative past the end of the budget is named; one that reaches 0 and
    stays there (SB3's LinearSchedule to 0 before the end) is as right at progress < 0 as at 0: no warning.
    """
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=LinearSchedule(1e-3, 0.0, 0.5), seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * 4 - 5, callback=NonFiniteGuardCallback())  # the 4th rollout ends 5 steps past the budget
    assert model.num_timesteps == 128
    assert [str(w.message) for w in caught if "past the budget" in str(w.message)] == []


def test_the_schedules_read_from_zero_are_given_back_when_learn_ends() -> None:
    """
    Promise: the stand-ins that read a model's schedules at 0 past the end last only for the update that needs them:
    when learn() ends the model holds its own schedule objects again (what save() stores and a later learn() reads).
    """
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=linear_schedule(1e-3),
                clip_range=linear_schedule(0.2), seed=0)  # fmt: skip
    own = {name: getattr(model, name) for name in ("lr_schedule", "clip_range")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning that names them is the test above's
        model.learn(32 * 4 - 5, callback=NonFiniteGuardCallback())
    assert {name: getattr(model, name) for name in own} == own


def test_the_past_the_end_warning_names_the_value_the_schedule_gives_at_progress_0() -> None:
    """
    Promise: the warning that names a schedule read past the end says what it would have been (its value at SB3's
    progress below 0) and the value sb3-safe reads instead, the schedule's at progress 0 (here the end of a linear
    schedule that does not end at 0).
    """

    def schedule(progress: float) -> float:
        return 1e-3 * progress + 2e-5  # 2e-5 at the end of training, negative just past it

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=schedule, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * 4 - 5, callback=NonFiniteGuardCallback())  # the 4th rollout ends 5 steps past the budget
    [message] = [str(w.message) for w in caught if "past the budget" in str(w.message)]
    found = re.search(r"is (\S+) at progress (\S+): .* at progress 0 \((\S+)\) instead\.$", message)
    assert found is not None, message
    assert float(found[2]) == pytest.approx(1 - 128 / 123, rel=1e-3)
    assert float(found[1]) == pytest.approx(schedule(1 - 128 / 123), rel=1e-2)
    assert float(found[1]) < 0.0
    assert float(found[3]) == pytest.approx(schedule(0.0), rel=1e-2)


def test_the_past_the_end_warning_comes_from_one_place_whatever_the_order_of_the_callbacks() -> None:
    """
    Promise: the warning that names a schedule read past the end is issued from one code location whichever sb3-safe
    callback (the guard or the adaptive learning rate) delivers the rollout's end first, so that one warnings filter
    (by module or line, as Python's default once-per-location filter also counts) catches it for either order.
    """
    locations = []
    for guard_first in (True, False):
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, clip_range=linear_schedule(0.2), seed=0)
        guard, adaptive = NonFiniteGuardCallback(), KLAdaptiveLRCallback(trust_region=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.learn(32 * 4 - 5, callback=[guard, adaptive] if guard_first else [adaptive, guard])
        [warning] = [w for w in caught if "past the budget" in str(w.message)]
        locations.append((warning.filename, warning.lineno))
    assert locations[0] == locations[1]
    assert "sb3_safe" in locations[0][0]


def test_an_update_within_the_budget_reads_the_models_own_schedules() -> None:
    """
    Promise: sb3-safe stands in for a model's schedules only in an update read past the end of the budget (SB3's
    progress below 0); every other update, also the last one of a budget the rollouts end exactly at (progress 0),
    reads the model's own schedule objects, and nothing is named.
    """
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=linear_schedule(1e-3),
                clip_range=linear_schedule(0.2), seed=0)  # fmt: skip
    own = {name: getattr(model, name) for name in ("lr_schedule", "clip_range")}
    train, read = model.train, []

    def recording_train() -> None:
        read.append({name: getattr(model, name) is schedule for name, schedule in own.items()})
        train()

    model.train = recording_train  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(32 * 4, callback=NonFiniteGuardCallback())  # the 4th rollout ends at the budget
    assert model.num_timesteps == 128
    assert read == [{"lr_schedule": True, "clip_range": True}] * 4
    assert [str(w.message) for w in caught if "past the budget" in str(w.message)] == []


# ----- item 11: a run where nothing learns -----


def huge_reward_env(scale: float = 1e30) -> Any:
    return make_vec_env(
        "Pendulum-v1",
        n_envs=2,
        seed=0,
        wrapper_class=gym.wrappers.TransformReward,
        wrapper_kwargs=dict(func=lambda r: r * scale),
    )


def stalled_model(name: str) -> BaseAlgorithm:
    """A model whose critic is in the reward's units (the safe algorithms with ``normalize_value=False``)."""
    small = dict(net_arch=[16])
    raw = dict(policy_kwargs=small, seed=0, normalize_value=False)
    if name == "SafeA2C":
        return SafeA2C("MlpPolicy", huge_reward_env(), n_steps=8, **raw)
    if name == "SafeA2C-huber":
        return SafeA2C("MlpPolicy", huge_reward_env(), n_steps=8, value_loss="huber", **raw)
    if name == "KLAdaptivePPO":
        return KLAdaptivePPO("MlpPolicy", huge_reward_env(), n_steps=16, batch_size=32, **raw)
    return PPO(SafeMlpPolicy, huge_reward_env(), n_steps=16, batch_size=32, policy_kwargs=small, seed=0)


def test_a_stall_names_the_scale_of_the_observations() -> None:
    """
    Observations far from unit scale saturate the network's units, so that no gradient reaches the weights (the
    stress suite's MaskablePPO with observations x 1e11 stalls so): the stall message gives their largest magnitude
    and the fix, not only the rewards'.
    """

    def scaled(env: gym.Env) -> gym.Env:
        space = gym.spaces.Box(-np.inf, np.inf, shape=env.observation_space.shape, dtype=np.float32)
        return gym.wrappers.TransformObservation(env, lambda obs: (obs * 1e11).astype(np.float32), space)

    env = make_vec_env("CartPole-v1", n_envs=1, seed=0, wrapper_class=scaled)
    # Gradients clipped to nothing: the parameters never move, whatever the observations
    model = PPO(SafeMlpPolicy, env, n_steps=32, batch_size=32, max_grad_norm=0.0, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", stall_updates=4)
    model.learn(32 * 10, callback=guard)
    [event] = guard.events
    assert event.source == "stall"
    largest = re.search(r"largest \|observation\|: ([0-9.]+e[+-][0-9]+)", event.message)
    assert largest is not None and 1e9 < float(largest.group(1)) < 1e12
    assert "VecNormalize(norm_obs=True)" in event.message
    assert "safe policies with policy_kwargs=dict(normalize_observations='auto')" in event.message


@pytest.mark.parametrize("mode", ["raise", "stop", "rollback"])
@pytest.mark.parametrize("name", ["SafeA2C", "SafeA2C-huber", "KLAdaptivePPO", "PPO+SafeMlpPolicy"])
def test_rewards_times_1e30_stall_is_reported_once_within_10_updates_naming_the_cause(name: str, mode: str) -> None:
    """Every update skipped (or its loss infinite): no parameter turns NaN, so only the stall tells."""
    model = stalled_model(name)
    guard = NonFiniteGuardCallback(on_nonfinite=mode)
    rollout = model.n_steps * model.n_envs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if mode == "raise":
            with pytest.raises(TrainingStalledError) as raised:
                model.learn(rollout * 30, callback=guard)
            message = str(raised.value)
        else:
            model.learn(rollout * 30, callback=guard)
            message = guard.stop_reason or ""
    assert len(guard.events) == 1 and guard.events[0].source == "stall"
    # The 10th update's stall ends training at the first step of the next rollout
    assert model.num_timesteps <= rollout * 10 + model.n_envs
    assert "Training stalled" in message and "largest |return|" in message and "VecNormalize(norm_reward=True)" in message
    assert "normalize_value=True" in message
    assert ("skipped" in message) or ("train/value_loss" in message)
    guard_warnings = [w for w in caught if issubclass(w.category, NonFiniteGuardWarning)]
    assert len(guard_warnings) == (0 if mode == "raise" else 1)  # one message per fault
    if mode == "rollback":
        assert "a rollback cannot fix a stall" in message


def test_a_healthy_run_has_no_stall() -> None:
    model = SafeA2C("MlpPolicy", huge_reward_env(1.0), n_steps=8, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="raise")
    model.learn(8 * 2 * 40, callback=guard)
    assert guard.events == []


def test_parameters_unchanged_at_a_positive_learning_rate_are_a_stall() -> None:
    """Steps taken at a positive rate, a finite loss, but gradients clipped to nothing (max_grad_norm=0)."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, max_grad_norm=0.0, seed=0)
    guard = NonFiniteGuardCallback(on_nonfinite="stop", stall_updates=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteGuardWarning)
        model.learn(16 * 10, callback=guard)
    assert len(guard.events) == 1 and "did not change over the last 4 updates" in guard.events[0].message
    assert model.num_timesteps == 16 * 4 + 1  # seen after the 4th update: the 5th rollout ends at its first step


def test_stall_updates_is_checked() -> None:
    with pytest.raises(ValueError, match="stall_updates"):
        NonFiniteGuardCallback(stall_updates=0)


@pytest.mark.parametrize("number", [float, np.float64, np.float32, np.float16])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1.0])
def test_the_stall_watch_reads_a_loss_logged_as_any_float_type(number: type, value: float) -> None:
    """numpy's float32 / float16 are not Python floats: a non-finite loss logged as one still counts."""
    logger = configure(None, [])
    logger.record("train/value_loss", number(value))
    logger.record("train/learning_rate", number(math.nan))  # not a loss
    logger.record("rollout/ep_rew_mean", "inf")  # not a number
    found = logged_nonfinite_losses(logger)
    assert [loss.name for loss in found] == ([] if math.isfinite(value) else ["train/value_loss"])
