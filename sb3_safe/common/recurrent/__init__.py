"""Safe policies for sb3-contrib's ``RecurrentPPO`` (LSTM policies)."""

from sb3_safe.common.recurrent.policies import (
    SafeCnnLstmPolicy,
    SafeMlpLstmPolicy,
    SafeMultiInputLstmPolicy,
    SafeRecurrentActorCriticPolicy,
)

__all__ = ["SafeCnnLstmPolicy", "SafeMlpLstmPolicy", "SafeMultiInputLstmPolicy", "SafeRecurrentActorCriticPolicy"]
