"""adapters/host_paths.py: names a task or caller gives for host files stay inside their folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters.host_paths import PathEscapeError, escape_problem, inside, is_inside


@pytest.mark.parametrize("name", ["result.xlsx", "sub/dir/file.txt", "a..b.txt", "..hidden", "x\\y.txt", "Book1.xlsx"])
def test_plain_names_stay_inside(tmp_path: Path, name: str) -> None:
    assert escape_problem(name) is None
    target = inside(tmp_path, name, what="dest")
    assert tmp_path.resolve() in target.parents


@pytest.mark.parametrize("name, why", [
    ("../x", "'..' component"), ("a/../../x", "'..' component"), ("..\\..\\x", "'..' component"), ("..", "'..'"),
    ("/etc/passwd", "absolute"), ("\\\\server\\share\\x", "absolute"), ("C:\\Windows\\x", "absolute"),
    ("c:x", "absolute"), ("", "empty"), ("  ", "empty"), ("a\x00b", "NUL"), (None, "string"), (["x"], "string"),
])
def test_names_that_lead_out_are_refused_with_the_reason(tmp_path: Path, name: object, why: str) -> None:
    problem = escape_problem(name)
    assert problem is not None and why in problem
    with pytest.raises(PathEscapeError, match="vm_file dest"):
        inside(tmp_path, name, what="vm_file dest")


def test_a_symbolic_link_inside_cannot_lead_out(tmp_path: Path) -> None:
    folder, outside = tmp_path / "cache", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    os.symlink(outside, folder / "link")
    with pytest.raises(PathEscapeError, match="resolves outside"):
        inside(folder, "link/planted.txt", what="dest")
    assert is_inside(folder / "link" / "x", [folder]) is False
    assert is_inside(folder / "a" / "b", [tmp_path / "other", folder]) is True
    assert is_inside("/etc/passwd", [folder]) is False and is_inside("", [folder]) is False
