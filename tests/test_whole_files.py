"""adapters/whole_files.py: writers of one file at once each leave a whole file, never an error."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from adapters.whole_files import replace_text, temporary_beside


def test_writers_at_once_all_succeed_and_leave_one_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    writers, rounds = 6, 15
    texts = [chr(ord("a") + n) * 2_000_000 for n in range(writers)]  # big enough to be mid-write when another renames
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(n: int) -> None:
        start.wait()
        for _ in range(rounds):
            try:
                replace_text(target, texts[n])
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert target.read_text() in texts  # one writer's text, whole
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary file left


def test_a_missing_folder_is_an_oserror_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        replace_text(tmp_path / "absent" / "report.html", "text")
    assert list(tmp_path.iterdir()) == []


def test_text_is_written_as_utf8_and_replaces_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "progress.json"
    target.write_text("old")
    replace_text(target, '{"name": "Zoë ✓"}')
    assert target.read_bytes() == '{"name": "Zoë ✓"}'.encode()


def test_the_file_is_as_readable_as_a_plain_write_makes_it(tmp_path: Path) -> None:
    previous = os.umask(0o022)  # a shared report must stay readable by others
    try:
        plain, whole = tmp_path / "plain.html", tmp_path / "whole.html"
        plain.write_text("x")
        replace_text(whole, "x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(whole.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o644


def test_each_writer_gets_a_temporary_name_of_its_own_beside_the_file(tmp_path: Path) -> None:
    target = tmp_path / "runs.parquet"
    names = {temporary_beside(target) for _ in range(100)}
    assert len(names) == 100
    assert all(n.parent == tmp_path and n.name.startswith(".runs.parquet.") and n.suffix == ".partial" for n in names)
