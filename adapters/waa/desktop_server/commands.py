"""Running programs in the desktop session: /execute, /setup/launch and /setup/open_file.

Every program runs as the desktop user with the session's environment (``DISPLAY``, the D-Bus
session bus, ``HOME``), in its own process group, so that a command that outlives WAA's 120 s
timeout is ended with everything it started, not just its shell.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import PurePosixPath

EXECUTE_TIMEOUT_SECONDS = 120.0  # WAA's /execute: subprocess.run(..., timeout=120)

# What /setup/open_file starts for a file, by suffix (WAA calls os.startfile: the Windows
# association). A folder opens in the file manager; anything else in the text editor.
_OPENERS = {
    (".xlsx", ".xls", ".ods", ".csv"): ["libreoffice", "--calc"],
    (".docx", ".doc", ".odt", ".rtf"): ["libreoffice", "--writer"],
    (".pptx", ".odp"): ["libreoffice", "--impress"],
}
TEXT_EDITOR = ["mousepad"]
FILE_MANAGER = ["pcmanfm"]


class CommandTimedOut(RuntimeError):
    """A command ran past EXECUTE_TIMEOUT_SECONDS (it and its children were ended)."""


def argv_of(command: object, shell: bool) -> list[str] | str:
    """What subprocess gets: WAA's rules (a string without shell is split like a shell would)."""
    if shell:
        return command if isinstance(command, str) else shlex.join(str(part) for part in command)  # type: ignore[union-attr]
    if isinstance(command, str):
        return shlex.split(command)
    if isinstance(command, list) and all(isinstance(part, (str, int, float)) for part in command):
        return [os.path.expanduser(str(part)) if str(part).startswith("~/") else str(part) for part in command]
    raise TypeError(f"command must be a string or a list of strings, got {type(command).__name__}")


def execute(command: object, shell: bool, env: dict[str, str], timeout: float = EXECUTE_TIMEOUT_SECONDS) -> dict:
    """Run a command to its end: WAA's /execute answer (status, output, error, returncode), a
    failing command included. Past `timeout`, CommandTimedOut (the route answers 500)."""
    argv = argv_of(command, shell)
    process = subprocess.Popen(argv, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, start_new_session=True, cwd=env.get("HOME"))
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.communicate()
        raise CommandTimedOut(f"Command '{argv}' timed out after {timeout:g} seconds") from None
    return {"status": "success", "output": out.decode("utf-8", "replace"), "error": err.decode("utf-8", "replace"),
            "returncode": process.returncode}


def launch(command: object, env: dict[str, str]) -> subprocess.Popen:
    """Start a program without waiting for it (WAA's /setup/launch runs it through the shell)."""
    line = command if isinstance(command, str) else shlex.join(str(part) for part in command)  # type: ignore[union-attr]
    return subprocess.Popen(line, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True, cwd=env.get("HOME"))


def opener(path: str, is_dir: bool) -> list[str]:
    """The program that opens `path` (the desktop's file associations)."""
    if is_dir:
        return FILE_MANAGER + [path]
    suffix = PurePosixPath(path).suffix.lower()
    for suffixes, program in _OPENERS.items():
        if suffix in suffixes:
            return program + [path]
    return TEXT_EDITOR + [path]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
