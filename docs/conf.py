"""Sphinx configuration of the sb3-safe documentation, following Stable-Baselines3's (docs/conf.py there)."""

import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Autodoc imports the package of this checkout, installed or not
sys.path.insert(0, str(ROOT))

# -- Project information -----------------------------------------------------

project = "sb3-safe"
copyright = "2026, sb3-safe contributors"
author = "sb3-safe contributors"
# The one version of the package (pyproject.toml reads it too)
release = (ROOT / "sb3_safe" / "version.txt").read_text(encoding="utf-8").strip()
version = release

# -- General configuration ---------------------------------------------------

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.extlinks",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
]

# .rst only for what autosummary generates internally: the pages are Markdown
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["build", "_build", "Thumbs.db", ".DS_Store"]  # build/: the output folder the README names
templates_path = []

# Links into SB3's and sb3-contrib's API reference from docstrings: :sb3:`PPO <modules/ppo.html#...>`
extlinks = {
    "sb3": ("https://stable-baselines3.readthedocs.io/en/master/%s", None),
    "sb3-contrib": ("https://sb3-contrib.readthedocs.io/en/master/%s", None),
}

# MyST: $...$ math, ::: fences for admonitions, headings up to ### as link targets ("page.md#section")
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# As SB3: type hints in the parameter descriptions, not in the signatures
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autosummary_generate = True
# The class docstring and the __init__ one (sb3-safe writes its :param: lists in the class docstring)
autoclass_content = "class"

# Copy only the command, not the prompt or the output
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

pygments_style = "sphinx"

# -- Options for HTML output -------------------------------------------------

html_theme = "sphinx_rtd_theme"
html_title = f"sb3-safe {release}"
html_static_path = ["_static"]
html_css_files = ["css/custom.css"]
html_theme_options = {"navigation_depth": 3}


# -- Docstrings --------------------------------------------------------------

# sb3-safe's docstrings write an absolute value as |x| (largest |logit|, |value| > 1e4), which reStructuredText
# reads as a substitution reference; inside ``literals`` it is plain text already
_INLINE_LITERAL = re.compile(r"(``.+?``)")
_ABSOLUTE_VALUE = re.compile(r"(?<![\\|])\|(?=[^|\s])([^|`]*?[^|\s])\|(?![|_])")


def _escape_absolute_values(line: str) -> str:
    parts = _INLINE_LITERAL.split(line)
    return "".join(part if part.startswith("``") else _ABSOLUTE_VALUE.sub(r"\\|\1\\|", part) for part in parts)


def escape_absolute_values(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    lines[:] = [_escape_absolute_values(line) for line in lines]


# -- Signatures ----------------------------------------------------------------

# Parameters the reference leaves out: SB3's private `_init_setup_model`, and a method's `self` or `cls` (listed
# among the parameters when annotated, as in `learn(self: SelfPPO, ...)`)
_HIDDEN_PARAMETER = re.compile(r"_\w*|self|cls")


def _split_parameters(args: str) -> list[str]:
    """The parameters of a signature's ``(a, b=(1, 2), *c)`` at the top level of its brackets."""
    parameters, depth, current = [], 0, ""
    for char in args.strip()[1:-1]:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parameters.append(current.strip())
            current = ""
        else:
            current += char
    return [*parameters, current.strip()] if current.strip() else parameters


def _parameter_name(parameter: str) -> str:
    return re.split(r"[:=]", parameter.lstrip("*"), maxsplit=1)[0].strip()


def hide_private_parameters(
    app: Any, what: str, name: str, obj: Any, options: Any, args: str | None, retann: str | None
) -> tuple[str, str | None] | None:
    # The type hints autodoc recorded become the field list's parameters: drop the hidden ones there too
    annotations = app.env.current_document.autodoc_annotations.get(name, {})
    for parameter in [key for key in annotations if _HIDDEN_PARAMETER.fullmatch(key)]:
        del annotations[parameter]
    if not args or not args.startswith("("):
        return None
    kept = [p for p in _split_parameters(args) if not _HIDDEN_PARAMETER.fullmatch(_parameter_name(p))]
    return f"({', '.join(kept)})", retann


def drop_private_parameter_docs(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    # A docstring's ":param _init_setup_model: ..." (SB3's convention) and its continuation lines
    kept, skipping = [], False
    for line in lines:
        continued = skipping and line.startswith(" ") and bool(line.strip())
        skipping = continued or re.match(r":param _\w*:", line) is not None
        if not skipping:
            kept.append(line)
    lines[:] = kept


# -- Links to benchmark reports ---------------------------------------------------

# The guides link a benchmark report where it lies in the repository (benchmarks/results/NAME.md), so that they read
# as plain Markdown too (GitHub); on the site the same link goes to the report's page, the one that includes it
DOCS = Path(__file__).resolve().parent
_INCLUDE = re.compile(r"^```\{include\} (\S+)", re.MULTILINE)
_LINK = re.compile(r"\]\((?P<path>[^)\s#]+\.md)(?P<anchor>#[^)\s]*)?\)")


def report_pages() -> dict[Path, Path]:
    """Each report that a page of docs/benchmarks/ includes, with that page (the first one that includes it)."""
    pages: dict[Path, Path] = {}
    for page in sorted((DOCS / "benchmarks").glob("*.md")):
        for included in _INCLUDE.findall(page.read_text(encoding="utf-8")):
            pages.setdefault((page.parent / included).resolve(), page)
    return pages


def link_reports_to_their_pages(app: Any, docname: str, source: list[str]) -> None:
    folder = (DOCS / docname).parent
    pages = report_pages()

    def to_page(match: re.Match) -> str:
        page = pages.get((folder / match.group("path")).resolve())
        if page is None:
            return match.group(0)
        return f"]({os.path.relpath(page, folder)}{match.group('anchor') or ''})"

    source[0] = _LINK.sub(to_page, source[0])


def setup(app: Any) -> None:
    app.connect("source-read", link_reports_to_their_pages)
    app.connect("autodoc-process-docstring", escape_absolute_values)
    app.connect("autodoc-process-docstring", drop_private_parameter_docs)
    # After autodoc's own handlers (priority 500), which record the type hints
    app.connect("autodoc-process-signature", hide_private_parameters, priority=900)
