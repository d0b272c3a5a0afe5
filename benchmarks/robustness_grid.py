"""
The robustness map's grid (:mod:`benchmarks.robustness`): its tasks, where their tuned settings come from, the
learning-rate factors, entropy coefficients and seeds per size, the jobs, and the random policy whose return is the
0 of the normalized score. The suite and its report both read it.
"""

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks import configs, training, variants

SUITE = "robustness"
#: Learning rate = tuned x factor: log-spaced around 1, mostly above it (too high is the common mistake)
LR_FACTORS = {"tiny": (1.0, 100.0), "quick": (0.1, 1.0, 100.0), "full": (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 1000.0)}
#: The factors of the two sb3-contrib tasks (RecurrentPPO, MaskablePPO): the tuned one and two too high
FEW_LR_FACTORS = {"tiny": (1.0, 100.0), "quick": (1.0, 100.0), "full": (1.0, 10.0, 100.0)}
#: The entropy coefficient besides the tuned one
HIGH_ENT_COEF = 0.1
#: Entropy coefficients per size: the tuned one only, or also HIGH_ENT_COEF
ENT_CHOICES = {"tiny": ("tuned",), "quick": ("tuned",), "full": ("tuned", "high")}
TUNED_ENT_ONLY = {"tiny": ("tuned",), "quick": ("tuned",), "full": ("tuned",)}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
EVAL_EPISODES = {"tiny": 1, "quick": 5, "full": 10}
#: Episodes of the random policy whose mean return is the 0 of the normalized score
RANDOM_EPISODES = 100
#: ``Task.config_source`` of the masked-action task (its settings are ``examples/maskable.py``'s, not rl-zoo's)
MASKABLE = "maskable"


@dataclass(frozen=True)
class Task:
    """
    One environment, where its settings come from, and the variants compared on it.

    :param env_id: the environment (and the task's name in rows and file names)
    :param config_source: the rl-zoo file read (``"ppo"``, ``"a2c"``, ``"ppo_lstm"``), or :data:`MASKABLE` for
        ``examples/maskable.py``'s settings (:func:`benchmarks.configs.maskable_config`)
    :param stock: the stock variant: its mean return at the tuned settings is the 1 of the normalized score
    :param peers: the other peers (what an SB3 user has without sb3-safe); the stock variant is a peer too
    :param safe: the sb3-safe variants
    :param recommended: the sb3-safe variants of the recommended stack, whose targets the report checks
    :param timesteps: training budget per size
    :param factors: learning-rate factors per size
    :param ent_choices: ``"tuned"`` and / or ``"high"`` (:data:`HIGH_ENT_COEF`) per size
    :param overrides: settings changed at a size (tiny: shorter rollouts, so that the smoke test takes seconds)
    :param note: what the report says about this task's budget or peers
    :param run_s: measured seconds of one stock run at the tuned settings and the full budget (see the module's
        sizing): the longest tasks' jobs are handed out first so that the pool's processes end together
    """

    env_id: str
    config_source: str
    stock: str
    peers: tuple[str, ...]
    safe: tuple[str, ...]
    recommended: tuple[str, ...]
    timesteps: dict[str, int]
    factors: dict[str, tuple[float, ...]] = field(default_factory=lambda: LR_FACTORS)
    ent_choices: dict[str, tuple[str, ...]] = field(default_factory=lambda: ENT_CHOICES)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str = ""
    run_s: float = 0.0

    def __post_init__(self) -> None:
        if not set(self.recommended) <= set(self.safe):
            raise ValueError(f"{self.env_id}: recommended variants {self.recommended} must be among safe {self.safe}")
        unknown = [name for name in self.variants if name not in variants.VARIANTS]
        if unknown:
            raise ValueError(f"{self.env_id}: unknown variants {unknown}")

    @property
    def peer_variants(self) -> tuple[str, ...]:
        """The stock variant and the other peers."""
        return (self.stock, *self.peers)

    @property
    def variants(self) -> tuple[str, ...]:
        return (*self.peer_variants, *self.safe)

    @property
    def algo(self) -> str:
        """The stock algorithm's name (``"PPO"``, ``"A2C"``, ``"RecurrentPPO"``, ``"MaskablePPO"``)."""
        return variants.VARIANTS[self.stock].algo


