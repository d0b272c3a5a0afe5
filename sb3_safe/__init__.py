"""sb3-safe: numerically safe on-policy reinforcement learning for Stable-Baselines3."""

from pathlib import Path

from sb3_safe.a2c_safe import SafeA2C
from sb3_safe.common.callbacks import (
    KLAdaptiveLRCallback,
    NonFiniteGuardCallback,
    NonFiniteGuardWarning,
    NumericsMonitorCallback,
)
from sb3_safe.common.exploration import ExplorationWarning
from sb3_safe.common.maskable import (
    SafeMaskableActorCriticPolicy,
    SafeMaskableCnnPolicy,
    SafeMaskableMlpPolicy,
    SafeMaskableMultiInputPolicy,
)
from sb3_safe.common.numerics import NonFiniteError, TrainingStalledError
from sb3_safe.common.policies import (
    PolicyAlgorithmMismatchError,
    SafeActorCriticPolicy,
    SafeCnnPolicy,
    SafeMlpPolicy,
    SafeMultiInputPolicy,
)
from sb3_safe.common.recurrent import (
    SafeCnnLstmPolicy,
    SafeMlpLstmPolicy,
    SafeMultiInputLstmPolicy,
    SafeRecurrentActorCriticPolicy,
)
from sb3_safe.loading import RefusedFileError, load, load_replay_buffer, load_vec_normalize
from sb3_safe.ppo_kl import KLAdaptivePPO

__version__ = (Path(__file__).parent / "version.txt").read_text(encoding="utf-8").strip()

__all__ = [
    "ExplorationWarning",
    "KLAdaptiveLRCallback",
    "KLAdaptivePPO",
    "NonFiniteError",
    "NonFiniteGuardCallback",
    "NonFiniteGuardWarning",
    "NumericsMonitorCallback",
    "PolicyAlgorithmMismatchError",
    "RefusedFileError",
    "SafeA2C",
    "SafeActorCriticPolicy",
    "SafeCnnLstmPolicy",
    "SafeCnnPolicy",
    "SafeMaskableActorCriticPolicy",
    "SafeMaskableCnnPolicy",
    "SafeMaskableMlpPolicy",
    "SafeMaskableMultiInputPolicy",
    "SafeMlpLstmPolicy",
    "SafeMlpPolicy",
    "SafeMultiInputLstmPolicy",
    "SafeMultiInputPolicy",
    "SafeRecurrentActorCriticPolicy",
    "TrainingStalledError",
    "__version__",
    "load",
    "load_replay_buffer",
    "load_vec_normalize",
]
