"""
Rerun rows of the robustness map at the current commit into a side JSONL, paired with the map's own rows (same task,
variant, learning-rate factor, ent_coef and seed), to measure what a change of the library moved without rerunning the
whole map. Resumable: rows already in the side file are skipped.

Usage::

    python -m benchmarks.robustness_rerun Pendulum-v1 KL-lr robustness_exact_kl.jsonl   # task, variant substring, file
"""

import sys
import time

from benchmarks import reports, robustness, suite


def main(task: str, variant_part: str, name: str) -> None:
    """Rerun the map's rows of ``task`` whose variant contains ``variant_part`` into ``benchmarks/results/<name>``."""
    out = reports.RESULTS / name
    _, rows = suite.read_jsonl(reports.RESULTS / "robustness.jsonl")
    runs = [row for row in rows if row["task"] == task and variant_part in row["variant"]]
    done = set()
    if out.exists():
        done = {tuple(row["key"]) for row in suite.read_jsonl(out)[1]}
    else:
        meta = dict(kind="meta", command="python -m benchmarks.robustness_rerun " + " ".join(sys.argv[1:]))
        suite.write_jsonl(out, [dict(meta, **suite.machine_info())])
    for row in sorted(runs, key=lambda row: (row["lr_factor"], row["variant"], row["ent_coef"], row["seed"])):
        key = (row["task"], row["variant"], row["lr_factor"], row["ent_coef"], row["seed"])
        if key in done:
            continue
        new = robustness.run_job((*key, "full"))[0]
        paired = dict(kind="run", key=key, old=row["final_return"], old_cpu=row.get("cpu"), **new, finished_at=time.time())
        suite.write_jsonl(out, [paired], mode="a")
        print(key, row["final_return"], new["final_return"], flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
