"""
The update-step logic every sb3-safe algorithm shares: guarded optimizer steps, safe advantage scaling, and writing
the statistics of the last update.
"""

import warnings
from collections.abc import Iterable

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm

from sb3_safe.common.numerics import is_finite


class SkippedUpdateWarning(UserWarning):
    """An update phase of a safe algorithm skipped every gradient step: the run does not train."""


class GuardedOptimizerStep:
    """
    One optimizer step that is skipped, leaving parameters and optimizer state untouched, when the loss or
    the gradient norm is not finite.

    Usage in a ``train()`` loop, in place of ``zero_grad / backward / clip_grad_norm_ / step``::

        grad_norm = self.guarded_step(self.policy.optimizer, loss, self.policy.parameters(), self.max_grad_norm)

    :param name: used in nothing but ``repr``, to tell several guards apart
    """

    # Class attributes: instances pickled with checkpoints from before them have neither
    #: the counts (taken, skipped) at the start of the current update (:meth:`start_update`)
    _update_start: tuple[int, int] = (0, 0)
    #: whether the current run of updates without a step taken was named (a warning: once per run)
    _named = False

    def __init__(self, name: str = "policy"):
        self.name = name
        #: skipped steps since construction
        self.n_skipped = 0
        #: steps taken since construction
        self.n_taken = 0

    def __call__(
        self,
        optimizer: th.optim.Optimizer,
        loss: th.Tensor,
        parameters: Iterable[th.nn.Parameter],
        max_grad_norm: float | None,
    ) -> th.Tensor | None:
        """
        Backpropagate ``loss``, clip gradients to ``max_grad_norm`` and step, unless something is non-finite.

        :param optimizer: the optimizer to step
        :param loss: scalar loss
        :param parameters: the parameters whose gradients are clipped (those of ``optimizer``)
        :param max_grad_norm: clip the global L2 norm of the gradients to this value; None: no clipping
        :return: the gradient norm before clipping, or None if the step was skipped
        """
        optimizer.zero_grad()
        if not is_finite(loss):
            self._skip(optimizer)
            return None
        loss.backward()
        grad_norm = th.nn.utils.clip_grad_norm_(list(parameters), max_grad_norm if max_grad_norm is not None else float("inf"))
        # An overflowing L2 norm (gradients ~1e19 and above) counts as non-finite too: such a step is no update
        if not is_finite(grad_norm):
            self._skip(optimizer)
            return None
        optimizer.step()
        self.n_taken += 1
        return grad_norm

    def start_update(self) -> None:
        """Mark the start of an update phase (``train()``), for :meth:`name_an_update_without_steps`."""
        self._update_start = (self.n_taken, self.n_skipped)

    def name_an_update_without_steps(self, algorithm: str) -> None:
        """
        Warn when the update phase since :meth:`start_update` skipped every step it tried: the parameters did not
        change, and without a warning a run that no longer trains looks like one that does. Once per run of such
        updates (a step taken starts a new run).

        :param algorithm: the algorithm's name, for the message
        """
        taken, skipped = self.n_taken - self._update_start[0], self.n_skipped - self._update_start[1]
        if taken:
            self._named = False
        elif skipped and not self._named:
            self._named = True
            warnings.warn(
                f"{algorithm} skipped every gradient step of this update ({skipped} of {skipped}: the loss or the "
                f"gradient norm was not finite; {self.n_skipped} skipped so far, train/skipped_updates): the "
                "parameters did not change. Likely causes: rewards or returns beyond float32's range (rewards near "
                "1e38 overflow the returns), a learning rate far too high. NonFiniteGuardCallback names the first "
                "non-finite value",
                SkippedUpdateWarning,
                stacklevel=3,
            )

    def _skip(self, optimizer: th.optim.Optimizer) -> None:
        # No stale (possibly NaN) gradients may reach a later step
        optimizer.zero_grad()
        self.n_skipped += 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, taken={self.n_taken}, skipped={self.n_skipped})"


def normalize_advantages(advantages: th.Tensor, epsilon: float = 1e-8) -> th.Tensor:
    """
    Scale advantages to zero mean and unit variance, safe for a batch of one (returned unchanged, as SB3's
    PPO does) and for zero variance (the centered advantages, all zero, are returned).

    :param advantages: advantages of a minibatch
    :param epsilon: added to the standard deviation
    """
    if advantages.numel() <= 1:
        return advantages
    centered = advantages - advantages.mean()
    return centered / (centered.std() + epsilon)


def read_from_zero_past_the_end(model: BaseAlgorithm) -> None:
    """
    Clamp the model's training progress at 0, from ``_update_current_progress_remaining``: SB3's goes below 0 when the
    last rollout ends past the budget (not a multiple of the rollout), where a linear schedule turns negative (a
    learning rate that climbs the loss, an inverted clip range); every schedule is read at 0 there instead.

    :param model: the algorithm, its progress just updated
    """
    model._current_progress_remaining = max(0.0, model._current_progress_remaining)


def write_last_update_statistics(model: BaseAlgorithm, log_interval: int | None) -> None:
    """
    Write what the last ``train()`` recorded (``train/kl_beta``, ``train/skipped_updates``, ...) when ``learn()`` ends.

    SB3 writes the logger before each ``train()``, so the statistics of the last update are never written, and a
    run with a single update writes no ``train/`` key at all. Nothing is written with ``log_interval=None`` (no
    logging asked for) or when nothing is pending. The values stay in ``model.logger.name_to_value`` afterwards, as
    without this write (code reads them there after ``learn()``); a resumed ``learn()`` writes them once more at its
    first logging step, where SB3 alone would write them for the first time.

    :param model: the algorithm whose ``learn()`` just returned
    :param log_interval: the ``log_interval`` that ``learn()`` was given
    """
    logger = model.logger
    if log_interval is None or not logger.name_to_value:
        return
    values, counts, excluded = dict(logger.name_to_value), dict(logger.name_to_count), dict(logger.name_to_excluded)
    logger.dump(model.num_timesteps)
    logger.name_to_value.update(values)
    logger.name_to_count.update(counts)
    logger.name_to_excluded.update(excluded)
