"""Limits on the files the evaluator reads, checked before anything is unpacked or parsed.

The agent controls the VM's files, and the evaluator reads some of them on the evaluation host:
a getter copies a file through `/file`, then a getter or metric opens it (python-docx, openpyxl,
pandas, odfpy, zipfile, py7zr). A small archive can unpack to gigabytes (a decompression bomb):
a 156 KB 7z made the 7-Zip getter write 1 GB, a 1 MB zip took compare_zip_files to 3 GB of
memory. So every archive (zip and the formats built on it: docx, xlsx, pptx, odt; 7z) is judged by
its directory first, the sizes its members declare (Python's zipfile and py7zr never unpack a
member past its declared size), and every file by its size. What is over a limit ends the
evaluation as an `evaluation_error` (`LimitExceeded`) naming the limit and the file.

The limits are far above what WAA's tasks read (real WAA office files are at most a few MB, their
XML unpacks to about 10-15 times that, and a task's zip holds a handful of files) and far below
what hurts a controller that evaluates several tasks at once.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

from adapters.waa.evaluator.errors import EvaluationConfigError

MiB = 1 << 20

# One file copied from the VM (`/file`), downloaded for a task, or opened by a metric: the
# largest inputs WAA evaluates are short recordings and pictures, tens of MB at most. The whole
# file sits in memory once while it is copied.
MAX_FILE_BYTES = 100 * MiB

# All members of one archive, unpacked (what extracting it writes, what reading every member
# holds): a few-MB office file unpacks to tens of MB at most (a 1 MB xlsx of 50,000 rows: 9 MB;
# pictures in a docx unpack to their own size).
MAX_UNPACKED_BYTES = 100 * MiB

# One member, unpacked: readers parse a document's XML part whole, and lxml takes up to about 23
# times its size for a part of tiny elements (measured: a 99 MiB document.xml of empty paragraphs,
# 4:1 packed, took python-docx to 2.4 GB). 32 MiB is 3.5 times that 50,000-row sheet and bounds
# such a parse to well under a gigabyte.
MAX_MEMBER_BYTES = 32 * MiB

# Unpacked size : packed size, for the archive and for each member. Office XML packs 5-20:1,
# pictures and media about 1:1; zeros pack about 1000:1 with deflate and far more with LZMA.
# 100:1 is Apache POI's limit for office files (ZipSecureFile), proven on real documents.
MAX_RATIO = 100

# Below this unpacked size the ratio is not judged: a small member (an empty sheet, a file of
# spaces) packs to almost nothing without being a bomb, and it cannot hurt.
RATIO_FLOOR_BYTES = 1 * MiB

# Members of one archive: a docx or xlsx has 10-30, a pptx with many slides and pictures a few
# hundred; each member costs the reader memory and time even when empty.
MAX_MEMBERS = 10_000

SEVEN_ZIP_MAGIC = b"7z\xbc\xaf\x27\x1c"


class LimitExceeded(EvaluationConfigError):
    """A file the evaluation would read is over one of this module's limits: the evaluation ends
    as an `evaluation_error` (EvaluationConfigError) naming the limit and the file."""

    def __init__(self, name: str, problem: str, limit: str, *, archive: bool = True) -> None:
        outcome = "not unpacked (a decompression bomb?)" if archive else "not read"
        super().__init__(f"{name}: {problem}, over the limit {limit}; {outcome}")
        self.name = name
        self.limit = limit


def _mib(count: int) -> str:
    if count and count % MiB == 0:
        return f"{count // MiB:,} MiB"
    return f"{count:,} bytes ({count / MiB:,.1f} MiB)" if count >= MiB else f"{count:,} bytes"


def file_too_large(name: str, size: int | None) -> LimitExceeded:
    """The error for a file over MAX_FILE_BYTES (`size` None: its reader stopped at the limit)."""
    said = f"the file is {_mib(size)}" if size is not None else f"the file is larger than {_mib(MAX_FILE_BYTES)}"
    return LimitExceeded(name, said, f"MAX_FILE_BYTES ({_mib(MAX_FILE_BYTES)})", archive=False)


def check_size(name: str, size: int) -> None:
    """Refuse a file of `size` bytes over MAX_FILE_BYTES; `name` is how messages name it (a VM
    path or a file name, never a host folder)."""
    if size > MAX_FILE_BYTES:
        raise file_too_large(name, size)


def check_members(name: str, archive_bytes: int, members: list[tuple[str, int, int | None]]) -> None:
    """Refuse an archive whose directory declares more than MAX_MEMBERS members, more than
    MAX_UNPACKED_BYTES unpacked, a member over MAX_MEMBER_BYTES, or a ratio over MAX_RATIO
    (whole, or one member over RATIO_FLOOR_BYTES). `members` are (name, unpacked size, packed
    size or None when the format packs members together, as solid 7z does)."""
    if len(members) > MAX_MEMBERS:
        raise LimitExceeded(name, f"the archive has {len(members):,} members", f"MAX_MEMBERS ({MAX_MEMBERS:,})")
    total = sum(unpacked for _, unpacked, _ in members)
    if total > MAX_UNPACKED_BYTES:
        raise LimitExceeded(
            name, f"its members unpack to {_mib(total)}", f"MAX_UNPACKED_BYTES ({_mib(MAX_UNPACKED_BYTES)})"
        )
    for member, unpacked, packed in members:
        if unpacked > MAX_MEMBER_BYTES:
            raise LimitExceeded(
                name, f"member {member!r:.80} unpacks to {_mib(unpacked)}", f"MAX_MEMBER_BYTES ({_mib(MAX_MEMBER_BYTES)})"
            )
        if packed is not None and unpacked > RATIO_FLOOR_BYTES and unpacked > MAX_RATIO * max(packed, 1):
            raise LimitExceeded(
                name, f"member {member!r:.80} unpacks {_mib(packed)} to {_mib(unpacked)}",
                f"MAX_RATIO ({MAX_RATIO}:1)",
            )
    if total > RATIO_FLOOR_BYTES and total > MAX_RATIO * max(archive_bytes, 1):
        raise LimitExceeded(
            name, f"its {_mib(archive_bytes)} unpack to {_mib(total)}", f"MAX_RATIO ({MAX_RATIO}:1)"
        )


def check_zip(name: str, archive: zipfile.ZipFile, archive_bytes: int) -> None:
    """`check_members` for an open zip (docx, xlsx, pptx, odt are zips), from its directory."""
    check_members(name, archive_bytes, [(i.filename, i.file_size, i.compress_size) for i in archive.infolist()])


def check_seven_zip(name: str, archive: Any, archive_bytes: int) -> None:
    """`check_members` for an open py7zr.SevenZipFile, from its header (`list()`)."""
    check_members(name, archive_bytes, [(f.filename, f.uncompressed or 0, f.compressed) for f in archive.list()])


def check_file(path: str | os.PathLike[str], name: str | None = None) -> None:
    """Check a host file before a getter or metric opens it: its size, and, when it is a zip or
    a 7z archive (told by its content, not its name), its directory. A file that is not a
    readable archive is left to its reader, which fails on it as it would anyway. `name`
    (default: the file's name) is how messages call it."""
    shown = name or os.path.basename(os.fspath(path))
    try:
        size = os.path.getsize(path)
    except OSError:
        return  # a missing file is the reader's to report, as WAA's reader does
    check_size(shown, size)
    with open(path, "rb") as handle:
        if handle.read(len(SEVEN_ZIP_MAGIC)) == SEVEN_ZIP_MAGIC:
            _check_seven_zip_file(shown, handle, size)
            return
        if not zipfile.is_zipfile(handle):
            return
        try:
            archive = zipfile.ZipFile(handle)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            return
        with archive:
            check_zip(shown, archive, size)


def _check_seven_zip_file(name: str, handle: Any, size: int) -> None:
    try:
        import py7zr
    except ImportError:
        return  # without py7zr nothing here can unpack a 7z either
    handle.seek(0)
    try:
        archive = py7zr.SevenZipFile(handle, mode="r")
    except Exception:  # noqa: BLE001 - not a readable 7z: its reader fails on it as it would anyway
        return
    with archive:
        check_seven_zip(name, archive, size)
