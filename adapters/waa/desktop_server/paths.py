"""Paths a WAA caller names, as paths of this Linux desktop.

WAA's callers (the harness's reset check, tasks written for Windows) name files in the Windows
user profile, ``C:\\Users\\Docker\\...``. Here that profile is the desktop user's home,
``/home/user``: ``C:\\Users\\Docker\\Documents\\a.txt`` is ``/home/user/Documents/a.txt`` (drive
letter and profile name compared without case, separators either way). Other drive paths have
no place on this desktop and are refused; Linux paths are used as they are, ``~`` is the home.
"""

from __future__ import annotations

import os
import re

HOME = "/home/user"
_PROFILE = re.compile(r"^[cC]:[\\/]+users[\\/]+docker(?=$|[\\/])", re.IGNORECASE)
_DRIVE = re.compile(r"^[A-Za-z]:(?:[\\/]|$)")


class PathRefused(ValueError):
    """A path that names nothing on this desktop (another drive, a relative path)."""


def local_path(path: str, home: str = HOME) -> str:
    """The Linux path for a path a caller named (see the module docstring)."""
    if not isinstance(path, str) or not path:
        raise PathRefused(f"no path given: {path!r}")
    match = _PROFILE.match(path)
    if match:
        rest = path[match.end():].replace("\\", "/").strip("/")
        return os.path.normpath(os.path.join(home, rest)) if rest else home
    if _DRIVE.match(path):
        raise PathRefused(f"{path!r} is a Windows path outside the user profile (C:\\Users\\Docker); "
                          "this Linux desktop has no such drive")
    if path == "~" or path.startswith("~/"):
        return os.path.normpath(home + path[1:])
    if not path.startswith("/"):
        raise PathRefused(f"{path!r} is not an absolute path")
    return os.path.normpath(path)
