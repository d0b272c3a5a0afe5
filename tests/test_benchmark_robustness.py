"""
The robustness map: the suite runs end to end at a tiny budget (the numbers are not checked, only their shape), a
rerun continues an interrupted one, and the statistics of the report are checked on hand-made rows.
"""

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import aggregate, configs, reports, suite
from benchmarks.__main__ import main
from benchmarks.robustness_grid import (
    SEEDS,
    TASKS,
    ent_coefs,
    initial_learning_rate,
    job_key,
    jobs,
    random_return,
    row_key,
    scaled_learning_rate,
)
from benchmarks.robustness_report import HEADLINE_HEADER, cpu_replicate_section
from benchmarks.robustness_scores import (
    REACH_THRESHOLD,
    TaskResults,
    beats_best_peer,
    best_peer_worst,
    cells_reached,
    iqm_intervals,
    targets,
    task_results,
    worst_return,
)

# The guard rolls back a diverged update on purpose, with a warning each time
pytestmark = pytest.mark.filterwarnings("ignore::sb3_safe.NonFiniteGuardWarning")

#: Columns every run row has (the harness's, training's and the suite's own)
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
    "redone_updates",
    "final_learning_rate",
    "finished_at",
}
TARGET_VERDICT = ("met (", "missed by ", "missed at ", "n/a (")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's output at the tiny budget (run once for the module's tests)."""
    out = tmp_path_factory.mktemp("robustness")
    main(["run", "robustness", "--size", "tiny", "--jobs", "1", "--out", str(out)])
    return out


def test_robustness_suite_runs_end_to_end(tiny_out: Path) -> None:
    lines = _lines(tiny_out / "robustness.jsonl")
    meta = [row for row in lines if row["kind"] == "meta"][-1]
    runs = [row for row in lines if row["kind"] == "run"]
    assert meta["command"] == f"python -m benchmarks run robustness --size tiny --jobs 1 --out {tiny_out}"
    assert "wall_s" in meta
    assert runs and all(set(row) >= ROW_KEYS for row in runs)
    # Every task's variants, peers and sb3-safe, in the same invocation, on the task's own grid
    for env_id, task in TASKS.items():
        rows = [row for row in runs if row["task"] == env_id]
        assert sorted(row_key(row) for row in rows) == sorted(
            (env_id, variant, factor, ent_coef, seed)
            for variant in task.variants
            for factor in task.factors["tiny"]
            for ent_coef in ent_coefs(task, "tiny")
            for seed in SEEDS["tiny"]
        )
        assert all(row["timesteps"] == task.timesteps["tiny"] for row in rows)
    # The sb3-safe variants run with the guard (its counts are recorded), the +KL-lr ones with the adaptive lr
    for row in runs:
        task = TASKS[row["task"]]
        assert (row["guard_rollbacks"] is None) == (row["variant"] in task.peer_variants)
        assert (row["redone_updates"] is None) == (not row["variant"].endswith("+KL-lr"))

    report = (tiny_out / "robustness.md").read_text()
    assert f"Command: `{meta['command']}`" in report
    assert "| " + " | ".join(HEADLINE_HEADER) + " |" in report
    for env_id, task in TASKS.items():
        section = report.split(f"## {env_id} (")[1].split("\n## ")[0]
        assert "### Worst case per learning-rate factor" in section
        assert "### Targets of the recommended stack" in section
        assert f"![{env_id}](robustness_{env_id}.png)" in section
        for variant in task.recommended:
            verdicts = section.split(f"- **{variant}**: ")[1].splitlines()[1:4]
            assert all(line.startswith("  - ") and line.split(": ", 1)[1].startswith(TARGET_VERDICT) for line in verdicts)
    assert "these peers do not exist for A2C" in report
    pngs = [f"robustness_{env_id}.png" for env_id in TASKS] + ["robustness_profile.png"]
    assert all((tiny_out / png).stat().st_size > 0 for png in pngs)

    # The report is rebuilt from the JSONL alone, keeping notes written below the marker
    (tiny_out / "robustness.md").write_text(report + "my reading\n")
    main(["report", "robustness", "--out", str(tiny_out)])
    assert (tiny_out / "robustness.md").read_text().endswith("my reading\n")


def test_rerun_continues_an_interrupted_map(tiny_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Cut a finished map's JSONL as an interruption leaves it: the rerun runs exactly the missing jobs."""
    lines = (tiny_out / "robustness.jsonl").read_text().splitlines()
    # Interrupted after all but the last 3 rows, while the first of them was being written
    kept = len(lines) - 5  # the meta rows at both ends, the 3 rows left out
    (tmp_path / "robustness.jsonl").write_text("\n".join([*lines[: kept + 1], lines[kept + 1][:25]]) + "\n")
    command = ["run", "robustness", "--size", "tiny", "--jobs", "1", "--out", str(tmp_path)]

    main(command)

    assert "resuming" in capsys.readouterr().out
    runs = [row for row in _lines(tmp_path / "robustness.jsonl") if row["kind"] == "run"]
    assert sorted(map(row_key, runs)) == sorted(map(job_key, jobs("tiny")))
    assert [json.dumps(row) for row in runs[:kept]] == lines[1 : kept + 1]  # as text: NaN is not equal to itself
    meta = suite.read_jsonl(tmp_path / "robustness.jsonl")[0]
    assert meta["sessions"] == 2 and meta["resumed_rows"] == kept
    assert meta["cpus"] == [meta["cpu"]] * 2 and all(row["cpu"] == meta["cpu"] for row in runs)
    assert meta["wall_s"] > meta["session_wall_s"]
    assert "Resumed: run in 2 parts" in (tmp_path / "robustness.md").read_text()


