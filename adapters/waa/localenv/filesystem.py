"""A sandboxed Windows file system: Windows paths mapped under one host directory.

``C:\\Users\\Docker\\Desktop\\a.txt`` lives at ``<root>/C/Users/Docker/Desktop/a.txt``. Lookups
are case-insensitive like NTFS (an existing entry's spelling wins), both slash styles are
accepted, and ``..`` may never climb above a drive root. Anything that could leave the sandbox
(UNC paths, relative paths, reserved characters, symlinks pointing outside) raises
:class:`PathError` instead of touching the host.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

USER_HOME = "C:\\Users\\Docker"
USER_FOLDERS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos")
# Characters Windows refuses in a file or folder name.
_RESERVED = set('<>:"|?*') | {chr(c) for c in range(32)}
_DRIVE_RE = re.compile(r"^([A-Za-z]):(?:[\\/]|$)")
# The recycle bin sits beside the drives, so no Windows path can name it.
_RECYCLE_DIR = ".sim_recycle_bin"


class PathError(ValueError):
    """A path that is malformed or would escape the simulated file system."""


@dataclass(frozen=True)
class WinPath:
    """A normalised absolute Windows path: drive letter plus name components."""

    drive: str
    parts: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.drive}:\\" + "\\".join(self.parts)

    @property
    def name(self) -> str:
        """The last component, or the drive for a drive root."""
        return self.parts[-1] if self.parts else f"{self.drive}:"

    @property
    def parent(self) -> "WinPath":
        """The containing folder (a drive root is its own parent)."""
        return WinPath(self.drive, self.parts[:-1])

    def child(self, name: str) -> "WinPath":
        """This path extended by one component."""
        return WinPath(self.drive, self.parts + (name,))


def expand(path: str) -> str:
    """Expand ``~`` and the few environment variables tasks use, as the real server does."""
    env = {
        "USERPROFILE": USER_HOME,
        "HOMEDRIVE": "C:",
        "HOMEPATH": "\\Users\\Docker",
        "USERNAME": "Docker",
        "SYSTEMDRIVE": "C:",
    }
    path = re.sub(r"%([A-Za-z_]+)%", lambda m: env.get(m.group(1).upper(), m.group(0)), path)
    if path == "~" or path.startswith(("~/", "~\\")):
        path = USER_HOME + path[1:]
    return path


def parse_winpath(path: str) -> WinPath:
    """Parse an absolute Windows path; raise PathError when it is not one or escapes its drive."""
    if not isinstance(path, str) or not path.strip():
        raise PathError("empty path")
    path = expand(path.strip())
    if path.startswith(("\\\\", "//")):
        raise PathError(f"network paths are not available in the WAA simulation: {path}")
    m = _DRIVE_RE.match(path)
    if not m:
        raise PathError(f"not an absolute Windows path: {path}")
    drive = m.group(1).upper()
    parts: list[str] = []
    for comp in re.split(r"[\\/]+", path[2:]):
        # Windows ignores trailing dots and spaces in names; keep the name as typed otherwise.
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                raise PathError(f"path escapes the simulated drive: {path}")
            parts.pop()
            continue
        if any(ch in _RESERVED for ch in comp):
            raise PathError(f"invalid character in path component {comp!r}")
        parts.append(comp)
    return WinPath(drive, tuple(parts))


# In a folder the simulation holds its disk in. Restoring a snapshot replaces everything in that
# folder, so only a new or empty folder, or one marked like this before, becomes a disk.
ROOT_MARKER = ".waa-simulated-disk"


class ForeignRootError(ValueError):
    """The folder given as the simulation's disk holds other files."""


def claim_root(root: Path) -> Path:
    """`root`, resolved and created, as the simulation's disk: marked as such when it is new or
    empty. ForeignRootError naming it when it holds anything else and is not marked, so a folder
    given by mistake (a home or project folder) is never emptied by a snapshot's restore."""
    root = Path(root).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise ForeignRootError(f"{root}: is a file; give a new or empty folder for the simulated disk")
    if root.is_dir() and not (root / ROOT_MARKER).is_file() and any(root.iterdir()):
        raise ForeignRootError(
            f"{root}: not empty and not a simulated disk (no {ROOT_MARKER}); the simulation replaces "
            "everything in its folder when it restores a snapshot, so give a new or empty folder"
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / ROOT_MARKER).touch()
    return root


