"""``diagnose``: read a model file as untrusted input and report what loading it would run and what its tensors hold."""

import contextlib
import io
import json
import os
import pickletools
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from sb3_safe.common.distributions import DEFAULT_LOG_STD_RANGE
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy
from sb3_safe.common.recurrent import SafeCnnLstmPolicy, SafeMultiInputLstmPolicy, SafeRecurrentActorCriticPolicy
from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.archive import SizeLimits, UnreadableModelError, open_archive, read_entry
from sb3_safe.doctor.pickles import (
    PickleReport,
    data_item_entry,
    data_pickles,
    scan_data,
    scan_pickle_file,
    scan_torch_entry,
)
from sb3_safe.doctor.report import DoctorReport, StoredFunction
from sb3_safe.doctor.scan import PickleScan, printable
from sb3_safe.doctor.tensors import VARIABLE_ENTRIES, check_state_dict, check_tensors, check_variables, load_torch_entry

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_UNREADABLE = 2

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


@contextlib.contextmanager
def _in_file(path: Path) -> Iterator[None]:
    """Name the model file in the messages about its entries."""
    try:
        yield
    except UnreadableModelError as error:
        raise UnreadableModelError(f"{path}: {error}") from None


def resolve_path(path: str | Path) -> Path:
    """
    The file a path names as SB3's loaders find it: a path that is not a file is tried with ``.zip`` (``load``)
    and ``.pkl`` (``load_replay_buffer``) appended. A folder too: rl_zoo3 saves ``<env>.zip`` next to a folder
    ``<env>`` (its statistics and configuration).

    :param path: the path as given
    :return: the path, or the first of those that is a file
    """
    path = Path(path)
    if path.is_file():
        return path
    with_suffix = [path.with_name(f"{path.name}.{suffix}") for suffix in ("zip", "pkl")]
    return next((candidate for candidate in with_suffix if candidate.is_file()), path)


def _read_entries(path: Path, limits: SizeLimits) -> tuple[bytes, dict[str, bytes]]:
    """The ``data`` entry and every ``.pth`` entry (as SB3's ``load`` finds them), after the checks of the archive."""
    if path.is_dir():
        models = sorted(model.name for model in path.glob("*.zip"))
        holds = f" (it holds {', '.join(models[:3])}{', ...' if len(models) > 3 else ''})" if models else ""
        raise UnreadableModelError(f"{path}: is a directory; pass the model's .zip{holds}")
    if not path.is_file():
        raise UnreadableModelError(f"{path}: no such file")
    try:
        file = path.open("rb")
    except OSError as error:
        raise UnreadableModelError(f"{path}: cannot open it ({error.strerror})") from None
    with file, open_archive(file, str(path), limits) as archive:
        names = archive.namelist()
        for required, what in (("policy.pth", "the policy's tensors"), ("data", "the model's metadata")):
            if required not in names:
                raise UnreadableModelError(f"{path}: a zip archive without {required} ({what}), so not a saved SB3 model")
        with _in_file(path):
            data = read_entry(archive, "data")
            torch_entries = {name: read_entry(archive, name) for name in names if os.path.splitext(name)[1] == ".pth"}
    return data, torch_entries


def _is_pickle_file(path: Path) -> bool:
    """Whether the file starts as a pickle of protocol 2 or later does (a zip starts with ``PK``)."""
    try:
        with path.open("rb") as file:
            start = file.read(2)
    except OSError:
        return False
    return len(start) == 2 and start[0] == 0x80 and 2 <= start[1] <= 5


def _diagnose_pickle(path: Path, limits: SizeLimits, rules: Allowlist) -> DoctorReport:
    """A pickle file SB3 writes besides model zips (``vecnormalize.pkl``, a replay buffer): its globals only."""
    size = path.stat().st_size
    if size > limits.entry:
        raise UnreadableModelError(
            f"{path}: a pickle of {size / 2**20:.1f} MiB, beyond the limit of {limits.entry / 2**20:.1f} MiB per "
            "entry (--max-entry-mb raises it)"
        )
    pickles = PickleReport()
    scan_pickle_file(path.read_bytes(), path.name, rules, limits, pickles)
    if pickles.problems and not pickles.findings:
        raise UnreadableModelError(f"{path}: {pickles.problems[0].removeprefix(f'{path.name}: ')}")
    return DoctorReport(str(path), unsafe=pickles.findings, tensors_checked=False, pickle_only=True)


