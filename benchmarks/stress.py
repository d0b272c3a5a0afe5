"""
Stress: realistic misconfigurations, short runs, stock SB3 vs sb3-safe.

Each configuration starts from rl-zoo's tuned entry and breaks one thing the way users do (learning rate far too
high, unnormalized reward or observation scale, extreme initial log-std, many epochs on tiny minibatches, rare
reward spikes, high RMSprop learning rate on a discrete actor, a squashed Gaussian driven into saturation), plus
sb3-contrib's RecurrentPPO and MaskablePPO in the setups where their stock policies failed. Each runs for stock
SB3, SB3 with the safe policy, the safe algorithm, and the safe algorithm with the guard in rollback mode (for the
sb3-contrib algorithms, which have no safe algorithm class: the safe policy with the guard). Per run: exception
(type and first line), non-finite parameters at the end, guard events, final return, the final log-std's largest
entry, and for MaskablePPO the actions sampled although the mask forbade them.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks import configs, reports, suite, training
from benchmarks.variants import VARIANTS

SUITE = "stress"
#: The ways to train, per algorithm family: stock, safe policy, safe algorithm, safe algorithm + guard, the safe
#: policy with the log-std's lower bound at -5 instead of the default -20 (continuous actions only: which lower
#: bound keeps more runs exploring), and the recommended stack: safe algorithm + guard + adaptive learning rate
ROLES = (
    "stock SB3",
    "safe policy",
    "safe algorithm",
    "safe algorithm + guard",
    "safe policy, log-std >= -5",
    "safe algorithm + guard + adaptive lr",
)
#: The role whose runs give the tuned reference: stock SB3 on the unbroken settings of the same task and budget
REFERENCE = "stock SB3, tuned (reference)"
#: A run "ends learning" at this share of the way from a random policy's return to the tuned reference's
LEARNING_SHARE = 0.5
#: One variant per role, None where the role does not exist: sb3-contrib's algorithms have no safe algorithm class,
#: so their guard role is the stock algorithm with the safe policy and the guard; MaskablePPO has no log-std
FAMILY_VARIANTS: dict[str, tuple[str | None, ...]] = {
    "PPO": (
        "PPO",
        "PPO+SafeMlpPolicy",
        "KLAdaptivePPO",
        "KLAdaptivePPO+guard",
        "PPO+SafeMlpPolicy(lo=-5)",
        "KLAdaptivePPO+guard+KL-lr",
    ),
    "A2C": ("A2C", "A2C+SafeMlpPolicy", "SafeA2C", "SafeA2C+guard", "A2C+SafeMlpPolicy(lo=-5)", "SafeA2C+guard+KL-lr"),
    "RecurrentPPO": (
        "RecurrentPPO",
        "RecurrentPPO+SafeMlpLstmPolicy",
        None,
        "RecurrentPPO+SafeMlpLstmPolicy+guard",
        "RecurrentPPO+SafeMlpLstmPolicy(lo=-5)",
        "RecurrentPPO+SafeMlpLstmPolicy+guard+KL-lr",
    ),
    "MaskablePPO": (
        "MaskablePPO",
        "MaskablePPO+SafeMaskableMlpPolicy",
        None,
        "MaskablePPO+SafeMaskableMlpPolicy+guard",
        None,
        "MaskablePPO+SafeMaskableMlpPolicy+guard+KL-lr",
    ),
}
#: Roles that need a log-std (continuous actions)
CONTINUOUS_ONLY_ROLES = ("safe policy, log-std >= -5",)


class ScaleObservation(gym.ObservationWrapper):
    """Observations times ``scale``: raw sensor units nobody normalized."""

    def __init__(self, env: gym.Env, scale: float) -> None:
        super().__init__(env)
        self.scale = scale
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(space.low * scale, space.high * scale, dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return (observation * self.scale).astype(self.observation_space.dtype)


class ScaleReward(gym.RewardWrapper):
    """Rewards times ``scale``: a cost in raw units, without VecNormalize."""

    def __init__(self, env: gym.Env, scale: float) -> None:
        super().__init__(env)
        self.scale = scale

    def reward(self, reward: float) -> float:
        return reward * self.scale


class RewardSpikes(gym.Wrapper):
    """With probability ``rate`` per step, add ``size`` to the reward (a rare bonus or a logging glitch)."""

    def __init__(self, env: gym.Env, rate: float, size: float) -> None:
        super().__init__(env)
        self.rate, self.size = rate, size
        self._rng = np.random.default_rng(0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed + 12_345)  # its own stream: the env's dynamics stay as they were
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if self._rng.random() < self.rate:
            reward = float(reward) + self.size
        return observation, reward, terminated, truncated, info


def saturate_action_mean(model: Any, bias: float) -> None:
    """Push the actor's mean to ``bias``, where float32 ``tanh`` is exactly 1 (a policy gone to the bound)."""
    import torch as th

    with th.no_grad():
        model.policy.action_net.bias.fill_(bias)


