"""Callbacks the tests read training through."""

from stable_baselines3.common.callbacks import BaseCallback


class RecordLearningRate(BaseCallback):
    """
    The optimizer's learning rate after each update (what the update used), appended to ``rates``; a new ``learn()``
    of a model that has updated records its last rate again first.

    :param rates: the list to append to
    """

    def __init__(self, rates: list[float]) -> None:
        super().__init__()
        self.rates = rates

    def _on_step(self) -> bool:
        return True

    def _on_rollout_start(self) -> None:
        if self.model._n_updates:
            self.rates.append(self.model.policy.optimizer.param_groups[0]["lr"])

    def _on_training_end(self) -> None:
        self._on_rollout_start()
