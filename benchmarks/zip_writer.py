"""
Zips written byte by byte, for hostile files (:mod:`benchmarks.hostile_files`, the doctor tests): entries given as
segments, zeros deflated without being held in memory, sizes the directory declares chosen freely.
"""

import struct
import zlib
from pathlib import Path

#: A part of a file: bytes, or that many zero bytes
Segment = bytes | int

_CHUNK = 2**20


def _size(segments: list[Segment]) -> int:
    return sum(segment if isinstance(segment, int) else len(segment) for segment in segments)


def _crc(segments: list[Segment]) -> int:
    crc, zeros = 0, bytes(_CHUNK)
    for segment in segments:
        if isinstance(segment, int):
            full, rest = divmod(segment, _CHUNK)
            for _ in range(full):
                crc = zlib.crc32(zeros, crc)
            crc = zlib.crc32(bytes(rest), crc)
        else:
            crc = zlib.crc32(segment, crc)
    return crc


def _deflate_part(raw: bytes) -> bytes:
    # A full flush ends the part on a byte boundary with nothing referring back: parts concatenate
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(raw) + compressor.flush(zlib.Z_FULL_FLUSH)


def _deflate(segments: list[Segment]) -> bytes:
    """Raw deflate of the segments; each MiB of zeros compresses to the same bytes, computed once."""
    zero_chunk = _deflate_part(bytes(_CHUNK))
    parts = []
    for segment in segments:
        if isinstance(segment, int):
            full, rest = divmod(segment, _CHUNK)
            parts.append(zero_chunk * full + (_deflate_part(bytes(rest)) if rest else b""))
        else:
            parts.append(_deflate_part(segment))
    parts.append(zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH))  # the final, empty block
    return b"".join(parts)


def zip_segments(entries: list[tuple[str, bool, list[Segment]]], declared: dict[str, int] | None = None) -> list[Segment]:
    """
    A zip archive (without zip64: every size below 4 GiB) as segments.

    :param entries: (name, deflated, content) for each entry
    :param declared: an uncompressed size to declare instead of the true one, by entry (a lying directory)
    """
    declared = declared or {}
    out: list[Segment] = []
    directory = []
    offset = 0
    for name, deflated, content in entries:
        crc, size = _crc(content), _size(content)
        stored = [_deflate(content)] if deflated else content
        compressed, method, raw_name = _size(stored), 8 if deflated else 0, name.encode()
        size = declared.get(name, size)
        header = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, method, 0, 0x21, crc, compressed, size, len(raw_name), 0)
        directory.append(
            struct.pack(
                "<4s4B4HL2L5H2L",
                b"PK\x01\x02",
                20,
                3,
                20,
                0,
                0,
                method,
                0,
                0x21,
                crc,
                compressed,
                size,
                len(raw_name),
                0,
                0,
                0,
                0,
                0o644 << 16,
                offset,
            )
            + raw_name
        )
        out += [header + raw_name, *stored]
        offset += len(header) + len(raw_name) + compressed
    central = b"".join(directory)
    out += [central, struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central), offset, 0)]
    return out


def write_segments(path: Path, segments: list[Segment]) -> Path:
    with path.open("wb") as file:
        for segment in segments:
            if isinstance(segment, int):
                full, rest = divmod(segment, _CHUNK)
                for _ in range(full):
                    file.write(bytes(_CHUNK))
                file.write(bytes(rest))
            else:
                file.write(segment)
    return path
