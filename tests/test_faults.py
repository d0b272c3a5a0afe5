"""
Randomized fault injection (``benchmarks/faults.py``): a fixed subset of its scenarios, each checked against the
invariants of the guard and the adaptive learning rate as one supervisor of each update (issue 36). The benchmark
runs many more (``python -m benchmarks run faults``).
"""

from dataclasses import fields

import pytest

from benchmarks import faults


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("seed", faults.TEST_SEEDS)
def test_scenario_keeps_every_invariant(seed: int) -> None:
    outcome = faults.run(faults.Scenario.draw(seed))
    violations = {name: found for name, found in faults.check(outcome).items() if found}
    assert violations == {}, f"{outcome.scenario}: {violations}"


def test_the_fixed_subset_covers_every_kind_of_scenario() -> None:
    """The suite's seeds draw every algorithm, callback order, mode, schedule, fault and save / load."""
    scenarios = [faults.Scenario.draw(seed) for seed in faults.TEST_SEEDS]
    assert {s.algo for s in scenarios} == {*faults.ON_POLICY, *faults.OFF_POLICY}
    assert {s.callbacks for s in scenarios} == set(faults.CALLBACKS)
    assert {s.mode for s in scenarios if s.guarded} == set(faults.MODES)
    assert {s.schedule for s in scenarios} == set(faults.SCHEDULES)
    assert {s.fault for s in scenarios} == set(faults.FAULTS)
    assert {s.n_envs for s in scenarios} == {1, 4} and {s.save_load for s in scenarios} == {False, True}


def test_a_scenario_is_a_function_of_its_seed() -> None:
    assert faults.Scenario.draw(7) == faults.Scenario.draw(7)
    assert len({faults.Scenario.draw(seed) for seed in range(40)}) == 40
    assert {field.name for field in fields(faults.Scenario)} >= {"algo", "callbacks", "mode", "fault", "fault_at"}


def test_the_suite_runs_and_reports_violations_per_invariant(tmp_path: object) -> None:
    from pathlib import Path

    from benchmarks.__main__ import main

    out = Path(str(tmp_path)) / "out"
    main(["run", "faults", "--size", "tiny", "--jobs", "1", "--out", str(out)])
    report = (out / "faults.md").read_text()
    assert "| invariant | scenarios violating it |" in report
    assert all(f"| {name} | 0 |" in report for name in faults.INVARIANTS)
    assert "**fault**:" in report and "**callbacks**:" in report
