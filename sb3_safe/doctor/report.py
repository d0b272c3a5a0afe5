"""What ``sb3-safe doctor`` found in a model file, as text for a terminal or as JSON."""

import math
from dataclasses import dataclass, field
from typing import Any

from sb3_safe.common.exploration import STOCK_LOG_STD_RANGE
from sb3_safe.common.numerics import NonFiniteTensor
from sb3_safe.doctor.pickles import data_item_entry
from sb3_safe.doctor.scan import Finding, printable

#: Largest healthy |value| of a policy weight: float32 values from 2^13 (8192) on are 2^-10 (~1e-3) apart, so an
#: Adam step of PPO's default learning rate (3e-4, less than half that) rounds away: the weight cannot be trained
WEIGHT_LIMIT = 1e4


@dataclass
class BeyondLimit:
    """
    A policy tensor with finite values beyond a limit.

    :param name: the tensor's name, e.g. ``policy.log_std``
    :param quantity: what is limited: ``log-std`` or ``|weight|``
    :param value: its value farthest beyond the limit
    :param limit: the limit it passes
    :param reason: which limit it is
    """

    name: str
    quantity: str
    value: float
    limit: float
    reason: str

    def __str__(self) -> str:
        side = "above" if self.value > self.limit else "below"
        if self.quantity == "log-std":
            value = f"{self.value:.4g} (std {safe_exp(self.value):.4g})"
            limit = f"{self.limit:.4g} (std {safe_exp(self.limit):.4g})"
        else:
            value, limit = f"{self.value:.4g}", f"{self.limit:.4g}"
        return f"{self.name}: {self.quantity} {value} {side} {limit}, {self.reason}"


@dataclass
class StoredFunction:
    """
    An item of a model's ``data`` that holds a function stored with its code (cloudpickle pickles a lambda or a
    function of a script by value): what a lambda learning rate or schedule looks like in the file.

    :param key: the item, e.g. ``learning_rate``
    :param module: the module the function says it was defined in (``__main__``: a script), if the file says
    :param qualname: the function's qualified name (``<lambda>``), if the file says
    """

    key: str
    module: str | None = None
    qualname: str | None = None

    def __str__(self) -> str:
        name = f"{self.qualname}, a function" if self.qualname else "a function"
        if self.module is None:
            where = " (the file does not say where it was defined)"
        else:
            where = f" defined in {self.module}" + (" (the script that saved the model)" if self.module == "__main__" else "")
        return f"{self.key}: {name}{where}"


