"""
Robustness map, second edition: can a run train through a wrong learning rate? Stock SB3 / sb3-contrib and the
learning-rate controllers an SB3 user reaches for (peers) vs sb3-safe with and without its
:class:`~sb3_safe.KLAdaptiveLRCallback`, on a grid around the tuned settings of five tasks.

Grid (size ``full``): learning rate = the tuned value x (0.1, 0.3, 1, 3, 10, 30, 100, 1000) (a ``lin_`` schedule has
its initial value scaled and stays linear), entropy coefficient in {tuned, 0.1}, seeds 0, 1, 2; RecurrentPPO and
MaskablePPO at x (1, 10, 100) with the tuned entropy coefficient only. Tasks (:data:`TASKS`, each with its peers and
sb3-safe variants; the "+KL-lr" ones are the recommended stack; every sb3-safe variant runs the guard in rollback
mode):

- Pendulum-v1, rl-zoo's ``ppo.yml`` entry, 49,152 steps (half of zoo's 1e5; the tuned PPO has converged by then);
- CartPole-v1, rl-zoo's ``a2c.yml`` entry, 100,000 steps (a fifth of zoo's 5e5);
- Acrobot-v1 (exploration matters: a random policy rarely swings up), rl-zoo's ``ppo.yml`` entry, 49,152 steps
  (zoo's 1e6 is far too long here; checked first: stock PPO at the tuned settings ends at -93, -80, -79 for seeds
  0-2 at 49,152 steps and -84, -79 at 100,000, against -497 for a random policy);
- CartPoleNoVel-v1, rl-zoo's ``ppo_lstm.yml`` entry (RecurrentPPO), 32,768 steps (the tuned run ends at 263 and 500
  for seeds 0 and 1, 361 at 49,152 steps; random: 24);
- MachineScheduling-v0, ``examples/maskable.py``'s MaskablePPO settings, its own budget of 100,000 steps.

Per run: exception, non-finite parameters, guard rollbacks and stops, updates redone by the adaptive learning rate,
final learning rate, final return (deterministic policy, 10 episodes). The report (``robustness.md``, built by
:mod:`benchmarks.robustness_report` from the JSONL; statistics in :mod:`benchmarks.robustness_scores`) has per
task the failures and counts per variant, the IQM of normalized scores with a stratified bootstrap interval
(rliable), the share of cells at >= 90 % of the tuned return, the worst case per learning-rate factor against the
best peer's, the targets of the recommended stack, heatmaps and performance profiles. An
interrupted run continues where it stopped when rerun with the same ``--out`` (:func:`benchmarks.suite.run_suite`,
keyed by :func:`job_key` / :func:`row_key`).

Sizing. Measured CPU-seconds of one run (training and 10 evaluation episodes, one process, one torch thread) at the
tuned settings and the full budget, one after another, the other core idle at first (1-min load 0.8-2.3) and then
busy with other jobs (load 3-5, the figures in brackets, whose wall time was up to 1.5x their CPU time):

- Pendulum-v1 (49,152): PPO 38.4, PPO+SafeMlpPolicy+guard+KL-lr 44.1, KLAdaptivePPO+guard 46.5,
  KLAdaptivePPO+guard+KL-lr 43.0, [PPO 41.5, PPO(target_kl=0.01) 19.1, PPO+SBX-lr 49.6; at x100 / x1000:
  PPO 37.3, PPO+SafeMlpPolicy+guard+KL-lr 48.0 / 49.2: a wrong learning rate costs about what the tuned one does];
- CartPole-v1 (100,000): A2C 23.4, SafeA2C+guard+KL-lr 26.8 (19 updates redone), [at x100: A2C 29.4,
  SafeA2C+guard+KL-lr 20.5];
- Acrobot-v1: at 100,000 steps PPO 40-46, PPO+SafeMlpPolicy+guard+KL-lr 33.0; [at 49,152 PPO 20.5-21.7];
- CartPoleNoVel-v1: at 49,152 steps RecurrentPPO 161.5 (about 300 steps/s),
  RecurrentPPO+SafeMlpLstmPolicy+guard+KL-lr 168.5; [at 32,768 RecurrentPPO 100-122];
- MachineScheduling-v0 (100,000): MaskablePPO 68.5, MaskablePPO+SafeMaskableMlpPolicy+guard+KL-lr 65.2.

This machine ran the same stock code about half as fast as when the first edition was measured (its rows: A2C
CartPole-v1 100k 10.4-11.8 CPU-s, PPO Pendulum-v1 49k 17.6-23.3). With today's figures (unmeasured variants taken
as their closest measured one) the task list as specified (6 Pendulum variants, Acrobot 100,000 and CartPoleNoVel
49,152 steps) is about 32,400 CPU-s: 4.5 h wall with ``--jobs 2``, three times the 90 minutes aimed at. Shrunk in
the order set for it: CartPoleNoVel-v1 49,152 -> 32,768 steps (-1,500 CPU-s), Acrobot-v1 100,000 -> 49,152
(-4,900); KLAdaptivePPO+guard without the adaptive lr stays on Pendulum-v1 (2,200), since it answers which of
KLAdaptivePPO's two KL controllers to use. Factors, seeds and ent_coef are as specified. The full size is then 774
runs, about 26,000 CPU-s: about 3.6 h wall with ``--jobs 2`` at today's speed, about 1.8 h at the first edition's
(the measured wall time is in the report's header); over the 90 minutes aimed at, for the five tasks asked for.
Measured (2026-12-01, ``benchmarks/results/robustness.md``): the tuned ent_coef's half, 414 runs, took about 2.7 h
wall with ``--jobs 2`` (resumed once), on cores shared at times with other jobs (Pendulum-v1 runs 18.5-51 CPU-s,
CartPole-v1 26-27, CartPoleNoVel-v1 77-132, MachineScheduling-v0 59-78); the ent_coef 0.1 half's 360 runs about
11,100 CPU-s (Pendulum-v1 6,100, CartPole-v1 2,500, Acrobot-v1 2,500), its last 348 runs 1.7 h wall with ``--jobs
2`` beside a third process at times. The whole map: 4.7 h wall, summed over the parts of a resumed run.
``--quick`` (x0.1 / x1 / x100, x1 / x100 on the sb3-contrib tasks; tuned ent_coef, 1 seed, short
budgets; 54 runs): measured 6.6 min wall with ``--jobs 2`` while another 2-process benchmark held both cores (each
run got about half a core: 571 s of run wall time for 283 CPU-s of training), i.e. about 3.5 min on free cores.
"""

