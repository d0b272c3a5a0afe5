"""
No false alarm from the stall watch: every tuned run of the learning suite and of the robustness map, watched by the
guard, reports no stall (the target: "no stall event in any tuned run of the learning suite and the robustness map").

The stall watch (:mod:`sb3_safe.common.guard.stall`) reports training that runs but no longer learns: every optimizer
step of ``stall_updates`` updates in a row skipped, a non-finite loss in each, or parameters unchanged over them at a
positive learning rate. Healthy training must never trip it. Runs (size ``full``):

- the learning suite's runs (:func:`benchmarks.learning.jobs`: every family, environment, variant and seed), each with
  a guard in ``"raise"`` mode added (the suite's variants have none), so that any event ends the run with its message;
- the robustness map's tuned runs: learning rate and entropy coefficient at their tuned values (factor 1), every seed
  and variant (:func:`benchmarks.robustness.jobs`); a variant with its own guard (the recommended stack, rollback mode)
  keeps it, the others get one in ``"raise"`` mode.

The guard in raise mode changes nothing in a run without a fault. Rows: the training row (:func:`benchmarks.training.
train`: ``guard_events``, ``guard_stalls``, ``error``) with ``source`` and ``added_guard``. ``no_stall.md``: runs,
events and stalls per source and variant, and every run with an event.
"""

from pathlib import Path
from typing import Any

from benchmarks import learning, reports, robustness, robustness_grid, suite, variants

SUITE = "no_stall"
#: What the runs come from: ("learning", learning job) or ("robustness", robustness job)
Job = tuple[str, tuple[Any, ...]]
#: The learning-rate factor of a tuned run of the robustness map
TUNED_FACTOR = 1


def jobs(size: str) -> list[Job]:
    """The tuned runs of the learning suite and the robustness map at ``size``, longest first within each."""
    tuned_ent_coef = {env_id: robustness_grid.tuned_settings(task)[1] for env_id, task in robustness_grid.TASKS.items()}
    tuned_map = [job for job in robustness.jobs(size) if job[2] == TUNED_FACTOR and job[3] == tuned_ent_coef[job[0]]]
    tuned_map.sort(key=lambda job: -robustness_grid.TASKS[job[0]].run_s)
    return [("learning", job) for job in learning.jobs(size)] + [("robustness", job) for job in tuned_map]


def job_key(job: Job) -> tuple[Any, ...]:
    """What identifies a run: its source and that suite's key (a rerun with the same ``--out`` skips those written)."""
    source, inner = job
    return (source, *(learning.job_key(inner) if source == "learning" else robustness.job_key(inner)))


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """:func:`job_key` of the job that wrote ``row``."""
    source = row["source"]
    return (source, *(learning.row_key(row) if source == "learning" else robustness.row_key(row)))


def run_job(job: Job) -> list[dict[str, Any]]:
    """Train one tuned run with a guard watching it: its own, or one in ``"raise"`` mode (any event ends the run)."""
    source, inner = job
    rows = learning.run_job(inner, guard="raise") if source == "learning" else robustness.run_job(inner, guard="raise")
    return [dict(source=source, added_guard=variants.VARIANTS[row["variant"]].guard is None, **row) for row in rows]


def budget(size: str) -> dict[str, Any]:
    """The runs recorded in the JSONL meta row (a resumed run must have the same)."""
    return dict(learning=learning.budget(size), robustness_lr_factor=TUNED_FACTOR, robustness=robustness.budget(size))


def report(out: Path) -> None:
    """``no_stall.md``: runs, guard events and stall events per source and variant; every run with an event."""
    meta, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    expected = len(jobs(meta.get("size", "full")))
    lines = reports.report_header(
        "No stall event in tuned runs: the learning suite and the robustness map's tuned cells, watched by the guard",
        meta,
        [
            f"{len(rows)} of {expected} runs (`benchmarks/no_stall.py`): every run of the learning suite, and the"
            f" robustness map's runs at the tuned learning rate (factor {TUNED_FACTOR}) and entropy coefficient;"
            " a variant without a guard runs with one in raise mode (any event ends the run), the recommended stack"
            " keeps its own (rollback mode).",
        ],
    )
    stalls = sum(row["guard_stalls"] or 0 for row in rows)
    events = sum(row["guard_events"] or 0 for row in rows)
    errors = [row for row in rows if row["error"]]
    lines += [
        f"**Stall events: {stalls}** in {len(rows)} runs; guard events of any kind: {events}; runs ended by an error:"
        f" {len(errors)}.",
        "",
        "## Per source and variant",
        "",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["source"], row["variant"]), []).append(row)
    lines += reports.table(
        ["source", "variant", "runs", "guard", "guard events", "stall events", "errors"],
        [
            [
                source,
                name,
                len(group),
                "added (raise)" if group[0]["added_guard"] else "its own (rollback)",
                sum(row["guard_events"] or 0 for row in group),
                sum(row["guard_stalls"] or 0 for row in group),
                sum(bool(row["error"]) for row in group),
            ]
            for (source, name), group in sorted(groups.items())
        ],
    )
    flagged = [row for row in rows if row["guard_events"] or row["error"]]
    if flagged:
        lines += ["", "## Runs with an event or an error", ""]
        lines += reports.table(
            ["source", "env", "variant", "seed", "events", "stalls", "error"],
            [
                [row[key] for key in ("source", "env", "variant", "seed", "guard_events", "guard_stalls", "error")]
                for row in flagged
            ],
        )
    reports.write_report(out / f"{SUITE}.md", lines)
