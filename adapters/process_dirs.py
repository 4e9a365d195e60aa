"""Temporary folders named after the process they belong to: waa-<kind>-<pid>-<random>.

A process killed with SIGKILL (the OOM killer, `kill -9`, a CI job's timeout) removes none of its
temporary folders. Named this way, whoever watched it (`arena run`'s watcher, flows/reaper.py)
finds them by its pid once it has ended and removes them. Three kinds use it: the local
simulations' disks (adapters/vms/local.py, "sim"), a starting simulation's port file
(adapters/waa/localenv/launcher.py, "port") and the files fetched for evaluation
(flows/pool_engine.py, "cache").
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def process_dir_prefix(kind: str) -> str:
    """The prefix for `tempfile.mkdtemp` / `TemporaryDirectory` of a folder of `kind` (lowercase
    letters) that belongs to this process."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"kind {kind!r}: lowercase letters only")
    return f"waa-{kind}-{os.getpid()}-"


def remove_process_dirs(owner_pid: int) -> list[Path]:
    """Remove the folders of every kind that process `owner_pid` left in the temporary folder;
    returns them. Only for a process that has ended: its folders are removed whole."""
    # mkdtemp's random part has no '-', so another pid's folders never match.
    mine = re.compile(rf"waa-[a-z]+-{owner_pid}-[^-]+")
    left = sorted(p for p in Path(tempfile.gettempdir()).glob(f"waa-*-{owner_pid}-*") if mine.fullmatch(p.name))
    for folder in left:
        shutil.rmtree(folder, ignore_errors=True)
    return left
