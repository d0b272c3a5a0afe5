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


def report_header(title: str, meta: dict[str, Any], budget_lines: list[str]) -> list[str]:
    """Title, the command, machine, versions, budget, load and wall time of a report."""
    wall = f"{meta['wall_s'] / 60:.1f} min wall" if "wall_s" in meta else "run incomplete"
    return [
        f"# {title}",
        "",
        f"Command: `{meta.get('command', '?')}` (size `{meta.get('size')}`, {meta.get('jobs')} processes, 1 torch thread"
        f" each; {wall})",
        "",
        f"- Machine: {_machines(meta)}, {meta.get('cores')} cores, shared with other jobs (1-min load average before /"
        f" after: {meta.get('load_avg')} / {meta.get('load_avg_after', '?')})",
        f"- Versions: Python {meta.get('python')}, torch {meta.get('torch')}, SB3 {meta.get('sb3')}, gymnasium"
        f" {meta.get('gymnasium')}, sb3-safe {meta.get('sb3_safe')}"
        + (f" (commit {meta['commit']})" if meta.get("commit") else ""),
        *[f"- {line}" for line in budget_lines],
        "",
    ]


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
