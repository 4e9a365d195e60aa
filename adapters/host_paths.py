"""Paths that task files and callers name on this host, kept inside their folder.

A task file, a suite downloaded from elsewhere, or a caller of the /evaluate endpoint may name
files on the evaluation host: an evaluator getter's ``dest`` (where a VM file is copied), a
``cache_file`` ``path``, the file a setup step saves a command's output to, the name a download
is cached under. Each is a name *inside* one folder the product chose (the task's cache
directory, the download cache), never a way out of it. Everything that touches the host's disk
for a task goes through `inside`; task loading and `arena tasks lint` use `escape_problem` to
refuse such a name before anything runs.

The rule (`escape_problem`): a non-empty relative path with no ``..`` component, no NUL, not
absolute in POSIX or Windows form (``/etc``, ``C:\\x``, ``\\\\server\\share``). `inside` also
resolves symbolic links, so a link inside the folder cannot lead out of it either.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# An absolute path in either form: /x, \x, C:x, C:\x, \\server\share.
_ABSOLUTE = re.compile(r"^(?:[/\\]|[A-Za-z]:)")


class PathEscapeError(ValueError):
    """A name would lead out of the folder it must stay in; the message names it and why."""


def escape_problem(name: Any) -> str | None:
    """Why `name` is not a safe name inside a folder, or None when it is.

    Static: it needs no folder and touches no disk, so suites are checked when they load."""
    if not isinstance(name, str):
        return f"must be a file name (a string), got {type(name).__name__}"
    if not name.strip():
        return "is empty"
    if "\x00" in name:
        return "contains a NUL character"
    if _ABSOLUTE.match(name):
        return f"{name!r:.120} is an absolute path; give a name inside the folder (e.g. 'result.xlsx')"
    if ".." in re.split(r"[/\\]", name):
        return f"{name!r:.120} has a '..' component, which leads out of the folder"
    return None


def inside(folder: Path, name: Any, *, what: str) -> Path:
    """The path `name` names inside `folder` (absolute, symbolic links resolved).

    Raises `PathEscapeError` naming `what` (e.g. "vm_file dest") when `name` is absolute, has a
    ``..`` component, or resolves outside `folder`. The file need not exist."""
    problem = escape_problem(name)
    if problem is not None:
        raise PathEscapeError(f"{what} {problem}")
    base = Path(folder).resolve()
    target = (base / name).resolve()
    if target != base and base not in target.parents:
        raise PathEscapeError(f"{what} {name!r:.120} resolves outside {base}")
    return target


def is_inside(path: Any, folders: list[Path]) -> bool:
    """Whether the existing-or-not file `path` lies inside one of `folders` (links resolved)."""
    if not isinstance(path, (str, Path)) or not str(path) or "\x00" in str(path):
        return False
    target = Path(path).resolve()
    for folder in folders:
        base = Path(folder).resolve()
        if target == base or base in target.parents:
            return True
    return False
