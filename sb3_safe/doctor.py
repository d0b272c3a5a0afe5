"""
``sb3-safe doctor``: check a saved SB3 model for non-finite values and for magnitudes beyond the limits of a
working policy, without its environment.

A model is unhealthy if a tensor holds NaN or inf, if the policy's log-std leaves its range (the policy's own
``log_std_range`` for sb3-safe's policies, :data:`STOCK_LOG_STD_RANGE` for other policies), or if a policy
weight exceeds :data:`WEIGHT_LIMIT` in magnitude.

Only the tensors are loaded (``torch.load(weights_only=True)``) and the JSON metadata is read as text, so no
pickled object from the file is executed and the classes the model was built with need not be installed.
"""

import base64
import contextlib
import json
import math
import pickletools
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

import torch as th
from stable_baselines3.common.save_util import load_from_zip_file

from sb3_safe.common.distributions import DEFAULT_LOG_STD_RANGE
from sb3_safe.common.exploration import STOCK_LOG_STD_RANGE
from sb3_safe.common.numerics import NonFiniteTensor, find_nonfinite
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy
from sb3_safe.common.recurrent import SafeCnnLstmPolicy, SafeMultiInputLstmPolicy, SafeRecurrentActorCriticPolicy

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREADABLE = 2

#: Largest healthy |value| of a policy weight: float32 values from 2^13 (8192) on are 2^-10 (~1e-3) apart, so an
#: Adam step of PPO's default learning rate (3e-4, less than half that) rounds away: the weight cannot be trained
WEIGHT_LIMIT = 1e4
#: sb3-safe's policies (as ``module.Name``): their log-std stays in their ``log_std_range``, by default
#: DEFAULT_LOG_STD_RANGE
_SAFE_POLICIES = frozenset(
    f"{cls.__module__}.{cls.__name__}"
    for cls in (
        SafeActorCriticPolicy,
        SafeCnnPolicy,
        SafeMultiInputPolicy,
        SafeRecurrentActorCriticPolicy,
        SafeCnnLstmPolicy,
        SafeMultiInputLstmPolicy,
    )
)


class UnreadableModelError(Exception):
    """The file is not a readable SB3 model; the message says why, in one line."""


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
            value = f"{self.value:.4g} (std {_safe_exp(self.value):.4g})"
            limit = f"{self.limit:.4g} (std {_safe_exp(self.limit):.4g})"
        else:
            value, limit = f"{self.value:.4g}", f"{self.limit:.4g}"
        return f"{self.name}: {self.quantity} {value} {side} {limit}, {self.reason}"


