"""
SafeA2C vs stock A2C with the same (rl-zoo tuned) hyperparameters, at a budget sized for a 2-core machine.

Usage::

    python benchmarks/a2c_benchmark.py --jobs 2          # runs everything, then writes the report
    python benchmarks/a2c_benchmark.py --report-only     # rewrites the report from saved runs

Each run writes ``benchmarks/results/a2c_runs/<env>_<algo>_<seed>.json``; the report is
``benchmarks/results/a2c.md`` with one learning-curve PNG per environment. Text between the notes marker
and the end of an existing report is kept, so hand-written notes survive a rerun.
"""

import argparse
import json
import multiprocessing
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
RUNS = RESULTS / "a2c_runs"
META = RESULTS / "a2c_meta.json"
SEEDS = (0, 1, 2)
ALGOS = ("A2C", "SafeA2C")
NOTES_MARKER = "<!-- notes -->"

# rl-zoo's tuned hyperparameters (rl_zoo3/hyperparams/a2c.yml), with fewer timesteps (zoo: 5e5, 5e5, 1e6).
# "normalize: true" is VecNormalize with the algorithm's gamma, as rl-zoo's ExperimentManager sets it.
CONFIGS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(timesteps=100_000, n_envs=8, normalize=False, kwargs=dict(ent_coef=0.0)),
    "Acrobot-v1": dict(timesteps=100_000, n_envs=16, normalize=True, kwargs=dict(ent_coef=0.0)),
    "Pendulum-v1": dict(
        timesteps=200_000,
        n_envs=8,
        normalize=True,
        kwargs=dict(
            ent_coef=0.0,
            max_grad_norm=0.5,
            n_steps=8,
            gae_lambda=0.9,
            vf_coef=0.4,
            gamma=0.9,
            use_rms_prop=True,
            normalize_advantage=False,
            learning_rate="lin_7e-4",
            use_sde=True,
            policy_kwargs=dict(log_std_init=-2, ortho_init=False),
        ),
    ),
}


