"""
Overhead: steps per second of stock SB3 and the sb3-safe variants on healthy runs: PPO, A2C and the safe
algorithms on CartPole-v1 and Hopper-v5; sb3-contrib's RecurrentPPO (stock vs SafeMlpLstmPolicy) on
CartPoleNoVel-v1 and MaskablePPO (stock vs SafeMaskableMlpPolicy) on ``examples/maskable.py``'s task, with the
settings of the learning suite.

All variants of one environment run in one process, each with its own model trained chunk by chunk, interleaved
(the order rotates from round to round, so drifts in machine load do not favour any variant); each variant is
compared with its baseline in the same round and the median of the per-round ratios is reported, for wall time
and for the process's CPU time. The full size repeats this in several processes ("replicas", seeds 0, 1, 2...): on
a shared VM one process's models can run a few percent faster or slower than another's for the same code (memory
placement), a bias no number of rounds inside one process removes.
"""

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import configs, reports, suite, training, variants

SUITE = "overhead"
VARIANTS = (
    "PPO",
    "PPO(foreach)",
    "PPO+SafeMlpPolicy",
    "PPO+guard(raise)",
    "PPO+guard",
    "KLAdaptivePPO",
    "KLAdaptivePPO+guard(raise)",
    "KLAdaptivePPO+guard",
    "A2C",
    "A2C(foreach)",
    "A2C+guard(raise)",
    "A2C+guard",
    "SafeA2C",
    "SafeA2C+guard(raise)",
    "SafeA2C+guard",
    "PPO+KL-lr",
    "KLAdaptivePPO+KL-lr",
    "A2C+KL-lr",
    "SafeA2C+KL-lr",
    "KLAdaptivePPO(no normalization)",
    "SafeA2C(no normalization)",
)
#: sb3-contrib's algorithms: stock, with the safe policy, with the guard (stock policy), with the adaptive lr
CONTRIB_VARIANTS = {
    algo: (algo, f"{algo}(foreach)", f"{algo}+{policy}", f"{algo}+guard(raise)", f"{algo}+guard", f"{algo}+KL-lr")
    for algo, policy in (("RecurrentPPO", "SafeMlpLstmPolicy"), ("MaskablePPO", "SafeMaskableMlpPolicy"))
}
#: The variants timed against each other on each environment (one process per environment and replica)
OFF_POLICY_VARIANTS = {algo: (algo, f"{algo}+guard(raise)", f"{algo}+guard") for algo in variants.OFF_POLICY}
ENV_VARIANTS = {
    "CartPole-v1": VARIANTS + OFF_POLICY_VARIANTS["DQN"],
    "Hopper-v5": VARIANTS,
    "Pendulum-v1": OFF_POLICY_VARIANTS["SAC"] + OFF_POLICY_VARIANTS["TD3"],
    "CartPoleNoVel-v1": CONTRIB_VARIANTS["RecurrentPPO"],
    configs.MACHINE_SCHEDULING: CONTRIB_VARIANTS["MaskablePPO"],
}
ENVS = tuple(ENV_VARIANTS)
#: Settings changed from the zoo entry: DQN updates after every step (rl-zoo's CartPole entry: 128 gradient steps
#: every 256 steps), the setting where a per-update cost weighs most
OVERRIDES = {("DQN", "CartPole-v1"): dict(train_freq=1, gradient_steps=1)}
#: (variant, baseline, target time ratio): <= 3 % for the safe policies and algorithms; <= 2 % for the guard on every
#: algorithm (off-policy ones: the guard is all sb3-safe adds) and for the adaptive learning rate on every on-policy
#: one (issues 20 and 23). Against "(foreach)" baselines: the cost of the safety alone, without the speed-up of
#: sb3-safe's default optimizer implementation
COMPARISONS = (
    ("PPO+SafeMlpPolicy", "PPO", 1.03),
    ("KLAdaptivePPO", "PPO", 1.03),
    ("SafeA2C", "A2C", 1.03),
    ("PPO+SafeMlpPolicy", "PPO(foreach)", 1.03),
    ("KLAdaptivePPO", "PPO(foreach)", 1.03),
    ("SafeA2C", "A2C(foreach)", 1.03),
    # the same without the observation and value normalizations that are on by default: the cost of the rest
    ("KLAdaptivePPO(no normalization)", "PPO", 1.03),
    ("SafeA2C(no normalization)", "A2C", 1.03),
    *(
        (f"{algo}{mode}", algo, 1.02)
        for algo in ("PPO", "KLAdaptivePPO", "A2C", "SafeA2C", "RecurrentPPO", "MaskablePPO", *variants.OFF_POLICY)
        for mode in ("+guard(raise)", "+guard")
    ),
    *((f"{algo}+KL-lr", algo, 1.02) for algo in ("PPO", "KLAdaptivePPO", "A2C", "SafeA2C", "RecurrentPPO", "MaskablePPO")),
    ("RecurrentPPO+SafeMlpLstmPolicy", "RecurrentPPO", 1.03),
    ("RecurrentPPO+SafeMlpLstmPolicy", "RecurrentPPO(foreach)", 1.03),
    ("MaskablePPO+SafeMaskableMlpPolicy", "MaskablePPO", 1.03),
    ("MaskablePPO+SafeMaskableMlpPolicy", "MaskablePPO(foreach)", 1.03),
)
ROUNDS = {"tiny": 1, "quick": 2, "full": 4}
#: Independent processes per environment, each with its own models (seed = replica index)
REPLICAS = {"tiny": 1, "quick": 1, "full": 3}
#: Timesteps per measured run, per env and size (RecurrentPPO: rollouts of 8 x 32 steps; MaskablePPO: 4 x 128)
TIMESTEPS = {
    "tiny": {"CartPole-v1": 256, "CartPoleNoVel-v1": 256, configs.MACHINE_SCHEDULING: 512, "Pendulum-v1": 64},
    "quick": {
        "CartPole-v1": 1_024,
        "Hopper-v5": 512,
        "CartPoleNoVel-v1": 512,
        configs.MACHINE_SCHEDULING: 2_048,
        "Pendulum-v1": 256,
    },
    "full": {
        "CartPole-v1": 6_144,
        "Hopper-v5": 1_536,
        "CartPoleNoVel-v1": 2_048,
        configs.MACHINE_SCHEDULING: 8_192,
        "Pendulum-v1": 500,
    },
}
#: Least coverage of the confidence interval reported for each median ratio
MEDIAN_CI_COVERAGE = 0.9


