"""
The README's Quickstart is what CI runs, and the README stays a landing page: short, a results table of one claim
per row with its report, install lines that leave the user's torch alone, and every Python block runnable after the
install line above it (tests/test_readme_snippets.py runs the blocks; here: what that install line brings).
"""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from snippets import readme_blocks

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    """Commands of the first fenced block under the Quickstart heading, as ../shared/tools/quickstart-check reads it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.split(r"^#+ .*[Qq]uick ?[Ss]tart.*$", text, maxsplit=1, flags=re.MULTILINE)[1]
    block = section.split("```", 2)[1]
    lines = block.splitlines()[1:]  # drop the language tag line
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_quickstart_has_a_main_and_a_test_command():
    commands = quickstart_commands()
    assert len(commands) == 2
    test_commands = [command for command in commands if "test" in command.lower()]
    assert len(test_commands) == 1


def test_ci_runs_the_readme_test_command():
    test_command = next(command for command in quickstart_commands() if "test" in command.lower())
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines


def test_main_command_runs_files_of_this_repository():
    main_command = next(command for command in quickstart_commands() if "test" not in command.lower())
    for token in main_command.split():
        if token.endswith((".py", ".sh")):
            assert (ROOT / token).is_file(), token


# ----- the README as a landing page -----

README = ROOT / "README.md"
#: the most lines the landing page may have: the rest lives in the guides and the reports it links
MAX_LINES = 120
#: the most rows of the results table: one claim each, the figure, the report and the benchmark
MAX_RESULT_ROWS = 10


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def results_rows() -> list[list[str]]:
    """The cells of each row of the table under the Results heading (header and separator left out)."""
    section = re.split(r"^## Results\s*$", readme_text(), maxsplit=1, flags=re.MULTILINE)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.MULTILINE)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]


def test_readme_is_short() -> None:
    n_lines = len(readme_text().splitlines())
    assert n_lines <= MAX_LINES, f"README.md has {n_lines} lines, at most {MAX_LINES}: move detail into docs/guide/"


def test_results_table_one_claim_per_row_each_with_its_report() -> None:
    rows = results_rows()
    assert 0 < len(rows) <= MAX_RESULT_ROWS, f"{len(rows)} result rows, at most {MAX_RESULT_ROWS}"
    # The last cell names the benchmark that reproduces the row (tests/test_readme_benchmarks.py)
    for claim, measured, report, _benchmark in rows:
        # One claim, its figure, the report: caveats stay in the report (no bold warnings, no nested qualifiers)
        assert claim and re.search(r"\d", measured), (claim, measured)
        assert "**" not in measured and "missed" not in measured.lower(), f"a caveat in the table: {measured}"
        links = re.findall(r"\]\(([^)]+)\)", report)
        assert len(links) == 1, f"{claim}: one link to its report, found {links}"
        assert (ROOT / links[0]).is_file(), f"{claim}: {links[0]} does not exist"


def test_readme_links_resolve() -> None:
    local = [link for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme_text()) if "://" not in link]
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_install_into_your_environment_leaves_torch_alone() -> None:
    """The first install line (into the user's own environment) installs sb3-safe only: pip keeps a torch >= 2.6."""
    indented = [line.strip() for line in readme_text().splitlines() if re.match(r"^ {4}pip install ", line)]
    assert indented and "torch" not in indented[0], indented
    # Where a torch line comes, sb3-safe is installed after it, in the same block (a fresh environment)
    torch_lines = [i for i, line in enumerate(indented) if "torch" in line.split()]
    assert all(i + 1 < len(indented) and "torch" not in indented[i + 1] for i in torch_lines), indented


def test_readme_names_the_docs_build_command() -> None:
    # The command test_docs.py builds the site with (there with -W, -q and --keep-going)
    commands = [line.strip() for line in readme_text().splitlines() if re.match(r"^ {4}python -m sphinx ", line)]
    assert len(commands) == 1, commands
    assert commands[0].startswith("python -m sphinx -b html docs "), commands[0]
    assert 'pip install ".[docs]"' in readme_text()


# ----- every Python block runs after the install line above it -----

#: environments whose package an extra brings: the module of the entry point -> the distributions that provide it
ENV_PACKAGES = {"gymnasium.envs.mujoco": {"mujoco"}, "gymnasium.envs.box2d": {"box2d", "box2d-py"}, "ale_py": {"ale-py"}}
#: an install line of sb3-safe: this checkout, the wheel built from it, or the package name, with its extras
SB3_SAFE_INSTALL = re.compile(r'pip install "?(?:\.|dist/sb3_safe-[^"\[\s`]+\.whl|sb3-safe)(?:\[(?P<extras>[\w,-]+)\])?"?')


def stated_extras(line: int) -> set[str]:
    """The extras of the last sb3-safe install command (indented or inline) above a line of the README."""
    above = "\n".join(readme_text().splitlines()[: line - 1])
    installs = list(SB3_SAFE_INSTALL.finditer(above))
    assert installs, f"README line {line}: no install command above it"
    return set(filter(None, (installs[-1].group("extras") or "").split(",")))


def installed_closure(name: str, extras: frozenset[str] = frozenset(), seen: set | None = None) -> set[str]:
    """The distributions ``pip install name[extras]`` brings, read from the metadata of this environment."""
    seen = set() if seen is None else seen
    key = (canonicalize_name(name), extras)
    if key in seen:
        return {canonicalize_name(found) for found, _ in seen}
    seen.add(key)
    try:
        requirements = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return {canonicalize_name(found) for found, _ in seen}
    for text in requirements:
        requirement = Requirement(text)
        wanted = requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras})
        if wanted:
            installed_closure(requirement.name, frozenset(requirement.extras), seen)
    return {canonicalize_name(found) for found, _ in seen}


