"""Files replaced whole: a reader sees the old file or the new one, never half of either.

Several processes may write the same file at once: `arena run` writes its HTML report while an
`arena report` of the same run (a team member, a script polling for the latest run) writes it too.
Each writer therefore goes through a temporary file of its own in the same folder and renames it
over the target; a temporary name shared by the writers let one rename the other's half-written
file away (the other then failed with "No such file or directory").
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def temporary_beside(path: Path) -> Path:
    """A name in `path`'s folder that no other writer uses, for a file that is then renamed over
    `path` (also for writers that are not Python, such as DuckDB's COPY)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")


def replace_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file of this call's own in the same
    folder, then rename it over `path`. Of writers at once, the last rename stays; each leaves
    a whole file. The file gets the mode a plain write would give it (the umask's). OSError
    when the folder is missing or cannot be written (nothing is left behind then)."""
    # A random name created exclusively, not mkstemp: that one makes the file 0600, so a report
    # a teammate or a web server should read would be the owner's alone.
    temporary = temporary_beside(path)
    try:
        with open(temporary, "x", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
