"""
The stall watch: training that runs but no longer learns, which no non-finite parameter announces.

An update stalls when none of its optimizer steps ran (sb3-safe's guarded step skips a step whose loss or gradient
norm is not finite), when a loss the algorithm logged is not finite (stock SB3 steps anyway: its gradient clipping
turns an infinite norm into a zero step), or when the parameters did not change over it at a positive learning rate.
``patience`` updates in a row that stall are a stall: one event, whose message names what was measured (the
non-finite losses, the largest reward and return of the rollouts) and the fix.
"""

import math
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger

from sb3_safe.common.numerics import NonFiniteTensor

#: Updates in a row that stall before the guard reports a stall, by default
DEFAULT_STALL_UPDATES = 10
#: Model attribute counting the updates in a row that stalled; saved with the model, so that a run continued in short
#: learn() calls, saved and loaded in between, is watched as one
STALLED_UPDATES_ATTRIBUTE = "nonfinite_guard_stalled_updates"
#: Above this |return| a squared error (the default value loss) overflows float32
SQUARE_OVERFLOW = math.sqrt(float(np.finfo(np.float32).max))
#: The logged values whose finiteness is read (numpy's float32 is not a float)
_NUMBERS = (int, float, np.floating)


def logged_nonfinite_losses(logger: Logger) -> list[NonFiniteTensor]:
    """
    The losses the last ``train()`` logged (``train/...loss``) that are not finite.

    :param logger: the model's logger
    """
    # Read after every update: the finiteness test first, on plain numbers only (a logged value may be anything)
    return [
        NonFiniteTensor(name, int(math.isnan(value)), int(math.isinf(value)), 1)
        for name, value in logger.name_to_value.items()
        if isinstance(value, _NUMBERS) and not math.isfinite(value) and name.startswith("train/") and name.endswith("loss")
    ]


class StallWatch:
    """
    Counts the updates in a row that stalled (see the module's docstring).

    :param patience: updates in a row before a stall is reported; None: never
    """

    def __init__(self, patience: int | None = DEFAULT_STALL_UPDATES) -> None:
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
            raise ValueError(f"stall_updates must be None or an int >= 1 (updates), got {patience!r}")
        self.patience = patience
        #: optimizer steps taken since the rollout end
        self.steps = 0
        self._unchanged = 0
        self._updates_since_check = 0
        self._n_updates: int | None = None
        #: the largest |reward|, |return| and |observation| of the last rollouts, recorded while updates stall
        self.largest: tuple[float, float, float | None] | None = None

    def before_update(self, model: BaseAlgorithm) -> None:
        """
        At a rollout end: start counting the update's optimizer steps; while updates stall, record the rollout's
        largest reward, return and observation (for the message; free while training is healthy).

        :param model: the algorithm
        """
        self.steps = 0
        self._n_updates = getattr(model, "_n_updates", None)
        if not (getattr(model, STALLED_UPDATES_ATTRIBUTE, 0) or self._unchanged):
            return
        buffer: Any = getattr(model, "rollout_buffer", None)
        returns = getattr(buffer, "returns", None)
        if isinstance(returns, np.ndarray):
            with np.errstate(over="ignore", invalid="ignore"):
                self.largest = (
                    float(np.abs(buffer.rewards).max()),
                    float(np.abs(returns).max()),
                    _largest_abs_observation(getattr(buffer, "observations", None)),
                )

    def after_update(self, model: BaseAlgorithm, logger: Logger) -> str | None:
        """
        After an update: count it.

        :param model: the algorithm
        :param logger: its logger (the losses the update logged)
        :return: what stalled, if the updates in a row that did reach ``patience``; else None
        """
        if getattr(model, "_n_updates", None) == self._n_updates:
            return None  # no update ran (off-policy algorithms before learning starts)
        self._updates_since_check += 1
        if self.steps and not logged_nonfinite_losses(logger):
            if getattr(model, STALLED_UPDATES_ATTRIBUTE, 0):
                setattr(model, STALLED_UPDATES_ATTRIBUTE, 0)
            return None  # (after nearly every update)
        failing = getattr(model, STALLED_UPDATES_ATTRIBUTE, 0) + 1
        stalled = self.patience is not None and failing >= self.patience
        setattr(model, STALLED_UPDATES_ATTRIBUTE, 0 if stalled else failing)
        if not stalled:
            return None
        if self.steps == 0:
            return f"every optimizer step of the last {self.patience} updates was skipped (a non-finite loss or gradient norm)"
        return f"the loss was not finite in each of the last {self.patience} updates"

    def after_full_check(self, unchanged: bool, learning_rate: float) -> str | None:
        """
        After a passed full check following updates: count those over which the parameters did not change.

        :param unchanged: whether the parameters equal those of the previous full check
        :param learning_rate: the learning rate of the updates
        :return: what stalled, if the parameters stayed unchanged over ``patience`` updates; else None
        """
        updates, self._updates_since_check = self._updates_since_check, 0
        self._unchanged = self._unchanged + updates if unchanged and learning_rate > 0.0 and updates else 0
        if self.patience is None or self._unchanged < self.patience:
            return None
        count, self._unchanged = self._unchanged, 0
        return f"the parameters did not change over the last {count} updates at a learning rate of {learning_rate:.3g}"

    def measured(self) -> str:
        """What the rollouts of the stalled updates held, for the message."""
        if self.largest is None:
            return ""
        reward, returned, observation = self.largest
        # SB3 adds the discounted value of a truncated episode's last observation to its last reward
        text = (
            f"Largest |reward| in the last rollout (with the values bootstrapped at truncations): {reward:.3g}, "
            f"largest |return|: {returned:.3g}"
        )
        if observation is not None:
            text += f", largest |observation|: {observation:.3g}"
        if not returned <= SQUARE_OVERFLOW:
            return text + (
                f": squared, as a mean-squared value loss squares it, a return above {SQUARE_OVERFLOW:.2g} overflows float32."
            )
        return text + "."


def _largest_abs_observation(observations: Any) -> float | None:
    """The largest |value| of a rollout buffer's float observations (Dict spaces: over their keys), None if none."""
    arrays = list(observations.values()) if isinstance(observations, dict) else [observations]
    floats = [
        np.abs(array).max() for array in arrays if isinstance(array, np.ndarray) and array.size and array.dtype.kind == "f"
    ]
    return float(max(floats)) if floats else None
