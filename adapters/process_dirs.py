"""Temporary folders that go when their process goes, however it ends.

A process killed with SIGKILL (the OOM killer, `kill -9`, a CI job's timeout, Prefect giving up
on a cancelled flow run's process) removes none of its temporary folders. So each folder made
with :func:`process_dir` is also told to a *folder guard*: a small child process that reads the
folders' paths from a pipe whose only writer is this process, and once the pipe reaches end of
file (the process has ended, however it ended) removes those that are still there, then exits.
It removes exactly the paths it was told, so a folder of another process is never touched, even
one whose process has the same pid in another PID namespace sharing the temporary folder.

`arena run`'s watcher (flows/reaper.py) is the guard of its process (:func:`guard_with`); any
other process (a served or a worker's flow run, library use) starts its own on its first folder.
The folders are named ``waa-<kind>-<pid>-<random>`` so that a person can tell whose they are.
Three kinds: the local simulations' disks (adapters/vms/local.py, "sim"), a starting simulation's
port file (adapters/waa/localenv/launcher.py, "port") and the files fetched for evaluation
(flows/pool_engine.py, "cache").

    python -m adapters.process_dirs     the guard (its stdin is the pipe)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

_REPO_ROOT = Path(__file__).resolve().parents[1]  # so `-m adapters.process_dirs` resolves from a checkout
_SEPARATOR = b"\0"  # the one byte a path cannot hold
_lock = threading.Lock()
_guard_pipe: IO[bytes] | None = None
_guard_process: subprocess.Popen[bytes] | None = None  # kept: the guard is this process's for its life


def process_dir(kind: str) -> Path:
    """A new temporary folder of `kind` (lowercase letters), removed by this process's folder
    guard if the process ends without removing it itself."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"kind {kind!r}: lowercase letters only")
    path = Path(tempfile.mkdtemp(prefix=f"waa-{kind}-{os.getpid()}-"))
    try:
        _tell_guard(path)
    except BaseException:  # a Ctrl-C before the guard knows of it: nobody else would remove it
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


@contextmanager
def temporary_process_dir(kind: str) -> Iterator[Path]:
    """`process_dir(kind)` for the block, removed at its end."""
    path = process_dir(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def guard_with(pipe: IO[bytes]) -> None:
    """Tell the folders of this process from now on to `pipe`, the stdin of a guard this process
    started itself (`arena run`'s watcher), instead of starting one."""
    global _guard_pipe
    with _lock:
        _guard_pipe = pipe


def _new_lock_in_forked_child() -> None:
    # A copy made while another thread held the lock would wait for it forever. The copy keeps
    # the pipe: its folders go to the same guard, which waits for both to end.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_forked_child)


def _tell_guard(path: Path) -> None:
    global _guard_pipe, _guard_process
    with _lock:
        if _guard_pipe is None:
            _guard_process = subprocess.Popen(
                [sys.executable, "-m", "adapters.process_dirs"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=_REPO_ROOT,
                start_new_session=True,  # a Ctrl-C in the terminal reaches this process, not its guard
            )
            _guard_pipe = _guard_process.stdin
        assert _guard_pipe is not None
        try:
            _guard_pipe.write(os.fsencode(path) + _SEPARATOR)
            _guard_pipe.flush()
        except (BrokenPipeError, ValueError):
            pass  # the guard is gone (killed by someone): this process still removes its own folders


class ToldFolders:
    """The folders a guarded process told its guard, read from the pipe in chunks."""

    def __init__(self) -> None:
        self._pending = b""
        self.paths: list[Path] = []

    def feed(self, data: bytes) -> None:
        """Take the next chunk read from the pipe."""
        *complete, self._pending = (self._pending + data).split(_SEPARATOR)
        self.paths.extend(Path(os.fsdecode(raw)) for raw in complete if raw)

    def remove(self) -> list[Path]:
        """Remove the told folders still there (the process's own clean-up did not run); returns them."""
        left = [path for path in self.paths if path.exists()]
        for path in left:
            shutil.rmtree(path, ignore_errors=True)
        return left


def guard(pipe: IO[bytes]) -> None:
    """Read folders from `pipe` until end of file, then remove those still there."""
    folders = ToldFolders()
    while data := pipe.read1(65536):  # type: ignore[attr-defined]
        folders.feed(data)
    folders.remove()


if __name__ == "__main__":
    guard(sys.stdin.buffer)
