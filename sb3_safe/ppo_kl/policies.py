"""Policy aliases of :class:`~sb3_safe.ppo_kl.KLAdaptivePPO`: the safe policies of :mod:`sb3_safe.common.policies`."""

from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy

MlpPolicy = SafeActorCriticPolicy
CnnPolicy = SafeCnnPolicy
MultiInputPolicy = SafeMultiInputPolicy
