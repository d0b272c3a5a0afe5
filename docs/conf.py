"""Sphinx configuration of the sb3-safe documentation, following Stable-Baselines3's (docs/conf.py there)."""

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
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
]

# .rst only for what autosummary generates internally: the pages are Markdown
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["build", "_build", "Thumbs.db", ".DS_Store"]  # build/: the output folder the README names
templates_path = []

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
html_static_path = []
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


def setup(app: Any) -> None:
    app.connect("autodoc-process-docstring", escape_absolute_values)
