"""
Randomized fault injection: the guard and the adaptive learning rate as one supervisor of each update,
checked by invariants over scenarios generated from a seed, as Jepsen and Hypothesis's stateful tests check a system
rather than one case per bug.

A :class:`Scenario` draws from its seed an algorithm (PPO, A2C, KLAdaptivePPO, SafeA2C, MaskablePPO, RecurrentPPO;
SAC and DQN with the guard alone), the callbacks and their order (the guard, the adaptive learning rate, both in either
order, ``adaptive_lr=`` plus the guard), the guard's mode, the learning-rate schedule (constant, linear, linear with a
budget that ends past the schedule's end), 1 or 4 envs, VecNormalize or not, a fault and when it happens (NaN or inf
in a weight after an optimizer step, NaN in a gradient, NaN in an observation, a terminal observation or a reward; a
learning rate 100 times too high; rewards times 1e30; none) and whether the model is saved, loaded and continued
between its two ``learn()`` calls. Some scenarios aim (:data:`AIMS`): a weight or gradient fault inside an update the
adaptive learning rate redoes, in the update after a redo, in an update judged far from the guard's healthy copy,
in the last update of a ``learn()``; or the adaptive learning rate at the lower bound of its ``lr_bounds``, deciding
after every update on a target near the updates' KLs, redoing every update at a rate 100 times too high. After each
scenario, :func:`check` verifies, from what is recorded outside the callbacks (the rate each optimizer step runs at,
the states kept at each rollout start, what was restored, saved, logged, printed and is in memory) against the
contract the callbacks document (written out here: :data:`ADAPTIVE_DEFAULTS`, :data:`KIND_DEFAULTS`):

(i) every optimizer step runs at a learning rate >= 0, inside the adaptive learning rate's bounds where it has them,
else at most the configured rate (a schedule's value at that progress), every update at a clip range >= 0, a redo
below the rate of the update it redoes and not below the lowest rate, and under a KL target no update meets the
scale never rises; (ii) ``"stop"``: the model in memory equals the one saved, which is the guard's last healthy state,
a kept update, and loads and trains on; (iii) ``"rollback"``: the restored state is a kept update (one the supervisor
judged, never an undone one), the learning-rate scale after it is at most the healthy state's times ``lr_decay``, and
no redo follows a guard's restore in its update;
(iv) no non-finite value reaches an optimizer step or a torch distribution unreported (no exception escapes but the
guard's own in ``"raise"`` mode; a non-finite parameter or gradient at a step has a guard event at that timestep; the
model at every rollout start is finite); (v) one event and one message per fault (a warning per event that does not
raise, none when it raises), and a schedule read past the end of the budget named once, only where it would turn
negative, with the value read instead; (vi) a new ``learn()`` and a loaded model run the configured schedule times the
saved scale (inside the bounds where an adaptive learning rate set them), ``learning_rate`` stays the object
configured, and the model holds its own schedules after ``learn()`` (after an exception out of it, also the stand-ins
of an update past the end of the budget); (vii) the update and skip counts describe the kept updates (an update redone
counts once), the redo count is the number of redos, and under the aimed scenarios' KL target an update is redone;
(viii) every rollout collects with the policy in evaluation mode, as SB3 sets it up (also after a redo);
(ix) the adaptive learning rate judges the updates it documents (the first 8 of a model, then one per 256 samples
A2C-style, every one PPO-style), decides once ``window_steps`` have passed, redoes an update while its KL overshoots
``max_redos`` times or down to the lowest rate, and moves the rate only by a redo (PPO-style the next updates keep the
redo's rate, A2C-style the rate before it over ``max_step``) or a decision by the documented rule (no change inside
``[target / tolerance, target x tolerance]``, outside it ``sqrt(target / KL)`` limited to ``max_step``, a raise only
after ``raise_after`` windows in a row below, never below the lowest rate nor above the configured one or the upper
bound); (x) each judgement logs the factor it applied (``train/lr_factor``, the scale's) and the scale
(``train/lr_scale``), and at verbose 1 prints each change of the rate with the KL that decided it, at verbose 0
nothing; (xi) every setting outside its documented range is refused with a ``ValueError`` naming it, and the edges of
the ranges are accepted.

Whether these scenarios and invariants find the defects they exist for is measured by re-introducing them:
``python -m benchmarks run faults --mutants`` (:mod:`benchmarks.fault_mutants`).

Usage: ``python -m benchmarks run faults [--size tiny|quick|full]`` (full: 320 scenarios; resumable), or
``python -m benchmarks.faults 17`` to run and print one scenario. The test suite runs a fixed subset
(``tests/test_faults.py``).
"""

import contextlib
import dataclasses
import hashlib
import io
import math
import random
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3.common.utils import FloatSchedule

from benchmarks import reports, suite
from sb3_safe.common.schedules import (
    apply_learning_rate_scale,
    current_learning_rate,
    learning_rate_bounds,
    learning_rate_scale,
)

ON_POLICY = ("PPO", "A2C", "KLAdaptivePPO", "SafeA2C", "MaskablePPO", "RecurrentPPO")
OFF_POLICY = ("SAC", "DQN")
#: sb3-safe's algorithms, which take ``adaptive_lr=``
WITH_OPTION = ("KLAdaptivePPO", "SafeA2C")
CALLBACKS = ("guard", "adaptive", "guard+adaptive", "adaptive+guard", "option+guard")
MODES = ("raise", "stop", "rollback")
#: What a scenario aims at: ``random`` draws everything; the others place a fault where the supervisor's defects show
#: (:data:`AIM_WEIGHTS`): inside an update the adaptive lr redoes (``fault_in_redo``), in the update after a redo,
#: whose rollback or stop restores the healthy copy of the redone one (``after_redo``), in an update the adaptive lr
#: then judges, far from the healthy copy (``after_rollback``: the guard's full check rarely runs), in the last update
#: of a ``learn()`` (``last_update``); ``at_floor`` runs the adaptive lr at the lower bound of its ``lr_bounds`` on a
#: decaying schedule, with a KL target no update meets (no redo can lower the rate, no decision may raise it);
#: ``decisions`` makes it decide after every update, on a target near these updates' KLs (in its band, above, below;
#: bounds or none); ``deep_redo`` runs it at a configured rate 100 times too high under a target no update meets (every
#: measured update redone as often as allowed, down to the lowest rate)
AIMS = ("random", "fault_in_redo", "after_redo", "after_rollback", "last_update", "at_floor", "decisions", "deep_redo")
#: Weights over the first six :data:`AIMS`, such that the test suite's fixed seeds draw each aim; a random scenario
#: with the adaptive lr and no fault of its own (none, or a rate 100 times too high) aims at the adaptive lr's rule
#: instead (``decisions``, ``deep_redo``)
AIM_WEIGHTS = (0.45, 0.12, 0.12, 0.12, 0.1, 0.09)
SCHEDULES = ("constant", "linear", "past_end")
#: Faults injected once (the others, lr_x100 and rewards_1e30, act all along)
ONCE = ("nan_weight", "inf_weight", "nan_grad", "nan_obs", "nan_terminal_obs", "nan_reward")
FAULTS = (*ONCE, "lr_x100", "rewards_1e30", "none")
#: Faults in the environment's data (the guard stops: they cannot be rolled back)
ENVIRONMENT_FAULTS = ("nan_obs", "nan_terminal_obs", "nan_reward")
LEARNING_RATE = {"PPO": 1e-3, "KLAdaptivePPO": 1e-3, "MaskablePPO": 1e-3, "RecurrentPPO": 1e-3, "A2C": 2e-3,
                 "SafeA2C": 2e-3, "SAC": 1e-3, "DQN": 1e-3}  # fmt: skip
INVARIANTS = ("i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x", "xi")
#: The adaptive lr's contract as documented (:class:`~sb3_safe.KLAdaptiveLRCallback`'s docstring,
#: ``docs/guide/adaptive_lr.md``), written out here so that the invariants do not read it from the code they check:
#: its defaults; per kind (A2C-style: A2C, SafeA2C) the target, undo threshold, raises after how many low decisions,
#: upper bound of ``raise_above_configured``; the lowest rate a cut goes to; the updates measured (the first 8 a
#: callback sees of a model, then one per 256 collected samples)
ADAPTIVE_DEFAULTS: dict[str, Any] = dict(tolerance=3.0, max_step=2.0, max_redos=3, window_steps=2048, verbose=0)
KIND_DEFAULTS = {False: dict(target_kl=0.015, undo_above=6.0, raise_after=2, highest=1e-3),
                 True: dict(target_kl=3e-3, undo_above=30.0, raise_after=1, highest=1e-2)}  # fmt: skip
LOWEST_RATE, MEASURED_FIRST, MEASURED_SAMPLES = 1e-5, 8, 256
#: The median KL of an update at the configured rate in these scenarios (PPO-style, A2C-style): where the
#: ``decisions`` scenarios place their target
TYPICAL_KL = {False: 1e-5, True: 1e-3}
#: The schedules SB3's on-policy algorithms read at each update
SB3_SCHEDULES = ("lr_schedule", "clip_range", "clip_range_vf")
#: What the warning that names a schedule read past the end of the budget says
PAST_END = re.compile(
    r"^\S+\.(\S+) .* is (\S+) at progress (\S+): the last rollout ends at timestep (\d+), past the budget (\d+)"
    r".* reads it at progress 0 \((\S+)\) instead\.$",
    re.DOTALL,
)


