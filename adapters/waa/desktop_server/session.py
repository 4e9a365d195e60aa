"""Start the desktop session in the guest: the display, the session bus, the window manager,
AT-SPI and warm instances of LibreOffice and the file manager, as the desktop user.

    python3 -m adapters.waa.desktop_server.session      # returns once the desktop is up

Run once per boot, before the server (boot.sh on the guest's code disk). Everything is left
running in its own session; the ready state the kvm provider saves afterwards holds it, so a
reset restores a desktop that is already up (LibreOffice started once, its profile made).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

DISPLAY = ":0"
SCREEN = "1280x800x24"
HOME = "/home/user"
UID = 1000
BIN = Path(__file__).resolve().parent / "bin"
CONFIG = Path(__file__).resolve().parent / "config"
START_TIMEOUT_SECONDS = 600.0  # LibreOffice's first start (its profile) under TCG takes minutes
OPENBOX_RC = Path("/etc/xdg/openbox/rc.xml")
MAXIMISED = '<application class="*" type="normal"><maximized>true</maximized><decor>yes</decor></application>\n'
HOME_FOLDERS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos")


def session_env(home: str = HOME, display: str = DISPLAY, uid: int = UID) -> dict[str, str]:
    """The environment every program of the desktop runs with (the server's commands too)."""
    runtime = f"/run/user/{uid}"
    return {
        "HOME": home, "USER": "user", "LOGNAME": "user", "SHELL": "/bin/sh", "LANG": "C.UTF-8",
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "DISPLAY": display, "XDG_RUNTIME_DIR": runtime,
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime}/bus", "SAL_USE_VCLPLUGIN": "gtk3",
        "PYTHONDONTWRITEBYTECODE": "1", "GTK_OVERLAY_SCROLLING": "0", "NO_AT_BRIDGE": "0",
    }


def _log(message: str) -> None:
    print(f"waa-desktop: {message}", file=sys.stderr, flush=True)


def _start(command: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen:
    log = open(Path(env["XDG_RUNTIME_DIR"]) / f"{log_name}.log", "ab")
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True, cwd=env["HOME"])


def _wait(what: str, ready, process: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}) before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready within {timeout:g} s")
        time.sleep(0.1)


def seed_home(home: Path) -> None:
    """The user's folders and the applications' settings (config/): LibreOffice without first-start
    dialogs, tips, recovery prompts or the "keep format" question, saving .xlsx/.docx by default."""
    for folder in HOME_FOLDERS:
        (home / folder).mkdir(parents=True, exist_ok=True)
    for source in sorted(CONFIG.rglob("*")):
        if source.is_file():
            target = home / source.relative_to(CONFIG)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    rc = home / ".config/openbox/rc.xml"
    if not rc.exists() and OPENBOX_RC.exists():
        # Openbox's own settings, with normal windows maximised: the same layout on every run.
        rc.parent.mkdir(parents=True, exist_ok=True)
        rc.write_text(OPENBOX_RC.read_text().replace("</applications>", MAXIMISED + "</applications>", 1))


def _lo_pipe_ready() -> bool:
    # A running soffice listens on its single-instance pipe in /tmp.
    return any(name.startswith("OSL_PIPE_") for name in os.listdir("/tmp"))


def start(home: str = HOME, display: str = DISPLAY) -> None:
    """Start every part of the session, each waited for; RuntimeError names the part that failed."""
    env = session_env(home, display)
    Path(env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, exist_ok=True)
    seed_home(Path(home))
    started = time.monotonic()
    x = _start(["Xvfb", display, "-screen", "0", SCREEN, "-nolisten", "tcp", "-dpi", "96"], env, "xvfb")
    _wait("Xvfb", lambda: os.path.exists(f"/tmp/.X11-unix/X{display.lstrip(':')}"), x)
    bus_path = env["DBUS_SESSION_BUS_ADDRESS"].removeprefix("unix:path=")
    bus = _start(["dbus-daemon", "--session", "--nofork", "--address", env["DBUS_SESSION_BUS_ADDRESS"]], env, "dbus")
    _wait("the session bus", lambda: os.path.exists(bus_path), bus)
    _start(["openbox"], env, "openbox")
    from .display import Display

    screen = Display(display)
    screen.use_us_keyboard()
    _wait("openbox", screen.has_window_manager, timeout=60)
    # AT-SPI's bus comes up on first use (D-Bus activation): use it once now, so it is in the ready state.
    done = subprocess.run([sys.executable, "-c", "import gi; gi.require_version('Atspi', '2.0'); "
                           "from gi.repository import Atspi; print(Atspi.get_desktop(0).get_child_count())"],
                          env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"AT-SPI did not answer: {done.stderr.strip()[-300:]}")
    _start(["pcmanfm", "--daemon-mode"], env, "pcmanfm")
    office = _start(["soffice", "--nodefault", "--nologo", "--norestore"], env, "libreoffice")
    _wait("LibreOffice", _lo_pipe_ready, office, timeout=START_TIMEOUT_SECONDS)
    _wait("LibreOffice to finish starting", _quiet("soffice.bin"), timeout=START_TIMEOUT_SECONDS)
    _log(f"desktop up in {time.monotonic() - started:.1f} s (display {display}, {SCREEN})")


def _cpu_ticks(name: str) -> int | None:
    """CPU time used so far by the processes named `name` (None when there is none)."""
    from .display import cpu_ticks

    total, found = 0, False
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/comm") as handle:
                if handle.read().strip() != name[:15]:
                    continue
        except OSError:
            continue
        ticks = cpu_ticks(int(entry))
        if ticks is not None:
            total, found = total + ticks, True
    return total if found else None


def _quiet(name: str, seconds: float = 3.0):
    """A readiness check: `name` runs and has used no CPU for `seconds` (done starting up)."""
    state = {"ticks": None, "since": time.monotonic()}

    def check() -> bool:
        ticks = _cpu_ticks(name)
        now = time.monotonic()
        if ticks is None or ticks != state["ticks"]:
            state["ticks"], state["since"] = ticks, now
            return False
        return now - state["since"] >= seconds

    return check


if __name__ == "__main__":
    try:
        start()
    except RuntimeError as exc:
        _log(f"the desktop did not start: {exc}")
        sys.exit(1)