def jobs(size: str, envs: list[str] | None = None) -> list[tuple[str, int, int, int]]:
    """
    Jobs ``(env, timesteps, rounds, replica)``: one per environment and replica (the variants of a job share one
    process, to interleave).

    :param envs: only these environments (None: all)
    """
    return [
        (env_id, steps, ROUNDS[size], replica)
        for replica in range(REPLICAS[size])
        for env_id, steps in TIMESTEPS[size].items()
        if envs is None or env_id in envs
    ]


def run_job(job: tuple[str, int, int, int]) -> list[dict[str, Any]]:
    """
    Build one model per variant (seed ``replica``), warm each up with one rollout and update, then ``rounds`` rounds
    in which every variant trains one more chunk of ``timesteps`` (``learn(..., reset_num_timesteps=False)``), in
    rotating order; one row per chunk.

    Models persist across rounds, so a round compares the variants in the same phase of training, and per-run
    construction (allocations, env start-up) does not add its noise to the timings.
    """
    env_id, timesteps, rounds, replica = job
    names = ENV_VARIANTS[env_id]
    models, guards, adaptive = {}, {}, {}
    for name in names:
        variant = variants.VARIANTS[name]
        models[name] = build_model(name, env_id, seed=replica)
        guards[name] = variants.make_guard(variant)
        adaptive[name] = variants.make_adaptive_lr(variant)

    clocks = {name: CallbackClock(guards[name] or adaptive[name]) for name in names}

    def measure(name: str, steps: int) -> dict[str, Any]:
        model, guard, adaptive_lr = models[name], guards[name], adaptive[name]
        before = model.num_timesteps
        clocks[name].seconds = 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        model.learn(steps, callback=guard or adaptive_lr, reset_num_timesteps=False)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert guard is None or not guard.events, f"{name} was not healthy: {guard.events}"
        return dict(
            variant=name,
            env=env_id,
            seed=replica,
            timesteps=steps,
            steps_done=model.num_timesteps - before,
            wall_s=wall,
            cpu_s=cpu,
            error=None,
            params_finite=training.params_finite(model),
            final_return=float("nan"),
            # The adaptive learning rate's redos at the tuned settings: each is one more train() on the rollout
            redone_updates=None if adaptive_lr is None else adaptive_lr.redone_updates,
            measured_updates=None if adaptive_lr is None else len(adaptive_lr.history),
            inner_s=clocks[name].seconds if clocks[name].callback is not None else None,
        )

    # Imports, allocator, optimizer state and the guard's first snapshot must not land on a measured chunk
    for name in names if rounds > 1 else ():
        measure(name, warm_up_steps(models[name]))
    rows = []
    for round_ in range(rounds):
        shift = round_ % len(names)
        for position, name in enumerate(names[shift:] + names[:shift]):
            row = measure(name, timesteps)
            rows.append(
                dict(
                    row,
                    replica=replica,
                    round=round_,
                    position=position,
                    steps_per_s=row["steps_done"] / row["wall_s"],
                    cpu_steps_per_s=row["steps_done"] / row["cpu_s"],
                )
            )
            print(suite.summary(rows[-1]), flush=True)
    for model in models.values():
        model.get_env().close()
    return rows