TASKS = {
    task.env_id: task
    for task in (
        Task(
            "Pendulum-v1",
            "ppo",
            "PPO",
            ("PPO(target_kl=0.01)", "PPO+SBX-lr"),
            # KLAdaptivePPO without the adaptive lr: which of its two KL controllers (penalty, learning rate) to use
            ("PPO+SafeMlpPolicy+guard+KL-lr", "KLAdaptivePPO+guard", "KLAdaptivePPO+guard+KL-lr"),
            ("PPO+SafeMlpPolicy+guard+KL-lr", "KLAdaptivePPO+guard+KL-lr"),
            dict(tiny=512, quick=4_096, full=49_152),
            overrides=dict(tiny=dict(n_steps=64)),
            note="49,152 steps: half of zoo's 1e5, by which the tuned PPO has converged (learning suite).",
            run_s=38.4,
        ),
        Task(
            "CartPole-v1",
            "a2c",
            "A2C",
            (),
            ("SafeA2C+guard", "SafeA2C+guard+KL-lr", "A2C+SafeMlpPolicy+guard+KL-lr"),
            ("SafeA2C+guard+KL-lr", "A2C+SafeMlpPolicy+guard+KL-lr"),
            dict(tiny=1_000, quick=20_000, full=100_000),
            note="100,000 steps: a fifth of zoo's 5e5. The only peer is stock A2C: A2C has no `target_kl` (one"
            " gradient step per update, nothing to stop early), and SBX's rule is defined on PPO's per-minibatch"
            " ratio, so these peers do not exist for A2C.",
            run_s=23.4,
        ),
        Task(
            "Acrobot-v1",
            "ppo",
            "PPO",
            ("PPO(target_kl=0.01)", "PPO+SBX-lr"),
            ("PPO+SafeMlpPolicy+guard+KL-lr", "KLAdaptivePPO+guard+KL-lr"),
            ("PPO+SafeMlpPolicy+guard+KL-lr", "KLAdaptivePPO+guard+KL-lr"),
            dict(tiny=512, quick=8_192, full=49_152),
            overrides=dict(tiny=dict(n_steps=16)),
            note="49,152 steps (12 rollouts of 16 x 256), a twentieth of zoo's 1e6, to fit the budget: stock PPO at the"
            " tuned settings is far above the random policy by then (references below).",
            run_s=21.0,
        ),
        Task(
            "CartPoleNoVel-v1",
            "ppo_lstm",
            "RecurrentPPO",
            ("RecurrentPPO(target_kl=0.01)",),
            ("RecurrentPPO+SafeMlpLstmPolicy+guard+KL-lr",),
            ("RecurrentPPO+SafeMlpLstmPolicy+guard+KL-lr",),
            dict(tiny=256, quick=2_048, full=32_768),
            FEW_LR_FACTORS,
            TUNED_ENT_ONLY,
            overrides=dict(tiny=dict(n_epochs=2)),
            note="32,768 steps (128 rollouts of 8 x 32), a third of zoo's 1e5, to fit the budget (the tuned run learns"
            " by then: references below). Peers: stock and `target_kl=0.01` (`benchmarks/variants.py` has no"
            " `+SBX-lr` variant of RecurrentPPO).",
            run_s=108.0,
        ),
        Task(
            configs.MACHINE_SCHEDULING,
            MASKABLE,
            "MaskablePPO",
            ("MaskablePPO(target_kl=0.01)",),
            ("MaskablePPO+SafeMaskableMlpPolicy+guard+KL-lr",),
            ("MaskablePPO+SafeMaskableMlpPolicy+guard+KL-lr",),
            dict(tiny=512, quick=8_192, full=100_000),
            FEW_LR_FACTORS,
            TUNED_ENT_ONLY,
            note="The example's own budget (100,000 steps, i.e. 196 whole rollouts of 4 x 128). Peers: stock and"
            " `target_kl=0.01` (`benchmarks/variants.py` has no `+SBX-lr` variant of MaskablePPO).",
            run_s=68.5,
        ),
    )
}


# --------------------------------------------------------------------------------------------------------------
# Settings of the grid
# --------------------------------------------------------------------------------------------------------------


def task_config(task: Task, **overrides: Any) -> configs.ZooConfig:
    """The task's settings (rl-zoo's entry, or the maskable example's) with ``overrides``."""
    if task.config_source == MASKABLE:
        return configs.maskable_config(**overrides)
    return configs.zoo_config(task.config_source, task.env_id, **overrides)


def stock_class(task: Task) -> type:
    """The stock algorithm's class (its defaults fill what an entry leaves out, as rl-zoo's training does)."""
    from sb3_contrib import MaskablePPO, RecurrentPPO
    from stable_baselines3 import A2C, PPO

    return {"PPO": PPO, "A2C": A2C, "RecurrentPPO": RecurrentPPO, "MaskablePPO": MaskablePPO}[task.algo]


