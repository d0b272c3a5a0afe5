"""
Full-budget MuJoCo: stock PPO with rl-zoo's entries against the recommended stack (PPO + ``SafeMlpPolicy`` + the
guard in rollback mode + ``KLAdaptiveLRCallback()``) on Hopper-v5, HalfCheetah-v5 and Walker2d-v5 at rl-zoo's
budget (1M steps), same harness, same evaluation; plus, on Hopper-v5, KLAdaptivePPO with ``kl_ppo.yml``, and once a
cross-check of the harness against rl_zoo3's own ``train``.

A run takes 20-60 minutes of one CPU core, so runs are resumable: every ``--eval-every`` steps (at the first
rollout boundary past it, right after an update) a run saves its model and VecNormalize statistics, evaluates
the deterministic policy (10 episodes on a fresh env, frozen observation normalization) and appends one row to
``full_budget.jsonl``. Rerunning the same command continues every unfinished run from its checkpoint (the envs
are reset and the random state reseeded there; the rows say where a run was resumed). Finished runs are skipped.

Usage::

    python -m benchmarks.full_budget run [--jobs 1] [--envs E ...] [--seeds 0 1 2] [--variants V ...] [--max-minutes M]
    python -m benchmarks.full_budget run --variants PPO &   # one process per variant, no two on one run
    python -m benchmarks.full_budget run --variants PPO+SafeMlpPolicy+guard+KL-lr &
    python -m benchmarks.full_budget crosscheck   # stock PPO, Hopper-v5, seed 0, by python -m rl_zoo3.train
    python -m benchmarks.full_budget report                                             # markdown + PNG
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import configs, reports, suite, training, variants

SUITE = "full_budget"
ENVS = ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5")
#: The README's recommended stack for a PPO user
STACK = "PPO+SafeMlpPolicy+guard+KL-lr"
#: The stack with the adaptive lr bounded above by the tuned rate (it may lower it, never raise it)
STACK_CAPPED = "PPO+SafeMlpPolicy+guard+KL-lr(<=tuned)"
#: What ``run`` trains: stock PPO and the stack at the current defaults
VARIANTS = ("PPO", STACK)
#: Runs of an earlier code path keep their own name, reported beside the current ones and never pooled with them:
#: the stack before the drop-in policy stopped normalizing observations by default and before the adaptive lr kept
#: the configured rate as its ceiling (88af44c, c95aaeb), the capped stack of those defaults (Walker2d-v5), and
#: KLAdaptivePPO with ``kl_ppo.yml`` (Hopper-v5)
EARLIER = " [earlier defaults]"
EARLIER_VARIANTS = (STACK + EARLIER, STACK_CAPPED + EARLIER, "KLAdaptivePPO+guard" + EARLIER)
REPORTED_VARIANTS = (*VARIANTS, *EARLIER_VARIANTS)
#: The variants whose learning rate the adaptive lr moves (the report shows its trajectory)
ADAPTIVE_LR_VARIANTS = (STACK, STACK + EARLIER, STACK_CAPPED + EARLIER)
#: The harness cross-check: stock PPO trained by ``python -m rl_zoo3.train`` itself
CROSSCHECK = "PPO (rl_zoo3.train)"
CROSSCHECK_ENV, CROSSCHECK_SEED = "Hopper-v5", 0
SEEDS = (0, 1, 2, 3, 4)
TIMESTEPS = 1_000_000
EVAL_EVERY = 50_000
EVAL_EPISODES = 10
#: The report's second statistic: the mean of a run's last evaluations
LAST_EVALS = 5
#: rl-zoo's published PPO results (``benchmark.md`` of rl-baselines3-zoo): task, mean, std over evaluation episodes
ZOO_REFERENCE = {
    "Hopper-v5": ("Hopper-v3", 2410.4, 10.0),
    "HalfCheetah-v5": ("HalfCheetah-v3", 5819.1, 663.5),
    "Walker2d-v5": ("Walker2d-v3", 3478.8, 821.7),
}
ZOO_REFERENCE_NOTE = (
    "rl-zoo's benchmark table (`benchmark.md` of rl-baselines3-zoo) lists one trained PPO agent per task (1M steps)"
    " evaluated over about 150 deterministic episodes: mean +- std over episodes, not over seeds, on the v3 tasks"
    " (mujoco-py, MuJoCo 2.x). The v5 tasks run on the `mujoco` bindings (MuJoCo 3.x) with the same reward terms"
    " (v5 fixes some v3/v4 details, e.g. Walker2d's feet friction), and rl-zoo's hyperparameters are its v4 entries:"
    " comparable in scale, not results on an identical task."
)


def config(env_id: str, variant: str) -> configs.ZooConfig:
    """The hyperparameters: rl-zoo's PPO entry (``-v4``) for PPO and the stack, ``kl_ppo.yml`` for KLAdaptivePPO."""
    if variant.startswith("KLAdaptivePPO"):
        return configs.config_from_file(configs.ROOT / "sb3_safe" / "zoo_configs" / "kl_ppo.yml", "kl_ppo", env_id)
    return configs.zoo_config("ppo", env_id)


