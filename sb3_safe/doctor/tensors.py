"""
The tensors of a model file: loaded with ``th.load(weights_only=True)`` (no object of the file is built beyond
tensors and containers), checked to have the shapes SB3 writes, named as the guard names them, and held against
the limits of a working policy.
"""

import io
import math
from typing import Any

import torch as th

from sb3_safe.common import observation_norm, value_norm
from sb3_safe.common.numerics import find_nonfinite
from sb3_safe.doctor.archive import UnreadableModelError, first_line
from sb3_safe.doctor.report import WEIGHT_LIMIT, BeyondLimit, DoctorReport
from sb3_safe.doctor.scan import printable

#: Buffers of running statistics (of the returns, of the observations) in their own units, not weights
STATISTICS = value_norm.STATISTICS + observation_norm.STATISTICS

#: The entries SB3 reads as pytorch variables ("tensors.pth": SB3 before 0.9)
VARIABLE_ENTRIES = ("pytorch_variables.pth", "tensors.pth")


def load_torch_entry(raw: bytes, entry: str, map_location: th.device | str = "cpu") -> Any:
    """
    ``th.load`` of one entry, as SB3's ``load`` reads it (``weights_only=True``).

    :param raw: the entry's bytes
    :param entry: its name, for the message
    :param map_location: where the tensors go
    :raises UnreadableModelError: naming the entry, when torch cannot read it
    """
    try:
        return th.load(io.BytesIO(raw), map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many types for a damaged file
        raise UnreadableModelError(f"{printable(entry)}: cannot load its tensors ({first_line(error)})") from None


def _kind(value: Any) -> str:
    return "a tensor" if isinstance(value, th.Tensor) else f"a {type(value).__name__}"


def check_state_dict(value: Any, entry: str) -> dict[str, Any]:
    """
    ``value`` if it has the shape SB3 saves in a ``.pth`` entry: a module's state dict (names to tensors), or an
    optimizer's (``state``: index to a dict of tensors, ``param_groups``: a list of dicts with ``params``).

    :raises UnreadableModelError: naming the entry and what was expected
    """
    if not isinstance(value, dict):
        raise UnreadableModelError(f"{entry}: expected a state dict (names to tensors), got {_kind(value)}")
    if "state" in value and "param_groups" in value:
        state, groups = value["state"], value["param_groups"]
        expected = "an optimizer state dict (state: a dict of dicts, param_groups: a list of dicts with params)"
        if not isinstance(state, dict) or not all(isinstance(item, dict) for item in state.values()):
            raise UnreadableModelError(f"{entry}: expected {expected}, got state of type {type(state).__name__}")
        if not isinstance(groups, list) or not all(
            isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups
        ):
            kind = type(groups).__name__ if not isinstance(groups, list) else "list with an item that is not so"
            raise UnreadableModelError(f"{entry}: expected {expected}, got param_groups of type {kind}")
    return value


def check_variables(value: Any, entry: str) -> dict[str, Any]:
    """``value`` if it is what SB3 saves as pytorch variables: a dict of names to tensors (or None: none saved)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnreadableModelError(f"{entry}: expected a dict of tensors (names to tensors), got {_kind(value)}")
    return value


def named_tensors(params: dict[str, dict[str, Any]], variables: dict[str, Any]) -> list[tuple[str, th.Tensor]]:
    """Every floating-point tensor of the file, named like the guard names them."""
    named: list[tuple[str, Any]] = []
    modules = {name: state_dict for name, state_dict in params.items() if not _is_optimizer(state_dict)}
    for dict_name, state_dict in params.items():
        if _is_optimizer(state_dict):
            names = _optimizer_parameter_names(dict_name, state_dict, modules)
            for index, state in state_dict["state"].items():
                param = names.get(index, str(index))
                named += [(f"{dict_name}.state[{param}].{key}", value) for key, value in state.items()]
        else:
            named += [(f"{dict_name}.{key}", value) for key, value in state_dict.items()]
    named += [(str(name), value) for name, value in variables.items()]
    # The names come from the file
    return [(printable(name), value) for name, value in named if _is_dense_float(value)]


def check_sizes(sources: dict[str, dict[str, Any]], max_total: int) -> None:
    """
    Refuse tensors larger than their storage, and more tensor bytes in all than ``max_total``.

    A tensor is a view of its storage: with a stride of 0, a file can make one stored value a tensor of 10^12
    values, which checking for NaN would expand. SB3 saves each tensor with a storage of its own size.

    :param sources: each entry's loaded state dict (or variables), by entry name
    :param max_total: most bytes of tensor values to check
    :raises UnreadableModelError: naming the entry
    """
    total = 0
    for entry, state_dict in sources.items():
        values = (
            [(f"state[{index}].{key}", value) for index, state in state_dict["state"].items() for key, value in state.items()]
            if _is_optimizer(state_dict)
            else list(state_dict.items())
        )
        for key, tensor in values:
            if not _is_dense_float(tensor):
                continue
            size = tensor.numel() * tensor.element_size()
            stored = tensor.untyped_storage().nbytes()
            if tensor.numel() > 0 and size > stored:
                raise UnreadableModelError(
                    f"{entry}: tensor {printable(str(key))} has {tensor.numel()} values over a storage of {stored} bytes "
                    "(overlapping views, which SB3 never saves)"
                )
            total += size
            if total > max_total:
                raise UnreadableModelError(
                    f"{entry}: the tensors pass {max_total / 2**20:.1f} MiB in all (--max-total-mb raises it)"
                )


def _is_dense_float(value: Any) -> bool:
    # A sparse or meta tensor has no values to check (SB3 saves neither)
    return isinstance(value, th.Tensor) and value.is_floating_point() and value.layout == th.strided and not value.is_meta


def _is_optimizer(state_dict: dict[str, Any]) -> bool:
    return "state" in state_dict and "param_groups" in state_dict


def _optimizer_parameter_names(
    optimizer_name: str, optimizer: dict[str, Any], modules: dict[str, dict[str, Any]]
) -> dict[Any, str]:
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
            (str(key), value)
            for key, value in state_dict.items()
            if isinstance(value, th.Tensor) and value.is_floating_point()
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


def _state_shapes_match(state: Any, param: th.Tensor) -> bool:
    # Per-parameter optimizer state (Adam's moments, RMSprop's square average) has the parameter's shape
    if not isinstance(state, dict):
        return False
    return all(value.shape == param.shape for value in state.values() if isinstance(value, th.Tensor) and value.dim() > 0)


def check_tensors(
    params: dict[str, dict[str, Any]],
    variables: dict[str, Any],
    report: DoctorReport,
    top: int,
    max_total: int,
    variables_entry: str = VARIABLE_ENTRIES[0],
) -> None:
    """
    Fill ``report`` with the tensors' findings: non-finite values, the log-std range, the largest weights, limits.

    :param params: the state dicts, by entry name without ``.pth`` (``policy``, ``policy.optimizer``)
    :param variables: the pytorch variables
    :param report: the report to fill
    :param top: how many of the largest policy tensors to report
    :param max_total: most bytes of tensor values to check
    :param variables_entry: the entry the variables come from
    :raises UnreadableModelError: for tensors beyond their storage or ``max_total`` bytes (:func:`check_sizes`)
    """
    check_sizes({f"{name}.pth": state_dict for name, state_dict in params.items()} | {variables_entry: variables}, max_total)
    named = named_tensors(params, variables)
    report.n_tensors = len(named)
    report.n_values = sum(tensor.numel() for _, tensor in named)
    report.nonfinite = find_nonfinite(named)

    policy = [
        (printable(f"policy.{key}"), tensor)
        for key, tensor in params.get("policy", {}).items()
        # normalize_value's and normalize_observations' running statistics are in their data's units: not weights
        if _is_dense_float(tensor) and tensor.numel() > 0 and key.rpartition(".")[2] not in STATISTICS
    ]
    log_stds = [tensor for name, tensor in policy if name.endswith("log_std")]
    report.has_log_std = bool(log_stds)
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