class SimFileSystem:
    """The simulated disk. All methods take Windows paths (str or WinPath)."""

    def __init__(self, root: Path) -> None:
        self.root = claim_root(root)

    # -- mapping -------------------------------------------------------------------------
    def host_path(self, path: str | WinPath) -> Path:
        """The host path for a Windows path, matching existing names case-insensitively."""
        wp = path if isinstance(path, WinPath) else parse_winpath(path)
        current = self.root / wp.drive
        for comp in wp.parts:
            current = current / self._match(current, comp)
        resolved = current.resolve()
        # Defence in depth: even a symlink planted on disk must not lead outside the root.
        if resolved != self.root and self.root not in resolved.parents:
            raise PathError(f"path escapes the simulated file system: {wp}")
        return current

    @staticmethod
    def _match(folder: Path, name: str) -> str:
        try:
            for entry in os.listdir(folder):
                if entry.lower() == name.lower():
                    return entry
        except OSError:
            pass
        return name

    def to_winpath(self, path: str | WinPath) -> WinPath:
        """The Windows path with each existing component spelled as stored on disk."""
        wp = path if isinstance(path, WinPath) else parse_winpath(path)
        host = self.host_path(wp)
        rel = host.relative_to(self.root / wp.drive)
        return WinPath(wp.drive, tuple(rel.parts))

    # -- queries ---------------------------------------------------------------------------
    def exists(self, path: str | WinPath) -> bool:
        """True when a file or folder exists at path."""
        return self.host_path(path).exists()

    def is_dir(self, path: str | WinPath) -> bool:
        """True when path is an existing folder."""
        return self.host_path(path).is_dir()

    def is_file(self, path: str | WinPath) -> bool:
        """True when path is an existing file."""
        return self.host_path(path).is_file()

    def listdir(self, path: str | WinPath) -> list[str]:
        """Entry names of a folder, folders first then files, each sorted like Explorer."""
        host = self.host_path(path)
        entries = os.listdir(host)
        dirs = sorted((e for e in entries if (host / e).is_dir()), key=str.lower)
        files = sorted((e for e in entries if not (host / e).is_dir()), key=str.lower)
        return dirs + files

    def read_bytes(self, path: str | WinPath) -> bytes:
        """File contents; FileNotFoundError when missing."""
        return self.host_path(path).read_bytes()

    def tree(self, path: str | WinPath, name: str) -> dict:
        """The recursive ``{type, name, children}`` tree of a folder, as /list_directory returns.

        ``name`` is the top node's name; the real server uses the basename of the path as sent.
        """
        return self._tree(self.host_path(path), name)

    def _tree(self, host: Path, name: str) -> dict:
        node: dict = {"type": "directory", "name": name, "children": []}
        for entry in os.listdir(host):
            full = host / entry
            if full.is_dir():
                node["children"].append(self._tree(full, entry))
            else:
                node["children"].append({"type": "file", "name": entry})
        return node

    # -- changes ---------------------------------------------------------------------------
    def write_bytes(self, path: str | WinPath, data: bytes) -> None:
        """Create or overwrite a file; the folder must exist (FileNotFoundError otherwise)."""
        host = self.host_path(path)
        if not host.parent.is_dir():
            raise FileNotFoundError(f"folder does not exist: {parse_or(path).parent}")
        if host.is_dir():
            raise IsADirectoryError(f"is a folder: {path}")
        host.write_bytes(data)

    def makedirs(self, path: str | WinPath, exist_ok: bool = True) -> None:
        """Create a folder and its parents."""
        self.host_path(path).mkdir(parents=True, exist_ok=exist_ok)

    def rename(self, path: str | WinPath, new_name: str) -> WinPath:
        """Rename an entry inside its folder; FileExistsError when the new name is taken."""
        wp = self.to_winpath(path)
        if not new_name or any(ch in _RESERVED or ch in "\\/" for ch in new_name):
            raise PathError(f"invalid file name {new_name!r}")
        if new_name in (".", ".."):
            raise PathError(f"invalid file name {new_name!r}")
        src = self.host_path(wp)
        dst_wp = wp.parent.child(new_name)
        dst = self.host_path(dst_wp)
        if dst.exists() and dst.name.lower() != src.name.lower():
            raise FileExistsError(f"{dst_wp} already exists")
        src.rename(src.parent / new_name)
        return dst_wp

    def recycle(self, path: str | WinPath) -> None:
        """Move an entry to the simulated recycle bin (like send2trash)."""
        src = self.host_path(path)
        if not src.exists():
            raise FileNotFoundError(str(path))
        bin_dir = self.root / _RECYCLE_DIR
        bin_dir.mkdir(exist_ok=True)
        target = bin_dir / src.name
        n = 1
        while target.exists():
            n += 1
            target = bin_dir / f"{src.name}.{n}"
        shutil.move(str(src), str(target))

    def remove_file(self, path: str | WinPath) -> None:
        """Delete a file permanently."""
        self.host_path(path).unlink()

    # -- set-up and snapshots --------------------------------------------------------------
    def initialise(self) -> None:
        """Create the user profile folders a fresh WAA VM has."""
        for folder in USER_FOLDERS:
            self.makedirs(f"{USER_HOME}\\{folder}")

    def capture(self) -> list[tuple[str, bytes | None]]:
        """Every folder (None) and file (bytes) under the root, for an exact snapshot."""
        items: list[tuple[str, bytes | None]] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, self.root)
            if rel_dir != ".":
                items.append((rel_dir, None))
            for fname in sorted(filenames):
                items.append((os.path.join(rel_dir, fname), (Path(dirpath) / fname).read_bytes()))
        return items

    def restore(self, items: list[tuple[str, bytes | None]]) -> None:
        """Replace the whole tree by a captured one."""
        for entry in os.listdir(self.root):
            full = self.root / entry
            if full.is_dir() and not full.is_symlink():
                shutil.rmtree(full)
            else:
                full.unlink()
        for rel, data in items:
            target = self.root / rel
            if data is None:
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)


def parse_or(path: str | WinPath) -> WinPath:
    """Accept either a WinPath or a Windows path string."""
    return path if isinstance(path, WinPath) else parse_winpath(path)


def path_has_parts(path: str | WinPath) -> bool:
    """False for a drive root such as ``C:\\``."""
    return bool(parse_or(path).parts)


def display_name(path: str | WinPath) -> str:
    """How Explorer titles a folder: its name, or ``Local Disk (C:)`` for a drive root."""
    wp = parse_or(path)
    return wp.parts[-1] if wp.parts else f"Local Disk ({wp.drive}:)"
