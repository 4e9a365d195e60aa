"""A small file system of its own (tmpfs) that a test can fill to the last byte: a results disk
that runs out of space. Mounting needs root; without it the tests that ask skip cleanly."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_small_disk(tmp_path: Path, size_mb: int = 96) -> Iterator[Path]:
    """A tmpfs of `size_mb` MB mounted in `tmp_path` for the test (a fixture's body)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill `disk` to the last byte; the file that does it."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as out:  # unbuffered: nothing is left to fail at close
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError:
                pass
    return filler
