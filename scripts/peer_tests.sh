#!/usr/bin/env bash
# SB3's or sb3-contrib's own tests with sb3-safe's policies substituted for the algorithms' policy aliases
# (scripts/peer_substitution.py). Usage: scripts/peer_tests.sh PATH_TO_TESTS [pytest args...], where PATH_TO_TESTS is
# the tests/ folder of an SB3 or sb3-contrib checkout; select the algorithms with -k, e.g.
#   scripts/peer_tests.sh ../stable-baselines3/tests -k "PPO or A2C or ppo or a2c"
#   scripts/peer_tests.sh ../stable-baselines3-contrib/tests -k "Maskable or maskable or Recurrent or lstm or Lstm"
set -euo pipefail
cd "$(dirname "$0")/.."
tests="$1"; shift
PYTHONPATH=scripts .venv/bin/python -m pytest -p peer_substitution -p no:cacheprovider "$tests" "$@"
