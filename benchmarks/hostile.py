"""
Generated hostile files: ``sb3-safe doctor`` and :func:`sb3_safe.load` on files no one wrote by hand, each checked for
the promises of untrusted input: ``python -m benchmarks run hostile [--size tiny|quick|full]``.

Each file is drawn from a seed by :func:`benchmarks.hostile_files.hostile_file` (its module says the grammar). For
every file (:func:`check_file`), in one long-lived process:

- **no code ran**: an audit hook records process starts and every event that names the canary; the canary must not
  exist;
- **bounded cost**: the peak resident memory (``VmHWM``, reset before each reader) grows by at most
  :data:`MAX_PEAK_MIB` and each reader takes at most :data:`MAX_SECONDS`;
- **run folders**: a ``config.yml`` / ``args.yml`` is read as ``sb3-safe enjoy`` reads it: refused in one line or
  read as data (no doctor verdict to compare);
- **one verdict**: doctor passes the file (exit 0, or exit 1 for its weights only) if and only if ``sb3_safe.load``
  loads it; a refused file is refused by both for the same cause (doctor's one-line error, or its first finding,
  is in load's message), and load raises nothing but :class:`~sb3_safe.RefusedFileError`. That holds for a file
  read in full from which SB3 cannot build the model too (tensors that do not fit the policy its data describes):
  doctor builds the model as load does (:mod:`sb3_safe.loading.building`), so any disagreement is a violation.

Rows: one per file (seed, kind, size, doctor's status and cause, load's outcome, seconds and peak of each, the
violations). ``hostile.md``: the counts of each violation, the outcomes by kind, the slowest and the largest file.
"""

import collections
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import suite
from benchmarks.hostile_files import HostileFile, hostile_file

SUITE = "hostile"
#: The kind of a row that reads a file over the time bound again (:func:`remeasure`)
REMEASURE = "remeasure"
#: Files per size
FILES = {"tiny": 100, "quick": 1_000, "full": 10_000}
#: Files per job (one job: consecutive seeds in one process)
FILES_PER_JOB = 100
#: Bounds every file must respect, per reader
MAX_PEAK_MIB = 1536
MAX_SECONDS = 10.0
#: Audit events that start another program
_PROCESS_EVENTS = frozenset({"os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.fork", "pty.spawn"})

Job = tuple[int, int]


class _Audit:
    """The audit events of this process that start a program or name the canary, while watching."""

    def __init__(self) -> None:
        self.canary: str | None = None
        self.events: list[str] = []
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.canary is None:
            return
        # "compile" names the canary when a reader parses a string that holds it (ast.parse of normalize): not a run
        if event in _PROCESS_EVENTS or (event != "compile" and self.canary in repr(args)[:10_000]):
            self.events.append(event)


def _peak_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))


def _resident_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