@dataclass(frozen=True)
class StressConfig:
    """
    One misconfiguration.

    :param name: short id
    :param description: what is broken, for the report
    :param family: ``"PPO"``, ``"A2C"``, ``"RecurrentPPO"`` or ``"MaskablePPO"``
    :param env_id: the environment
    :param timesteps: training budget per size
    :param overrides: replace rl-zoo's hyperparameters (MaskablePPO: the maskable example's)
    :param zoo: start from rl-zoo's entry (the example's for MaskablePPO); False: from the library's defaults
    :param wrapper: training env wrapper
    :param eval_wrapper: evaluation env wrapper (observation changes only, so returns stay in the task's units)
    :param prepare: called on the model before training
    """

    name: str
    description: str
    family: str
    env_id: str
    timesteps: dict[str, int]
    overrides: dict[str, Any] = field(default_factory=dict)
    wrapper: Callable[[Any], Any] | None = None
    eval_wrapper: Callable[[Any], Any] | None = None
    prepare: Callable[[Any], None] | None = None
    zoo: bool = True


def _steps(tiny: int, quick: int, full: int) -> dict[str, int]:
    return dict(tiny=tiny, quick=quick, full=full)


_OBS_1E4 = functools.partial(ScaleObservation, scale=1e4)
_OBS_1E11 = functools.partial(ScaleObservation, scale=1e11)
#: Zoo's Pendulum PPO collects 4 x 1024 steps per update; 4 x 256 gives a short run several updates
_PENDULUM_PPO = dict(n_steps=256)
CONFIGS = {
    config.name: config
    for config in (
        StressConfig(
            "lr_100x_ppo",
            "PPO CartPole-v1, learning rate lin_0.1 (100x zoo's lin_0.001)",
            "PPO",
            "CartPole-v1",
            _steps(512, 2_048, 8_192),
            dict(learning_rate="lin_0.1"),
        ),
        StressConfig(
            "lr_30x_a2c",
            "A2C Pendulum-v1 (gSDE, VecNormalize), learning rate lin_0.021 (30x zoo's lin_7e-4)",
            "A2C",
            "Pendulum-v1",
            _steps(512, 2_000, 8_000),
            dict(learning_rate="lin_0.021"),
        ),
        StressConfig(
            "reward_scale_1e6",
            "A2C CartPole-v1, rewards x 1e6, no VecNormalize",
            "A2C",
            "CartPole-v1",
            _steps(512, 2_000, 8_000),
            wrapper=functools.partial(ScaleReward, scale=1e6),
        ),
        StressConfig(
            "obs_scale_1e4",
            "PPO Pendulum-v1 (gSDE; n_steps 256), observations x 1e4, no VecNormalize",
            "PPO",
            "Pendulum-v1",
            _steps(1_024, 1_024, 4_096),
            _PENDULUM_PPO,
            wrapper=_OBS_1E4,
            eval_wrapper=_OBS_1E4,
        ),
        StressConfig(
            "log_std_init_+10",
            "A2C Pendulum-v1 (gSDE, VecNormalize), log_std_init=+10 (zoo: -2)",
            "A2C",
            "Pendulum-v1",
            _steps(512, 2_000, 8_000),
            dict(policy_kwargs="dict(log_std_init=10, ortho_init=False)"),
        ),
        StressConfig(
            "log_std_init_-10",
            "PPO Pendulum-v1 (n_steps 256) without gSDE, log_std_init=-10",
            "PPO",
            "Pendulum-v1",
            _steps(1_024, 1_024, 4_096),
            dict(_PENDULUM_PPO, use_sde=False, sde_sample_freq=-1, policy_kwargs="dict(log_std_init=-10)"),
        ),
        StressConfig(
            "log_std_collapsed",
            "PPO Pendulum-v1 (n_steps 256) without gSDE, log_std_init=-60: a collapsed log-std (the variance underflows"
            " float32 to 0), the first report's `scale ... 0.`",
            "PPO",
            "Pendulum-v1",
            _steps(1_024, 1_024, 4_096),
            dict(_PENDULUM_PPO, use_sde=False, sde_sample_freq=-1, policy_kwargs="dict(log_std_init=-60)"),
        ),
        StressConfig(
            "lr_4000x_a2c_box",
            "A2C HalfCheetah-v5 (zoo: VecNormalize, RMSprop), learning rate 3.0 (4000x zoo's 7e-4): the first report's"
            " exploding log-std (`scale ... inf`)",
            "A2C",
            "HalfCheetah-v5",
            _steps(512, 2_000, 8_000),
            dict(learning_rate=3.0),
        ),
        StressConfig(
            "tiny_minibatch_50_epochs",
            "PPO Pendulum-v1 (gSDE), n_steps 64 x 4 envs, batch_size 8, n_epochs 50 (zoo: 1024, 64, 10)",
            "PPO",
            "Pendulum-v1",
            _steps(256, 256, 512),
            dict(n_steps=64, batch_size=8, n_epochs=50),
        ),
        StressConfig(
            "reward_spikes_1e6",
            "A2C CartPole-v1, reward + 1e6 with probability 1e-3 per step",
            "A2C",
            "CartPole-v1",
            _steps(512, 2_000, 8_000),
            wrapper=functools.partial(RewardSpikes, rate=1e-3, size=1e6),
        ),
        StressConfig(
            "rmsprop_lr_100x_discrete",
            "A2C CartPole-v1, RMSpropTFLike(eps=1e-5) as zoo's Atari A2C, learning rate 0.07 (100x), no gradient"
            " clipping (max_grad_norm=inf)",
            "A2C",
            "CartPole-v1",
            _steps(512, 2_000, 8_000),
            dict(
                learning_rate=0.07,
                max_grad_norm=float("inf"),
                policy_kwargs="dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(eps=1e-5))",
            ),
        ),
        StressConfig(
            "squashed_saturated",
            "PPO Hopper-v5 (zoo's Hopper entry + gSDE), squash_output=True, log_std_init=-3, n_steps 128, batch_size 16,"
            " n_epochs 10, action_net bias 12 (every action saturates to 1.0 in float32): the reported setup",
            "PPO",
            "Hopper-v5",
            _steps(256, 256, 512),
            dict(
                use_sde=True,
                n_steps=128,
                batch_size=16,
                n_epochs=10,
                policy_kwargs="dict(squash_output=True, log_std_init=-3, ortho_init=False, activation_fn=nn.ReLU,"
                " net_arch=dict(pi=[256, 256], vf=[256, 256]))",
            ),
            prepare=functools.partial(saturate_action_mean, bias=12.0),
        ),
        StressConfig(
            "recurrent_log_std",
            "RecurrentPPO MountainCarContinuous-v0 (sb3-contrib's defaults: 1 env, no VecNormalize, no gSDE), learning"
            " rate 0.1, ent_coef 0.3, n_steps 128, batch_size 128: the measured case (stock: `Expected parameter loc`"
            " on 1 of 2 seeds, log-std 40.5 on the other, at 12k steps)",
            "RecurrentPPO",
            "MountainCarContinuous-v0",
            _steps(256, 4_096, 12_000),
            dict(learning_rate=0.1, ent_coef=0.3, n_steps=128, batch_size=128),
            zoo=False,
        ),
        StressConfig(
            "masked_large_logits",
            "MaskablePPO on `examples/maskable.py`'s machine scheduling (its settings) with ReLU (zoo's usual activation),"
            " observations in raw units x 1e11, no VecNormalize: raw logits of order 1e8-1e9, beyond sb3-contrib's"
            " masking constant -1e8, so the mask stops removing actions. Stock raises nothing at this budget: its"
            " failure is the actions taken against the mask",
            "MaskablePPO",
            configs.MACHINE_SCHEDULING,
            _steps(512, 4_096, 20_480),
            dict(policy_kwargs="dict(net_arch=[64, 64], activation_fn=nn.ReLU)"),
            wrapper=_OBS_1E11,
            eval_wrapper=_OBS_1E11,
        ),
        StressConfig(
            "masked_sgd_lr",
            "MaskablePPO on `examples/maskable.py`'s machine scheduling (its settings), plain SGD at learning rate 0.3"
            " without gradient clipping (max_grad_norm=inf; the example: Adam 1e-3, clipping 0.5): the first update"
            " diverges",
            "MaskablePPO",
            configs.MACHINE_SCHEDULING,
            _steps(1_024, 4_096, 20_480),
            dict(
                learning_rate=0.3,
                max_grad_norm=float("inf"),
                policy_kwargs="dict(net_arch=[64, 64], optimizer_class=th.optim.SGD)",
            ),
        ),
    )
}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
EVAL_EPISODES = {"tiny": 1, "quick": 2, "full": 5}
#: The tiny size (the test) runs cheap configurations only (MaskablePPO's SGD case crashes stock at its second rollout)
TINY_CONFIGS = ("lr_100x_ppo", "reward_spikes_1e6", "masked_sgd_lr", "recurrent_log_std")


