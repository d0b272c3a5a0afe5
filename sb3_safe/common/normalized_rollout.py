"""
A rollout normalized once per update instead of once per minibatch.

Within an update the observation statistics and the return statistics are fixed (they change when a rollout is folded
in, and at a rollback of the guard), so every minibatch of every epoch would normalize the same values again: a few
small tensor operations each, which at rl-zoo's CartPole-v1 settings (20 epochs) are several percent of training.
:class:`NormalizedRollout` normalizes the rollout buffer's observations, value targets and advantages once, with the
very operations the policy and :class:`~sb3_safe.common.value_norm.PopArtValueHead` apply (element-wise, so the
results are the same to the bit), lets the policy take the normalized observations unchanged and read normalized
values, and gives the buffer its raw arrays back when the update ends. A statistics change inside the update (a
rollback restores them) normalizes the rollout again from the raw arrays before the next minibatch.
"""

import contextlib
from types import TracebackType
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_safe.common.observation_norm import ObservationNormalizer
from sb3_safe.common.value_norm import normalized_values, value_head


class NormalizedRollout:
    """
    Inside (``with``), the buffer's arrays are in the units the update's losses use, and the policy reads them so.

    :param policy: the policy being updated (its ``observation_normalizer`` and value head, where it has them)
    :param buffer: the full rollout buffer (Box observations are normalized; a dict's are left to the policy)
    """

    def __init__(self, policy: ActorCriticPolicy, buffer: RolloutBuffer) -> None:
        self.policy = policy
        self.buffer = buffer
        self.head = value_head(policy)
        normalizer = (
            getattr(policy, "observation_normalizer", None) if getattr(policy, "normalize_observations", False) else None
        )
        # A dict of observations is not normalized in the policy (only a Box is)
        box_observations = isinstance(buffer.observations, np.ndarray)
        self.normalizer = normalizer if isinstance(normalizer, ObservationNormalizer) and box_observations else None
        #: the raw arrays by name, in the buffer's current layout
        self._raw: dict[str, np.ndarray] = {}
        #: what the arrays were normalized with (the statistics' derived transforms): compared before each minibatch
        self._normalized_with: tuple[Any, ...] = ()
        self._flattened = buffer.generator_ready
        self._switches = contextlib.ExitStack()

    def __enter__(self) -> "NormalizedRollout":
        names = (["observations"] if self.normalizer is not None else []) + (
            ["returns", "values", "advantages"] if self.head is not None else []
        )
        self._raw = {name: getattr(self.buffer, name) for name in names}
        if self._raw:
            self._normalize()
        if self.normalizer is not None:
            self.normalizer.passthrough = True
            self._switches.callback(setattr, self.normalizer, "passthrough", False)
        self._switches.enter_context(normalized_values(self.policy))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._switches.close()
        self._follow_layout()
        for name, raw in self._raw.items():
            setattr(self.buffer, name, raw)

    def refresh(self) -> None:
        """Normalize the rollout again where the statistics changed since (a rollback restored them)."""
        if self._raw and any(now is not then for now, then in zip(self._transforms(), self._normalized_with, strict=True)):
            self._normalize()

    def _transforms(self) -> tuple[Any, ...]:
        # Each is derived once per change of its statistics: the same object until they change
        return (
            None if self.normalizer is None else self.normalizer.shift_and_scale(),
            None if self.head is None else self.head.output_scale(),
        )

    def _follow_layout(self) -> None:
        """The buffer's first ``get`` flattens its arrays (steps x envs into one axis): the raw ones follow."""
        if self.buffer.generator_ready and not self._flattened:
            self._raw = {name: self.buffer.swap_and_flatten(raw) for name, raw in self._raw.items()}
            self._flattened = True

    @th.no_grad()
    def _normalize(self) -> None:
        self._follow_layout()
        self._normalized_with = self._transforms()
        device = self.policy.device
        raw = {name: th.from_numpy(array).to(device) for name, array in self._raw.items()}
        normalized: dict[str, th.Tensor] = {}
        if self.normalizer is not None:
            normalized["observations"] = self.normalizer.normalize(raw["observations"])
        if self.head is not None:
            normalized["returns"] = self.head.normalize(raw["returns"])
            normalized["values"] = self.head.normalize(raw["values"])
            normalized["advantages"] = self.head.scale_advantages(raw["advantages"])
        for name, tensor in normalized.items():
            setattr(self.buffer, name, tensor.cpu().numpy())
