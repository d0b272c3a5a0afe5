from sb3_safe.a2c_safe.a2c_safe import SafeA2C
from sb3_safe.a2c_safe.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["CnnPolicy", "MlpPolicy", "MultiInputPolicy", "SafeA2C"]