def _toy_job(job: int) -> list[dict[str, Any]]:
    if job == 3:
        raise KeyboardInterrupt  # the run is stopped here
    return [dict(job=job, value=job * 10)]


def test_suite_resume_skips_written_jobs_and_refuses_another_budget(tmp_path: Path) -> None:
    def run(function: Any, budget: dict[str, Any]) -> None:
        suite.run_suite(
            "toy", tmp_path, "cmd", "tiny", 1, function, [1, 2, 3, 4], budget, lambda job: job, lambda row: row["job"]
        )

    with pytest.raises(KeyboardInterrupt):
        run(_toy_job, dict(grid=[1, 2]))
    assert [row["job"] for row in suite.read_jsonl(tmp_path / "toy.jsonl")[1]] == [1, 2]

    done: list[int] = []
    run(lambda job: done.append(job) or [dict(job=job, value=-job)], dict(grid=[1, 2]))
    assert done == [3, 4]
    meta, rows = suite.read_jsonl(tmp_path / "toy.jsonl")
    assert [(row["job"], row["value"]) for row in rows] == [(1, 10), (2, 20), (3, -3), (4, -4)]
    assert meta["sessions"] == 2 and meta["resumed_rows"] == 2

    with pytest.raises(ValueError, match="another grid or budget"):
        run(_toy_job, dict(grid=[1, 2, 3]))
    # Without keys a suite starts afresh, as before
    suite.run_suite("toy", tmp_path, "cmd", "tiny", 1, lambda job: [dict(job=job)], [7], dict(grid=[1]))
    assert [row["job"] for row in suite.read_jsonl(tmp_path / "toy.jsonl")[1]] == [7]


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


def test_full_grid_keeps_the_issue_s_shape() -> None:
    main_tasks = ("Pendulum-v1", "CartPole-v1", "Acrobot-v1")
    for env_id in main_tasks:
        assert len(TASKS[env_id].factors["full"]) >= 8 and len(ent_coefs(TASKS[env_id], "full")) == 2
    assert all(len(task.factors["full"]) >= 3 for task in TASKS.values())
    assert len(SEEDS["full"]) == 3
    assert all(task.recommended and all(name.endswith("+KL-lr") for name in task.recommended) for task in TASKS.values())