@dataclass
class DoctorReport:
    """
    What ``doctor`` found in a saved model.

    :param path: the model file
    :param policy_class: the policy's class (``module.Name``), when the metadata names an allowed class
    :param num_timesteps: timesteps trained, when the metadata says it
    :param unsafe: what loading the file would run beyond what SB3 model files need (named globals)
    :param unchecked: the parts not checked because they are unsafe or unreadable (one line each)
    :param tensors_checked: whether the tensors were read (not when ``policy.pth`` itself is unsafe)
    :param pickle_only: the file is a pickle, not a model zip (VecNormalize's statistics, a replay buffer): only its
        globals are checked
    :param n_tensors: number of floating-point tensors checked (parameters, optimizer state, variables)
    :param n_values: number of values in them
    :param nonfinite: the tensors holding NaN or inf
    :param has_log_std: whether the policy has ``log_std`` parameters
    :param log_std_range: (min, max) over the finite values of the policy's ``log_std`` parameters, if any
    :param log_std_limits: the (low, high) range the policy's log-std must stay in
    :param log_std_limits_source: where ``log_std_limits`` comes from
    :param beyond_limits: the policy tensors with finite values beyond ``log_std_limits`` or :data:`WEIGHT_LIMIT`
    :param largest: the policy tensors with the largest |value|, largest first, as (name, max |value|)
    :param stored_functions: the items of ``data`` that hold a function stored with its code (a lambda learning
        rate): their findings in ``unsafe`` are reported apart, with the ``custom_objects`` that replace them
    :param built: the algorithm whose ``load`` built the model from the file, as :func:`sb3_safe.load` builds it
    :param built_parameters: the parameters of the policy built
    :param not_built: why the model was not built, when it was not (a model SB3 cannot build makes the file
        unreadable instead)
    """

    path: str
    policy_class: str | None = None
    num_timesteps: int | None = None
    unsafe: list[Finding] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    tensors_checked: bool = True
    pickle_only: bool = False
    n_tensors: int = 0
    n_values: int = 0
    nonfinite: list[NonFiniteTensor] = field(default_factory=list)
    has_log_std: bool = False
    log_std_range: tuple[float, float] | None = None
    log_std_limits: tuple[float, float] = STOCK_LOG_STD_RANGE
    log_std_limits_source: str = "the range for stock policies"
    beyond_limits: list[BeyondLimit] = field(default_factory=list)
    largest: list[tuple[str, float]] = field(default_factory=list)
    stored_functions: list[StoredFunction] = field(default_factory=list)
    built: str | None = None
    built_parameters: int = 0
    not_built: str | None = None

    @property
    def healthy(self) -> bool:
        if self.pickle_only:
            return not self.unsafe
        return not self.unsafe and self.tensors_checked and not self.nonfinite and not self.beyond_limits

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-serializable data."""
        return {
            "path": self.path,
            "healthy": self.healthy,
            "policy_class": self.policy_class,
            "num_timesteps": self.num_timesteps,
            "unsafe": [
                {"entry": finding.entry, "target": finding.target, "detail": finding.detail, "message": str(finding)}
                for finding in self.unsafe
            ],
            "stored_functions": [vars(function) for function in self.stored_functions],
            "unchecked": self.unchecked,
            "tensors_checked": self.tensors_checked,
            "pickle_only": self.pickle_only,
            "n_tensors": self.n_tensors,
            "n_values": self.n_values,
            "nonfinite": [vars(bad) for bad in self.nonfinite],
            "beyond_limits": [vars(bad) for bad in self.beyond_limits],
            "limits": {
                "log_std": self.log_std_limits,
                "log_std_source": self.log_std_limits_source,
                "weight": WEIGHT_LIMIT,
            },
            "log_std_range": self.log_std_range,
            "largest": [{"name": name, "max_abs": _json_float(value)} for name, value in self.largest],
            "built": None if self.built is None else {"algorithm": self.built, "parameters": self.built_parameters},
            "not_built": self.not_built,
        }

    def format(self) -> str:
        """The report as text for a terminal."""
        about = ", ".join(
            part
            for part in (
                self.policy_class,
                f"{self.num_timesteps} timesteps" if self.num_timesteps is not None else None,
            )
            if part
        )
        if self.pickle_only:
            about = "a pickle, not a model zip: VecNormalize's statistics or a replay buffer"
        lines = [f"{self.path}" + (f" ({about})" if about else "")]
        stored = {data_item_entry(function.key) for function in self.stored_functions}
        unsafe = [finding for finding in self.unsafe if not (finding.builds_code and finding.entry in stored)]
        if unsafe:
            lines.append(
                "UNSAFE: loading this file would run code that SB3 / sb3-contrib / sb3-safe model files never need "
                f"({len(unsafe)} finding{'s' if len(unsafe) > 1 else ''}). Do not load it."
            )
            lines += [f"  {finding}" for finding in unsafe]
            lines.append(
                f"  Inspect without running anything: sb3-safe doctor --dis {dis_argument(unsafe[0].entry)} "
                f"{self.path} (pickletools), or fickling. A class of your own: --trust MODULE."
            )
        if self.stored_functions:
            lines += self._stored_function_lines()
        lines += [f"Not checked: {part}" for part in self.unchecked]
        if self.built is not None:
            lines.append(
                f"Builds: {self.built}.load builds the model it describes, as sb3_safe.load does "
                f"({self.built_parameters} policy parameters)"
            )
        elif self.not_built is not None:
            lines.append(f"Not built: {self.not_built}")
        if self.pickle_only and not self.unsafe:
            lines.append(
                "Healthy: the pickle names only what SB3 files hold (its values are not checked for NaN: that needs "
                "unpickling it)."
            )
        if not self.tensors_checked:
            return "\n".join(lines)
        if self.healthy:
            lines.append(
                f"Healthy: all {self.n_tensors} tensors ({self.n_values} values) are finite, within the limits; "
                "the pickles name only what SB3 model files hold."
            )
        elif not self.nonfinite and not self.beyond_limits:
            lines.append(f"Tensors: all {self.n_tensors} ({self.n_values} values) are finite, within the limits.")
        if self.nonfinite:
            lines.append(f"UNHEALTHY: {len(self.nonfinite)} of {self.n_tensors} tensors hold NaN or inf:")
            lines += [f"  {bad}" for bad in self.nonfinite]
        if self.beyond_limits:
            n_beyond = len(self.beyond_limits)
            lines.append(f"UNHEALTHY: {n_beyond} policy tensor{'s' if n_beyond > 1 else ''} beyond the limits:")
            lines += [f"  {bad}" for bad in self.beyond_limits]
        # Only the limits that apply to this policy: a policy without log_std parameters (discrete actions, a
        # squashed or state-dependent std) has no log-std to limit
        if self.has_log_std:
            low, high = self.log_std_limits
            lines.append(
                f"Limits: log-std in [{low:.4g}, {high:.4g}] ({self.log_std_limits_source}), |weight| <= {WEIGHT_LIMIT:.4g}"
            )
            if self.log_std_range is not None:
                low, high = self.log_std_range
                lines.append(f"log-std range: [{low:.4g}, {high:.4g}] (std [{safe_exp(low):.4g}, {safe_exp(high):.4g}])")
            else:
                lines.append("log-std: no finite value (see the NaN / inf above)")
        else:
            lines.append(f"Limits: |weight| <= {WEIGHT_LIMIT:.4g}")
        if self.largest:
            lines.append("Largest |weight|:")
            lines += [f"  {name}: {value:.4g}" for name, value in self.largest]
        return "\n".join(lines)

    def _stored_function_lines(self) -> list[str]:
        """What the stored functions are, that they are expected for a schedule you wrote, and how to load without them."""
        functions = self.stored_functions
        several = len(functions) > 1
        lines = [
            f"CODE: {'these items hold functions' if several else 'this item holds a function'} stored with "
            f"{'their' if several else 'its'} code, which loading runs:"
        ]
        lines += [f"  {function}" for function in functions]
        replacements = ", ".join(printable(f'"{function.key}": 0.0') for function in functions)
        lines += [
            "  Expected for a learning rate or schedule you wrote as a lambda or a function of your script: SB3 "
            "saves it with its code. In a file you did not write it can be any code: do not load that file as it is.",
            f"  Load it without running {'them' if several else 'it'}: custom_objects replaces the items unread, "
            f"e.g. PPO.load({self.path!r}, custom_objects={{{replacements}}}) to predict (to train on: your schedule "
            "for learning_rate); sb3_safe.load(PPO, ..., custom_objects=...) also refuses any other code.",
            f"  Inspect without running anything: sb3-safe doctor --dis {dis_argument(data_item_entry(functions[0].key))} "
            f"{self.path}",
        ]
        return lines


def dis_argument(entry: str) -> str:
    """The ``--dis`` argument (shell-quoted) that prints the pickle of a finding's entry."""
    if entry.startswith('data["'):
        return "'" + entry[: entry.index('"]') + 2] + "'"
    return entry.split(" > ", 1)[0].split(" (", 1)[0]  # the entry's own pickle, which loads what is nested in it


def safe_exp(value: float) -> float:
    """``exp(value)``, inf where it overflows."""
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def _json_float(value: float) -> float | str:
    """Strict JSON has no NaN or Infinity: write those as strings."""
    return value if math.isfinite(value) else str(value)
