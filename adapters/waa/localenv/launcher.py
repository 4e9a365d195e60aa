"""Start the WAA simulation as a process of its own and hand back a handle to it.

Each simulation is forked from this process's fork server (:mod:`.forkserver`), which has
imported the simulation once, so a start costs no Python start-up; set ``ARENA_SIM_START=exec``
(or run where Linux's process file descriptors are missing) to start each one afresh
(see :data:`.forkserver.START_ENV`).

This is what the project's local VM provider calls::

    handle = start_local_env(tmp_path / "vm")
    requests.get(handle.base_url + "/probe")
    handle.stop()

``start_local_env(root, quirks=True)`` runs the simulation in quirks mode (:mod:`.quirks`);
``quirk_settings={"ready_delay": 0.5, ...}`` tunes its knobs. With ``wait_ready=False`` it returns
as soon as the server has bound its port (written the port file), before ``/probe`` answers, so
the caller's own readiness wait is what gets exercised.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from adapters.process_dirs import process_dir

from . import forkserver
from .forkserver import REPO_ROOT
from .quirks import QuirkSettings

SimulationProcess = subprocess.Popen | forkserver.ForkedProcess
"""A simulation's process: forked (the usual) or started afresh."""


class LocalEnvError(RuntimeError):
    """The simulation process failed to start."""


@dataclass
class LocalEnvHandle:
    """A running simulation process."""

    base_url: str
    pid: int
    root: Path
    log_path: Path
    _proc: SimulationProcess = field(repr=False)
    quirks: QuirkSettings | None = None
    """The quirks-mode settings in force, None without quirks mode."""

    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc.poll() is None

    def returncode(self) -> int | None:
        """Its exit status once it has ended (negative: the signal that ended it), else None."""
        return self._proc.poll()

    def stop(self, timeout: float = 5) -> None:
        """Terminate (SIGTERM), then kill if it has not exited within timeout seconds."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _spawn(args: list[str], log_path: Path) -> SimulationProcess:
    """``python -m adapters.waa.localenv ARGS`` in a session of its own, its output appended to
    `log_path`: forked from this process's fork server (:mod:`.forkserver`) where the platform
    allows, else started afresh.

    A session of its own: the terminal's Ctrl-C goes to `arena run`, which lets the running
    attempts finish within its grace period and then stops the simulation itself; reaching the
    simulation directly, it would cut those attempts short as infrastructure errors.
    """
    env = forkserver.simulation_env()
    if forkserver.in_use():
        return forkserver.spawn(args, env=env, cwd=REPO_ROOT, log_path=log_path)
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "adapters.waa.localenv", *args,
                                 "--exit-with-parent", str(os.getpid())],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=str(REPO_ROOT), start_new_session=True)


def start_local_env(root: Path, *, width: int = 1280, height: int = 800, startup_timeout: float = 30.0,
                    log_path: Path | None = None, quirks: bool = False, wait_ready: bool = True,
                    quirk_settings: dict[str, Any] | None = None) -> LocalEnvHandle:
    """Start a simulation serving on a free loopback port. Its log is `log_path`, by default
    beside `root` (``<root>.log``: the root is the simulated disk, which a snapshot's restore
    replaces whole), and stays after the simulation stops.

    With wait_ready (the default) wait until /probe answers 200 (in quirks mode that takes the
    readiness delay); without it, return once the port is bound. quirk_settings (only with
    quirks=True) overrides the knobs of :class:`~.quirks.QuirkSettings`; ValueError when bad.
    """
    if quirk_settings is not None and not quirks:
        raise ValueError("quirk_settings given without quirks=True")
    settings = QuirkSettings.from_dict(quirk_settings) if quirks else None
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    # The port file's, gone once it is read, and with this process if it is killed first.
    run_dir = process_dir("port")
    port_file = run_dir / "port"
    log_path = Path(log_path) if log_path else Path(f"{root.resolve()}.log")
    args = ["--host", "127.0.0.1", "--port", "0", "--root", str(root), "--port-file", str(port_file),
            "--width", str(width), "--height", str(height), *(settings.cli_args() if settings is not None else [])]
    proc = _spawn(args, log_path)
    deadline = time.monotonic() + startup_timeout

    def tidy() -> None:
        shutil.rmtree(run_dir, ignore_errors=True)  # the port file has done its job

    def fail(why: str) -> LocalEnvError:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tidy()
        return LocalEnvError(f"WAA simulation {why}; log {log_path}:\n{_tail(log_path)}")

    while not port_file.exists():
        if proc.poll() is not None:
            raise fail(f"exited with code {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise fail(f"did not start within {startup_timeout} s")
        time.sleep(0.05)
    base_url = f"http://127.0.0.1:{int(port_file.read_text().strip())}"
    tidy()
    while wait_ready:
        try:
            if requests.get(base_url + "/probe", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise fail(f"exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise fail(f"did not answer /probe within {startup_timeout} s")
        time.sleep(0.05)
    return LocalEnvHandle(base_url=base_url, pid=proc.pid, root=root, log_path=log_path, _proc=proc, quirks=settings)
