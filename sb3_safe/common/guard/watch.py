"""
What the guard watches: the tensors ``model.save()`` stores, under their names, the VecNormalize statistics, the
first observation of ``learn()``, each env step's data (terminal observations included) and the rollout buffer; the
optimizer hooks it listens on; and the cheap checks of all of these.
"""

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.save_util import recursive_getattr
from torch.utils.hooks import RemovableHandle

from sb3_safe.common.numerics import ArrayFiniteCheck, GradientNorm, TensorFiniteCheck
from sb3_safe.common.observation_norm import ObservationNormalizer

#: A batch of observations, or of dict observations
Observation = np.ndarray | dict[str, np.ndarray]
#: The hooks' signature, as ``register_step_pre_hook`` / ``register_step_post_hook`` call them
OptimizerHook = Callable[[th.optim.Optimizer, Any, Any], None]
#: The rollout buffer arrays that the end-of-rollout check reads, where the buffer has them
ROLLOUT_BUFFER_ARRAYS = ("rewards", "values", "returns", "advantages", "log_probs")
#: Those that imply the others, as SB3's buffers compute them (GAE, in every on-policy algorithm of SB3 and
#: sb3-contrib): returns = advantages + values, each advantage from the rewards, values and bootstrap values after it,
#: and a non-finite operand stays non-finite in sums and products; the log-probabilities come from the policy
ROLLOUT_BUFFER_DERIVED = ("returns", "log_probs")
_NO_ACTIONS = np.zeros(0, dtype=np.int64)


def _arrays(observation: Observation) -> list[np.ndarray]:
    """The arrays of an observation (one, or one per key of a dict observation)."""
    if isinstance(observation, dict):
        return [np.asarray(value) for value in observation.values()]
    return [np.asarray(observation)]


