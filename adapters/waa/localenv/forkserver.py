"""Start simulations by forking one process that has already imported them.

Starting ``python -m adapters.waa.localenv`` costs about 0.17 s of CPU before the simulation does
anything, most of it importing Flask, Werkzeug and Pillow (measured: 0.13 s of imports, 0.025 s
from there to a bound port). A run starts one simulation per VM and another per reboot, and the
tests some hundreds, so each process that starts simulations keeps one *fork server*: a child
that imports the simulation once, then forks a copy of itself for every simulation asked of it.
A forked simulation is the same program as a started one: its own session, its log on stdout and
stderr, the command line ``python -m adapters.waa.localenv`` takes, the asking process's
environment and working directory.

Protocol (Linux: file descriptors passed over Unix sockets, process file descriptors):

* The asking process holds one end of a ``SOCK_SEQPACKET`` socket pair; the fork server the other.
  For each simulation it sends one JSON message (command line, environment, working directory,
  log file) with one end of a new socket pair attached.
* The fork server forks. On that new socket it answers ``{"pid": N}`` with a process file
  descriptor of the child attached (taken before the child can be reaped, so signals sent through
  it never reach a recycled pid), and, once it has reaped the child, ``{"exit": code}`` (a
  negative code for a signal, as :class:`subprocess.Popen` gives).
* The fork server reads its end of the first pair until end of file: the asking process has
  ended, however it ended. It then exits; its simulations, watching their parent
  (``--exit-with-parent``), stop within half a second.

The fork server itself is single-threaded (forking a process with threads is unsafe), and the
children close every descriptor they inherit beyond their standard three. Its socket has no name
on the file system: only the process that started it can ask it for anything.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# The repository root, so ``-m adapters.waa.localenv[.forkserver]`` resolves in a new Python.
REPO_ROOT = Path(__file__).resolve().parents[3]
_MESSAGE_BYTES = 1 << 20  # a request carries the environment: ample for any
_REPLY_SECONDS = 30.0  # the fork server answers at once after its imports (0.2 s)
TITLE = "arena simulation fork server"
"""How the fork server names itself (``ps``): not a simulation, though it runs their code."""

START_ENV = "ARENA_SIM_START"
"""``exec`` starts every simulation as a new Python process instead of forking it from the fork
server (each then pays its own imports, about 0.17 s of CPU): to compare the two, or to rule the
fork server out when looking into a problem."""


def simulation_env() -> dict[str, str]:
    """This process's environment as a new simulation Python needs it: the repository on its
    path, its output unbuffered (its log is read while it runs)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def supported() -> bool:
    """Whether this platform has what the fork server needs (Linux's process file descriptors)."""
    return hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") and hasattr(socket, "send_fds")


def in_use() -> bool:
    """Whether simulations are forked here: the platform allows it and `START_ENV` does not say ``exec``."""
    return supported() and os.environ.get(START_ENV) != "exec"


class ForkedProcess:
    """A simulation the fork server forked, with the part of :class:`subprocess.Popen`'s interface
    the launcher uses (``pid``, ``returncode``, ``poll``, ``wait``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int, pidfd: int, channel: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._channel = channel  # the fork server writes the exit code here
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The exit code once the process has ended (and been reaped), else None."""
        return self._settle(0)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; :class:`subprocess.TimeoutExpired` after `timeout` seconds."""
        code = self._settle(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"simulation {self.pid}", timeout or 0)
        return code

    def terminate(self) -> None:
        """SIGTERM, unless it has ended."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, unless it has ended."""
        self.send_signal(signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        """Signal the process through its process file descriptor (never a recycled pid)."""
        with self._lock:
            if self.returncode is not None:
                return
            try:
                signal.pidfd_send_signal(self._pidfd, signum)
            except ProcessLookupError:
                pass  # ended; its code is on the way

    def _settle(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        # Waited for without the lock, so that a signal can be sent meanwhile.
        if not select.select([self._channel], [], [], timeout)[0]:
            return None
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            try:
                message = self._channel.recv(_MESSAGE_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if message:
                self.returncode = int(json.loads(message)["exit"])
            elif select.select([self._pidfd], [], [], timeout)[0]:
                # The fork server was killed (end of file, no word): its orphan stops by itself
                # (it watches its parent) and has now ended; its code went with the fork server.
                self.returncode = -signal.SIGKILL
            else:
                return None
            os.close(self._pidfd)
            self._channel.close()
            return self.returncode


class ForkServer:
    """This process's fork server: started on first use (or by :meth:`prestart`), restarted if it
    has died, replaced in a forked copy of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._errors: IO[bytes] | None = None
        self._closes_at_exit = False

    def prestart(self) -> None:
        """Start the fork server now, so its imports overlap with the caller's own work."""
        with self._lock:
            self._ensure()

    def spawn(self, argv: list[str], *, env: dict[str, str], cwd: Path, log_path: Path) -> ForkedProcess:
        """Fork a simulation: ``python -m adapters.waa.localenv`` with `argv`, in its own session,
        stdout and stderr appended to `log_path`. OSError when the fork server cannot answer."""
        request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd), "log": str(log_path)}).encode()
        for tries_left in (1, 0):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                with self._lock:
                    control = self._ensure()
                    try:
                        socket.send_fds(control, [request], [theirs.fileno()])
                    except OSError:
                        self._forget()  # died since its last use: once more with a new one
                        if not tries_left:
                            raise
                        ours.close()
                        theirs.close()
                        continue
                theirs.close()
                ours.settimeout(_REPLY_SECONDS)
                message, fds, _, _ = socket.recv_fds(ours, _MESSAGE_BYTES, 1)
                if not message or not fds:
                    raise OSError(f"the simulation fork server ended without starting the simulation: {self._failure()}")
                ours.settimeout(None)
                return ForkedProcess(int(json.loads(message)["pid"]), fds[0], ours)
            except BaseException:
                ours.close()
                theirs.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Let the fork server go (it exits at once; its simulations stop by themselves) and wait
        for it, so that it is reaped here: no process of ours is left to init, and its CPU and its
        simulations' count as this process's children's, as they did when this process started
        each simulation itself (what bench/process_cpu.py accounts by)."""
        with self._lock:
            if self._owner != os.getpid():
                return
            control, process, errors = self._control, self._process, self._errors
            self._control, self._process, self._errors = None, None, None
        if control is not None:
            control.close()
        if process is not None:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if errors is not None:
            errors.close()

    def _ensure(self) -> socket.socket:
        if self._owner != os.getpid():
            # A forked copy of this process holds its parent's control socket: it lets go of it
            # (the fork server must see its end when the parent ends) and starts its own.
            if self._control is not None:
                self._control.close()
            self._process, self._control, self._errors, self._owner = None, None, None, os.getpid()
        if self._process is not None and self._process.poll() is not None:
            self._forget()
        if self._control is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._errors = tempfile.TemporaryFile()  # what it says if it fails; read by _failure
            # A session of its own, as each simulation: a Ctrl-C in the terminal is for `arena run`.
            self._process = subprocess.Popen(
                [sys.executable, "-m", "adapters.waa.localenv.forkserver", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=self._errors, env=simulation_env(), cwd=str(REPO_ROOT), start_new_session=True,
            )
            theirs.close()
            self._control = ours
            if not self._closes_at_exit:
                atexit.register(self.close)
                self._closes_at_exit = True
        return self._control

    def _failure(self) -> str:
        """The fork server's exit code and the end of what it wrote, once it has ended."""
        process, errors = self._process, self._errors
        if process is None or errors is None:
            return "not running"
        try:
            code = process.wait(5)
        except subprocess.TimeoutExpired:
            return "it is still running"
        errors.seek(0)
        said = errors.read().decode(errors="replace").strip().splitlines()[-5:]
        return f"exit code {code}" + (":\n" + "\n".join(said) if said else "")

    def _forget(self) -> None:
        if self._control is not None:
            self._control.close()
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._errors is not None:
            self._errors.close()
        self._process, self._control, self._errors = None, None, None


