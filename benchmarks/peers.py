"""
Learning-rate controllers of other libraries, reimplemented on SB3 for the robustness map: the peers sb3-safe's
:class:`~sb3_safe.KLAdaptiveLRCallback` is compared with in the same run.

- :class:`SBXAdaptiveLR`: the rule of SBX's ``KLAdaptiveLR`` (shared with rsl_rl, rl_games and skrl: divide the
  learning rate by 1.5 when the KL is above 2x the target, multiply it by 1.5 below half, clip to [1e-5, 1e-2]), as
  SBX's PPO applies it: after every minibatch, on the approximate KL ``mean((ratio - 1) - log(ratio))`` of that
  minibatch computed before its own gradient step, and kept across updates.
- SB3's own ``target_kl`` (early stopping of the epochs) needs no code here: it is a PPO argument.
"""

import math
from collections.abc import Iterator
from typing import Any

import torch as th

#: rsl_rl's and SBX's defaults
SBX_BOUNDS = (1e-5, 1e-2)
SBX_MARGIN = 2.0
SBX_FACTOR = 1.5


class SBXLearningRate:
    """A schedule that returns the controller's current learning rate (so SB3's per-update reset keeps it)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, progress_remaining: float) -> float:
        return self.value


class SBXAdaptiveLR:
    """
    Attach SBX's per-minibatch rule to an SB3 PPO-style model (PPO, KLAdaptivePPO): each minibatch the train loop
    reads from the rollout buffer is remembered, the log-probabilities ``evaluate_actions`` computes on it are
    remembered, and before the optimizer's step the minibatch's approximate KL (from the ratio before that step)
    updates the learning rate, which that very step then uses, as in SBX.

    :param model: the model (``learn()`` it afterwards as usual)
    :param target_kl: the KL aimed at (SBX's ``target_kl`` of the adaptive learning rate)
    """

    def __init__(self, model: Any, target_kl: float = 0.01) -> None:
        self.model, self.target_kl = model, target_kl
        self.learning_rate = SBXLearningRate(float(model.lr_schedule(1.0)))
        model.lr_schedule = self.learning_rate
        self._old_log_prob: th.Tensor | None = None
        self._log_prob: th.Tensor | None = None
        self.updates = 0
        buffer_get = model.rollout_buffer.get
        evaluate_actions = model.policy.evaluate_actions

        def get(batch_size: int | None = None) -> Iterator[Any]:
            for data in buffer_get(batch_size):
                self._old_log_prob = data.old_log_prob
                yield data

        def evaluate(*args: Any, **kwargs: Any) -> Any:
            values, log_prob, entropy = evaluate_actions(*args, **kwargs)
            self._log_prob = log_prob.detach()
            return values, log_prob, entropy

        model.rollout_buffer.get = get
        model.policy.evaluate_actions = evaluate
        model.policy.optimizer.register_step_pre_hook(self._before_step)

    def _before_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._log_prob is None or self._old_log_prob is None:
            return
        log_ratio = self._log_prob - self._old_log_prob
        approx_kl = ((th.exp(log_ratio) - 1) - log_ratio).mean().item()
        low, high = SBX_BOUNDS
        value = self.learning_rate.value
        if approx_kl > self.target_kl * SBX_MARGIN:
            value /= SBX_FACTOR
        elif approx_kl < self.target_kl / SBX_MARGIN:
            value *= SBX_FACTOR
        self.learning_rate.value = min(max(value, low), high) if math.isfinite(approx_kl) else value
        for group in optimizer.param_groups:
            group["lr"] = self.learning_rate.value
        self.updates += 1
        self._log_prob = None
