"""The benchmark harness runs end to end at a tiny budget (the numbers are not checked, only their shape)."""

import dataclasses
import importlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from benchmarks import suite, variants
from benchmarks.__main__ import main
from benchmarks.overhead import median_interval, verdict
from benchmarks.stress import REFERENCE, TINY_CONFIGS

# The stress suite's guard rolls back a diverged update on purpose, with a warning each time
pytestmark = pytest.mark.filterwarnings("ignore::sb3_safe.NonFiniteGuardWarning")

#: Columns every run row has, and the ones each suite adds
COMMON_KEYS = {"kind", "variant", "env", "seed", "timesteps", "wall_s", "cpu_s", "error", "params_finite", "final_return"}
SUITE_KEYS = {
    "overhead": {"replica", "round", "position", "steps_per_s", "cpu_steps_per_s"},
    "learning": {"family", "curve", "skipped_updates", "kl_beta", "log_std_max", "masked_actions"},
    "stress": {"config", "role", "guard_rollbacks", "guard_stopped", "log_std_max", "masked_actions"},
}
#: sb3-contrib's algorithms, stock and with sb3-safe's policies: in every suite, also at the tiny budget
CONTRIB_VARIANTS = {"RecurrentPPO", "RecurrentPPO+SafeMlpLstmPolicy", "MaskablePPO", "MaskablePPO+SafeMaskableMlpPolicy"}
#: Report lines naming the sb3-contrib families
CONTRIB_LINES = {
    "overhead": ["| CartPoleNoVel-v1 | RecurrentPPO+SafeMlpLstmPolicy | RecurrentPPO |", "| MachineScheduling-v0 |"],
    "learning": ["## RecurrentPPO: stock vs safe policy", "## MaskablePPO: stock vs safe policy"],
    "stress": [
        "| `recurrent_log_std` | 1/1 | 1/1 | n/a | 1/1 | 1/1 | 1/1 |",
        "| `masked_sgd_lr` |",
        "## Runs that end learning (final return >= 50% of the way from random to the tuned return)",
    ],
}
TABLE_HEADERS = {
    "overhead": "| env | variant | baseline | steps/s (median) | wall ratio (median) |",
    "learning": "| env | PPO return IQM [95 % CI] | KLAdaptivePPO return IQM [95 % CI] |",
    "stress": "| config | stock SB3 | safe policy | safe algorithm | safe algorithm + guard |",
}
PLOTS = {
    "overhead": ["overhead.png"],
    "learning": ["learning_CartPole-v1.png", "learning_CartPoleNoVel-v1.png", "learning_MachineScheduling-v0.png"],
    "stress": ["stress.png"],
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Run a suite at the tiny budget once per module (several tests read its output); returns its folder."""
    folders: dict[str, Path] = {}

    def run(suite: str) -> Path:
        if suite not in folders:
            folders[suite] = tmp_path_factory.mktemp(suite)
            main(["run", suite, "--size", "tiny", "--jobs", "1", "--out", str(folders[suite])])
        return folders[suite]

    return run


def run_rows(out: Path, suite: str) -> list[dict]:
    """The run rows of a suite's JSONL."""
    return [row for row in map(json.loads, (out / f"{suite}.jsonl").read_text().splitlines()) if row["kind"] == "run"]


@pytest.mark.parametrize("suite", sorted(SUITE_KEYS))
def test_suite_runs_end_to_end(suite: str, tiny_run: Callable[[str], Path]) -> None:
    tmp_path = tiny_run(suite)

    lines = [json.loads(line) for line in (tmp_path / f"{suite}.jsonl").read_text().splitlines()]
    metas = [row for row in lines if row["kind"] == "meta"]
    runs = [row for row in lines if row["kind"] == "run"]
    assert metas[-1]["command"] == f"python -m benchmarks run {suite} --size tiny --jobs 1 --out {tmp_path}"
    assert {"cpu", "cores", "sb3", "torch", "sb3_safe", "budget", "wall_s"} <= set(metas[-1])
    assert runs and all(COMMON_KEYS | SUITE_KEYS[suite] <= set(row) for row in runs)
    # Stock SB3 and sb3-safe side by side in the same invocation, sb3-contrib's algorithms included
    assert {"PPO", "KLAdaptivePPO"} | CONTRIB_VARIANTS <= {row["variant"] for row in runs}

    report = (tmp_path / f"{suite}.md").read_text()
    assert f"Command: `{metas[-1]['command']}`" in report
    assert TABLE_HEADERS[suite] in report
    assert all(line in report for line in CONTRIB_LINES[suite])
    assert all((tmp_path / png).stat().st_size > 0 for png in PLOTS[suite])

    # The report is rebuilt from the JSONL alone, keeping notes written below the marker
    (tmp_path / f"{suite}.md").write_text(report + "my reading\n")
    main(["report", suite, "--out", str(tmp_path)])
    assert (tmp_path / f"{suite}.md").read_text().endswith("my reading\n")


def test_stress_rows_record_log_std_and_masked_actions(tiny_run: Callable[[str], Path]) -> None:
    """The log-std's largest entry where the policy has one, the actions against the mask for MaskablePPO only."""
    assert {"recurrent_log_std", "masked_sgd_lr"} <= set(TINY_CONFIGS)
    runs = run_rows(tiny_run("stress"), "stress")
    for row in runs:
        recurrent, masked = row["variant"].startswith("RecurrentPPO"), row["variant"].startswith("MaskablePPO")
        assert (row["log_std_max"] is not None) == recurrent, row
        assert (row["masked_actions"] is not None) == masked, row
        if recurrent and row["variant"] != "RecurrentPPO":
            assert row["log_std_max"] <= 2.0  # the safe policy's upper bound
    # Stock MaskablePPO diverges at its first SGD update (its second rollout); the guard rolls back and goes on
    by_variant = {row["variant"]: row for row in runs if row["config"] == "masked_sgd_lr" and row["role"] != REFERENCE}
    assert by_variant["MaskablePPO"]["error"].startswith("ValueError: Expected parameter logits")
    assert by_variant["MaskablePPO+SafeMaskableMlpPolicy+guard"]["guard_rollbacks"] >= 1
    assert by_variant["MaskablePPO+SafeMaskableMlpPolicy+guard"]["params_finite"]


def test_median_interval_uses_order_statistics_with_exact_coverage() -> None:
    # n = 11: x_(3)..x_(9) covers the median with probability 1 - 2 * (1 + 11 + 55) / 2**11 = 0.9346;
    # x_(4)..x_(8) would cover only 0.77 (< 0.9)
    low, high, coverage = median_interval([float(value) for value in (5, 1, 9, 3, 7, 11, 2, 10, 4, 8, 6)])
    assert (low, high) == (3.0, 9.0) and coverage == pytest.approx(1 - 2 * 67 / 2048)
    # n = 7: no narrower interval reaches 0.9, so the range (coverage 1 - 2 / 128)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]) == (1.0, 7.0, pytest.approx(1 - 2 / 128))


@pytest.mark.parametrize(
    "low, high, expected",
    [(0.98, 1.03, "yes"), (1.031, 1.05, "**no**"), (0.99, 1.05, "within noise (median yes)")],
)
def test_overhead_verdict_reads_the_interval(low: float, high: float, expected: str) -> None:
    assert verdict(1.02 if "yes" in expected else 1.04, low, high, 1.03) == expected


def test_callback_clock_times_each_event_of_a_real_run() -> None:
    """The callback clock counts every call of the guard's events and hooks in a real learn(), and times them."""
    from stable_baselines3 import A2C

    from benchmarks.overhead import CallbackClock
    from sb3_safe import NonFiniteGuardCallback

    model = A2C("MlpPolicy", "CartPole-v1", n_steps=5, seed=0)
    guard = NonFiniteGuardCallback()
    clock = CallbackClock(guard)
    model.learn(50, callback=guard)
    calls = {name: n_calls for name, (n_calls, _) in clock.calls.items()}
    assert calls["_on_step"] == 50
    assert calls["_on_rollout_start"] == calls["_on_rollout_end"] == 10
    assert calls["_after_optimizer_step"] == 10  # one RMSprop step per rollout
    assert calls["_on_training_start"] == calls["_on_training_end"] == 1
    assert all(seconds > 0 for name, (n_calls, seconds) in clock.calls.items() if n_calls)


def test_critic_probe_sees_the_kept_update_and_the_report_reads_it(tmp_path: Path) -> None:
    """The probe's KL per update is the one the adaptive lr kept (after its redos); the suite runs end to end."""
    from stable_baselines3 import PPO

    from benchmarks.critic import UpdateProbe
    from sb3_safe import KLAdaptiveLRCallback

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=4, learning_rate=3e-2, seed=0)
    # A target this low makes updates overshoot the undo bound: those are redone, and the kept one differs
    adaptive_lr = KLAdaptiveLRCallback(target_kl=1e-5, undo_above=2.0, max_redos=1)
    probe = UpdateProbe()
    model.learn(256, callback=[adaptive_lr, probe])
    assert adaptive_lr.redone_updates >= 1 and len(probe.updates) == len(adaptive_lr.history) == 4
    assert [update["kl"] for update in probe.updates] == pytest.approx([kl for kl, _ in adaptive_lr.history], rel=1e-5)
    assert all(update["explained_variance"] is not None and update["explained_variance"] <= 1.0 for update in probe.updates)

    main(["run", "critic", "--size", "tiny", "--jobs", "1", "--out", str(tmp_path)])
    rows = run_rows(tmp_path, "critic")
    assert {row["variant"] for row in rows} == {"PPO", "PPO+SafeMlpPolicy+guard+KL-lr"}
    assert all(row["updates"] and all(u["kl"] is not None and u["kl"] >= 0.0 for u in row["updates"]) for row in rows)
    assert "| lr factor | variant | seed | learning rate, first / last |" in (tmp_path / "critic.md").read_text()
    assert (tmp_path / "critic.png").stat().st_size > 0


