"""
Every pickle that SB3's ``load`` unpickles from a model file, found as ``load`` finds them and scanned with
:func:`~sb3_safe.doctor.scan.scan_pickle`:

- each top-level item of ``data`` with a ``:serialized:`` key: base64 of a cloudpickle, ``cloudpickle.loads``-ed
  (a full unpickler: this is where a hostile file runs code);
- each ``.pth`` entry: ``th.load(weights_only=True)``, whose restricted unpickler refuses unknown globals; scanned
  all the same, since other loaders (older SB3, ``weights_only=False``) run them. torch's zip format keeps its
  pickle in ``<archive>/data.pkl``; its legacy format is five pickles in a row;
- the bytes a pickle hands to ``torch.storage._load_from_bytes`` (a tensor pickled by plain pickle, ARS's weights),
  which ``torch.load`` loads with ``weights_only=False``.
"""

import base64
import binascii
import io
import posixpath
from dataclasses import dataclass, field
from typing import Any

from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.archive import open_archive, read_entry
from sb3_safe.doctor.budget import BudgetExceeded, ReadingBudget, UnreadableModelError
from sb3_safe.doctor.scan import Finding, PickleScan, printable, scan_pickle

#: torch's legacy format: magic number, protocol, system info, the object, the storage keys
_LEGACY_PICKLES = 5
#: How deep torch files may nest through _load_from_bytes (a real file: one level)
_MAX_NESTING = 4