def tuned_settings(task: Task) -> tuple[Any, float]:
    """
    The entry's learning rate (a float or zoo's linear schedule) and entropy coefficient; where the entry sets none
    (``a2c.yml``'s CartPole-v1 and ``ppo.yml``'s Acrobot-v1 set no learning rate), the stock algorithm's default.
    """
    config = task_config(task)
    defaults = inspect.signature(stock_class(task).__init__).parameters
    learning_rate = config.kwargs.get("learning_rate", defaults["learning_rate"].default)
    ent_coef = float(config.kwargs.get("ent_coef", defaults["ent_coef"].default))
    return learning_rate, ent_coef


def initial_learning_rate(learning_rate: Any) -> float:
    """The learning rate at the start of training: the value, or a linear schedule's initial value."""
    from rl_zoo3.utils import SimpleLinearSchedule

    if isinstance(learning_rate, SimpleLinearSchedule):
        return learning_rate.initial_value
    if callable(learning_rate):
        raise TypeError(f"only rl-zoo's linear schedules can be scaled, not {learning_rate!r}")
    return float(learning_rate)


def scaled_learning_rate(learning_rate: Any, factor: float) -> float | str:
    """
    ``learning_rate`` x ``factor`` as an override: a float, or for zoo's ``lin_`` schedule the string
    ``lin_<initial value x factor>``, so the whole schedule is scaled and stays linear (to 0 at the end).
    """
    from rl_zoo3.utils import SimpleLinearSchedule

    scaled = initial_learning_rate(learning_rate) * factor
    return f"lin_{scaled!r}" if isinstance(learning_rate, SimpleLinearSchedule) else scaled


def ent_coefs(task: Task, size: str) -> list[float]:
    """The entropy coefficients of the task's grid at ``size`` (one if the tuned one is HIGH_ENT_COEF)."""
    tuned = tuned_settings(task)[1]
    return sorted({tuned if choice == "tuned" else HIGH_ENT_COEF for choice in task.ent_choices[size]})


# --------------------------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------------------------

#: (task, variant, lr factor, ent_coef, seed, size)
Job = tuple[str, str, float, float, int, str]


def jobs(size: str) -> list[Job]:
    """
    Every run of the grid at ``size``: the tuned ent_coef's runs of every task first, then the others; the longest
    tasks' first within each half. A run cut short is then a complete map at the tuned ent_coef.
    """
    tasks = sorted(TASKS.values(), key=lambda task: -task.run_s)
    grid = [
        (task.env_id, variant, factor, ent_coef, seed, size)
        for task in tasks
        for factor in task.factors[size]
        for ent_coef in ent_coefs(task, size)
        for seed in SEEDS[size]
        for variant in task.variants
    ]
    tuned_ent_coef = {task.env_id: tuned_settings(task)[1] for task in tasks}
    return sorted(grid, key=lambda job: job[3] != tuned_ent_coef[job[0]])


def job_key(job: Job) -> tuple[str, str, float, float, int]:
    """What identifies a run: (task, variant, lr factor, ent_coef, seed); a rerun skips the keys already written."""
    return job[:5]


def row_key(row: dict[str, Any]) -> tuple[str, str, float, float, int]:
    """:func:`job_key` of the job that wrote ``row``."""
    return row["task"], row["variant"], row["lr_factor"], row["ent_coef"], row["seed"]


def cell_config(task: Task, factor: float, ent_coef: float, size: str) -> configs.ZooConfig:
    """The task's settings in one grid cell: learning rate tuned x ``factor``, ``ent_coef``, the size's overrides."""
    tuned_lr, _ = tuned_settings(task)
    overrides = dict(task.overrides.get(size, {}), learning_rate=scaled_learning_rate(tuned_lr, factor), ent_coef=ent_coef)
    return task_config(task, **overrides)


# --------------------------------------------------------------------------------------------------------------
# The random policy (0 of the normalized score)
# --------------------------------------------------------------------------------------------------------------


@functools.cache
def random_return(env_id: str, episodes: int = RANDOM_EPISODES, seed: int = 0) -> float:
    """
    Mean return of a uniformly random policy over ``episodes`` seeded episodes. On an env with action masks
    (MachineScheduling-v0) the random policy picks uniformly among the allowed actions, as MaskablePPO acts only
    among them: the example's "random ready machine".
    """
    import gymnasium as gym

    training.register_envs(env_id)
    env = gym.make(env_id)
    env.action_space.seed(seed)
    masks = getattr(env.unwrapped, "action_masks", None)
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            action = rng.choice(np.flatnonzero(masks())) if masks is not None else env.action_space.sample()
            _, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))
