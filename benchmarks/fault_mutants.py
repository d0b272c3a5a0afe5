"""
Does the randomized fault injection (:mod:`benchmarks.faults`) find what it was built to find? The claim "N random
fault scenarios, 0 violations" means something only if the same scenarios and invariants report the defects they exist
for. This suite re-introduces each defect the guard and the adaptive learning rate had before they became one
supervisor (:data:`DEFECTS`, each a named source patch of sb3-safe) and the mutation benchmark's mutants
(:mod:`benchmarks.mutation`'s operators) of the supervisor, the guard, the adaptive learning rate and the schedules
(:data:`MODULES`), and runs the randomized suite alone against each, in a forked process that imports the mutated
sb3-safe (the checkout is never written to).

- a defect runs the test suite's fixed scenarios (``faults.TEST_SEEDS``) all, and the full set's (seeds 0-319) up to
  the first that reports a violation: it is *detected* when one does;
- a module mutant runs the fixed scenarios up to the first violation (*killed*; *survived* when none reports one;
  an exception outside the scenarios or a hang past the timeout kills it too), the scenarios that killed most so far
  first.

Usage: ``python -m benchmarks run faults --mutants [--size tiny|quick|full] [--modules MODULE ...]`` (tiny: the
defects alone; quick: and every tenth module mutant; full: every module mutant; resumable) writes
``faults_mutants.jsonl`` and ``faults_mutants.md``. ``python -m benchmarks.fault_mutants DEFECT [SEED ...]`` runs one
defect (or a mutant key ``module:operator:occurrence``) against the seeds given and prints each scenario's violations.
"""

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import mutation, reports, suite
from benchmarks.configs import ROOT


@dataclass(frozen=True)
class Defect:
    """A defect of the supervisor as a source patch: ``code`` in ``module`` replaced by ``mutated``."""

    module: str
    code: str
    mutated: str
    #: what goes wrong, as the issue and the changelog said it
    what: str
    #: the hand-written test that guards it
    test: str
    #: why no run of the code as it is can reach it (it needs another defect first), if none can
    unreachable: str | None = None


