"""
pytest plugin: run Stable-Baselines3's or sb3-contrib's own test suite with sb3-safe's policies substituted for the
policy aliases of PPO, A2C, TRPO ("MlpPolicy", "CnnPolicy", "MultiInputPolicy"), MaskablePPO (the same aliases,
maskable policies) and RecurrentPPO ("MlpLstmPolicy", "CnnLstmPolicy", "MultiInputLstmPolicy"), so every test
that builds these algorithms by alias exercises the safe policies. Usage (see scripts/peer_tests.sh)::

    PYTHONPATH=scripts python -m pytest -p peer_substitution PATH/TO/tests -k "..."
"""

from sb3_contrib import TRPO, MaskablePPO, RecurrentPPO
from stable_baselines3 import A2C, PPO

from sb3_safe import (
    SafeCnnLstmPolicy,
    SafeCnnPolicy,
    SafeMaskableCnnPolicy,
    SafeMaskableMlpPolicy,
    SafeMaskableMultiInputPolicy,
    SafeMlpLstmPolicy,
    SafeMlpPolicy,
    SafeMultiInputLstmPolicy,
    SafeMultiInputPolicy,
)

SAFE_ALIASES = {"MlpPolicy": SafeMlpPolicy, "CnnPolicy": SafeCnnPolicy, "MultiInputPolicy": SafeMultiInputPolicy}
for algo in (PPO, A2C, TRPO):
    algo.policy_aliases = dict(SAFE_ALIASES)
MaskablePPO.policy_aliases = {
    "MlpPolicy": SafeMaskableMlpPolicy,
    "CnnPolicy": SafeMaskableCnnPolicy,
    "MultiInputPolicy": SafeMaskableMultiInputPolicy,
}
RecurrentPPO.policy_aliases = {
    "MlpLstmPolicy": SafeMlpLstmPolicy,
    "CnnLstmPolicy": SafeCnnLstmPolicy,
    "MultiInputLstmPolicy": SafeMultiInputLstmPolicy,
}
