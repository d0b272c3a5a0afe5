"""
The fenced code blocks of the README and of the documentation pages (``docs/**/*.md``), as the tests run them.

A fence with a language (```` ```python ````, ```` ```bash ````) is a code block. A fence whose info string starts with
``{`` is a MyST directive (```` ```{toctree} ````, ```` ```{eval-rst} ````): its content is not a code block, except
that directives holding Markdown (admonitions) may hold fenced code blocks of their own, found too (MyST needs the
outer fence longer than the inner one). A MyST comment line ``% checked: WHAT`` right above a block marks a block
that the suite does not run as written but checks otherwise (:data:`CHECKED`), e.g. install commands.
"""

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: The markers of blocks checked instead of run, and how (tests/test_readme_snippets.py implements each)
CHECKED = {
    "install": "install commands: valid requirements of torch (unpinned or at the set-up script's pin) and sb3-safe's extras",
    "tests/test_readme.py and .ci/run run these": "the README's Quickstart commands, verbatim",
    "the README's Quickstart runs this": "the Quickstart's train command as run from an installed sb3-safe",
    "tests/test_tuning_postgres.py runs these": "the -optimize and --trial-id commands that test reads from this block",
}
#: Directives that would show code without a fence the tests see: write a plain ```python / ```bash fence instead
CODE_DIRECTIVES = ("code-block", "code", "sourcecode", "code-cell", "literalinclude")

_OPENING = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_CHECKED_MARKER = re.compile(r"^%\s*checked:\s*(?P<what>.+?)\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block of the README or of a documentation page."""

    #: the Markdown file
    source: Path
    #: 1-based position among the file's blocks
    index: int
    language: str
    code: str
    #: line of the opening fence in the file (1-based)
    line: int
    #: the heading of the section it is in
    section: str
    #: the paragraph just before it
    lead: str
    #: what a ``% checked: ...`` marker above it says, if any
    checked: str | None = None

    @property
    def name(self) -> str:
        """The file, relative to the repository root."""
        return self.source.relative_to(ROOT).as_posix()

    @property
    def lines(self) -> list[str]:
        """The non-empty lines that are not only a comment."""
        return [line for line in self.code.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    @property
    def test_id(self) -> str:
        first = self.lines[0].strip() if self.lines else "(empty)"
        prefix = "" if self.source == README else f"{self.name}:"
        return f"{prefix}{self.index}-{first[:70].rstrip()}"


@dataclass(frozen=True)
class Directive:
    """A MyST directive fence (``{name}``) of a file, for the checks of what a directive may hold."""

    source: Path
    name: str
    line: int
    content: str


def _is_closing(line: str, fence: str) -> bool:
    """Whether ``line`` closes a block opened by ``fence``: the same character, at least as many, nothing else."""
    stripped = line.strip()
    indent = len(line) - len(line.lstrip(" "))
    return indent <= 3 and len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def parse(source: Path) -> tuple[list[Block], list[Directive]]:
    """
    The code blocks and directives of a Markdown file.

    :param source: the file
    :return: its code blocks, in order, and its directives
    """
    lines = source.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    directives: list[Directive] = []
    open_directives: list[tuple[str, str, int, list[str]]] = []  # (fence, name, line, content)
    section, paragraph, lead = "", [], ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if open_directives and _is_closing(line, open_directives[-1][0]):
            fence, name, start, content = open_directives.pop()
            directives.append(Directive(source, name, start + 1, "\n".join(content)))
            i += 1
            continue
        for _, _, _, content in open_directives:
            content.append(line)
        opening = _OPENING.match(line)
        if opening is None:
            heading = re.match(r"^#+ (.*)$", line)
            if heading and not open_directives:
                section = heading.group(1)
            if line.strip():
                paragraph.append(line)
            elif paragraph:
                lead, paragraph = "\n".join(paragraph), []
            i += 1
            continue
        fence, info = opening.group("fence"), opening.group("info").strip()
        if info.startswith("{"):
            name = info[1:].split("}", 1)[0]
            open_directives.append((fence, name, i, []))
            i += 1
            continue
        # A code block: up to its closing fence, verbatim
        end = i + 1
        while end < len(lines) and not _is_closing(lines[end], fence):
            end += 1
        marker = _CHECKED_MARKER.match(lines[i - 1]) if i > 0 else None
        before = [*paragraph[:-1]] if marker else paragraph
        blocks.append(
            Block(
                source=source,
                index=len(blocks) + 1,
                language=info.split()[0] if info else "",
                code="".join(f"{code_line}\n" for code_line in lines[i + 1 : end]),
                line=i + 1,
                section=section,
                lead="\n".join(before) if before else lead,
                checked=marker.group("what") if marker else None,
            )
        )
        for _, _, _, content in open_directives:
            content.extend(lines[i + 1 : end + 1])
        paragraph = []
        i = end + 1
    return blocks, directives


def doc_pages() -> list[Path]:
    """The documentation's Markdown pages."""
    return sorted(path for path in DOCS.rglob("*.md") if not {"build", "_build"} & set(path.relative_to(DOCS).parts))


def readme_blocks() -> list[Block]:
    return parse(README)[0]


def docs_blocks() -> list[Block]:
    return [block for page in doc_pages() for block in parse(page)[0]]


def docs_directives() -> list[Directive]:
    return [directive for page in doc_pages() for directive in parse(page)[1]]