_SUPERVISOR, _ADAPTIVE = "sb3_safe/common/supervisor.py", "sb3_safe/common/adaptive_lr.py"
_JUDGES_THEN_GUARDS = """            for judge in self.judges:
                if self.stopping or self.restored:
                    judge.discard_update()
                else:
                    judge.judge_update(at_end)
            for guard in self.guards:
                guard.judge_kept_update(at_end)
"""
_GUARDS_THEN_JUDGES = """            for guard in self.guards:
                guard.judge_kept_update(at_end)
            for judge in self.judges:
                if self.stopping or self.restored:
                    judge.discard_update()
                else:
                    judge.judge_update(at_end)
"""
#: The defects fixed when the guard and the adaptive lr became one supervisor (the changelog lists them), each re-introduced
DEFECTS: dict[str, Defect] = {
    "judge_after_restore": Defect(
        _SUPERVISOR,
        "                    judge.discard_update()\n",
        "                    judge.judge_update(at_end)\n",
        "after a guard restored a state the adaptive lr judges the update anyway: an A2C-style redo undoes the"
        " rollback and sets the rate back up; a stop in the last update is redone after the model was saved",
        "test_a_rollback_is_not_undone_by_a_redo_of_the_update_it_replaced",
    ),
    "healthy_copy_before_redo": Defect(
        _SUPERVISOR,
        _JUDGES_THEN_GUARDS,
        _GUARDS_THEN_JUDGES,
        "the guards take their healthy copy before the adaptive lr's redo: a rollback restores an undone update, a"
        " stop keeps another model than the last kept one",
        "test_a_rollback_after_a_redo_restores_the_kept_update_and_the_schedules_rate",
    ),
    "redo_after_a_fault_in_the_redo": Defect(
        _ADAPTIVE,
        "                return\n            kl = self._measure(pending)",
        "                pass\n            kl = self._measure(pending)",
        "a fault in a redone step does not end the redos: the next redo undoes the guard's rollback or stop",
        "test_a_rollback_is_not_undone_by_a_redo_of_the_update_it_replaced",
    ),
    "rollback_keeps_the_optimizers_rate": Defect(
        "sb3_safe/common/guard/response.py",
        "        scale_learning_rate(self.model, (optimizer for _, optimizer in self.watched.optimizers), factor)\n",
        "        scale_learning_rate(self.model, (), factor)\n"
        "        for (_, optimizer), groups in zip(self.watched.optimizers, healthy.param_groups):\n"
        "            for group, saved in zip(optimizer.param_groups, groups):\n"
        "                group['lr'] = saved['lr'] * factor\n",
        "a rollback writes back the optimizer's rate of the healthy state (from before a redo's cut, or an earlier"
        " point of the schedule) times lr_decay, not the schedule's",
        "test_a_rollback_after_a_redo_restores_the_kept_update_and_the_schedules_rate",
    ),
    "redo_at_the_lowest_rate": Defect(
        _ADAPTIVE,
        "                break  # at the lowest learning rate already",
        "                pass  # at the lowest learning rate already",
        "a redo at the lower bound trains again at the same rate, max_redos times",
        "test_no_redo_at_the_lowest_learning_rate",
    ),
    "redo_leaves_training_mode": Defect(
        _ADAPTIVE,
        "def _set_up_rollout(model: OnPolicyAlgorithm) -> None:\n",
        "def _set_up_rollout(model: OnPolicyAlgorithm) -> None:\n    return\n",
        "a redo leaves the next rollout in training mode, with gSDE noise of the discarded update",
        "test_a_redo_leaves_the_next_rollout_in_evaluation_mode_with_gsde_noise_of_the_kept_policy",
    ),
    "redo_divides_by_a_zero_rate": Defect(
        _ADAPTIVE,
        "            if not self.targets.keep_redo_rate and learning_rate > 0.0:",
        "            if not self.targets.keep_redo_rate:",
        "an A2C-style redo at a schedule's end divides by its rate of 0 (ZeroDivisionError)",
        "test_an_a2c_redo_after_a_rollback_at_the_end_of_a_decayed_schedule_does_not_divide_by_zero",
        unreachable=(
            "a redo needs a cut below 1, which a rate of 0 never gets (a scale moves nothing there), and runs at the"
            " same progress, so the rate after it is positive; the ZeroDivisionError came from judging the KL against"
            " a rollback's state at the schedule's end, which judge_after_restore re-introduces (its hand-written"
            " test passes with this patch alone)"
        ),
    ),
    "option_builds_a_callback_per_learn": Defect(
        _ADAPTIVE,
        "    if kept is None or kept[0] != settings:",
        "    if True:",
        "SafeA2C(adaptive_lr=...) builds a new callback per learn(): a continued run measures its first updates again",
        "test_adaptive_lr_option_keeps_one_callback_across_learn_calls",
    ),
    "bounds_folded_into_the_scale": Defect(
        _ADAPTIVE,
        "        return scale * (max(moved, 1.0) if factor > 1.0 else min(moved, 1.0))",
        "        return scale * moved",
        "the bounds' clamp is folded into the saved scale: a decision on a decayed schedule raises it (28.6 saved"
        " where the decisions chose 6.6)",
        "test_a_decaying_schedule_runs_inside_the_bounds_and_the_saved_scale_is_what_the_decisions_chose",
    ),
    "rate_below_the_lower_bound": Defect(
        "sb3_safe/common/schedules.py",
        "            learning_rate = min(max(learning_rate, self.bounds[0]), self.bounds[1])",
        "            learning_rate = min(learning_rate, self.bounds[1])",
        "updates run below the adaptive lr's lower bound",
        "test_a_decaying_schedule_runs_inside_the_bounds_and_the_saved_scale_is_what_the_decisions_chose",
    ),
    "schedules_read_past_the_end": Defect(
        _SUPERVISOR,
        '        if not total or model.num_timesteps <= total or getattr(model, "reads_schedules_from_zero", False):',
        "        if True:",
        "a last rollout past the budget reads linear schedules below progress 0: a negative rate and clip range",
        "test_no_update_runs_at_a_negative_learning_rate_or_clip_range",
    ),
    "redo_keeps_the_counters": Defect(
        "sb3_safe/common/guard/snapshot.py",
        'COUNTERS = ("_n_updates",)',
        "COUNTERS = ()",
        "a redo or a rollback keeps the update counter of the undone update: n_updates counts it twice",
        "test_a_redo_restores_the_update_and_skip_counters",
    ),
    "two_messages_when_raising": Defect(
        "sb3_safe/common/guard/report.py",
        '    if event.action != "raise":  # raised, the exception carries the message: once',
        "    if True:",
        "raise mode warns and raises: two messages for one fault",
        "test_rewards_times_1e30_stall_is_reported_once_within_10_updates_naming_the_cause",
    ),
    "no_stall_event": Defect(
        "sb3_safe/common/guard/stall.py",
        "        stalled = self.patience is not None and failing >= self.patience",
        "        stalled = False",
        "updates that all skip their steps (rewards x 1e30) are never reported: the run stalls silently",
        "test_rewards_times_1e30_stall_is_reported_once_within_10_updates_naming_the_cause",
    ),
}