class CallbackClock:
    """
    Time spent inside a callback's own code during ``learn()``: its SB3 events and the guard's optimizer hooks (the
    adaptive learning rate's redos run inside its rollout-start event, so they count). A ratio measured inside one
    run: the machine's load slows the callback and the training alike, where the wall ratio of two runs moves with
    it. Not counted: SB3's own dispatch of the events (the baseline pays it too, for its ``ConvertCallback``).

    :param callback: the guard or the adaptive learning rate, or None
    """

    #: per event, [calls, seconds] since construction: where the callback's time goes
    calls: dict[str, list[float]]

    METHODS = (
        "_on_training_start",
        "_on_rollout_start",
        "_on_step",
        "_on_rollout_end",
        "_on_training_end",
        "_after_optimizer_step",
        "_before_optimizer_step",
    )

    def __init__(self, callback: Any) -> None:
        self.callback = callback
        self.seconds = 0.0
        self.calls = {}
        for name in self.METHODS if callback is not None else ():
            if hasattr(callback, name):
                setattr(callback, name, self._timed(name, getattr(callback, name)))

    def _timed(self, name: str, method: Any) -> Any:
        record = self.calls.setdefault(name, [0, 0.0])

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.seconds += elapsed
                record[0] += 1
                record[1] += elapsed

        return timed


def build_model(name: str, env_id: str, seed: int) -> Any:
    """The model of variant ``name`` on ``env_id`` with this suite's settings (:func:`settings`), seeded."""
    variant = variants.VARIANTS[name]
    config = settings(variant.algo, env_id)
    env = training.make_env(env_id, config.n_envs, seed=seed, normalize=config.normalize, gamma=config.gamma)
    return variants.build_model(variant, env, seed=seed, kwargs=config.kwargs)


def settings(algo: str, env_id: str) -> configs.ZooConfig:
    """The zoo settings of ``algo`` on ``env_id`` with this suite's OVERRIDES."""
    return configs.family_config(algo, env_id, **OVERRIDES.get((algo, env_id), {}))


def warm_up_steps(model: Any) -> int:
    """One rollout and update (on-policy), or the steps to the first updates (off-policy: past ``learning_starts``)."""
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    if isinstance(model, OnPolicyAlgorithm):
        return model.n_steps * model.n_envs
    # Off-policy algorithms have an ``n_steps`` too (n-step returns): not a rollout length
    return model.learning_starts + 256


def budget(size: str) -> dict[str, Any]:
    """The budget recorded in the JSONL meta row."""
    return dict(
        replicas=REPLICAS[size],
        rounds=ROUNDS[size],
        timesteps=TIMESTEPS[size],
        variants={env_id: list(ENV_VARIANTS[env_id]) for env_id in TIMESTEPS[size]},
    )


def ratios(runs: list[dict[str, Any]], env_id: str, variant: str, baseline: str, key: str) -> list[float]:
    """Time ratios variant / baseline of every (replica, round) (``key``: ``wall_s`` or ``cpu_s``)."""
    by_round = {(row["variant"], (row.get("replica", 0), row["round"])): row[key] for row in runs if row["env"] == env_id}
    rounds = sorted({round_ for _, round_ in by_round})
    return [
        by_round[variant, round_] / by_round[baseline, round_]
        for round_ in rounds
        if (variant, round_) in by_round and (baseline, round_) in by_round
    ]


def median_interval(values: list[float], coverage: float = MEDIAN_CI_COVERAGE) -> tuple[float, float, float]:
    """
    Distribution-free confidence interval of the median of ``values``: the order statistics ``x_(k)`` and
    ``x_(n+1-k)`` with the largest ``k`` whose coverage ``1 - 2 P(Binomial(n, 1/2) < k)`` is at least ``coverage``
    (the range, if no narrower interval has it).

    :return: ``(low, high, coverage of this interval)``
    """
    ordered = sorted(values)
    n = len(ordered)

    def interval_coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, below) for below in range(k)) / 2**n

    k = 1
    while k < (n + 1) // 2 and interval_coverage(k + 1) >= coverage:
        k += 1
    return ordered[k - 1], ordered[n - k], interval_coverage(k)


