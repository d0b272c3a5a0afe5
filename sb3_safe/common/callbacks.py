"""Callbacks that watch the numerics of any SB3 model: the non-finite guard and a numerics monitor."""

import copy
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import WARN
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.save_util import recursive_getattr
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import FloatSchedule
from torch.utils.hooks import RemovableHandle

from sb3_safe.common.exploration import DEFAULT_PATIENCE, ExplorationWatch
from sb3_safe.common.numerics import (
    ArrayFiniteCheck,
    FlatCopy,
    GradientNorm,
    NonFiniteError,
    NonFiniteTensor,
    TensorFiniteCheck,
    find_nonfinite,
)

#: What the guard does on a non-finite value
OnNonFinite = Literal["raise", "stop", "rollback"]
ON_NONFINITE_MODES: tuple[OnNonFinite, ...] = get_args(OnNonFinite)
#: Model attribute counting the guard's rollbacks; saved with the model, so max_rollbacks holds across resumed runs
ROLLBACKS_ATTRIBUTE = "nonfinite_guard_rollbacks"
REPORT_FILENAME = "nonfinite_guard.jsonl"


class NonFiniteGuardWarning(RuntimeWarning):
    """Issued by :class:`NonFiniteGuardCallback` for every stop and rollback (and before raising), with its message."""


# Where a non-finite value came from. Only the model state (parameters, optimizer state, gradients) and the
# normalization statistics can be repaired by restoring a snapshot; data from the environment, or collected
# with a policy that already misbehaved, cannot.
MODEL, NORMALIZATION, ENVIRONMENT, ROLLOUT = "model", "normalization", "environment", "rollout"
_RESTORABLE = (MODEL, NORMALIZATION)
_ROLLOUT_BUFFER_ARRAYS = ("rewards", "values", "returns", "advantages", "log_probs")
_NO_ACTIONS = np.zeros(0, dtype=np.int64)

_CAUSES = {
    MODEL: (
        "Likely causes: a learning rate too high for the scale of the loss (lower `learning_rate`, or pass "
        "on_nonfinite='rollback', which lowers it on each failure); rewards of large magnitude (scale them or wrap "
        "the env in VecNormalize); an unbounded log-std (use a bounded policy such as sb3_safe's SafeMlpPolicy); "
        "no gradient clipping (set `max_grad_norm`)."
    ),
    NORMALIZATION: (
        "Likely causes: observations or rewards of extreme magnitude overflowed the VecNormalize running "
        "statistics. Check the scale of the environment's outputs, clip them before VecNormalize."
    ),
    ENVIRONMENT: (
        "The environment produced it: check its step() and reset() (division by zero, simulator blow-up, "
        "unbounded reward), and wrap it in VecCheckNan(raise_exception=True) to find the call. "
        "Rollback cannot repair environment data."
    ),
    ROLLOUT: (
        "The policy or value function produced it from finite parameters: a log-std so large that the std "
        "overflows (or so small that log-probs reach -inf), or a diverging value function. Bound the log-std "
        "(sb3_safe's SafeMlpPolicy), lower the learning rate, scale the rewards. "
        "Rollback cannot repair data already collected."
    ),
}


class ScaledSchedule:
    """
    A learning-rate schedule multiplied by a constant factor.

    SB3 sets the optimizer learning rate from ``model.lr_schedule`` at every ``train()``, so scaling the schedule
    (rather than the optimizer) keeps a lowered learning rate for the rest of training, whatever the schedule.
    A module-level class, not a closure, so that ``model.save()`` can pickle it.

    :param schedule: the schedule (or constant learning rate) to scale
    :param scale: the factor
    """

    def __init__(self, schedule: Schedule | float, scale: float) -> None:
        self.schedule = FloatSchedule(schedule)
        self.scale = scale

    def __call__(self, progress_remaining: float) -> float:
        return self.scale * self.schedule(progress_remaining)

    def __repr__(self) -> str:
        return f"ScaledSchedule({self.schedule}, scale={self.scale})"


