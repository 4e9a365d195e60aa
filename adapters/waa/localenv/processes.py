"""The simulated process list, as ``tasklist /fo csv /nh`` prints it on Windows.

The client verifies a launch by a new window or a new process of the launched program, because
WAA's ``/setup/launch`` answers 200 even for a program the VM does not have. Here the process list
follows the open windows: each Notepad and Settings window is its own process; File Explorer
windows live in the shell's explorer.exe (as on Windows); a dialog belongs to its owner's process.
A launch the simulation does not know starts neither window nor process.
"""

from __future__ import annotations

from .desktop import Desktop, Window

# Always running: the kernel, the shell, and the WAA server itself.
SYSTEM_PROCESSES: tuple[tuple[str, int], ...] = (
    ("System Idle Process", 0),
    ("System", 4),
    ("explorer.exe", 1204),
    ("python.exe", 2240),  # the WAA server (Flask) in the user's session
    ("svchost.exe", 868),
)
# Window class -> image name of the process that owns it (None: the shell's explorer.exe).
_IMAGES: dict[str, str | None] = {
    "Notepad": "notepad.exe",
    "ApplicationFrameWindow": "SystemSettings.exe",
    "CabinetWClass": None,
}


def window_pid(window: Window) -> int:
    """A PID that stays the same while the window is open and differs between windows."""
    return 4000 + 4 * window.wid


def processes(desk: Desktop) -> list[tuple[str, int]]:
    """(image name, PID) of every running process, system processes first."""
    running = list(SYSTEM_PROCESSES)
    for window in desk.windows:
        if window.owner is not None:
            continue  # a dialog runs in its owner's process
        image = _IMAGES.get(window.cls_name)
        if image is not None:
            running.append((image, window_pid(window)))
    return running


def tasklist_csv(desk: Desktop) -> str:
    """What ``tasklist /fo csv /nh`` prints: one quoted CSV line per process."""
    lines = [f'"{image}","{pid}","Console","1","{12_000 + pid % 7_000:,} K"' for image, pid in processes(desk)]
    return "\n".join(lines) + "\n"
