"""The whole simulated machine: disk, desktop, ``computer`` state and named snapshots.

One lock guards every change, because the HTTP server is threaded. Quirks mode
(:mod:`.quirks`) adds a readiness clock, delayed app launches, the server-process fail-safe, slow
repaints and failing strict activations.

``/execute`` keeps two limits of the real server on Windows, always: a command line longer than
Windows' 32,766 characters fails to start (500 ``[WinError 206] The filename or extension is too
long``), and a program that runs past WAA's 120 s subprocess timeout is killed (500 ``Command
'...' timed out after 120 seconds``); the text typed before that stays typed. Typing time is
modelled (``interval`` per character), not spent, so the answer comes at once.

``cmd /c type PATH`` prints a file's bytes as they are, and WAA's ``/execute`` decodes a command's
output as text in Windows' ANSI code page (``subprocess.run(..., text=True)``: cp1252): a file in
another code page (UTF-8 text with a Cyrillic letter, an OEM cp437 one with an umlaut) holds bytes
cp1252 does not define, and the route answers 500 ``'charmap' codec can't decode byte 0x81 ...``,
every time it is asked.
"""

from __future__ import annotations

import copy
import logging
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import actioncode
from .desktop import Desktop
from .faults import FaultInjector
from .filesystem import SimFileSystem
from .processes import tasklist_csv
from .quirks import QuirkSettings

log = logging.getLogger(__name__)

_GET_REG = re.compile(r"^Get-ItemPropertyValue -Path '([^'\r\n]+)' -Name '([^'\r\n]+)'$")
_SET_REG = re.compile(r"^Set-ItemProperty -Path '([^'\r\n]+)' -Name '([^'\r\n]+)' -Value '([^'\r\n]*)'$")
_PYTHONS = {"python", "python.exe", "python3", "python3.exe", "py", "py.exe", "pythonw", "pythonw.exe"}
# Windows' CreateProcess refuses a longer command line; WAA's /execute kills its subprocess after.
COMMAND_LINE_LIMIT = 32766
EXECUTE_TIMEOUT_SECONDS = 120.0


class CommandLineTooLong(OSError):
    """What subprocess.run raises on Windows for a command line over COMMAND_LINE_LIMIT."""

    def __init__(self) -> None:
        super().__init__("[WinError 206] The filename or extension is too long")


class ExecuteTimedOut(RuntimeError):
    """subprocess.TimeoutExpired as WAA's /execute reports it (its str() is the message)."""


