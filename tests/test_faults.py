"""
Randomized fault injection (``benchmarks/faults.py``): a fixed subset of its scenarios, each checked against the
invariants of the guard and the adaptive learning rate as one supervisor of each update (issue 36). The benchmark
runs many more (``python -m benchmarks run faults``). The subset must find what it was built to find: each defect of
the one-supervisor issue, re-introduced (``benchmarks/fault_mutants.py``), makes one of its scenarios report a
violation (issue 62).
"""

from dataclasses import fields

import pytest

from benchmarks import fault_mutants, faults


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


#: The violations of the unmutated code, by seed (what a defect's scenario must differ from)
_VIOLATIONS: dict[int, dict[str, list[str]]] = {}


def violations_of(seed: int) -> dict[str, list[str]]:
    if seed not in _VIOLATIONS:
        outcome = faults.run(faults.Scenario.draw(seed))
        _VIOLATIONS[seed] = {name: found for name, found in faults.check(outcome).items() if found}
    return _VIOLATIONS[seed]


@pytest.mark.parametrize("seed", faults.TEST_SEEDS)
def test_scenario_keeps_every_invariant(seed: int) -> None:
    violations = violations_of(seed)
    assert violations == {}, f"{faults.Scenario.draw(seed)}: {violations}"


#: The first scenario of the subset that reports each defect (tried first; the others follow if it no longer does)
FIRST_DETECTED_BY = {
    "judge_after_restore": 1003,
    "healthy_copy_before_redo": 1019,
    "redo_after_a_fault_in_the_redo": 1028,
    "rollback_keeps_the_optimizers_rate": 1003,
    "redo_at_the_lowest_rate": 1000,
    "redo_leaves_training_mode": 1001,
    "option_builds_a_callback_per_learn": 1003,
    "bounds_folded_into_the_scale": 1000,
    "rate_below_the_lower_bound": 1000,
    "schedules_read_past_the_end": 1005,
    "redo_keeps_the_counters": 1001,
    "two_messages_when_raising": 1002,
    "no_stall_event": 1015,
}


#: The defects a scenario can reach alone (the others say why not: ``Defect.unreachable``, in the mutants report)
REACHABLE = [name for name, defect in fault_mutants.DEFECTS.items() if defect.unreachable is None]


@pytest.mark.parametrize("defect", REACHABLE)
def test_the_fixed_subset_reports_each_defect_of_the_one_supervisor_issue(defect: str) -> None:
    """
    Each defect of issue 36, re-introduced in a forked process, makes a scenario of the subset report a violation
    the unmutated code does not (``python -m benchmarks run faults --mutants`` runs the full set too).
    """
    first = FIRST_DETECTED_BY.get(defect)
    seeds = [*([first] if first is not None else []), *(seed for seed in faults.TEST_SEEDS if seed != first)]
    baseline = {seed: found for seed, found in _VIOLATIONS.items() if found}  # (those the tests above saw, if any)
    module, source = fault_mutants.defect_source(defect)
    result = fault_mutants.in_child(module, source, seeds, True, baseline)
    assert result["error"] is None and not result["timeout"], result
    assert result["violating"], f"no scenario of the subset reports {defect}: {fault_mutants.DEFECTS[defect].what}"


def test_the_fixed_subset_covers_every_kind_of_scenario() -> None:
    """The suite's seeds draw every algorithm, callback order, mode, schedule, fault and save / load."""
    scenarios = [faults.Scenario.draw(seed) for seed in faults.TEST_SEEDS]
    assert {s.algo for s in scenarios} == {*faults.ON_POLICY, *faults.OFF_POLICY}
    assert {s.callbacks for s in scenarios} == set(faults.CALLBACKS)
    assert {s.mode for s in scenarios if s.guarded} == set(faults.MODES)
    assert {s.schedule for s in scenarios} == set(faults.SCHEDULES)
    assert {s.fault for s in scenarios} == set(faults.FAULTS)
    assert {s.n_envs for s in scenarios} == {1, 4} and {s.save_load for s in scenarios} == {False, True}
    assert {s.aim for s in scenarios} == set(faults.AIMS)
    aimed = [s for s in scenarios if s.aim in ("fault_in_redo", "after_redo", "last_update")]
    assert {s.mode for s in aimed} == {"stop", "rollback"} and {s.save_load for s in aimed} == {False, True}
    # the adaptive lr printing and quiet; deciding without bounds, with lr_bounds and with the kind's bounds
    assert {s.verbose for s in scenarios if s.adaptive} == {0, 1}
    deciding = [faults.adaptive_lr_settings(s) for s in scenarios if s.aim == "decisions"]
    assert {("lr_bounds" in d) + 2 * ("raise_above_configured" in d) for d in deciding} == {0, 1, 2}


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