@pytest.mark.parametrize("suite", ["learning", "stress"])
def test_suite_rows_name_their_jobs_for_a_resumed_run(suite: str, tiny_run: Callable[[str], Path]) -> None:
    """A rerun with the same --out skips the jobs whose key is among the rows: each job's key once, one per row."""
    module = importlib.import_module(f"benchmarks.{suite}")
    keys = [module.job_key(job) for job in module.jobs("tiny")]
    assert len(set(keys)) == len(keys)
    assert sorted(map(module.row_key, run_rows(tiny_run(suite), suite))) == sorted(keys)


def test_reward_scale_map_runs_resumes_and_reports(tmp_path: Path) -> None:
    """The reward-scale map at the tiny budget: one row per job (keyed for a resumed run), a rerun runs nothing, the
    report has its tables and heatmap."""
    from benchmarks import reward_scale

    command = ["run", "reward_scale", "--size", "tiny", "--jobs", "1", "--out", str(tmp_path)]
    main(command)
    rows = run_rows(tmp_path, "reward_scale")
    assert sorted(map(reward_scale.row_key, rows)) == sorted(map(reward_scale.job_key, reward_scale.jobs("tiny")))
    assert all(COMMON_KEYS | {"family", "scale", "stack", "guard_stalls", "skipped_updates"} <= row.keys() for row in rows)
    assert {row["variant"] for row in rows} == {label for label, *_ in reward_scale.SETTINGS["A2C"]}
    main(command)
    assert len(run_rows(tmp_path, "reward_scale")) == len(rows)
    report = (tmp_path / "reward_scale.md").read_text()
    assert "| variant | x1e+30 |" in report and "| variant | crashes | stall events | skipped steps | rollbacks |" in report
    assert (tmp_path / "reward_scale.png").exists()