@dataclass
class DoctorReport:
    """
    What ``doctor`` found in a saved model.

    :param path: the model file
    :param policy_class: the policy's class (``module.Name``), when the metadata says it
    :param num_timesteps: timesteps trained, when the metadata says it
    :param n_tensors: number of floating-point tensors checked (parameters, optimizer state, variables)
    :param n_values: number of values in them
    :param nonfinite: the tensors holding NaN or inf
    :param log_std_range: (min, max) over the policy's ``log_std`` parameters, if it has any
    :param log_std_limits: the (low, high) range the policy's log-std must stay in
    :param log_std_limits_source: where ``log_std_limits`` comes from
    :param beyond_limits: the policy tensors with finite values beyond ``log_std_limits`` or :data:`WEIGHT_LIMIT`
    :param largest: the policy tensors with the largest |value|, largest first, as (name, max |value|)
    """

    path: str
    policy_class: str | None = None
    num_timesteps: int | None = None
    n_tensors: int = 0
    n_values: int = 0
    nonfinite: list[NonFiniteTensor] = field(default_factory=list)
    log_std_range: tuple[float, float] | None = None
    log_std_limits: tuple[float, float] = STOCK_LOG_STD_RANGE
    log_std_limits_source: str = "the range for stock policies"
    beyond_limits: list[BeyondLimit] = field(default_factory=list)
    largest: list[tuple[str, float]] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.nonfinite and not self.beyond_limits

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-serializable data."""
        return {
            "path": self.path,
            "healthy": self.healthy,
            "policy_class": self.policy_class,
            "num_timesteps": self.num_timesteps,
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
        lines = [f"{self.path}" + (f" ({about})" if about else "")]
        if self.healthy:
            lines.append(f"Healthy: all {self.n_tensors} tensors ({self.n_values} values) are finite, within the limits.")
        if self.nonfinite:
            lines.append(f"UNHEALTHY: {len(self.nonfinite)} of {self.n_tensors} tensors hold NaN or inf:")
            lines += [f"  {bad}" for bad in self.nonfinite]
        if self.beyond_limits:
            n_beyond = len(self.beyond_limits)
            lines.append(f"UNHEALTHY: {n_beyond} policy tensor{'s' if n_beyond > 1 else ''} beyond the limits:")
            lines += [f"  {bad}" for bad in self.beyond_limits]
        low, high = self.log_std_limits
        lines.append(
            f"Limits: log-std in [{low:.4g}, {high:.4g}] ({self.log_std_limits_source}), |weight| <= {WEIGHT_LIMIT:.4g}"
        )
        if self.log_std_range is not None:
            low, high = self.log_std_range
            lines.append(f"log-std range: [{low:.4g}, {high:.4g}] (std [{_safe_exp(low):.4g}, {_safe_exp(high):.4g}])")
        else:
            lines.append("log-std: the policy has no log_std parameter")
        if self.largest:
            lines.append("Largest |weight|:")
            lines += [f"  {name}: {value:.4g}" for name, value in self.largest]
        return "\n".join(lines)


def _safe_exp(value: float) -> float:
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def _json_float(value: float) -> float | str:
    """Strict JSON has no NaN or Infinity: write those as strings."""
    return value if math.isfinite(value) else str(value)


def _class_name(item: Any) -> str | None:
    """The ``module.Name`` of a class pickled by reference, read from the pickle opcodes without loading it."""
    if not isinstance(item, dict) or ":serialized:" not in item:
        return None
    try:
        strings: list[str] = []
        for opcode, argument, _ in pickletools.genops(base64.b64decode(item[":serialized:"])):
            if isinstance(argument, str):
                strings.append(argument)
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                return f"{strings[-2]}.{strings[-1]}"
    except (ValueError, TypeError):
        return None
    return None


def _read_metadata(path: Path, report: DoctorReport) -> None:
    with zipfile.ZipFile(path) as archive:
        if "data" not in archive.namelist():
            return
        data = json.loads(archive.read("data").decode())
    if isinstance(data.get("num_timesteps"), int):
        report.num_timesteps = data["num_timesteps"]
    report.policy_class = _class_name(data.get("policy_class"))
    policy_kwargs = data.get("policy_kwargs")
    # SB3 writes the JSON-able items of policy_kwargs as JSON, also when it pickles the whole dict
    declared = policy_kwargs.get("log_std_range") if isinstance(policy_kwargs, dict) else None
    if isinstance(declared, list) and len(declared) == 2 and all(isinstance(bound, int | float) for bound in declared):
        report.log_std_limits = (float(declared[0]), float(declared[1]))
        report.log_std_limits_source = "the policy's log_std_range"
    elif report.policy_class in _SAFE_POLICIES:
        report.log_std_limits = DEFAULT_LOG_STD_RANGE
        report.log_std_limits_source = "the default log_std_range of sb3-safe's policies"


def _named_tensors(params: dict[str, Any], variables: dict[str, Any] | None) -> list[tuple[str, th.Tensor]]:
    """Every floating-point tensor of the file, named like the guard names them."""
    named: list[tuple[str, th.Tensor]] = []
    modules = {name: state_dict for name, state_dict in params.items() if not _is_optimizer(state_dict)}
    for dict_name, state_dict in params.items():
        if _is_optimizer(state_dict):
            names = _optimizer_parameter_names(dict_name, state_dict, modules)
            for index, state in state_dict["state"].items():
                param = names.get(index, str(index))
                named += [(f"{dict_name}.state[{param}].{key}", value) for key, value in state.items()]
        else:
            named += [(f"{dict_name}.{key}", value) for key, value in state_dict.items()]
    named += list((variables or {}).items())
    return [(name, value) for name, value in named if isinstance(value, th.Tensor) and value.is_floating_point()]


def _is_optimizer(state_dict: dict[str, Any]) -> bool:
    return "state" in state_dict and "param_groups" in state_dict


def _optimizer_parameter_names(
    optimizer_name: str, optimizer: dict[str, Any], modules: dict[str, dict[str, Any]]
) -> dict[int, str]:
    """
    The parameter name of each index of a saved optimizer, as the guard names them (``policy.mlp_extractor...``), or
    {} when the file does not tell them apart.

    A saved optimizer keeps its parameters by index, in the order they were given to it: the parameters of one
    module (``critic.optimizer``: the policy's ``critic.``), or of one of its top-level parts (DQN: ``q_net.``).
    The first such run of a module's floating-point tensors whose count and shapes match every state entry names
    them; buffers among them, or no match, leave the indices.
    """
    indices = [index for group in optimizer["param_groups"] for index in group["params"]]
    owner = optimizer_name.removesuffix(".optimizer")  # "policy" (its own), "critic" (a part of the policy)
    for module_name, state_dict in modules.items():
        floats = [
            (key, value) for key, value in state_dict.items() if isinstance(value, th.Tensor) and value.is_floating_point()
        ]
        parts = dict.fromkeys(key.split(".", 1)[0] + "." for key, _ in floats)
        for group in ("" if owner == module_name else f"{owner}.", *parts):
            candidates = [(key, value) for key, value in floats if key.startswith(group)]
            if len(candidates) != len(indices):
                continue
            pairs = list(zip(indices, candidates, strict=True))
            if all(_state_shapes_match(optimizer["state"].get(index, {}), value) for index, (_, value) in pairs):
                return {index: f"{module_name}.{key}" for index, (key, _) in pairs}
    return {}


def _state_shapes_match(state: dict[str, Any], param: th.Tensor) -> bool:
    # Per-parameter optimizer state (Adam's moments, RMSprop's square average) has the parameter's shape
    return all(value.shape == param.shape for value in state.values() if isinstance(value, th.Tensor) and value.dim() > 0)


def _beyond_limits(policy: list[tuple[str, th.Tensor]], report: DoctorReport) -> list[BeyondLimit]:
    """The policy tensors whose finite values pass the log-std limits or WEIGHT_LIMIT (NaN and inf are reported apart)."""
    low, high = report.log_std_limits
    source = report.log_std_limits_source
    beyond = []
    for name, tensor in policy:
        finite = tensor[th.isfinite(tensor)]
        if finite.numel() == 0:
            continue
        if name.endswith("log_std"):
            top, bottom = finite.max(), finite.min()
            # In the tensor's dtype: a safe policy clamps its log-std to the bounds rounded to float32
            if top > th.tensor(high, dtype=finite.dtype):
                beyond.append(BeyondLimit(name, "log-std", top.item(), high, f"the ceiling of {source}"))
            if bottom < th.tensor(low, dtype=finite.dtype):
                beyond.append(BeyondLimit(name, "log-std", bottom.item(), low, f"the floor of {source}"))
        elif (largest := finite.abs().max().item()) > WEIGHT_LIMIT:
            reason = "the limit for weights (float32 rounds away Adam steps of 3e-4 there)"
            beyond.append(BeyondLimit(name, "|weight|", largest, WEIGHT_LIMIT, reason))
    return beyond


def diagnose(path: str | Path, top: int = 5) -> DoctorReport:
    """
    Check every tensor of a saved SB3 model for NaN and inf, and the policy's tensors against the limits: its
    log-std against its ``log_std_range`` (sb3-safe's policies) or :data:`STOCK_LOG_STD_RANGE` (other policies),
    its other tensors against :data:`WEIGHT_LIMIT`.

    :param path: the model ``.zip``
    :param top: how many of the largest policy tensors to report
    :return: the report
    :raises UnreadableModelError: if the file is not a readable SB3 model
    """
    path = Path(path)
    if path.is_dir():
        models = sorted(model.name for model in path.glob("*.zip"))
        holds = f" (it holds {', '.join(models[:3])}{', ...' if len(models) > 3 else ''})" if models else ""
        raise UnreadableModelError(f"{path}: is a directory; pass the model's .zip{holds}")
    if not path.is_file():
        raise UnreadableModelError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise UnreadableModelError(f"{path}: not a zip archive, so not a saved SB3 model")
    try:
        _, params, variables = load_from_zip_file(path, load_data=False, device="cpu")
    except Exception as error:  # th.load and zipfile raise many types for a damaged file
        first_line = (str(error).strip().splitlines() or [""])[0]
        raise UnreadableModelError(f"{path}: cannot load its tensors ({type(error).__name__}: {first_line})") from error
    if "policy" not in params:
        raise UnreadableModelError(f"{path}: a zip archive without policy.pth, so not a saved SB3 model")

    report = DoctorReport(str(path))
    # Metadata names the model and the policy's log-std range; without it the stock range applies
    with contextlib.suppress(ValueError, KeyError, zipfile.BadZipFile):
        _read_metadata(path, report)
    named = _named_tensors(params, variables)
    report.n_tensors = len(named)
    report.n_values = sum(tensor.numel() for _, tensor in named)
    report.nonfinite = find_nonfinite(named)

    policy = [
        (f"policy.{key}", tensor)
        # SB3 types these as tensors, but each value is a whole state dict
        for key, tensor in cast(dict[str, Any], params["policy"]).items()
        if isinstance(tensor, th.Tensor) and tensor.is_floating_point() and tensor.numel() > 0
    ]
    log_stds = [tensor for name, tensor in policy if name.endswith("log_std")]
    if log_stds:
        values = th.cat([tensor.flatten() for tensor in log_stds])
        finite = values[th.isfinite(values)]
        if finite.numel() > 0:
            report.log_std_range = (finite.min().item(), finite.max().item())
    # NaN sorts as largest, so corrupted tensors lead the list
    maxima = [(name, tensor.abs().max().item()) for name, tensor in policy]
    maxima.sort(key=lambda item: (math.isnan(item[1]), item[1]), reverse=True)
    report.largest = maxima[:top]
    report.beyond_limits = _beyond_limits(policy, report)
    return report


def run_doctor(path: str, top: int = 5, as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """
    Diagnose a model file and print the report.

    :param path: the model ``.zip``
    :param top: how many of the largest policy tensors to report
    :param as_json: print the report as JSON instead of text
    :param out: where the report goes (default stdout)
    :param err: where the one-line error for an unreadable file goes (default stderr)
    :return: exit status: 0 healthy, 1 non-finite values or values beyond the limits found, 2 not a readable SB3
        model (or a directory)
    """
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        report = diagnose(path, top)
    except UnreadableModelError as error:
        print(f"sb3-safe doctor: error: {error}", file=err)
        return EXIT_UNREADABLE
    print(json.dumps(report.to_dict(), indent=2) if as_json else report.format(), file=out)
    return EXIT_HEALTHY if report.healthy else EXIT_UNHEALTHY
