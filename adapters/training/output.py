"""Output directories of exports and demo libraries: complete or absent, never half-written."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputExists(Exception):
    """Mixed into an exporter's own error when its output would replace what is already there.

    The message says how to allow it in the Python API (`overwrite=True`); a caller with another
    way of saying so words it with `with_option` (the CLI: `--overwrite`)."""

    def __init__(self, what: str, *, replaced: str = "it") -> None:
        super().__init__(f"{what}; pass overwrite=True to replace {replaced}")
        self.what, self.replaced = what, replaced

    def with_option(self, option: str) -> str:
        """The message for a caller whose way to allow it is `option`."""
        return f"{self.what}; add {option} to replace {self.replaced}"


def usable_output_dir(out_dir: Path, overwrite: bool, error: type[OutputExists], *, refused: type[ValueError],
                      marker: str, kind: str) -> Path:
    """`out_dir` resolved, to be written whole (`replaced_directory`). `error` when it exists and is
    not an empty directory, unless `overwrite`; even then a directory is replaced only when it is
    an earlier output of this `kind` (the file `marker` in it): `refused` for a file or any other
    directory, whatever the caller allows (`--out . --overwrite` in a project folder deleted the
    project)."""
    out_dir = Path(out_dir).expanduser().resolve()
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return out_dir
    if not out_dir.is_dir():
        raise refused(f"{out_dir} is a file; give a new or empty directory for the {kind}")
    if not overwrite:
        raise error(f"{out_dir} exists and is not an empty directory", replaced=f"it (when it is an earlier {kind})")
    if not (out_dir / marker).is_file():
        raise refused(f"{out_dir} holds files and is not an earlier {kind} (no {marker} in it); overwriting "
                      "replaces only one of those, so give a new or empty directory")
    return out_dir


@contextmanager
def replaced_directory(out_dir: Path) -> Iterator[Path]:
    """A temporary sibling of `out_dir` to write into; when the block ends normally it replaces
    `out_dir`, and on any exception (Ctrl-C included) it is removed and `out_dir` is untouched."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield work
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