def test_no_stall_suite_watches_every_tuned_run_and_resumes(tmp_path: Path) -> None:
    """The tuned runs of the learning suite and of the robustness map (factor 1), each with a guard; keyed for a
    resumed run; the report counts the stall events."""
    from benchmarks import learning, no_stall, robustness, robustness_grid

    jobs = no_stall.jobs("tiny")
    tuned_ent_coef = {env_id: robustness_grid.tuned_settings(task)[1] for env_id, task in robustness_grid.TASKS.items()}
    tuned = [job for job in robustness.jobs("tiny") if job[2] == 1 and job[3] == tuned_ent_coef[job[0]]]
    assert len(jobs) == len(learning.jobs("tiny")) + len(tuned) and len(set(map(no_stall.job_key, jobs))) == len(jobs)
    assert all(variants.guarded(name, "raise").guard for name in variants.VARIANTS)
    assert variants.guarded("PPO+SafeMlpPolicy+guard+KL-lr", "raise").guard == "rollback"  # its own kept
    rows = [row for job in jobs[:1] + jobs[-1:] for row in no_stall.run_job(job)]
    assert [no_stall.row_key(row) for row in rows] == [no_stall.job_key(jobs[0]), no_stall.job_key(jobs[-1])]
    assert all(row["guard_events"] == 0 and row["guard_stalls"] == 0 and row["error"] is None for row in rows)
    assert rows[0]["added_guard"] and rows[0]["source"] == "learning" and rows[-1]["source"] == "robustness"
    meta = dict(kind="meta", size="tiny", command="c")
    suite.write_jsonl(tmp_path / "no_stall.jsonl", [meta] + [dict(kind="run", **row) for row in rows])
    no_stall.report(tmp_path)
    report = (tmp_path / "no_stall.md").read_text()
    assert "**Stall events: 0** in 2 runs" in report and "| source | variant | runs | guard |" in report


