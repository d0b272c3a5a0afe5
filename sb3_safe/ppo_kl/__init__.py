from sb3_safe.ppo_kl.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_safe.ppo_kl.ppo_kl import KLAdaptivePPO, adapt_kl_beta

__all__ = ["CnnPolicy", "KLAdaptivePPO", "MlpPolicy", "MultiInputPolicy", "adapt_kl_beta"]
