"""
Overhead: steps per second of stock SB3 and the sb3-safe variants on healthy runs, CartPole-v1 and Hopper-v5.

All variants of one environment run in ONE process, each with its own model trained chunk by chunk, interleaved
(the order rotates from round to round, so drifts in machine load do not favour any variant); each variant is
compared with its baseline in the same round and the median of the per-round ratios is reported, for wall time
and for the process's CPU time (less sensitive to other jobs on a shared machine).
"""

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common

SUITE = "overhead"
ENVS = ("CartPole-v1", "Hopper-v5")
VARIANTS = (
    "PPO",
    "PPO+SafeMlpPolicy",
    "PPO+guard(raise)",
    "KLAdaptivePPO",
    "KLAdaptivePPO+guard(raise)",
    "KLAdaptivePPO+guard",
    "A2C",
    "SafeA2C",
    "SafeA2C+guard(raise)",
    "SafeA2C+guard",
)
#: (variant, baseline, target time ratio): policy+algorithm <= 3 %, guard <= 2 %
COMPARISONS = (
    ("PPO+SafeMlpPolicy", "PPO", 1.03),
    ("KLAdaptivePPO", "PPO", 1.03),
    ("SafeA2C", "A2C", 1.03),
    ("PPO+guard(raise)", "PPO", 1.02),
    ("KLAdaptivePPO+guard(raise)", "KLAdaptivePPO", 1.02),
    ("KLAdaptivePPO+guard", "KLAdaptivePPO", 1.02),
    ("SafeA2C+guard(raise)", "SafeA2C", 1.02),
    ("SafeA2C+guard", "SafeA2C", 1.02),
)
ROUNDS = {"tiny": 1, "quick": 2, "full": 7}
#: Timesteps per measured run, per env and size
TIMESTEPS = {
    "tiny": {"CartPole-v1": 256},
    "quick": {"CartPole-v1": 1_024, "Hopper-v5": 512},
    "full": {"CartPole-v1": 8_192, "Hopper-v5": 2_048},
}


def jobs(size: str) -> list[tuple[str, int, int]]:
    """One job (env, timesteps, rounds) per environment: its variants must share one process to interleave."""
    return [(env_id, steps, ROUNDS[size]) for env_id, steps in TIMESTEPS[size].items()]


def run_job(job: tuple[str, int, int]) -> list[dict[str, Any]]:
    """
    Build one model per variant, warm each up with one chunk, then ``rounds`` rounds in which every variant trains
    one more chunk of ``timesteps`` (``learn(..., reset_num_timesteps=False)``), in rotating order; one row per chunk.

    Models persist across rounds, so a round compares the variants in the same phase of training, and per-run
    construction (allocations, env start-up) does not add its noise to the timings.
    """
    env_id, timesteps, rounds = job
    configs = {zoo: common.zoo_config(zoo, env_id) for zoo in ("ppo", "a2c")}
    models, guards = {}, {}
    for name in VARIANTS:
        variant = common.VARIANTS[name]
        config = configs[common.ZOO_FILE[variant.algo]]
        env = common.make_env(env_id, config.n_envs, seed=0, normalize=config.normalize, gamma=config.gamma)
        models[name] = common.build_model(variant, env, seed=0, kwargs=config.kwargs)
        guards[name] = common.make_guard(variant)

    def measure(name: str, steps: int) -> dict[str, Any]:
        model, guard = models[name], guards[name]
        before = model.num_timesteps
        wall, cpu = time.perf_counter(), time.process_time()
        model.learn(steps, callback=guard, reset_num_timesteps=False)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert guard is None or not guard.events, f"{name} was not healthy: {guard.events}"
        return dict(
            variant=name,
            env=env_id,
            seed=0,
            timesteps=steps,
            steps_done=model.num_timesteps - before,
            wall_s=wall,
            cpu_s=cpu,
            error=None,
            params_finite=common.params_finite(model),
            final_return=float("nan"),
        )

    # Imports, allocator, optimizer state and the guard's first snapshot must not land on a measured chunk
    for name in VARIANTS if rounds > 1 else ():
        measure(name, timesteps)
    rows = []
    for round_ in range(rounds):
        shift = round_ % len(VARIANTS)
        for position, name in enumerate(VARIANTS[shift:] + VARIANTS[:shift]):
            row = measure(name, timesteps)
            rows.append(
                dict(
                    row,
                    round=round_,
                    position=position,
                    steps_per_s=row["steps_done"] / row["wall_s"],
                    cpu_steps_per_s=row["steps_done"] / row["cpu_s"],
                )
            )
            print(common._summary(rows[-1]), flush=True)
    for model in models.values():
        model.get_env().close()
    return rows


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    return dict(rounds=ROUNDS[size], timesteps=TIMESTEPS[size], variants=list(VARIANTS))