def test_the_capped_stack_may_lower_the_tuned_rate_never_raise_it() -> None:
    from benchmarks import full_budget

    capped = variants.VARIANTS[full_budget.STACK_CAPPED]
    assert variants.make_adaptive_lr(capped, 5.05e-5).lr_bounds == (1e-5, 5.05e-5)
    assert variants.make_adaptive_lr(capped, 3e-6).lr_bounds == (3e-6, 3e-6)  # a tuned rate below the default floor
    assert variants.make_adaptive_lr(variants.VARIANTS[full_budget.STACK], 5.05e-5).lr_bounds is None  # the defaults
    with pytest.raises(ValueError, match="configured"):
        variants.make_adaptive_lr(capped)
    planned = full_budget.planned_runs(list(full_budget.ENVS), list(full_budget.VARIANTS), [0])
    assert {env for env, variant, _ in planned if variant == full_budget.STACK} == set(full_budget.ENVS)
    assert not set(full_budget.EARLIER_VARIANTS) & {variant for _, variant, _ in planned}  # reported, never rerun


@pytest.mark.parametrize("name", ["PPO+SafeMlpPolicy", "A2C+SafeMlpPolicy", "KLAdaptivePPO", "SafeA2C"])
def test_benchmark_models_normalize_observations_once(name: str) -> None:
    """A safe policy under a stock algorithm or SafeA2C normalizes no observation by default (SB3's computation);
    KLAdaptivePPO's "auto" normalizes them unless the env's VecNormalize already does; a pinned True normalizes."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    variant = variants.VARIANTS[name]
    for vec_normalize in (None, {"norm_obs": True}, {"norm_obs": False}):
        env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
        if vec_normalize is not None:
            env = VecNormalize(env, **vec_normalize)
        model = variants.build_model(variant, env, seed=0, kwargs={})
        normalized_by_env = vec_normalize is not None and vec_normalize["norm_obs"]
        auto = variant.algo == "KLAdaptivePPO"
        assert hasattr(model.policy, "observation_normalizer") is (auto and not normalized_by_env)
    pinned = dataclasses.replace(variants.VARIANTS[name], normalize_observations=True)
    model = variants.build_model(pinned, VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0)), seed=0, kwargs={})
    assert hasattr(model.policy, "observation_normalizer")


def test_the_iqm_ratio_scales_with_the_variant_and_its_interval_holds_it() -> None:
    from benchmarks import aggregate

    reference = np.array([[900.0], [1000.0], [1100.0], [700.0], [1300.0]])
    ratio, low, high = aggregate.iqm_ratio_with_interval(2 * reference, reference)
    assert ratio == pytest.approx(2.0) and low <= 2.0 <= high and low < high
    ratio, low, high = aggregate.iqm_ratio_with_interval(reference[::-1], reference)
    assert ratio == pytest.approx(1.0) and low < 1.0 < high
