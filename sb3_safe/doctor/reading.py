"""
Reading a saved file as untrusted input, the one way ``sb3-safe doctor`` and :func:`sb3_safe.load` both read it, so
that they give one verdict: a file doctor calls healthy loads, a file load refuses is not healthy, for the same
cause.

A model zip is read in four steps, each charged to the file's :class:`~sb3_safe.doctor.budget.ReadingBudget`:

1. its archive, within the sizes its directory declares (:mod:`~sb3_safe.doctor.archive`): ``data`` and every
   ``.pth`` entry;
2. every pickle loading unpickles (``data``'s ``:serialized:`` items, the ``.pth`` entries, the torch files nested
   in them), opcode by opcode, nothing run (:mod:`~sb3_safe.doctor.pickles`); a file whose pickles name or call
   more than the allowlist stops here, with its findings;
3. ``data``'s items, unpickled by :class:`~sb3_safe.doctor.unpickler.RestrictedUnpickler` (it builds only the
   allowlisted values: arrays, spaces, schedules);
4. the tensors, with ``th.load(weights_only=True)``, checked to have the shapes SB3 writes and no overlapping views.
"""

import contextlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import torch as th

from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.archive import first_line, open_archive, read_entry
from sb3_safe.doctor.budget import BudgetExceeded, ReadingBudget, SizeLimits, UnreadableModelError, size_text
from sb3_safe.doctor.pickles import PickleReport, data_item_entry, data_pickles, scan_data, scan_pickle_file, scan_torch_entry
from sb3_safe.doctor.scan import Finding, PickleScan, printable
from sb3_safe.doctor.tensors import VARIABLE_ENTRIES, check_sizes, check_state_dict, check_variables, load_torch_entry
from sb3_safe.doctor.unpickler import RefusedGlobal, restricted_loads

#: The entries a model zip must have: what SB3's ``load`` reads
REQUIRED_ENTRIES = (("policy.pth", "the policy's tensors"), ("data", "the model's metadata"))


class RefusedPickle(Exception):
    """
    The unpickler refused what the scan let pass: a check only the built objects allow.

    :param finding: what it refused
    """

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding


@dataclass
class ModelContents:
    """
    What :func:`read_model` read from a model zip.

    :param report: what the pickles would do (findings) and where they are not valid (problems)
    :param data: the ``data`` entry parsed as JSON (None when not read)
    :param objects: ``data``'s items, with the pickled ones unpickled (empty when the pickles have findings or
        problems: nothing is unpickled then)
    :param tensors: each ``.pth`` entry's state dict (or variables), by entry name (empty when the pickles have
        findings or problems)
    :param torch_entries: each ``.pth`` entry's bytes, when the pickles have findings or problems (the safe ones can
        still be inspected)
    """

    report: PickleReport
    data: dict[str, Any] | None = None
    objects: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, Any] = field(default_factory=dict)
    torch_entries: dict[str, bytes] = field(default_factory=dict)


@contextlib.contextmanager
def _unprefixed(name: str) -> Iterator[None]:
    """The archive's messages without its name: :func:`read_model`'s callers name the file."""
    try:
        yield
    except BudgetExceeded as error:
        raise BudgetExceeded(str(error).removeprefix(f"{name}: ")) from None
    except UnreadableModelError as error:
        raise UnreadableModelError(str(error).removeprefix(f"{name}: ")) from None


def parse_data(raw: bytes) -> dict[str, Any]:
    """
    The ``data`` entry as SB3's ``load`` reads it: UTF-8 JSON of an object.

    :param raw: the entry's bytes
    :raises UnreadableModelError: for bytes that are not UTF-8 JSON of an object
    """
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


def unpickle(pickle: bytes, entry: str, rules: Allowlist, budget: ReadingBudget) -> Any:
    """
    The object of a pickle the scan passed, built by the restricted unpickler.

    :param pickle: the pickle
    :param entry: where it is, for the messages
    :param rules: the allowlist
    :param budget: charged with its calls and the values searched in their arguments
    :raises RefusedPickle: for what the unpickler refuses (never reached for a pickle the scan passed)
    :raises BudgetExceeded: beyond the budget
    :raises UnreadableModelError: for a pickle the unpickler stops in (an allowlisted call that fails)
    """
    try:
        return restricted_loads(pickle, entry, rules, budget)
    except RefusedGlobal as refused:
        refusal: Exception = RefusedPickle(refused.finding)
    except BudgetExceeded as exceeded:
        refusal = exceeded
    except Exception as error:  # a pickle the scan read to its end, yet the unpickler stops in: one line all the same
        refusal = UnreadableModelError(f"{printable(entry)}: cannot be unpickled ({first_line(error)})")
    # Raised here, outside the handlers: no frame of the unpickler is chained to it
    raise refusal


