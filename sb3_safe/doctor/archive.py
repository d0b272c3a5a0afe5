"""
Reading the zip archives of a model file (the model's zip, and the torch zips inside it) as untrusted input: the
sizes the archive declares are checked before anything is read, so a small file that inflates to gigabytes, or
a central directory of millions of entries, is refused without being expanded.

zipfile never returns more bytes than an entry's declared size (and then fails its CRC check if the data is
longer), so memory stays within the declared sizes, which are charged to the file's
:class:`~sb3_safe.doctor.budget.ReadingBudget` when the archive is opened (a torch file inside a model file is an
archive too: its records become tensors).
"""

import io
import struct
import zipfile
import zlib
from typing import IO

from sb3_safe.doctor.budget import MIB, ReadingBudget, UnreadableModelError, size_text
from sb3_safe.doctor.scan import printable

#: Most entries a zip may declare, and most bytes of its central directory: zipfile reads the whole directory and
#: builds an object for each entry before anything can be checked. A model zip has 5 to 8 entries, a torch file
#: one record per tensor plus 5 (about 100 bytes of directory each).
MAX_ENTRIES = 100_000
MAX_CENTRAL_DIRECTORY_BYTES = 16 * MIB

#: Bytes inflated at a time
_READ_CHUNK = MIB
_END_OF_CENTRAL_DIRECTORY = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_END_OF_CENTRAL_DIRECTORY = struct.Struct("<4sQ2H2L4Q")


def _declared_directory(file: IO[bytes]) -> tuple[int, int] | None:
    """
    The number of entries and the size of the central directory that the archive's end-of-central-directory record
    declares, found as zipfile finds it (the last 22 bytes, else the last signature within a comment's reach, and
    the zip64 record just before it); None if there is no such record.
    """
    file.seek(0, io.SEEK_END)
    size = file.tell()
    window = min(size, _END_OF_CENTRAL_DIRECTORY.size + 65535)
    file.seek(size - window)
    tail = file.read(window)
    start = len(tail) - _END_OF_CENTRAL_DIRECTORY.size
    if start < 0:
        return None
    if not (tail[start : start + 4] == b"PK\x05\x06" and tail[-2:] == b"\x00\x00"):
        start = tail.rfind(b"PK\x05\x06")
        if start < 0 or start + _END_OF_CENTRAL_DIRECTORY.size > len(tail):
            return None
    record = _END_OF_CENTRAL_DIRECTORY.unpack_from(tail, start)
    entries, directory_size = record[4], record[5]
    locator_start = start - _ZIP64_LOCATOR.size
    if locator_start >= 0 and tail[locator_start : locator_start + 4] == b"PK\x06\x07":
        # zip64: zipfile takes the counts of the zip64 record just before the locator; the larger of both is checked
        record_start = size - window + locator_start - _ZIP64_END_OF_CENTRAL_DIRECTORY.size
        if record_start >= 0:
            file.seek(record_start)
            zip64 = file.read(_ZIP64_END_OF_CENTRAL_DIRECTORY.size)
            if len(zip64) == _ZIP64_END_OF_CENTRAL_DIRECTORY.size and zip64[:4] == b"PK\x06\x06":
                fields = _ZIP64_END_OF_CENTRAL_DIRECTORY.unpack(zip64)
                entries, directory_size = max(entries, fields[7]), max(directory_size, fields[8])
    file.seek(0)
    return entries, directory_size


def open_archive(file: IO[bytes], name: str, budget: ReadingBudget) -> zipfile.ZipFile:
    """
    Open a zip archive after checking the sizes it declares, and charge them to the file's budget.

    :param file: the archive, a seekable binary file
    :param name: how the messages name it (the model's path, or ``policy.pth``)
    :param budget: the budget of the file the archive is (or is in)
    :raises UnreadableModelError: if it is not a zip archive, or declares too many entries or an entry beyond the
        limit (naming the entry and its size, and the flag that raises the limit); BudgetExceeded if its entries
        pass what is left of the file's budget
    """
    directory = _declared_directory(file)
    if directory is None:
        file.seek(0)
        start = file.read(4)
        file.seek(0)
        if start == b"PK\x03\x04":
            raise UnreadableModelError(
                f"{name}: a truncated zip archive (it starts as one, its directory at the end is missing)"
            )
        raise UnreadableModelError(f"{name}: not a zip archive, so not a saved SB3 model")
    entries, directory_size = directory
    if entries > MAX_ENTRIES or directory_size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise UnreadableModelError(
            f"{name}: the zip archive declares {entries} entries in a directory of {size_text(directory_size)}, "
            f"beyond the limits of {MAX_ENTRIES} entries and {size_text(MAX_CENTRAL_DIRECTORY_BYTES)}"
        )
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, struct.error) as error:
        raise UnreadableModelError(f"{name}: a damaged zip archive ({first_line(error)})") from None
    starts = [info.header_offset for info in archive.infolist()]
    if starts and min(starts) != 0:
        # A model zip (and a torch file) starts with its first entry. A directory that starts later is that of a
        # zip stored inside (a truncated model zip ends in the middle of policy.pth, itself a zip) or follows
        # foreign data
        raise UnreadableModelError(
            f"{name}: a truncated or damaged zip archive (the directory found at its end describes a zip starting "
            f"at byte {min(starts)}, not at the start of the file)"
        )
    limits = budget.limits
    total = 0
    seen: set[str] = set()
    for info in archive.infolist():
        if info.filename in seen:
            # Readers disagree on which of two entries of one name they read (zipfile the last, torch's the first)
            raise UnreadableModelError(f"{name}: two entries named {printable(info.filename)}")
        seen.add(info.filename)
        total += info.file_size
        if info.file_size > limits.entry:
            raise UnreadableModelError(
                f"{name}: entry {printable(info.filename)} is {size_text(info.file_size)} uncompressed, beyond the limit of "
                f"{size_text(limits.entry)} per entry (--max-entry-mb raises it)"
            )
    budget.charge_bytes(total, name)
    return archive


def read_entry(archive: zipfile.ZipFile, entry: str, name: str | None = None) -> bytes:
    """
    The bytes of one entry, at most its declared (and checked) size.

    :param archive: an archive from :func:`open_archive`
    :param entry: the entry's name
    :param name: how the messages name the archive (None: the caller names it)
    :raises UnreadableModelError: if the entry cannot be read (damaged, truncated, encrypted, an unknown compression)
    """
    try:
        # In chunks: read() of the whole entry inflates all the compressed data in one call, whatever the size the
        # directory declares, before cutting it to that size
        with archive.open(entry) as stream:
            content = io.BytesIO()
            while chunk := stream.read(_READ_CHUNK):
                content.write(chunk)
        return content.getvalue()
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, NotImplementedError, RuntimeError) as error:
        # RuntimeError: encrypted; NotImplementedError: a compression method zipfile does not have
        where = "" if name is None else f"{name}: "
        raise UnreadableModelError(f"{where}cannot read entry {printable(entry)} ({first_line(error)})") from None


#: Most characters of an error message quoted in a refusal (errors of numpy and torch can repr a whole argument)
_MAX_QUOTED = 200


def first_line(error: BaseException) -> str:
    """
    The error's type and the first line of its message, cut to a readable length, control characters escaped.

    :param error: the error
    """
    message = (str(error).strip().splitlines() or [""])[0]
    if len(message) > _MAX_QUOTED:
        message = message[:_MAX_QUOTED] + "..."
    return printable(f"{type(error).__name__}: {message}" if message else type(error).__name__)
