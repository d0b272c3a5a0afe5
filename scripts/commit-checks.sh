#!/usr/bin/env bash
# SB3's `make commit-checks`: lint, formatting and types. tests/test_code_quality.py runs it in the test suite
# (and so in CI); PYTHON picks the interpreter whose ruff and mypy run (default: the .venv of scripts/setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
status=0
# Every check runs, so that one run shows every finding
"$PYTHON" -m ruff check . || status=1
"$PYTHON" -m ruff format --check . || status=1
"$PYTHON" -m mypy sb3_safe || status=1
exit "$status"