class SimEnvironment:
    """State and behaviour behind the HTTP routes."""

    def __init__(self, root: Path, width: int = 1280, height: int = 800,
                 sleep: Callable[[float], None] = time.sleep, quirks: QuirkSettings | None = None) -> None:
        self.quirks_on = quirks is not None
        self.quirks = quirks if quirks is not None else QuirkSettings.off()
        # pyautogui.FAILSAFE in the server process (what /execute_windows code runs under); an
        # /execute_windows program that assigns pyautogui.FAILSAFE changes it for later calls too,
        # as in the real, long-running server. Reverting a snapshot restarts it (back to default).
        self.server_failsafe = self.quirks.failsafe
        self.ready_at = time.monotonic() + self.quirks.ready_delay
        self._launch_generation = 0
        self.lock = threading.RLock()
        self.fs = SimFileSystem(root)
        self.fs.initialise()
        self.desk = Desktop(self.fs, width, height)
        self.desk.save_prompts = self.quirks.save_prompts
        self.computer: actioncode.ComputerState | None = None
        self.snapshots: dict[str, tuple[Any, ...]] = {}
        self.sleep = sleep
        # Injected server faults (POST /sim/faults; quirks mode's action_fault_rate).
        self.faults = FaultInjector.for_action_rate(self.quirks.action_fault_rate, self.quirks.fault_seed)
        # Slow repaint (quirks mode's repaint_delay): what the screen still shows, until when.
        self._painted: Desktop | None = None
        self._repaint_at = 0.0
        # Actions run so far, and how many of them the screen shows (a test's stale check).
        self.actions_run = 0
        self._painted_actions = 0

    # -- slow repaint (quirks mode) ---------------------------------------------------------
    def shown_desk(self) -> Desktop:
        """The desktop as the screen and the accessibility tree show it (call with the lock
        held): with a repaint pending, the desktop from before the actions since the last repaint."""
        if self._painted is not None and time.monotonic() < self._repaint_at:
            return self._painted
        self._painted = None
        return self.desk

    def shown_actions(self) -> int:
        """How many of the actions run so far the screen shows (call with the lock held): fewer
        than `actions_run` while a slow repaint is pending."""
        return self._painted_actions if self.shown_desk() is self._painted else self.actions_run

    def live_at(self) -> float | None:
        """The time live regions are drawn at (quirks mode's live_regions), or None."""
        return time.time() if self.quirks.live_regions else None

    def _before_action(self) -> None:
        """Keep what the screen shows now, when actions repaint late (lock held)."""
        if self.quirks.repaint_delay > 0 and self._painted is None:
            view = Desktop(self.fs, self.desk.width, self.desk.height)
            view.restore(self.desk.capture())
            self._painted = view
            self._painted_actions = self.actions_run

    def _after_action(self) -> None:
        """The screen catches up repaint_delay seconds after the last action (lock held)."""
        self.actions_run += 1
        if self.quirks.repaint_delay > 0:
            self._repaint_at = time.monotonic() + self.quirks.repaint_delay

    def restart_server(self) -> None:
        """The WAA server process restarted while the VM kept running (its watchdog, a crash).

        Its module state is new: ``computer`` is None again until the next /update_computer, and
        pyautogui's fail-safe is back to its default. Desktop, files and clipboard stay.
        """
        with self.lock:
            self.computer = None
            self.server_failsafe = self.quirks.failsafe

    # -- readiness and delayed launches (quirks mode) ---------------------------------------
    def start_ready_clock(self) -> None:
        """Start the readiness delay now (call when the server starts serving)."""
        self.ready_at = time.monotonic() + self.quirks.ready_delay

    def is_ready(self) -> bool:
        """False while quirks mode still pretends the WAA server is not up."""
        return time.monotonic() >= self.ready_at

    def ready_in(self) -> float:
        """Seconds until ready (0 when ready)."""
        return max(0.0, self.ready_at - time.monotonic())

    def launch_later(self, command: Any, delay: float) -> None:
        """Run /setup/launch's effect after delay seconds (a real app takes time to open).

        Loading a snapshot cancels launches still pending, as reverting a VM kills its processes.
        """
        from .launch import launch

        generation = self._launch_generation

        def fire() -> None:
            with self.lock:
                if generation != self._launch_generation:
                    return
                try:
                    launch(self.desk, command)
                except Exception:  # a background launch has nobody to report to but the log
                    log.exception("delayed launch of %r failed", command)

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        timer.start()

    # -- snapshots -------------------------------------------------------------------------
    def save_snapshot(self, name: str) -> None:
        """Capture disk, desktop, registry, clipboard, pointer and computer state."""
        with self.lock:
            self.snapshots[name] = (self.fs.capture(), self.desk.capture(), copy.deepcopy(self.computer))

    def load_snapshot(self, name: str) -> bool:
        """Restore a snapshot exactly; False when it does not exist."""
        with self.lock:
            snap = self.snapshots.get(name)
            if snap is None:
                return False
            self.fs.restore(snap[0])
            self.desk.restore(snap[1])
            self.computer = copy.deepcopy(snap[2])
            self.server_failsafe = self.quirks.failsafe
            self._launch_generation += 1
            self._painted = None
            return True

    # -- /execute --------------------------------------------------------------------------
    def execute(self, command: Any, shell: bool) -> dict[str, Any]:
        """What ``subprocess.run`` would report for the command, as the /execute JSON body.
        Raises (the route answers 500) where subprocess.run raises on Windows: a command line
        over COMMAND_LINE_LIMIT, a program past EXECUTE_TIMEOUT_SECONDS."""
        line = subprocess.list2cmdline([str(c) for c in command]) if isinstance(command, list) else str(command)
        if len(line) > COMMAND_LINE_LIMIT:
            raise CommandLineTooLong()
        if isinstance(command, str) and not shell:
            argv = shlex.split(command)
        elif isinstance(command, list):
            argv = [str(c) for c in command]
        else:
            argv = None  # a shell string
        if argv is None and _is_tasklist(str(command).split()):
            argv = str(command).split()
        if argv is None:
            # cmd.exe would parse it; accept only the exact registry query form.
            m = re.match(r'^powershell(?:\.exe)? -Command "(.*)"$', str(command).strip(), re.S | re.I)
            if m:
                return self._powershell(m.group(1))
            first = str(command).strip().split(" ", 1)[0] if str(command).strip() else ""
            return self._unavailable(first)
        if not argv:
            return self._unavailable("")
        prog = argv[0].replace("\\", "/").rsplit("/", 1)[-1].lower()
        if _is_tasklist(argv):
            with self.lock:
                return self._result(output=tasklist_csv(self.desk))
        if prog in _PYTHONS and len(argv) == 3 and argv[1] == "-c":
            return self._python(argv[2], argv)
        if prog in ("powershell", "powershell.exe") and len(argv) == 3 and argv[1].lower() == "-command":
            return self._powershell(argv[2])
        if prog in ("cmd", "cmd.exe") and len(argv) == 4 and [a.lower() for a in argv[1:3]] == ["/c", "type"]:
            return self._type(argv[3])
        return self._unavailable(argv[0])

    def _type(self, path: str) -> dict[str, Any]:
        """``cmd /c type PATH``: the file's bytes, decoded as WAA's server decodes a command's
        output (cp1252, strict: an undefined byte raises and the route answers 500)."""
        with self.lock:
            try:
                data = self.fs.read_bytes(path) if self.fs.is_file(path) else None
            except (OSError, ValueError):
                data = None
        if data is None:
            return self._result(error="The system cannot find the file specified.\r\n", returncode=1)
        return self._result(output=data.decode("cp1252"))

    @staticmethod
    def _result(output: str = "", error: str = "", returncode: int = 0) -> dict[str, Any]:
        return {"status": "success", "output": output, "error": error, "returncode": returncode}

    def _unavailable(self, prog: str) -> dict[str, Any]:
        return self._result(error=f"'{prog}' is not available in the WAA simulation "
                                  "(only pyautogui action code and registry queries are)\n", returncode=1)

    def _python(self, source: str, argv: list[str]) -> dict[str, Any]:
        try:
            ops = actioncode.parse(source, dialect="python")
        except actioncode.ActionError as exc:
            return self._result(error=exc.traceback_text(), returncode=1)
        runner = actioncode.Runner(self.desk, failsafe=True, sleep=self._sleep_unlocked,
                                   time_limit=EXECUTE_TIMEOUT_SECONDS)
        try:
            with self.lock:
                self._before_action()
                try:
                    runner.run(ops)
                finally:
                    self._after_action()
        except actioncode.ActionError as exc:
            return self._result(output="".join(runner.stdout), error=exc.traceback_text(), returncode=1)
        except actioncode.CommandTimedOut:
            raise ExecuteTimedOut(f"Command '{argv}' timed out after {EXECUTE_TIMEOUT_SECONDS:g} seconds") from None
        return self._result(output="".join(runner.stdout))

    def _powershell(self, script: str) -> dict[str, Any]:
        script = script.strip()
        with self.lock:
            m = _GET_REG.match(script)
            if m:
                path, name = m.groups()
                try:
                    has_key = self.desk.registry.has_key(path)
                    value = self.desk.registry.get(path, name)
                except ValueError:
                    has_key, value = False, None
                if not has_key:
                    return self._result(error=f"Get-ItemPropertyValue : Cannot find path '{path}' because it does "
                                              "not exist.\n", returncode=1)
                if value is None:
                    return self._result(error=f"Get-ItemPropertyValue : Property {name} does not exist at path "
                                              f"{path}.\n", returncode=1)
                return self._result(output=f"{value}\n")
            m = _SET_REG.match(script)
            if m:
                path, name, raw = m.groups()
                try:
                    old = self.desk.registry.get(path, name)
                    value: int | str = int(raw) if isinstance(old, int) and re.fullmatch(r"-?\d+", raw) else raw
                    self.desk.registry.set(path, name, value)
                except ValueError:
                    return self._result(error=f"Set-ItemProperty : Cannot find drive for path '{path}'.\n", returncode=1)
                return self._result()
        return self._unavailable("powershell")

    def _sleep_unlocked(self, seconds: float) -> None:
        # time.sleep in action code must not freeze screenshots and other requests meanwhile.
        self.lock.release()
        try:
            self.sleep(seconds)
        finally:
            self.lock.acquire()

    # -- /execute_windows ------------------------------------------------------------------
    def execute_windows(self, source: str) -> str:
        """Run ``computer.*`` code; returns captured stdout, raises ActionError on failure."""
        ops = actioncode.parse(source, dialect="computer")
        with self.lock:
            runner = actioncode.Runner(self.desk, failsafe=self.server_failsafe, computer=self.computer,
                                       sleep=self._sleep_unlocked)
            self._before_action()
            try:
                runner.run(ops)
            finally:
                self.server_failsafe = runner.failsafe  # module state of the long-running server
                self._after_action()
        return "".join(runner.stdout)


def _is_tasklist(argv: list[str]) -> bool:
    """``tasklist /fo csv /nh``: the process list the client verifies launches with."""
    words = [a.lower() for a in argv]
    return bool(words) and words[0] in ("tasklist", "tasklist.exe") and words[1:] == ["/fo", "csv", "/nh"]
