"""
The generated hostile files of ``python -m benchmarks run hostile``, a fixed set of seeds: for every file, no code ran,
doctor and ``sb3_safe.load`` stayed within the memory bound, and they gave one verdict for the same cause: doctor
passes a file if and only if load loads it, with no exemption (a file whose model SB3 cannot build is refused by both).
"""

import sys

import pytest

from benchmarks.hostile import MAX_PEAK_MIB, run_seeds
from benchmarks.hostile_files import KINDS
from sb3_safe.loading.building import BUILD_REFUSAL

#: Seeds drawn for the suite: enough that every kind of file appears (checked below)
SEEDS = range(1000, 1080)


@pytest.mark.skipif(sys.platform != "linux", reason="peak memory is read from /proc (VmHWM)")
def test_generated_hostile_files_keep_every_promise() -> None:
    rows = run_seeds(SEEDS)
    assert {row["file_kind"] for row in rows} == set(KINDS)
    # Some of each outcome: the generator reaches refusals of each reader's cause and files that load
    assert {row["doctor_status"] for row in rows} == {None, 0, 1, 2}  # None: a run folder, read by enjoy's reader
    assert any(row["load"] == "loaded" for row in rows)
    # and files read in full whose model SB3 cannot build, which doctor refuses at the build as load does
    assert any(row["doctor_status"] == 2 and row["doctor_cause"].startswith(BUILD_REFUSAL) for row in rows)
    broken = [(row["seed"], row["file_kind"], row["violations"]) for row in rows if row["violations"]]
    assert broken == []
    assert any(row["file_kind"] == "run folder yaml" and row["load"] == "refused" for row in rows)
    # Memory is an invariant (time is the benchmark's: the machine's load varies)
    assert max(max(row["doctor_peak_mib"], row["load_peak_mib"]) for row in rows) <= MAX_PEAK_MIB