#: The modules whose mutation-benchmark mutants run against the randomized suite
MODULES = (
    _SUPERVISOR,
    _ADAPTIVE,
    "sb3_safe/common/schedules.py",
    "sb3_safe/common/guard/response.py",
    "sb3_safe/common/guard/snapshot.py",
    "sb3_safe/common/guard/stall.py",
    "sb3_safe/common/guard/cadence.py",
    "sb3_safe/common/guard/report.py",
    "sb3_safe/common/guard/locate.py",
    "sb3_safe/common/guard/watch.py",
)
_WHY_RESTORED = "`restored` is read only after rollout_end(), which sets it to False first (after_update and judge_update)"
_WHY_POSITIVE_RATE = (
    "the rate after a redo is positive (a redo needs a cut below 1, which a rate of 0 never gets, and runs at the same"
    " progress): `learning_rate > 0.0`, `>= 0.0` and `> -1.0` agree (see the unreachable defect)"
)
_WHY_TOTAL = "SB3's BaseAlgorithm sets `_total_timesteps` (0) in its constructor: getattr's default is never returned"
#: Module mutants that change no behaviour, by row key (``module:operator:occurrence@source``), with why (the
#: mutation benchmark's :data:`~benchmarks.mutation.EQUIVALENT` lists the first four at an earlier source)
EQUIVALENT: dict[str, str] = {
    f"{_SUPERVISOR}:core/RemoveDecorator:0@cf3f6345893e": (
        "`Guard` is a typing Protocol (not runtime-checkable, never in isinstance): its `stopping` member is read only"
        " on the guards, whose own `stopping` is a property; the Protocol's body never runs"
    ),
    f"{_SUPERVISOR}:core/ReplaceFalseWithTrue:0@cf3f6345893e": _WHY_RESTORED,
    f"{_SUPERVISOR}:core/ReplaceFalseWithTrue:1@cf3f6345893e": _WHY_RESTORED,
    f"{_SUPERVISOR}:core/ReplaceContinueWithBreak:0@cf3f6345893e": (
        "in every algorithm SB3, sb3-contrib and sb3-safe ship the schedules read are callable but `clip_range_vf`"
        " (PPO's family, the last name looped over), so no callable schedule follows a skipped one"
    ),
    f"{_SUPERVISOR}:core/NumberReplacer:0@cf3f6345893e": _WHY_TOTAL,
    f"{_SUPERVISOR}:core/NumberReplacer:1@cf3f6345893e": _WHY_TOTAL,
    f"{_ADAPTIVE}:core/ReplaceComparisonOperator_Gt_GtE:2@c5097dd41b82": _WHY_POSITIVE_RATE,
    f"{_ADAPTIVE}:core/NumberReplacer:97@c5097dd41b82": _WHY_POSITIVE_RATE,
    f"{_ADAPTIVE}:core/NumberReplacer:57@c5097dd41b82": (
        "the initial `_factor` is a dead store: judge_update sets it to 1 before anything multiplies or logs it"
    ),
    f"{_ADAPTIVE}:core/ReplaceComparisonOperator_LtE_Lt:6@c5097dd41b82": (
        "where the smallest factor is exactly 1 the mutant goes on to return `min(factors)`, which is 1.0, the value"
        " the original returns there"
    ),
    f"{_ADAPTIVE}:core/ReplaceBreakWithContinue:1@c5097dd41b82": (
        "at the lowest rate the loop's next passes see the same KL and scale, so compute the same cut >= 1 and do"
        " nothing: `continue` ends the redos where `break` does, after at most max_redos idle passes"
    ),
}
#: The full set's seeds (``python -m benchmarks run faults``, size full)
FULL_SEEDS = tuple(range(320))
#: Each scenario's share of a mutant's timeout (seconds, on top of a fixed minute)
_SECONDS_PER_SCENARIO = 15.0
#: The unmutated code's violations, by the sources they ran (see :func:`baseline_of`)
BASELINE_CACHE = ROOT / "build" / "faults_mutants_baseline.json"