def verdict(median: float, low: float, high: float, target: float) -> str:
    """Met if the whole interval is at or below the target, not met if all of it is above; else the noise decides."""
    if high <= target:
        return "yes"
    if low > target:
        return "**no**"
    return f"within noise (median {'yes' if median <= target else '**no**'})"


def report(out: Path) -> None:
    """``overhead.md`` and ``overhead.png`` from ``overhead.jsonl``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    budget_ = meta.get("budget", {})
    envs = [env_id for env_id in ENVS if any(row["env"] == env_id for row in runs)]
    lines = reports.report_header(
        "Overhead: steps per second, stock SB3 vs sb3-safe",
        meta,
        [
            f"Budget: {budget_.get('replicas', 1)} process(es) per env (replicas, seeds 0, 1, ...), each with one model"
            f" per variant trained in chunks: a warm-up rollout and update, then {budget_.get('rounds')} interleaved"
            f" rounds of one chunk of every variant (order rotating), timesteps per chunk {budget_.get('timesteps')};"
            " timed: each chunk's `learn(..., reset_num_timesteps=False)`. Every (replica, round) gives one ratio.",
            "Hyperparameters: "
            + "; ".join(
                configs.describe_zoo(settings(family, env_id), budget_.get("timesteps", {}).get(env_id, 0))
                + "".join(f" ({key}={value})" for key, value in OVERRIDES.get((family, env_id), {}).items())
                for env_id in envs
                for family in _families(env_id)
            ),
            "Guard: `+guard` is `NonFiniteGuardCallback(on_nonfinite='rollback')` (snapshots policy, optimizer and"
            " VecNormalize at each passed check: the mode the stress suite uses); `+guard(raise)` is the default mode"
            " (checks only). Both check the first observation, every step's data including terminal observations,"
            " every optimizer step and the full state at the cadence; alone in `learn()` (as here) they do not re-read"
            " the live model at rollout boundaries, which only other callbacks make necessary.",
            "Adaptive learning rate: `+KL-lr` is `KLAdaptiveLRCallback()` with its defaults (no guard).",
            "Ratio: time of the variant / time of its baseline in the same round (1.03 = 3 % slower); median over"
            " rounds (chunks of the same size, at the same point of training). Wall time is what was asked for; CPU"
            " time of the process is less disturbed by other jobs.",
            f"CI: distribution-free confidence interval of the median wall ratio (order statistics; coverage >="
            f" {MEDIAN_CI_COVERAGE:.0%}, exact coverage in brackets). Met: the whole interval is at or below the target;"
            " not met: all of it is above; otherwise the machine's noise decides (the median's side is shown).",
            "`(foreach)` baselines: stock SB3 with its optimizer stepping `foreach=True`, as sb3-safe's policies do by"
            " default (same values): comparing with them isolates the cost of the safety from that speed-up.",
            "RecurrentPPO and MaskablePPO (sb3-contrib): the stock algorithm with its policy vs the same algorithm with"
            " sb3-safe's policy (SafeMlpLstmPolicy, SafeMaskableMlpPolicy), on the learning suite's settings.",
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
            median_wall = statistics.median(wall)
            low, high, coverage = median_interval(wall)
            rows.append(
                [
                    env_id,
                    variant,
                    baseline,
                    f"{speed:.0f}",
                    f"**{median_wall:.3f}**",
                    f"{low:.3f}-{high:.3f} ({coverage:.1%})",
                    f"{statistics.median(cpu):.3f}",
                    f"<= {target:.2f}",
                    verdict(median_wall, low, high, target),
                ]
            )
    header = [
        "env",
        "variant",
        "baseline",
        "steps/s (median)",
        "wall ratio (median)",
        "CI of the median",
        "CPU ratio (median)",
        "target",
        "met?",
    ]
    lines += [*reports.table(header, rows), "", "![overhead](overhead.png)", ""]
    lines += _inner_shares(runs, envs)
    lines += _redone_updates(runs, envs)
    reports.write_report(out / f"{SUITE}.md", lines)
    plot(runs, envs, out)


def _inner_shares(runs: list[dict[str, Any]], envs: list[str]) -> list[str]:
    """The share of each chunk's wall time spent inside the guard's or the adaptive lr's own code."""
    rows = []
    for env_id in envs:
        for variant in ENV_VARIANTS[env_id]:
            shares = [
                row["inner_s"] / row["wall_s"]
                for row in runs
                if row["env"] == env_id and row["variant"] == variant and row.get("inner_s") is not None
            ]
            if shares:
                low, high, coverage = median_interval(shares)
                median = statistics.median(shares)
                met = verdict(median, low, high, 0.02)
                rows.append([env_id, variant, f"**{median:.2%}**", f"{low:.2%}-{high:.2%} ({coverage:.1%})", met])
    if not rows:
        return []
    return [
        "Time inside sb3-safe's callback code (its events and the guard's optimizer hooks, the adaptive lr's redos"
        " included), share of each chunk's wall time, median over chunks with its interval: measured inside each run,"
        " so the machine's load slows both sides alike (the wall ratios above compare two runs and move with it).",
        "",
        *reports.table(["env", "variant", "share of learn() (median)", "CI of the median", "<= 2 %?"], rows),
        "",
    ]