_SERVER = ForkServer()


def prestart() -> None:
    """Start this process's fork server in the background when simulations are forked here
    (see :meth:`ForkServer.prestart`)."""
    if in_use():
        _SERVER.prestart()


def spawn(argv: list[str], *, env: dict[str, str], cwd: Path, log_path: Path) -> ForkedProcess:
    """Fork a simulation from this process's fork server (see :meth:`ForkServer.spawn`)."""
    return _SERVER.spawn(argv, env=env, cwd=cwd, log_path=log_path)


# --- the fork server's side --------------------------------------------------------------------


def _serve(control: socket.socket) -> None:
    """Fork a simulation for each request on `control` until it reaches end of file."""
    from adapters.import_gc import paused_for_imports

    with paused_for_imports():  # and frozen: no child's collector walks them (adapters/import_gc.py)
        from . import accessibility, launch  # noqa: F401 - imported once here, not in every child
        from .__main__ import main

    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the asker's channel)
    events = selectors.DefaultSelector()
    events.register(control, selectors.EVENT_READ)
    while True:
        for key, _ in events.select():
            if key.fileobj is control:
                message, fds, _, _ = socket.recv_fds(control, _MESSAGE_BYTES, 1)
                if not message:
                    return  # the asking process has ended: so do we (the children follow)
                channel = socket.socket(fileno=fds[0])
                pid, pidfd = _fork(json.loads(message), main)
                children[pidfd] = (pid, channel)
                events.register(pidfd, selectors.EVENT_READ)
                _tell(channel, {"pid": pid}, [pidfd])
            else:
                pid, channel = children.pop(key.fd)
                events.unregister(key.fd)
                _, status = os.waitpid(pid, 0)
                os.close(key.fd)
                _tell(channel, {"exit": os.waitstatus_to_exitcode(status)})
                channel.close()


def _tell(channel: socket.socket, message: dict[str, int], fds: list[int] | None = None) -> None:
    try:
        socket.send_fds(channel, [json.dumps(message).encode()], fds or [])
    except OSError:
        pass  # the asker has closed its handle (or ended): nobody is waiting for this


def _fork(request: dict[str, Any], main: Callable[[list[str]], int]) -> tuple[int, int]:
    """Fork one simulation: in this process its pid and process file descriptor; the child runs
    the simulation and never returns."""
    me = os.getpid()
    pid = os.fork()
    if pid:
        return pid, os.pidfd_open(pid)  # before any reaping: the pid cannot be recycled yet
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the fork server's sockets, other children's channels
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # It watches the fork server, its parent, named before the fork (see --exit-with-parent).
        argv = [*request["argv"], "--exit-with-parent", str(me)]
        from setproctitle import setproctitle  # imported by the fork server already

        # Named as a started one: `ps` and what looks for simulations by command line see the same.
        setproctitle(" ".join([sys.executable, "-m", "adapters.waa.localenv", *argv]))
        sys.argv = ["python -m adapters.waa.localenv", *argv]
        code = main(argv)
    except SystemExit as stop:  # argparse's, as `python -m` would exit with it
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    from setproctitle import setproctitle

    # Not a simulation itself: named so that nothing counts it as one.
    setproctitle(f"{TITLE} (for pid {os.getppid()})")
    _serve(socket.socket(fileno=int(sys.argv[1])))