class WatchedModel:
    """
    Every tensor that ``model.save()`` would store (networks, target networks, torch variables such as SAC's
    ``log_ent_coef``, optimizer state such as Adam moments), named as in the file, the optimizers and VecNormalize.

    Resolved once, at the start of ``learn()``: the set of tensors then only changes through lazily created
    optimizer state, which :meth:`signature` tells.

    :param model: the algorithm
    """

    def __init__(self, model: BaseAlgorithm) -> None:
        self.modules: list[tuple[str, th.nn.Module]] = []
        self.variables: list[tuple[str, th.Tensor]] = []
        self.optimizers: list[tuple[str, th.optim.Optimizer]] = []
        state_dict_names, variable_names = model._get_torch_save_params()
        for name in state_dict_names:
            obj = recursive_getattr(model, name)
            if isinstance(obj, th.optim.Optimizer):
                self.optimizers.append((name, obj))
            elif isinstance(obj, th.nn.Module):
                self.modules.append((name, obj))
        for name in variable_names:
            value = recursive_getattr(model, name)
            if isinstance(value, th.Tensor):
                self.variables.append((name, value))
        #: the name of each parameter (and torch variable), as ``<module>.<key>``
        self.param_names: dict[th.Tensor, str] = {}
        for module_name, module in self.modules:
            for key, param in module.named_parameters():
                self.param_names.setdefault(param, f"{module_name}.{key}")
        for name, value in self.variables:
            self.param_names.setdefault(value, name)
        self.log_std_names = [name for name in self.param_names.values() if name.endswith(".log_std")]
        #: the names of the parameters (and torch variables)
        self.parameter_names = set(self.param_names.values())
        self.gradient_norm = GradientNorm(self.param_names)
        #: the VecNormalize wrapper of the training env, or None
        self.vec_normalize: Any = model.get_vec_normalize_env()
        #: the safe policies' observation normalizers: they keep a rollout's observations outside their tensors
        self.observation_normalizers = [
            normalizer
            for _, module in self.modules
            for normalizer in module.modules()
            if isinstance(normalizer, ObservationNormalizer)
        ]
        # The per-step check of the parameters each optimizer updates (read in place: no snapshot is needed)
        self._step_checks = {
            id(optimizer): (name, TensorFiniteCheck(self.parameters(optimizer))) for name, optimizer in self.optimizers
        }
        # What forward passes read: every module parameter and buffer, and the torch variables (read in place)
        self._live_check = TensorFiniteCheck(tensor for _, tensor in self.live_tensors())
        self._all_finite = ArrayFiniteCheck()

    def resolves_to_the_same(self, model: BaseAlgorithm) -> bool:
        """
        Whether ``model``'s modules, optimizers and torch variables are still the objects resolved at construction
        (nothing replaced since, e.g. by assigning a new policy): then this description can be reused.

        :param model: the algorithm
        """
        resolved = (*self.modules, *self.optimizers, *self.variables)
        return all(recursive_getattr(model, name) is obj for name, obj in resolved)

    # ----- names -----

    def name_of(self, param: th.Tensor) -> str:
        """
        :param param: a parameter or torch variable
        :return: its name, or ``"?"`` for a tensor that ``model.save()`` does not store
        """
        return self.param_names.get(param, "?")

    def optimizer_name(self, optimizer: th.optim.Optimizer) -> str:
        """:param optimizer: one of :attr:`optimizers`"""
        return self._step_checks[id(optimizer)][0]

    @staticmethod
    def parameters(optimizer: th.optim.Optimizer) -> list[th.Tensor]:
        """:param optimizer: an optimizer; its parameters, in the order of its parameter groups"""
        return [p for group in optimizer.param_groups for p in group["params"]]

    def optimizer_state(
        self, optimizer_name: str, optimizer: th.optim.Optimizer, params: Iterable[th.Tensor]
    ) -> list[tuple[str, th.Tensor]]:
        """
        The state tensors of ``optimizer`` for ``params``, named like ``policy.optimizer.state[policy.x.weight].exp_avg``.

        :param optimizer_name: the optimizer's name
        :param optimizer: the optimizer
        :param params: the parameters whose state to name (those without state have none)
        """
        return [
            (f"{optimizer_name}.state[{self.name_of(param)}].{key}", value)
            for param in params
            for key, value in optimizer.state.get(param, {}).items()
            if isinstance(value, th.Tensor)
        ]

    def state_tensors(self) -> list[tuple[str, th.Tensor]]:
        """Every tensor ``model.save()`` stores, named: module states, torch variables, then optimizer state."""
        named: list[tuple[str, th.Tensor]] = []
        for module_name, module in self.modules:
            named += [(f"{module_name}.{key}", tensor) for key, tensor in module.state_dict(keep_vars=True).items()]
        named += self.variables
        for optimizer_name, optimizer in self.optimizers:
            named += self.optimizer_state(optimizer_name, optimizer, optimizer.state)
        return named

    def live_tensors(self) -> list[tuple[str, th.Tensor]]:
        """What forward passes read, named: every module parameter and buffer, and the torch variables."""
        named = [
            (f"{name}.{key}", tensor)
            for name, module in self.modules
            for key, tensor in module.state_dict(keep_vars=True).items()
        ]
        return named + self.variables

    def signature(self) -> tuple[tuple[int, int], ...]:
        """What changes when the set of state tensors does."""
        # Optimizer state is created lazily at the first step: a new entry changes the set of tensors to watch
        return tuple((id(optimizer.state), len(optimizer.state)) for _, optimizer in self.optimizers)

    def vec_normalize_arrays(self) -> list[tuple[str, np.ndarray]]:
        """The VecNormalize statistics, named (a VecNormalize wrapper must be present)."""
        venv = self.vec_normalize
        obs_rms = venv.obs_rms if isinstance(venv.obs_rms, dict) else {"": venv.obs_rms}
        arrays = []
        for key, rms in obs_rms.items():
            prefix = f"VecNormalize obs_rms[{key!r}]" if key else "VecNormalize obs_rms"
            arrays += [(f"{prefix}.mean", rms.mean), (f"{prefix}.var", rms.var)]
        arrays += [
            ("VecNormalize ret_rms.mean", np.asarray(venv.ret_rms.mean)),
            ("VecNormalize ret_rms.var", np.asarray(venv.ret_rms.var)),
            ("VecNormalize returns", venv.returns),
        ]
        return arrays

    @staticmethod
    def rollout_buffer_arrays(buffer: Any) -> list[tuple[str, np.ndarray]]:
        """:param buffer: an on-policy rollout buffer; its arrays of :data:`ROLLOUT_BUFFER_ARRAYS`, named"""
        arrays = [(name, getattr(buffer, name, None)) for name in ROLLOUT_BUFFER_ARRAYS]
        return [(f"rollout buffer {name}", array) for name, array in arrays if isinstance(array, np.ndarray)]

    @staticmethod
    def terminal_observations(infos: Sequence[dict[str, Any]]) -> list[tuple[int, Observation]]:
        """
        The final observations of the episodes that ended at an env step, which ``new_obs`` does not hold (the VecEnv
        reset those envs): SB3 stores them as ``next_obs`` in replay buffers and bootstraps from them on truncation.

        :param infos: the step's ``infos`` (a VecEnv puts ``terminal_observation`` there only where an episode ended)
        :return: (env index, terminal observation) for every env whose episode ended with one
        """
        return [(i, info["terminal_observation"]) for i, info in enumerate(infos) if "terminal_observation" in info]

    @staticmethod
    def step_actions(locals_: dict[str, Any]) -> np.ndarray:
        """:param locals_: the locals of ``collect_rollouts`` at an env step; the actions sent to the env"""
        # Every SB3 / sb3-contrib algorithm names them `actions` in collect_rollouts; a custom one might not
        actions = locals_.get("actions")
        return actions if isinstance(actions, np.ndarray) else _NO_ACTIONS

    # ----- hook points -----

    def attach_hooks(self, after_step: OptimizerHook, before_step: OptimizerHook | None = None) -> list[RemovableHandle]:
        """
        Call ``after_step`` after every step of every optimizer, and ``before_step`` (if given) before it.

        :param after_step: a step post-hook
        :param before_step: a step pre-hook, or None
        :return: the handles that remove the hooks
        """
        handles = []
        for _, optimizer in self.optimizers:
            handles.append(optimizer.register_step_post_hook(after_step))
            if before_step is not None:
                handles.append(optimizer.register_step_pre_hook(before_step))
        return handles

    # ----- cheap checks (one reduction each; see sb3_safe.common.numerics) -----

    def parameters_are_finite(self, optimizer: th.optim.Optimizer, check_storage: bool = True) -> bool:
        """
        :param optimizer: one of :attr:`optimizers`; whether the parameters it updates are finite
        :param check_storage: also check that no parameter was given new storage since the last call (an optimizer
            step updates in place: within one ``train()`` only the first step needs it)
        """
        return self._step_checks[id(optimizer)][1](check_storage)

    def gradients_are_finite(self, optimizer: th.optim.Optimizer) -> bool:
        """:param optimizer: an optimizer; whether the gradients of its parameters are finite (True without any)"""
        grads = [p.grad for p in self.parameters(optimizer) if p.grad is not None]
        return not grads or math.isfinite(th.nn.utils.get_total_norm(grads, norm_type=math.inf).item())

    def vec_normalize_is_finite(self) -> bool:
        """Whether the VecNormalize statistics are finite (True without VecNormalize)."""
        return self.vec_normalize is None or self._all_finite(*(array for _, array in self.vec_normalize_arrays()))

    def model_is_finite(self) -> bool:
        """Whether what forward passes read is finite (:meth:`live_tensors`, read in place, one reduction each)."""
        return self._live_check()

    def observation_is_finite(self, observation: Observation) -> bool:
        """:param observation: a batch of observations, or of dict observations"""
        return self._all_finite(*_arrays(observation))

    def step_is_finite(
        self,
        new_obs: Observation,
        rewards: np.ndarray,
        actions: np.ndarray,
        terminal: Sequence[tuple[int, Observation]] = (),
    ) -> bool:
        """
        Whether an env step's data is finite, with the VecNormalize variances: one call for all of it.

        :param new_obs: the (normalized) observations the step returned
        :param rewards: the (normalized) rewards
        :param actions: the actions sent to the env (discrete actions are integers: the check skips them)
        :param terminal: the step's :meth:`terminal_observations` (normalized under VecNormalize, like ``new_obs``)
        """
        observations = list(new_obs.values()) if isinstance(new_obs, dict) else [new_obs]
        for _, obs in terminal:
            observations += _arrays(obs)
        venv = self.vec_normalize
        if venv is None:
            return self._all_finite(*observations, rewards, actions)
        # Of VecNormalize only the variances: a non-finite mean or return reaches the normalized data checked
        # here (or, through ret_rms.update, the reward variance), but an infinite variance normalizes to zeros
        obs_rms = venv.obs_rms.values() if isinstance(venv.obs_rms, dict) else (venv.obs_rms,)
        variances = (rms.var for rms in obs_rms)
        return math.isfinite(venv.ret_rms.var) and self._all_finite(*observations, rewards, actions, *variances)

    def rollout_buffer_is_finite(self, buffer: Any, derived_only: bool = False) -> bool:
        """
        :param buffer: an on-policy rollout buffer; whether its arrays of :data:`ROLLOUT_BUFFER_ARRAYS` are finite
        :param derived_only: read only :data:`ROLLOUT_BUFFER_DERIVED`, which imply the others where nothing but SB3's
            own code wrote the buffer (no other callback ran)
        """
        names = ROLLOUT_BUFFER_DERIVED if derived_only else ROLLOUT_BUFFER_ARRAYS
        arrays = [getattr(buffer, name, None) for name in names]
        return self._all_finite(*(array for array in arrays if isinstance(array, np.ndarray)))