def scale_schedule(schedule: Schedule | float, factor: float) -> ScaledSchedule:
    """
    A new schedule equal to ``factor`` times ``schedule``, folding nested scalings into one.

    :param schedule: the schedule (or constant) to scale; left unchanged, as other objects may refer to it
    :param factor: the factor
    """
    if isinstance(schedule, ScaledSchedule):
        return ScaledSchedule(schedule.schedule, schedule.scale * factor)
    return ScaledSchedule(schedule, factor)


@dataclass
class GuardEvent:
    """
    One detection of non-finite values by :class:`NonFiniteGuardCallback`.

    :param timestep: ``model.num_timesteps`` when it was detected
    :param phase: when in the training loop, e.g. ``optimizer step of policy.optimizer in train()``
    :param source: ``"model"``, ``"normalization"``, ``"environment"`` or ``"rollout"``
    :param nonfinite: the non-finite tensors, most likely cause first
    :param healthy: statistics of the last healthy state (timestep, largest |param|, grad norm, log-std range)
    :param action: what the guard did: ``"raise"``, ``"stop"`` or ``"rollback"``
    :param message: the full explanation, as raised or logged
    """

    timestep: int
    phase: str
    source: str
    nonfinite: list[NonFiniteTensor]
    healthy: dict[str, Any]
    action: str = ""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-serializable data."""
        return {
            "timestep": self.timestep,
            "phase": self.phase,
            "source": self.source,
            "nonfinite": [vars(bad) for bad in self.nonfinite],
            "healthy": self.healthy,
            "action": self.action,
            "message": self.message,
        }


@dataclass
class _Snapshot:
    """A copy of the model state taken by a passed check, to restore on failure."""

    flat: FlatCopy
    signature: tuple[tuple[int, int], ...]
    optimizer_states: list[dict[th.Tensor, dict[str, Any]]] = field(default_factory=list)
    param_groups: list[list[dict[str, Any]]] = field(default_factory=list)
    vec_normalize: tuple[Any, RunningMeanStd, np.ndarray] | None = None
    timestep: int = 0
    grad_norm: float | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


def _copy_obs_rms(obs_rms: RunningMeanStd | dict[str, RunningMeanStd]) -> RunningMeanStd | dict[str, RunningMeanStd]:
    if isinstance(obs_rms, dict):
        return {key: rms.copy() for key, rms in obs_rms.items()}
    return obs_rms.copy()


def _per_env(name: str, data: np.ndarray | dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Split batched env data into one named entry per env (and per key for dict observations)."""
    if isinstance(data, dict):
        return [entry for key, value in data.items() for entry in _per_env(f"{name}[{key!r}]", value)]
    return [(f"{name} of env {i}", np.asarray(data[i])) for i in range(len(data))]