def jobs(size: str) -> list[tuple[str, str, int, int, int]]:
    """(config, variant, seed, timesteps, eval episodes); variant :data:`REFERENCE`: the tuned reference run."""
    names = TINY_CONFIGS if size == "tiny" else tuple(CONFIGS)
    return [
        (name, variant, seed, CONFIGS[name].timesteps[size], EVAL_EPISODES[size])
        for name in names
        for seed in SEEDS[size]
        for variant in (*variants(CONFIGS[name]), REFERENCE)
    ]


def job_key(job: tuple[str, str, int, int, int]) -> tuple[str, str, int]:
    """What identifies a run: (config, variant, seed); a rerun with the same ``--out`` skips the keys written."""
    return job[:3]


def row_key(row: dict[str, Any]) -> tuple[str, str, int]:
    """:func:`job_key` of the job that wrote ``row`` (a reference run's variant is :data:`REFERENCE`)."""
    return row["config"], REFERENCE if row["role"] == REFERENCE else row["variant"], row["seed"]


def variants(config: StressConfig) -> list[str]:
    """The config's variants, one per role the family has (roles that need a log-std only for continuous actions)."""
    training.register_envs(config.env_id)
    continuous = isinstance(gym.make(config.env_id).action_space, gym.spaces.Box)
    return [
        variant
        for role, variant in zip(ROLES, FAMILY_VARIANTS[config.family], strict=True)
        if variant is not None and (continuous or role not in CONTINUOUS_ONLY_ROLES)
    ]