# --------------------------------------------------------------------------------------------------------------
# Statistics on hand-made rows
# --------------------------------------------------------------------------------------------------------------


def _row(task: str, variant: str, factor: float, ent_coef: float, seed: int, final: float, **changes: Any) -> dict:
    """A run row as ``run_job`` writes it (the fields the report reads)."""
    peer = variant in TASKS[task].peer_variants
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
        skipped_updates=None if peer or variant.startswith("PPO+") else 0,
        guard_rollbacks=None if peer else 0,
        guard_stopped=None if peer else False,
        redone_updates=0 if variant.endswith("+KL-lr") else None,
    )
    return {**row, **changes}


PENDULUM = "Pendulum-v1"
SAFE, KLPPO = "PPO+SafeMlpPolicy+guard+KL-lr", "KLAdaptivePPO+guard+KL-lr"


def _pendulum_rows() -> list[dict]:
    """
    Pendulum-v1, factors x1 / x100, ent_coef 0 / 0.1, seeds 0 / 1; every run returns -200 except: at x100 stock PPO
    crashes once, the target_kl peer's worst is -900 and SBX's -1000; SafeMlpPolicy's worst there is -800, the
    KLAdaptivePPO stack's -950 and it fails once at x1.
    """
    task = TASKS[PENDULUM]
    rows = [
        _row(PENDULUM, variant, factor, ent, seed, -200.0)
        for variant in task.variants
        for factor in (1.0, 100.0)
        for ent in (0.0, 0.1)
        for seed in (0, 1)
    ]
    changes = {
        ("PPO", 100.0, 0.1, 1): dict(final_return=float("nan"), error="ValueError: Expected parameter loc"),
        ("PPO(target_kl=0.01)", 100.0, 0.0, 0): dict(final_return=-900.0),
        ("PPO+SBX-lr", 100.0, 0.1, 0): dict(final_return=-1000.0),
        (SAFE, 100.0, 0.0, 1): dict(final_return=-800.0, redone_updates=7),
        (KLPPO, 100.0, 0.1, 1): dict(final_return=-950.0, guard_rollbacks=2),
        (KLPPO, 1.0, 0.0, 0): dict(params_finite=False, final_return=float("nan")),
    }
    return [{**row, **changes.get((row["variant"], row["lr_factor"], row["ent_coef"], row["seed"]), {})} for row in rows]


def test_worst_case_is_compared_with_the_best_peer() -> None:
    result = task_results(TASKS[PENDULUM], _pendulum_rows())
    assert worst_return(result, "PPO", 100.0) == float("-inf")
    assert best_peer_worst(result, 100.0) == ("PPO(target_kl=0.01)", -900.0)
    assert best_peer_worst(result, 1.0)[1] == -200.0
    assert beats_best_peer(result, SAFE, 100.0) and beats_best_peer(result, SAFE, 1.0)
    assert beats_best_peer(result, KLPPO, 100.0) is False
    assert beats_best_peer(result, KLPPO, 1.0) is False  # a failed run is below any return
    assert beats_best_peer(result, SAFE, 10.0) is None  # not run

    assert targets(result, SAFE, {})[2].text == "met (at 2 of 2 factors)"
    worst_case = targets(result, KLPPO, {})[2]
    assert worst_case.met is False
    assert worst_case.text == (
        "missed at 2 of 2 factors: x1: failed runs, PPO's worst -200.0; x100 by 50.0 (-950.0 vs PPO(target_kl=0.01)'s -900.0)"
    )


def test_failed_runs_on_both_sides_are_a_tie() -> None:
    rows = [row for row in _pendulum_rows() if row["variant"] in ("PPO", KLPPO)]
    rows = [{**row, "final_return": float("nan")} if row["lr_factor"] == 100.0 else row for row in rows]
    result = task_results(TASKS[PENDULUM], rows)
    assert worst_return(result, KLPPO, 100.0) == worst_return(result, "PPO", 100.0) == float("-inf")
    assert beats_best_peer(result, KLPPO, 100.0)


