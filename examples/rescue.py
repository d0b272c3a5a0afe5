"""
Rescue: SB3's ``Expected parameter scale ... but found invalid values`` crash, and how sb3-safe handles it.

The reported setting: A2C with a Gaussian policy on a 3-dim observation, 4-dim action task whose reward grows with
the action size, at a learning rate far too high (3.0). Three runs of the same training:

1. stock A2C + ``MlpPolicy``: the log-std parameter becomes non-finite and torch raises ``Expected parameter scale``;
2. the same with :class:`~sb3_safe.NonFiniteGuardCallback` (``on_nonfinite="rollback"``): the guard catches the
   update that made the parameters non-finite, names the tensors, and rolls back to the last state that passed its
   full check (for A2C the one of at most ``snapshot_every`` = 1,000 steps ago: here the start) with a halved
   learning rate, with which this run then trains to the end; had rollbacks not helped, it would have stopped
   cleanly after ``max_rollbacks`` and saved the last healthy model to ``save_path``;
3. ``SafeMlpPolicy``, the root fix: its log-std stays inside its bounds, so training runs to the end.

::

    python examples/rescue.py                       # 5,000 steps per run, seconds
    python examples/rescue.py --timesteps 1000
"""

import argparse
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3 import A2C

from sb3_safe import NonFiniteGuardCallback, SafeMlpPolicy

LEARNING_RATE = 3.0


class LargeActionRewardEnv(gym.Env):
    """The report's shapes: 3-dim observation, 4-dim Box action; the reward |a|_1 pushes the log-std up."""

    observation_space = spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._steps += 1
        observation = self.np_random.normal(size=3).astype(np.float32)
        return observation, float(np.abs(action).sum()), False, self._steps >= 50, {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=5000, help="training budget of each run")
    parser.add_argument("--output", type=Path, default=Path("runs/rescue"), help="folder for the last healthy model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"1. stock A2C, MlpPolicy, learning rate {LEARNING_RATE}")
    model = A2C("MlpPolicy", LargeActionRewardEnv(), learning_rate=LEARNING_RATE, seed=args.seed)
    try:
        model.learn(args.timesteps)
        print(f"stock A2C: no crash in {model.num_timesteps} steps")
    except ValueError as error:
        print(f"stock A2C: ValueError: {str(error).splitlines()[0]}")
        print(f"  at timestep {model.num_timesteps}; policy.log_std = {model.policy.log_std.data.tolist()}")

    print("\n2. the same with NonFiniteGuardCallback(on_nonfinite='rollback')")
    model = A2C("MlpPolicy", LargeActionRewardEnv(), learning_rate=LEARNING_RATE, seed=args.seed)
    args.output.mkdir(parents=True, exist_ok=True)
    healthy_path = args.output / "last_healthy.zip"
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", save_path=str(healthy_path))
    model.learn(args.timesteps, callback=guard)  # does not raise
    print("\n".join(guard.events[0].message.splitlines()[:4]) if guard.events else "guard: no event")
    learning_rate = model.policy.optimizer.param_groups[0]["lr"]
    print(f"guard: actions {[event.action for event in guard.events]}, learning rate now {learning_rate:g}")
    # The stop reason repeats the event; its last line says what the guard did
    print(f"guard: {guard.stop_reason.splitlines()[-1] if guard.stop_reason else 'training ran to the end'}")

    print("\n3. SafeMlpPolicy (bounded log-std) with the guard")
    model = A2C(SafeMlpPolicy, LargeActionRewardEnv(), learning_rate=LEARNING_RATE, seed=args.seed)
    # Patience in environment steps (the default, 10,000, is longer than this example's runs)
    patience = 200
    guard = NonFiniteGuardCallback(on_nonfinite="rollback", collapse_patience=patience)
    model.learn(args.timesteps, callback=guard)
    low, high = model.policy.log_std_range
    log_std = model.policy.log_std.data
    print(
        f"SafeMlpPolicy: trained {model.num_timesteps} steps, {len(guard.events)} guard events, "
        f"log-std parameter in [{log_std.min().item():.3g}, {log_std.max().item():.3g}] (bounds [{low:g}, {high:g}])"
    )
    # Finite is not healthy: a log-std pinned at a bound no longer explores (or explores only noise); the guard says so
    print(f"guard: {guard.exploration.message or f'no log-std sat at a bound for {patience} environment steps'}")


if __name__ == "__main__":
    main()