@dataclass
class PickleReport:
    """
    What the pickles of a model file would do.

    :param findings: what loading would run beyond an SB3 file's needs
    :param problems: pickles that are not valid (loading fails there), one line each
    :param unsafe_entries: the ``.pth`` entries with findings or problems (their tensors are not loaded)
    :param scans: the scan of each data item, by key
    """

    findings: list[Finding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unsafe_entries: set[str] = field(default_factory=set)
    scans: dict[str, PickleScan] = field(default_factory=dict)

    def add(self, scan: PickleScan) -> bool:
        """Add one scan's findings and problem; whether it had any."""
        self.findings += scan.findings
        if scan.error is not None:
            self.problems.append(printable(f"{scan.entry}: not a valid pickle ({scan.error})"))
        return bool(scan.findings) or scan.error is not None


def data_item_entry(key: str) -> str:
    """How the report names a data item."""
    return printable(f'data["{key}"]')


def data_pickles(data: dict[str, Any], budget: ReadingBudget) -> dict[str, bytes]:
    """
    The pickles SB3's ``load`` would unpickle from ``data``, by key, decoded as ``load`` decodes them.

    :param data: the parsed ``data`` entry
    :param budget: the file's budget, charged with the decoded pickles
    :raises UnreadableModelError: for an item ``load`` cannot decode (``:serialized:`` not base64 text)
    """
    pickles = {}
    for key, item in data.items():
        if not (isinstance(item, dict) and ":serialized:" in item):
            continue
        serialized = item[":serialized:"]
        entry = data_item_entry(key)
        if not isinstance(serialized, str):
            raise UnreadableModelError(f"{entry}: ':serialized:' is a {type(serialized).__name__}, expected base64 text")
        try:
            # As SB3's json_to_data decodes it (non-alphabet characters are dropped, not refused)
            pickles[key] = base64.b64decode(serialized.encode())
            budget.charge_bytes(len(pickles[key]), entry)
        except (binascii.Error, ValueError, UnicodeError) as error:
            raise UnreadableModelError(f"{entry}: ':serialized:' is not base64 ({error})") from None
    return pickles


def scan_data(pickles: dict[str, bytes], rules: Allowlist, budget: ReadingBudget, report: PickleReport) -> None:
    """Scan the pickles of ``data`` (from :func:`data_pickles`) into ``report``."""
    for key, pickle in pickles.items():
        scan = scan_pickle(pickle, data_item_entry(key), rules, budget)
        report.scans[key] = scan
        report.add(scan)
        _scan_nested(scan, rules, budget, report, depth=1)


def scan_pickle_file(raw: bytes, entry: str, rules: Allowlist, budget: ReadingBudget, report: PickleReport) -> None:
    """Scan a pickle file (``vecnormalize.pkl``, a replay buffer: loaded with a full unpickler) into ``report``."""
    scan = scan_pickle(raw, entry, rules, budget)
    report.add(scan)
    _scan_nested(scan, rules, budget, report, depth=1)


def scan_torch_entry(raw: bytes, entry: str, rules: Allowlist, budget: ReadingBudget, report: PickleReport) -> None:
    """Scan the pickles of one ``.pth`` entry (torch's zip or legacy format) into ``report``."""
    first = len(report.findings)
    if _scan_torch_file(raw, entry, rules, budget, report, depth=0):
        report.unsafe_entries.add(entry)
    # SB3's load reads .pth entries with torch.load(weights_only=True), whose own allowlist refuses these globals
    report.findings[first:] = [
        Finding(
            finding.entry,
            finding.target,
            f"{finding.detail}; SB3's torch.load(weights_only=True) refuses it, a loader without weights_only runs it",
        )
        for finding in report.findings[first:]
    ]


def _scan_torch_file(
    raw: bytes, entry: str, rules: Allowlist, budget: ReadingBudget, report: PickleReport, depth: int
) -> bool:
    """Whether the torch file had findings or problems."""
    if depth > _MAX_NESTING:
        report.problems.append(f"{entry}: torch files nested more than {_MAX_NESTING} deep")
        return True
    # torch.load tells its formats apart by the first bytes (a zip's local file header), not as zipfile does
    if raw[:4] == b"PK\x03\x04":
        try:
            pickles = _torch_zip_pickles(raw, entry, budget)
        except BudgetExceeded:
            raise
        except UnreadableModelError as error:
            report.problems.append(str(error))
            return True
        bad = False
        for name, pickle in pickles:
            scan = scan_pickle(pickle, name, rules, budget, persistent_ids="torch zip")
            bad = report.add(scan) or bad
            bad = _scan_nested(scan, rules, budget, report, depth + 1) or bad
        return bad
    file = io.BytesIO(raw)
    bad = False
    for index in range(_LEGACY_PICKLES):
        scan = scan_pickle(file, f"{entry} (legacy format, pickle {index + 1})", rules, budget, persistent_ids="torch legacy")
        if index == 0 and scan.error is not None and not scan.findings:
            report.problems.append(f"{entry}: not a torch file, neither its zip format nor its legacy format ({scan.error})")
            return True
        bad = report.add(scan) or bad
        bad = _scan_nested(scan, rules, budget, report, depth + 1) or bad
        if scan.error is not None:
            break
    return bad


def _scan_nested(scan: PickleScan, rules: Allowlist, budget: ReadingBudget, report: PickleReport, depth: int) -> bool:
    bad = False
    for name, raw in scan.nested:
        bad = _scan_torch_file(raw, name, rules, budget, report, depth) or bad
    return bad


def _torch_zip_pickles(raw: bytes, entry: str, budget: ReadingBudget) -> list[tuple[str, bytes]]:
    """
    The pickles of a torch zip file: ``data.pkl`` in the folder of its first record (where ``torch.load`` reads it),
    and any other ``.pkl`` record.
    """
    archive = open_archive(io.BytesIO(raw), entry, budget)
    names = archive.namelist()
    if not names:
        raise UnreadableModelError(f"{entry}: an empty torch zip file")
    folder = names[0].split("/", 1)[0]
    main = posixpath.join(folder, "data.pkl")
    if main not in names:
        raise UnreadableModelError(f"{entry}: a torch zip file without {main}")
    ordered = [main] + [name for name in names if name.endswith(".pkl") and name != main]
    return [(entry if name == main else f"{entry} ({name})", read_entry(archive, name, entry)) for name in ordered]