def run_job(job: tuple[str, str, int, int, int]) -> list[dict[str, Any]]:
    """Train one (config, variant, seed); crashes are results."""
    name, variant, seed, timesteps, episodes = job
    config = CONFIGS[name]
    if variant == REFERENCE:
        # The unbroken settings: rl-zoo's entry (the example's for MaskablePPO) or the library's defaults
        stock = FAMILY_VARIANTS[config.family][0]
        assert stock is not None
        row = training.train(VARIANTS[stock], config.env_id, _settings(config, broken=False), timesteps, seed, episodes)
        return [dict(config=name, role=REFERENCE, **row)]
    zoo = _settings(config, broken=True)
    row = training.train(
        VARIANTS[variant],
        config.env_id,
        zoo,
        timesteps,
        seed,
        episodes,
        wrapper=config.wrapper,
        eval_wrapper=config.eval_wrapper,
        prepare=config.prepare,
    )
    role = ROLES[FAMILY_VARIANTS[config.family].index(variant)]
    return [dict(config=name, role=role, **row)]


def _settings(config: StressConfig, broken: bool) -> configs.ZooConfig:
    """The configuration's starting settings, with its misconfiguration (``broken``) or without."""
    overrides = config.overrides if broken else {}
    if config.zoo:
        return configs.family_config(config.family, config.env_id, **overrides)
    return configs.other_config(f"{config.family}'s defaults", config.env_id, **overrides)