def _redone_updates(runs: list[dict[str, Any]], envs: list[str]) -> list[str]:
    """How often the adaptive learning rate undid and redid an update at the tuned settings (each costs a train())."""
    rows = []
    for env_id in envs:
        for variant in ENV_VARIANTS[env_id]:
            chunks = [row for row in runs if row["env"] == env_id and row["variant"] == variant]
            if not chunks or chunks[0].get("redone_updates") is None:
                continue
            redone = sum(row["redone_updates"] for row in chunks)
            measured = sum(row["measured_updates"] for row in chunks)
            rows.append([env_id, variant, str(measured), str(redone), f"{redone / max(measured, 1):.1%}"])
    if not rows:
        return []
    return [
        "Adaptive learning rate at the tuned settings (`+KL-lr`: `KLAdaptiveLRCallback()` with its defaults), over the"
        " timed chunks: updates whose KL was measured, and of those the updates undone and redone (each one more"
        " `train()` on the same rollout, included in the timings above).",
        "",
        *reports.table(["env", "variant", "updates measured", "updates redone", "share"], rows),
    ]


def _families(env_id: str) -> list[str]:
    """The algorithm families timed on ``env_id`` (one settings line each in the report)."""
    families = {"PPO": "PPO", "KLAdaptivePPO": "PPO", "A2C": "A2C", "SafeA2C": "A2C"}
    algos = [variants.VARIANTS[name].algo for name in ENV_VARIANTS[env_id]]
    return list(dict.fromkeys(families.get(algo, algo) for algo in algos))


def plot(runs: list[dict[str, Any]], envs: list[str], out: Path) -> None:
    """Median wall ratio per comparison and env, with its confidence interval and the targets."""
    plt = reports.pyplot()
    # Each panel's width follows its number of comparisons (12 for PPO / A2C, 2 for an sb3-contrib algorithm)
    compared = {env_id: [c for c in COMPARISONS if ratios(runs, env_id, c[0], c[1], "wall_s")] for env_id in envs}
    envs = [env_id for env_id in envs if compared[env_id]]
    widths = [max(len(compared[env_id]), 4) for env_id in envs]
    figure, axes = plt.subplots(
        1, len(envs), figsize=(0.5 * sum(widths) + 2 * len(envs), 4.5), squeeze=False, gridspec_kw=dict(width_ratios=widths)
    )
    for axis, env_id in zip(axes[0], envs, strict=True):
        comparisons = compared[env_id]
        labels = [f"{variant}\n/ {baseline}" for variant, baseline, _ in comparisons]
        x = np.arange(len(comparisons))
        medians, errors = [], []
        for variant, baseline, _ in comparisons:
            wall = ratios(runs, env_id, variant, baseline, "wall_s")
            median = statistics.median(wall)
            low, high, _ = median_interval(wall)
            medians.append(median)
            errors.append((median - low, high - median))
        axis.bar(x, medians, width=0.6, yerr=np.array(errors).T, capsize=3, label="wall time ratio (median, CI)")
        for target, style in ((1.03, "--"), (1.02, ":")):
            axis.axhline(target, color="gray", linestyle=style, linewidth=1, label=f"target {target}")
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
        axis.set(ylabel="time ratio", ylim=(0.8, None))
        axis.set_title(f"{env_id}:\ntime ratio vs baseline", fontsize=10)
        axis.legend(fontsize=7)
    reports.save_figure(figure, out / "overhead.png")
