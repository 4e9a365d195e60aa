"""What /setup/launch and /setup/open_file do on the simulated desktop.

The real server hands the command to ``Popen(..., shell=True)`` and returns 200 whatever
happens; here a small parser recognises the commands WAA tasks use (``notepad [file]``,
``explorer [folder | ms-settings:...]``, ``start ms-settings:...``, ``cmd /c start ...``) and
anything else simply does nothing, which is what a missing program does on Windows too.
"""

from __future__ import annotations

import shlex

from .apps.explorer import TEXT_EXTENSIONS, open_explorer
from .apps.notepad import open_notepad
from .apps.settings import URI_PAGES, open_settings
from .desktop import Desktop
from .filesystem import PathError, USER_HOME, parse_winpath


def split_command(command: str | list[str]) -> list[str]:
    """Split a command line the way cmd.exe sees it (backslashes are not escapes)."""
    if isinstance(command, list):
        return [str(a) for a in command]
    try:
        parts = shlex.split(command, posix=False)
    except ValueError:
        parts = command.split()
    return [p[1:-1] if len(p) >= 2 and p[0] == p[-1] == '"' else p for p in parts]


def launch(desk: Desktop, command: str | list[str]) -> bool:
    """Start what the command names; False when the simulation knows no such program."""
    args = split_command(command)
    # Peel wrappers: "cmd /c ...", "start ...", 'start "" ...'.
    while args:
        head = args[0].lower()
        if head in ("cmd", "cmd.exe") and len(args) > 1 and args[1].lower() in ("/c", "/k"):
            # cmd.exe re-parses everything after /c as one command line.
            args = split_command(" ".join(f'"{a}"' if " " in a and len(args) > 3 else a for a in args[2:]))
        elif head == "start":
            args = args[1:]
            if args and args[0] == "":
                args = args[1:]
        else:
            break
    if not args:
        return False
    prog = args[0].lower().replace("/", "\\").rsplit("\\", 1)[-1]
    rest = " ".join(args[1:]).strip()
    if prog.startswith("ms-settings:"):
        open_settings(desk, URI_PAGES.get(prog[12:].lower(), "System"))
        return True
    if prog in ("notepad", "notepad.exe"):
        path = None
        if rest:
            try:
                path = parse_winpath(rest)
            except PathError:
                return True  # Notepad opens but cannot use the argument
        if path is not None and "." not in path.name:
            path = path.parent.child(path.name + ".txt")  # notepad appends .txt to bare names
        open_notepad(desk, path)
        return True
    if prog in ("explorer", "explorer.exe"):
        if rest.lower().startswith("ms-settings:"):
            open_settings(desk, URI_PAGES.get(rest[12:].lower(), "System"))
            return True
        target = rest or f"{USER_HOME}"
        try:
            if rest and desk.fs.is_file(target):
                return open_path(desk, target)
            open_explorer(desk, target if desk.fs.is_dir(target) else f"{USER_HOME}\\Documents")
        except PathError:
            open_explorer(desk, f"{USER_HOME}\\Documents")
        return True
    return False


def open_path(desk: Desktop, path: str) -> bool:
    """Open a file or folder with its default program, as os.startfile does."""
    wp = desk.fs.to_winpath(path)
    if desk.fs.is_dir(wp):
        open_explorer(desk, str(wp))
        return True
    if wp.name.lower().endswith(TEXT_EXTENSIONS):
        open_notepad(desk, wp)
        return True
    return False  # no simulated program for this file type
