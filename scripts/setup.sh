#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv holding the CPU build of torch and sb3-safe with every extra.
# torch is installed first, pinned, so that no dependency pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[all]"
