"""
What the KL does not see: per update on Acrobot-v1 at the robustness map's settings, the policy's KL (what
:class:`~sb3_safe.KLAdaptiveLRCallback` adapts on) beside the critic's explained variance, for stock PPO and the
recommended stack at learning rate x1 / x10 / x30 / x100, 3 seeds. Written to find out why the adaptive lr misses on
Acrobot-v1 (``robustness.md``): SB3's policies train the actor and the critic with one optimizer, so one learning
rate.

Per update: the learning rate it used; the mean exact ``KL(pi_old || pi_new)`` over its rollout
(:func:`sb3_safe.common.rollout_kl.mean_kl`, measured the same way for both variants, after any redo); the policy's
mean entropy on the rollout; the explained variance of the critic on the rollout before training on it
(``1 - Var(returns - values) / Var(returns)``, values as predicted while collecting: the critic of the previous
updates on new data; below 0 it predicts worse than a constant); the mean training episode return.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.utils import explained_variance

from benchmarks import reports, robustness_grid, suite, training, variants
from sb3_safe.common.rollout_kl import Rollout, mean_kl, old_distribution_params
from sb3_safe.common.schedules import current_learning_rate

SUITE = "critic"
ENV_ID = "Acrobot-v1"
VARIANTS = ("PPO", "PPO+SafeMlpPolicy+guard+KL-lr")
FACTORS = {"tiny": (1.0,), "quick": (1.0, 10.0), "full": (1.0, 10.0, 30.0, 100.0)}
SEEDS = {"tiny": (0,), "quick": (0,), "full": (0, 1, 2)}
#: Updates from which the critic has had time to fit (the tuned run's explained variance passes 0.4 by the 5th)
SETTLED_FROM = 4


class UpdateProbe(BaseCallback):
    """Records, per update, the learning rate, KL, entropy, the critic's explained variance and the episode return."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[dict[str, float | None]] = []
        self._pending: tuple[Rollout, th.Tensor | None] | None = None

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        model, buffer = self.model, self.model.rollout_buffer
        rollout = Rollout.of(buffer)
        self._pending = (rollout, old_distribution_params(model.policy, rollout))
        with th.no_grad():
            observations = th.as_tensor(rollout.observations, device=model.device)
            entropy = model.policy.get_distribution(observations).entropy()
        explained = explained_variance(buffer.values.ravel(), buffer.returns.ravel())  # nan for constant returns
        episodes = [info["r"] for info in model.ep_info_buffer]
        self.updates.append(
            dict(
                learning_rate=current_learning_rate(model),
                entropy=float(entropy.mean()) if entropy is not None else None,
                explained_variance=float(explained),
                episode_return=float(np.mean(episodes)) if episodes else None,
                kl=None,
            )
        )

    def _on_rollout_start(self) -> None:
        self._measure()

    def _on_training_end(self) -> None:
        self._measure()

    def _measure(self) -> None:
        if self._pending is not None:
            rollout, old_params = self._pending
            self.updates[-1]["kl"] = mean_kl(self.model.policy, rollout, old_params)
            self._pending = None


def jobs(size: str) -> list[tuple[str, float, int, str]]:
    """(variant, lr factor, seed, size)."""
    return [(variant, factor, seed, size) for factor in FACTORS[size] for seed in SEEDS[size] for variant in VARIANTS]


def run_job(job: tuple[str, float, int, str]) -> list[dict[str, Any]]:
    """Train one variant at one learning-rate factor with the probe last (it sees the update that was kept)."""
    variant_name, factor, seed, size = job
    task = robustness_grid.TASKS[ENV_ID]
    ent_coef = robustness_grid.tuned_settings(task)[1]
    config = robustness_grid.cell_config(task, factor, ent_coef, size)
    probe = UpdateProbe()
    row = training.train(
        variants.VARIANTS[variant_name],
        ENV_ID,
        config,
        task.timesteps[size],
        seed,
        robustness_grid.EVAL_EPISODES[size],
        callbacks=[probe],
    )
    return [dict(row, lr_factor=factor, ent_coef=ent_coef, updates=probe.updates)]


def budget(size: str) -> dict[str, Any]:
    """The grid recorded in the JSONL meta row."""
    return dict(env=ENV_ID, variants=list(VARIANTS), lr_factors=list(FACTORS[size]), seeds=list(SEEDS[size]))


def _median(values: list[float | None]) -> float:
    finite = [value for value in values if value is not None and np.isfinite(value)]
    return float(np.median(finite)) if finite else float("nan")


def report(out: Path) -> None:
    """``critic.md`` and ``critic.png`` from ``critic.jsonl``."""
    meta, runs = suite.read_jsonl(out / f"{SUITE}.jsonl")
    runs = sorted(runs, key=lambda row: (row["lr_factor"], row["variant"], row["seed"]))
    lines = reports.report_header(
        f"The critic beside the KL: {ENV_ID} at a wrong learning rate",
        meta,
        [
            f"rl-zoo's `ppo.yml` {ENV_ID} entry at the robustness map's budget, learning rate x"
            f"{', x'.join(f'{f:g}' for f in meta.get('budget', {}).get('lr_factors', []))}; the variants' settings as"
            " in the map (the `+KL-lr` one is the recommended stack: guard in rollback mode, `KLAdaptiveLRCallback()`).",
            "Per update: the learning rate used, the mean exact KL(pi_old || pi_new) over its rollout (after any redo),"
            " the policy's entropy, the critic's explained variance on the new rollout before training on it.",
        ],
    )
    header = [
        "lr factor",
        "variant",
        "seed",
        "learning rate, first / last",
        "KL per update, median",
        f"explained variance, median from update {SETTLED_FROM + 1}",
        "explained variance, last",
        "entropy, last",
        "final return",
    ]
    rows = []
    for run in runs:
        updates = run["updates"]
        settled = updates[SETTLED_FROM:]
        rows.append(
            [
                f"x{run['lr_factor']:g}",
                run["variant"],
                run["seed"],
                f"{updates[0]['learning_rate']:.2g} / {updates[-1]['learning_rate']:.2g}",
                f"{_median([u['kl'] for u in updates]):.3g}",
                f"{_median([u['explained_variance'] for u in settled]):.2f}",
                f"{updates[-1]['explained_variance']:.2f}",
                f"{updates[-1]['entropy']:.3f}",
                f"{run['final_return']:.1f}",
            ]
        )
    lines += [*reports.table(header, rows), "", f"![per update]({SUITE}.png)", ""]
    reports.write_report(out / f"{SUITE}.md", lines)
    _plot(runs, out / f"{SUITE}.png")


def _plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = sorted({run["lr_factor"] for run in runs})
    fig, axes = plt.subplots(2, len(factors), figsize=(4 * len(factors), 6), squeeze=False, sharey="row")
    for column, factor in enumerate(factors):
        for run in (run for run in runs if run["lr_factor"] == factor):
            style = "-" if run["variant"] == VARIANTS[0] else "--"
            label = f"{run['variant']} s{run['seed']}"
            updates = run["updates"]
            axes[0, column].plot([u["kl"] for u in updates], style, label=label)
            axes[1, column].plot([u["explained_variance"] for u in updates], style, label=label)
        axes[0, column].set(title=f"lr x{factor:g}", yscale="log", ylabel="KL per update")
        axes[1, column].set(xlabel="update", ylabel="critic's explained variance", ylim=(-1.5, 1.0))
        axes[1, column].axhline(0.0, color="grey", linewidth=0.5)
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")
