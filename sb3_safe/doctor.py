"""
``sb3-safe doctor``: check a saved SB3 model for non-finite values, without its environment.

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

from sb3_safe.common.numerics import NonFiniteTensor, find_nonfinite

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREADABLE = 2


class UnreadableModelError(Exception):
    """The file is not a readable SB3 model; the message says why, in one line."""


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
    :param largest: the policy tensors with the largest |value|, largest first, as (name, max |value|)
    """

    path: str
    policy_class: str | None = None
    num_timesteps: int | None = None
    n_tensors: int = 0
    n_values: int = 0
    nonfinite: list[NonFiniteTensor] = field(default_factory=list)
    log_std_range: tuple[float, float] | None = None
    largest: list[tuple[str, float]] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.nonfinite

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
            lines.append(f"Healthy: all {self.n_tensors} tensors ({self.n_values} values) are finite.")
        else:
            lines.append(f"UNHEALTHY: {len(self.nonfinite)} of {self.n_tensors} tensors hold NaN or inf:")
            lines += [f"  {bad}" for bad in self.nonfinite]
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


def _named_tensors(params: dict[str, Any], variables: dict[str, Any] | None) -> list[tuple[str, th.Tensor]]:
    """Every floating-point tensor of the file, named like the guard names them."""
    named: list[tuple[str, th.Tensor]] = []
    for dict_name, state_dict in params.items():
        if "state" in state_dict and "param_groups" in state_dict:
            # An optimizer: parameters are stored by index, in the optimizer's order
            for index, state in state_dict["state"].items():
                named += [(f"{dict_name}.state[{index}].{key}", value) for key, value in state.items()]
        else:
            named += [(f"{dict_name}.{key}", value) for key, value in state_dict.items()]
    named += list((variables or {}).items())
    return [(name, value) for name, value in named if isinstance(value, th.Tensor) and value.is_floating_point()]


def diagnose(path: str | Path, top: int = 5) -> DoctorReport:
    """
    Check every tensor of a saved SB3 model.

    :param path: the model ``.zip``
    :param top: how many of the largest policy tensors to report
    :return: the report
    :raises UnreadableModelError: if the file is not a readable SB3 model
    """
    path = Path(path)
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
    # Metadata is informative only; the tensors decide the verdict
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
    return report


def run_doctor(path: str, top: int = 5, as_json: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """
    Diagnose a model file and print the report.

    :param path: the model ``.zip``
    :param top: how many of the largest policy tensors to report
    :param as_json: print the report as JSON instead of text
    :param out: where the report goes (default stdout)
    :param err: where the one-line error for an unreadable file goes (default stderr)
    :return: exit status: 0 healthy, 1 non-finite values found, 2 not a readable SB3 model
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
