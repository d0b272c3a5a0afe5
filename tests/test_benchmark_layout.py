"""
The shape of ``benchmarks/``: its modules import one another without a cycle, each stays short enough to read, and
what a user reads says what was measured, not when in the project's work it was.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
MAX_LINES = 600
#: Modules longer than MAX_LINES, not split yet (fault_mutants.py is listed while it grows beside faults.py)
LONGER = {"faults.py", "fault_mutants.py", "mutation.py"}


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``benchmarks`` that ``path`` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("benchmarks."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("benchmarks.")}
    return found & modules


def test_no_import_cycles() -> None:
    modules = {path.stem for path in BENCHMARKS.glob("*.py")}
    graph = {name: imported_modules(BENCHMARKS / f"{name}.py", modules) for name in modules}
    # Depth-first search; a module met again while on the path closes a cycle
    state: dict[str, str] = {}
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles in benchmarks/: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_module_length() -> None:
    lengths = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in BENCHMARKS.glob("*.py")}
    too_long = {name: lines for name, lines in lengths.items() if lines > MAX_LINES and name not in LONGER}
    assert not too_long, f"benchmarks modules over {MAX_LINES} lines (split them): {too_long}"


ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth"
    "|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
)
#: Working history: numbered work periods and the project's own issue numbers (git keeps both)
HISTORY = re.compile(
    r"\bsessions?\s+\d|\b(?:this|that|last|earlier|previous)\s+sessions?\b|\b(?:" + ORDINALS + r")\s+sessions?\b"
    r"|\bsessions\s+(?:below|above)\b|\bround\s+\d|\bissue\s+\d+|\bthe\s+issue's\b",
    re.IGNORECASE,
)
#: Files others are rewriting; they leave this list once their working-history words are gone
HISTORY_PENDING = {"mutation.py", "mutation.md"}


def _read_by_users() -> list[Path]:
    paths = [
        *BENCHMARKS.rglob("*.py"),
        *BENCHMARKS.glob("results/*.md"),
        *BENCHMARKS.glob("results/*/*.md"),
        *(ROOT / "docs" / "benchmarks").glob("*.md"),
    ]
    return sorted(path for path in paths if path.name not in HISTORY_PENDING)


@pytest.mark.parametrize("path", _read_by_users(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_working_history(path: Path) -> None:
    hits = [
        f"{number}: {line.strip()[:100]}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if HISTORY.search(line)
    ]
    assert not hits, "working history (say what was measured, at which commit): " + "; ".join(hits)
