"""
One claim, one benchmark, one command (DESIGN.md): every row of the README's results table names, in its last column,
the benchmark that reproduces it, one that ``python -m benchmarks run`` lists, and links the report that benchmark
writes; a report regenerates from its committed rows.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
from test_readme import results_rows

from benchmarks import reports
from benchmarks.__main__ import SUITES, build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def row_benchmark(row: list[str]) -> str:
    """The benchmark a results row names: its last cell, a name in backticks."""
    match = re.fullmatch(r"`(\w+)`", row[-1])
    assert match, f"{row[0]}: the last cell names the benchmark in backticks, found {row[-1]!r}"
    return match[1]


def test_every_results_row_names_a_benchmark_that_run_lists() -> None:
    parser = build_parser()
    listed = parser.format_help()
    for row in results_rows():
        assert len(row) == 4, f"{row[0]}: claim, measured, report, benchmark"
        name = row_benchmark(row)
        assert name in SUITES and name in listed, f"{row[0]}: {name!r} is not a benchmark of `python -m benchmarks run`"
        assert parser.parse_args(["run", name, "--size", "quick"]).suite == name
        # The report linked is the one the benchmark writes (`--out` may put it in another folder of results/)
        (link,) = re.findall(r"\]\(([^)]+)\)", row[2])
        assert link.startswith("benchmarks/results/") and Path(link).name == f"{name}.md", f"{row[0]}: {link}"


def test_the_readme_says_how_to_rerun_a_row() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`python -m benchmarks run BENCHMARK [--size quick|full]`" in text


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_benchmark_has_the_harness_interface(name: str) -> None:
    module = SUITES[name]
    for size in ("tiny", "quick", "full"):
        jobs = module.jobs(size)
        assert jobs, f"{name}: no job at size {size}"
        json.dumps(module.budget(size))  # the meta row holds it
        if hasattr(module, "job_key"):
            keys = [module.job_key(job) for job in jobs]
            assert len(set(keys)) == len(keys), f"{name}: two jobs share a key at size {size}"
    assert callable(module.run_job) and callable(module.report)


@pytest.mark.parametrize("name", ["drop_in", "recipe", "secure_load"])
def test_report_regenerates_from_its_committed_rows(name: str, tmp_path: Path) -> None:
    """The committed report is what ``report NAME`` writes from the committed JSONL, its notes kept."""
    for suffix in (".jsonl", ".md"):
        shutil.copy(reports.RESULTS / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    main(["report", name, "--out", str(tmp_path)])
    assert (tmp_path / f"{name}.md").read_text() == (reports.RESULTS / f"{name}.md").read_text()


@pytest.mark.parametrize("name", ["drop_in", "secure_load"])
def test_benchmark_runs_at_the_tiny_size(name: str, tmp_path: Path) -> None:
    main(["run", name, "--size", "tiny", "--jobs", "1", "--out", str(tmp_path)])
    module = SUITES[name]
    rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    runs = [row for row in rows if row["kind"] == "run"]
    assert sorted(map(module.row_key, runs)) == sorted(map(module.job_key, module.jobs("tiny")))
    assert (tmp_path / f"{name}.md").read_text().startswith("# ")