def learning_threshold(runs: list[dict[str, Any]], name: str) -> float | None:
    """
    The return a run of configuration ``name`` must reach to count as learning: :data:`LEARNING_SHARE` of the way
    from a random policy's mean return to the tuned reference runs' mean; None when the reference does not beat
    random (nothing to learn at this budget) or has no finite run.

    :param runs: the suite's rows
    :param name: the configuration
    """
    from benchmarks.robustness_grid import random_return

    returns = [row["final_return"] for row in runs if row["config"] == name and row["role"] == REFERENCE]
    returns = [value for value in returns if np.isfinite(value)]
    if not returns:
        return None
    tuned, random = float(np.mean(returns)), random_return(CONFIGS[name].env_id)
    return random + LEARNING_SHARE * (tuned - random) if tuned > random else None


def _learning(row: dict[str, Any], threshold: float | None) -> bool:
    return threshold is not None and _healthy(row) and np.isfinite(row["final_return"]) and row["final_return"] >= threshold


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    names = TINY_CONFIGS if size == "tiny" else tuple(CONFIGS)
    return dict(
        seeds=list(SEEDS[size]),
        eval_episodes=EVAL_EPISODES[size],
        timesteps={name: CONFIGS[name].timesteps[size] for name in names},
    )


def _healthy(row: dict[str, Any]) -> bool:
    """Finished ``learn()`` without an exception, with finite parameters (MaskablePPO: no action against the mask)."""
    return not row["error"] and row["params_finite"] and not row.get("masked_actions")


