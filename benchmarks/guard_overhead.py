"""
Overhead of NonFiniteGuardCallback on a healthy PPO run.

Runs PPO (SB3 defaults) on CartPole-v1 with and without the guard, in interleaved pairs (the order alternates
from pair to pair so that drifts in machine load do not favour either side), and writes to
benchmarks/results/guard_overhead.md the median ratios (time with guard / time without) of

- wall time, the number asked for, which on a shared machine also measures the other processes;
- CPU time of this process (one torch thread), which other processes disturb much less;

and, from one more guarded run with its callback methods and optimizer hook timed, the share of the run's
CPU time spent inside the guard.

Usage: python benchmarks/guard_overhead.py --timesteps 4096 --pairs 5
"""

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch as th
from stable_baselines3 import PPO

import sb3_safe
from sb3_safe import NonFiniteGuardCallback

TARGET = 1.02


def timed_run(timesteps: int, seed: int, guard: NonFiniteGuardCallback | None) -> tuple[float, float]:
    """Wall and CPU seconds spent in ``learn()`` (model construction excluded)."""
    model = PPO("MlpPolicy", "CartPole-v1", seed=seed, device="cpu")
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(timesteps, callback=guard)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert guard is None or not guard.events, "the guard fired on a healthy run"
    return wall, cpu


def guard_cpu_share(timesteps: int, seed: int) -> float:
    """CPU time inside the guard (its callback methods and optimizer hook) over the CPU time of ``learn()``."""
    guard = NonFiniteGuardCallback()
    spent = [0.0]
    names = ("_on_training_start", "_on_rollout_start", "_on_step", "_on_rollout_end", "_on_training_end")
    for name in (*names, "_after_optimizer_step"):
        method = getattr(guard, name)

        def timed(*args: Any, method: Callable[..., Any] = method) -> Any:
            start = time.thread_time()
            result = method(*args)
            spent[0] += time.thread_time() - start
            return result

        # Instance attributes shadow the methods, the hook included (it is looked up at training start)
        setattr(guard, name, timed)
    _, cpu = timed_run(timesteps, seed, guard)
    return spent[0] / cpu


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timesteps", type=int, default=8192, help="timesteps per run")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved (guard, no guard) pairs, at least 5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps timings stable)")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results", "guard_overhead.md"))
    args = parser.parse_args()
    th.set_num_threads(args.threads)

    load_before = os.getloadavg()
    # Warm-up run: imports, allocator and env registration costs must not land on the first measured run
    timed_run(2048, args.seed, NonFiniteGuardCallback())
    rows = []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        times = {
            with_guard: timed_run(args.timesteps, args.seed + pair, NonFiniteGuardCallback() if with_guard else None)
            for with_guard in order
        }
        (wall_with, cpu_with), (wall_without, cpu_without) = times[True], times[False]
        rows.append((wall_with, wall_without, wall_with / wall_without, cpu_with, cpu_without, cpu_with / cpu_without))
        print(f"pair {pair}: wall ratio {rows[-1][2]:.4f}, CPU ratio {rows[-1][5]:.4f}", flush=True)
    median_wall = statistics.median(row[2] for row in rows)
    median_cpu = statistics.median(row[5] for row in rows)
    share = guard_cpu_share(args.timesteps, args.seed)
    load_after = os.getloadavg()
    print(f"share of CPU time inside the guard: {share:.4f}")

    lines = [
        "# NonFiniteGuardCallback overhead on a healthy PPO run",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"- Machine: {cpu_name()}, {os.cpu_count()} logical cores, torch threads {args.threads}"
        f" ({platform.system()} {platform.release()})",
        f"- Versions: Python {platform.python_version()}, torch {th.__version__}, stable-baselines3 "
        f"{stable_baselines3.__version__}, gymnasium {gym.__version__}, numpy {np.__version__},"
        f" sb3-safe {sb3_safe.__version__}",
        f"- Budget: PPO (SB3 defaults: n_steps=2048, batch_size=64, n_epochs=10) on CartPole-v1, {args.timesteps} timesteps"
        f" per run, {args.pairs} interleaved pairs (order alternating), seeds {args.seed}..{args.seed + args.pairs - 1},"
        " guard with default settings (on_nonfinite='raise')",
        f"- Machine load (1-min load average) before / after: {load_before[0]:.2f} / {load_after[0]:.2f}"
        " (other processes share the machine; the CPU-time ratio and the in-guard share are less sensitive to them)",
        "",
        "| pair | wall with guard (s) | wall without (s) | wall ratio | CPU with guard (s) | CPU without (s) | CPU ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += ["| {} | {:.2f} | {:.2f} | {:.4f} | {:.2f} | {:.2f} | {:.4f} |".format(i, *row) for i, row in enumerate(rows)]
    lines += [
        "",
        f"- **Median wall-time ratio: {median_wall:.4f}**"
        f" (target <= {TARGET}: {'met' if median_wall <= TARGET else 'NOT met'})",
        f"- Median CPU-time ratio: {median_cpu:.4f}",
        f"- CPU time spent inside the guard (callback methods and optimizer hook, one more guarded run): {100 * share:.2f} %",
        "",
    ]
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as file:
        file.write("\n".join(lines))
    print(f"median wall ratio {median_wall:.4f}, median CPU ratio {median_cpu:.4f}; written to {args.output}")


if __name__ == "__main__":
    main()