@contextlib.contextmanager
def _measured(into: dict[str, Any], name: str) -> Iterator[None]:
    """Time and peak memory growth (MiB) of the block, into ``into[name + "_seconds" / "_peak_mib"]``."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current resident size
    before, start = _resident_kib(), time.perf_counter()
    try:
        yield
    finally:
        into[f"{name}_seconds"] = time.perf_counter() - start
        into[f"{name}_peak_mib"] = (_peak_kib() - before) / 1024


def check_file(file: HostileFile, audit: _Audit, canary: Path) -> dict[str, Any]:
    """Doctor and load on one file: their outcomes, costs and the promises they break (``violations``)."""
    import stable_baselines3
    from stable_baselines3.common.vec_env import DummyVecEnv

    import sb3_safe
    from sb3_safe.doctor import diagnose, run_doctor

    if file.reader == "run folder":
        return _check_run_folder(file, audit, canary)
    row: dict[str, Any] = {"file_kind": file.kind, "bytes": file.path.stat().st_size}
    audit.canary, audit.events = str(canary), []
    err = io.StringIO()
    with _measured(row, "doctor"):
        status = run_doctor(str(file.path), out=io.StringIO(), err=err)
    row["doctor_status"] = status
    doctor_cause = err.getvalue().strip().removeprefix("sb3-safe doctor: error: ").removeprefix(f"{file.path}: ")
    unsafe: list[str] = []
    if status == 1:
        report = diagnose(file.path)
        unsafe = [finding.target for finding in report.unsafe]
        doctor_cause = unsafe[0] if unsafe else "weights"
    row["doctor_cause"] = doctor_cause
    with _measured(row, "load"):
        try:
            if file.reader == "model":
                sb3_safe.load(stable_baselines3.PPO, file.path)
            else:
                sb3_safe.load_vec_normalize(file.path, DummyVecEnv([lambda: __import__("gymnasium").make("Pendulum-v1")]))
            row["load"] = "loaded"
        except sb3_safe.RefusedFileError as error:
            row["load"], row["load_cause"] = "refused", str(error)
            if file.reader == "statistics" and "Buffer, not VecNormalize statistics" in str(error):
                # A replay buffer, which doctor passes too: read by its own loader
                from stable_baselines3 import DQN

                sb3_safe.load_replay_buffer(DQN("MlpPolicy", "CartPole-v1", buffer_size=10), file.path)
                row["load"] = "loaded"
        except BaseException as error:
            row["load"], row["load_cause"] = f"raised {type(error).__name__}", str(error)[:300]
    audit.canary = None
    violations = []
    if audit.events or canary.exists():
        violations.append(f"code ran: {audit.events} {canary.exists()}")
        canary.unlink(missing_ok=True)
    for reader in ("doctor", "load"):
        if row[f"{reader}_peak_mib"] > MAX_PEAK_MIB or row[f"{reader}_seconds"] > MAX_SECONDS:
            violations.append(f"{reader} over budget")
    doctor_passes = status == 0 or (status == 1 and not unsafe)
    if row["load"].startswith("raised"):
        violations.append(f"load {row['load']}")
    elif doctor_passes != (row["load"] == "loaded"):
        violations.append("verdicts disagree")
    elif row["load"] == "refused" and doctor_cause not in row["load_cause"]:
        violations.append("causes disagree")
    row["violations"] = violations
    return stored(row, str(file.path.parent))


#: Characters of a cause kept in a row (the comparison uses the whole)
_STORED_CAUSE = 160


def stored(row: dict[str, Any], folder: str) -> dict[str, Any]:
    """
    The row as written: causes without the temporary folder's path, cut to :data:`_STORED_CAUSE` characters; load's
    only where it says more than doctor's (a violation); times to the millisecond.
    """
    if not row["violations"]:
        row.pop("load_cause", None)
    for key in ("doctor_cause", "load_cause"):
        if key in row:
            row[key] = row[key].replace(f"{folder}/", "")[:_STORED_CAUSE]
    for key in ("doctor_seconds", "load_seconds", "doctor_peak_mib", "load_peak_mib"):
        row[key] = round(row[key], 3)
    return row


_BASES: dict[str, Path] = {}


def _check_run_folder(file: HostileFile, audit: _Audit, canary: Path) -> dict[str, Any]:
    """
    A run folder's YAML read as ``sb3-safe enjoy`` reads it (:mod:`sb3_safe.zoo.run_folder`): refused in one line or
    read as data; no code ran, bounded cost. doctor and load do not read run folders: no verdict to compare.
    """
    from sb3_safe.zoo.run_folder import RunFolderError, read_args, read_config

    row: dict[str, Any] = {"file_kind": file.kind, "bytes": sum(path.stat().st_size for path in file.path.iterdir())}
    audit.canary, audit.events = str(canary), []
    with _measured(row, "load"):
        try:
            read_config(file.path)
            read_args(file.path)
            row["load"] = "loaded"
        except RunFolderError as error:
            row["load"], row["load_cause"] = "refused", str(error)[:300]
        except BaseException as error:
            row["load"], row["load_cause"] = f"raised {type(error).__name__}", str(error)[:300]
    audit.canary = None
    row.update(doctor_status=None, doctor_cause="", doctor_seconds=0.0, doctor_peak_mib=0.0)
    violations = []
    if audit.events or canary.exists():
        violations.append(f"code ran: {audit.events} {canary.exists()}")
        canary.unlink(missing_ok=True)
    if row["load_peak_mib"] > MAX_PEAK_MIB or row["load_seconds"] > MAX_SECONDS:
        violations.append("load over budget")
    if row["load"].startswith("raised"):
        violations.append(f"load {row['load']}")
    row["violations"] = violations
    return row


def _bases(folder: Path) -> dict[str, Path]:
    """A real model zip and VecNormalize statistics, saved once per process."""
    if not _BASES:
        import gymnasium as gym
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

        model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, seed=0)
        model.save(folder / "model.zip")
        statistics = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
        statistics.save(str(folder / "vecnormalize.pkl"))
        _BASES.update(model=folder / "model.zip", statistics=folder / "vecnormalize.pkl")
    return _BASES


_AUDIT: list[_Audit] = []


def run_seeds(seeds: range) -> list[dict[str, Any]]:
    """The rows of the files of ``seeds``, in this process."""
    import warnings

    warnings.simplefilter("ignore")
    if not _AUDIT:
        _AUDIT.append(_Audit())
    rows = []
    with tempfile.TemporaryDirectory(prefix="sb3-safe-hostile-") as folder_name:
        folder = Path(folder_name)
        bases = _bases(Path(tempfile.mkdtemp(prefix="sb3-safe-hostile-bases-")))
        canary = folder / "CANARY"
        for seed in seeds:
            file = hostile_file(seed, bases, folder, str(canary))
            rows.append({"seed": seed, **check_file(file, _AUDIT[0], canary)})
            if file.path.is_dir():
                for path in file.path.iterdir():
                    path.unlink()
                file.path.rmdir()
            else:
                file.path.unlink()
    return rows


def jobs(size: str) -> list[Job]:
    """Consecutive seeds, :data:`FILES_PER_JOB` per job."""
    return [(start, min(start + FILES_PER_JOB, FILES[size])) for start in range(0, FILES[size], FILES_PER_JOB)]


def job_key(job: Job) -> tuple[Any, ...]:
    return job


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    start = row["seed"] - row["seed"] % FILES_PER_JOB
    return (start, start + FILES_PER_JOB)


def run_job(job: Job) -> list[dict[str, Any]]:
    return run_seeds(range(*job))


def budget(size: str) -> dict[str, Any]:
    return {"files": FILES[size], "max_peak_mib": MAX_PEAK_MIB, "max_seconds": MAX_SECONDS}


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many files broke each promise."""
    seen = collections.Counter(violation.split(":")[0] for row in rows for violation in row["violations"])
    return {
        "code runs": seen["code ran"],
        "budget overruns": seen["doctor over budget"] + seen["load over budget"],
        "verdict disagreements": seen["verdicts disagree"] + seen["causes disagree"],
        "other errors from load": sum(count for name, count in seen.items() if name.startswith("load raised")),
    }


