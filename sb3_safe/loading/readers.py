"""
SB3's readers of saved files, made to read every pickle without running code from the file, and the context in
which SB3's own ``load`` uses them.

SB3 reads a model zip in ``load_from_zip_file`` (``cloudpickle.loads`` of each ``:serialized:`` item of ``data``,
``th.load(weights_only=True)`` of each ``.pth`` entry), a replay buffer in ``load_from_pkl`` and VecNormalize
statistics in ``VecNormalize.load`` (both ``pickle.load``). Inside :func:`secure_reading`, those three read through
the functions here instead, which:

1. read the file once, into memory (what is checked is what is loaded);
2. read it as ``sb3-safe doctor`` reads it (:mod:`sb3_safe.doctor.reading`, one verdict for both), within one
   budget for the whole file (:class:`~sb3_safe.doctor.budget.SizeLimits`): every pickle the original would
   unpickle scanned, nothing run, and the file refused (:class:`RefusedFileError`, naming every global and its entry)
   if any names or calls more than the allowlist allows, is not a valid pickle, or passes the budget; then ``data``'s
   items and the pickle files unpickled with :class:`~sb3_safe.doctor.unpickler.RestrictedUnpickler`, which enforces
   the same allowlist on the objects, and the ``.pth`` entries loaded with ``th.load(weights_only=True)`` as SB3
   does (torch's own restricted unpickler);
3. return what the original returns, so that SB3's ``load`` builds the model as it always does.

Outside the context (another thread, another task), SB3's readers are SB3's: the routing to these functions is
installed on first use and reads the context of the caller only.
"""

import contextlib
import contextvars
import functools
import io
import os
import pathlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch as th
from stable_baselines3.common import base_class, off_policy_algorithm
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.save_util import open_path
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.archive import open_archive, read_entry
from sb3_safe.doctor.budget import ReadingBudget, SizeLimits, UnreadableModelError
from sb3_safe.doctor.pickles import PickleReport, data_item_entry
from sb3_safe.doctor.reading import ModelContents, RefusedPickle, read_model, read_pickle
from sb3_safe.doctor.scan import Finding, printable

#: The entries SB3's load reads as pytorch variables ("tensors.pth": SB3 before 0.9)
_VARIABLE_ENTRIES = ("pytorch_variables.pth", "tensors.pth")


class RefusedFileError(ValueError):
    """
    A file that sb3-safe's loaders refuse to load, before building anything from it. The message is one line: each
    global the file would import or call beyond the allowlist, with the entry holding it; the items that hold a
    function stored with its code, with the ``custom_objects`` that replace them; or why the file cannot be read;
    and the ``sb3-safe doctor`` command that inspects it.

    A ``ValueError``, as SB3's ``load`` raises for a file that is not a model.

    :param path: the file
    :param findings: what loading it would run beyond the allowlist
    :param stored_functions: the items of ``data`` that hold a function stored with its code
    :param problem: why it cannot be read, if it cannot
    """

    def __init__(
        self,
        path: str,
        findings: Sequence[Finding] = (),
        stored_functions: Sequence[str] = (),
        problem: str | None = None,
    ) -> None:
        self.path = path
        self.findings = list(findings)
        self.stored_functions = list(stored_functions)
        self.problem = problem
        super().__init__(self._message())

    def _message(self) -> str:
        parts = []
        # The stored functions of data items are named apart, with the custom_objects that replace them
        stored = {data_item_entry(key) for key in self.stored_functions}
        code = [finding for finding in self.findings if not (finding.builds_code and finding.entry in stored)]
        if code:
            named = "; ".join(f"{finding.target} ({finding.entry}: {finding.detail})" for finding in code)
            parts.append(f"loading it would run code from {named}")
        if self.stored_functions:
            entries = ", ".join(data_item_entry(key) for key in self.stored_functions)
            replacements = ", ".join(printable(f'"{key}": ...') for key in self.stored_functions)
            what = (
                "holds a function stored with its code (a lambda or a closure), which is not rebuilt: replace it"
                if len(self.stored_functions) == 1
                else "hold functions stored with their code (lambdas or closures), which are not rebuilt: replace them"
            )
            parts.append(
                f"{entries} {what} with custom_objects={{{replacements}}} (a float, or a schedule such as "
                "stable_baselines3.common.utils.FloatSchedule)"
            )
        if self.problem is not None:
            parts.append(printable(self.problem))
        if any(finding.detail.startswith("the pickle imports it") for finding in code):
            parts.append("a class of your own: trust its module (trust=, sb3-safe's --trust MODULE)")
        path = printable(self.path)
        return f"{path}: refused: {'; '.join(parts)}; inspect it with: sb3-safe doctor {path}"


