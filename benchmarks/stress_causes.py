"""
Why the recommended stack misses on some stress configurations (a measured cause for every miss).

Each probe trains a stress configuration (``benchmarks/stress.py``, its full budget unless said) a few ways that
differ in one thing, more seeds than the suite, and records what the cause needs: the final return and, per update,
the logged entropy, KL and learning rate, and the guard's events.
Resumable: rows already in the JSONL are skipped.

Probes:

- ``critic_speed``: CartPole-v1 at A2C's rl-zoo settings, unbroken, 8,000 steps: stock A2C, stock A2C with its
  critic's output multiplied by 5 or 20 (the same parameters move the values in reward units that much faster), and
  the stack (SafeA2C + guard + adaptive lr) with ``normalize_value`` off and on (its critic moves in units of the
  returns' standard deviation), SafeA2C + guard with it on (the stack less the adaptive lr's raises), and the stack
  with it on where the raises reach only the actor or only the critic (the other's rate held at the configured one).
- ``head_gain``: CartPole-v1 at A2C's rl-zoo settings, unbroken and ``reward_scale_1e6``: the stack with
  ``normalize_value`` on and its value head's output multiplied by 0.3 (the head's initial weights and its learning
  rate times 0.3, which for RMSprop is the same: its normalized values move 0.3 times as far per update), at the
  suite's 8,000 steps and at 6x (48,000, near the reward-scale map's 50,000).
- ``a2c_long``: CartPole-v1 at A2C's rl-zoo settings, unbroken, 48,000 steps (near the reward-scale map's 50,000), 32
  seeds: the stack with ``normalize_value`` on and off, and SafeA2C + guard with it on (the stack less the adaptive
  lr): how often a run falls short of 500 at a budget where the default is meant to train. ``a2c_long_peers``: the
  reward-scale map's peers (stock A2C, and A2C in ``VecNormalize``) on the same budget and seeds;
  ``a2c_long_observations``: stock A2C and the stack with only the observations normalized
  (``VecNormalize(norm_reward=False)``).
- ``a2c_observations``: the stack (``normalize_value`` on) in ``VecNormalize(norm_reward=False)`` at the suite's
  8,000 steps, 8 seeds: CartPole-v1 unbroken and the three A2C CartPole-v1 stress configurations.
- ``stack_observations``: the recommended stack in ``VecNormalize(norm_reward=False)`` on every configuration whose
  unbroken settings learn at the suite's budget and that has no ``VecNormalize``, 8 seeds (the suite's 0-2 first).
- ``stack_policy_observations``: the same with the safe policy's ``normalize_observations=True`` instead.
- ``a2c_cartpole``: the three A2C CartPole-v1 stress configurations, the stack with ``normalize_value`` off and on at
  the suite's 8,000 steps, and on at 3x that; SafeA2C + guard with it on.
- ``reward_spikes_clipped``: ``reward_spikes_1e6``'s stack with the rewards clipped to [-10, 10] (what the report
  prescribes for heavy-tailed rewards), at the suite's steps and at 3x.
- ``lr_100x_ppo``: the stack as in the suite, the per-update trace.
- ``masked_sgd_lr``: the stack as in the suite, and with the adaptive lr's bounds up to the configured rate (plain
  SGD's step is the rate times the gradient: the default upper bound 1e-3 is sized for Adam and RMSprop).
- ``masked_large_logits``: the stack as in the suite, and the same with the observations normalized
  (``VecNormalize``, what SB3's docs prescribe for unscaled observations).

Usage::

    python -m benchmarks.stress_causes [PROBE ...]   # all probes by default
    python -m benchmarks.stress_causes --summary     # print the table of what ran
"""

import collections
import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from benchmarks import reports, stress, suite, training, variants
from sb3_safe.common import value_norm