@dataclass(frozen=True)
class Scenario:
    """One scenario, drawn by :meth:`draw` from its seed."""

    seed: int
    algo: str
    callbacks: str
    mode: str
    schedule: str
    n_envs: int
    discrete: bool
    normalize: bool
    fault: str
    #: the optimizer step (weight and gradient faults) or environment step (environment faults) it happens at
    fault_at: int
    save_load: bool
    aggressive_lr: bool
    lr_decay: float
    snapshot_every: int | None
    #: one of :data:`AIMS` (the fault's timing and the adaptive lr's settings follow from it)
    aim: str = "random"
    #: the adaptive lr's ``verbose``: 1 prints each change of the rate, 0 nothing
    verbose: int = 0

    @classmethod
    def draw(cls, seed: int) -> "Scenario":
        """The scenario of ``seed``."""
        # The kind and verbose from generators of their own: a random scenario of a seed stays the one it was before
        aim = random.Random(f"kind {seed}").choices(AIMS[: len(AIM_WEIGHTS)], AIM_WEIGHTS)[0]
        scenario = cls._draw_random(seed) if aim == "random" else cls._draw_aimed(seed, aim)
        if aim == "random" and scenario.adaptive and scenario.fault in ("none", "lr_x100"):
            scenario = cls._draw_aimed(seed, "decisions" if scenario.fault == "none" else "deep_redo")
        verbose = random.Random(f"verbose {seed}").choice([0, 1]) if scenario.adaptive else 0
        return dataclasses.replace(scenario, verbose=verbose)

    @classmethod
    def _draw_random(cls, seed: int) -> "Scenario":
        """A scenario of the kind ``random``."""
        rng = random.Random(seed)
        algo = rng.choice(ON_POLICY + OFF_POLICY)
        if algo in OFF_POLICY:
            callbacks = "guard"
        else:
            callbacks = rng.choice([c for c in CALLBACKS if c != "option+guard" or algo in WITH_OPTION])
        guarded = "guard" in callbacks
        faults = [f for f in FAULTS if algo in ON_POLICY or f not in ("lr_x100", "rewards_1e30")]
        # Without a guard, nothing reports a non-finite value: only the faults that make none by themselves
        fault = rng.choice(faults) if guarded else rng.choice(["none", "none", "lr_x100"])
        if algo == "MaskablePPO" and fault in ("nan_obs", "nan_terminal_obs"):
            fault = "nan_reward"  # its observations are integers (a Discrete space): a NaN cannot be one
        discrete = algo in ("DQN", "MaskablePPO") or (algo != "SAC" and rng.random() < 0.4)
        scenario = cls(
            seed=seed,
            algo=algo,
            callbacks=callbacks,
            mode=rng.choice(MODES),
            schedule=rng.choice(SCHEDULES),
            n_envs=rng.choice([1, 4]) if algo != "SAC" else 1,
            discrete=discrete,
            normalize=algo in ON_POLICY and not discrete and rng.random() < 0.3,
            fault=fault,
            fault_at=0,
            save_load=rng.random() < 0.4,
            aggressive_lr=rng.random() < 0.5,
            lr_decay=rng.choice([0.5, 0.1]),
            snapshot_every=rng.choice([None, None, 16]),
        )
        # Within the scenario's two learn() calls: its env steps, or its optimizer steps (one per A2C update, four per
        # PPO update, one per four env steps of the off-policy ones once they learn)
        first, second = budgets(scenario)
        if fault in ENVIRONMENT_FAULTS:
            last = first + second
        else:
            last = {"A2C": 10, "SafeA2C": 10, "SAC": 20, "DQN": 20}.get(algo, 40)
        return dataclasses.replace(scenario, fault_at=rng.randint(2, last))

    @classmethod
    def _draw_aimed(cls, seed: int, aim: str) -> "Scenario":
        """A scenario of one of the aimed kinds: the adaptive lr and the guard on an on-policy algorithm."""
        rng = random.Random(seed)
        algo = rng.choice(ON_POLICY)
        with_guard = ["guard+adaptive", "adaptive+guard", *(["option+guard"] if algo in WITH_OPTION else [])]
        if aim in ("at_floor", "decisions", "deep_redo"):
            callbacks, mode, fault_at = rng.choice(["adaptive", *with_guard]), rng.choice(MODES), 0
            fault = "lr_x100" if aim == "deep_redo" else "none"
        else:
            callbacks = rng.choice(with_guard)
            # raise ends the run at the fault: nothing is restored, nothing could be redone after it
            mode = rng.choice(["stop", "rollback"]) if aim != "last_update" else rng.choice(["stop", "stop", "rollback"])
            fault = rng.choice(["nan_weight", "inf_weight", "nan_grad"])
            # the how-manieth optimizer step inside redos (counted over all of them), after a redo, of the last update;
            # outside redos
            steps = 1 if algo in ("A2C", "SafeA2C") else 4
            last = {"fault_in_redo": 2 * steps, "after_rollback": 5 * steps}.get(aim, steps)
            fault_at = rng.randint(2 * steps + 1 if aim == "after_rollback" else 1, last)
        discrete = algo == "MaskablePPO" or rng.random() < 0.4
        return cls(
            seed=seed,
            algo=algo,
            callbacks=callbacks,
            mode=mode,
            schedule="linear" if aim == "at_floor" else rng.choice(SCHEDULES),
            n_envs=rng.choice([1, 4]),
            discrete=discrete,
            normalize=not discrete and rng.random() < 0.3,
            fault=fault,
            fault_at=fault_at,
            save_load=rng.random() < 0.5,
            aggressive_lr=True,
            lr_decay=rng.choice([0.5, 0.1]),
            # (a full check every 10**6 steps: the healthy copy is the learn()'s first state, far from later updates)
            snapshot_every={"after_rollback": 10**6, "fault_in_redo": rng.choice([None, 10**6])}.get(
                aim, rng.choice([None, None, 16])
            ),
            aim=aim,
        )

    @property
    def adaptive(self) -> bool:
        return "adaptive" in self.callbacks or "option" in self.callbacks

    @property
    def guarded(self) -> bool:
        return "guard" in self.callbacks


# ----- the environment and its faults -----


class EnvFault(gym.Wrapper):
    """
    NaN in the observation, the terminal observation (the episode is cut there) or the reward of one env step,
    counted over all the envs of a VecEnv (they share ``counter``, whose second entry says whether it fired).
    """

    def __init__(self, env: gym.Env, kind: str, at: int, counter: list[int]) -> None:
        super().__init__(env)
        self.kind, self.at, self.counter = kind, at, counter

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.counter[0] += 1
        if self.counter[0] == self.at:
            self.counter[1] = 1
            obs = np.array(obs, dtype=np.float32)
            if self.kind == "nan_reward":
                reward = math.nan
            else:
                obs.flat[0] = math.nan
                truncated = truncated or self.kind == "nan_terminal_obs"
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        return self.env.get_wrapper_attr("action_masks")()


class ScaleReward(gym.RewardWrapper):
    def __init__(self, env: gym.Env, scale: float) -> None:
        super().__init__(env)
        self.scale = scale

    def reward(self, reward: float) -> float:
        return reward * self.scale


def make_env(scenario: Scenario, counter: list[int]) -> Any:
    """
    The scenario's vectorized environment, with its fault (one per scenario: the envs share ``counter``, [steps,
    fired]).
    """
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    def wrap(env: gym.Env) -> gym.Env:
        if scenario.fault in ENVIRONMENT_FAULTS:
            env = EnvFault(env, scenario.fault, scenario.fault_at, counter)
        if scenario.fault == "rewards_1e30":
            env = ScaleReward(env, 1e30)
        return env

    if scenario.algo == "MaskablePPO":
        env_id: Any = lambda: InvalidActionEnvDiscrete(dim=10, n_invalid_actions=4)  # noqa: E731
    else:
        env_id = "CartPole-v1" if scenario.discrete else "Pendulum-v1"
    env = make_vec_env(env_id, n_envs=scenario.n_envs, seed=scenario.seed, wrapper_class=wrap)
    return VecNormalize(env) if scenario.normalize else env


# ----- the model -----


def configured_schedule(scenario: Scenario) -> Callable[[float], float]:
    """The learning-rate schedule the scenario configures (before any scaling)."""
    from rl_zoo3.utils import linear_schedule

    rate = LEARNING_RATE[scenario.algo] * (100.0 if scenario.fault == "lr_x100" else 1.0)
    if scenario.schedule == "constant":
        return lambda _: rate
    return linear_schedule(rate)


def rollout_size(scenario: Scenario) -> int:
    """Environment steps per update (on-policy) or per ``train_freq`` (off-policy)."""
    if scenario.algo in OFF_POLICY:
        return 4
    if scenario.algo in ("A2C", "SafeA2C"):
        return 8 * scenario.n_envs
    return 16 * scenario.n_envs


