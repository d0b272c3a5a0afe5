"""
The documentation site builds without a warning, documents the whole public API, shows every benchmark report, and
its guard page says what the guard's docstring says. Its code blocks run in tests/test_readme_snippets.py.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import sb3_safe
from sb3_safe.common.callbacks import NonFiniteGuardCallback

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the modules documented whole, besides the names of ``sb3_safe.__all__``
MODULES = (
    "sb3_safe.common.distributions",
    "sb3_safe.common.kl",
    "sb3_safe.common.schedules",
    "sb3_safe.common.rollout_kl",
    "sb3_safe.common.updates",
)
#: seconds: the build takes about 20 s on a shared 2-core machine
BUILD_TIMEOUT = 300


def build_site(out: Path) -> None:
    """Build the HTML site into ``out`` as CI builds it: ``-W``, so that any warning fails the build."""
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    # --keep-going: every warning is listed, not only the first
    assert result.returncode == 0, f"sphinx-build -W failed:\n{result.stderr[-8000:]}\n{result.stdout[-2000:]}"
    assert "WARNING" not in result.stderr and "ERROR" not in result.stderr, result.stderr[-8000:]


def test_site_builds_and_documents_the_public_api(tmp_path: Path) -> None:
    # One test for the one build (about 20 s): pytest-xdist would build once per worker for a shared fixture
    build_site(tmp_path)
    html = "\n".join(path.read_text(encoding="utf-8") for path in tmp_path.rglob("*.html"))
    missing = [name for name in sb3_safe.__all__ if f'id="sb3_safe.{name}"' not in html]
    assert not missing, f"names of sb3_safe.__all__ with no entry in the API reference (docs/modules/): {missing}"
    missing_modules = [module for module in MODULES if f'id="module-{module}"' not in html]
    assert not missing_modules, f"modules with no page in docs/common/: {missing_modules}"
    # The version of the package, read from sb3_safe/version.txt by docs/conf.py
    assert f"sb3-safe {sb3_safe.__version__}" in (tmp_path / "index.html").read_text(encoding="utf-8")


def test_every_benchmark_report_has_a_page() -> None:
    reports = sorted(path.stem for path in (ROOT / "benchmarks" / "results").glob("*.md"))
    pages = {path.stem: path.read_text(encoding="utf-8") for path in (DOCS / "benchmarks").glob("*.md")}
    missing = [name for name in reports if f"../../benchmarks/results/{name}.md" not in pages.get(name, "")]
    assert not missing, (
        f"benchmark reports without a page: {missing}; add docs/benchmarks/NAME.md holding "
        "```{include} ../../benchmarks/results/NAME.md (with :relative-images:) and list it in docs/benchmarks/reports.md"
    )
    toctree = pages["reports"]
    unlisted = [name for name in reports if not re.search(rf"^{re.escape(name)}$", toctree, re.MULTILINE)]
    assert not unlisted, f"report pages missing from the toctree of docs/benchmarks/reports.md: {unlisted}"


def _normalized(text: str) -> str:
    """Markdown or reStructuredText as plain words: ``x`` and `x` alike, one space between words."""
    return " ".join(text.replace("``", "`").split())


def _docstring_list(heading: str) -> list[str]:
    """The bullet list under a heading line of NonFiniteGuardCallback's docstring."""
    doc = NonFiniteGuardCallback.__doc__ or ""
    section = doc.split(f"{heading}\n", 1)[1].strip().split("\n\n", 1)[0]
    return [_normalized(item) for item in re.split(r"^\s*- ", section, flags=re.MULTILINE) if item.strip()]


def _page_list(heading: str) -> list[str]:
    page = (DOCS / "guide" / "guard.md").read_text(encoding="utf-8")
    section = page.split(f"\n## {heading}\n", 1)[1].strip().split("\n\n", 1)[0]
    return [_normalized(item) for item in re.split(r"^- ", section, flags=re.MULTILINE) if item.strip()]


@pytest.mark.parametrize(
    ("docstring_heading", "page_heading"),
    [
        ("What is checked, and when:", "What is checked, and when"),
        ("What a rollback restores, and what it keeps:", "What a rollback restores"),
    ],
)
def test_guard_page_says_what_the_docstring_says(docstring_heading: str, page_heading: str) -> None:
    # The docstring is kept with the code; the guide's lists are copies of it
    assert _page_list(page_heading) == _docstring_list(docstring_heading), (
        f"docs/guide/guard.md '{page_heading}' differs from NonFiniteGuardCallback's docstring: copy the docstring's list"
    )
