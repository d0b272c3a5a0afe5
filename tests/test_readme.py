"""The README's Quickstart is what CI runs."""

import re
from pathlib import Path

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