def build(scenario: Scenario, env: Any) -> Any:
    """The scenario's model (tiny networks, CPU)."""
    from sb3_contrib import MaskablePPO, RecurrentPPO
    from stable_baselines3 import A2C, DQN, PPO, SAC

    from sb3_safe import KLAdaptivePPO, SafeA2C, SafeMaskableMlpPolicy, SafeMlpLstmPolicy, SafeMlpPolicy

    common: dict[str, Any] = dict(learning_rate=configured_schedule(scenario), seed=scenario.seed, device="cpu", verbose=0)
    small = dict(net_arch=[16])
    algo = scenario.algo
    if algo in OFF_POLICY:
        cls: Any = SAC if algo == "SAC" else DQN
        return cls("MlpPolicy", env, learning_starts=16, batch_size=16, train_freq=4, policy_kwargs=small, **common)
    n_steps = rollout_size(scenario) // scenario.n_envs
    if algo in ("A2C", "SafeA2C"):
        kwargs: dict[str, Any] = dict(n_steps=n_steps)
    else:
        kwargs = dict(n_steps=n_steps, batch_size=rollout_size(scenario) // 2, n_epochs=2)
    if algo in WITH_OPTION and scenario.callbacks == "option+guard":
        kwargs["adaptive_lr"] = adaptive_lr_settings(scenario)
    if algo == "KLAdaptivePPO":
        return KLAdaptivePPO("MlpPolicy", env, policy_kwargs=small, **kwargs, **common)
    if algo == "SafeA2C":
        return SafeA2C("MlpPolicy", env, policy_kwargs=small, **kwargs, **common)
    policy: Any = {"PPO": SafeMlpPolicy, "A2C": SafeMlpPolicy, "MaskablePPO": SafeMaskableMlpPolicy}.get(algo)
    if algo == "RecurrentPPO":
        policy, small = SafeMlpLstmPolicy, dict(net_arch=[16], lstm_hidden_size=16)
    if scenario.seed % 3 == 0 and algo in ("PPO", "A2C"):
        policy = "MlpPolicy"  # stock policies too
    cls = {"PPO": PPO, "A2C": A2C, "MaskablePPO": MaskablePPO, "RecurrentPPO": RecurrentPPO}[algo]
    return cls(policy, env, policy_kwargs=small, **kwargs, **common)


def adaptive_lr_settings(scenario: Scenario) -> dict[str, Any]:
    """The adaptive learning rate's arguments (and ``verbose``): its defaults, or a target that makes it act often."""
    rng = random.Random(f"settings {scenario.seed}")
    rate = LEARNING_RATE[scenario.algo]
    settings: dict[str, Any] = {}
    if scenario.aim == "at_floor":
        # The configured rate is the lower bound: no redo can lower it, and every decision is a lowering
        settings = dict(target_kl=1e-9, undo_above=2.0, lr_bounds=(rate, 10 * rate), window_steps=rollout_size(scenario))
    elif scenario.aim == "decisions":
        # A decision after every update, on a target within a factor 10 of the updates' KLs: windows in the band,
        # above and below it; no bounds (the default), bounds around the configured rate, or the kind's
        target = TYPICAL_KL[scenario.algo in ("A2C", "SafeA2C")] * 10 ** rng.uniform(-1.0, 1.0)
        bounds: dict[str, Any] = rng.choice([{}, {}, dict(lr_bounds=(rate / 20, 10 * rate)), {"raise_above_configured": True}])
        settings = dict(target_kl=target, window_steps=rollout_size(scenario), **bounds)
    elif scenario.aim == "deep_redo":
        # Every measured update overshoots at every rate: redone max_redos times, or down to the lowest rate
        settings = dict(target_kl=1e-9, window_steps=10**9, **({"raise_above_configured": True} if rng.random() < 0.5 else {}))
    elif scenario.aim != "random":
        # The first updates overshoot and are redone at a lower rate, which holds (no window decision raises it)
        settings = dict(target_kl=1e-6, undo_above=2.0, window_steps=10**9)
    elif scenario.aggressive_lr:
        settings = dict(target_kl=1e-4, undo_above=2.0, window_steps=32)
    return {**settings, **({"verbose": 1} if scenario.verbose else {})}


@dataclass(frozen=True)
class Contract:
    """What the adaptive lr of a scenario promises, from its settings and the documented defaults."""

    target: float
    tolerance: float
    max_step: float
    undo_above: float
    raise_after: int
    max_redos: int
    window_steps: int
    verbose: int
    #: the bounds the rate each step uses is clamped into, or None (never above the configured rate)
    bounds: tuple[float, float] | None
    #: one update in this many measured after the first MEASURED_FIRST
    every: int


def contract(scenario: Scenario, model: Any) -> Contract:
    """The adaptive lr's contract in ``scenario`` on ``model`` (:data:`ADAPTIVE_DEFAULTS`, :data:`KIND_DEFAULTS`)."""
    one_step = scenario.algo in ("A2C", "SafeA2C")
    kind = KIND_DEFAULTS[one_step]
    settings = {**ADAPTIVE_DEFAULTS, **kind, **adaptive_lr_settings(scenario)}
    if "target_kl" not in adaptive_lr_settings(scenario) and scenario.algo == "KLAdaptivePPO":
        settings["target_kl"] = model.adaptive_kl_target  # its penalty's target: the two controllers agree
    bounds = settings.get("lr_bounds")
    if bounds is None and settings.get("raise_above_configured"):
        bounds = (LOWEST_RATE, kind["highest"])  # (Adam and RMSprop: the kind's upper bound as it is)
    size = rollout_size(scenario)
    return Contract(
        target=settings["target_kl"],
        tolerance=settings["tolerance"],
        max_step=settings["max_step"],
        undo_above=settings["undo_above"],
        raise_after=settings["raise_after"],
        max_redos=settings["max_redos"],
        window_steps=settings["window_steps"],
        verbose=settings["verbose"],
        bounds=None if bounds is None else (float(bounds[0]), float(bounds[1])),
        every=max(1, math.ceil(MEASURED_SAMPLES / size)) if one_step else 1,
    )


# ----- instrumentation -----


def state_hash(model: Any) -> str:
    """A hash of the model's parameters (what a kept or a restored state is compared by)."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in model.policy.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def parameters_finite(model: Any) -> bool:
    return all(bool(th.isfinite(p).all()) for p in model.policy.parameters())


#: What the adaptive lr logs when it judges an update
JUDGEMENT_KEYS = ("train/kl", "train/kl_window", "train/lr_factor", "train/lr_scale")


@dataclass
class Judged:
    """One update of a model with the adaptive lr, seen from outside it: before the update, after its judgement."""

    #: the how-manieth update of this model the adaptive lr saw (from 0); the timestep; the timestep its learn() began
    index: int
    timestep: int
    learn_start: int
    #: the learning-rate scale before the update and after its judgement
    scale_before: float
    #: whether the parameters were finite before the update
    finite: bool
    scale_after: float = 1.0
    #: SB3's progress remaining during the update
    progress: float = 1.0
    #: the learning rate of the update's first and last optimizer steps (None: no step)
    first_rate: float | None = None
    last_rate: float | None = None
    redos: int = 0
    #: whether a guard restored a state (a rollback, a stop) since the judgement before
    restored: bool = False
    #: what the judgement logged (:data:`JUDGEMENT_KEYS`) and printed
    logged: dict[str, float] = field(default_factory=dict)
    printed: list[str] = field(default_factory=list)


@dataclass
class Record:
    """What the instruments saw during a scenario."""

    #: (timestep, learning rate, the adaptive lr's bounds or None, SB3's progress remaining, the rate of the update a
    #: redo redoes or None) at every optimizer step
    steps: list[tuple[int, float, tuple[float, float] | None, float, float | None]] = field(default_factory=list)
    #: timesteps at which an optimizer step saw a non-finite parameter or gradient
    nonfinite_at_step: list[int] = field(default_factory=list)
    clip_ranges: list[float] = field(default_factory=list)
    #: hashes of the states the supervisor kept (at every rollout start, at every learn()'s start)
    kept: set[str] = field(default_factory=set)
    #: (restored hash, was it kept then, scale after, healthy scale, lr_decay, optimizer's rate, schedule's rate) per
    #: rollback
    rollbacks: list[tuple[str, bool, float, float, float, float, float]] = field(default_factory=list)
    nonfinite_at_rollout_start: int = 0
    #: what the update after a rollback was judged to keep, against the rollback (see Probe.after_judgement)
    after_rollback: list[str] = field(default_factory=list)
    #: (n_updates, skip steps taken + skipped) at every rollout start, and whether a rollback came before it
    counters: list[tuple[int, int | None, bool]] = field(default_factory=list)
    redo_calls: int = 0
    fault_fired_at: list[int] = field(default_factory=list)
    warnings: int = 0
    #: (restored hash, was it kept then) per stop that restored a healthy state
    stops: list[tuple[str, bool]] = field(default_factory=list)
    #: redos of an update a guard had restored a state in (a rollback or a stop replaces the update)
    redone_after_restore: list[str] = field(default_factory=list)
    #: redo steps at a learning rate not below the update they redo
    redo_rates: list[str] = field(default_factory=list)
    #: the learning-rate scale after each judged update
    scales: list[float] = field(default_factory=list)
    #: rollouts whose first step ran with the policy in training mode (SB3 collects in evaluation mode)
    rollouts_in_training_mode: int = 0
    #: the warnings that name a schedule read past the end of the budget, one list per model object
    past_end_warnings: list[list[str]] = field(default_factory=list)
    #: the schedules a model held after a learn() that were not its own (a stand-in left in place), and whether the
    #: learn()'s last update ran past the end of its budget (the only update the supervisor puts stand-ins in for)
    stand_ins_left: list[tuple[str, bool]] = field(default_factory=list)
    #: the adaptive lr's contract in the scenario (None: no adaptive lr), and each update it saw
    contract: Contract | None = None
    judgements: list[Judged] = field(default_factory=list)
    #: the lines the adaptive lr printed
    printed: list[str] = field(default_factory=list)
    #: settings outside their documented ranges accepted, or inside them refused
    settings: list[str] = field(default_factory=list)
    #: whether the model's learning_rate is still the object the scenario configured (None: not checked)
    learning_rate_kept: bool | None = None


class Probe:
    """
    The instruments of one scenario: optimizer hooks (the rate and finiteness at each step, the weight and gradient
    faults) and a callback placed after the sb3-safe callbacks (the kept states, counters, clip ranges).
    """

    def __init__(self, scenario: Scenario, record: Record) -> None:
        self.scenario, self.record = scenario, record
        self.model: Any = None
        self.adaptive: Any = None
        self.steps = 0
        self.rolled_back = False
        #: the last rollback's restored state and its scale (nothing raises it in the update the rollback replaced)
        self.last_rollback: tuple[str, float] | None = None
        #: the learning rate of the last optimizer step
        self.last_rate = 0.0
        #: inside a redo: the rate of the steps it redoes (its steps must run below it)
        self.redoing_from: float | None = None
        #: optimizer steps inside redos, outside them, since the last redo ended (None: no redo yet), in the last
        #: rollout's update
        self.redo_steps, self.attempt_steps, self.steps_after_redo, self.last_update_steps = 0, 0, None, 0
        self.fired = False
        #: whether a guard restored a state since the last rollout end
        self.restored_in_update = False
        self.first_step_of_rollout = False
        #: the adaptive lr's contract on the model; its updates of the model so far; the one being judged
        self.contract: Contract | None = None
        self.updates, self.judged_model = 0, None
        self.judged: Judged | None = None
        #: what the model logged since the last rollout end; where the adaptive lr prints; the learn()'s first timestep
        self.logged: dict[str, Any] = {}
        self.output = io.StringIO()
        self.learn_start = 0
        #: rollbacks and stops so far, and at the last judgement; redos and printed characters before the update
        self.restores, self.restores_seen, self.marks = 0, 0, (0, 0)

    def attach(self, model: Any, adaptive: Any) -> None:
        """Hook the model's optimizers (again after a load: new optimizers)."""
        self.model, self.adaptive = model, adaptive
        self.contract = contract(self.scenario, model) if adaptive is not None else None
        self.record.contract = self.contract
        if model is not self.judged_model:  # the adaptive lr counts the updates of a model (a learn() continues them)
            self.updates, self.judged_model = 0, model
        if self.scenario.algo == "SAC":
            optimizers = [model.actor.optimizer, model.critic.optimizer]
            optimizers += [model.ent_coef_optimizer] if model.ent_coef_optimizer is not None else []
        else:
            optimizers = [model.policy.optimizer]
        for optimizer in optimizers:
            optimizer.register_step_pre_hook(self.before_step)
        optimizers[0].register_step_post_hook(self.after_step)

    def before_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        model, record = self.model, self.record
        if optimizer is self._first_optimizer():
            self._count_step()
            if self.scenario.fault == "nan_grad" and self._fault_due():
                grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
                if grads:
                    with th.no_grad():
                        grads[0].view(-1)[0] = math.nan
                    self.fired = True
                    record.fault_fired_at.append(model.num_timesteps)
        tensors = [p for group in optimizer.param_groups for p in group["params"]]
        tensors += [p.grad for p in tensors if p.grad is not None]
        if not all(bool(th.isfinite(t).all()) for t in tensors):
            record.nonfinite_at_step.append(model.num_timesteps)
        bounds = None if self.contract is None else self.contract.bounds
        rate = float(optimizer.param_groups[0]["lr"])
        record.steps.append((model.num_timesteps, rate, bounds, model._current_progress_remaining, self.redoing_from))
        if optimizer is self._first_optimizer():
            if self.redoing_from is not None and not rate < self.redoing_from:
                record.redo_rates.append(f"a redo step at {rate:.3g}, not below the {self.redoing_from:.3g} it redoes")
            self.last_rate = rate
            if self.judged is not None and self.judged.first_rate is None:
                self.judged.first_rate = rate

    def _count_step(self) -> None:
        """Count the optimizer step about to run where the aimed kinds place their fault."""
        self.steps += 1
        if self.redoing_from is not None:
            self.redo_steps += 1
        else:
            self.attempt_steps += 1
            if self.steps_after_redo is not None:
                self.steps_after_redo += 1
        if self.model.num_timesteps >= self.model._total_timesteps:
            self.last_update_steps += 1

    def _fault_due(self) -> bool:
        """Whether the optimizer step being taken is the scenario's fault step (see :data:`AIMS`)."""
        s = self.scenario
        if self.fired:
            return False
        if s.aim == "fault_in_redo":
            return self.redoing_from is not None and self.redo_steps == s.fault_at
        if s.aim == "after_redo":
            return self.steps_after_redo == s.fault_at
        if s.aim == "after_rollback":
            return self.redoing_from is None and self.attempt_steps == s.fault_at
        if s.aim == "last_update":
            return self.last_update_steps == s.fault_at
        return self.steps == s.fault_at

    def before_redo(self) -> None:
        """A redo starts: it must not follow a guard's restore in its update, and must train at a lower rate."""
        if self.restored_in_update:
            self.record.redone_after_restore.append(f"an update redone at timestep {self.model.num_timesteps}")
        self.redoing_from = self.last_rate

    def after_redo(self) -> None:
        self.redoing_from, self.steps_after_redo = None, 0

    def _first_optimizer(self) -> th.optim.Optimizer:
        return self.model.actor.optimizer if self.scenario.algo == "SAC" else self.model.policy.optimizer

    def after_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.scenario.fault in ("nan_weight", "inf_weight") and self._fault_due():
            weight = next(iter(p for group in optimizer.param_groups for p in group["params"]))
            with th.no_grad():
                weight.view(-1)[0] = math.nan if self.scenario.fault == "nan_weight" else math.inf
            self.fired = True
            self.record.fault_fired_at.append(self.model.num_timesteps)

    def callback(self) -> Any:
        from stable_baselines3.common.callbacks import BaseCallback

        probe = self

        class Kept(BaseCallback):
            def _on_training_start(self) -> None:
                probe.record.kept.add(state_hash(self.model))
                probe.learn_start = self.model.num_timesteps
                # What is logged, as it is logged (SB3 makes a logger per learn(); A2C dumps it every 100 updates)
                record = self.logger.record

                def recording(key: str, value: Any, exclude: Any = None) -> None:
                    probe.logged[key] = value
                    record(key, value, exclude)

                self.logger.record = recording  # type: ignore[method-assign]

            def _on_step(self) -> bool:
                if probe.first_step_of_rollout:
                    probe.first_step_of_rollout = False
                    probe.record.rollouts_in_training_mode += bool(self.model.policy.training)
                return True

            def _on_rollout_start(self) -> None:
                probe.after_judgement(self.model, self.logger)
                probe.first_step_of_rollout = True

            def _on_rollout_end(self) -> None:
                probe.restored_in_update = False
                probe.before_update(self.model)

            def _on_training_end(self) -> None:
                probe.after_judgement(self.model, self.logger)

        return Kept()

    def before_update(self, model: Any) -> None:
        """The rollout ended: the adaptive lr prepares the update (if it measures it), train() runs, then it judges."""
        self.logged = {}
        if self.contract is None:
            return
        self.judged = Judged(self.updates, model.num_timesteps, self.learn_start, learning_rate_scale(model),
                             parameters_finite(model))  # fmt: skip
        self.marks = (self.record.redo_calls, self.output.tell())
        self.updates += 1

    def _judgement(self, model: Any) -> None:
        """After the judgement of the update (and the guards'): what it changed, logged and printed."""
        judged, self.judged = self.judged, None
        if judged is not None:
            judged.scale_after, judged.progress = learning_rate_scale(model), model._current_progress_remaining
            judged.last_rate = None if judged.first_rate is None else self.last_rate
            judged.redos = self.record.redo_calls - self.marks[0]
            judged.restored = self.restores != self.restores_seen
            judged.logged = {key: float(self.logged[key]) for key in JUDGEMENT_KEYS if key in self.logged}
            printed = self.output.getvalue()[self.marks[1] :].splitlines()
            judged.printed = [line for line in printed if line.startswith("KLAdaptiveLRCallback:")]
            self.record.judgements.append(judged)
        self.restores_seen = self.restores

    def after_judgement(self, model: Any, logger: Any) -> None:
        record = self.record
        self._judgement(model)
        record.kept.add(state_hash(model))
        if not parameters_finite(model):
            record.nonfinite_at_rollout_start += 1
        clip = logger.name_to_value.get("train/clip_range")
        if clip is not None:
            record.clip_ranges.append(float(clip))
        guarded_step = getattr(model, "guarded_step", None)
        steps = None if guarded_step is None else guarded_step.n_taken + guarded_step.n_skipped
        record.counters.append((int(getattr(model, "_n_updates", 0)), steps, self.rolled_back))
        record.scales.append(learning_rate_scale(model))
        if self.last_rollback is not None:
            restored, highest_scale = self.last_rollback
            # One optimizer step per update (A2C): the update the rollback replaced ends at the restored state; and
            # nothing raises the learning rate back over the rollback's before the next update
            if self.scenario.algo in ("A2C", "SafeA2C") and state_hash(model) != restored:
                record.after_rollback.append("the rolled-back update ended elsewhere than at the restored state")
            if learning_rate_scale(model) > highest_scale * (1 + 1e-9):
                record.after_rollback.append(f"scale {learning_rate_scale(model):.3g} > the rollback's {highest_scale:.3g}")
            self.last_rollback = None
        self.rolled_back = False


@contextlib.contextmanager
def instrumented(probe: Probe, algorithm: Any) -> Iterator[None]:
    """
    Record each rollback (its restored state), each redo and what is printed, for the scenario's duration; keep what
    is logged after the last ``train()`` of ``algorithm`` only (what the judgement of the update logs: KLAdaptivePPO
    logs ``train/kl`` too).
    """
    from sb3_safe import KLAdaptiveLRCallback
    from sb3_safe.common.guard.response import Response

    rollback, stop, redo = Response._rollback, Response._stop, KLAdaptiveLRCallback._redo
    own_train, train = algorithm.__dict__.get("train"), algorithm.train

    def recording_train(model: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return train(model, *args, **kwargs)
        finally:
            probe.logged = {}

    def recording_rollback(response: Response) -> str:
        healthy = response.snapshots.healthy
        assert healthy is not None
        message = rollback(response)
        restored = state_hash(response.model)
        model = response.model
        probe.record.rollbacks.append(
            (
                restored,
                restored in probe.record.kept,
                learning_rate_scale(model),
                healthy.lr_scale,
                response.lr_decay,
                float(response.watched.optimizers[0][1].param_groups[0]["lr"]),
                current_learning_rate(model),
            )
        )
        probe.rolled_back = probe.restored_in_update = True
        probe.last_rollback = (restored, learning_rate_scale(model))
        probe.restores += 1
        return message

    def recording_stop(response: Response, reason: str) -> str:
        probe.rolled_back = True  # (the counts go back to the healthy state's too)
        probe.restores += 1
        message = stop(response, reason)
        if response.snapshots.healthy is not None:
            restored = state_hash(response.model)
            probe.record.stops.append((restored, restored in probe.record.kept))
            probe.restored_in_update = True
        return message

    def recording_redo(callback: Any, *args: Any) -> None:
        probe.record.redo_calls += 1
        probe.before_redo()
        try:
            redo(callback, *args)
        finally:
            probe.after_redo()

    Response._rollback, Response._stop = recording_rollback, recording_stop  # type: ignore[method-assign]
    KLAdaptiveLRCallback._redo = recording_redo  # type: ignore[method-assign]
    algorithm.train = recording_train
    try:
        with contextlib.redirect_stdout(probe.output):
            yield
    finally:
        Response._rollback, Response._stop = rollback, stop  # type: ignore[method-assign]
        KLAdaptiveLRCallback._redo = redo  # type: ignore[method-assign]
        if own_train is None:
            del algorithm.train
        else:
            algorithm.train = own_train


# ----- one scenario -----


@dataclass
class Outcome:
    scenario: Scenario
    record: Record
    events: list[Any]
    raised: str | None
    crashed: str | None
    stop_reason: str | None
    stop_matches_saved: bool | None
    stop_matches_healthy: bool | None
    saved_trains_on: bool | None
    schedule_checks: list[str]
    counter_checks: list[str]
    redone_updates: int
    wall_s: float


def budgets(scenario: Scenario) -> tuple[int, int]:
    """
    The two ``learn()`` budgets: 6 and 4 rollouts (past_end: 3 steps short of the last); with rewards x1e30 6 and 8, as
    the first updates may read rollouts without a reward yet and the stall is seen at the 10th failing update.
    """
    size = rollout_size(scenario)
    if scenario.algo in OFF_POLICY:
        first, second = 60, 40
    else:
        first, second = 6 * size, (8 if scenario.fault == "rewards_1e30" else 4) * size
    return (first - 3, second - 3) if scenario.schedule == "past_end" else (first, second)


def run(scenario: Scenario) -> Outcome:
    """Run a scenario and collect what :func:`check` needs."""
    from sb3_safe import KLAdaptiveLRCallback, NonFiniteError, NonFiniteGuardCallback, NonFiniteGuardWarning
    from sb3_safe.common.adaptive_lr import with_adaptive_lr

    start = time.perf_counter()
    record, counter = Record(), [0, 0]
    folder = Path(tempfile.mkdtemp(prefix="sb3_safe_faults_"))
    env = make_env(scenario, counter)
    model = build(scenario, env)
    configured = model.learning_rate  # (the object the scenario passed: nothing may replace it)
    record.settings = settings_problems(scenario)
    guard = None
    if scenario.guarded:
        guard = NonFiniteGuardCallback(
            on_nonfinite=scenario.mode,  # type: ignore[arg-type]
            save_path=str(folder / "healthy.zip") if scenario.mode == "stop" else None,
            lr_decay=scenario.lr_decay,
            report_dir=str(folder),
            snapshot_every=scenario.snapshot_every,
        )
    adaptive = None
    if scenario.callbacks in ("adaptive", "guard+adaptive", "adaptive+guard"):
        adaptive = KLAdaptiveLRCallback(**adaptive_lr_settings(scenario))
    probe = Probe(scenario, record)

    def callbacks() -> list[Any]:
        ordered = {"guard": [guard], "adaptive": [adaptive], "guard+adaptive": [guard, adaptive]}.get(
            scenario.callbacks, [adaptive, guard] if scenario.callbacks == "adaptive+guard" else [guard]
        )
        return [*ordered, probe.callback()]

    def the_adaptive(current: Any) -> Any:
        """The adaptive lr of the model (``adaptive_lr=`` makes its callback once per model, kept on it)."""
        if adaptive is not None or scenario.callbacks != "option+guard":
            return adaptive
        with_adaptive_lr(current, None)
        return current._adaptive_lr_callback[1]

    redone = [0]

    def learn(current: Any, steps: int, **kwargs: Any) -> None:
        probe.attach(current, the_adaptive(current))
        if probe.model is not models[-1]:
            models.append(probe.model)
            record.past_end_warnings.append([])
        seen = len(caught)
        try:
            current.learn(steps, callback=callbacks(), **kwargs)
        finally:
            if probe.adaptive is not None:
                redone[0] += probe.adaptive.redone_updates  # (per learn())
            past_end = [str(w.message) for w in caught[seen:] if "past the budget" in str(w.message)]
            record.past_end_warnings[-1] += past_end
            past = current.num_timesteps > current._total_timesteps
            record.stand_ins_left += [
                (name, past) for name in SB3_SCHEDULES if type(getattr(current, name, None)).__name__ == "ReadFromZero"
            ]

    raised = crashed = None
    first, second = budgets(scenario)
    models: list[Any] = [None]
    with instrumented(probe, type(model)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            learn(model, first)
            if guard is None or guard.stop_reason is None:
                if scenario.save_load:
                    model = save_and_load(model, scenario, folder, env)
                learn(model, second, reset_num_timesteps=False)
        except NonFiniteError as error:
            raised = str(error)
        except Exception:
            crashed = traceback.format_exc(limit=6)
        record.warnings = sum(issubclass(w.category, NonFiniteGuardWarning) for w in caught)
    if counter[1]:
        record.fault_fired_at.append(counter[0])
    record.printed = [line for line in probe.output.getvalue().splitlines() if line.startswith("KLAdaptiveLRCallback:")]
    record.learning_rate_kept = len(models) > 1 and models[1].learning_rate is configured
    stopped = guard is not None and guard.stop_reason is not None
    stop_checks = check_stop(model, guard, scenario, folder) if stopped else (None, None, None)
    outcome = Outcome(
        scenario=scenario,
        record=record,
        events=list(guard.events) if guard is not None else [],
        raised=raised,
        crashed=crashed,
        stop_reason=guard.stop_reason if guard is not None else None,
        stop_matches_saved=stop_checks[0],
        stop_matches_healthy=stop_checks[1],
        saved_trains_on=stop_checks[2],
        schedule_checks=check_schedules(model, scenario, folder) if crashed is None else [],
        counter_checks=check_counters(model, scenario, record),
        redone_updates=redone[0],
        wall_s=time.perf_counter() - start,
    )
    env.close()
    return outcome


def save_and_load(model: Any, scenario: Scenario, folder: Path, env: Any) -> Any:
    """Save the model (and VecNormalize), load both into a new model on the same envs."""
    from stable_baselines3.common.vec_env import VecNormalize

    model.save(folder / "between.zip")
    if scenario.normalize:
        model.get_vec_normalize_env().save(str(folder / "between_vecnormalize.pkl"))
        env = VecNormalize.load(str(folder / "between_vecnormalize.pkl"), env.venv)
    return type(model).load(folder / "between.zip", env=env, device="cpu")


def check_stop(model: Any, guard: Any, scenario: Scenario, folder: Path) -> tuple[bool | None, bool, bool]:
    """(ii): the model in memory against the saved one and the guard's healthy snapshot; the saved one trains on."""
    healthy = guard._snapshots.healthy
    live = {f"policy.{key}": tensor for key, tensor in model.policy.state_dict().items()}
    matches_healthy = healthy is not None and all(
        healthy.flat.get(name) is None or th.equal(healthy.flat.get(name), tensor) for name, tensor in live.items()
    )
    path = folder / "healthy.zip"
    if not path.exists():
        return None, matches_healthy, True  # no healthy state recorded before the fault: nothing was saved
    loaded = type(model).load(path, device="cpu")
    saved = loaded.policy.state_dict()
    matches_saved = all(th.equal(saved[key], tensor) for key, tensor in model.policy.state_dict().items())
    try:
        fresh = make_env(Scenario(**{**asdict(scenario), "fault": "none"}), [0, 0])
        loaded.set_env(fresh)
        loaded.learn(rollout_size(scenario) * 2, reset_num_timesteps=False)
        trains_on = parameters_finite(loaded)
    except Exception:
        trains_on = False
    return matches_saved, matches_healthy, trains_on


def check_schedules(model: Any, scenario: Scenario, folder: Path) -> list[str]:
    """
    (vi): the model's schedule is the configured one times the saved scale, inside its bounds; a loaded copy keeps
    the configured ``learning_rate`` and the scale, and its schedule once a ``learn()`` applies the scale is the
    configured one times it (the bounds are the adaptive learning rate's, set again by it at each ``learn()``).
    """
    model.save(folder / "final.zip")
    loaded = type(model).load(folder / "final.zip", device="cpu")
    scale, bounds = learning_rate_scale(model), learning_rate_bounds(model)
    configured = configured_schedule(scenario)
    problems = []
    if learning_rate_scale(loaded) != scale:
        problems.append(f"loaded scale {learning_rate_scale(loaded):.6g} != {scale:.6g}")
    apply_learning_rate_scale(loaded)  # what learn() does with sb3-safe's callbacks or algorithms
    for progress in (1.0, 0.5, 0.1, 0.0):
        unbounded = max(0.0, scale * configured(max(progress, 0.0)))
        expected = unbounded if bounds is None else min(max(unbounded, bounds[0]), bounds[1])
        for name, candidate, wanted in (("model", model, expected), ("loaded", loaded, unbounded)):
            value = candidate.lr_schedule(progress)
            if not math.isclose(value, wanted, rel_tol=1e-9, abs_tol=1e-15):
                problems.append(f"{name} lr_schedule({progress}) = {value:.6g}, expected {wanted:.6g}")
        for name, candidate in (("model", model), ("loaded", loaded)):
            rate = FloatSchedule(candidate.learning_rate)(progress)
            if not math.isclose(rate, configured(progress), rel_tol=1e-9, abs_tol=1e-15):
                problems.append(f"{name} learning_rate({progress}) = {rate:.6g}, not the configured one")
    return problems


def steps_per_update(model: Any, scenario: Scenario) -> tuple[int, int] | None:
    """(n_updates increment, optimizer steps) of one whole update of an on-policy algorithm, else None."""
    if scenario.algo not in ON_POLICY:
        return None
    if scenario.algo in ("A2C", "SafeA2C"):
        return 1, 1
    minibatches = math.ceil(rollout_size(scenario) / model.batch_size)
    return model.n_epochs, model.n_epochs * minibatches


def check_counters(model: Any, scenario: Scenario, record: Record) -> list[str]:
    """(vii): between two rollout starts without a rollback, the counts grew by exactly one update's."""
    per_update = steps_per_update(model, scenario)
    if per_update is None:
        return []
    problems = []
    for (n_before, steps_before, _), (n_after, steps_after, rolled_back) in zip(
        record.counters, record.counters[1:], strict=False
    ):
        if rolled_back or n_after == n_before:
            continue  # a rollback restored older counts; no update (the first rollout start of a learn())
        if n_after - n_before != per_update[0]:
            problems.append(f"n_updates grew by {n_after - n_before}, one update is {per_update[0]}")
        if steps_before is not None and steps_after is not None and steps_after - steps_before != per_update[1]:
            problems.append(f"guarded steps grew by {steps_after - steps_before}, one update is {per_update[1]}")
    return problems


#: Settings outside their documented ranges (each refused by a ValueError naming it), then settings at the edges of
#: the ranges (accepted): the adaptive lr's (``lr_bounds`` needs 0 < lowest <= highest < inf; ``tolerance``,
#: ``max_step``, ``undo_above`` > 1; ``raise_after``, ``window_steps`` ints >= 1; ``max_redos`` an int >= 0) and the
#: guard's (``lr_decay`` in (0, 1); ``max_rollbacks`` >= 0; ``snapshot_every``, ``stall_updates`` None or >= 1)
REFUSED_SETTINGS: dict[str, list[dict[str, Any]]] = {
    "adaptive": [dict(target_kl=0.0), dict(target_kl=math.inf), dict(tolerance=1.0), dict(max_step=1.0),
                 dict(undo_above=1.0), dict(undo_above=0.5), dict(raise_after=0), dict(max_redos=-1),
                 dict(window_steps=0), dict(lr_bounds=(0.0, 1e-3)), dict(lr_bounds=(-0.5, 1e-3)),
                 dict(lr_bounds=(2e-3, 1e-3)), dict(lr_bounds=(1e-5, math.inf)), dict(raise_above_configured=1)],
    "guard": [dict(lr_decay=0.0), dict(lr_decay=1.0), dict(max_rollbacks=-1), dict(snapshot_every=0),
              dict(stall_updates=0), dict(on_nonfinite="ignore")],
}  # fmt: skip
ACCEPTED_SETTINGS: dict[str, list[dict[str, Any]]] = {
    "adaptive": [dict(lr_bounds=(1e-3, 1e-3)), dict(max_redos=0), dict(raise_after=1), dict(window_steps=1),
                 dict(tolerance=1.01, max_step=1.01, undo_above=1.01)],
    "guard": [dict(lr_decay=0.99), dict(max_rollbacks=0), dict(snapshot_every=1), dict(stall_updates=1)],
}  # fmt: skip


def settings_problems(scenario: Scenario) -> list[str]:
    """(xi) The scenario's callbacks refuse every setting outside its documented range, naming it, and accept its edges."""
    from sb3_safe import KLAdaptiveLRCallback, NonFiniteGuardCallback

    problems = []
    kinds = {"adaptive": KLAdaptiveLRCallback, "guard": NonFiniteGuardCallback}
    for kind in [kind for kind in kinds if (scenario.adaptive if kind == "adaptive" else scenario.guarded)]:
        for settings in REFUSED_SETTINGS[kind] + ACCEPTED_SETTINGS[kind]:
            refused = settings in REFUSED_SETTINGS[kind]
            try:
                kinds[kind](**settings)
                error = None
            except Exception as caught:
                error = caught
            if refused and not (isinstance(error, ValueError) and all(name in str(error) for name in settings)):
                problems.append(f"{kind} {settings}: {'accepted' if error is None else repr(error)[:80]}")
            elif not refused and error is not None:
                problems.append(f"{kind} {settings} refused: {error!r}"[:120])
    return problems


# ----- the invariants -----


def check(outcome: Outcome) -> dict[str, list[str]]:
    """The violations of each invariant (empty lists: none)."""
    s, record = outcome.scenario, outcome.record
    violations: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    # (i) rates and clip ranges
    configured = configured_schedule(s)
    for timestep, rate, bounds, progress, redoing_from in record.steps:
        scheduled = max(0.0, configured(max(progress, 0.0)))
        lowest = min(LOWEST_RATE, scheduled)  # (the lowest rate a cut of the adaptive lr goes to, without bounds)
        if not rate >= 0.0:
            violations["i"].append(f"step at timestep {timestep}: learning rate {rate:.3g}")
        elif bounds is not None and not bounds[0] * (1 - 1e-9) <= rate <= bounds[1] * (1 + 1e-9):
            violations["i"].append(f"step at timestep {timestep}: learning rate {rate:.3g} outside {bounds}")
        elif bounds is None and rate > scheduled * (1 + 1e-9):
            violations["i"].append(f"step at timestep {timestep}: learning rate {rate:.3g} above the configured one")
        elif bounds is None and redoing_from is not None and redoing_from > lowest and rate < lowest * (1 - 1e-9):
            violations["i"].append(f"a redo step at {rate:.3g}, below the lowest rate {lowest:.3g}")
    violations["i"] += [f"clip range {clip:.3g}" for clip in record.clip_ranges if not clip >= 0.0]
    violations["i"] += record.redo_rates
    if s.aim == "at_floor":  # a KL target no update meets: decisions only lower the rate, the scale never rises
        rises = [(a, b) for a, b in zip(record.scales, record.scales[1:], strict=False) if b > a * (1 + 1e-9)]
        violations["i"] += [f"the scale rose from {a:.3g} to {b:.3g} under a target no update meets" for a, b in rises]
    # (ii) stop
    if outcome.stop_reason is not None:
        if outcome.stop_matches_saved is False:
            violations["ii"].append("the model in memory differs from the saved one")
        if outcome.stop_matches_healthy is False:
            violations["ii"].append("the model in memory differs from the guard's healthy state")
        if outcome.saved_trains_on is False:
            violations["ii"].append("the saved model does not train on")
    violations["ii"] += [f"a stop restored state {restored[:8]}, never kept" for restored, kept in record.stops if not kept]
    # (iii) rollback
    for restored, was_kept, scale_after, healthy_scale, lr_decay, rate, scheduled in record.rollbacks:
        if not was_kept:
            violations["iii"].append(f"restored state {restored[:8]} was never kept")
        if scale_after > healthy_scale * lr_decay * (1 + 1e-9):
            violations["iii"].append(f"scale {scale_after:.3g} after a rollback above {healthy_scale:.3g} x {lr_decay}")
        if not math.isclose(rate, scheduled, rel_tol=1e-9):
            violations["iii"].append(f"the optimizer runs at {rate:.3g} after a rollback, the schedule says {scheduled:.3g}")
    violations["iii"] += record.after_rollback
    violations["iii"] += record.redone_after_restore
    # (iv) nothing non-finite unreported
    if outcome.crashed is not None:
        violations["iv"].append("exception: " + outcome.crashed.strip().splitlines()[-1])
    if outcome.raised is not None and s.mode != "raise":
        violations["iv"].append("raised outside raise mode: " + outcome.raised.splitlines()[0])
    event_times = {event.timestep for event in outcome.events}
    for timestep in record.nonfinite_at_step:
        if timestep not in event_times:
            violations["iv"].append(f"non-finite at an optimizer step at timestep {timestep} without an event")
    if record.nonfinite_at_rollout_start and outcome.raised is None:
        violations["iv"].append(f"non-finite parameters at {record.nonfinite_at_rollout_start} rollout start(s)")
    # (v) one event and one message per fault
    messages_expected = sum(event.action != "raise" for event in outcome.events)
    if record.warnings != messages_expected:
        violations["v"].append(f"{record.warnings} warnings for {messages_expected} events that did not raise")
    if s.fault in ONCE and record.fault_fired_at and len(outcome.events) != 1:
        kinds = [f"{event.source}/{event.action}" for event in outcome.events]
        violations["v"].append(f"{len(outcome.events)} events for one fault: {kinds}")
    # Rewards x1e30 on a dense reward (not normalized by VecNormalize): a stock critic stalls every update, one stall
    # event; the safe algorithms normalize their value targets there (normalize_value="auto") and train without an
    # event. (The masked task's reward is sparse: a rollout without one trains, and the updates in a row that stall
    # start again)
    kinds = [event.source for event in outcome.events]
    dense = s.algo != "MaskablePPO" and not s.normalize
    expected = [] if s.algo in ("KLAdaptivePPO", "SafeA2C") else ["stall"]
    if s.fault == "rewards_1e30" and s.guarded and dense and kinds != expected:
        violations["v"].append(f"rewards x1e30: events {[f'{e.source}/{e.action}' for e in outcome.events]}")
    violations["v"] += past_end_problems(record.past_end_warnings)
    # The guard alone on a stock algorithm's linear schedule read past the end, nothing restored (the scale of 1 leaves
    # SB3's schedule, which goes negative there): sb3-safe reads it at 0 and names it (its own algorithms clamp the
    # progress themselves)
    untouched = (
        s.callbacks == "guard" and s.algo not in WITH_OPTION and not outcome.events and record.scales[-1:] in ([], [1.0])
    )
    if s.schedule == "past_end" and untouched and outcome.crashed is None and not record.past_end_warnings[0]:
        violations["v"].append("the linear schedule read past the end of the budget is not named")
    # (vi) schedules
    violations["vi"] += outcome.schedule_checks
    if record.learning_rate_kept is False:
        violations["vi"].append("model.learning_rate is no longer the object the scenario configured")
    # (an exception out of learn() leaves the stand-ins of an update past the end of the budget in place, no others)
    violations["vi"] += [
        f"{name} is a stand-in after learn(){'' if past else ', its last update not past the end of the budget'}"
        for name, past in record.stand_ins_left
        if outcome.raised is None or not past
    ]
    # (vii) counters
    violations["vii"] += outcome.counter_checks
    if outcome.redone_updates != record.redo_calls:
        violations["vii"].append(f"redone_updates {outcome.redone_updates} for {record.redo_calls} redos")
    # The aimed scenarios' target (1e-6) is far below the KL of a first update at the configured rate: one is redone
    if s.aim in ("fault_in_redo", "after_redo", "after_rollback", "last_update") and not record.redo_calls:
        violations["vii"].append("no update redone under a KL target the first updates exceed")
    # (viii) each rollout collects with the policy in evaluation mode, as SB3 sets it up, also after a redo
    if record.rollouts_in_training_mode:
        violations["viii"].append(f"{record.rollouts_in_training_mode} rollout(s) collected in training mode")
    # (ix) the adaptive lr's measurements, redos and decisions; (x) what it logs and prints of them
    violations["ix"], violations["x"] = check_adaptive(s, record)
    # (xi) settings outside their documented ranges refused
    violations["xi"] += record.settings
    return violations


#: The lines the adaptive lr prints at verbose 1: a redo, the rate after an A2C-style redo, a decision
_CHANGE = r": learning rate x \S+ \(\S+ -> \S+\)$"
REDO_LINE = re.compile(r"KLAdaptiveLRCallback: KL \S+ > \S+ x target \S+, update redone" + _CHANGE)
AFTER_REDO_LINE = re.compile(r"KLAdaptiveLRCallback: the redo's cut holds for that update only, .*" + _CHANGE)
DECISION_LINE = re.compile(r"KLAdaptiveLRCallback: mean KL (\S+) over (\d+) update(s?), (above|below) \[\S+, \S+\]" + _CHANGE)


def documented_factor(kl: float, c: Contract) -> float:
    """The documented factor of a window's KL: 1 in the band, else sqrt(target / KL) limited to max_step."""
    if not math.isfinite(kl) or kl <= 0.0 or c.target / c.tolerance <= kl <= c.target * c.tolerance:
        return 1.0
    return min(max(math.sqrt(c.target / kl), 1.0 / c.max_step), c.max_step)


def check_adaptive(s: Scenario, record: Record) -> tuple[list[str], list[str]]:
    """
    (ix) The adaptive lr measures the first 8 updates of a model and one per 256 samples after (A2C-style), every one
    (PPO-style); decides once ``window_steps`` have passed since the last decision; redoes an update while its KL is
    above ``undo_above`` x target, ``max_redos`` times or down to the lowest rate; moves the rate only by a redo or a
    decision, each by the documented rule (no change in the band, sqrt(target / KL) limited to ``max_step`` outside,
    a raise after ``raise_after`` windows in a row below it, never below the lowest rate, never above the configured
    rate or the upper bound). (x) Each judgement logs the factor it applied (the scale's) and the scale, and at
    verbose 1 prints each change with the KL that decided it (at verbose 0 nothing).
    """
    c, rule, logged = record.contract, [], []
    if c is None:
        return [], []
    if c.verbose == 0 and record.printed:
        logged.append(f"verbose=0, yet printed: {record.printed[0][:80]}")
    configured = configured_schedule(s)
    window, start, learn = 0, 0, None
    recent: list[float] = []
    for j in record.judgements:
        if j.learn_start != learn:  # (a learn() starts with an empty window)
            window, start, recent, learn = 0, j.learn_start, [], j.learn_start
        judged = "train/lr_factor" in j.logged
        measured = j.index < MEASURED_FIRST or j.index % c.every == 0
        if judged != measured and (judged or not j.restored):
            rule.append(f"update {j.index} {'judged' if judged else 'not judged'}: measured are the first"
                        f" {MEASURED_FIRST} and one in {c.every} after")  # fmt: skip
        kl, window_kl = j.logged.get("train/kl"), j.logged.get("train/kl_window")
        window += kl is not None and j.index % c.every == 0
        due = kl is not None and window > 0 and j.timestep - start >= c.window_steps
        if due != (window_kl is not None):
            rule.append(f"a decision {'missing' if due else 'made'} at timestep {j.timestep}: {window} KLs over"
                        f" {j.timestep - start} steps, window_steps {c.window_steps}")  # fmt: skip
        count = window
        if window_kl is not None:
            recent, window, start = [*recent, window_kl][-c.raise_after :], 0, j.timestep
        if not judged or j.restored:
            continue
        scheduled = max(0.0, configured(max(j.progress, 0.0)))
        low, high = c.bounds or (min(LOWEST_RATE, scheduled), scheduled)
        ratio = j.scale_after / j.scale_before if j.scale_before > 0.0 else 1.0
        # the rates a step uses at this progress, before the update and after its judgement
        clamp = c.bounds or (0.0, math.inf)
        before, after = (min(max(scale * scheduled, clamp[0]), clamp[1]) for scale in (j.scale_before, j.scale_after))
        # (x) logged and printed
        if not math.isclose(j.logged["train/lr_factor"], ratio, rel_tol=1e-9):
            logged.append(f"train/lr_factor {j.logged['train/lr_factor']:.6g}, the scale moved x {ratio:.6g}")
        if not math.isclose(j.logged.get("train/lr_scale", math.nan), j.scale_after, rel_tol=1e-9):
            logged.append(f"train/lr_scale {j.logged.get('train/lr_scale')}, the scale is {j.scale_after:.6g}")
        if c.verbose:
            logged += printed_problems(j, c, ratio, count)
        # (ix) redos: as many as allowed while the KL overshoots and the rate can go lower
        if j.redos > c.max_redos:
            rule.append(f"update at timestep {j.timestep} redone {j.redos} times, max_redos {c.max_redos}")
        lower = j.last_rate is not None and j.last_rate > low * (1 + 1e-9)  # (a cut could lower the rate)
        if kl is not None and kl > c.undo_above * c.target and j.redos < c.max_redos and j.finite and lower:
            rule.append(f"update at timestep {j.timestep} redone {j.redos} of {c.max_redos} times: KL {kl:.3g} >"
                        f" {c.undo_above:g} x target {c.target:.3g} at {j.last_rate:.3g} > the lowest {low:.3g}")  # fmt: skip
        if scheduled <= 0.0:
            if ratio != 1.0:
                rule.append(f"the scale moved x {ratio:.3g} at a scheduled rate of 0")
            continue
        expected = None
        if window_kl is None and not j.redos:
            expected = before  # only a redo or a decision moves the rate
        elif window_kl is not None and not j.redos:
            factors = [documented_factor(kl, c) for kl in recent]
            raise_ = len(factors) >= c.raise_after and min(factors) > 1.0
            factor = factors[-1] if factors[-1] < 1.0 else min(factors) if raise_ else 1.0
            expected = min(max(before * factor, low), before) if factor < 1.0 else max(min(before * factor, high), before)
        elif window_kl is None and j.first_rate is not None and j.last_rate is not None:
            # after redos the next updates run at the redo's rate (PPO-style), or at the rate before the redo divided
            # by max_step where that is higher (A2C-style)
            one_step = s.algo in ("A2C", "SafeA2C")
            expected = min(max(j.last_rate, j.first_rate / c.max_step), high) if one_step else j.last_rate
        if expected is not None and not math.isclose(after, expected, rel_tol=1e-9, abs_tol=1e-15):
            why = f"window KL {window_kl:.3g}, target {c.target:.3g}" if window_kl is not None else f"{j.redos} redos"
            rule.append(f"the rate went from {before:.3g} to {after:.3g} after the update at timestep {j.timestep}"
                        f" ({why}), the documented rule gives {expected:.3g}")  # fmt: skip
        if c.bounds is None and ratio < 1.0 and j.scale_after < min(low / scheduled, j.scale_before) * (1 - 1e-9):
            rule.append(f"the rate cut to {after:.3g}, below the lowest {low:.3g}")
    return rule, logged


def printed_problems(j: Judged, c: Contract, ratio: float, count: int) -> list[str]:
    """(x) At verbose 1 a judgement prints a line per redo and per change of the rate, each with its KL."""
    problems = [f"an unreadable line: {line[:80]}" for line in j.printed
                if not (REDO_LINE.match(line) or AFTER_REDO_LINE.match(line) or DECISION_LINE.match(line))]  # fmt: skip
    redos = [found for found in map(REDO_LINE.match, j.printed) if found]
    if len(redos) != j.redos:
        problems.append(f"{len(redos)} lines for {j.redos} redos")
    if ratio != 1.0 and not j.printed:
        problems.append(f"the rate moved x {ratio:.3g}, nothing printed")
    window_kl = j.logged.get("train/kl_window")
    decisions = [found for found in map(DECISION_LINE.match, j.printed) if found]
    if not j.redos and window_kl is not None and len(decisions) != (ratio != 1.0):
        problems.append(f"{len(decisions)} decision lines for a decision that moved the rate x {ratio:.3g}")
    for found in decisions:
        n, plural, where = int(found[2]), found[3], found[4]
        if found[1] != f"{window_kl:.3g}" or n != count or (plural == "s") != (n != 1):
            problems.append(f"a decision on {window_kl:.3g} over {count} updates printed: {found[0][22:100]}")
        if (where == "above") != (window_kl is not None and window_kl > c.target * c.tolerance):
            problems.append(f"a decision on {window_kl:.3g} printed '{where}' the band")
    return problems


def past_end_problems(messages_per_model: list[list[str]]) -> list[str]:
    """
    (v) A schedule read past the end of the budget is named once per model, and only if it would turn negative: its
    value below 0 at SB3's progress, which is 1 - timestep / budget, below 0; with the value read instead, at progress
    0 (the scenarios' schedules that turn negative are linear, rate x progress: 0).
    """
    problems = []
    for messages in messages_per_model:
        named = [PAST_END.match(message) for message in messages]
        problems += [
            f"an unreadable past-the-end warning: {m[:80]}" for m, found in zip(messages, named, strict=True) if not found
        ]
        names = [found[1] for found in named if found]
        problems += [f"{name} named {names.count(name)} times" for name in sorted(set(names)) if names.count(name) > 1]
        for found in filter(None, named):
            value, progress, timestep, total = float(found[2]), float(found[3]), int(found[4]), int(found[5])
            if not value < 0.0:
                problems.append(f"{found[1]} named past the end at {value:.3g}, not negative")
            if float(found[6]) != 0.0:
                problems.append(f"{found[1]} named past the end, read at progress 0 as {found[6]}, not 0")
            if not (timestep > total and math.isclose(progress, 1.0 - timestep / total, rel_tol=1e-3, abs_tol=1e-6)):
                problems.append(f"{found[1]} named at progress {progress:.4g}, timestep {timestep} of {total}")
    return problems


# ----- the suite -----

SIZES = {"tiny": 8, "quick": 60, "full": 320}
#: The test suite's fixed subset (tests/test_faults.py)
TEST_SEEDS = tuple(range(1000, 1048))


def jobs(size: str) -> list[int]:
    return list(range(SIZES[size]))


def job_key(job: int) -> int:
    return job


def row_key(row: dict[str, Any]) -> int:
    return int(row["seed"])


def budget(size: str) -> dict[str, Any]:
    return dict(scenarios=SIZES[size])


def run_job(seed: int) -> list[dict[str, Any]]:
    outcome = run(Scenario.draw(seed))
    violations = check(outcome)
    return [
        dict(
            **asdict(outcome.scenario),
            events=[f"{event.source}/{event.action}" for event in outcome.events],
            rollbacks=len(outcome.record.rollbacks),
            redos=outcome.redone_updates,
            fault_fired=bool(outcome.record.fault_fired_at),
            raised=outcome.raised is not None,
            stopped=outcome.stop_reason is not None,
            violations={name: found for name, found in violations.items() if found},
            wall_s=outcome.wall_s,
        )
    ]


def report(out: Path) -> None:
    """``faults.md``: scenarios per kind, violations per invariant."""
    meta, rows = suite.read_jsonl(out / "faults.jsonl")
    wall = sum(row["wall_s"] for row in rows)
    lines = reports.report_header(
        "Randomized fault injection: the guard and the adaptive learning rate as one supervisor",
        meta,
        [
            f"{len(rows)} scenarios drawn from seeds 0-{len(rows) - 1} (`benchmarks/faults.py`), one process each"
            f" (summed wall time {wall / 60:.1f} min); the test suite runs seeds {TEST_SEEDS[0]}-{TEST_SEEDS[-1]}.",
            "Invariants: (i) learning rate >= 0, inside the bounds or at most the configured rate, clip range >= 0, a"
            " redo at a lower rate, not below the lowest; (ii) a stop keeps in memory the saved, healthy, kept, loadable"
            " model; (iii) a rollback restores a kept state, at most the healthy scale x lr_decay, and is not redone;"
            " (iv) nothing non-finite unreported; (v) one event and one message per fault, a schedule read past the end"
            " named once where it would turn negative; (vi) the saved schedule is the configured one times the saved"
            " scale, in its bounds, learning_rate the object configured, no stand-in left after learn(); (vii) counts"
            " of kept updates and redos; (viii) rollouts collect in evaluation mode; (ix) the adaptive lr judges the"
            " updates it documents, redoes while the KL overshoots, and moves the rate by its documented rule only;"
            " (x) it logs the factor and the scale of each judgement, prints each change at verbose 1, nothing at 0;"
            " (xi) settings outside their documented ranges refused, their edges accepted.",
            "Aims: random (everything drawn), or aimed at the supervisor's defects: a fault inside a redo"
            " (fault_in_redo), in the update after a redo (after_redo), in an update judged far from the healthy copy"
            " (after_rollback), in the last update of a learn() (last_update); or at the adaptive lr's rule: at its"
            " lower bound (at_floor), deciding after every update on a target near the updates' KLs (decisions),"
            " redoing every update of a rate 100 times too high (deep_redo).",
        ],
        summary=f"**{sum(bool(row['violations']) for row in rows)} of {len(rows)} scenarios violate any of the"
        f" {len(INVARIANTS)} invariants.** Whether they would report the defects they exist for: the mutants report"
        " (`faults_mutants.md`, below).",
    )
    lines += ["## Violations per invariant", ""]
    lines += reports.table(
        ["invariant", "scenarios violating it"],
        [[name, sum(name in row["violations"] for row in rows)] for name in INVARIANTS],
    )
    lines += ["", "## Scenarios per kind", ""]
    for key in ("aim", "algo", "callbacks", "mode", "schedule", "fault", "n_envs", "save_load", "verbose"):
        counts: dict[str, int] = {}
        for row in rows:
            counts[str(row.get(key, "random"))] = counts.get(str(row.get(key, "random")), 0) + 1
        lines.append(f"- **{key}**: " + ", ".join(f"{name} {count}" for name, count in sorted(counts.items())))
    outcomes = {
        "raised": sum(row["raised"] for row in rows),
        "stopped": sum(row["stopped"] for row in rows),
        "with a rollback": sum(row["rollbacks"] > 0 for row in rows),
        "with a redo": sum(row["redos"] > 0 for row in rows),
        "with a stall event": sum(any(e.startswith("stall") for e in row["events"]) for row in rows),
        "with no event": sum(not row["events"] for row in rows),
    }
    lines += ["", "**Outcomes**: " + ", ".join(f"{name} {count}" for name, count in outcomes.items()) + ".", ""]
    bad = [row for row in rows if row["violations"]]
    if bad:
        lines += ["## Scenarios with violations", ""]
        lines += reports.table(
            ["seed", "scenario", "violations"],
            [[row["seed"], f"{row['algo']} {row['callbacks']} {row['mode']} {row['fault']}@{row['fault_at']}",
              "; ".join(f"({k}) {v[0]}" for k, v in row["violations"].items())] for row in bad],
        )  # fmt: skip
    reports.write_report(out / "faults.md", lines)


def main(argv: list[str]) -> None:
    """Run the scenarios of the seeds given and print each one's outcome and violations."""
    for text in argv:
        outcome = run(Scenario.draw(int(text)))
        print(outcome.scenario)
        print(f"  events: {[(e.timestep, e.source, e.action) for e in outcome.events]}, raised: {outcome.raised is not None}")
        print(f"  crashed: {outcome.crashed}")
        print(f"  violations: { {k: v for k, v in check(outcome).items() if v} }, {outcome.wall_s:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