@dataclass(frozen=True)
class ReadModel:
    """
    A model zip already read by :func:`~sb3_safe.doctor.reading.read_model` (doctor's reading), for SB3's ``load`` to
    build the model from instead of reading a file.

    :param name: the file, as messages name it
    :param size: its size in bytes
    :param contents: what was read
    """

    name: str
    size: int
    contents: ModelContents


@dataclass
class SecureReading:
    """
    How the readers read inside :func:`secure_reading`.

    :param rules: the allowlist, with the user's trusted modules
    :param limits: the budget of each file
    :param read: the model files read in full so far (what fails after is the building of the model)
    :param size: the size in bytes of the model file read last
    :param model: a model zip already read, which the reader of model zips returns whatever path it is given
    """

    rules: Allowlist
    limits: SizeLimits
    read: list[str] = field(default_factory=list)
    size: int = 0
    model: ReadModel | None = None


_READING: contextvars.ContextVar[SecureReading | None] = contextvars.ContextVar("sb3_safe_secure_reading", default=None)


def _read_file(path: str | pathlib.Path | io.BufferedIOBase, verbose: int, suffix: str, from_start: bool) -> tuple[str, bytes]:
    """
    The name and bytes of a file as SB3's readers open it (``open_path``: a path may leave out ``.suffix``); a file
    object from its start (as ``zipfile`` reads it) or from where it is (as ``pickle.load`` reads it).
    """
    file = open_path(path, "r", verbose=verbose, suffix=suffix)
    opened = isinstance(path, str | pathlib.Path)
    try:
        if from_start:
            file.seek(0)
        return str(getattr(file, "name", path if opened else "<file object>")), file.read()
    finally:
        if opened:
            file.close()


def _refuse_if_unsafe(name: str, report: PickleReport) -> None:
    if report.findings or report.problems:
        stored = [key for key, scan in report.scans.items() if any(finding.builds_code for finding in scan.findings)]
        problem = report.problems[0] if report.problems and not report.findings else None
        raise RefusedFileError(name, report.findings, stored, problem)


@contextlib.contextmanager
def _refusing(name: str) -> Iterator[None]:
    """What doctor's reading refuses, as :class:`RefusedFileError` (no frame of the reading chained to it)."""
    refusal: RefusedFileError | None = None
    try:
        yield
    except RefusedPickle as refused:
        refusal = RefusedFileError(name, [refused.finding])
    except UnreadableModelError as error:
        refusal = RefusedFileError(name, problem=str(error).removeprefix(f"{name}: "))
    if refusal is not None:
        raise refusal from None


def read_model_zip(
    reading: SecureReading,
    load_path: str | pathlib.Path | io.BufferedIOBase,
    load_data: bool = True,
    custom_objects: dict[str, Any] | None = None,
    device: th.device | str = "auto",
    verbose: int = 0,
    print_system_info: bool = False,
) -> tuple[dict[str, Any] | None, dict[str, Any], Any]:
    """
    SB3's ``load_from_zip_file``, reading the pickles as the module docstring says.

    :param reading: the allowlist and limits
    :param load_path: the model zip (``.zip`` may be left out), or a binary file
    :param load_data: whether to read ``data`` (the model's attributes), or only the tensors
    :param custom_objects: items of ``data`` to use instead of the file's, never unpickled
    :param device: where the tensors go
    :param verbose: SB3's verbosity, for ``open_path``
    :param print_system_info: print the ``system_info.txt`` the model was saved with
    :return: the attributes, the state dicts by entry name (without ``.pth``), the pytorch variables
    :raises RefusedFileError: before anything is unpickled, for a file that names or calls more than the allowlist,
        or that is not a readable model
    """
    if load_data and custom_objects is not None and not isinstance(custom_objects, dict):
        raise ValueError("custom_objects argument must be a dict or None")
    replaced = custom_objects or {}
    if reading.model is not None:
        name, size, contents = reading.model.name, reading.model.size, reading.model.contents
    else:
        name, raw = _read_file(load_path, verbose, "zip", from_start=True)
        size = len(raw)
        if print_system_info:
            _print_system_info(name, raw, reading.limits)
        budget = ReadingBudget(reading.limits)
        with _refusing(name):
            contents = read_model(io.BytesIO(raw), name, reading.rules, budget, load_data, replaced.keys(), get_device(device))
        del raw
    _refuse_if_unsafe(name, contents.report)
    data = None
    if contents.data is not None:
        data = {key: replaced.get(key, contents.objects.get(key, item)) for key, item in contents.data.items()}
        if data.get("env") is not None:
            # SB3 never saves the environment; its load would make one of what the file names there
            raise RefusedFileError(name, problem='data["env"]: an environment, which SB3 never saves')
    params: dict[str, Any] = {}
    pytorch_variables = None
    for entry, loaded in contents.tensors.items():
        if entry in _VARIABLE_ENTRIES:
            pytorch_variables = loaded
        else:
            params[os.path.splitext(entry)[0]] = loaded
    reading.size = size
    reading.read.append(name)
    return data, params, pytorch_variables