def test_share_and_iqm_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "BOOTSTRAP_REPS", 200)  # point estimates checked, not intervals
    result = task_results(TASKS[PENDULUM], _pendulum_rows())
    random = random_return(PENDULUM)
    assert result.tuned == -200.0 and result.random == random
    # A cell's score is its seed mean: (-200 + -800) / 2 at x100, ent_coef 0 is far below 90 % of tuned
    assert result.cell_scores(SAFE)[(100.0, 0.0)] == pytest.approx((-500.0 - random) / (-200.0 - random))
    assert cells_reached(result, SAFE) == (3, 4)
    assert cells_reached(result, "PPO(target_kl=0.01)") == (3, 4)
    assert cells_reached(result, KLPPO) == (2, 4)  # x1 ent 0 (a failed seed scores 0) and x100 ent 0.1

    iqms = iqm_intervals(result)
    safe = targets(result, SAFE, iqms)
    assert safe[1].met and safe[1].text == "met (3 of 4 cells, 75%)"
    kl = targets(result, KLPPO, iqms)
    assert kl[1].text == "missed by 25 percentage points (2 of 4 cells, 50%; 3 needed)"
    # The IQM (the mean of the middle half of 8 runs) of the stack with two low runs is still 1
    assert iqms[KLPPO][0] == pytest.approx(1.0) and kl[0].text.startswith("met (IQM 1.00 [")
    low = targets(result, KLPPO, {KLPPO: (0.80, 0.70, 0.90)})[0]
    assert low.met is False and low.text == "missed by 0.05 (IQM 0.80 [0.70, 0.90])"


def test_scores_are_not_defined_when_tuned_does_not_beat_random(tmp_path: Path) -> None:
    """CartPole-v1's stock run at the tuned settings below the random policy's 22: shares and IQM are n/a."""
    task = TASKS["CartPole-v1"]
    rows = [
        _row("CartPole-v1", variant, factor, 0.0, 0, 9.0 if factor == 1.0 else 30.0)
        for variant in task.variants
        for factor in (1.0, 10.0)
    ]
    result = task_results(task, rows)
    assert not result.normalizable
    assert cells_reached(result, task.stock) is None and iqm_intervals(result) == {}
    verdicts = targets(result, task.recommended[0], {})
    assert [target.met for target in verdicts] == [None, None, True]
    assert verdicts[0].text == verdicts[1].text == "n/a (tuned return not above random)"

    meta = dict(kind="meta", command="test", size="tiny", jobs=1, budget=dict(eval_episodes=1))
    (tmp_path / "robustness.jsonl").write_text("\n".join(json.dumps(row) for row in [meta, *rows]) + "\n")
    main(["report", "robustness", "--out", str(tmp_path)])
    report = (tmp_path / "robustness.md").read_text()
    assert "**The tuned return does not exceed the random policy's at this budget" in report
    assert "| A2C | peer (stock) | 0 of 2 | 0 / 0 / 0 | - | - | - | - | n/a | n/a |" in report


