"""
The documentation site builds without a warning, documents the whole public API with every listed parameter
described, and shows every benchmark report. Its code blocks run in tests/test_readme_snippets.py.
"""

import html
import re
import subprocess
import sys
from pathlib import Path

import sb3_safe

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the modules documented whole, besides the names of ``sb3_safe.__all__``
MODULES = (
    "sb3_safe.common.distributions",
    "sb3_safe.common.kl",
    "sb3_safe.common.schedules",
    "sb3_safe.common.rollout_kl",
    "sb3_safe.common.updates",
    "sb3_safe.common.value_norm",
    "sb3_safe.common.observation_norm",
)
#: what Sphinx writes between a parameter's name and type and its description: "name (type) \N{EN DASH} description"
DASH = "\N{EN DASH}"
#: a field list's Parameters field (the first field is "field-odd", the next "field-even", ...)
FIELD = (
    r'<dt class="field-(?:odd|even)">Parameters<span class="colon">:</span></dt>\s*'
    r'<dd class="field-(?:odd|even)">(.*?)</dd>'
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


def _text(fragment: str) -> str:
    """The text of an HTML fragment, on one line."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def parameter_fields(page: str) -> list[tuple[str, str]]:
    """
    Every parameter the API reference lists on a built page, with the object it belongs to.

    :param page: the page's HTML
    :return: (object id, the parameter's text: ``name (type)``, then :data:`DASH` and the description if it has one)
    """
    fields = []
    # Each object's block starts at its signature; its field lists follow, before the next signature
    for block in re.split(r'<dt class="sig sig-object py" id="', page)[1:]:
        object_id = block.split('"', 1)[0]
        for body in re.findall(FIELD, block, re.S):
            items = re.findall(r"<li><p>(.*?)</p></li>", body, re.S) or [body]  # one parameter: no list
            fields += [(object_id, _text(item)) for item in items]
    return fields


def signatures(page: str) -> list[tuple[str, str]]:
    """(object id, signature text) of every object a built page documents."""
    found = re.findall(r'<dt class="sig sig-object py" id="([^"]+)">(.*?)</dt>', page, re.S)
    return [(object_id, _text(signature)) for object_id, signature in found]


def check_api_reference(site: Path) -> None:
    """Every listed parameter described, no private parameter in a signature, tables that wrap."""
    pages = {path.relative_to(site).as_posix(): path.read_text(encoding="utf-8") for path in api_pages(site)}
    undescribed = [
        f"{name}: {object_id}: {field.split(' ', 1)[0]}"
        for name, page in pages.items()
        for object_id, field in parameter_fields(page)
        if f" {DASH} " not in field
    ]
    assert not undescribed, f"parameters without a description (add a :param: line to the docstring): {undescribed}"
    assert sum(len(parameter_fields(page)) for page in pages.values()) > 250  # the parser still finds them
    private = [
        f"{name}: {object_id}: {parameter}"
        for name, page in pages.items()
        for object_id, signature in signatures(page)
        for parameter in re.findall(r"[(,]\s*\*{0,2}(_\w+)", signature)
    ]
    assert not private, f"private parameters shown in signatures: {private}"
    # The theme keeps table cells on one line (a horizontal scrollbar); the site's stylesheet lets them wrap
    assert "white-space: normal" in (site / "_static" / "css" / "custom.css").read_text(encoding="utf-8")
    unstyled = [name for name, page in pages.items() if "_static/css/custom.css" not in page]
    assert not unstyled, f"pages without the site's stylesheet: {unstyled}"


def api_pages(site: Path) -> list[Path]:
    """The API reference's pages: the public API (docs/modules/) and the documented modules (docs/common/)."""
    return sorted([*site.glob("modules/*.html"), *site.glob("common/*.html")])


def test_site_builds_and_documents_the_public_api(tmp_path: Path) -> None:
    # One test for the one build (about 20 s): pytest-xdist would build once per worker for a shared fixture
    build_site(tmp_path)
    html_text = "\n".join(path.read_text(encoding="utf-8") for path in tmp_path.rglob("*.html"))
    missing = [name for name in sb3_safe.__all__ if f'id="sb3_safe.{name}"' not in html_text]
    assert not missing, f"names of sb3_safe.__all__ with no entry in the API reference (docs/modules/): {missing}"
    missing_modules = [module for module in MODULES if f'id="module-{module}"' not in html_text]
    assert not missing_modules, f"modules with no page in docs/common/: {missing_modules}"
    # The version of the package, read from sb3_safe/version.txt by docs/conf.py
    assert f"sb3-safe {sb3_safe.__version__}" in (tmp_path / "index.html").read_text(encoding="utf-8")
    check_api_reference(tmp_path)


def test_the_parser_sees_a_parameter_without_a_description() -> None:
    # The check above is only as good as its reading of Sphinx's HTML: a page as Sphinx writes it
    page = (
        '<dt class="sig sig-object py" id="sb3_safe.Thing">class Thing(a, _private=True)</dt><dd>'
        '<dl class="field-list simple"><dt class="field-odd">Parameters<span class="colon">:</span></dt>'
        f'<dd class="field-odd"><ul class="simple"><li><p><strong>a</strong> (<em>int</em>) {DASH} the count</p></li>'
        "<li><p><strong>b</strong> (<em>float</em>)</p></li></ul></dd></dl></dd>"
    )
    assert parameter_fields(page) == [("sb3_safe.Thing", f"a (int) {DASH} the count"), ("sb3_safe.Thing", "b (float)")]
    assert signatures(page) == [("sb3_safe.Thing", "class Thing(a, _private=True)")]


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