def report(out: Path) -> None:
    """``stress.md`` and ``stress.png`` from ``stress.jsonl``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    names = [name for name in CONFIGS if any(row["config"] == name for row in runs)]
    lines = reports.report_header(
        "Stress: misconfigurations, stock SB3 vs sb3-safe",
        meta,
        [
            f"Budget: seeds {meta.get('budget', {}).get('seeds')}, timesteps per run"
            f" {meta.get('budget', {}).get('timesteps')}; final return: deterministic policy,"
            f" {meta.get('budget', {}).get('eval_episodes')} episodes of the unmodified task (observation scaling kept).",
            "Start: rl-zoo's tuned entry for the env (`rl_zoo3/hyperparams/{ppo,a2c}.yml`), then one thing broken;"
            " RecurrentPPO: sb3-contrib's defaults plus the settings of the measured case; MaskablePPO (no zoo file):"
            " the settings of `examples/maskable.py`.",
            "Roles: stock SB3 (PPO / A2C, MlpPolicy; sb3-contrib's RecurrentPPO / MaskablePPO with their MlpLstmPolicy"
            " / MlpPolicy); safe policy (the same algorithm with SafeMlpPolicy, SafeMlpLstmPolicy or"
            " SafeMaskableMlpPolicy); safe algorithm (KLAdaptivePPO / SafeA2C; 'n/a' for the sb3-contrib algorithms,"
            " which have none); safe algorithm + `NonFiniteGuardCallback(on_nonfinite='rollback')` (for the"
            " sb3-contrib algorithms: the safe policy + the guard; max 3 rollbacks, then it stops training, which is"
            " counted as 'stopped by guard'); safe policy with `log_std_range=(-5, 2)` instead of the default (-20, 2)"
            " (continuous actions only, 'n/a' otherwise).",
            "Ended with exploration collapsed: some log-std entry at the lower bound of the policy's range at the end"
            " (sb3-safe's `log_std_range`; -20 for stock policies), finite but no longer exploring. Final log-std max:"
            " the largest log-std entry at the end, per seed (stock policies have no upper bound; sb3-safe's is 2).",
            "Actions against the mask (MaskablePPO): training actions sampled although the env's mask forbade them;"
            " a run with any is not counted as healthy.",
        ],
    )
    summary, learning, details = [], [], []
    for name in names:
        config = CONFIGS[name]
        threshold = learning_threshold(runs, name)
        references = [row["final_return"] for row in runs if row["config"] == name and row["role"] == REFERENCE]
        learned = [f"`{name}`", reports.mean_std(references), "n/a" if threshold is None else f"{threshold:.1f}"]
        cells = [f"`{name}`"]
        for role, variant in zip(ROLES, FAMILY_VARIANTS[config.family], strict=True):
            selected = [row for row in runs if row["config"] == name and row["role"] == role]
            if variant is None or not selected:
                cells.append("n/a")
                learned.append("n/a")
                continue
            healthy = sum(_healthy(row) for row in selected)
            cells.append(f"{healthy}/{len(selected)}")
            learned.append(
                "n/a" if threshold is None else f"{sum(_learning(row, threshold) for row in selected)}/{len(selected)}"
            )
            errors = sorted({row["error"] for row in selected if row["error"]})
            errors += sorted({f"in evaluation: {row['eval_error']}" for row in selected if row.get("eval_error")})
            details.append(
                [
                    f"`{name}`",
                    f"{role}: {variant}",
                    sum(bool(row["error"]) for row in selected),
                    sum(not row["params_finite"] for row in selected),
                    _sum(selected, "skipped_updates"),
                    _sum(selected, "guard_rollbacks"),
                    _sum(selected, "guard_stopped"),
                    _sum(selected, "log_std_collapsed"),
                    _per_seed(selected, "log_std_max"),
                    _sum(selected, "masked_actions"),
                    reports.mean_std(row["final_return"] for row in selected),
                    "<br>".join(errors) or "-",
                ]
            )
        summary.append([*cells, config.description])
        learning.append(learned)
    lines += [
        "## Runs that finished with finite parameters and no exception (MaskablePPO: and no action against the mask)",
        "",
        *reports.table(["config", *ROLES, "misconfiguration"], summary),
        "",
        "![stress](stress.png)",
        "",
        f"## Runs that end learning (final return >= {LEARNING_SHARE:.0%} of the way from random to the tuned return)",
        "",
        "Tuned reference: stock SB3 on the configuration's unbroken settings (rl-zoo's entry, the example's, or the"
        " library's defaults), same budget and seeds; random: uniformly random actions (100 episodes). 'n/a' where the"
        " reference does not beat random at this budget: nothing to learn there.",
        "",
        *reports.table(["config", "tuned reference return", "threshold", *ROLES], learning),
        "",
        "## Per configuration and variant",
        "",
        *reports.table(
            [
                "config",
                "variant",
                "exceptions",
                "non-finite params",
                "skipped steps",
                "guard rollbacks",
                "stopped by guard",
                "ended with exploration collapsed",
                "final log-std max per seed",
                "actions against the mask",
                "final return",
                "exceptions (type: first line)",
            ],
            details,
        ),
    ]
    reports.write_report(out / f"{SUITE}.md", lines)
    plot(runs, names, out)


def _sum(rows: list[dict[str, Any]], key: str) -> int | str:
    values = [row[key] for row in rows if row.get(key) is not None]
    return int(sum(values)) if values else "-"


def _per_seed(rows: list[dict[str, Any]], key: str) -> str:
    """The rows' values of ``key`` in seed order (``-`` if none has one)."""
    values = [row.get(key) for row in sorted(rows, key=lambda row: row["seed"])]
    return (
        "-" if all(value is None for value in values) else " / ".join(f"{value:.3g}" for value in values if value is not None)
    )


def plot(runs: list[dict[str, Any]], names: list[str], out: Path) -> None:
    """Share of healthy runs per configuration and role."""
    plt = reports.pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 1.1 * len(names) + 2), 4.5))
    x = np.arange(len(names))
    width = 0.8 / len(ROLES)
    for index, role in enumerate(ROLES):
        shares = []
        for name in names:
            selected = [row for row in runs if row["config"] == name and row["role"] == role]
            shares.append(np.mean([_healthy(row) for row in selected]) if selected else np.nan)
        axis.bar(x + (index - (len(ROLES) - 1) / 2) * width, shares, width=width, label=role)
    axis.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    axis.set(
        ylabel="share of runs: no exception, finite params\n(MaskablePPO: mask respected)",
        ylim=(0, 1.25),
        title="Stress: runs that stayed finite",
    )
    axis.legend(fontsize=7, loc="upper center", ncol=3)
    reports.save_figure(figure, out / "stress.png")