OUT = reports.RESULTS / "stress_causes.jsonl"
STACK = {"A2C": "SafeA2C+guard+KL-lr", "PPO": "KLAdaptivePPO+guard+KL-lr"}
MASKED_STACK = "MaskablePPO+SafeMaskableMlpPolicy+guard+KL-lr"
#: The stack less the adaptive learning rate
SAFE_A2C_GUARD = "SafeA2C+guard"
#: Logged values traced per update
#: The configurations whose unbroken settings learn at the suite's budget and that train without VecNormalize
LEARNING_CONFIGS = (
    "lr_100x_ppo",
    "reward_scale_1e6",
    "reward_spikes_1e6",
    "rmsprop_lr_100x_discrete",
    "recurrent_log_std",
    "masked_large_logits",
    "masked_sgd_lr",
)
TRACED = ("train/entropy_loss", "train/approx_kl", "train/learning_rate", "train/logit_max")


class TraceUpdates(BaseCallback):
    """The values :data:`TRACED` that the last ``train()`` logged, read at the end of each rollout."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[dict[str, float]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        logged = self.model.logger.name_to_value
        point = {key.split("/")[1]: float(logged[key]) for key in TRACED if key in logged}
        if point:
            self.points.append(dict(point, timesteps=self.model.num_timesteps))


class ScaleCritic(th.nn.Module):
    """A critic's last layer, its output multiplied by ``factor``: the values move ``factor`` times faster."""

    def __init__(self, linear: th.nn.Module, factor: float) -> None:
        super().__init__()
        self.linear, self.factor = linear, factor

    def forward(self, latent: th.Tensor) -> th.Tensor:
        return self.linear(latent) * self.factor


def _scale_critic(factor: float) -> Callable[[Any], None]:
    def prepare(model: Any) -> None:
        model.policy.value_net = ScaleCritic(model.policy.value_net, factor)

    return prepare


def _critic(policy: Any) -> list[th.nn.Parameter]:
    """The parameters of an actor-critic policy's critic (its own layers and its last layer)."""
    return [*policy.mlp_extractor.value_net.parameters(), *policy.value_net.parameters()]


def _others(policy: Any, second: list[th.nn.Parameter]) -> list[th.nn.Parameter]:
    """The parameters of ``policy`` that are not in ``second``, in their order."""
    second_ids = {id(parameter) for parameter in second}
    return [parameter for parameter in policy.parameters() if id(parameter) not in second_ids]


def _split_optimizer(policy: Any, second: list[th.nn.Parameter]) -> th.optim.Optimizer:
    """
    Give ``policy`` an optimizer of its kind and settings with two parameter groups: the others first (the adaptive lr
    reads and sets group 0's rate), then ``second``.
    """
    first = _others(policy, second)
    policy.optimizer = type(policy.optimizer)([{"params": first}, {"params": second}], **policy.optimizer.defaults)
    return policy.optimizer


def _hold_rate(held: str) -> Callable[[Any], None]:
    """
    Split the optimizer of an A2C's policy into the actor's and the critic's parameters and hold ``held``'s learning
    rate at the configured one before every step: the adaptive lr's raises then reach the other part only.
    """

    def prepare(model: Any) -> None:
        policy = model.policy
        critic = _critic(policy)
        configured = policy.optimizer.defaults["lr"]
        optimizer = _split_optimizer(policy, critic)
        held_group = optimizer.param_groups[1 if held == "critic" else 0]

        def hold(*_: Any) -> None:
            held_group["lr"] = configured

        optimizer.register_step_pre_hook(hold)

    return prepare


def _head_gain(gain: float) -> Callable[[Any], None]:
    """
    Multiply the output of a normalized critic's head (PopArt) by ``gain``: its weights times ``gain``, and its own
    parameter group at ``gain`` times the others' learning rate before every step (RMSprop's step on a weight is about
    the learning rate whatever the gradient's size, so this is the same as a factor on the head's output).
    """

    def prepare(model: Any) -> None:
        policy = model.policy
        head = value_norm.value_head(policy)
        assert head is not None, "head_gain needs normalize_value on"
        with th.no_grad():
            for parameter in head.parameters():
                parameter.mul_(gain)
        optimizer = _split_optimizer(policy, list(head.parameters()))

        def follow(*_: Any) -> None:
            optimizer.param_groups[1]["lr"] = gain * optimizer.param_groups[0]["lr"]

        optimizer.register_step_pre_hook(follow)

    return prepare


