"""Faults the tests inject into training, as a diverging update would make them."""

from typing import Any

import torch as th


class NaNAfterOptimizerStep:
    """Write a NaN into a weight right after a chosen optimizer step (counted from 1)."""

    def __init__(self, optimizer: th.optim.Optimizer, at: int, weight: th.Tensor):
        self.at, self.weight, self.calls = at, weight, 0
        # Registered before learn(), so it runs before the guard's hook, like a real optimizer step would
        optimizer.register_step_post_hook(self)

    def __call__(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.calls += 1
        if self.calls == self.at:
            with th.no_grad():
                self.weight.view(-1)[0] = float("nan")
