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

Sizing. CPU-seconds of one run (training and 10 evaluation episodes, one process, one torch thread, cores shared at
times) at the tuned settings and the full budget: Pendulum-v1 19-50 per variant, CartPole-v1 20-30, Acrobot-v1 about
21 (stock PPO), CartPoleNoVel-v1 100-122 (stock RecurrentPPO), MachineScheduling-v0 59-78; a wrong learning rate costs
about what the tuned one does (PPO Pendulum-v1 at x100 / x1000: 37-49). The full size, 774 runs, is about 26,000
CPU-s: it took 4.7 h wall with ``--jobs 2``, summed over the parts of a resumed run (the report's header has the
measured wall time). ``--quick`` (x0.1 / x1 / x100, x1 / x100 on the sb3-contrib tasks; tuned ent_coef, 1 seed,
short budgets; 57 runs): about 3.5 min on free cores with ``--jobs 2`` (measured with 54).
"""

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


def run_job(job: Job, guard: str | None = None) -> list[dict[str, Any]]:
    """
    Train and evaluate one grid cell's run; crashes are results.

    :param guard: a guard in this mode on a variant without one (``benchmarks.no_stall``); None: the variant as it is
    """
    env_id, variant, factor, ent_coef, seed, size = job
    task = TASKS[env_id]
    tuned_lr, _ = tuned_settings(task)
    config = cell_config(task, factor, ent_coef, size)
    trained = variants.guarded(variant, guard)
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
