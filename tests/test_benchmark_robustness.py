"""The robustness-map suite runs end to end at a tiny budget (the numbers are not checked, only their shape)."""

import json
import math
from pathlib import Path

import pytest

from benchmarks import configs
from benchmarks.__main__ import main
from benchmarks.robustness import HEADLINE_HEADER, TASKS, initial_learning_rate, scaled_learning_rate

# The guard rolls back a diverged update on purpose, with a warning each time
pytestmark = pytest.mark.filterwarnings("ignore::sb3_safe.NonFiniteGuardWarning")

#: Columns every run row has (the harness's and the suite's own)
ROW_KEYS = {
    "kind",
    "task",
    "variant",
    "env",
    "seed",
    "lr_factor",
    "ent_coef",
    "learning_rate",
    "timesteps",
    "error",
    "params_finite",
    "final_return",
    "guard_rollbacks",
}


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's output at the tiny budget (run once for the module's tests)."""
    out = tmp_path_factory.mktemp("robustness")
    main(["run", "robustness", "--size", "tiny", "--jobs", "1", "--out", str(out)])
    return out


def test_robustness_suite_runs_end_to_end(tiny_out: Path) -> None:
    lines = [json.loads(line) for line in (tiny_out / "robustness.jsonl").read_text().splitlines()]
    meta = [row for row in lines if row["kind"] == "meta"][-1]
    runs = [row for row in lines if row["kind"] == "run"]
    assert meta["command"] == f"python -m benchmarks run robustness --size tiny --jobs 1 --out {tiny_out}"
    assert "wall_s" in meta
    assert runs and all(set(row) >= ROW_KEYS for row in runs)
    # Every task's variants, stock and safe, in the same invocation, at factor 1 (the reference) and above
    for env_id, task in TASKS.items():
        rows = [row for row in runs if row["task"] == env_id]
        assert {row["variant"] for row in rows} == set(task.variants)
        assert {1.0, 100.0} == {row["lr_factor"] for row in rows}
    # The safe variants run with the guard (its counts are recorded), stock without
    assert all((row["guard_rollbacks"] is None) == (row["variant"] in ("PPO", "A2C")) for row in runs)

    report = (tiny_out / "robustness.md").read_text()
    assert f"Command: `{meta['command']}`" in report
    assert "| " + " | ".join(HEADLINE_HEADER) + " |" in report
    assert "### Worst case per learning-rate factor" in report
    assert all(f"## {env_id}:" in report for env_id in TASKS)
    pngs = [f"robustness_{env_id}.png" for env_id in TASKS] + ["robustness_profile.png"]
    assert all((tiny_out / png).stat().st_size > 0 for png in pngs)

    # The report is rebuilt from the JSONL alone, keeping notes written below the marker
    (tiny_out / "robustness.md").write_text(report + "my reading\n")
    main(["report", "robustness", "--out", str(tiny_out)])
    assert (tiny_out / "robustness.md").read_text().endswith("my reading\n")


def test_learning_rate_scaling_keeps_the_schedule() -> None:
    from rl_zoo3.utils import SimpleLinearSchedule, linear_schedule

    # A constant learning rate is scaled as a number
    assert scaled_learning_rate(1e-3, 30.0) == pytest.approx(0.03)
    # zoo's lin_ schedule: the initial value is scaled and the override is again a lin_ string, so it stays linear
    override = scaled_learning_rate(linear_schedule(7e-4), 10.0)
    assert isinstance(override, str) and override.startswith("lin_")
    schedule = configs.zoo_config("ppo", "Pendulum-v1", learning_rate=override).kwargs["learning_rate"]
    assert isinstance(schedule, SimpleLinearSchedule)
    assert initial_learning_rate(schedule) == pytest.approx(7e-3)
    assert schedule(0.5) == pytest.approx(3.5e-3)
    assert math.isclose(initial_learning_rate(2e-4), 2e-4)


def _row(task: str, variant: str, factor: float, ent_coef: float, seed: int, final: float, **changes: object) -> dict:
    """A run row as ``run_job`` writes it (the fields the report reads)."""
    guarded = variant not in ("PPO", "A2C")
    row = dict(
        kind="run",
        task=task,
        env=task,
        variant=variant,
        lr_factor=factor,
        ent_coef=ent_coef,
        seed=seed,
        timesteps=1000,
        error=None,
        eval_error=None,
        params_finite=True,
        final_return=final,
        skipped_updates=None if variant in ("PPO", "A2C", "PPO+SafeMlpPolicy+guard") else 0,
        guard_rollbacks=0 if guarded else None,
        guard_stopped=False if guarded else None,
    )
    return {**row, **changes}


def test_report_scores_failed_runs_as_worst_and_random(tmp_path: Path) -> None:
    """Failed runs rank last in the worst case and score 0 in the shares; the IQM and profiles need no training."""
    rows = []
    for factor in (1.0, 10.0):
        for ent_coef in (0.0, 0.1):
            for seed in (0, 1):
                rows.append(_row("CartPole-v1", "A2C", factor, ent_coef, seed, 500.0))
                rows.append(_row("CartPole-v1", "SafeA2C+guard", factor, ent_coef, seed, 480.0))
    # At x10 stock crashes once, the safe variant rolls back and ends lower
    rows[-4] = _row("CartPole-v1", "A2C", 10.0, 0.1, 0, float("nan"), error="ValueError: Expected parameter logits")
    rows[-1] = _row("CartPole-v1", "SafeA2C+guard", 10.0, 0.1, 1, 100.0, guard_rollbacks=2)
    meta = dict(kind="meta", command="test", size="tiny", jobs=1, budget=dict(lr_factors=[1.0, 10.0]))
    (tmp_path / "robustness.jsonl").write_text("\n".join(json.dumps(row) for row in [meta, *rows]) + "\n")

    main(["report", "robustness", "--out", str(tmp_path)])

    report = (tmp_path / "robustness.md").read_text()
    assert "| A2C | 1 of 8 | 1 / 0 / 0 | - | - | - | 3 of 4 (75%) |" in report
    assert "| SafeA2C+guard | 0 of 8 | 0 / 0 / 0 | 2 | 0 | 0 | 3 of 4 (75%) |" in report
    assert "| x10 | failed 1 of 4 | 100.0 | yes |" in report
    assert "| x1 | 500.0 | 480.0 | **no** |" in report
    assert "IQM normalized score [95% stratified bootstrap CI]" in report
    assert "`ValueError: Expected parameter logits`" in report
    assert (tmp_path / "robustness_profile.png").stat().st_size > 0
