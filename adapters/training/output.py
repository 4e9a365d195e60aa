"""Output directories of exports and demo libraries: complete or absent, never half-written,
and replaced only when this product wrote them.

Every such directory holds the marker file `MARKER` (JSON: the producer ``waa-arena`` and the
kind of output, e.g. ``training-export``), written with the rest. `--overwrite` replaces a
directory only after reading and parsing that marker and finding its own kind; a directory
without one is replaced only when it is an earlier output of the kind from before the marker
(each kind recognises its own files by their known fields: an export's manifest.json names its
``waa-arena.*`` schema). Anything else (a web app's folder that happens to hold a manifest.json)
is refused in one line naming the folder and why, and nothing is deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRODUCER = "waa-arena"
MARKER = ".waa-arena-output"  # hidden: datasets loaders and the demo library's *.json skip it
MARKER_VERSION = 1
# Marker and manifest files are small; a larger file of that name is not one of ours.
MAX_MARKER_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class OutputKind:
    """A kind of directory this product writes whole (a training export, a demo library).

    `files` is the file every output of the kind holds (manifest.json), and `earlier` says
    whether its parsed content is that of an output written before the marker existed: None
    when it is, else why not."""

    kind: str  # in the marker: "training-export"
    title: str  # in messages: "training export"
    files: str
    earlier: Callable[[Path], str | None]


def read_json_file(path: Path, *, lines: bool = False) -> Any:
    """The parsed JSON in `path` (its first line with `lines`), or ValueError saying why not
    (unreadable, too large, not JSON)."""
    if not path.is_file():  # a FIFO or a device would block or never end
        raise ValueError(f"{path.name} is not a regular file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_MARKER_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    if len(data) > MAX_MARKER_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_MARKER_BYTES // (1024 * 1024)} MiB")
    if lines:
        data = data.split(b"\n", 1)[0]
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path.name} is not JSON ({str(exc).splitlines()[0][:120]})") from None


def write_marker(directory: Path, kind: OutputKind) -> None:
    """Mark `directory` as an output of `kind` written by this product."""
    marker = {"producer": PRODUCER, "kind": kind.kind, "version": MARKER_VERSION}
    (directory / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")


def ownership_problem(directory: Path, kind: OutputKind) -> str | None:
    """Why `directory` is not an output of `kind` this product wrote, or None when it is."""
    marker = directory / MARKER
    if marker.exists():
        try:
            parsed = read_json_file(marker)
        except ValueError as exc:
            return str(exc)
        if not isinstance(parsed, dict) or parsed.get("producer") != PRODUCER:
            return f"its {MARKER} does not name {PRODUCER} as its producer"
        if parsed.get("kind") != kind.kind:
            return f"its {MARKER} says it is a {parsed.get('kind')!r:.40} output, not a {kind.kind}"
        return None
    if not (directory / kind.files).is_file():
        return f"no {kind.files} in it"
    return kind.earlier(directory / kind.files)


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
                      kind: OutputKind) -> Path:
    """`out_dir` resolved, to be written whole (`replaced_directory`). `error` when it exists and is
    not an empty directory, unless `overwrite`; even then a directory is replaced only when it is
    an earlier output of this `kind` that this product wrote (`ownership_problem`): `refused`
    for a file or any other directory, whatever the caller allows (`--out . --overwrite` in a
    project folder deleted the project; a web app's folder with a manifest.json was wiped)."""
    out_dir = Path(out_dir).expanduser().resolve()
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return out_dir
    if not out_dir.is_dir():
        raise refused(f"{out_dir} is a file; give a new or empty directory for the {kind.title}")
    if not overwrite:
        raise error(f"{out_dir} exists and is not an empty directory", replaced=f"it (when it is an earlier {kind.title})")
    problem = ownership_problem(out_dir, kind)
    if problem is not None:
        raise refused(f"{out_dir} holds files and is not an earlier {kind.title} ({problem}); overwriting "
                      "replaces only one of those, so give a new or empty directory")
    return out_dir


@contextmanager
def replaced_directory(out_dir: Path, kind: OutputKind) -> Iterator[Path]:
    """A temporary sibling of `out_dir` to write into; when the block ends normally it is marked
    as an output of `kind` and replaces `out_dir`, and on any exception (Ctrl-C included) it is
    removed and `out_dir` is untouched."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield work
        write_marker(work, kind)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
