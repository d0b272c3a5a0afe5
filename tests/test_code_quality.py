"""The checks of SB3's `make commit-checks` (ruff lint, ruff format, mypy), run by the suite so that CI fails on them."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_commit_checks_pass() -> None:
    # The tools of the interpreter running the suite; mypy's cache in the repository (.mypy_cache) makes reruns fast
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", "scripts/commit-checks.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_python_running_the_tests_is_a_listed_one() -> None:
    # The classifiers say which versions are tested: the one running this suite (CI's) must be among them
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f'"Programming Language :: Python :: {version}"' in (ROOT / "pyproject.toml").read_text()
