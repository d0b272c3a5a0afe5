"""
Running a suite: the process pool, JSONL I/O and the machine information every results file starts with.
"""

import json
import multiprocessing
import os
import platform
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.configs import ROOT

SIZES = ("tiny", "quick", "full")


def _init_worker() -> None:
    import torch as th

    # One torch thread per process: N processes on N cores without oversubscription
    th.set_num_threads(1)


def run_parallel(function: Callable[[Any], list[dict[str, Any]]], jobs: list[Any], n_jobs: int) -> Iterator[dict[str, Any]]:
    """Run ``function`` on each job in up to ``n_jobs`` spawned processes; yield its rows as they finish."""
    if n_jobs <= 1:
        _init_worker()
        for job in jobs:
            yield from function(job)
        return
    with multiprocessing.get_context("spawn").Pool(n_jobs, initializer=_init_worker) as pool:
        for rows in pool.imap_unordered(function, jobs, chunksize=1):
            yield from rows


def machine_info() -> dict[str, Any]:
    """CPU, core count, load average and library versions."""
    import gymnasium
    import stable_baselines3
    import torch as th

    import sb3_safe

    cpu = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    models = [line for line in cpuinfo.read_text().splitlines() if line.startswith("model name")] if cpuinfo.exists() else []
    if models:
        cpu = models[0].split(":", 1)[1].strip()
    return dict(
        commit=_git_commit(),
        cpu=cpu,
        cores=os.cpu_count(),
        load_avg=round(os.getloadavg()[0], 2),
        python=platform.python_version(),
        torch=th.__version__,
        sb3=stable_baselines3.__version__,
        gymnasium=gymnasium.__version__,
        sb3_safe=sb3_safe.__version__,
    )


def _git_commit() -> str | None:
    """The repository's commit (``+dirty`` with uncommitted changes under ``sb3_safe/``): the code measured."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "sb3_safe"], cwd=ROOT, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]], mode: str = "w") -> None:
    """Write (or append) rows, one JSON object per line, flushed as they come."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
            file.flush()