def _advantages_unscaled(model: Any) -> None:
    """A2C's advantages in reward units, as SB3's, beside the normalized critic (not divided by the returns' std)."""
    head = value_norm.value_head(model.policy)
    assert head is not None, "advantages_unscaled needs normalize_value on"
    head.scale_advantages = lambda advantages: advantages  # type: ignore[method-assign]


def _clip_per_part(model: Any) -> None:
    """
    Clip the actor's and the critic's gradients each to the model's ``max_grad_norm`` (SB3 clips their joint norm:
    a critic's large gradient then shrinks the actor's step); the joint clip is turned off.
    """
    policy, bound = model.policy, model.max_grad_norm
    critic = _critic(policy)
    parts = [_others(policy, critic), critic]

    def clip(*_: Any) -> None:
        for part in parts:
            th.nn.utils.clip_grad_norm_(part, bound)

    policy.optimizer.register_step_pre_hook(clip)
    model.max_grad_norm = math.inf


def _clipped(env: Any, inner: Callable[[Any], Any] | None, bound: float) -> Any:
    """``env`` wrapped by ``inner`` (if any), its rewards then clipped to ``[-bound, bound]``."""
    return gym.wrappers.ClipReward(inner(env) if inner is not None else env, -bound, bound)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One way to train a stress configuration: ``label`` names it in the JSONL."""

    label: str
    config: str
    variant: str
    normalize_value: bool | None = None
    broken: bool = True
    steps_factor: int = 1
    prepare: Callable[[Any], None] | None = None
    normalize_obs: bool = False
    #: with ``normalize_obs``: VecNormalize scales the rewards too
    normalize_reward: bool = True
    lr_capped_at_configured: bool = False
    #: rewards clipped to [-clip_reward, clip_reward] after the configuration's wrapper (None: not clipped)
    clip_reward: float | None = None
    #: the safe policy's own ``normalize_observations`` (not VecNormalize's)
    policy_normalizes_observations: bool = False


def _stack_on_learning_configs(label: str, **how: Any) -> list[Probe]:
    """The recommended stack of each of :data:`LEARNING_CONFIGS`' families, trained ``how`` (Probe's fields)."""
    return [
        Probe(label, name, stress.FAMILY_VARIANTS[stress.CONFIGS[name].family][-1] or "", **how) for name in LEARNING_CONFIGS
    ]


def probes() -> dict[str, tuple[list[Probe], tuple[int, ...]]]:
    """Probe name: its ways to train and its seeds."""
    cartpole = "reward_scale_1e6"  # its unbroken settings: rl-zoo's A2C CartPole-v1 entry
    a2c_configs = ("reward_scale_1e6", "reward_spikes_1e6", "rmsprop_lr_100x_discrete")
    # the default stack near the reward-scale map's budget: seeds 0-7 in head_gain, 8-39 in a2c_long
    long_stack = Probe(
        "stack, normalize_value on, 6x steps", cartpole, STACK["A2C"], normalize_value=True, broken=False, steps_factor=6
    )
    return {
        "critic_speed": (
            [
                Probe("A2C", cartpole, "A2C", broken=False),
                Probe("A2C, critic x5", cartpole, "A2C", broken=False, prepare=_scale_critic(5.0)),
                Probe("A2C, critic x20", cartpole, "A2C", broken=False, prepare=_scale_critic(20.0)),
                Probe("stack, normalize_value off", cartpole, STACK["A2C"], normalize_value=False, broken=False),
                Probe("stack, normalize_value on", cartpole, STACK["A2C"], normalize_value=True, broken=False),
                # The stack less the adaptive lr, whose raises move the normalized critic faster still
                Probe("SafeA2C + guard, normalize_value on", cartpole, SAFE_A2C_GUARD, normalize_value=True, broken=False),
                *(
                    Probe(
                        f"stack, normalize_value on, the {held}'s rate held at the configured one",
                        cartpole,
                        STACK["A2C"],
                        normalize_value=True,
                        broken=False,
                        prepare=_hold_rate(held),
                    )
                    for held in ("critic", "actor")
                ),
            ],
            tuple(range(8)),
        ),
        # critic_speed's ways again at 16 more seeds; then the advantages left in reward units: is their division by
        # the returns' std (A2C's policy gradient made scale-free) what slows the normalized stack?
        "critic_speed_more_seeds": (
            [
                Probe("A2C", cartpole, "A2C", broken=False),
                Probe("stack, normalize_value off", cartpole, STACK["A2C"], normalize_value=False, broken=False),
                Probe("stack, normalize_value on", cartpole, STACK["A2C"], normalize_value=True, broken=False),
                Probe("SafeA2C + guard, normalize_value on", cartpole, SAFE_A2C_GUARD, normalize_value=True, broken=False),
            ],
            tuple(range(8, 24)),
        ),
        "advantages_unscaled": (
            [
                Probe(
                    "stack, normalize_value on, advantages in reward units",
                    cartpole,
                    STACK["A2C"],
                    normalize_value=True,
                    broken=False,
                    prepare=_advantages_unscaled,
                )
            ],
            tuple(range(24)),
        ),
        # The suspected cause: one clipped norm for the actor's and the critic's gradients together
        "clip_per_part": (
            [
                Probe(
                    f"stack, normalize_value {'on' if on else 'off'}, actor and critic clipped apart",
                    cartpole,
                    STACK["A2C"],
                    normalize_value=on,
                    broken=False,
                    prepare=_clip_per_part,
                )
                for on in (True, False)
            ],
            tuple(range(24)),
        ),
        "head_gain": (
            [
                Probe(
                    f"stack, normalize_value on, head x0.3{label}",
                    config,
                    STACK["A2C"],
                    normalize_value=True,
                    broken=broken,
                    steps_factor=factor,
                    prepare=_head_gain(0.3),
                )
                for config, broken in ((cartpole, False), (cartpole, True))
                for factor, label in ((1, ""), (6, ", 6x steps"))
            ]
            + [long_stack],
            tuple(range(8)),
        ),
        "a2c_long": (
            [
                long_stack,
                Probe(
                    "stack, normalize_value off, 6x steps",
                    cartpole,
                    STACK["A2C"],
                    normalize_value=False,
                    broken=False,
                    steps_factor=6,
                ),
                Probe(
                    "SafeA2C + guard, normalize_value on, 6x steps",
                    cartpole,
                    SAFE_A2C_GUARD,
                    normalize_value=True,
                    broken=False,
                    steps_factor=6,
                ),
            ],
            tuple(range(8, 40)),
        ),
        "a2c_long_peers": (
            [
                # The reward-scale map's peers: stock A2C, and in VecNormalize (observations and rewards, rl-zoo's
                # `normalize: true`), at the same 48,000 steps and seeds as `a2c_long` plus 0-7 (`head_gain`'s)
                Probe("A2C, 6x steps", cartpole, "A2C", broken=False, steps_factor=6),
                Probe("A2C + VecNormalize, 6x steps", cartpole, "A2C", broken=False, steps_factor=6, normalize_obs=True),
            ],
            tuple(range(40)),
        ),
        "a2c_long_observations": (
            [
                # What sets the peer in VecNormalize apart: its observations, normalized alone, under stock A2C and
                # under the stack (whose critic's targets are normalized by `normalize_value`)
                Probe(
                    f"{name}, observations normalized, 6x steps",
                    cartpole,
                    variant,
                    normalize_value=normalize_value,
                    broken=False,
                    steps_factor=6,
                    normalize_obs=True,
                    normalize_reward=False,
                )
                for name, variant, normalize_value in (("A2C", "A2C", None), ("stack", STACK["A2C"], True))
            ],
            tuple(range(40)),
        ),
        "a2c_long_policy_observations": (
            [
                # The same 48,000 steps and seeds with the safe policy's own normalize_observations (not VecNormalize)
                Probe(
                    "stack, normalize_observations, 6x steps",
                    cartpole,
                    STACK["A2C"],
                    normalize_value=True,
                    broken=False,
                    steps_factor=6,
                    policy_normalizes_observations=True,
                )
            ],
            tuple(range(40)),
        ),
        "a2c_observations": (
            [
                # The suite's budget with the observations normalized (VecNormalize(norm_reward=False)), which at
                # 48,000 steps closes the gap to the peer in VecNormalize: the stack, unbroken and broken
                Probe(
                    f"stack, observations normalized{label}",
                    name,
                    STACK["A2C"],
                    normalize_value=True,
                    broken=broken,
                    normalize_obs=True,
                    normalize_reward=False,
                )
                for name, broken, label in (
                    (cartpole, False, ", unbroken"),
                    *((name, True, "") for name in a2c_configs),
                )
            ],
            tuple(range(8)),
        ),
        # The recommended stack with the observations normalized (by VecNormalize, then by the safe policy's own
        # normalize_observations), on every configuration whose unbroken settings learn at the suite's budget and that
        # trains without VecNormalize
        "stack_observations": (
            _stack_on_learning_configs("stack, observations normalized", normalize_obs=True, normalize_reward=False),
            tuple(range(8)),
        ),
        "stack_policy_observations": (
            _stack_on_learning_configs("stack, normalize_observations", policy_normalizes_observations=True),
            tuple(range(8)),
        ),
        "a2c_cartpole": (
            [
                probe
                for name in a2c_configs
                for probe in (
                    Probe("stack, normalize_value off", name, STACK["A2C"], normalize_value=False),
                    Probe("stack, normalize_value on", name, STACK["A2C"], normalize_value=True),
                    Probe("stack, normalize_value on, 3x steps", name, STACK["A2C"], normalize_value=True, steps_factor=3),
                    Probe("stock A2C, 3x steps (reference)", name, "A2C", broken=False, steps_factor=3),
                    Probe("SafeA2C + guard, normalize_value on", name, SAFE_A2C_GUARD, normalize_value=True),
                )
            ],
            tuple(range(6)),
        ),
        "reward_spikes_clipped": (
            [
                # What the report prescribes for heavy-tailed rewards: clip them (a wrapper), the stack's defaults kept
                Probe("stack, rewards clipped to [-10, 10]", "reward_spikes_1e6", STACK["A2C"], clip_reward=10.0),
                Probe(
                    "stack, rewards clipped to [-10, 10], 3x steps",
                    "reward_spikes_1e6",
                    STACK["A2C"],
                    clip_reward=10.0,
                    steps_factor=3,
                ),
            ],
            tuple(range(6)),
        ),
        "lr_100x_ppo": ([Probe("stack", "lr_100x_ppo", STACK["PPO"])], tuple(range(6))),
        "masked_sgd_lr": (
            [
                Probe("stack", "masked_sgd_lr", MASKED_STACK),
                # The adaptive lr's bounds from 1e-5 up to the configured 0.3 (the default upper bound: 1e-3)
                Probe(
                    "stack, lr_bounds up to the configured rate", "masked_sgd_lr", MASKED_STACK, lr_capped_at_configured=True
                ),
            ],
            tuple(range(6)),
        ),
        "masked_large_logits": (
            [
                Probe("stack", "masked_large_logits", MASKED_STACK),
                Probe("stack, observations normalized", "masked_large_logits", MASKED_STACK, normalize_obs=True),
            ],
            (0, 1, 2),
        ),
    }


def run(probe: Probe, seed: int) -> dict[str, Any]:
    """Train ``probe`` on ``seed``: the training row (final return, guard events) and the update trace."""
    config = stress.CONFIGS[probe.config]
    settings = stress._settings(config, broken=probe.broken)
    if probe.normalize_obs:
        settings = dataclasses.replace(settings, normalize=True, normalize_reward=probe.normalize_reward)
    variant = variants.VARIANTS[probe.variant]
    if probe.normalize_value is not None:
        variant = dataclasses.replace(variant, normalize_value=probe.normalize_value)
    if probe.lr_capped_at_configured:
        variant = dataclasses.replace(variant, lr_capped_at_configured=True)
    if variant.safe_policy or variant.algo in variants.SAFE_ALGORITHM_CLASSES:
        # Explicit: the probes were measured before the safe policies normalized observations by default
        variant = dataclasses.replace(variant, normalize_observations=probe.policy_normalizes_observations)
    steps = config.timesteps["full"] * probe.steps_factor
    trace = TraceUpdates()
    prepares = [step for step in (config.prepare if probe.broken else None, probe.prepare) if step is not None]
    wrapper = config.wrapper if probe.broken else None
    if probe.clip_reward is not None:
        wrapper = functools.partial(_clipped, inner=wrapper, bound=probe.clip_reward)

    def prepare(model: Any) -> None:
        for step in prepares:
            step(model)

    row = training.train(
        variant,
        config.env_id,
        settings,
        steps,
        seed,
        stress.EVAL_EPISODES["full"],
        wrapper=wrapper,
        eval_wrapper=config.eval_wrapper if probe.broken else None,
        prepare=prepare,
        callbacks=[trace],
    )
    return dict(row, kind="run", probe_label=probe.label, config=probe.config, trace=trace.points)


def main(names: list[str]) -> None:
    th.set_num_threads(1)  # as the suites' workers
    done: set[tuple[str, str, str, int]] = set()
    if OUT.exists():
        done = {(r["probe"], r["config"], r["probe_label"], r["seed"]) for r in suite.read_jsonl(OUT)[1]}
    else:
        meta = dict(kind="meta", command="python -m benchmarks.stress_causes " + " ".join(sys.argv[1:]))
        suite.write_jsonl(OUT, [dict(meta, **suite.machine_info())])
    for name, (ways, seeds) in probes().items():
        if names and name not in names:
            continue
        for probe in ways:
            for seed in seeds:
                if (name, probe.config, probe.label, seed) in done:
                    continue
                row = run(probe, seed)
                suite.write_jsonl(OUT, [dict(row, probe=name, finished_at=time.time())], mode="a")
                print(json.dumps({key: row[key] for key in ("config", "probe_label", "seed", "final_return")}), flush=True)


def summary() -> None:
    """Per configuration and way: final returns, runs past the suite's learning threshold, final learning rates."""
    stress_rows = suite.read_jsonl(reports.RESULTS / "stress.jsonl")[1]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for row in suite.read_jsonl(OUT)[1]:
        groups[(row["probe"], row["config"], row["probe_label"])].append(row)
    for (_probe, config, label), rows in groups.items():
        threshold = stress.learning_threshold(stress_rows, config)
        returns = [row["final_return"] for row in rows]
        learned = "-" if threshold is None else f"{sum(value >= threshold for value in returns)}/{len(returns)}"
        rates = [row.get("final_learning_rate") or float("nan") for row in rows]
        print(
            f"{config:26s} {label:38s} mean {np.mean(returns):8.1f} learned {learned:5s} returns "
            f"{[round(value, 1) for value in returns]} final lr {[float(f'{rate:.2g}') for rate in rates]}"
        )


if __name__ == "__main__":
    if sys.argv[1:] == ["--summary"]:
        summary()
    else:
        main(sys.argv[1:])
