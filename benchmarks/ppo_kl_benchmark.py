"""
KLAdaptivePPO vs stock PPO with the same (rl-zoo tuned) hyperparameters, at a budget sized for a 2-core machine.

Usage::

    python benchmarks/ppo_kl_benchmark.py --jobs 2          # runs everything, then writes the report
    python benchmarks/ppo_kl_benchmark.py --report-only     # rewrites the report from saved runs

Each run writes ``benchmarks/results/ppo_kl_runs/<env>_<algo>_<seed>.json``; the report is
``benchmarks/results/ppo_kl.md`` with one learning-curve PNG per environment.
"""

import argparse
import json
import multiprocessing
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
RUNS = RESULTS / "ppo_kl_runs"
SEEDS = (0, 1, 2)
NOTES_MARKER = "<!-- notes -->"
ALGOS = ("PPO", "KLAdaptivePPO")

# rl-zoo's tuned hyperparameters (rl_zoo3/hyperparams/ppo.yml; Hopper-v5 uses the Hopper-v4 entry),
# with a reduced number of timesteps (zoo: 1e5, 1e5, 1e6)
CONFIGS: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(
        timesteps=30_000,
        n_envs=8,
        normalize=False,
        kwargs=dict(
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate="lin_0.001",
            clip_range="lin_0.2",
        ),
    ),
    "Pendulum-v1": dict(
        timesteps=40_000,
        n_envs=4,
        normalize=False,
        kwargs=dict(
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        ),
    ),
    "Hopper-v5": dict(
        timesteps=20_000,
        n_envs=1,
        normalize=True,
        kwargs=dict(
            batch_size=32,
            n_steps=512,
            gamma=0.999,
            learning_rate=9.80828e-05,
            ent_coef=0.00229519,
            clip_range=0.2,
            n_epochs=5,
            gae_lambda=0.99,
            max_grad_norm=0.7,
            vf_coef=0.835671,
            policy_kwargs="hopper",
        ),
    ),
}


def _linear(start: float):
    def schedule(progress_remaining: float) -> float:
        return progress_remaining * start

    return schedule


def _resolve(kwargs: dict[str, Any]) -> dict[str, Any]:
    import torch as th

    resolved = {}
    for key, value in kwargs.items():
        if isinstance(value, str) and value.startswith("lin_"):
            value = _linear(float(value[4:]))
        elif key == "policy_kwargs":
            value = dict(
                log_std_init=-2, ortho_init=False, activation_fn=th.nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256])
            )
        resolved[key] = value
    return resolved


def run_one(job: tuple[str, str, int]) -> dict[str, Any]:
    """Train one (env, algorithm, seed), evaluate it, and save the result as JSON."""
    env_id, algo, seed = job
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_safe import KLAdaptivePPO

    th.set_num_threads(1)
    config = CONFIGS[env_id]

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
    normalized = VecNormalize(env) if config["normalize"] else None
    env = normalized or env
    cls = KLAdaptivePPO if algo == "KLAdaptivePPO" else PPO
    model = cls("MlpPolicy", env, seed=seed, device="cpu", **_resolve(config["kwargs"]))
    curve = Curve()
    error = None
    start = time.perf_counter()
    try:
        model.learn(config["timesteps"], callback=curve)
    except (ValueError, FloatingPointError) as exc:  # stock PPO fails this way on NaN weights
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    wall = time.perf_counter() - start
    finite = all(bool(th.isfinite(p).all()) for p in model.policy.parameters())
    final = float("nan")
    if error is None and finite:
        eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 1000)
        if normalized is not None:
            eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
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
        final_return=float(final),
        params_finite=finite,
        error=error,
        skipped_updates=model.policy_guard.n_skipped if isinstance(model, KLAdaptivePPO) else None,
        final_kl_beta=model.kl_beta if isinstance(model, KLAdaptivePPO) else None,
        curve=curve.points,
    )
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / f"{env_id}_{algo}_{seed}.json").write_text(json.dumps(result))
    print(f"{env_id} {algo} seed={seed}: return {final:.1f}, {wall:.0f}s, error={error}", flush=True)
    return result


def smoothed_curve(points: list[tuple[int, float]], grid: np.ndarray, window: int = 20) -> np.ndarray:
    """Mean return of the last ``window`` episodes finished by each grid timestep."""
    steps = np.array([p[0] for p in points])
    returns = np.array([p[1] for p in points])
    values = np.full(len(grid), np.nan)
    for i, step in enumerate(grid):
        done = returns[steps <= step]
        if len(done):
            values[i] = done[-window:].mean()
    return values