def parse_data(raw: bytes) -> dict[str, Any]:
    """The ``data`` entry as SB3's ``load`` reads it: UTF-8 JSON of an object."""
    try:
        data = json.loads(raw.decode())
    except UnicodeDecodeError:
        raise UnreadableModelError("data: expected UTF-8 JSON text, got bytes that are not UTF-8") from None
    except RecursionError:
        raise UnreadableModelError("data: JSON nested too deeply to read (beyond Python's recursion limit)") from None
    except ValueError as error:  # JSONDecodeError, and integers beyond Python's digit limit
        raise UnreadableModelError(f"data: expected JSON, {str(error).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UnreadableModelError(f"data: expected a JSON object (the model's attributes), got a {type(data).__name__}")
    return data


def _named_class(scan: PickleScan | None) -> str | None:
    """The class a data item's pickle names, when it only names one allowed class."""
    if scan is None or scan.findings or scan.error is not None or scan.calls or len(scan.references) != 1:
        return None
    return str(scan.references[0])


def _read_metadata(data: dict[str, Any], scans: dict[str, PickleScan], report: DoctorReport) -> None:
    num_timesteps = data.get("num_timesteps")
    if isinstance(num_timesteps, int) and not isinstance(num_timesteps, bool):
        report.num_timesteps = num_timesteps
    report.policy_class = _named_class(scans.get("policy_class"))
    policy_kwargs = data.get("policy_kwargs")
    # SB3 writes the JSON-able items of policy_kwargs as JSON, also when it pickles the whole dict
    declared = policy_kwargs.get("log_std_range") if isinstance(policy_kwargs, dict) else None
    if (
        isinstance(declared, list)
        and len(declared) == 2
        and all(isinstance(bound, int | float) and not isinstance(bound, bool) for bound in declared)
    ):
        report.log_std_limits = (float(declared[0]), float(declared[1]))
        report.log_std_limits_source = "the policy's log_std_range"
    elif report.policy_class in _SAFE_POLICIES:
        report.log_std_limits = DEFAULT_LOG_STD_RANGE
        report.log_std_limits_source = "the default log_std_range of sb3-safe's policies"


def _load_tensors(
    torch_entries: dict[str, bytes], skip: set[str], report: DoctorReport
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], str]:
    """The state dicts and variables of the entries not in ``skip``; an unreadable entry raises, unless the file is unsafe."""
    params: dict[str, dict[str, Any]] = {}
    variables: dict[str, Any] = {}
    variables_entry = VARIABLE_ENTRIES[0]
    for name, raw in torch_entries.items():
        if name in skip:
            report.unchecked.append(f"{name}: its pickle is not one SB3 writes, so its tensors are not loaded")
            continue
        try:
            loaded = load_torch_entry(raw, name)
            if name in VARIABLE_ENTRIES:
                variables, variables_entry = check_variables(loaded, name), name
            else:
                params[os.path.splitext(name)[0]] = check_state_dict(loaded, name)
        except UnreadableModelError as error:
            if not report.unsafe:
                raise
            report.unchecked.append(str(error))
    return params, variables, variables_entry


def diagnose(
    path: str | Path, top: int = 5, limits: SizeLimits | None = None, trusted_modules: tuple[str, ...] = ()
) -> DoctorReport:
    """
    Check a saved SB3 model without loading it: what its pickles would import and call when loaded (against what
    SB3 / sb3-contrib / sb3-safe model files hold, :mod:`sb3_safe.doctor.allowlist`); every tensor for NaN and
    inf; the policy's log-std against its ``log_std_range`` (sb3-safe's policies) or
    :data:`~sb3_safe.common.exploration.STOCK_LOG_STD_RANGE` (other policies), its other tensors against
    :data:`~sb3_safe.doctor.report.WEIGHT_LIMIT`.

    :param path: the model ``.zip`` (``.zip`` may be left out, as for SB3's ``load``)
    :param top: how many of the largest policy tensors to report
    :param limits: how much of the file may be read (default :class:`~sb3_safe.doctor.archive.SizeLimits`)
    :param trusted_modules: modules whose classes the file may name besides SB3's (the user's own)
    :return: the report
    :raises UnreadableModelError: if the file is not a readable SB3 model (and names nothing unsafe)
    """
    path = resolve_path(path)
    limits = limits or SizeLimits()
    rules = Allowlist(trusted_modules)
    if path.is_file() and _is_pickle_file(path):
        return _diagnose_pickle(path, limits, rules)
    data_raw, torch_entries = _read_entries(path, limits)
    pickles = PickleReport()
    with _in_file(path):
        data = parse_data(data_raw)
        scan_data(data_pickles(data), rules, limits, pickles)
        for name, raw in torch_entries.items():
            scan_torch_entry(raw, name, rules, limits, pickles)
        if pickles.problems and not pickles.findings:
            raise UnreadableModelError(pickles.problems[0])

    report = DoctorReport(str(path), unsafe=pickles.findings, unchecked=list(pickles.problems))
    report.stored_functions = [
        StoredFunction(key, scan.function_names.get("__module__"), scan.function_names.get("__qualname__"))
        for key, scan in pickles.scans.items()
        if any(finding.builds_code for finding in scan.findings)
    ]
    _read_metadata(data, pickles.scans, report)
    with _in_file(path):
        params, variables, variables_entry = _load_tensors(torch_entries, pickles.unsafe_entries, report)
    del torch_entries
    if "policy" not in params:
        report.tensors_checked = False
        return report
    try:
        with _in_file(path):
            check_tensors(params, variables, report, top, limits.total, variables_entry)
    except UnreadableModelError as error:
        if not report.unsafe:
            raise
        report.unchecked.append(str(error))
        report.tensors_checked = False
    return report


def _pickles_of(path: Path, entry: str, limits: SizeLimits) -> list[tuple[str, io.BytesIO]]:
    """The pickles of one entry (``data[KEY]`` or a ``.pth`` name), as binary files; of a pickle file, itself."""
    if path.is_file() and _is_pickle_file(path):
        if path.stat().st_size > limits.entry:
            raise UnreadableModelError(f"{path}: beyond the limit of {limits.entry / 2**20:.1f} MiB per entry")
        return [(path.name, io.BytesIO(path.read_bytes()))]
    data_raw, torch_entries = _read_entries(path, limits)
    with _in_file(path):
        item = re.fullmatch(r"""data\[["']?(.*?)["']?\]""", entry)
        if item is not None:
            pickles = data_pickles(parse_data(data_raw))
            if item.group(1) not in pickles:
                raise UnreadableModelError(f"data has no pickled item {item.group(1)!r} (pickled: {', '.join(pickles)})")
            return [(data_item_entry(item.group(1)), io.BytesIO(pickles[item.group(1)]))]
        if entry not in torch_entries:
            raise UnreadableModelError(f"no entry {entry!r} (pickles: data[KEY], {', '.join(torch_entries)})")
        raw = torch_entries[entry]
        if raw[:4] != b"PK\x03\x04":
            return [(f"{entry} (legacy format)", io.BytesIO(raw))]
        archive = open_archive(io.BytesIO(raw), entry, limits)
        return [
            (f"{entry} ({name})", io.BytesIO(read_entry(archive, name, entry)))
            for name in archive.namelist()
            if name.endswith(".pkl")
        ]


def disassemble(path: str | Path, entry: str, out: TextIO, limits: SizeLimits | None = None) -> None:
    """
    Print the opcodes of one pickle of a model file (``pickletools.dis``: nothing is loaded).

    :param path: the model ``.zip``
    :param entry: ``data[KEY]`` (a pickled item of ``data``) or a ``.pth`` entry (``policy.pth``)
    :param out: where to print
    :param limits: how much of the file may be read
    :raises UnreadableModelError: if there is no such pickle
    """
    for name, pickle in _pickles_of(resolve_path(path), entry, limits or SizeLimits()):
        print(f"{name}:", file=out)
        # torch's legacy format is several pickles in a row
        while pickle.tell() < len(pickle.getbuffer()):
            try:
                pickletools.dis(pickle, out)
            except BrokenPipeError:
                raise
            except Exception as error:  # pickletools stops at what is not a pickle
                print(f"(not a pickle from here: {error})", file=out)
                break


def run_doctor(
    path: str,
    top: int = 5,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
    limits: SizeLimits | None = None,
    trusted_modules: tuple[str, ...] = (),
    dis: str | None = None,
) -> int:
    """
    Diagnose a model file and print the report.

    :param path: the model ``.zip``
    :param top: how many of the largest policy tensors to report
    :param as_json: print the report as JSON instead of text
    :param out: where the report goes (default stdout)
    :param err: where the one-line error for an unreadable file goes (default stderr)
    :param limits: how much of the file may be read
    :param trusted_modules: modules whose classes the file may name besides SB3's (the user's own)
    :param dis: print the opcodes of this pickle (``data[KEY]``, ``policy.pth``) instead of the report
    :return: exit status: 0 healthy, 1 unhealthy (what loading would run beyond an SB3 file's needs, non-finite
        values or values beyond the limits), 2 not a readable SB3 model (or a directory, or beyond the size limits)
    """
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if dis is not None:
            disassemble(path, dis, out, limits)
            return EXIT_HEALTHY
        report = diagnose(path, top, limits, trusted_modules)
        print(json.dumps(report.to_dict(), indent=2) if as_json else report.format(), file=out)
    except UnreadableModelError as error:
        print(f"sb3-safe doctor: error: {error}", file=err)
        return EXIT_UNREADABLE
    except BrokenPipeError:
        # The reader closed the pipe (doctor ... | head -1): what it did not read is dropped, the status stands
        if dis is not None:
            return EXIT_HEALTHY
    except Exception as error:  # a file no check above foresaw: still one line, never a traceback
        message = printable((str(error).strip().splitlines() or [""])[0])
        print(
            f"sb3-safe doctor: error: {path}: cannot read it (an error in doctor, please report it: "
            f"{type(error).__name__}: {message})",
            file=err,
        )
        return EXIT_UNREADABLE
    return EXIT_HEALTHY if report.healthy else EXIT_UNHEALTHY
