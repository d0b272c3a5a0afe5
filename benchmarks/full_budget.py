"""
Full-budget MuJoCo: stock PPO with rl-zoo's Hopper entry vs KLAdaptivePPO with ``sb3_safe/zoo_configs/kl_ppo.yml``
on Hopper-v5 at rl-zoo's budget (1M steps), same harness, same evaluation.

A run takes about 20 minutes of one CPU core, so runs are resumable: every ``--eval-every`` steps (at the first
rollout boundary past it, right after an update) a run saves its model and VecNormalize statistics, evaluates
the deterministic policy (10 episodes on a fresh env, frozen observation normalization) and appends one row to
``full_budget.jsonl``. Rerunning the same command continues every unfinished run from its checkpoint (the envs
are reset and the random state reseeded there; the rows say where a run was resumed). Finished runs are skipped.

Usage::

    python -m benchmarks.full_budget run [--jobs 1] [--seeds 0 1 2] [--variants V ...] [--max-minutes M]
    python -m benchmarks.full_budget run --variants PPO &   # one process per variant, no two on one run
    python -m benchmarks.full_budget run --variants KLAdaptivePPO+guard &
    python -m benchmarks.full_budget report                                             # markdown + PNG
"""

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import configs, reports, suite, training, variants

SUITE = "full_budget"
ENV_ID = "Hopper-v5"
TIMESTEPS = 1_000_000
VARIANTS = ("PPO", "KLAdaptivePPO+guard")
SEEDS = (0, 1, 2)
EVAL_EVERY = 50_000
EVAL_EPISODES = 10
#: rl-zoo's published PPO result for Hopper (benchmark.md of rl-baselines3-zoo), for the report
ZOO_REFERENCE = (
    "rl-zoo's benchmark table (`benchmark.md` of rl-baselines3-zoo) lists PPO on Hopper-v3 at 2410.4 +- 10.0 (one"
    " trained agent, 1M steps; mean +- std over 150 deterministic evaluation episodes, not over seeds). That figure"
    " is Hopper-v3 on mujoco-py (MuJoCo 2.x); Hopper-v5 runs on the `mujoco` bindings (MuJoCo 3.x) with the same"
    " reward terms, so the numbers are comparable in scale, not results on an identical task."
)
ZOO_REFERENCE_RETURN = 2410.4


def config(variant: str) -> configs.ZooConfig:
    """The variant's hyperparameters: rl-zoo's Hopper entry for PPO, sb3-safe's ``kl_ppo.yml`` for KLAdaptivePPO."""
    if variant == "PPO":
        return configs.zoo_config("ppo", ENV_ID)
    return configs.config_from_file(configs.ROOT / "sb3_safe" / "zoo_configs" / "kl_ppo.yml", "kl_ppo", ENV_ID)


def run_folder(out: Path, variant: str, seed: int) -> Path:
    return out / SUITE / f"{variant}_{seed}"


def progress(out: Path) -> dict[tuple[str, int], int]:
    """Steps reached per (variant, seed): the last evaluation row of each run in the JSONL."""
    path = out / f"{SUITE}.jsonl"
    if not path.exists():
        return {}
    _, rows = suite.read_jsonl(path)
    reached: dict[tuple[str, int], int] = {}
    for row in rows:
        key = (row["variant"], row["seed"])
        reached[key] = max(reached.get(key, 0), row["timesteps"])
    return reached