def _print_system_info(name: str, raw: bytes, limits: SizeLimits) -> None:
    """Print the ``system_info.txt`` the model was saved with, as SB3's ``load_from_zip_file`` does."""
    with _refusing(name), open_archive(io.BytesIO(raw), name, ReadingBudget(limits)) as archive:
        if "system_info.txt" in archive.namelist():
            print("== SAVED MODEL SYSTEM INFO ==")
            print(read_entry(archive, "system_info.txt", name).decode())
        else:
            warnings.warn("The model was saved with SB3 <= 1.2.0 and thus cannot print system information.", UserWarning)


def _read_pickle(reading: SecureReading, name: str, raw: bytes, entry: str) -> Any:
    with _refusing(name):
        report, loaded = read_pickle(raw, entry, reading.rules, ReadingBudget(reading.limits))
    _refuse_if_unsafe(name, report)
    return loaded


def read_pickle_file(reading: SecureReading, path: str | pathlib.Path | io.BufferedIOBase, verbose: int = 0) -> Any:
    """
    SB3's ``load_from_pkl`` (a replay buffer), reading the pickle as the module docstring says.

    :param reading: the allowlist and limits
    :param path: the pickle file (``.pkl`` may be left out), or a binary file
    :param verbose: SB3's verbosity, for ``open_path``
    :raises RefusedFileError: before anything is unpickled, for a pickle that names or calls more than the allowlist
    """
    name, raw = _read_file(path, verbose, "pkl", from_start=False)
    return _read_pickle(reading, name, raw, os.path.basename(name))


def read_vec_normalize(reading: SecureReading, load_path: str, venv: VecEnv) -> VecNormalize:
    """
    ``VecNormalize.load``: the statistics of ``load_path`` (pickled by ``VecNormalize.save``), wrapping ``venv``.

    :param reading: the allowlist and limits
    :param load_path: the pickle file
    :param venv: the environment to wrap
    :raises RefusedFileError: before anything is unpickled, for a pickle that names or calls more than the allowlist,
        and for one that holds something else than VecNormalize statistics
    """
    with open(load_path, "rb") as file:
        raw = file.read()
    entry = os.path.basename(load_path)
    vec_normalize = _read_pickle(reading, str(load_path), raw, entry)
    if not isinstance(vec_normalize, VecNormalize):
        raise RefusedFileError(
            str(load_path),
            # As doctor names a pickle that is neither (a replay buffer has its own loader)
            problem=f"{entry}: holds a {type(vec_normalize).__name__}, not VecNormalize statistics"
            + ("" if isinstance(vec_normalize, BaseBuffer) else " or a replay buffer"),
        )
    vec_normalize.set_venv(venv)
    return vec_normalize


def _route(owner: Any, name: str, secure: Callable[..., Any], wrap: Callable[[Any], Any] = lambda function: function) -> None:
    """
    Make ``owner.name`` call ``secure`` inside :func:`secure_reading`, and what it was before everywhere else (the
    routing already there is kept; one put over it is routed in turn).
    """
    current = getattr(owner, name)
    if getattr(current, "__sb3_safe_secure__", None) is secure:
        return

    @functools.wraps(current)
    def routed(*args: Any, **kwargs: Any) -> Any:
        reading = _READING.get()
        return current(*args, **kwargs) if reading is None else secure(reading, *args, **kwargs)

    routed.__sb3_safe_secure__ = secure  # type: ignore[attr-defined]
    setattr(owner, name, wrap(routed))


@contextlib.contextmanager
def secure_reading(
    trust: Sequence[str] = (), limits: SizeLimits | None = None, model: ReadModel | None = None
) -> Iterator[SecureReading]:
    """
    Inside this block, SB3's ``load`` (its ``load_from_zip_file``), ``load_replay_buffer`` (its ``load_from_pkl``) and
    ``VecNormalize.load`` read files with the functions of this module: they refuse a file whose pickles name or call
    more than the allowlist, or that costs more than its budget, with :class:`RefusedFileError`, before building
    anything from it.

    :param trust: modules (or packages) of your own whose classes the files may name, as ``sb3-safe doctor --trust``
    :param limits: the budget of each file (default :class:`~sb3_safe.doctor.budget.SizeLimits`: doctor's)
    :param model: a model zip already read: SB3's ``load`` builds from it, whatever path it is given
    """
    # SB3's modules look these names up when they run: routed here, the rest of SB3 is unchanged
    _route(base_class, "load_from_zip_file", read_model_zip)
    _route(off_policy_algorithm, "load_from_pkl", read_pickle_file)
    _route(VecNormalize, "load", read_vec_normalize, staticmethod)
    reading = SecureReading(Allowlist(tuple(trust)), limits or SizeLimits(), model=model)
    token = _READING.set(reading)
    try:
        yield reading
    finally:
        _READING.reset(token)