def write_report(command: str, jobs: int, total_wall: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import stable_baselines3
    import torch as th

    import sb3_safe

    runs = [json.loads(path.read_text()) for path in sorted(RUNS.glob("*.json"))]
    lines = [
        "# KLAdaptivePPO vs stock PPO",
        "",
        f"- Command: `{command}` ({jobs} runs in parallel, 1 torch thread each)",
        f"- Machine: {_cpu_model()}, {multiprocessing.cpu_count()} cores (shared with other jobs: wall times are noisy)",
        f"- Versions: Python {platform.python_version()}, sb3-safe {sb3_safe.__version__},"
        f" SB3 {stable_baselines3.__version__}, torch {th.__version__}",
        "- Hyperparameters: rl-zoo's tuned ones (`rl_zoo3/hyperparams/ppo.yml`; Hopper-v5 uses the Hopper-v4 entry, with"
        " VecNormalize), identical for both algorithms; KLAdaptivePPO adds its defaults (d_targ 0.01, beta0 1,"
        " bounds (1e-4, 1e3)) and the safe MlpPolicy. Pendulum's zoo entry uses gSDE, so there KLAdaptivePPO uses the"
        " `(ratio - 1) - log ratio` KL estimator.",
        "- Budget: "
        + ", ".join(
            f"{env} {cfg['timesteps']:,} steps (zoo: {'1e6' if env == 'Hopper-v5' else '1e5'})" for env, cfg in CONFIGS.items()
        )
        + f", seeds {list(SEEDS)}"
        + (f"; whole run {total_wall / 60:.1f} min wall" if total_wall is not None else ""),
        "- Final return: deterministic evaluation, 10 episodes, after training; mean +- std over seeds.",
        "",
        "| env | PPO return | KLAdaptivePPO return | wall-time ratio (KL / PPO) | non-finite events PPO / KL"
        " | KL skipped steps | final beta |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id in CONFIGS:
        by_algo = {algo: [r for r in runs if r["env"] == env_id and r["algo"] == algo] for algo in ALGOS}
        if not all(by_algo.values()):
            continue
        cells = []
        for algo in ALGOS:
            returns = np.array([r["final_return"] for r in by_algo[algo]])
            cells.append(f"{np.nanmean(returns):.1f} +- {np.nanstd(returns):.1f} (n={np.isfinite(returns).sum()})")
        ratio = np.mean([r["wall_s"] for r in by_algo["KLAdaptivePPO"]]) / np.mean([r["wall_s"] for r in by_algo["PPO"]])
        nonfinite = [sum(1 for r in by_algo[algo] if r["error"] or not r["params_finite"]) for algo in ALGOS]
        skipped = sum(r["skipped_updates"] for r in by_algo["KLAdaptivePPO"])
        betas = ", ".join(f"{r['final_kl_beta']:.3g}" for r in by_algo["KLAdaptivePPO"])
        lines.append(
            f"| {env_id} | {cells[0]} | {cells[1]} | {ratio:.2f} | {nonfinite[0]} / {nonfinite[1]} | {skipped} | {betas} |"
        )

        figure, axis = plt.subplots(figsize=(6, 4))
        grid = np.linspace(0, CONFIGS[env_id]["timesteps"], 100)
        for algo in ALGOS:
            curves = np.array([smoothed_curve(r["curve"], grid) for r in by_algo[algo]])
            mean, std = np.nanmean(curves, axis=0), np.nanstd(curves, axis=0)
            axis.plot(grid, mean, label=algo)
            axis.fill_between(grid, mean - std, mean + std, alpha=0.2)
        axis.set(title=f"{env_id} ({len(SEEDS)} seeds, mean +- std)", xlabel="timesteps", ylabel="episode return (last 20)")
        axis.legend()
        figure.tight_layout()
        figure.savefig(RESULTS / f"ppo_kl_{env_id}.png", dpi=100)
        plt.close(figure)
    lines += ["", "Learning curves: " + ", ".join(f"![{env}](ppo_kl_{env}.png)" for env in CONFIGS), ""]
    # Hand-written reading of the numbers, below this marker, survives a rewrite of the report
    report = RESULTS / "ppo_kl.md"
    notes = report.read_text().partition(NOTES_MARKER)[2] if report.exists() else ""
    report.write_text("\n".join(lines) + "\n" + NOTES_MARKER + (notes or "\n"))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from saved runs")
    args = parser.parse_args()
    command = "python benchmarks/ppo_kl_benchmark.py --jobs " + str(args.jobs)
    total_wall = None
    if not args.report_only:
        jobs = [(env_id, algo, seed) for env_id in CONFIGS for seed in SEEDS for algo in ALGOS]
        start = time.perf_counter()
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            pool.map(run_one, jobs, chunksize=1)
        total_wall = time.perf_counter() - start
        (RUNS / "total_wall_s.txt").write_text(f"{total_wall}\n")
    elif (RUNS / "total_wall_s.txt").exists():
        total_wall = float((RUNS / "total_wall_s.txt").read_text())
    write_report(command, args.jobs, total_wall)


if __name__ == "__main__":
    main()