def read_jsonl(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The meta row (kind "meta", the last one if several) and the run rows of a suite's JSONL."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    metas = [row for row in rows if row.get("kind") == "meta"]
    return (metas[-1] if metas else {}), [row for row in rows if row.get("kind") != "meta"]


def run_suite(
    suite: str,
    out: Path,
    command: str,
    size: str,
    n_jobs: int,
    function: Callable[[Any], list[dict[str, Any]]],
    jobs: list[Any],
    budget: dict[str, Any],
    job_key: Callable[[Any], Hashable] | None = None,
    row_key: Callable[[dict[str, Any]], Hashable] | None = None,
    any_size: bool = False,
) -> None:
    """
    Run a suite's jobs, write ``<suite>.jsonl`` (meta row first, completed with the end state).

    With ``job_key`` and ``row_key`` the suite is resumable: if ``<suite>.jsonl`` already holds rows of the same
    suite, size and budget (an interrupted or finished run), the jobs whose key is among its rows' are skipped and
    the others' rows appended, so that a rerun with the same ``out`` continues where the last one stopped. The final
    meta row's ``wall_s`` is then the sum over the run's parts (an interrupted one counted up to its last row).

    :param job_key: what identifies a job
    :param row_key: the key of the job that wrote a row
    :param any_size: resume rows of any size and budget of the suite (one whose row keys say what was measured, and
        whose report says which rows count)
    """
    path = out / f"{suite}.jsonl"
    meta = dict(kind="meta", suite=suite, command=command, size=size, jobs=n_jobs, budget=budget, **machine_info())
    meta["started_at"] = time.time()
    earlier = _earlier_lines(path, suite, size, budget, any_size) if job_key is not None and row_key is not None else []
    if earlier:
        assert job_key is not None and row_key is not None
        rows = [line for line in earlier if line.get("kind") != "meta"]
        done_keys = {row_key(row) for row in rows}
        todo = [job for job in jobs if job_key(job) not in done_keys]
        walls, commits, cpus = _parts(earlier)
        meta.update(
            sessions=len(walls) + 1, commits=[*commits, meta["commit"]], cpus=[*cpus, meta["cpu"]], resumed_rows=len(rows)
        )
        print(f"[{suite}] resuming {path}: {len(jobs) - len(todo)} of {len(jobs)} jobs done, {len(todo)} to run", flush=True)
        # Rewritten without a line cut short by the interruption
        write_jsonl(path, [*earlier, meta])
    else:
        todo, walls = jobs, []
        write_jsonl(path, [meta])
    start = time.perf_counter()
    for done, row in enumerate(run_parallel(function, todo, n_jobs), start=1):
        # The machine per row: runs of one seed differ between CPUs (their float kernels), so a resumed map says
        # which rows came from which
        write_jsonl(path, [dict(kind="run", **row, cpu=meta["cpu"], finished_at=time.time())], mode="a")
        print(f"[{suite} row {done}] " + summary(row), flush=True)
    session_wall = time.perf_counter() - start
    meta.update(wall_s=sum(walls) + session_wall, session_wall_s=session_wall, load_avg_after=round(os.getloadavg()[0], 2))
    write_jsonl(path, [meta], mode="a")


def _earlier_lines(path: Path, suite: str, size: str, budget: dict[str, Any], any_size: bool = False) -> list[dict[str, Any]]:
    """
    The lines of an earlier run of the same suite, size and budget to resume (a last line cut short dropped);
    empty if there is none. Another size or budget in the file is refused rather than overwritten (unless
    ``any_size``: then only another suite is).
    """
    if not path.exists():
        return []
    texts = [text for text in path.read_text().splitlines() if text.strip()]
    lines = []
    for i, text in enumerate(texts):
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            if i < len(texts) - 1:
                raise
    if not lines:
        return []
    first = next((line for line in lines if line.get("kind") == "meta"), {})
    # Compared as JSON holds it (tuples are lists there)
    if any_size and first.get("suite") == suite:
        return lines
    if (first.get("suite"), first.get("size"), first.get("budget")) != (suite, size, json.loads(json.dumps(budget))):
        raise ValueError(
            f"{path} holds a run of suite {first.get('suite')!r} at size {first.get('size')!r} with another grid or"
            f" budget than this {size!r} run: a rerun continues only the same grid; move that file away or pass"
            " another --out"
        )
    return lines


def _parts(lines: list[dict[str, Any]]) -> tuple[list[float], list[str | None], list[str | None]]:
    """
    Wall seconds, commit and CPU of each part of a resumed run in a JSONL: a part starts with a meta row without
    ``wall_s`` and ends with one that has it; an interrupted part ends at its last row.
    """
    walls: list[float] = []
    commits: list[str | None] = []
    cpus: list[str | None] = []
    started = None
    for line in lines:
        if line.get("kind") == "meta" and "wall_s" not in line:
            walls.append(0.0)
            commits.append(line.get("commit"))
            cpus.append(line.get("cpu"))
            started = line.get("started_at")
        elif line.get("kind") == "meta" and walls:
            walls[-1] = line.get("session_wall_s", line["wall_s"])
        elif walls and started is not None and "finished_at" in line:
            walls[-1] = line["finished_at"] - started
    return walls, commits, cpus


def summary(row: dict[str, Any]) -> str:
    """A row's identifying keys and main results, on one line (the progress printed as rows come)."""
    identity = ("config", "env", "variant", "algorithm", "use_sde", "arm", "model", "seed", "pair")
    keys = (*identity, "final_return", "max_abs_difference", "ratio", "steps_per_s", "wall_s", "error")
    return " ".join(
        f"{key}={row[key]:.4g}" if isinstance(row[key], float) else f"{key}={row[key]}" for key in keys if key in row
    )