def ratios(runs: list[dict[str, Any]], env_id: str, variant: str, baseline: str, key: str) -> list[float]:
    """Per-round time ratios variant / baseline (``key``: ``wall_s`` or ``cpu_s``)."""
    by_round = {(row["variant"], row["round"]): row[key] for row in runs if row["env"] == env_id}
    return [
        by_round[variant, round_] / by_round[baseline, round_]
        for round_ in sorted({row["round"] for row in runs})
        if (variant, round_) in by_round and (baseline, round_) in by_round
    ]


def report(out: Path) -> None:
    """``overhead.md`` and ``overhead.png`` from ``overhead.jsonl``."""
    meta, runs = common.read_jsonl(out / f"{SUITE}.jsonl")
    budget_ = meta.get("budget", {})
    envs = [env_id for env_id in ENVS if any(row["env"] == env_id for row in runs)]
    lines = common.report_header(
        "Overhead: steps per second, stock SB3 vs sb3-safe",
        meta,
        [
            f"Budget: one model per variant (seed 0), trained in chunks: one warm-up chunk, then"
            f" {budget_.get('rounds')} interleaved rounds of one chunk of every variant (order rotating), timesteps per"
            f" chunk {budget_.get('timesteps')}; timed: each chunk's `learn(..., reset_num_timesteps=False)`.",
            "Hyperparameters: "
            + "; ".join(
                common.describe_zoo(common.zoo_config(fam, env_id), budget_.get("timesteps", {}).get(env_id, 0))
                for env_id in envs
                for fam in ("ppo", "a2c")
            ),
            "Guard: `+guard` is `NonFiniteGuardCallback(on_nonfinite='rollback')` (snapshots policy, optimizer and"
            " VecNormalize at each passed check: the mode the stress suite uses); `+guard(raise)` is the default mode"
            " (checks only).",
            "Ratio: time of the variant / time of its baseline in the same round (1.03 = 3 % slower); median over"
            " rounds (chunks of the same size, at the same point of training). Wall time is what was asked for; CPU"
            " time of the process is less disturbed by other jobs.",
        ],
    )
    rows = []
    for env_id in envs:
        for variant, baseline, target in COMPARISONS:
            wall = ratios(runs, env_id, variant, baseline, "wall_s")
            cpu = ratios(runs, env_id, variant, baseline, "cpu_s")
            if not wall:
                continue
            speed = statistics.median(row["steps_per_s"] for row in runs if row["env"] == env_id and row["variant"] == variant)
            median_wall, median_cpu = statistics.median(wall), statistics.median(cpu)
            rows.append(
                [
                    env_id,
                    variant,
                    baseline,
                    f"{speed:.0f}",
                    f"**{median_wall:.3f}**",
                    f"{min(wall):.3f}-{max(wall):.3f}",
                    f"{median_cpu:.3f}",
                    f"<= {target:.2f}",
                    _met(median_wall, median_cpu, target),
                ]
            )
    header = [
        "env",
        "variant",
        "baseline",
        "steps/s (median)",
        "wall ratio (median)",
        "wall ratio range",
        "CPU ratio (median)",
        "target",
        "met?",
    ]
    lines += [*common.table(header, rows), "", "![overhead](overhead.png)"]
    common.write_report(out / f"{SUITE}.md", lines)
    plot(runs, envs, out)


def _met(wall: float, cpu: float, target: float) -> str:
    if wall <= target and cpu <= target:
        return "yes"
    if wall <= target or cpu <= target:
        return "wall " + ("yes" if wall <= target else "no") + ", CPU " + ("yes" if cpu <= target else "no")
    return "**no**"


def plot(runs: list[dict[str, Any]], envs: list[str], out: Path) -> None:
    """Median wall and CPU ratios per comparison and env, with the targets."""
    plt = common.pyplot()
    figure, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.5), squeeze=False)
    labels = [f"{variant}\n/ {baseline}" for variant, baseline, _ in COMPARISONS]
    x = np.arange(len(COMPARISONS))
    for axis, env_id in zip(axes[0], envs, strict=True):
        for offset, key in ((-0.2, "wall_s"), (0.2, "cpu_s")):
            medians = [statistics.median(ratios(runs, env_id, v, b, key) or [np.nan]) for v, b, _ in COMPARISONS]
            axis.bar(x + offset, medians, width=0.4, label="wall" if key == "wall_s" else "CPU")
        for target, style in ((1.03, "--"), (1.02, ":")):
            axis.axhline(target, color="gray", linestyle=style, linewidth=1, label=f"target {target}")
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
        axis.set(title=f"{env_id}: time ratio vs baseline (median)", ylabel="time ratio", ylim=(0.8, None))
        axis.legend(fontsize=7)
    common.save_figure(figure, out / "overhead.png")
