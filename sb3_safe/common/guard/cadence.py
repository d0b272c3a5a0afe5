"""
When the guard runs its full check of the model state, whose passing copy becomes the snapshot.

The full check copies every stored tensor, so it runs once per update phase (``train()``) rather than at every
env step: at the start of ``learn()``, at the start of each rollout that follows an update, and at the end of
``learn()`` if the last update is unchecked. Every optimizer step is checked in between by the cheap in-place check.
"""

from stable_baselines3.common.base_class import BaseAlgorithm


class FullCheckCadence:
    """Tell, from the model's update counter ``_n_updates``, whether an update ran since the last passed full check."""

    def __init__(self) -> None:
        self._checked_n_updates: int | None = None

    def due_at_rollout_start(self, model: BaseAlgorithm) -> bool:
        """
        Whether to check at the start of a rollout: after an update, and always for algorithms that do not count them.
        Off-policy algorithms start rollouts without training in between while learning has not started.

        :param model: the algorithm
        """
        n_updates = getattr(model, "_n_updates", None)
        return n_updates is None or n_updates != self._checked_n_updates

    def due_at_training_end(self, model: BaseAlgorithm) -> bool:
        """
        Whether to check at the end of ``learn()``: if an update ran after the last check.

        :param model: the algorithm
        """
        return getattr(model, "_n_updates", None) != self._checked_n_updates

    def passed(self, model: BaseAlgorithm) -> None:
        """
        Record a passed full check.

        :param model: the algorithm
        """
        self._checked_n_updates = getattr(model, "_n_updates", None)
