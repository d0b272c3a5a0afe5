"""
pytest plugin: run Stable-Baselines3's own test suite with sb3-safe's policies substituted for PPO's and A2C's
policy aliases ("MlpPolicy", "CnnPolicy", "MultiInputPolicy"), so every test that builds PPO or A2C by alias
exercises the safe policies. Usage (an SB3 checkout's tests/ in $SB3_TESTS; see scripts/peer_tests.sh)::

    PYTHONPATH=scripts python -m pytest -p peer_substitution $SB3_TESTS -k "PPO or A2C or ppo or a2c"
"""

from stable_baselines3 import A2C, PPO

from sb3_safe import SafeCnnPolicy, SafeMlpPolicy, SafeMultiInputPolicy

SAFE_ALIASES = {"MlpPolicy": SafeMlpPolicy, "CnnPolicy": SafeCnnPolicy, "MultiInputPolicy": SafeMultiInputPolicy}
for algo in (PPO, A2C):
    algo.policy_aliases = dict(SAFE_ALIASES)