def _refused_at_build(row: dict[str, Any]) -> bool:
    """Whether doctor refused the file at the building of its model (which load then refuses for the same cause)."""
    return row["doctor_status"] == 2 and row["doctor_cause"].startswith("read, but")


def report(out: Path) -> None:
    """``hostile.md`` from ``hostile.jsonl``: the claim and its figures first, then the method and the tables."""
    path = out / f"{SUITE}.jsonl"
    if not path.exists():
        return
    meta, rows = suite.read_jsonl(path)
    remeasured = {row["seed"]: row for row in rows if row.get("kind") == REMEASURE}
    rows = [row for row in rows if "seed" in row and row.get("kind") != REMEASURE]
    counts = _counts(rows)
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for row in rows:
        doctor = "" if row["doctor_status"] is None else f"doctor {row['doctor_status']}, "
        by_kind[row["file_kind"]][f"{doctor}load {row['load']}"] += 1

    def cost(row: dict[str, Any]) -> str:
        return (
            f"seed {row['seed']} ({row['file_kind']}, {row['bytes'] / 1024:.0f} KiB): doctor {row['doctor_seconds']:.2f} s "
            f"/ {row['doctor_peak_mib']:.0f} MiB, load {row['load_seconds']:.2f} s / {row['load_peak_mib']:.0f} MiB"
        )

    broken = [row for row in rows if row["violations"]]
    slowest = max(rows, key=lambda row: max(row["doctor_seconds"], row["load_seconds"]))
    hungriest = max(rows, key=lambda row: max(row["doctor_peak_mib"], row["load_peak_mib"]))
    figures = ", ".join(f"{count} {name}" for name, count in counts.items())
    lines = [
        "# Generated hostile files",
        "",
        f"**{len(rows)} generated files read by `sb3-safe doctor` and `sb3_safe.load`: {figures}.** Bounds per reader: "
        f"peak memory growth <= {MAX_PEAK_MIB} MiB, <= {MAX_SECONDS:.0f} s.",
        "",
        f"- Slowest: {cost(slowest)}.",
        f"- Most memory: {cost(hungriest)}.",
        f"- Largest: {cost(max(rows, key=lambda row: row['bytes']))}.",
        f"- Read in full, refused by both because SB3 cannot build the model it describes (or not within its limits): "
        f"{sum(_refused_at_build(row) for row in rows)} files.",
        "",
        "## Method",
        "",
        f"Command `{meta.get('command')}` at commit {meta.get('commit')}; {meta.get('cpu')}, {meta.get('cores')} cores "
        f"(load average before: {meta.get('load_avg')}); Python {meta.get('python')}, torch {meta.get('torch')}, "
        f"SB3 {meta.get('sb3')}. Each file is drawn from its seed by `benchmarks/hostile_files.py` (its docstring says "
        "the grammar) and read by doctor (which builds the model as the algorithm its data describes, PPO's for "
        "these files), then by `sb3_safe.load` (`PPO`; `load_vec_normalize` for statistics, `load_replay_buffer` for "
        "a pickled buffer), in one long-lived process per job of "
        f"{FILES_PER_JOB} files: peak memory is `VmHWM`, reset before each reader, less the resident size before it.",
        "",
        "## Outcomes by kind",
        "",
        "| kind | files | doctor's exit status, load's outcome |",
        "|---|---:|---|",
        *[
            f"| {kind} | {sum(outcomes.values())} | {'; '.join(f'{name}: {n}' for name, n in outcomes.most_common())} |"
            for kind, outcomes in sorted(by_kind.items())
        ],
        "",
        "## Violations",
        "",
        *([f"- seed {row['seed']} ({row['file_kind']}): {'; '.join(row['violations'])}" for row in broken][:50] or ["None."]),
    ]
    if remeasured:
        lines += [
            "",
            "Files over the time bound, read again alone (`python -m benchmarks.hostile --remeasure`: the time of a reader "
            "on a machine shared with other jobs includes theirs):",
            "",
            *[
                f"- seed {seed}: doctor {row['doctor_seconds']:.2f} s, load {row['load_seconds']:.2f} s (1-min load "
                f"average {row['load_avg']:.2f}); violations then: {'; '.join(row['violations']) or 'none'}"
                for seed, row in sorted(remeasured.items())
            ],
        ]
    (out / f"{SUITE}.md").write_text("\n".join(lines) + "\n")


def remeasure(out: Path) -> None:
    """Read each file over the time bound again, in this process, and append the rows (kind ``remeasure``)."""
    _, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    slow = [row["seed"] for row in rows if any(violation.endswith("over budget") for violation in row.get("violations", []))]
    for seed in slow:
        row = run_seeds(range(seed, seed + 1))[0]
        suite.write_jsonl(out / f"{SUITE}.jsonl", [dict(row, kind=REMEASURE, load_avg=os.getloadavg()[0])], mode="a")
    report(out)


if __name__ == "__main__":
    if sys.argv[1:] == ["--remeasure"]:
        remeasure(Path(__file__).parent / "results")
    else:
        for row in run_seeds(range(int(sys.argv[1]), int(sys.argv[2]))):
            print(json.dumps(row))
    os._exit(0)