def _load_tensors(raw: bytes, entry: str, map_location: th.device | str) -> Any:
    loaded = load_torch_entry(raw, entry, map_location)
    return check_variables(loaded, entry) if entry in VARIABLE_ENTRIES else check_state_dict(loaded, entry)


def read_model(
    file: IO[bytes],
    name: str,
    rules: Allowlist,
    budget: ReadingBudget,
    load_data: bool = True,
    replaced: Collection[str] = (),
    map_location: th.device | str = "cpu",
    unpickles: Callable[[PickleScan], bool] | None = None,
) -> ModelContents:
    """
    Read a model zip as the module docstring says.

    :param file: the zip, a seekable binary file
    :param name: how messages name it
    :param rules: the allowlist
    :param budget: the file's budget
    :param load_data: whether to read ``data`` (SB3's ``load_data``)
    :param replaced: items of ``data`` that are not read (``custom_objects`` replaces them)
    :param map_location: where the tensors go
    :param unpickles: whether to unpickle the pickled item of ``data`` with this scan (None: all)
    :return: the contents; when the pickles have findings or problems, only ``report`` (and ``data``)
    :raises UnreadableModelError: (unprefixed by ``name``) for a file that is not a readable model, BudgetExceeded
        beyond the budget, RefusedPickle for what the unpickler refuses
    """
    with _unprefixed(name), open_archive(file, name, budget) as archive:
        names = archive.namelist()
        for required, what in REQUIRED_ENTRIES:
            if required not in names and (required != "data" or load_data):
                raise UnreadableModelError(f"a zip archive without {required} ({what}), so not a saved SB3 model")
        data_raw = read_entry(archive, "data") if load_data else None
        torch_entries = {entry: read_entry(archive, entry) for entry in names if os.path.splitext(entry)[1] == ".pth"}
    contents = ModelContents(PickleReport())
    report = contents.report
    pickles: dict[str, bytes] = {}
    if data_raw is not None:
        contents.data = parse_data(data_raw)
        del data_raw
        # The items custom_objects replaces are never unpickled, so not read either (as SB3's json_to_data)
        pickles = data_pickles({key: item for key, item in contents.data.items() if key not in replaced}, budget)
        scan_data(pickles, rules, budget, report)
    for entry, raw in torch_entries.items():
        scan_torch_entry(raw, entry, rules, budget, report)
    if report.findings or report.problems:
        contents.torch_entries = torch_entries
        return contents

    # The unpickler charges a budget of its own: no more than the scan charged, as a second check
    unpickling = ReadingBudget(budget.limits)
    for key, pickle in pickles.items():
        if unpickles is None or unpickles(report.scans[key]):
            contents.objects[key] = unpickle(pickle, data_item_entry(key), rules, unpickling)
    for entry, raw in torch_entries.items():
        contents.tensors[entry] = _load_tensors(raw, entry, map_location)
    # A tensor can view more values than its storage holds (stride 0), and many tensors one storage
    check_sizes(contents.tensors, budget.limits.total)
    return contents


def check_pickle_size(size: int, entry: str, limits: SizeLimits) -> None:
    """
    Refuse a pickle file beyond the limit of one entry (as doctor, before reading it).

    :param size: its size in bytes
    :param entry: its name, for the message
    :param limits: the limits
    :raises UnreadableModelError: beyond ``limits.entry``
    """
    if size > limits.entry:
        raise UnreadableModelError(
            f"{entry}: a pickle of {size_text(size)}, beyond the limit of {size_text(limits.entry)} per entry "
            "(--max-entry-mb raises it)"
        )


def read_pickle(raw: bytes, entry: str, rules: Allowlist, budget: ReadingBudget) -> tuple[PickleReport, Any]:
    """
    Read a pickle file SB3 writes besides model zips (``vecnormalize.pkl``, a replay buffer): scanned, then unpickled
    by the restricted unpickler if the scan found nothing.

    :param raw: the pickle file's bytes
    :param entry: its name, for the messages
    :param rules: the allowlist
    :param budget: the file's budget
    :return: the scan's report, and the object (None when the report has findings or problems)
    :raises BudgetExceeded: beyond the budget; RefusedPickle, UnreadableModelError as :func:`unpickle`
    """
    check_pickle_size(len(raw), entry, budget.limits)
    budget.charge_bytes(len(raw), entry)
    report = PickleReport()
    scan_pickle_file(raw, entry, rules, budget, report)
    if report.findings or report.problems:
        return report, None
    return report, unpickle(raw, entry, rules, ReadingBudget(budget.limits))
