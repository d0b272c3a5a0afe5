"""What the packaged zoo entries may and may not set about observation normalization."""

import ast
from typing import Any


def vec_normalize_normalizes_observations(entry: dict[str, Any]) -> bool:
    """Whether rl_zoo3 wraps the entry's env in a VecNormalize with ``norm_obs`` on (its default)."""
    normalize = entry.get("normalize", False)
    if isinstance(normalize, str):  # rl_zoo3 reads a string as VecNormalize's keyword arguments
        return bool(ast.literal_eval(normalize).get("norm_obs", True))
    return bool(normalize)


def assert_policy_default_observations(ours: dict[str, Any]) -> None:
    """
    Check that an entry leaves ``normalize_observations`` to the policy's default: False for the safe policies under a
    stock algorithm (SB3's computation: VecNormalize normalizes once where the zoo's ``normalize`` has it), ``"auto"``
    under KLAdaptivePPO and SafeA2C (which turn it off where VecNormalize normalizes the observations).
    """
    assert "normalize_observations" not in str(ours.get("policy_kwargs", ""))
