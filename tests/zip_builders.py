"""
Hostile and malformed model files for the doctor tests, built from a real saved model: zips rewritten entry by
entry, pickles that run a payload when loaded, and a zip written byte by byte (for a decompression bomb whose
gigabyte of zeros is never held in memory).
"""

import base64
import collections
import io
import json
import pickle
import struct
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch as th

from benchmarks.zip_writer import Segment, write_segments, zip_segments


def rewrite_zip(
    source: Path,
    target: Path,
    data: Callable[[dict[str, Any]], Any] | None = None,
    replace: dict[str, bytes] | None = None,
    drop: tuple[str, ...] = (),
) -> Path:
    """
    A copy of the model zip ``source`` with entries changed.

    :param data: maps the parsed ``data`` JSON to the new one (a dict or list to write as JSON, or raw bytes)
    :param replace: entries to write instead of (or besides) the source's, by name
    :param drop: entries left out
    """
    replace = dict(replace or {})
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for name in original.namelist():
            if name in drop:
                continue
            raw = replace.pop(name) if name in replace else original.read(name)
            if name == "data" and data is not None:
                changed = data(json.loads(raw))
                raw = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
            copy.writestr(name, raw)
        for name, raw in replace.items():
            copy.writestr(name, raw)
    return target


def serialized(pickled: bytes) -> dict[str, str]:
    """A data item as SB3 writes a pickled attribute."""
    return {":type:": "<class 'object'>", ":serialized:": base64.b64encode(pickled).decode()}


class Reduce:
    """An object whose pickle calls ``function(*args)`` when loaded."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return self.function, self.args


def torch_bytes(obj: Any, legacy: bool = False) -> bytes:
    """``th.save`` of ``obj``, in torch's zip format or its legacy format."""
    buffer = io.BytesIO()
    th.save(obj, buffer, _use_new_zipfile_serialization=not legacy)
    return buffer.getvalue()


def touch_code(canary: Path) -> str:
    """Python code that creates ``canary``."""
    return f"open({str(canary)!r}, 'w').close()"


def shell_command(canary: Path) -> str:
    return f'"{sys.executable}" -c "{touch_code(canary)}"'


# Pickle opcodes, for pickles no Python object pickles to
def unicode(text: str) -> bytes:
    """SHORT_BINUNICODE (or BINUNICODE for longer strings)."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def global_opcode(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


PROTO_2, PROTO_4 = b"\x80\x02", b"\x80\x04"
MEMOIZE, POP, STACK_GLOBAL, TUPLE1, TUPLE2, REDUCE, STOP = b"\x94", b"0", b"\x93", b"\x85", b"\x86", b"R", b"."
EMPTY_DICT, NONE, SETITEM, BUILD, EXT1 = b"}", b"N", b"s", b"b", b"\x82"


def binget(index: int) -> bytes:
    return b"h" + bytes([index])


def binint1(value: int) -> bytes:
    return b"K" + bytes([value])


class _Storage:
    """Stands for a tensor's storage in a hand-made torch pickle (a persistent id)."""


class _Tensor:
    def __init__(self, storage: _Storage, numel: int) -> None:
        self.storage, self.numel = storage, numel

    def __reduce__(self) -> tuple[Any, ...]:
        return th._utils._rebuild_tensor_v2, (self.storage, 0, (self.numel,), (1,), False, collections.OrderedDict())


def torch_zip_of_zeros(numel: int, deflate_record: bool = False) -> list[Segment]:
    """
    torch's zip format for ``{"weight": th.zeros(numel)}``, written without holding the zeros: what ``th.save``
    writes, as segments.

    :param deflate_record: deflate the tensor's record (``th.save`` stores it; torch's reader inflates either)
    """
    storage = _Storage()
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=2)
    pickler.persistent_id = lambda obj: ("storage", th.FloatStorage, "0", "cpu", numel) if obj is storage else None  # type: ignore[method-assign]
    pickler.dump(collections.OrderedDict(weight=_Tensor(storage, numel)))
    records = [
        ("archive/data.pkl", False, [buffer.getvalue()]),
        ("archive/byteorder", False, [b"little"]),
        ("archive/data/0", deflate_record, [4 * numel]),
        ("archive/version", False, [b"3\n"]),
        ("archive/.data/serialization_id", False, [b"0" * 40]),
    ]
    return zip_segments(records)


def model_with_policy(source: Path, target: Path, policy: list[Segment], deflate: bool, declared: int | None = None) -> Path:
    """The model zip ``source`` with ``policy.pth`` replaced by ``policy`` (segments), written byte by byte."""
    entries = []
    with zipfile.ZipFile(source) as original:
        for name in original.namelist():
            if name == "policy.pth":
                entries.append((name, deflate, policy))
            else:
                entries.append((name, False, [original.read(name)]))
    return write_segments(target, zip_segments(entries, {} if declared is None else {"policy.pth": declared}))


def duplicate_entry(source: Path, target: Path, name: str) -> Path:
    """The model zip with a second entry called ``name`` (zipfile reads the last, torch's reader the first)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        for entry in original.namelist():
            copy.writestr(entry, original.read(entry))
        copy.writestr(name, original.read(name))
    return target
