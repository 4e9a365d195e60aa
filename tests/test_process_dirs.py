"""Temporary folders that go with their process: a folder guard removes exactly the folders its
process made, when that process is killed, and nothing else in the temporary folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.process_dirs import ToldFolders, process_dir
from processes import ended_within

ROOT = Path(__file__).resolve().parents[1]

# A process that makes one folder of each kind, says which (and its guard's pid), then waits.
MAKER = """
import json, os, sys, time
import psutil
from adapters.process_dirs import process_dir, temporary_process_dir
made = [str(process_dir(kind)) for kind in ("sim", "port")]
with temporary_process_dir("cache") as cache:
    (cache / "fetched.txt").write_text("x")
    print(json.dumps({"made": made + [str(cache)], "guards": [p.pid for p in psutil.Process().children()]}), flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
"""


def _start_maker(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], dict]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    maker = subprocess.Popen([sys.executable, "-c", MAKER, mode], env=env, stdout=subprocess.PIPE, text=True)
    assert maker.stdout is not None
    return maker, json.loads(maker.stdout.readline())


def _removed_within(seconds: float, *paths: Path) -> bool:
    deadline = time.monotonic() + seconds
    while any(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(p.exists() for p in paths)


def test_a_killed_process_folders_are_removed_and_no_one_elses(tmp_path: Path) -> None:
    maker, said = _start_maker(tmp_path, "wait")
    try:
        made = [Path(p) for p in said["made"]]
        assert [p.parent for p in made] == [tmp_path] * 3 and all(p.is_dir() for p in made)
        assert [p.name.split("-")[:3] for p in made] == [["waa", kind, str(maker.pid)]
                                                          for kind in ("sim", "port", "cache")]
        # Named like the process's own folders but not made by it: what another process with the
        # same pid in another PID namespace sharing /tmp would have.
        other = tmp_path / f"waa-sim-{maker.pid}-another"
        other.mkdir()
        [guard] = said["guards"]
    finally:
        maker.send_signal(signal.SIGKILL)
        maker.wait(timeout=10)
    assert _removed_within(10, *made), [p for p in made if p.exists()]
    assert other.is_dir()
    assert ended_within(guard, 10)


def test_a_process_that_ends_normally_leaves_its_guard_nothing_but_its_own_folders(tmp_path: Path) -> None:
    maker, said = _start_maker(tmp_path, "end")
    assert maker.wait(timeout=30) == 0
    [guard] = said["guards"]
    cache = Path(said["made"][2])
    assert not cache.exists()  # the process removed it itself
    # The other two it left: its guard removes them once the process has ended.
    assert _removed_within(10, *map(Path, said["made"][:2]))
    assert sorted(tmp_path.iterdir()) == []
    assert ended_within(guard, 10)


def test_paths_split_across_reads_are_put_back_together(tmp_path: Path) -> None:
    folders = ToldFolders()
    wanted = [tmp_path / "a b", tmp_path / "é\nnewline", tmp_path / "c"]
    told = b"".join(os.fsencode(p) + b"\0" for p in wanted)
    for i in range(0, len(told), 3):  # three bytes at a time
        folders.feed(told[i:i + 3])
    assert folders.paths == wanted
    wanted[0].mkdir()
    (wanted[0] / "inside").write_text("x")
    assert folders.remove() == [wanted[0]]
    assert not wanted[0].exists()


@pytest.mark.parametrize("kind", ["", "Sim", "sim-1", "../x", "a/b"])
def test_a_kind_is_lowercase_letters(kind: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters only"):
        process_dir(kind)