# ----- a mutated sb3-safe in a forked process -----


def defect_source(name: str) -> tuple[str, str]:
    """The module a defect patches and its patched source."""
    defect = DEFECTS[name]
    source = (ROOT / defect.module).read_text()
    assert source.count(defect.code) == 1, f"{name}: the code it patches changed"
    return defect.module, source.replace(defect.code, defect.mutated)


class _MutatedSource(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports one module of sb3-safe from a given source (the rest from the checkout)."""

    def __init__(self, module: str, source: str) -> None:
        self.name = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        self.source = source

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        original = importlib.machinery.PathFinder.find_spec(fullname, path)
        assert original is not None and original.origin is not None
        spec = importlib.util.spec_from_loader(fullname, self, origin=original.origin)
        assert spec is not None
        spec.submodule_search_locations = original.submodule_search_locations
        spec.has_location = True
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.source, module.__spec__.origin, "exec"), module.__dict__)  # type: ignore[union-attr]


def import_mutated(module: str, source: str) -> ModuleType:
    """
    In a forked child: forget sb3-safe and the suite, import them again with ``module`` built from ``source``.

    :return: :mod:`benchmarks.faults`, importing the mutated sb3-safe
    """
    for name in [name for name in sys.modules if name.split(".")[0] == "sb3_safe" or name == "benchmarks.faults"]:
        del sys.modules[name]
    sys.meta_path.insert(0, _MutatedSource(module, source))
    import sb3_safe  # noqa: F401  (the package first: the mutated module imports its siblings from it)

    importlib.import_module(module.removesuffix(".py").replace("/", "."))
    return importlib.import_module("benchmarks.faults")


Violations = dict[str, list[str]]


def violations_unlike(
    faults: ModuleType, seeds: Sequence[int], stop_at_first: bool, baseline: dict[int, Violations]
) -> Iterator[dict[str, Any]]:
    """
    Run the scenarios of ``seeds``; yield each that reports a violation the unmutated code does not (``baseline``, by
    seed; none where a seed is missing): its seed, the invariant, the violation's text. (A violation of the unmutated
    code that a mutant makes go away is no report of the mutant.)
    """
    for seed in seeds:
        outcome = faults.run(faults.Scenario.draw(seed))
        found = {name: texts for name, texts in faults.check(outcome).items() if texts}
        before = baseline.get(seed, {})
        new = [(name, text) for name in faults.INVARIANTS for text in found.get(name, []) if text not in before.get(name, [])]
        if new:
            yield dict(seed=seed, invariant=new[0][0], text=new[0][1], violations=found)
            if stop_at_first:
                return


def in_child(
    module: str, source: str, seeds: Sequence[int], stop_at_first: bool, baseline: dict[int, Violations] | None = None
) -> dict[str, Any]:
    """
    Run ``seeds`` against sb3-safe with ``module`` built from ``source``, in a forked child (its own process group,
    killed past the timeout): ``violating`` (the scenarios whose violations differ from ``baseline``'s, in order),
    ``error`` (an exception outside the scenarios, e.g. at import), ``timeout``, ``wall_s``.
    """
    read, write = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        status = 0
        try:
            os.setpgid(0, 0)
            result: dict[str, Any] = dict(violating=[], error=None)
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
                try:
                    faults = import_mutated(module, source)
                    for found in violations_unlike(faults, seeds, stop_at_first, baseline or {}):
                        result["violating"].append(found)
                except Exception as error:  # a mutant that breaks the import or the harness
                    result["error"] = f"{type(error).__name__}: {error}"[:300]
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(result))
        except BaseException:  # (the child never returns: its status says it failed)
            status = 3
        finally:
            os._exit(status)
    os.close(write)
    deadline = start + 60.0 + _SECONDS_PER_SCENARIO * len(seeds)
    chunks: list[bytes] = []
    os.set_blocking(read, False)
    timed_out = False
    while True:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read, 1 << 16):
                chunks.append(chunk)
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            timed_out = True
            break
        time.sleep(0.05)
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
    os.close(read)
    text = b"".join(chunks).decode()
    result = json.loads(text) if text and not timed_out else dict(violating=[], error=None if timed_out else "no result")
    return dict(result, timeout=timed_out, wall_s=round(time.perf_counter() - start, 2))


def baseline_of(seeds: Sequence[int], cache: Path | None = None) -> dict[int, Violations]:
    """
    The violations of the unmutated code in the scenarios of ``seeds`` (a defect the suite finds in it is no mutant's;
    :file:`faults_mutants.md` lists them), run in a forked child like the mutants; cached in ``cache`` by the
    sources it ran.
    """
    paths = [Path(__file__).with_name("faults.py"), *(ROOT / module for module in MODULES)]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in paths)).hexdigest()[:12]
    key = f"{digest}:{len(seeds)}:{min(seeds)}-{max(seeds)}"
    known = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    if key not in known:
        result = in_child(_SUPERVISOR, (ROOT / _SUPERVISOR).read_text(), seeds, stop_at_first=False)
        assert result["error"] is None and not result["timeout"], f"the unmutated code's run failed: {result}"
        known[key] = {str(found["seed"]): found["violations"] for found in result["violating"]}
        if cache is not None:
            cache.write_text(json.dumps(known))
    return {int(seed): found for seed, found in known[key].items()}


# ----- the suite -----

#: A job: ("defect", name, "ci" | "full") or ("module", module, operator, occurrence, line)
Job = tuple[Any, ...]
#: Scenarios (seeds) by how many module mutants each killed so far in this process: the likeliest first
_KILLS: dict[int, int] = {}


def jobs(size: str, modules: list[str] | None = None) -> list[Job]:
    """The defects against both scenario sets; with ``quick`` / ``full`` every tenth / every module mutant too."""
    selected: list[Job] = [("defect", name, which) for name in DEFECTS for which in ("ci", "full")]
    stride = {"tiny": 0, "quick": 10, "full": 1}[size]
    chosen = [m for m in MODULES if not modules or any(m == name or m.endswith("/" + name) for name in modules)]
    for module in chosen if stride else []:
        every = mutation.module_mutants(module)
        # Every tenth first (the quick sample), then the next tenth...: a run cut short has measured a spread sample
        order = sorted(range(0, len(every), stride), key=lambda index: (index % 10, index))
        selected += [("module", *every[index]) for index in order]
    return selected


def job_key(job: Job) -> str:
    if job[0] == "defect":
        return f"defect:{job[1]}:{job[2]}@{mutation.source_hash(DEFECTS[job[1]].module)}"
    return f"{mutation.mutant_key(*job[1:4])}@{mutation.source_hash(job[1])}"


def row_key(row: dict[str, Any]) -> str:
    if row["mutant"] == "defect":
        return f"defect:{row['name']}:{row['scenarios']}@{row['source']}"
    return f"{mutation.mutant_key(row['module'], row['operator'], row['occurrence'])}@{row['source']}"


#: Rows of every size in one JSONL, keyed by the source they mutated
ANY_SIZE = True
#: One mutant at a time (each forks its own process)
MAX_JOBS = 1


def budget(size: str) -> dict[str, Any]:
    from benchmarks import faults

    return dict(defects=sorted(DEFECTS), ci_seeds=len(faults.TEST_SEEDS), full_seeds=len(FULL_SEEDS))


def _baseline(seeds: Sequence[int]) -> dict[int, Violations]:
    BASELINE_CACHE.parent.mkdir(parents=True, exist_ok=True)
    return baseline_of(seeds, BASELINE_CACHE)


def run_job(job: Job) -> list[dict[str, Any]]:
    """Run one defect or module mutant against the randomized suite: its row."""
    from benchmarks import faults

    if job[0] == "defect":
        _, name, which = job
        module, source = defect_source(name)
        seeds = faults.TEST_SEEDS if which == "ci" else FULL_SEEDS
        result = in_child(module, source, seeds, which == "full", _baseline(seeds))
        row = dict(mutant="defect", name=name, scenarios=which, module=module, source=mutation.source_hash(module))
    else:
        _, module, operator, occurrence, line = job
        row = dict(mutant="module", module=module, operator=operator, occurrence=occurrence, line=line,
                   source=mutation.source_hash(module))  # fmt: skip
        mutated = mutation.mutated_source(module, operator, occurrence)
        if mutated is None:
            return [dict(row, outcome="no mutation", wall_s=0.0)]
        seeds = sorted(faults.TEST_SEEDS, key=lambda seed: -_KILLS.get(seed, 0))
        result = in_child(module, mutated, seeds, True, _baseline(faults.TEST_SEEDS))
        for found in result["violating"]:
            _KILLS[found["seed"]] = _KILLS.get(found["seed"], 0) + 1
    detected = bool(result["violating"]) or result["error"] is not None or result["timeout"]
    return [dict(row, outcome="killed" if detected else "survived", seeds=len(seeds), **result)]


def _equivalent(row: dict[str, Any]) -> str | None:
    """Why a module mutant changes no behaviour (this suite's list, or the mutation benchmark's), if it does not."""
    key = f"{mutation.mutant_key(row['module'], row['operator'], row['occurrence'])}@{row['source']}"
    return EQUIVALENT.get(key) or mutation.EQUIVALENT.get(key)


def _whole_suite(module: str) -> str:
    """The whole test suite's score of ``module`` in the mutation benchmark's results (``mutation.md``)."""
    path = reports.RESULTS / "mutation.md"
    for line in path.read_text().splitlines() if path.exists() else []:
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 8 and cells[1] == f"`{module}`":
            return f"{cells[5]} / {int(cells[4]) - int(cells[7])} ({cells[8]})"
    return "not measured"


def report(out: Path) -> None:
    """``faults_mutants.md``: each defect's detection, each module's kill rate, the survivors."""
    from benchmarks import faults

    meta, rows = suite.read_jsonl(out / "faults_mutants.jsonl")
    current: dict[str, dict[str, Any]] = {}
    for row in rows:  # a later row of the same key replaces an earlier one; rows of changed sources are stale
        module = row["module"]
        if row["source"] == mutation.source_hash(module):
            current[row_key(row)] = row
    defects = {(row["name"], row["scenarios"]): row for row in current.values() if row["mutant"] == "defect"}
    detected_ci = sum(defects.get((name, "ci"), {}).get("outcome") == "killed" for name in DEFECTS)
    detected_full = sum(defects.get((name, "full"), {}).get("outcome") == "killed" for name in DEFECTS)
    reachable = sum(defect.unreachable is None for defect in DEFECTS.values())
    module_rows = [row for row in current.values() if row["mutant"] == "module" and row["outcome"] != "no mutation"]
    per_module, survivors, figures = [], [], []
    for module in MODULES:
        mine = [row for row in module_rows if row["module"] == module]
        if not mine:
            continue
        equivalent = [row for row in mine if _equivalent(row)]
        scored = [row for row in mine if not _equivalent(row)]
        killed = sum(row["outcome"] == "killed" for row in scored)
        total = len(mutation.module_mutants(module))
        over = "every mutant" if len(mine) >= total else f"{len(mine)} of {total}"
        score = f"{100 * killed / max(len(scored), 1):.1f} %"
        per_module.append([f"`{module}`", over, len(scored), killed, len(equivalent), score, _whole_suite(module)])
        survivors += [row for row in scored if row["outcome"] != "killed"]
        if module in (_SUPERVISOR, _ADAPTIVE):
            figures.append(f"{score} of `{Path(module).name}`'s module mutants ({killed} of {len(scored)}, {over} run)")
    summary = (
        f"**The randomized suite alone detects {detected_ci} of the {reachable} reachable supervisor defects re-injected"
        f" with its {len(faults.TEST_SEEDS)} fixed scenarios ({detected_full} of {reachable} with the full"
        f" {len(FULL_SEEDS)}) and kills " + " and ".join(figures) + ".** Equivalent mutants are listed with why, left"
        " out of the score."
    )
    lines = reports.report_header(
        "Does the randomized fault injection find the defects it was built for?",
        meta,
        [
            f"Defects: the {len(DEFECTS)} defects fixed when the guard and the adaptive lr became one supervisor"
            " (`benchmarks/fault_mutants.py`, `DEFECTS`), each re-introduced as a source patch in a forked process;"
            " the randomized suite alone"
            f" (`benchmarks/faults.py`) runs against each: the test suite's {len(faults.TEST_SEEDS)} fixed scenarios"
            f" all (seeds {faults.TEST_SEEDS[0]}-{faults.TEST_SEEDS[-1]}, `tests/test_faults.py`), the full set's"
            f" {len(FULL_SEEDS)} up to the first violation.",
            "Module mutants: the mutation benchmark's operators (`benchmarks/mutation.py`) on the modules listed, each"
            " run against the fixed scenarios up to the first violation (the scenarios that killed most first);"
            " killed: a scenario violates an invariant (or the harness fails, or hangs past the timeout).",
            f"Detected: {detected_ci}/{reachable} reachable defects by the fixed scenarios, {detected_full}/{reachable}"
            f" by the full set ({len(DEFECTS) - reachable} of the {len(DEFECTS)} cannot be reached alone, see below).",
        ],
        summary=summary,
    )
    lines += ["## Defects", ""]
    table = []
    for name, defect in DEFECTS.items():
        ci, full = defects.get((name, "ci")), defects.get((name, "full"))
        first = (ci or {}).get("violating") or (full or {}).get("violating") or []
        found = f"seed {first[0]['seed']}: ({first[0]['invariant']}) {first[0]['text']}" if first else "none"
        if ci is not None and ci.get("error"):
            found = f"error: {ci['error']}"
        table.append([
            f"`{name}`",
            defect.what,
            "not run" if ci is None else f"{len(ci['violating'])} / {ci['seeds']}",
            "not run" if full is None else (f"seed {full['violating'][0]['seed']}" if full["violating"] else "none"),
            found.replace("|", "/"),
        ])  # fmt: skip
    lines += reports.table(
        ["defect", "what goes wrong", "fixed scenarios violating", "full set: first violating", "first violation"],
        table,
    )
    unreachable = [(name, defect.unreachable) for name, defect in DEFECTS.items() if defect.unreachable]
    if unreachable:
        lines += ["", "Unreachable alone (equivalent in the code as it is):", ""]
        lines += [f"- `{name}`: {why}." for name, why in unreachable]
    lines += ["", "## Module mutants: the randomized suite alone against the whole test suite", ""]
    lines += reports.table(
        ["module", "mutants run", "scored", "killed", "equivalent", "randomized suite",
         "whole suite (mutation.md): killed / scored (score)"],
        per_module,
    )  # fmt: skip
    equivalent_rows = [row for row in module_rows if _equivalent(row)]
    if equivalent_rows:
        lines += ["", "## Equivalent module mutants (left out of the score)", ""]
        for row in equivalent_rows:
            change = mutation.diff(row["module"], row["operator"], row["occurrence"]).replace("\n", " / ")
            lines.append(f"- `{row['module']}` line {row['line']}: `{change}`: {_equivalent(row)}")
    if survivors:
        lines += ["", "## Module mutants the randomized suite does not kill", ""]
        for row in survivors:
            change = mutation.diff(row["module"], row["operator"], row["occurrence"]).replace("\n", " / ")
            lines.append(f"- `{row['module']}` line {row['line']} ({row['operator']}): `{change}`")
    reports.write_report(out / "faults_mutants.md", lines)


def main(argv: list[str]) -> None:
    """Run one defect (or module mutant key) against the seeds given and print the violations found."""
    from benchmarks import faults

    target, seeds = argv[0], [int(seed) for seed in argv[1:]] or list(faults.TEST_SEEDS)
    if target in DEFECTS:
        module, source = defect_source(target)
    else:
        module, operator, occurrence = target.split(":")
        source = mutation.mutated_source(module, operator, int(occurrence)) or ""
    result = in_child(module, source, seeds, False, baseline_of(seeds))
    for found in result["violating"]:
        print(f"seed {found['seed']}: ({found['invariant']}) {found['text']}")
    print(f"{len(result['violating'])} of {len(seeds)} scenarios violate; error: {result['error']};"
          f" timeout: {result['timeout']}; {result['wall_s']:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
