"""Simulations forked from the fork server behave as started ones: real processes, their own
session and log, exit codes and signals as Popen gives them, and nothing outlives the process
that asked for them, whichever of the two is killed."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from adapters.waa.localenv import forkserver
from adapters.waa.localenv.forkserver import START_ENV
from adapters.waa.localenv.launcher import LocalEnvError, start_local_env

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not forkserver.supported(), reason="the fork server needs Linux's pidfds")


@pytest.fixture(autouse=True)
def _forked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(START_ENV, raising=False)  # forked, whatever the caller's environment says


def _gone_within(pid: int, seconds: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout=seconds)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def test_a_forked_simulation_is_its_own_process_session_and_log(tmp_path: Path) -> None:
    handle = start_local_env(tmp_path / "root")
    try:
        assert requests.get(handle.base_url + "/probe", timeout=10).status_code == 200
        sim = psutil.Process(handle.pid)
        server = sim.parent()
        assert server is not None and server.pid != os.getpid()
        assert server.parent().pid == os.getpid()
        assert os.getsid(handle.pid) == handle.pid  # a session of its own: Ctrl-C is not for it
        # It holds no Unix socket: neither the fork server's control channel nor another
        # simulation's exit channel leaked into it.
        assert sim.net_connections(kind="unix") == []
        assert [os.readlink(f"/proc/{handle.pid}/fd/{fd}") for fd in (0, 1, 2)] == [os.devnull, *[str(handle.log_path)] * 2]
        # Named as a started one, watching the fork server, its parent (named before the fork).
        command = " ".join(sim.cmdline())
        assert command.startswith(f"{sys.executable} -m adapters.waa.localenv --host 127.0.0.1 --port 0 "
                                  f"--root {tmp_path / 'root'} "), command
        assert command.endswith(f" --width 1280 --height 800 --exit-with-parent {server.pid}"), command
        assert " ".join(server.cmdline()).startswith(f"{forkserver.TITLE} (for pid {os.getpid()})")  # not a simulation
    finally:
        handle.stop()
    assert not handle.alive() and handle._proc.returncode == 0  # noqa: SLF001 - a clean SIGTERM stop
    log = handle.log_path.read_text()
    assert "WAA SIMULATION listening" in log and "WAA SIMULATION stopped" in log


def test_exit_codes_and_signals_are_reported_as_popen_reports_them(tmp_path: Path) -> None:
    # Exits with 2 before listening: the launcher names the code and the log's last lines.
    with pytest.raises(LocalEnvError, match=r"exited with code 2 before listening[\s\S]*screen too small"):
        start_local_env(tmp_path / "small", width=10, height=10, startup_timeout=20)
    handle = start_local_env(tmp_path / "killed")
    os.kill(handle.pid, signal.SIGKILL)
    assert handle._proc.wait(10) == -signal.SIGKILL  # noqa: SLF001
    assert not handle.alive()
    handle.stop()  # nothing left to stop: returns at once, signals no recycled pid
    with pytest.raises(subprocess.TimeoutExpired):
        live = start_local_env(tmp_path / "live")
        try:
            live._proc.wait(0.2)  # noqa: SLF001 - still serving
        finally:
            live.stop()


def test_a_killed_fork_server_takes_its_simulations_and_a_new_one_serves_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fork server of the test's own as this process's: killing the shared one would also take
    # the simulations other tests in this process started (the session's `sim`).
    own = forkserver.ForkServer()
    monkeypatch.setattr(forkserver, "_SERVER", own)
    try:
        _kill_the_fork_server_and_start_again(tmp_path)
    finally:
        own.close()


def _kill_the_fork_server_and_start_again(tmp_path: Path) -> None:
    first = start_local_env(tmp_path / "a")
    server = psutil.Process(first.pid).parent()
    assert server is not None
    server.kill()
    # Its orphan notices within its half-second watch and stops; the handle says so.
    assert _gone_within(first.pid, 10), "a simulation outlived its killed fork server by 10 s"
    deadline = time.monotonic() + 10
    while first.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not first.alive()
    second = start_local_env(tmp_path / "b")
    try:
        assert requests.get(second.base_url + "/probe", timeout=10).status_code == 200
        assert psutil.Process(second.pid).parent().pid != server.pid
    finally:
        second.stop()


def test_nothing_outlives_an_asking_process_killed_with_sigkill(tmp_path: Path) -> None:
    asker = ("import sys, time\n"
             "from pathlib import Path\n"
             "from adapters.waa.localenv.launcher import start_local_env\n"
             "handle = start_local_env(Path(sys.argv[1]))\n"
             "print(handle.pid, flush=True)\n"
             "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", asker, str(tmp_path / "root")], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        sim_pid = int(proc.stdout.readline())
        server_pid = psutil.Process(sim_pid).ppid()
        proc.kill()
        proc.wait(10)
        assert _gone_within(server_pid, 10), "the fork server outlived the process it served by 10 s"
        assert _gone_within(sim_pid, 10), "a simulation outlived the process that asked for it by 10 s"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_exec_starts_each_simulation_as_a_new_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(START_ENV, "exec")
    handle = start_local_env(tmp_path / "root")
    try:
        assert isinstance(handle._proc, subprocess.Popen)  # noqa: SLF001
        assert psutil.Process(handle.pid).ppid() == os.getpid()
        assert requests.get(handle.base_url + "/probe", timeout=10).status_code == 200
    finally:
        handle.stop()
    assert handle._proc.returncode == 0  # noqa: SLF001


def test_closing_reaps_the_fork_server_so_its_cpu_counts_as_this_processs_children(tmp_path: Path) -> None:
    server = forkserver.ForkServer()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    port_file = tmp_path / "port"
    sim = server.spawn(["--root", str(tmp_path / "root"), "--port-file", str(port_file)], env=dict(os.environ),
                       cwd=ROOT, log_path=tmp_path / "sim.log")
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert sim.poll() is None and time.monotonic() < deadline, (tmp_path / "sim.log").read_text()
        time.sleep(0.05)
    process = server._process  # noqa: SLF001 - the fork server's own process
    assert process is not None
    sim.terminate()
    assert sim.wait(10) == 0
    server.close()
    assert process.returncode == 0 and not psutil.pid_exists(process.pid)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Its imports alone are about 0.15 s of CPU: reaped by a process that never waited for it,
    # none of it would count here.
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) > 0.05
