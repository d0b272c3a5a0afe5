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
from typing import IO, Any, TextIO

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.vec_env import VecNormalize

from sb3_safe.common.distributions import DEFAULT_LOG_STD_RANGE
from sb3_safe.common.policies import SafeActorCriticPolicy, SafeCnnPolicy, SafeMultiInputPolicy
from sb3_safe.common.recurrent import SafeCnnLstmPolicy, SafeMultiInputLstmPolicy, SafeRecurrentActorCriticPolicy
from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.archive import first_line, open_archive, read_entry
from sb3_safe.doctor.budget import ReadingBudget, SizeLimits, UnreadableModelError
from sb3_safe.doctor.pickles import data_item_entry, data_pickles
from sb3_safe.doctor.reading import ModelContents, RefusedPickle, check_pickle_size, parse_data, read_model, read_pickle
from sb3_safe.doctor.report import DoctorReport, StoredFunction
from sb3_safe.doctor.scan import PickleScan
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


def _open(path: Path) -> IO[bytes]:
    """The model file, opened as SB3's ``load`` finds it (a folder or a missing file named in one line)."""
    if path.is_dir():
        models = sorted(model.name for model in path.glob("*.zip"))
        holds = f" (it holds {', '.join(models[:3])}{', ...' if len(models) > 3 else ''})" if models else ""
        raise UnreadableModelError(f"{path}: is a directory; pass the model's .zip{holds}")
    if not path.is_file():
        raise UnreadableModelError(f"{path}: no such file")
    try:
        return path.open("rb")
    except OSError as error:
        raise UnreadableModelError(f"{path}: cannot open it ({error.strerror})") from None


def _is_pickle_file(path: Path) -> bool:
    """Whether the file starts as a pickle of protocol 2 or later does (a zip starts with ``PK``)."""
    try:
        with path.open("rb") as file:
            start = file.read(2)
    except OSError:
        return False
    return len(start) == 2 and start[0] == 0x80 and 2 <= start[1] <= 5


def _diagnose_pickle(path: Path, budget: ReadingBudget, rules: Allowlist) -> DoctorReport:
    """A pickle file SB3 writes besides model zips (``vecnormalize.pkl``, a replay buffer): read as load reads it."""
    with _in_file(path):
        check_pickle_size(path.stat().st_size, path.name, budget.limits)  # before reading it
        try:
            pickles, loaded = read_pickle(path.read_bytes(), path.name, rules, budget)
        except RefusedPickle as refused:
            return DoctorReport(str(path), unsafe=[refused.finding], tensors_checked=False, pickle_only=True)
        if pickles.problems and not pickles.findings:
            raise UnreadableModelError(pickles.problems[0])
        if not pickles.findings and not isinstance(loaded, VecNormalize | BaseBuffer):
            # What SB3's loaders of pickles refuse (VecNormalize.load, load_replay_buffer)
            raise UnreadableModelError(
                f"{path.name}: holds a {type(loaded).__name__}, not VecNormalize statistics or a replay buffer"
            )
    return DoctorReport(str(path), unsafe=pickles.findings, tensors_checked=False, pickle_only=True)


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


def _build(
    path: Path,
    contents: ModelContents,
    algorithm: type[BaseAlgorithm] | None,
    report: DoctorReport,
    limits: SizeLimits,
    trusted_modules: tuple[str, ...],
) -> None:
    """
    Build the model from what was read, as :func:`sb3_safe.load` builds it (one function for both, within the same
    limits), into ``report``.

    :raises UnreadableModelError: for a model SB3 cannot build from the file, or beyond the limits of building it,
        with the cause :func:`sb3_safe.load` refuses it for
    """
    # Imported here: sb3_safe.loading reads files with this package's modules
    from sb3_safe.loading.building import algorithm_of, build_model
    from sb3_safe.loading.readers import ReadModel, RefusedFileError, secure_reading

    skipped = [data_item_entry(key) for key in contents.report.scans if key not in contents.objects]
    if skipped:
        report.not_built = (
            f"{', '.join(skipped)} name{'s' if len(skipped) == 1 else ''} a module you trust, which doctor does not "
            "import (sb3_safe.load with trust= builds the model)"
        )
        return
    algorithm = algorithm or algorithm_of(contents.data or {}, contents.objects.get("policy_class"))
    try:
        with secure_reading(trusted_modules, limits, ReadModel(str(path), path.stat().st_size, contents)) as reading:
            model = build_model(algorithm, reading, str(path), device="cpu")
    except RefusedFileError as refused:
        raise UnreadableModelError(refused.problem or str(refused)) from None
    report.built = algorithm.__name__
    report.built_parameters = sum(parameter.numel() for parameter in model.policy.parameters())