from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import robustness_report, training, variants
from benchmarks.robustness_grid import (
    EVAL_EPISODES,
    SEEDS,
    SUITE,
    TASKS,
    Job,
    cell_config,
    ent_coefs,
    initial_learning_rate,
    job_key,
    jobs,
    row_key,
    tuned_settings,
)

# The suite's interface, read by benchmarks/__main__.py; the grid's definitions live in benchmarks.robustness_grid
__all__ = ["SUITE", "budget", "job_key", "jobs", "report", "row_key", "run_job"]


def run_job(job: Job, guard: str | None = None, normalize_observations: str | None = None) -> list[dict[str, Any]]:
    """
    Train and evaluate one grid cell's run; crashes are results.

    :param guard: a guard in this mode on a variant without one (``benchmarks.no_stall``); None: the variant as it is
    :param normalize_observations: ``"env"``: train in ``VecNormalize(norm_reward=False)``; ``"policy"``: with the safe
        policy's ``normalize_observations``; ``"none"``: neither (all three for ``benchmarks.observation_norm``); None:
        as the task and the variant train
    """
    env_id, variant, factor, ent_coef, seed, size = job
    task = TASKS[env_id]
    tuned_lr, _ = tuned_settings(task)
    config = cell_config(task, factor, ent_coef, size)
    trained = variants.guarded(variant, guard)
    if normalize_observations is not None:
        if normalize_observations not in ("env", "policy", "none"):
            raise ValueError(f"normalize_observations={normalize_observations!r}: 'env', 'policy', 'none' or None")
        trained = replace(trained, normalize_observations=normalize_observations == "policy")
        if normalize_observations == "env":
            config = replace(config, normalize=True, normalize_reward=False)
    row = training.train(trained, env_id, config, task.timesteps[size], seed, EVAL_EPISODES[size])
    return [
        dict(
            task=env_id,
            lr_factor=factor,
            ent_coef=ent_coef,
            learning_rate=initial_learning_rate(tuned_lr) * factor,
            lr_schedule="linear" if callable(tuned_lr) else "constant",
            **row,
        )
    ]


def budget(size: str) -> dict[str, Any]:
    """The grid recorded in the JSONL meta row (a resumed run must have the same)."""
    return dict(
        seeds=list(SEEDS[size]),
        eval_episodes=EVAL_EPISODES[size],
        tasks={
            env_id: dict(
                lr_factors=list(task.factors[size]),
                ent_coefs=ent_coefs(task, size),
                timesteps=task.timesteps[size],
                overrides=task.overrides.get(size, {}),
                variants=list(task.variants),
            )
            for env_id, task in TASKS.items()
        },
    )


def report(out: Path) -> None:
    """``robustness.md`` and its plots from the JSONL (:func:`benchmarks.robustness_report.report`)."""
    robustness_report.report(out)
