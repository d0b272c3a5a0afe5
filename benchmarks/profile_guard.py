"""
Where the guard's remaining cost goes: ``python -m benchmarks.profile_guard``.

After the overhead suite's warm-up, on its settings, for each case: ``model.learn(steps, callback=guard)`` with
``NonFiniteGuardCallback(on_nonfinite="rollback")``,

1. timed per event, without a profiler: microseconds per call of each of the guard's events and optimizer hooks, and
   their share of ``learn()`` (what the guard costs, call by call, inside a real training loop, where caches are
   cold for its code);
2. under cProfile: the own time of sb3-safe's functions as a share of ``learn()``. numpy's and torch's work called
   from them is counted under those libraries, and cProfile inflates the share of Python-heavy code: read it for
   where the cost is, the first table and the overhead suite for how large it is.
"""

import cProfile
import pstats
import time
from typing import Any

import torch as th

from benchmarks import overhead
from sb3_safe import NonFiniteGuardCallback

#: (variant, env, timesteps profiled): the families whose guard cost stays above the target
CASES = (("A2C", "Hopper-v5", 3000), ("DQN", "CartPole-v1", 2000), ("PPO", "Hopper-v5", 4096))


def _trained_model(algo: str, env_id: str) -> Any:
    model = overhead.build_model(algo, env_id, seed=0)
    model.learn(overhead.warm_up_steps(model))
    return model


def time_events(algo: str, env_id: str, steps: int) -> None:
    """Print microseconds per call and share of ``learn()`` of each guard event in ``steps`` steps."""
    model = _trained_model(algo, env_id)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    clock = overhead.CallbackClock(guard)
    start = time.perf_counter()
    model.learn(steps, callback=guard, reset_num_timesteps=False)
    total = time.perf_counter() - start
    print(f"## {algo} {env_id}, {steps} steps: {total / steps * 1e6:.0f} us per env step, guard {clock.seconds / total:.2%}")
    for name, (n_calls, seconds) in sorted(clock.calls.items(), key=lambda item: -item[1][1]):
        if n_calls:
            print(f"  {name:24s} {int(n_calls):6d} calls {seconds / n_calls * 1e6:7.1f} us each  {seconds / total:6.2%}")


def profile(algo: str, env_id: str, steps: int, top: int = 8) -> None:
    """Print the ``top`` sb3-safe functions by own time in ``steps`` guarded steps of ``algo`` on ``env_id``."""
    model = _trained_model(algo, env_id)
    guard = NonFiniteGuardCallback(on_nonfinite="rollback")
    profiler = cProfile.Profile()
    profiler.enable()
    model.learn(steps, callback=guard, reset_num_timesteps=False)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = max(cumulative for (_, _, name), (_, _, _, cumulative, _) in stats.items() if name == "learn")
    own = sorted(((row[2], key) for key, row in stats.items() if "sb3_safe" in key[0]), reverse=True)
    share = sum(seconds for seconds, _ in own) / total
    print(f"## {algo} {env_id}, {steps} steps, cProfile: learn() {total:.2f} s, own time in sb3-safe {share:.2%}")
    for seconds, (path, line, name) in own[:top]:
        print(f"  {seconds / total:6.2%}  {path.split('sb3_safe/')[-1]}:{line} {name}")


if __name__ == "__main__":
    th.set_num_threads(1)
    for case in CASES:
        time_events(*case)
    for case in CASES:
        profile(*case)