def planned_runs(envs: list[str], variant_names: list[str], seeds: list[int]) -> list[tuple[str, str, int]]:
    """(env, variant, seed) of every run asked for, a task's seeds before the next task's."""
    return [(env_id, variant, seed) for env_id in envs for seed in seeds for variant in variant_names]


def run_folder(out: Path, env_id: str, variant: str, seed: int) -> Path:
    return out / SUITE / env_id / f"{variant}_{seed}"


def _env_of(row: dict[str, Any]) -> str:
    """The row's task (the first run set, on Hopper-v5 only, wrote none)."""
    return str(row.get("env", "Hopper-v5"))


def progress(out: Path) -> dict[tuple[str, str, int], int]:
    """Steps reached per (env, variant, seed): the last evaluation row of each run in the JSONL."""
    path = out / f"{SUITE}.jsonl"
    if not path.exists():
        return {}
    _, rows = suite.read_jsonl(path)
    reached: dict[tuple[str, str, int], int] = {}
    for row in rows:
        key = (_env_of(row), row["variant"], row["seed"])
        reached[key] = max(reached.get(key, 0), row["timesteps"])
    return reached


def run_job(job: tuple[str, str, int, int, int, str, float]) -> list[dict[str, Any]]:
    """Train one (env, variant, seed) to ``timesteps`` from its checkpoint or from scratch; rows go to the JSONL."""
    env_id, variant_name, seed, timesteps, eval_every, out_text, deadline = job
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from sb3_safe import KLAdaptivePPO
    from sb3_safe.common.schedules import current_learning_rate, learning_rate_scale

    out = Path(out_text)
    folder = run_folder(out, env_id, variant_name, seed)
    folder.mkdir(parents=True, exist_ok=True)
    variant = variants.VARIANTS[variant_name]
    settings = config(env_id, variant_name)
    env = training.make_env(env_id, settings.n_envs, seed, normalize=settings.normalize, gamma=settings.gamma)
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
    adaptive_lr = variants.make_adaptive_lr(variant, settings.kwargs.get("learning_rate"))
    commit = suite.machine_info()["commit"]  # of the code this process runs (two processes append to one file)

    class CheckpointAndEvaluate(BaseCallback):
        """At the first rollout boundary past each multiple of ``eval_every``: save, evaluate, append a row."""

        def __init__(self) -> None:
            super().__init__()
            self.next_eval = (resumed_at // eval_every + 1) * eval_every
            self.episodes: list[float] = []
            self.start = time.perf_counter()
            self.past_deadline = False
            self.learning_rates: list[float] = []

        def _on_rollout_end(self) -> None:
            # the rate the coming update starts at (constant schedules: the one it runs at, unless it is redone)
            self.learning_rates.append(current_learning_rate(self.model))

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
            returns = evaluate_episodes(self.model, env_id, seed)
            rates = self.learning_rates or [float("nan")]
            row = dict(
                kind="eval",
                commit=commit,
                env=env_id,
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
                guard_events=len(guard.events) if guard else None,
                # the learning rate: the next update's, and the lowest / highest the updates since the last row started at
                learning_rate=current_learning_rate(self.model),
                lr_scale=learning_rate_scale(self.model),
                lr_min=float(np.min(rates)),
                lr_max=float(np.max(rates)),
                redone_since_resume=adaptive_lr.redone_updates if adaptive_lr else None,
                lr_decisions_since_resume=len(adaptive_lr.decisions) if adaptive_lr else None,
            )
            self.learning_rates = []
            suite.write_jsonl(out / f"{SUITE}.jsonl", [row], mode="a")
            print(
                f"[{SUITE}] {env_id} {variant_name} seed {seed}: {row['timesteps']} steps, eval {row['eval_return']:.1f},"
                f" lr {row['learning_rate']:.3g}",
                flush=True,
            )
            self.next_eval = (self.num_timesteps // eval_every + 1) * eval_every

        def _on_training_end(self) -> None:
            # Finished, or stopped at the deadline: keep what was reached
            self.save_and_evaluate()

    class StopAtDeadline(BaseCallback):
        def _on_step(self) -> bool:
            return not recorder.past_deadline

    recorder = CheckpointAndEvaluate()
    # The recorder runs after the guard and the adaptive lr, so that it saves and logs the update they kept
    callbacks = [cb for cb in (guard, adaptive_lr, recorder, StopAtDeadline()) if cb is not None]
    model.learn(timesteps - resumed_at, callback=callbacks, reset_num_timesteps=False)
    env.close()
    if model.num_timesteps >= timesteps:
        shutil.rmtree(folder)  # finished: its rows are the result, only unfinished runs keep (and commit) a checkpoint
    return []


def evaluate_episodes(model: Any, env_id: str, seed: int) -> list[float]:
    """Returns of EVAL_EPISODES deterministic episodes on a fresh env with the training normalization frozen."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    train_env = model.get_env()
    eval_env = VecNormalize(training.make_env(env_id, 1, seed + 1000), training=False, norm_reward=False)
    eval_env.obs_rms = train_env.obs_rms
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, return_episode_rewards=True)
    eval_env.close()
    return [float(value) for value in returns]


def run(args: argparse.Namespace) -> None:
    """Start or continue every unfinished run."""
    reached = progress(args.out)
    deadline = time.time() + 60 * args.max_minutes if args.max_minutes else float("inf")
    jobs = [
        (env_id, variant, seed, args.timesteps, args.eval_every, str(args.out), deadline)
        for env_id, variant, seed in planned_runs(args.envs, args.variants, args.seeds)
        if reached.get((env_id, variant, seed), 0) < args.timesteps
    ]
    meta = dict(kind="meta", suite=SUITE, command="python -m benchmarks.full_budget " + " ".join(sys.argv[1:]), jobs=args.jobs)
    suite.write_jsonl(args.out / f"{SUITE}.jsonl", [dict(meta, **suite.machine_info())], mode="a")
    for _ in suite.run_parallel(run_job, jobs, args.jobs):
        pass
    report(args.out, args.timesteps)


def crosscheck(args: argparse.Namespace) -> None:
    """
    Train stock PPO on Hopper-v5 (seed 0) with ``python -m rl_zoo3.train`` and rl-zoo's Hopper-v4 entry, evaluated by
    rl-zoo's own EvalCallback every ``--eval-every`` steps (10 deterministic episodes, normalization synced and
    frozen); its evaluations become rows of variant :data:`CROSSCHECK`. Not resumable: a stopped run starts again.
    """
    import yaml

    settings = configs.zoo_config("ppo", CROSSCHECK_ENV)
    entries = yaml.safe_load((Path(__import__("rl_zoo3").__file__).parent / "hyperparams" / "ppo.yml").read_text())
    folder = args.out / SUITE / CROSSCHECK_ENV / "rl_zoo3_train"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "ppo.yml"
        conf.write_text(yaml.safe_dump({CROSSCHECK_ENV: entries[settings.zoo_key]}))
        command = [
            sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo", "--env", CROSSCHECK_ENV, "--seed", str(CROSSCHECK_SEED),
            "-conf", str(conf), "-n", str(args.timesteps), "--eval-freq", str(args.eval_every),
            "--eval-episodes", str(EVAL_EPISODES), "--n-eval-envs", "1", "--num-threads", "1", "-f", str(folder),
            "--device", "cpu",
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - start
    runs = sorted((folder / "ppo").glob(f"{CROSSCHECK_ENV}_*"), key=lambda path: int(path.name.rsplit("_", 1)[1]))
    evaluations = np.load(runs[-1] / "evaluations.npz")
    for trained_model in runs[-1].glob("*.zip"):
        trained_model.unlink()  # 1.7 MB each: the evaluations, rl-zoo's args and monitor are what is kept
    rows = [
        dict(
            kind="eval", env=CROSSCHECK_ENV, variant=CROSSCHECK, seed=CROSSCHECK_SEED, timesteps=int(step),
            eval_return=float(np.mean(returns)), eval_returns=[float(value) for value in returns], resumed_at=0,
            wall_s_since_resume=wall if step == evaluations["timesteps"][-1] else None,
        )
        for step, returns in zip(evaluations["timesteps"], evaluations["results"], strict=True)
    ]  # fmt: skip
    meta = dict(kind="meta", suite=SUITE, command="python -m benchmarks.full_budget " + " ".join(sys.argv[1:]), jobs=1)
    suite.write_jsonl(args.out / f"{SUITE}.jsonl", [dict(meta, **suite.machine_info()), *rows], mode="a")


def _runs(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    """Evaluation rows per (env, variant, seed) in step order, the latest row per step (a resumed run rewrites some)."""
    latest: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    for row in rows:
        latest[(_env_of(row), row["variant"], row["seed"], row["timesteps"])] = row
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for (env_id, variant, seed, _), row in sorted(latest.items()):
        runs.setdefault((env_id, variant, seed), []).append(row)
    return runs


def _per_segment_total(evals: list[dict[str, Any]], key: str) -> int | None:
    """A count kept per ``learn()`` (since a resume), summed over the run's segments."""
    last_of_segment: dict[int, Any] = {}
    for row in evals:
        last_of_segment[row.get("resumed_at", 0)] = row.get(key)
    values = [value for value in last_of_segment.values() if value is not None]
    return int(sum(values)) if values else None


def _wall_minutes(evals: list[dict[str, Any]]) -> float | None:
    """Training and evaluation time of a run, summed over its segments."""
    last_of_segment: dict[int, Any] = {}
    for row in evals:
        last_of_segment[row.get("resumed_at", 0)] = row.get("wall_s_since_resume")
    values = [value for value in last_of_segment.values() if value is not None]
    return sum(values) / 60 if values else None


def _finished(
    runs: dict[tuple[str, str, int], list[dict[str, Any]]], env_id: str, variant: str, timesteps: int
) -> list[list[dict[str, Any]]]:
    """The evaluation rows of the runs of ``variant`` on ``env_id`` that reached ``timesteps``."""
    return [
        evals
        for (env, name, _), evals in sorted(runs.items())
        if env == env_id and name == variant and evals[-1]["timesteps"] >= timesteps
    ]


def _last_evals_mean(evals: list[dict[str, Any]]) -> float:
    """The mean return of a run's last :data:`LAST_EVALS` evaluations."""
    return float(np.mean([row["eval_return"] for row in evals[-LAST_EVALS:]]))


def _probability(runs: list[float], stock: list[float]) -> str:
    """P(a run of ``runs`` ends above a run of ``stock``) with its 95 % bootstrap CI."""
    from benchmarks import aggregate

    p, low, high = aggregate.probability_of_improvement(np.array(runs)[:, None], np.array(stock)[:, None])
    return f"{p:.2f} [{low:.2f}, {high:.2f}]"


def _ratio(runs: list[float], stock: list[float]) -> str:
    """IQM(runs) / IQM(stock) with its 95 % bootstrap CI."""
    from benchmarks import aggregate

    ratio, low, high = aggregate.iqm_ratio_with_interval(np.array(runs)[:, None], np.array(stock)[:, None])
    return f"{ratio:.2f} [{low:.2f}, {high:.2f}]"


def _interval(values: list[float]) -> str:
    from benchmarks import aggregate

    if len(values) < 2:
        return "-" if not values else f"{values[0]:.0f} (1 run)"
    point, low, high = aggregate.iqm_with_interval({"x": np.array(values)[:, None]})["x"]
    return f"{point:.0f} [{low:.0f}, {high:.0f}]"


def report(out: Path, timesteps: int = TIMESTEPS) -> None:
    """``full_budget.md`` and ``full_budget.png`` from the JSONL (the latest row per run and step)."""

    meta, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    runs = _runs(rows)
    commits = sorted({str(row.get("commit")) for row in _metas(out) if row.get("commit")})
    lines = [
        "# Full budget on MuJoCo: stock PPO against the recommended stack at rl-zoo's 1M steps",
        "",
        f"Command: `python -m benchmarks.full_budget run` (resumable; last invocation `{meta.get('command')}`)",
        "",
        f"- Machine: {meta.get('cpu')}, {meta.get('cores')} cores, two runs at a time, 1 torch thread per run; versions:"
        f" torch {meta.get('torch')}, SB3 {meta.get('sb3')}, gymnasium {meta.get('gymnasium')}, sb3-safe"
        f" {meta.get('sb3_safe')} (commits of the invocations: {', '.join(commits)})",
        f"- Budget: {timesteps:,} steps per run (rl-zoo's); evaluation every {EVAL_EVERY:,} steps: deterministic policy,"
        f" {EVAL_EPISODES} episodes on a fresh env with the training observation normalization frozen.",
        "- Variants: **PPO**: stock SB3 PPO with rl-zoo's `ppo.yml` entry (the `-v4` one: rl-zoo has no `-v5` entries),"
        f" VecNormalize; **{STACK}** (the stack): the same hyperparameters with `SafeMlpPolicy`,"
        ' `NonFiniteGuardCallback(on_nonfinite="rollback")` and `KLAdaptiveLRCallback()` (its defaults);'
        f" **{STACK}{EARLIER}**: the stack's runs before the drop-in policy stopped normalizing observations by"
        " default and before the adaptive lr kept the configured rate as its ceiling (it raised Walker2d-v5's tuned"
        f" rate 3.4x); **{STACK_CAPPED}{EARLIER}** (Walker2d-v5): those runs with"
        f" `KLAdaptiveLRCallback(lr_bounds=(1e-5, tuned rate))`; **KLAdaptivePPO+guard{EARLIER}** (Hopper-v5):"
        " `sb3_safe/zoo_configs/kl_ppo.yml`, guard in"
        " rollback mode. Rows of an earlier code path are never pooled with the current ones."
        f" **{CROSSCHECK}**: stock PPO trained by rl-zoo's own `train` (seed {CROSSCHECK_SEED}, rl-zoo's"
        " EvalCallback, same protocol), the harness's cross-check.",
        f"- Reference: {ZOO_REFERENCE_NOTE}",
        "",
        "## Result per task (finished runs)",
        "",
        "IQM over seeds with its 95 % stratified bootstrap CI; P(> stock PPO): the probability that a run of the"
        " variant ends above a stock run (0.5: no difference), with its CI. Final: the last evaluation (10 episodes);"
        f" last {LAST_EVALS}: the mean of a run's last {LAST_EVALS} evaluations (its last"
        f" {LAST_EVALS * EVAL_EVERY:,} steps), less at the mercy of one evaluation's falls, the per-seed score the"
        f" comparison rests on: IQM / stock's is the ratio of the last-{LAST_EVALS} IQMs with its two-sample bootstrap"
        " CI (the stack's target: at least 0.95). Only finished runs count; runs in progress are listed below.",
        "",
    ]
    result_rows = []
    for env_id in ENVS:
        stock = _finished(runs, env_id, "PPO", timesteps)
        for variant in REPORTED_VARIANTS:
            finished = _finished(runs, env_id, variant, timesteps)
            if not finished:
                continue
            final = [evals[-1]["eval_return"] for evals in finished]
            last = [_last_evals_mean(evals) for evals in finished]
            best = [max(row["eval_return"] for row in evals) for evals in finished]
            comparison, comparison_last, ratio_last = "-", "-", "-"
            if variant != "PPO" and len(finished) >= 2 and len(stock) >= 2:
                stock_last = [_last_evals_mean(evals) for evals in stock]
                comparison = _probability(final, [evals[-1]["eval_return"] for evals in stock])
                comparison_last = _probability(last, stock_last)
                ratio_last = _ratio(last, stock_last)
            reference = ZOO_REFERENCE[env_id]
            result_rows.append(
                [
                    env_id,
                    variant,
                    len(finished),
                    _interval(final),
                    _interval(last),
                    _interval(best),
                    ratio_last,
                    comparison,
                    comparison_last,
                    f"{reference[1]:.0f} +- {reference[2]:.0f} ({reference[0]})" if variant == "PPO" else "",
                ]
            )
    lines += reports.table(
        [
            "task",
            "variant",
            "runs",
            "final return IQM",
            f"last {LAST_EVALS} IQM",
            "best return IQM",
            f"last {LAST_EVALS} IQM / stock's",
            "P(> stock PPO), final",
            f"P(> stock PPO), last {LAST_EVALS}",
            "rl-zoo PPO",
        ],
        result_rows,
    )
    lines += ["", "## Every run", ""]
    table_rows = []
    for (env_id, variant, seed), evals in sorted(runs.items()):
        last = evals[-1]
        rates = [row[key] for row in evals for key in ("lr_min", "lr_max") if row.get(key) is not None]
        rates = [rate for rate in rates if np.isfinite(rate)]
        first_rate = config(env_id, variant).kwargs.get("learning_rate") if variant != CROSSCHECK else None
        resumes = sorted({row["resumed_at"] for row in evals if row.get("resumed_at")})
        wall = _wall_minutes(evals)
        table_rows.append(
            [
                env_id,
                variant,
                seed,
                f"{last['timesteps']:,}" + (" (done)" if last["timesteps"] >= timesteps else " (partial)"),
                f"{last['eval_return']:.0f}",
                f"{max(row['eval_return'] for row in evals):.0f}",
                f"{first_rate:.3g}: {min(rates):.3g} to {max(rates):.3g}, last {last['learning_rate']:.3g}"
                if rates and isinstance(first_rate, float) and variant in ADAPTIVE_LR_VARIANTS
                else "-",
                _per_segment_total(evals, "redone_since_resume") if variant in ADAPTIVE_LR_VARIANTS else "-",
                last.get("guard_rollbacks") if last.get("guard_rollbacks") is not None else "-",
                last.get("skipped_updates") if last.get("skipped_updates") is not None else "-",
                f"{wall:.0f}" if wall else "-",
                ", ".join(f"{step:,}" for step in resumes) or "-",
            ]
        )
    lines += reports.table(
        [
            "task",
            "variant",
            "seed",
            "steps reached",
            "last eval",
            "best eval",
            "learning rate (tuned: lowest to highest, last)",
            "redos",
            "rollbacks",
            "skipped steps",
            "wall min",
            "resumed at",
        ],
        table_rows,
    )
    lines += ["", f"![curves]({SUITE}.png)"]
    reports.write_report(out / f"{SUITE}.md", lines)
    plot(runs, out)


def _metas(out: Path) -> list[dict[str, Any]]:
    import json

    path = out / f"{SUITE}.jsonl"
    return [row for row in map(json.loads, path.read_text().splitlines()) if row.get("kind") == "meta"]


def plot(runs: dict[tuple[str, str, int], list[dict[str, Any]]], out: Path) -> None:
    """Per task: evaluation return over timesteps (a line per run, a colour per variant); the stack's learning rate."""
    plt = reports.pyplot()
    figure, axes = plt.subplots(2, len(ENVS), figsize=(5 * len(ENVS), 7), sharex=True, squeeze=False)
    colours = {
        "PPO": "tab:blue",
        STACK: "tab:orange",
        STACK + EARLIER: "tab:brown",
        STACK_CAPPED + EARLIER: "tab:red",
        "KLAdaptivePPO+guard" + EARLIER: "tab:green",
        CROSSCHECK: "black",
    }
    for column, env_id in enumerate(ENVS):
        returns, rates = axes[0][column], axes[1][column]
        labelled: set[str] = set()
        for (env, variant, _), evals in sorted(runs.items()):
            if env != env_id:
                continue
            steps = [row["timesteps"] for row in evals]
            label = None if variant in labelled else variant
            labelled.add(variant)
            style = dict(color=colours.get(variant), marker=".", linewidth=1, label=label)
            returns.plot(steps, [row["eval_return"] for row in evals], **style)
            if variant in ADAPTIVE_LR_VARIANTS:
                rates.plot(steps, [row["learning_rate"] for row in evals], **style)
        reference = ZOO_REFERENCE[env_id]
        returns.axhline(reference[1], color="grey", linestyle="--", label=f"rl-zoo PPO {reference[0]}")
        tuned = config(env_id, "PPO").kwargs["learning_rate"]
        rates.axhline(tuned, color="tab:blue", linestyle="--", label="rl-zoo's tuned rate (stock PPO)")
        returns.set(title=f"{env_id}: evaluation return (10 episodes)", ylabel="return")
        rates.set(title="the stacks' learning rates", xlabel="timesteps", ylabel="learning rate", yscale="log")
        returns.legend(fontsize=7)
        rates.legend(fontsize=7)
    reports.save_figure(figure, out / f"{SUITE}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.full_budget", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("run", "crosscheck", "report"))
    parser.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS))
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
    elif args.action == "crosscheck":
        crosscheck(args)
    else:
        report(args.out, args.timesteps)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