class NonFiniteGuardCallback(BaseCallback):
    """
    Detect, explain and recover from NaN / inf anywhere in the training of any SB3 model.

    What is checked, and when:

    - after every optimizer step (a step post-hook): the parameters it updated, so a NaN is caught at the
      update that made it, before the next forward pass fails inside torch;
    - after every update phase (``train()``) and at the start and end of ``learn()``: every tensor that
      ``model.save()`` would store (all networks, target networks, optimizer state such as Adam moments),
      and the VecNormalize statistics;
    - at every environment step: the new observations, rewards and (continuous) actions, and the
      VecNormalize statistics;
    - at the end of each on-policy rollout: the rollout buffer (rewards, values, returns, advantages, log-probs);
    - optionally (``check_gradients=True``) the gradients before every optimizer step.

    Each check is one numpy dot per array or tensor (environment data with zeros, tensors with themselves; see
    :mod:`sb3_safe.common.numerics`); the bad tensors are located and named only when a check fails. A passed
    check of the model state copies it first, so the copy is also the snapshot to roll back to.

    What a rollback restores, and what it keeps:

    - restored, as of the last passed check: every tensor that ``model.save()`` stores (networks, optimizer
      state), the optimizers' hyperparameters, the VecNormalize statistics, and the algorithm's own update state
      named in its ``rollback_attributes`` (``KLAdaptivePPO``'s ``kl_beta``, which the failed update may have
      adapted to a diverged KL);
    - kept: ``num_timesteps``, ``_n_updates`` and the skipped-step counters (they count what happened), the
      environment and its last observation, the lowered learning rate and the rollback count. These two are
      stored on the model (in ``learning_rate`` and in ``nonfinite_guard_rollbacks``), so they survive
      ``save`` / ``load`` and a resumed ``learn()``: a resumed run does not get a fresh ``max_rollbacks`` budget.

    :param on_nonfinite: ``"raise"``: raise :class:`~sb3_safe.NonFiniteError`;
        ``"stop"``: restore the last healthy state, save it to ``save_path`` and end ``learn()`` cleanly;
        ``"rollback"``: restore the last healthy state, multiply the learning rate by ``lr_decay`` for the rest
        of training, and go on; bad data from the environment, or ``max_rollbacks`` exceeded, stop instead.
    :param save_path: where ``"stop"`` saves the last healthy model (a ``.zip``); VecNormalize statistics go
        next to it as ``<save_path without .zip>_vecnormalize.pkl``. None: restore it in memory only.
    :param lr_decay: factor in (0, 1) applied to the learning rate at each rollback
    :param max_rollbacks: rollbacks allowed over the model's whole training (also across ``save`` / ``load``)
        before the guard stops training instead
    :param check_gradients: also check the gradients before every optimizer step
    :param report_dir: folder for the JSON-lines event report (``nonfinite_guard.jsonl``);
        None: the logger's folder, or the current directory when the logger writes no files
    :param collapse_patience: consecutive updates with a log-std at a bound of its range before an
        :class:`~sb3_safe.common.exploration.ExplorationWarning` (finite, but no longer exploring, or only noise)
    :param verbose: kept for SB3's callback signature: every event is reported whatever its value, as a
        :class:`NonFiniteGuardWarning`, a logger WARNING and a line of the JSON-lines report

    After ``learn()`` returns, :attr:`events` lists what happened and :attr:`stop_reason` says why training was
    stopped (None if it was not).
    """

    def __init__(
        self,
        on_nonfinite: OnNonFinite = "raise",
        save_path: str | None = None,
        lr_decay: float = 0.5,
        max_rollbacks: int = 3,
        check_gradients: bool = False,
        report_dir: str | None = None,
        collapse_patience: int = DEFAULT_PATIENCE,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        if on_nonfinite not in ON_NONFINITE_MODES:
            raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE_MODES}, got {on_nonfinite!r}")
        if not 0.0 < lr_decay < 1.0:
            raise ValueError(f"lr_decay must be in (0, 1), got {lr_decay!r}")
        if max_rollbacks < 0:
            raise ValueError(f"max_rollbacks must be >= 0, got {max_rollbacks!r}")
        self.on_nonfinite = on_nonfinite
        self.save_path = save_path
        self.lr_decay = lr_decay
        self.max_rollbacks = max_rollbacks
        self.check_gradients = check_gradients
        self.report_dir = report_dir
        #: warns once when a log-std sits at a bound of its range for ``collapse_patience`` consecutive updates
        self.exploration = ExplorationWatch(collapse_patience)
        # Public results
        self.events: list[GuardEvent] = []
        self.n_rollbacks = 0
        self.stop_reason: str | None = None
        # Resolved at training start
        self._modules: list[tuple[str, th.nn.Module]] = []
        self._variables: list[tuple[str, th.Tensor]] = []
        self._optimizers: list[tuple[str, th.optim.Optimizer]] = []
        self._param_names: dict[th.Tensor, str] = {}
        self._log_std_names: list[str] = []
        self._step_checks: dict[int, tuple[str, TensorFiniteCheck]] = {}
        self._hooks: list[RemovableHandle] = []
        self._vec_normalize: Any = None
        self._all_finite = ArrayFiniteCheck()
        self._gradient_norm = GradientNorm([])
        self._healthy: _Snapshot | None = None
        self._scratch: _Snapshot | None = None
        self._checked_n_updates: int | None = None
        self._stopping = False
        self._events_at_start = 0

    # ----- SB3 callback events -----

    def _on_training_start(self) -> None:
        self.n_rollbacks = int(getattr(self.model, ROLLBACKS_ATTRIBUTE, 0))
        self._resolve_model()
        self._stopping = False
        self._healthy = self._scratch = None
        self._events_at_start = len(self.events)
        self._check_model("at the start of learn()")

    def _on_rollout_start(self) -> None:
        if self._stopping:
            self._restore_healthy()
            return
        # Off-policy algorithms start a rollout without training in between while learning has not started.
        n_updates = getattr(self.model, "_n_updates", None)
        if n_updates is None or n_updates != self._checked_n_updates:
            self._check_model(f"after train() (n_updates={n_updates})")

    def _on_step(self) -> bool:
        if self._stopping:
            return False
        new_obs, rewards, actions = self.locals["new_obs"], self.locals["rewards"], self._step_actions()
        observations = new_obs.values() if isinstance(new_obs, dict) else (new_obs,)
        # One call for all of the step's data (discrete actions are integers: the check skips them)
        venv = self._vec_normalize
        if venv is None:
            finite = self._all_finite(*observations, rewards, actions)
        else:
            # Of VecNormalize only the variances: a non-finite mean or return reaches the normalized data checked
            # here (or, through ret_rms.update, the reward variance), but an infinite variance normalizes to zeros
            obs_rms = venv.obs_rms.values() if isinstance(venv.obs_rms, dict) else (venv.obs_rms,)
            variances = (rms.var for rms in obs_rms)
            finite = math.isfinite(venv.ret_rms.var) and self._all_finite(*observations, rewards, actions, *variances)
        if not finite:
            self._locate_step_fault()
        return not self._stopping

    def _step_actions(self) -> np.ndarray:
        # Every SB3 / sb3-contrib algorithm names them `actions` in collect_rollouts; a custom one might not
        actions = self.locals.get("actions")
        return actions if isinstance(actions, np.ndarray) else _NO_ACTIONS

    def _on_rollout_end(self) -> None:
        buffer = getattr(self.model, "rollout_buffer", None)
        if buffer is not None and not self._stopping:
            arrays = [getattr(buffer, name, None) for name in _ROLLOUT_BUFFER_ARRAYS]
            if not self._all_finite(*(array for array in arrays if isinstance(array, np.ndarray))):
                named = [
                    (f"rollout buffer {name}", array)
                    for name, array in zip(_ROLLOUT_BUFFER_ARRAYS, arrays, strict=True)
                    if isinstance(array, np.ndarray)
                ]
                self._handle(ROLLOUT, "end of rollout (returns and advantages computed)", find_nonfinite(named))
        at_bound = self.exploration.after_update(self.model)
        if at_bound is not None:
            self.logger.record("train/log_std_at_bound_fraction", at_bound)
        self._record_counts()

    def _on_training_end(self) -> None:
        if self._stopping:
            self._restore_healthy()
        elif getattr(self.model, "_n_updates", None) != self._checked_n_updates:
            self._check_model("after the last train() of learn()")
        self._detach_hooks()
        if len(self.events) > self._events_at_start:
            # SB3 dumps before train(), so without this the last events would never reach the log files
            self._record_counts()
            self.logger.dump(self.num_timesteps)

    # ----- setup -----

    def _resolve_model(self) -> None:
        """Find every tensor ``model.save()`` would store, the optimizers, VecNormalize, and attach the hooks."""
        self._detach_hooks()
        self._modules, self._variables, self._optimizers = [], [], []
        state_dict_names, variable_names = self.model._get_torch_save_params()
        for name in state_dict_names:
            obj = recursive_getattr(self.model, name)
            if isinstance(obj, th.optim.Optimizer):
                self._optimizers.append((name, obj))
            elif isinstance(obj, th.nn.Module):
                self._modules.append((name, obj))
        for name in variable_names:
            value = recursive_getattr(self.model, name)
            if isinstance(value, th.Tensor):
                self._variables.append((name, value))
        self._param_names = {}
        for module_name, module in self._modules:
            for key, param in module.named_parameters():
                self._param_names.setdefault(param, f"{module_name}.{key}")
        for name, value in self._variables:
            self._param_names.setdefault(value, name)
        self._log_std_names = [name for name in self._param_names.values() if name.endswith(".log_std")]

        self._gradient_norm = GradientNorm(self._param_names)
        self._step_checks = {}
        for name, optimizer in self._optimizers:
            self._step_checks[id(optimizer)] = (name, self._step_check(optimizer))
            self._hooks.append(optimizer.register_step_post_hook(self._after_optimizer_step))
            if self.check_gradients:
                self._hooks.append(optimizer.register_step_pre_hook(self._before_optimizer_step))

        self._vec_normalize = self.model.get_vec_normalize_env()

    @staticmethod
    def _step_check(optimizer: th.optim.Optimizer) -> TensorFiniteCheck:
        """The per-step check of the parameters ``optimizer`` updates (read in place: no snapshot is needed)."""
        return TensorFiniteCheck(p for group in optimizer.param_groups for p in group["params"])

    def _detach_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ----- model state: check, snapshot, restore -----

    def _signature(self) -> tuple[tuple[int, int], ...]:
        # Optimizer state is created lazily at the first step: a new entry changes the set of tensors to watch
        return tuple((id(optimizer.state), len(optimizer.state)) for _, optimizer in self._optimizers)

    def _new_snapshot(self, signature: tuple[tuple[int, int], ...]) -> _Snapshot:
        named: list[tuple[str, th.Tensor]] = []
        for module_name, module in self._modules:
            named += [(f"{module_name}.{key}", tensor) for key, tensor in module.state_dict(keep_vars=True).items()]
        named += self._variables
        for optimizer_name, optimizer in self._optimizers:
            for param, state in optimizer.state.items():
                param_name = self._param_names.get(param, "?")
                named += [
                    (f"{optimizer_name}.state[{param_name}].{key}", value)
                    for key, value in state.items()
                    if isinstance(value, th.Tensor)
                ]
        return _Snapshot(FlatCopy(named), signature)

    def _check_model(self, phase: str) -> None:
        """Check every stored tensor and the VecNormalize statistics; when healthy, keep them as the snapshot."""
        signature = self._signature()
        if self._scratch is None or self._scratch.signature != signature:
            self._scratch = self._new_snapshot(signature)
        snapshot = self._scratch
        if not snapshot.flat.update():
            self._handle(MODEL, phase, snapshot.flat.find_nonfinite())
            return
        if self._vec_normalize is not None and not self._vec_normalize_is_finite():
            self._handle(NORMALIZATION, phase, self._locate_vec_normalize())
            return
        self._capture(snapshot)
        self._scratch, self._healthy = self._healthy, snapshot
        self._checked_n_updates = getattr(self.model, "_n_updates", None)

    def _capture(self, snapshot: _Snapshot) -> None:
        """Complete a snapshot whose tensors were just copied: what is not a tensor, and statistics."""
        snapshot.timestep = self.model.num_timesteps
        snapshot.grad_norm = self._gradient_norm()
        if self.on_nonfinite == "raise":
            return  # never restored: the statistics above are all the error message needs
        snapshot.optimizer_states = [
            {param: dict(state) for param, state in optimizer.state.items()} for _, optimizer in self._optimizers
        ]
        snapshot.param_groups = [
            [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
            for _, optimizer in self._optimizers
        ]
        venv = self._vec_normalize
        if venv is not None:
            snapshot.vec_normalize = (_copy_obs_rms(venv.obs_rms), venv.ret_rms.copy(), venv.returns.copy())
        names = getattr(self.model, "rollback_attributes", ())
        snapshot.attributes = {name: copy.deepcopy(getattr(self.model, name)) for name in names}

    def _restore(self, snapshot: _Snapshot) -> None:
        snapshot.flat.restore()
        saved = zip(self._optimizers, snapshot.optimizer_states, snapshot.param_groups, strict=True)
        for (_, optimizer), states, groups in saved:
            # State entries created after the snapshot are dropped: the optimizer re-creates them lazily
            optimizer.state.clear()
            for param, state in states.items():
                # Its tensors are the live ones, which the flat copy just restored
                optimizer.state[param] = dict(state)
            for group, hyperparameters in zip(optimizer.param_groups, groups, strict=True):
                group.update(hyperparameters)
            # Gradients of the failed step must not leak into the next one
            optimizer.zero_grad(set_to_none=True)
        if snapshot.vec_normalize is not None:
            obs_rms, ret_rms, returns = snapshot.vec_normalize
            self._vec_normalize.obs_rms = _copy_obs_rms(obs_rms)
            self._vec_normalize.ret_rms = ret_rms.copy()
            self._vec_normalize.returns = returns.copy()
        for name, value in snapshot.attributes.items():
            setattr(self.model, name, copy.deepcopy(value))
        # The scratch copy may point at optimizer-state tensors that were just dropped
        self._scratch = None

    def _restore_healthy(self) -> None:
        if self._healthy is not None:
            self._restore(self._healthy)

    def _healthy_stats(self) -> dict[str, Any]:
        snapshot = self._healthy
        if snapshot is None:
            return {}
        stats: dict[str, Any] = {"timestep": snapshot.timestep}
        largest = snapshot.flat.largest(set(self._param_names.values()))
        if largest is not None:
            stats["largest_abs_param_name"], stats["largest_abs_param"] = largest
        stats["grad_norm"] = snapshot.grad_norm
        log_stds = [snapshot.flat.get(name) for name in self._log_std_names]
        values = [t for t in log_stds if t is not None]
        if values:
            stats["log_std_min"] = min(t.min().item() for t in values)
            stats["log_std_max"] = max(t.max().item() for t in values)
        return stats

    # ----- optimizer hooks -----

    def _after_optimizer_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._stopping:
            # Training is ending at the next env step; keep the rest of this train() from changing the model
            self._restore_healthy()
            return
        name, check = self._step_checks[id(optimizer)]
        if check():
            return
        bad = self._locate_in_optimizer(name, optimizer)
        self._handle(MODEL, f"optimizer step of {name} in train()", bad)

    def _before_optimizer_step(self, optimizer: th.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads or math.isfinite(th.nn.utils.get_total_norm(grads, norm_type=math.inf).item()):
            return
        name, _ = self._step_checks[id(optimizer)]
        bad = self._locate_in_optimizer(name, optimizer)
        self._handle(MODEL, f"gradients before an optimizer step of {name} in train()", bad)
        # Rollback or stop restored the model and cleared the gradients: this step is now a no-op

    def _locate_in_optimizer(self, name: str, optimizer: th.optim.Optimizer) -> list[NonFiniteTensor]:
        """Gradients first, then optimizer state, then parameters: the order in which a NaN spreads."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        names = [self._param_names.get(p, "?") for p in params]
        grads = [(f"gradient of {n}", p.grad) for n, p in zip(names, params, strict=True) if p.grad is not None]
        states = [
            (f"{name}.state[{n}].{key}", value)
            for n, p in zip(names, params, strict=True)
            for key, value in optimizer.state.get(p, {}).items()
            if isinstance(value, th.Tensor)
        ]
        return find_nonfinite(grads + states + list(zip(names, params, strict=True)))

    # ----- environment data and normalization -----

    def _vec_normalize_arrays(self) -> list[tuple[str, np.ndarray]]:
        venv = self._vec_normalize
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

    def _vec_normalize_is_finite(self) -> bool:
        return self._all_finite(*(array for _, array in self._vec_normalize_arrays()))

    def _locate_vec_normalize(self) -> list[NonFiniteTensor]:
        return find_nonfinite(self._vec_normalize_arrays())

    def _locate_step_fault(self) -> None:
        """Name the bad env data of this step, telling the environment's own output from normalization."""
        venv = self._vec_normalize
        if venv is not None:
            raw_obs, raw_rewards = venv.get_original_obs(), venv.get_original_reward()
        else:
            raw_obs, raw_rewards = self.locals["new_obs"], self.locals["rewards"]
        from_env = find_nonfinite(_per_env("observation", raw_obs) + _per_env("reward", raw_rewards))
        if from_env:
            if venv is not None:
                from_env += self._locate_vec_normalize()
            self._handle(ENVIRONMENT, "env step", from_env)
            return
        actions = find_nonfinite(_per_env("action", self._step_actions()))
        if actions:
            self._handle(ROLLOUT, "env step (action sampled by the policy)", actions)
            return
        # The environment's output and the actions are finite: the normalization statistics, or the data they made, are not
        named = _per_env("normalized observation", self.locals["new_obs"])
        normalized = find_nonfinite(named + _per_env("normalized reward", self.locals["rewards"]))
        self._handle(NORMALIZATION, "env step", self._locate_vec_normalize() + normalized)
        if not self._stopping:  # rolled back
            self._renormalize_step_data()

    def _renormalize_step_data(self) -> None:
        """
        Normalize this step's data again with the restored statistics: the observation is the next one the policy
        acts on (and, in a recurrent policy, feeds its LSTM state), the reward goes into the rollout buffer.
        """
        venv = self._vec_normalize
        new_obs, rewards = self.locals["new_obs"], self.locals["rewards"]
        normalized = venv.normalize_obs(venv.get_original_obs())
        if isinstance(new_obs, dict):
            for key in new_obs:
                new_obs[key][...] = normalized[key]
        else:
            new_obs[...] = normalized
        rewards[...] = venv.normalize_reward(venv.get_original_reward())

    # ----- reacting -----

    def _handle(self, source: str, phase: str, nonfinite: list[NonFiniteTensor]) -> None:
        event = GuardEvent(self.model.num_timesteps, phase, source, nonfinite, self._healthy_stats())
        if self.on_nonfinite == "raise":
            event.action, outcome = "raise", "Pass on_nonfinite='rollback' or 'stop' to recover instead of raising."
        elif (
            self.on_nonfinite == "rollback"
            and source in _RESTORABLE
            and self._healthy is not None
            and self.n_rollbacks < self.max_rollbacks
        ):
            event.action, outcome = "rollback", self._rollback()
        else:
            reason = ""
            if self.on_nonfinite == "rollback" and source not in _RESTORABLE:
                reason = "rollback cannot repair this data"
            elif self.on_nonfinite == "rollback" and self._healthy is not None:
                reason = f"all max_rollbacks={self.max_rollbacks} rollbacks were used"
            event.action, outcome = "stop", self._stop(reason)
        event.message = self._compose(event, outcome)
        self.events.append(event)
        self._report(event)
        if event.action == "raise":
            self._detach_hooks()
            raise NonFiniteError(event.message)
        if event.action == "stop":
            self.stop_reason = event.message

    def _rollback(self) -> str:
        assert self._healthy is not None
        self._restore(self._healthy)
        self.n_rollbacks += 1
        setattr(self.model, ROLLBACKS_ATTRIBUTE, self.n_rollbacks)
        # lr_schedule drives train(); learning_rate is what load() rebuilds lr_schedule from
        self.model.lr_schedule = scale_schedule(self.model.lr_schedule, self.lr_decay)
        self.model.learning_rate = scale_schedule(self.model.learning_rate, self.lr_decay)
        # SB3 re-applies the schedule at the next train(); this holds for the rest of the current one
        for _, optimizer in self._optimizers:
            for group in optimizer.param_groups:
                group["lr"] *= self.lr_decay
        return (
            f"Rolled back to the state of timestep {self._healthy.timestep} and multiplied the learning rate by "
            f"{self.lr_decay} (rollback {self.n_rollbacks} of at most {self.max_rollbacks})."
        )

    def _stop(self, reason: str) -> str:
        self._stopping = True
        why = f" ({reason})" if reason else ""
        if self._healthy is None:
            return f"Stopping training{why}; no healthy state was recorded, so the model is left as it is."
        self._restore(self._healthy)
        where = "restored in memory"
        if self.save_path is not None:
            self.model.save(self.save_path)
            where = f"restored and saved to {self.save_path}"
            if self._vec_normalize is not None:
                vec_path = self.vec_normalize_path
                assert vec_path is not None
                self._vec_normalize.save(vec_path)
                where += f" (VecNormalize to {vec_path})"
        return f"Stopping training{why}; the last healthy model (timestep {self._healthy.timestep}) was {where}."

    @property
    def vec_normalize_path(self) -> str | None:
        """Where ``"stop"`` saves the VecNormalize statistics, next to ``save_path``."""
        if self.save_path is None:
            return None
        base = self.save_path[:-4] if self.save_path.endswith(".zip") else self.save_path
        return f"{base}_vecnormalize.pkl"

    def _compose(self, event: GuardEvent, outcome: str) -> str:
        shown = event.nonfinite[:8]
        lines = [f"Non-finite values at timestep {event.timestep} ({event.phase}):"]
        lines += [f"  {bad}" for bad in shown]
        if len(event.nonfinite) > len(shown):
            lines.append(f"  ... and {len(event.nonfinite) - len(shown)} more")
        lines.append(_describe_stats(event.healthy))
        lines.append(_CAUSES[event.source])
        lines.append(outcome)
        return "\n".join(lines)

    def _report(self, event: GuardEvent) -> None:
        # Never silent: a stop looks like a finished run, a rollback like a healthy one, whatever verbose is
        self._record_counts()
        self.logger.log(event.message, level=WARN)
        warnings.warn(event.message, NonFiniteGuardWarning, stacklevel=2)
        os.makedirs(self.report_folder, exist_ok=True)
        with open(os.path.join(self.report_folder, REPORT_FILENAME), "a", encoding="utf-8") as file:
            file.write(json.dumps(event.to_dict()) + "\n")

    @property
    def report_folder(self) -> str:
        """
        Where ``nonfinite_guard.jsonl`` goes: ``report_dir``, else the logger's folder if the logger writes there
        (SB3's default logger has a temporary folder it writes nothing to), else the current directory.
        """
        logger_folder = self.logger.get_dir() if self.logger.output_formats else None
        return self.report_dir or logger_folder or os.getcwd()

    def _record_counts(self) -> None:
        self.logger.record("guard/events", len(self.events))
        self.logger.record("guard/rollbacks", self.n_rollbacks)


def _describe_stats(stats: dict[str, Any]) -> str:
    if not stats:
        return "No healthy state was recorded before this."
    parts = []
    if "largest_abs_param" in stats:
        parts.append(f"largest |param| {stats['largest_abs_param']:.4g} ({stats['largest_abs_param_name']})")
    grad_norm = stats.get("grad_norm")
    parts.append("last grad norm " + (f"{grad_norm:.4g}" if grad_norm is not None else "unknown (no update yet)"))
    if "log_std_min" in stats:
        parts.append(f"log-std range [{stats['log_std_min']:.3g}, {stats['log_std_max']:.3g}]")
    return f"Last healthy state (timestep {stats['timestep']}): " + ", ".join(parts) + "."


class NumericsMonitorCallback(BaseCallback):
    """
    Log the numbers that announce a divergence before it happens, at the end of each rollout:
    ``train/log_std_min`` and ``train/log_std_max`` (policies with a ``log_std`` parameter),
    ``train/param_max_abs`` (largest |parameter|), ``train/grad_norm`` (L2 norm of the gradients of the
    last optimizer step) and ``train/log_std_at_bound_fraction`` (share of log-std entries at a bound of the range;
    after ``collapse_patience`` consecutive updates with one at a bound, an
    :class:`~sb3_safe.common.exploration.ExplorationWarning` says that exploration collapsed or exploded).
    They go to SB3's logger, hence to stdout, CSV and TensorBoard.
    Use with :class:`NonFiniteGuardCallback`, which logs ``guard/events`` and ``guard/rollbacks``.

    :param collapse_patience: consecutive updates with a log-std at a bound before the warning
    :param verbose: Verbosity level: 0 for no output, 1 for info messages
    """

    def __init__(self, collapse_patience: int = DEFAULT_PATIENCE, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.exploration = ExplorationWatch(collapse_patience)

    def _on_training_start(self) -> None:
        self._params: list[th.Tensor] = [p for p in self.model.policy.parameters() if p.is_floating_point()]
        self._gradient_norm = GradientNorm(self._params)
        log_std = getattr(self.model.policy, "log_std", None)
        self._log_std: th.Tensor | None = log_std if isinstance(log_std, th.Tensor) else None

    def _on_step(self) -> bool:
        return True

    @th.no_grad()
    def _on_rollout_end(self) -> None:
        record = self.logger.record
        if self._log_std is not None:
            low, high = th.aminmax(self._log_std)
            record("train/log_std_min", low.item())
            record("train/log_std_max", high.item())
        if self._params:
            record("train/param_max_abs", th.nn.utils.get_total_norm(self._params, norm_type=math.inf).item())
        grad_norm = self._gradient_norm()
        if grad_norm is not None:
            record("train/grad_norm", grad_norm)
        at_bound = self.exploration.after_update(self.model)
        if at_bound is not None:
            record("train/log_std_at_bound_fraction", at_bound)
