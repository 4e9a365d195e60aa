"""Temporary folders named after their process: a watcher removes exactly those of the process it
watched, and nothing else in the temporary folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from adapters.process_dirs import process_dir_prefix, remove_process_dirs


def test_only_the_ended_process_folders_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # tempfile's own setting: where mkdtemp makes them
    mine = [Path(tempfile.mkdtemp(prefix=process_dir_prefix(kind))) for kind in ("sim", "cache")]
    (mine[0] / "disk").mkdir()
    (mine[0] / "disk" / "state.json").write_text("{}")
    pid = os.getpid()
    # Another process's, one whose pid merely starts with ours, and folders of other naming.
    kept = [tmp_path / f"waa-sim-{pid + 1}-abc", tmp_path / f"waa-sim-{pid}0-abc", tmp_path / "waa-sim-abcd1234",
            tmp_path / f"waa-sim-{pid}-a-b", tmp_path / f"other-{pid}-abc"]
    for folder in kept:
        folder.mkdir()
    assert sorted(remove_process_dirs(pid)) == sorted(mine)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
    assert remove_process_dirs(pid) == []


@pytest.mark.parametrize("kind", ["", "Sim", "sim-1", "../x", "a/b"])
def test_a_kind_is_lowercase_letters(kind: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters only"):
        process_dir_prefix(kind)