def linear_schedule(start: float):
    """rl-zoo's ``lin_<value>``: decays linearly from ``start`` to 0."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * start

    return schedule


def run_one(job: tuple[str, str, int]) -> dict[str, Any]:
    """Train one (env, algorithm, seed), evaluate it, and save the result as JSON."""
    env_id, algo, seed = job
    import torch as th
    from stable_baselines3 import A2C
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_safe import SafeA2C

    th.set_num_threads(1)
    config = CONFIGS[env_id]
    kwargs = dict(config["kwargs"])
    gamma = kwargs.get("gamma", 0.99)
    if isinstance(kwargs.get("learning_rate"), str):
        kwargs["learning_rate"] = linear_schedule(float(kwargs["learning_rate"][len("lin_") :]))

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.points.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

    env = make_vec_env(env_id, n_envs=config["n_envs"], seed=seed)
    normalized = VecNormalize(env, gamma=gamma) if config["normalize"] else None
    cls = SafeA2C if algo == "SafeA2C" else A2C
    model = cls("MlpPolicy", normalized or env, seed=seed, device="cpu", **kwargs)
    curve = Curve()
    error = None
    start = time.perf_counter()
    try:
        model.learn(config["timesteps"], callback=curve)
    except (ValueError, FloatingPointError) as exc:  # how stock A2C fails on NaN weights
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    wall = time.perf_counter() - start
    finite = all(bool(th.isfinite(p).all()) for p in model.policy.parameters())
    final = float("nan")
    if error is None and finite:
        eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 1000)
        if normalized is not None:
            eval_env = VecNormalize(eval_env, training=False, norm_reward=False, gamma=gamma)
            eval_env.obs_rms = normalized.obs_rms
        mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=10)
        assert isinstance(mean_return, float)
        final = mean_return
    result = dict(
        env=env_id,
        algo=algo,
        seed=seed,
        timesteps=config["timesteps"],
        wall_s=wall,
        final_return=final,
        params_finite=finite,
        error=error,
        skipped_updates=model.skipped_updates if isinstance(model, SafeA2C) else None,
        curve=curve.points,
    )
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / f"{env_id}_{algo}_{seed}.json").write_text(json.dumps(result))
    print(f"{env_id} {algo} seed={seed}: return {final:.1f}, {wall:.0f}s, error={error}", flush=True)
    return result


def smoothed_curve(points: list[tuple[int, float]], grid: np.ndarray, window: int = 20) -> np.ndarray:
    """Mean return of the last ``window`` training episodes finished by each grid timestep."""
    steps = np.array([point[0] for point in points])
    returns = np.array([point[1] for point in points])
    values = np.full(len(grid), np.nan)
    for i, step in enumerate(grid):
        done = returns[steps <= step]
        if len(done):
            values[i] = done[-window:].mean()
    return values


def write_report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import stable_baselines3
    import torch as th

    import sb3_safe

    runs = [json.loads(path.read_text()) for path in sorted(RUNS.glob("*.json"))]
    meta = json.loads(META.read_text())
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line),
        platform.processor(),
    )
    lines = [
        "# SafeA2C vs stock A2C",
        "",
        f"- Command: `{meta['command']}` ({meta['jobs']} runs in parallel, 1 torch thread each;"
        f" {meta['wall_s'] / 60:.1f} min wall)",
        f"- Machine: {cpu}, {multiprocessing.cpu_count()} cores (shared with other jobs, so times are noisy)",
        f"- Versions: Python {platform.python_version()}, torch {th.__version__}, SB3 {stable_baselines3.__version__}, "
        f"sb3-safe {sb3_safe.__version__}",
        "- Hyperparameters: rl-zoo's tuned A2C entries (`rl_zoo3/hyperparams/a2c.yml`), the same for both algorithms;"
        " SafeA2C uses its defaults on top (safe-logit / bounded log-std policies, MSE value loss, guarded step).",
        "- Budget: "
        + ", ".join(
            f"{env_id} {config['timesteps']:,} steps (zoo: {zoo})"
            for (env_id, config), zoo in zip(CONFIGS.items(), ("5e5", "5e5", "1e6"), strict=True)
        )
        + f"; seeds {', '.join(map(str, SEEDS))}.",
        "- Final return: deterministic policy, 10 evaluation episodes (normalized observations where zoo normalizes),"
        " mean +- std over seeds. Curves: mean of the last 20 training episodes, averaged over seeds (band: min-max).",
        "",
        "| Environment | Algorithm | Final return (mean +- std) | Per seed | Wall s / run | Skipped updates | Failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id, config in CONFIGS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        grid = np.linspace(0, config["timesteps"], 100)
        for algo in ALGOS:
            selected = [run for run in runs if run["env"] == env_id and run["algo"] == algo]
            if not selected:
                continue
            finals = np.array([run["final_return"] for run in selected])
            failures = sum(run["error"] is not None or not run["params_finite"] for run in selected)
            skipped = [run["skipped_updates"] for run in selected if run["skipped_updates"] is not None]
            per_seed = ", ".join(f"{value:.1f}" for value in finals)
            lines.append(
                f"| {env_id} | {algo} | {np.nanmean(finals):.1f} +- {np.nanstd(finals):.1f} | {per_seed} "
                f"| {np.mean([run['wall_s'] for run in selected]):.0f} | {', '.join(map(str, skipped)) or '-'} | {failures} |"
            )
            curves = np.array([smoothed_curve(run["curve"], grid) for run in selected])
            ax.plot(grid, np.nanmean(curves, axis=0), label=f"{algo} ({len(selected)} seeds)")
            ax.fill_between(grid, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.2)
        ax.set(title=f"{env_id}: A2C vs SafeA2C (rl-zoo hyperparameters)", xlabel="timesteps", ylabel="training return")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"a2c_{env_id}.png", dpi=100)
        plt.close(fig)
    lines += ["", *[f"![{env_id}](a2c_{env_id}.png)" for env_id in CONFIGS], "", NOTES_MARKER]
    report = RESULTS / "a2c.md"
    notes = report.read_text().split(NOTES_MARKER, 1)[1] if report.exists() and NOTES_MARKER in report.read_text() else "\n"
    report.write_text("\n".join(lines) + notes)
    print(f"wrote {report}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one process each)")
    parser.add_argument("--envs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from saved runs")
    args = parser.parse_args()
    if not args.report_only:
        jobs = [(env_id, algo, seed) for env_id in args.envs for seed in SEEDS for algo in ALGOS]
        start = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            pool.map(run_one, jobs, chunksize=1)
        meta = dict(command=" ".join(["python", *sys.argv]), jobs=args.jobs, wall_s=time.perf_counter() - start)
        META.write_text(json.dumps(meta))
    write_report()


if __name__ == "__main__":
    main()
