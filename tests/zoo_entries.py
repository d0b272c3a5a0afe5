"""How the packaged zoo entries for the stock algorithms may differ from the rl-zoo entries they cite."""

import ast
import re
from typing import Any

#: What an entry adds to the policy's keyword arguments where VecNormalize already normalizes the observations
OBSERVATION_NORMALIZATION_OFF = "normalize_observations=False,"


def vec_normalize_normalizes_observations(entry: dict[str, Any]) -> bool:
    """Whether rl_zoo3 wraps the entry's env in a VecNormalize with ``norm_obs`` on (its default)."""
    normalize = entry.get("normalize", False)
    if isinstance(normalize, str):  # rl_zoo3 reads a string as VecNormalize's keyword arguments
        return bool(ast.literal_eval(normalize).get("norm_obs", True))
    return bool(normalize)


def pop_observation_normalization_off(ours: dict[str, Any], zoo: dict[str, Any]) -> None:
    """
    Check that ``ours`` turns the safe policy's own observation normalization off exactly where the zoo entry
    normalizes observations in VecNormalize (twice costs time and changes nothing), and take that setting out of
    ``ours`` so that what is left compares equal to the zoo entry (``policy_kwargs`` up to whitespace).
    """
    policy_kwargs = ours.get("policy_kwargs", "")
    if not vec_normalize_normalizes_observations(zoo):
        assert "normalize_observations" not in policy_kwargs
        return
    rest = re.sub(r"\s", "", policy_kwargs.replace(OBSERVATION_NORMALIZATION_OFF, "", 1))
    if "policy_kwargs" in zoo:
        assert rest == re.sub(r"\s", "", zoo["policy_kwargs"])
        ours["policy_kwargs"] = zoo["policy_kwargs"]
    else:
        assert re.sub(r"\s", "", policy_kwargs) == "dict(normalize_observations=False)"
        del ours["policy_kwargs"]
