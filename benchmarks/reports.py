"""
Markdown reports and plots of the benchmark suites.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
#: Hand-written reading of the numbers below this marker survives a rewrite of a report
NOTES_MARKER = "<!-- notes -->"


def report_header(title: str, meta: dict[str, Any], budget_lines: list[str], summary: str | None = None) -> list[str]:
    """
    Title, the command, machine, versions, budget, load and wall time of a report.

    :param summary: the claim's current figure, put right under the title
    """
    if meta.get("wall_s") is not None:
        wall = f"{meta['wall_s'] / 60:.1f} min wall"
    else:
        wall = "wall time not recorded" if "wall_s" in meta else "run incomplete"
    return [
        f"# {title}",
        "",
        *([summary, ""] if summary else []),
        f"Command: `{meta.get('command', '?')}` (size `{meta.get('size')}`, {meta.get('jobs')} processes, 1 torch thread"
        f" each; {wall})",
        "",
        f"- Machine: {_machines(meta)}"
        + (f", {meta['cores']} cores" if meta.get("cores") is not None else "")
        + (
            f", shared with other jobs (1-min load average before / after: {meta['load_avg']} /"
            f" {meta.get('load_avg_after', '?')})"
            if meta.get("load_avg") is not None
            else ""
        ),
        f"- Versions: {_versions(meta)}" + (f" (commit {meta['commit']})" if meta.get("commit") else ""),
        *[f"- {line}" for line in budget_lines],
        "",
    ]


#: (meta key, name) of the versions a report names
VERSIONS = (("python", "Python"), ("torch", "torch"), ("sb3", "SB3"), ("gymnasium", "gymnasium"), ("sb3_safe", "sb3-safe"))


def _versions(meta: dict[str, Any]) -> str:
    """The versions the meta row recorded (a run written before the harness recorded them has none)."""
    known = [f"{name} {meta[key]}" for key, name in VERSIONS if meta.get(key) is not None]
    return ", ".join(known) if known else "not recorded"


def _machines(meta: dict[str, Any]) -> str:
    """The CPU, or for a run resumed on other machines every CPU that ran some of its rows."""
    cpus = meta.get("cpus") or [meta.get("cpu")]
    if len(set(cpus)) == 1:
        return str(cpus[0])
    listed = " and ".join(str(cpu) for cpu in dict.fromkeys(cpus))
    return f"rows from {listed} (one commit and seed can end elsewhere on another CPU)"


def write_report(path: Path, lines: list[str]) -> None:
    """Write a markdown report, keeping the hand-written notes below NOTES_MARKER of an existing one."""
    notes = path.read_text().partition(NOTES_MARKER)[2] if path.exists() else ""
    path.write_text("\n".join(lines) + "\n\n" + NOTES_MARKER + (notes or "\n"))
    print(f"wrote {path}")


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows],
    ]


def mean_std(values: Iterable[float], digits: int = 1) -> str:
    """``mean +- std`` over the finite values, with ``(n=k)`` when some were not finite."""
    array = np.asarray(list(values), dtype=float)
    finite = array[np.isfinite(array)]
    if not len(finite):
        return "n/a"
    text = f"{finite.mean():.{digits}f} +- {finite.std():.{digits}f}"
    return text if len(finite) == len(array) else f"{text} (n={len(finite)})"


def pyplot() -> Any:
    """matplotlib's pyplot with the file-only backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path) -> None:
    """Save and close a figure."""
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot().close(figure)


def smoothed_curve(points: list[tuple[int, float]], grid: np.ndarray, window: int = 20) -> np.ndarray:
    """Mean return of the last ``window`` training episodes finished by each grid timestep."""
    steps = np.array([point[0] for point in points])
    returns = np.array([point[1] for point in points])
    values = np.full(len(grid), np.nan)
    for i, step in enumerate(grid):
        done = returns[steps <= step] if len(steps) else returns
        if len(done):
            values[i] = done[-window:].mean()
    return values