def diagnose(
    path: str | Path,
    top: int = 5,
    limits: SizeLimits | None = None,
    trusted_modules: tuple[str, ...] = (),
    algorithm: type[BaseAlgorithm] | None = None,
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
    :param algorithm: the algorithm whose ``load`` builds the model (default: the one whose saved items its data
        holds, :func:`~sb3_safe.loading.building.algorithm_of`)
    :return: the report
    :raises UnreadableModelError: if the file is not a readable SB3 model (and names nothing unsafe), or one from
        which SB3 cannot build the model it describes within the limits (what :func:`sb3_safe.load` refuses it for)
    """
    path = resolve_path(path)
    budget = ReadingBudget(limits)
    rules = Allowlist(trusted_modules)
    if path.is_file() and _is_pickle_file(path):
        return _diagnose_pickle(path, budget, rules)
    with _open(path) as file, _in_file(path):
        try:
            # As sb3_safe.load reads it, but for the items that name a module of the user's: doctor does not
            # import it, so does not build them
            contents = read_model(file, str(path), rules, budget, unpickles=lambda scan: not _names_trusted(scan, rules))
        except RefusedPickle as refused:
            return DoctorReport(str(path), unsafe=[refused.finding], tensors_checked=False)
        pickles = contents.report
        if pickles.problems and not pickles.findings:
            raise UnreadableModelError(pickles.problems[0])

    report = DoctorReport(str(path), unsafe=pickles.findings, unchecked=list(pickles.problems))
    report.stored_functions = [
        StoredFunction(key, scan.function_names.get("__module__"), scan.function_names.get("__qualname__"))
        for key, scan in pickles.scans.items()
        if any(finding.builds_code for finding in scan.findings)
    ]
    _read_metadata(contents.data or {}, pickles.scans, report)
    with _in_file(path):
        if report.unsafe:
            report.not_built = "nothing is built from a file that would run code"
            params, variables, variables_entry = _load_tensors(contents.torch_entries, pickles.unsafe_entries, report)
        else:
            _build(path, contents, algorithm, report, budget.limits, trusted_modules)
            params, variables, variables_entry = _split_tensors(contents.tensors)
    del contents
    if "policy" not in params:
        report.tensors_checked = False
        return report
    try:
        with _in_file(path):
            check_tensors(params, variables, report, top, budget.limits.total, variables_entry)
    except UnreadableModelError as error:
        if not report.unsafe:
            raise
        report.unchecked.append(str(error))
        report.tensors_checked = False
    return report


def _names_trusted(scan: PickleScan, rules: Allowlist) -> bool:
    """Whether the pickle names a global of a module the user trusts."""
    return any(rules.is_trusted(found) for found in scan.references)


def _split_tensors(tensors: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any], str]:
    """The state dicts (by entry name without ``.pth``), the variables and their entry, of loaded entries."""
    variables_entry = next((name for name in tensors if name in VARIABLE_ENTRIES), VARIABLE_ENTRIES[0])
    params = {os.path.splitext(name)[0]: value for name, value in tensors.items() if name not in VARIABLE_ENTRIES}
    return params, tensors.get(variables_entry, {}), variables_entry


def _pickles_of(path: Path, entry: str, budget: ReadingBudget) -> list[tuple[str, io.BytesIO]]:
    """The pickles of one entry (``data[KEY]`` or a ``.pth`` name), as binary files; of a pickle file, itself."""
    if path.is_file() and _is_pickle_file(path):
        if path.stat().st_size > budget.limits.entry:
            raise UnreadableModelError(f"{path}: beyond the limit of {budget.limits.entry / 2**20:.1f} MiB per entry")
        return [(path.name, io.BytesIO(path.read_bytes()))]
    with _open(path) as file, _in_file(path), open_archive(file, str(path), budget) as archive:
        item = re.fullmatch(r"""data\[["']?(.*?)["']?\]""", entry)
        if item is not None:
            if "data" not in archive.namelist():
                raise UnreadableModelError("a zip archive without data (the model's metadata)")
            pickles = data_pickles(parse_data(read_entry(archive, "data")), budget)
            if item.group(1) not in pickles:
                raise UnreadableModelError(f"data has no pickled item {item.group(1)!r} (pickled: {', '.join(pickles)})")
            return [(data_item_entry(item.group(1)), io.BytesIO(pickles[item.group(1)]))]
        torch_entries = [name for name in archive.namelist() if os.path.splitext(name)[1] == ".pth"]
        if entry not in torch_entries:
            raise UnreadableModelError(f"no entry {entry!r} (pickles: data[KEY], {', '.join(torch_entries)})")
        raw = read_entry(archive, entry)
    if raw[:4] != b"PK\x03\x04":
        return [(f"{entry} (legacy format)", io.BytesIO(raw))]
    with _in_file(path):
        nested = open_archive(io.BytesIO(raw), entry, budget)
        return [
            (f"{entry} ({name})", io.BytesIO(read_entry(nested, name, entry)))
            for name in nested.namelist()
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
    for name, pickle in _pickles_of(resolve_path(path), entry, ReadingBudget(limits)):
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
    algorithm: type[BaseAlgorithm] | None = None,
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
    :param algorithm: the algorithm whose ``load`` builds the model (default: the one its data describes)
    :return: exit status: 0 healthy, 1 unhealthy (what loading would run beyond an SB3 file's needs, non-finite
        values or values beyond the limits), 2 not a readable SB3 model (or a directory, beyond the size limits, or
        one from which SB3 cannot build the model it describes)
    """
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if dis is not None:
            disassemble(path, dis, out, limits)
            return EXIT_HEALTHY
        report = diagnose(path, top, limits, trusted_modules, algorithm)
        print(json.dumps(report.to_dict(), indent=2) if as_json else report.format(), file=out)
    except UnreadableModelError as error:
        print(f"sb3-safe doctor: error: {error}", file=err)
        return EXIT_UNREADABLE
    except BrokenPipeError:
        # The reader closed the pipe (doctor ... | head -1): what it did not read is dropped, the status stands
        if dis is not None:
            return EXIT_HEALTHY
    except Exception as error:  # a file no check above foresaw: still one line, never a traceback
        print(
            f"sb3-safe doctor: error: {path}: cannot read it (an error in doctor, please report it: {first_line(error)})",
            file=err,
        )
        return EXIT_UNREADABLE
    return EXIT_HEALTHY if report.healthy else EXIT_UNHEALTHY