def run_job(job: tuple[str, int, int, int, str, float]) -> list[dict[str, Any]]:
    """Train one (variant, seed) to ``timesteps`` from its checkpoint or from scratch; rows go to the JSONL directly."""
    variant_name, seed, timesteps, eval_every, out_text, deadline = job
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_safe import KLAdaptivePPO

    out = Path(out_text)
    folder = run_folder(out, variant_name, seed)
    folder.mkdir(parents=True, exist_ok=True)
    variant = variants.VARIANTS[variant_name]
    settings = config(variant_name)
    env = training.make_env(ENV_ID, settings.n_envs, seed, normalize=settings.normalize, gamma=settings.gamma)
    checkpoint = folder / "model.zip"
    resumed_at = 0
    if checkpoint.exists():
        env = VecNormalize.load(str(folder / "vecnormalize.pkl"), env.venv)
        model = {"PPO": PPO, "KLAdaptivePPO": KLAdaptivePPO}[variant.algo].load(checkpoint, env=env, device="cpu")
        resumed_at = int(model.num_timesteps)
        model.set_random_seed(seed + resumed_at)
    else:
        model = variants.build_model(variant, env, seed, settings.kwargs)
    guard = variants.make_guard(variant)

    class CheckpointAndEvaluate(BaseCallback):
        """At the first rollout boundary past each multiple of ``eval_every``: save, evaluate, append a row."""

        def __init__(self) -> None:
            super().__init__()
            self.next_eval = (resumed_at // eval_every + 1) * eval_every
            self.episodes: list[float] = []
            self.start = time.perf_counter()
            self.past_deadline = False

        def _on_step(self) -> bool:
            self.episodes += [float(info["episode"]["r"]) for info in self.locals["infos"] if "episode" in info]
            return True

        def _on_rollout_start(self) -> None:
            if self.num_timesteps >= min(self.next_eval, timesteps):
                self.save_and_evaluate()
            self.past_deadline = time.time() > deadline

        def save_and_evaluate(self) -> None:
            self.model.save(checkpoint)
            self.model.get_vec_normalize_env().save(str(folder / "vecnormalize.pkl"))
            returns = evaluate_episodes(self.model, seed)
            row = dict(
                kind="eval",
                variant=variant_name,
                seed=seed,
                timesteps=int(self.num_timesteps),
                eval_return=float(np.mean(returns)),
                eval_returns=returns,
                train_return_last20=float(np.mean(self.episodes[-20:])) if self.episodes else None,
                resumed_at=resumed_at,
                wall_s_since_resume=time.perf_counter() - self.start,
                params_finite=training.params_finite(self.model),
                skipped_updates=training.skipped_updates(self.model),
                kl_beta=getattr(self.model, "kl_beta", None),
                guard_rollbacks=getattr(self.model, "nonfinite_guard_rollbacks", 0) if guard else None,
            )
            suite.write_jsonl(out / f"{SUITE}.jsonl", [row], mode="a")
            print(f"[{SUITE}] {variant_name} seed {seed}: {row['timesteps']} steps, eval {row['eval_return']:.1f}", flush=True)
            self.next_eval = (self.num_timesteps // eval_every + 1) * eval_every

        def _on_training_end(self) -> None:
            # Finished, or stopped at the deadline: keep what was reached
            self.save_and_evaluate()

    class StopAtDeadline(BaseCallback):
        def _on_step(self) -> bool:
            return not recorder.past_deadline

    recorder = CheckpointAndEvaluate()
    callbacks = [cb for cb in (guard, recorder, StopAtDeadline()) if cb is not None]
    model.learn(timesteps - resumed_at, callback=callbacks, reset_num_timesteps=False)
    env.close()
    return []


def evaluate_episodes(model: Any, seed: int) -> list[float]:
    """Returns of EVAL_EPISODES deterministic episodes on a fresh env with the training normalization frozen."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    train_env = model.get_env()
    eval_env = VecNormalize(training.make_env(ENV_ID, 1, seed + 1000), training=False, norm_reward=False)
    eval_env.obs_rms = train_env.obs_rms
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, return_episode_rewards=True)
    eval_env.close()
    return [float(value) for value in returns]


def run(args: argparse.Namespace) -> None:
    """Start or continue every unfinished run."""
    reached = progress(args.out)
    deadline = time.time() + 60 * args.max_minutes if args.max_minutes else float("inf")
    jobs = [
        (variant, seed, args.timesteps, args.eval_every, str(args.out), deadline)
        for seed in args.seeds
        for variant in args.variants
        if reached.get((variant, seed), 0) < args.timesteps
    ]
    meta = dict(kind="meta", suite=SUITE, command="python -m benchmarks.full_budget " + " ".join(sys.argv[1:]), jobs=args.jobs)
    suite.write_jsonl(args.out / f"{SUITE}.jsonl", [dict(meta, **suite.machine_info())], mode="a")
    for _ in suite.run_parallel(run_job, jobs, args.jobs):
        pass
    report(args.out, args.timesteps)


def report(out: Path, timesteps: int = TIMESTEPS) -> None:
    """``full_budget.md`` and ``full_budget.png`` from the JSONL (the latest row per run and step)."""
    from benchmarks import aggregate

    meta, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    latest: dict[tuple[str, int, int], dict[str, Any]] = {}
    for row in rows:
        latest[(row["variant"], row["seed"], row["timesteps"])] = row
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for (variant, seed, _), row in sorted(latest.items()):
        runs.setdefault((variant, seed), []).append(row)
    lines = [
        "# Full-budget Hopper-v5: stock PPO (rl-zoo) vs KLAdaptivePPO (`kl_ppo.yml`)",
        "",
        f"Command: `python -m benchmarks.full_budget run` (resumable; last invocation `{meta.get('command')}`)",
        "",
        f"- Machine: {meta.get('cpu')}, {meta.get('cores')} cores shared with other jobs, 1 torch thread per run;"
        f" versions: torch {meta.get('torch')}, SB3 {meta.get('sb3')}, gymnasium {meta.get('gymnasium')},"
        f" sb3-safe {meta.get('sb3_safe')} (commit {meta.get('commit')})",
        f"- Budget: {timesteps:,} steps per run (rl-zoo's); evaluation every {EVAL_EVERY:,} steps: deterministic policy,"
        f" {EVAL_EPISODES} episodes on a fresh env with the training observation normalization frozen.",
        f"- Hyperparameters: PPO {configs.describe_zoo(config('PPO'), timesteps)}; KLAdaptivePPO:"
        " `sb3_safe/zoo_configs/kl_ppo.yml` `Hopper-v5` (the same values plus adaptive_kl_target 0.03, guard in"
        " rollback mode).",
        f"- Reference: {ZOO_REFERENCE}",
        "",
        "## Steps reached per run",
        "",
    ]
    table_rows = []
    for (variant, seed), evals in sorted(runs.items()):
        last = evals[-1]
        resumes = sorted({row["resumed_at"] for row in evals if row["resumed_at"]})
        table_rows.append(
            [
                variant,
                seed,
                f"{last['timesteps']:,}" + (" (done)" if last["timesteps"] >= timesteps else " (partial)"),
                f"{last['eval_return']:.1f}",
                f"{max(row['eval_return'] for row in evals):.1f}",
                last["skipped_updates"] if last["skipped_updates"] is not None else "-",
                last["guard_rollbacks"] if last["guard_rollbacks"] is not None else "-",
                ", ".join(f"{step:,}" for step in resumes) or "-",
            ]
        )
    lines += reports.table(
        [
            "variant",
            "seed",
            "steps reached",
            "last eval return",
            "best eval return",
            "skipped steps",
            "rollbacks",
            "resumed at",
        ],
        table_rows,
    )
    finished = {
        variant: [
            evals[-1]["eval_return"]
            for (name, _), evals in runs.items()
            if name == variant and evals[-1]["timesteps"] >= timesteps
        ]
        for variant in VARIANTS
    }
    lines += ["", "## Final return at the full budget (finished runs only)", ""]
    if all(len(values) >= 2 for values in finished.values()):
        lines += aggregate.markdown_table({variant: np.array(values)[:, None] for variant, values in finished.items()})
    else:
        lines += [
            "Fewer than 2 finished runs per variant: no aggregate yet ("
            + ", ".join(f"{variant}: {len(values)} finished" for variant, values in finished.items())
            + "). Continue with `python -m benchmarks.full_budget run`."
        ]
    lines += ["", f"![curves]({SUITE}.png)"]
    reports.write_report(out / f"{SUITE}.md", lines)
    plot(runs, out)


def plot(runs: dict[tuple[str, int], list[dict[str, Any]]], out: Path) -> None:
    """Evaluation return over timesteps, one line per run, colour per variant."""
    plt = reports.pyplot()
    figure, axis = plt.subplots(figsize=(8, 4.5))
    colours = dict(zip(VARIANTS, ("tab:blue", "tab:orange"), strict=True))
    for (variant, seed), evals in sorted(runs.items()):
        axis.plot(
            [row["timesteps"] for row in evals],
            [row["eval_return"] for row in evals],
            color=colours.get(variant),
            marker=".",
            label=f"{variant} seed {seed}",
        )
    axis.axhline(ZOO_REFERENCE_RETURN, color="grey", linestyle="--", label=f"rl-zoo PPO Hopper-v3 ({ZOO_REFERENCE_RETURN})")
    axis.set(title=f"{ENV_ID}: evaluation return (10 episodes, deterministic)", xlabel="timesteps", ylabel="return")
    axis.legend(fontsize=7)
    reports.save_figure(figure, out / f"{SUITE}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.full_budget", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("run", "report"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="e.g. one process per variant")
    parser.add_argument("--timesteps", type=int, default=TIMESTEPS)
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    parser.add_argument("--jobs", type=int, default=1, help="parallel runs (default 1: leaves a core for other work)")
    parser.add_argument("--max-minutes", type=float, default=0, help="stop every run at its next rollout after this")
    parser.add_argument("--out", type=Path, default=reports.RESULTS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.action == "run":
        run(args)
    else:
        report(args.out, args.timesteps)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