def needed_distributions(code: str) -> dict[str, set[str]]:
    """What a block imports and the environments it makes, each with the distributions that can provide it."""
    tree = ast.parse(code)
    modules = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    providers = importlib.metadata.packages_distributions()
    needed = {
        module: {canonicalize_name(dist) for dist in providers.get(module, [module])}
        for module in modules - set(sys.stdlib_module_names)
    }
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    for env_id in strings & set(gym.registry):
        entry_point = str(gym.registry[env_id].entry_point)
        for prefix, dists in ENV_PACKAGES.items():
            if entry_point.startswith(prefix):
                needed[env_id] = dists
    return needed


PYTHON_BLOCKS = [block for block in readme_blocks() if block.language == "python"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"line-{block.line}" for block in PYTHON_BLOCKS])
def test_python_block_runs_after_its_install_line(block) -> None:
    extras = frozenset(stated_extras(block.line))
    brought = installed_closure("sb3-safe", extras)
    missing = {what: dists for what, dists in needed_distributions(block.code).items() if not dists & brought}
    assert not missing, (
        f'README line {block.line}: needs {missing}, which pip install ".[{",".join(sorted(extras))}]" does not '
        "bring: name the extra in the install line above the block"
    )


def test_the_install_check_sees_a_missing_extra() -> None:
    # Hopper needs MuJoCo, which only the mujoco extra brings
    brought = installed_closure("sb3-safe", frozenset({"zoo"}))
    assert not needed_distributions('gym.make("Hopper-v5")')["Hopper-v5"] & brought
    assert needed_distributions('gym.make("Hopper-v5")')["Hopper-v5"] & installed_closure("sb3-safe", frozenset({"mujoco"}))


# ----- user documentation speaks of the software, not of how it was made -----

#: words of the project's working history: work periods, issue and pull-request numbers, commit hashes
HISTORY_WORDS = re.compile(
    r"\b(?:this |that |each |every |a |the |previous |last |next )?sessions?\b"
    r"|\b(?:issue|ticket|PR|pull request)s?\s*#?\d+"
    r"|\b(?:round|sprint|work period|iteration|phase)\s+#?\d+\b"
    r"|\b(?:commit|at|since|before|after)\s+[0-9a-f]{7,40}\b"
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}'s\b",
    re.IGNORECASE,
)


def user_documents() -> list[Path]:
    docs = ROOT / "docs"
    return [
        ROOT / "README.md",
        docs / "index.md",
        *sorted((docs / "guide").glob("*.md")),
        *sorted((docs / "misc").glob("*.md")),
    ]


def docstrings(path: Path) -> list[tuple[int, str]]:
    """The docstrings of a module and of its classes and functions, with their line numbers."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [
        tree,
        *(node for node in ast.walk(tree) if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))),
    ]
    found = []
    for node in nodes:
        text = ast.get_docstring(node, clean=False)
        if text:
            found.append((node.body[0].lineno, text))
    return found


def test_no_working_history_in_user_documentation() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for path in user_documents()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for match in HISTORY_WORDS.finditer(line)
    ]
    hits += [
        f"{path.relative_to(ROOT)}:{number} (docstring): {match.group(0)!r}"
        for path in sorted((ROOT / "sb3_safe").rglob("*.py"))
        for number, text in docstrings(path)
        for match in HISTORY_WORDS.finditer(text)
    ]
    assert not hits, f"working history belongs in git and benchmarks/results/, not in user documentation: {hits}"


@pytest.mark.parametrize(
    "text",
    ["as measured in this session", "fixed in issue 37", "see issue #63", "the round 4 review", "back to 8938b37's cost"],
)
def test_history_words_are_seen(text: str) -> None:
    assert HISTORY_WORDS.search(text)


@pytest.mark.parametrize("text", ["float32 rounds an Adam step", "around", "the issue of scale", "A2C's update", "deadbeef"])
def test_ordinary_words_pass(text: str) -> None:
    assert not HISTORY_WORDS.search(text)


def test_pages_the_readme_links_read_as_plain_markdown() -> None:
    """The guides and the changelog (the README sends people there): links a plain Markdown view follows, no MyST roles."""
    linked = {
        (ROOT / link).resolve() for link in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", readme_text()) if "docs/" in link
    }
    assert linked, "the README links no guide"
    pages = sorted(linked | set((ROOT / "docs" / "guide").glob("*.md")))
    roles = [f"{page.relative_to(ROOT)}: {role}" for page in pages for role in re.findall(r"\{\w+\}`[^`]*`", page.read_text())]
    assert not roles, f"write these as [text](page.md) links, which Sphinx and GitHub both follow: {roles}"
    missing = [
        f"{page.relative_to(ROOT)}: {link}"
        for page in pages
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
        if "://" not in link and not (page.parent / link).exists()
    ]
    assert not missing, f"links to missing files: {missing}"
