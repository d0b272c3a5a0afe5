# This file is here just to define MlpPolicy/CnnPolicy/MultiInputPolicy that work for SafeA2C
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy

MlpPolicy = SafeActorCriticPolicy
CnnPolicy = SafeCnnPolicy
MultiInputPolicy = SafeMultiInputPolicy