def test_report_of_a_full_size_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-made rows on Pendulum's full grid: headline counts, worst-case table and targets, one heatmap."""
    # The point estimates are checked here, not the intervals: fewer bootstrap resamples keep the test short
    monkeypatch.setattr(aggregate, "BOOTSTRAP_REPS", 200)
    task = TASKS[PENDULUM]
    factors, ents = task.factors["full"], ent_coefs(task, "full")
    rows = [
        _row(PENDULUM, variant, factor, ent, seed, -200.0 - 50.0 * seed)
        for variant in task.variants
        for factor in factors
        for ent in ents
        for seed in SEEDS["full"]
    ]
    rows = [
        {**row, "redone_updates": 3, "guard_rollbacks": 1}
        if row["variant"] == SAFE and row["lr_factor"] == 1000.0
        else {**row, "final_return": -1200.0}
        if row["variant"] == "PPO" and row["lr_factor"] == 1000.0
        else row
        for row in rows
    ]
    meta = dict(kind="meta", command="test", size="full", jobs=2, budget=dict(eval_episodes=10), wall_s=60.0)
    (tmp_path / "robustness.jsonl").write_text("\n".join(json.dumps(row) for row in [meta, *rows]) + "\n")

    main(["report", "robustness", "--out", str(tmp_path)])

    report = (tmp_path / "robustness.md").read_text()
    assert f"| {SAFE} | sb3-safe, recommended | 0 of 48 | 0 / 0 / 0 | 6 | 0 | 18 | - | 1.00 [" in report
    assert "| x1000 | -1200.0 | -300.0 | -300.0 | -300.0 | -300.0 | -300.0 | PPO(target_kl=0.01) | yes | yes | yes |" in report
    share = f"  - >= 75% of cells at >= {REACH_THRESHOLD:.0%} of the tuned return: met (16 of 16 cells, 100%)"
    assert share in report
    assert (tmp_path / f"robustness_{PENDULUM}.png").stat().st_size > 0


def test_the_masked_random_policy_acts_among_allowed_actions() -> None:
    """MachineScheduling-v0's random policy is the example's random ready machine, not an invalid-action ender."""
    example = configs.maskable_example()
    assert random_return(configs.MACHINE_SCHEDULING) == pytest.approx(
        example.scripted_return(example.random_ready, seed=0), abs=1.0
    )


def test_report_header_names_each_machine_of_a_resumed_run() -> None:
    """Runs of one seed differ between CPUs: a map resumed on another machine names each CPU."""
    one = dict(cpu="CPU A", cpus=["CPU A", "CPU A"], cores=2)
    assert "- Machine: CPU A, 2 cores" in "\n".join(reports.report_header("t", one, []))
    mixed = dict(cpu="CPU B", cpus=["CPU A", "CPU A", "CPU B"], cores=2)
    header = "\n".join(reports.report_header("t", mixed, []))
    assert "rows from CPU A and CPU B (one commit and seed" in header


def test_cpu_replicate_section_compares_the_same_jobs_on_two_cpus() -> None:
    """Per task and variant: pairs, equal returns, the median score difference and the 90 % criterion's flips."""

    def run(factor: float, seed: int, cpu: str, final_return: float) -> dict[str, Any]:
        return dict(task="Pendulum-v1", variant="PPO", lr_factor=factor, ent_coef=0.0, seed=seed, cpu=cpu,
                    final_return=final_return, error=None, eval_error=None, params_finite=True)  # fmt: skip

    # Scores: x1 seeds 0 / 1: 1 and 1 on A, 0 and 1 on B (cell means 1 / 0.5); x10 seed 0: 1 on both
    # (a cell of 1 seed of the map's 2: not a whole cell); a job on one CPU only is not paired
    runs = [
        run(1.0, 0, "A", -100.0), run(1.0, 0, "B", -1000.0), run(1.0, 1, "A", -100.0), run(1.0, 1, "B", -100.0),
        run(10.0, 0, "A", -100.0), run(10.0, 0, "B", -100.0), run(30.0, 0, "A", -100.0),
    ]  # fmt: skip
    map_cells = {(1.0, 0.0): runs[:2], (10.0, 0.0): runs[:2]}
    result = TaskResults(TASKS["Pendulum-v1"], {"PPO": map_cells}, [1.0, 10.0], [0.0], 0.0, random=-1000.0, tuned=-100.0)

    lines = cpu_replicate_section(({"note": "Two CPUs"}, runs), {"Pendulum-v1": result})

    assert lines[0] == "## The same runs on another CPU" and "CPUs: A, B" in lines[2]
    assert "| Pendulum-v1 | PPO | 3 | 2 | 0.00 | 1 | 1 of 1 |" in lines
