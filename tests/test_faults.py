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
