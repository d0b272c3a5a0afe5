#!/usr/bin/env bash
# Stable-Baselines3's own PPO / A2C tests with sb3-safe's policies substituted (scripts/peer_substitution.py).
# Usage: scripts/peer_tests.sh PATH_TO_SB3_TESTS [pytest args...]   (the tests/ folder of an SB3 checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
tests="$1"; shift
PYTHONPATH=scripts .venv/bin/python -m pytest -p peer_substitution -p no:cacheprovider "$tests" -k "PPO or A2C or ppo or a2c" "$@"
