"""
Invalid action masking: sb3-contrib's ``MaskablePPO`` with :class:`~sb3_safe.SafeMaskableMlpPolicy`.

The task: each step, run one of 6 machines. Their payouts are 0, 0.2, ..., 1 in an order shuffled at every episode
(the observation shows them), and a machine paying ``k / 5`` then needs ``k`` steps of cooldown, during which
running it is invalid: the episode ends with a penalty of -1. The action mask allows exactly the machines that are
ready, so it changes with the state at every step. Per 30-step episode, the optimal schedule (dynamic programming)
earns 18.2, always running the best ready machine 15, a random ready machine about 12.

The policy is trained with the masks, then evaluated with them (it never runs a machine that is cooling down) and
without them (the same network: an invalid machine soon ends the episode)::

    python examples/maskable.py                      # about a minute on 2 CPU cores
    python examples/maskable.py --timesteps 512      # smoke run
"""

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.evaluation import evaluate_policy
from stable_baselines3.common.env_util import make_vec_env

from sb3_safe import SafeMaskableMlpPolicy

N_MACHINES = 6
LONGEST_COOLDOWN = N_MACHINES - 1
EPISODE_LENGTH = 30
INVALID_PENALTY = -1.0
#: MaskablePPO's settings here (the benchmarks train with the same ones)
N_ENVS = 4
TIMESTEPS = 100_000
HYPERPARAMS: dict = dict(
    n_steps=128,
    batch_size=128,
    n_epochs=10,
    gamma=0.99,
    learning_rate=1e-3,
    ent_coef=0.01,
    policy_kwargs=dict(net_arch=[64, 64]),
)


def next_cooldowns(remaining: tuple[int, ...], cooldowns: tuple[int, ...], action: int) -> tuple[int, ...]:
    """The remaining cooldowns after running the ready machine ``action``."""
    return tuple(cooldowns[i] if i == action else max(left - 1, 0) for i, left in enumerate(remaining))


class MachineSchedulingEnv(gym.Env):
    """
    Run one of ``N_MACHINES`` machines per step. Each episode shuffles which machine pays ``k / LONGEST_COOLDOWN``
    and cools down for ``k`` steps (``k = 0 .. LONGEST_COOLDOWN``). Observation: each machine's payout, its remaining
    cooldown (divided by the longest), and the time left.
    """

    observation_space = spaces.Box(0.0, 1.0, (2 * N_MACHINES + 1,), np.float32)
    action_space = spaces.Discrete(N_MACHINES)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.cooldowns = tuple(int(k) for k in self.np_random.permutation(N_MACHINES))
        self._remaining = (0,) * N_MACHINES
        self._steps = 0
        return self._observation(), {}

    def action_masks(self) -> np.ndarray:
        """The machines that are ready (``MaskablePPO`` calls this before each step)."""
        return np.array(self._remaining) == 0

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._steps += 1
        truncated = self._steps >= EPISODE_LENGTH
        if self._remaining[action] > 0:
            return self._observation(), INVALID_PENALTY, True, truncated, {"invalid": True}
        self._remaining = next_cooldowns(self._remaining, self.cooldowns, int(action))
        return self._observation(), self.cooldowns[action] / LONGEST_COOLDOWN, False, truncated, {"invalid": False}

    def _observation(self) -> np.ndarray:
        payouts = np.array(self.cooldowns) / LONGEST_COOLDOWN
        remaining = np.array(self._remaining) / LONGEST_COOLDOWN
        return np.concatenate([payouts, remaining, [1.0 - self._steps / EPISODE_LENGTH]]).astype(np.float32)


def optimal_return() -> float:
    """
    The largest return of an episode, by dynamic programming over (remaining cooldowns, step): 720 x 30 states.
    The same for every shuffle, which only renames the machines.
    """
    cooldowns = tuple(range(N_MACHINES))

    @functools.cache
    def value(remaining: tuple[int, ...], step: int) -> float:
        if step == EPISODE_LENGTH:
            return 0.0
        ready = [action for action, left in enumerate(remaining) if left == 0]
        return max(a / LONGEST_COOLDOWN + value(next_cooldowns(remaining, cooldowns, a), step + 1) for a in ready)

    return value((0,) * N_MACHINES, 0)


def scripted_return(choose: Callable[[np.ndarray, np.ndarray, np.random.Generator], int], seed: int) -> float:
    """Mean return over 100 episodes of a scripted policy ``choose(mask, observation, rng) -> action``."""
    env, rng, returns = MachineSchedulingEnv(), np.random.default_rng(seed), []
    for episode in range(100):
        observation, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            observation, reward, terminated, truncated, _ = env.step(choose(env.action_masks(), observation, rng))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def best_ready(mask: np.ndarray, observation: np.ndarray, rng: np.random.Generator) -> int:
    return int(np.argmax(np.where(mask, observation[:N_MACHINES], -1.0)))


def random_ready(mask: np.ndarray, observation: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.choice(np.flatnonzero(mask)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=TIMESTEPS, help="training budget")
    parser.add_argument("--output", type=Path, default=Path("runs/maskable"), help="folder for the model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=20)
    args = parser.parse_args()

    args.output.mkdir(parents=True, exist_ok=True)
    env = make_vec_env(MachineSchedulingEnv, n_envs=N_ENVS, seed=args.seed)
    model = MaskablePPO(SafeMaskableMlpPolicy, env, seed=args.seed, **HYPERPARAMS)
    model.learn(args.timesteps)
    model_path = args.output / "maskable_ppo_machines.zip"
    model.save(model_path)
    print(f"saved model: {model_path}")

    best, random = scripted_return(best_ready, args.seed), scripted_return(random_ready, args.seed)
    print(f"optimal schedule {optimal_return():.1f}, best ready machine {best:.1f}, random ready machine {random:.1f}")
    eval_env = make_vec_env(MachineSchedulingEnv, n_envs=1, seed=args.seed + 1000)
    model = MaskablePPO.load(model_path, device="cpu")
    masked, masked_std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True)
    unmasked, unmasked_std = evaluate_policy(
        model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True, use_masking=False
    )
    print(f"without masks: mean return {unmasked:.1f} +/- {unmasked_std:.1f} (an invalid machine ends the episode)")
    print(f"evaluation over {args.eval_episodes} episodes (masked): mean return {masked:.1f} +/- {masked_std:.1f}")


if __name__ == "__main__":
    main()
