"""SSH tunnels (adapters/vms/tunnel.py) against a REAL OpenSSH server on 127.0.0.1.

Every test runs the system `ssh` client against a throwaway `sshd` (tests/vms/sshd_server.py)
and reaches a real HTTP server (the local WAA simulation) through the forwards. Nothing is
mocked: killed processes, restarted servers and changed host keys are real. Skips cleanly when
OpenSSH's server or client is not installed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine_pace import scaled
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd_server import SSHServer, keygen, sshd_missing_reason  # noqa: E402

from adapters.vms.base import ProviderError  # noqa: E402
from adapters.vms.tunnel import (  # noqa: E402
    HostKeyMismatchError,
    SSHAuthenticationError,
    SSHTarget,
    SSHTunnel,
    SSHUnavailableError,
    TunnelError,
    TunnelManager,
    find_ssh,
    forget_host_key,
    free_local_port,
    ssh_version,
)

pytestmark = pytest.mark.timeout(60)


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def _sshd_available() -> None:
    reason = sshd_missing_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def sshd(_sshd_available, tmp_path_factory) -> Iterator[SSHServer]:
    """One sshd for the tests that do not disturb it."""
    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_sshd(_sshd_available, tmp_path) -> Iterator[SSHServer]:
    """An sshd the test may stop, restart and re-key."""
    server = SSHServer(tmp_path / "own-sshd")
    server.start()
    yield server
    server.stop()


def target_for(server: SSHServer, known_hosts: Path, **overrides) -> SSHTarget:
    values = dict(host="127.0.0.1", port=server.port, user=server.user, identity_file=server.client_key,
                  known_hosts_file=known_hosts, connect_timeout=5, host_key_alias="vm-test",
                  config_file=Path("/dev/null"))  # not the developer's ~/.ssh/config
    values.update(overrides)
    return SSHTarget(**values)


def sim_port(sim) -> int:
    return int(sim.base_url.rsplit(":", 1)[1])


def forwards_for(sim) -> dict[str, int]:
    # The simulation plays WAA; QMP and DevTools point at it too (only reachability matters here).
    port = sim_port(sim)
    return {"waa": port, "qmp": port, "devtools": port}


def probe(url: str) -> dict:
    response = requests.get(url + "/probe", timeout=5)
    response.raise_for_status()
    return response.json()


def ssh_pids(marker: str | Path = "") -> set[int]:
    """Running `ssh` client processes (from /proc) whose command line contains `marker` (a test's
    own tmp path: other tests may run ssh at the same time under pytest-xdist)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode(errors="replace")) == "ssh" \
                and str(marker).encode() in b" ".join(argv):
            pids.add(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def wait_for(predicate, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + scaled(timeout)  # written for a quiet machine (tests/machine_pace.py)
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# -- the tunnel ---------------------------------------------------------------------------------


def test_forwards_reach_the_vm_http_server_and_pin_its_key(sshd, sim, tmp_path):
    known_hosts = tmp_path / "my state" / "known_hosts"  # the folder does not exist yet; a blank in the path
    started = time.monotonic()
    with SSHTunnel(target_for(sshd, known_hosts), forwards_for(sim), label="vm-0") as tunnel:
        opened = time.monotonic() - started
        ports = tunnel.local_ports
        assert set(ports) == {"waa", "qmp", "devtools"} and len(set(ports.values())) == 3
        assert sim_port(sim) not in ports.values()  # really a forward, not the server itself
        assert tunnel.url("waa") == f"http://127.0.0.1:{ports['waa']}"
        assert tunnel.address("qmp") == ("127.0.0.1", ports["qmp"])
        assert probe(tunnel.url("waa"))["status"] == "Probe successful"
        assert probe(tunnel.url("devtools"))  # every forward carries traffic
        assert tunnel.healthy() and ssh_pids(tmp_path) == {tunnel.pid}
        with pytest.raises(KeyError, match="no forward 'vnc'"):
            tunnel.url("vnc")
    assert opened < 5
    # Pinned on first use, under the VM's alias (not a recyclable IP), with the server's real key.
    (line,) = known_hosts.read_text().splitlines()
    assert line.split()[0] == "vm-test"
    assert line.split()[1:3] == sshd.host_key_line().split()[:2]
    assert oct(known_hosts.stat().st_mode & 0o777) == "0o600"
    assert "-----BEGIN" not in known_hosts.read_text()


def test_local_ports_are_distinct_and_never_those_of_another_tunnel(sshd, tmp_path):
    target = target_for(sshd, tmp_path / "kh")
    tunnels = [SSHTunnel(target, {"waa": 5000, "qmp": 7200, "devtools": 9222}) for _ in range(20)]
    ports = [port for t in tunnels for port in t.local_ports.values()]
    assert len(ports) == len(set(ports)) == 60
    with pytest.raises(ValueError, match="share a local port"):
        SSHTunnel(target, {"waa": 5000, "qmp": 7200}, local_ports={"waa": 15001, "qmp": 15001})
    for tunnel in tunnels:
        tunnel.close()


def test_command_line_is_batch_pinned_and_loopback_only(sshd, tmp_path):
    tunnel = SSHTunnel(target_for(sshd, tmp_path / "kh"), {"waa": 5000, "qmp": 7200}, local_ports={"waa": 15000})
    cmd = tunnel.command()
    options = {cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-o"}
    for option in ("BatchMode=yes", "ExitOnForwardFailure=yes", "StrictHostKeyChecking=accept-new",
                   f"UserKnownHostsFile={tmp_path / 'kh'}", "HostKeyAlias=vm-test", "IdentitiesOnly=yes",
                   "ControlPath=none", "ServerAliveInterval=10", "ServerAliveCountMax=3"):
        assert option in options
    forwards = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-L"]
    assert forwards[0] == "127.0.0.1:15000:127.0.0.1:5000"  # a given local port is kept
    assert forwards[1].startswith("127.0.0.1:") and forwards[1].endswith(":127.0.0.1:7200")
    assert cmd[-2:] == ["--", "127.0.0.1"] and "-N" in cmd
    with pytest.raises(ValueError):
        SSHTarget(host="-oProxyCommand=x", user="u")


def test_ensure_reestablishes_a_killed_ssh_on_the_same_port(sshd, sim, tmp_path):
    with SSHTunnel(target_for(sshd, tmp_path / "kh"), forwards_for(sim), label="vm-1") as tunnel:
        url, first_pid = tunnel.url("waa"), tunnel.pid
        assert tunnel.ensure() is False  # healthy: nothing to do
        os.kill(first_pid, signal.SIGKILL)
        assert wait_for(lambda: not tunnel.healthy(), 5)
        with pytest.raises(requests.ConnectionError):
            requests.get(url + "/probe", timeout=2)
        assert tunnel.ensure() is True
        assert tunnel.url("waa") == url and tunnel.pid not in (None, first_pid) and tunnel.restarts == 1
        assert probe(url)["status"] == "Probe successful"
    assert not alive(first_pid)


def test_monitor_reestablishes_a_killed_tunnel_and_the_same_url_works(sshd, sim, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="adapters.vms.tunnel")
    with TunnelManager(monitor_interval=0.1) as manager:
        tunnel = manager.open("vm-2", target_for(sshd, tmp_path / "kh"), forwards_for(sim))
        url, first_pid = tunnel.url("waa"), tunnel.pid
        assert probe(url)
        os.kill(first_pid, signal.SIGKILL)
        assert wait_for(lambda: manager.reestablished == ["vm-2"], 10)
        assert manager.get("vm-2") is tunnel and tunnel.pid != first_pid
        assert probe(url)["status"] == "Probe successful"
        assert any("re-established" in r.getMessage() and "vm-2" in r.getMessage() for r in caplog.records)


def test_tunnel_comes_back_after_sshd_restarts(own_sshd, sim, tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="adapters.vms.tunnel")
    with TunnelManager(monitor_interval=0.1, open_timeout=2) as manager:
        tunnel = manager.open("vm-3", target_for(own_sshd, tmp_path / "kh", connect_timeout=1), forwards_for(sim))
        url, first_pid = tunnel.url("waa"), tunnel.pid
        assert probe(url)
        own_sshd.stop()
        assert wait_for(lambda: not alive(first_pid), 10)  # the VM's sshd went: ssh noticed and exited
        # While the server is down the monitor fails and says so, naming the VM and host.
        assert wait_for(lambda: any("could not be re-established" in r.getMessage() for r in caplog.records), 10)
        message = next(r.getMessage() for r in caplog.records if "could not be re-established" in r.getMessage())
        assert "vm-3" in message and f"127.0.0.1:{own_sshd.port}" in message and "Connection refused" in message
        own_sshd.start()
        assert wait_for(lambda: tunnel.healthy(), 15)
        assert tunnel.url("waa") == url and probe(url)["status"] == "Probe successful"
        assert "vm-3" in manager.reestablished


def test_wrong_key_is_a_clear_error_naming_the_host(sshd, sim, tmp_path):
    stranger = keygen(tmp_path / "stranger", "not-authorized")
    tunnel = SSHTunnel(target_for(sshd, tmp_path / "kh", identity_file=stranger), forwards_for(sim), label="vm-4")
    with pytest.raises(SSHAuthenticationError) as info:
        tunnel.open()
    text = str(info.value)
    assert f"127.0.0.1:{sshd.port}" in text and "vm-4" in text
    assert "authentication failed" in text and "Permission denied" in text and str(stranger) in text
    assert isinstance(info.value, ProviderError)  # the pipeline records an infrastructure error
    assert "PRIVATE KEY" not in text and stranger.read_text().splitlines()[1] not in text
    assert tunnel.pid is None and ssh_pids(tmp_path) == set()
    tunnel.close()


def test_unreachable_sshd_names_the_host(sim, tmp_path, _sshd_available):
    port = free_local_port()  # nothing listens there
    target = SSHTarget(host="127.0.0.1", port=port, user="nobody", known_hosts_file=tmp_path / "kh",
                       connect_timeout=60, config_file=Path("/dev/null"))
    started = time.monotonic()
    with pytest.raises(TunnelError, match=f"127.0.0.1:{port}.*Connection refused"):
        SSHTunnel(target, forwards_for(sim), label="vm-5").open()
    assert time.monotonic() - started < 30  # refused at once, not retried until the 60 s deadline


def test_changed_host_key_is_refused_until_forgotten(own_sshd, sim, tmp_path):
    known_hosts = tmp_path / "kh"
    target = target_for(own_sshd, known_hosts)
    with SSHTunnel(target, forwards_for(sim)) as tunnel:
        assert probe(tunnel.url("waa"))
    pinned = known_hosts.read_text()
    assert own_sshd.host_key_line().split()[1] in pinned

    own_sshd.stop()
    own_sshd.new_host_key()  # a rebuilt VM, or someone in the middle
    own_sshd.start()
    tunnel = SSHTunnel(target, forwards_for(sim), label="vm-6")
    with pytest.raises(HostKeyMismatchError) as info:
        tunnel.open()
    text = str(info.value)
    assert "REFUSED" in text and f"127.0.0.1:{own_sshd.port}" in text and "vm-6" in text
    assert str(known_hosts) in text and "ssh-keygen -R 'vm-test'" in text
    assert tunnel.pid is None
    assert known_hosts.read_text() == pinned  # the old pin is kept, not overwritten

    # Only when told (the provider replaced the VM's disk itself) is the key forgotten and re-pinned.
    assert forget_host_key(target) == 1
    tunnel = SSHTunnel(target, forwards_for(sim))
    with tunnel:
        assert probe(tunnel.url("waa"))
    assert own_sshd.host_key_line().split()[1] in known_hosts.read_text()
    assert forget_host_key(target_for(own_sshd, known_hosts, host_key_alias="other-vm")) == 0


def test_retargeting_a_vm_keeps_its_local_ports(sshd, own_sshd, sim, tmp_path):
    with TunnelManager(monitor_interval=5) as manager:
        first = manager.open("vm-7", target_for(sshd, tmp_path / "kh", host_key_alias="a"), forwards_for(sim))
        ports, first_pid = first.local_ports, first.pid
        assert manager.open("vm-7", first.target, forwards_for(sim)) is first  # same target: reused
        # The VM came back on another address (stop/start without an Elastic IP).
        second = manager.open("vm-7", target_for(own_sshd, tmp_path / "kh", host_key_alias="b"), forwards_for(sim))
        assert second is not first and first.closed and not alive(first_pid)
        assert second.local_ports == ports and probe(second.url("waa"))
        assert manager.keys() == ["vm-7"]


def test_closing_leaves_no_ssh_process(sshd, sim, tmp_path):
    manager = TunnelManager(monitor_interval=0.1)
    tunnels = [manager.open(f"vm-{i}", target_for(sshd, tmp_path / "kh", host_key_alias=f"vm-{i}"),
                            forwards_for(sim)) for i in range(3)]
    pids = {t.pid for t in tunnels}
    assert len(pids) == 3 and pids == ssh_pids(tmp_path)
    manager.close("vm-0", forget=True)
    assert "vm-0" not in (tmp_path / "kh").read_text() and "vm-1" in (tmp_path / "kh").read_text()
    manager.close("vm-0")  # no error when there is none
    manager.close_all()
    manager.close_all()  # safe to repeat
    assert all(not alive(pid) for pid in pids)
    assert ssh_pids(tmp_path) == set()
    assert manager._monitor is not None and not manager._monitor.is_alive()
    for tunnel in tunnels:
        assert tunnel.closed and not tunnel.healthy() and tunnel.ensure() is False
        with pytest.raises(TunnelError, match="closed"):
            tunnel.open()
    with pytest.raises(requests.ConnectionError):
        requests.get(tunnels[1].url("waa") + "/probe", timeout=2)


def test_a_taken_local_port_is_rechosen_before_first_use_and_refused_after(sshd, sim, tmp_path):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    try:
        # Before any URL was handed out another port is simply chosen ...
        with SSHTunnel(target_for(sshd, tmp_path / "kh"), {"waa": sim_port(sim)}, local_ports={"waa": taken}) as t:
            assert t.local_ports["waa"] != taken and probe(t.url("waa"))
            port, pid = t.local_ports["waa"], t.pid
            os.kill(pid, signal.SIGKILL)
            # Really gone (its listener closes a moment before it exits; then the thief would
            # pass for it, which is why open() checks that its ports are free beforehand).
            assert wait_for(lambda: not alive(pid), 5) and not t.healthy()
            # ... afterwards the URL must stay: a squatter on it is an error, never a silent new port.
            thief = socket.socket()
            thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the probe left TIME_WAITs
            thief.bind(("127.0.0.1", port))
            thief.listen()
            try:
                with pytest.raises(TunnelError, match=f"taken by another process.*{port}|{port}.*taken by another"):
                    t.ensure()
                assert t.local_ports["waa"] == port
            finally:
                thief.close()
            assert t.ensure() is True and probe(t.url("waa"))
    finally:
        squatter.close()


def test_close_interrupts_an_open_waiting_for_a_silent_host(sim, tmp_path, _sshd_available):
    silent = socket.socket()  # accepts TCP, never says a word of SSH: a VM still booting, or a black hole
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    target = SSHTarget(host="127.0.0.1", port=silent.getsockname()[1], user="nobody",
                       known_hosts_file=tmp_path / "kh", connect_timeout=20, config_file=Path("/dev/null"))
    tunnel = SSHTunnel(target, forwards_for(sim), label="vm-8")
    errors: list[Exception] = []

    def opener() -> None:
        try:
            tunnel.open()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    thread = threading.Thread(target=opener)
    thread.start()
    try:
        assert wait_for(lambda: ssh_pids(tmp_path) != set(), 5)
        started = time.monotonic()
        tunnel.close()
        thread.join(15)
        assert not thread.is_alive() and time.monotonic() - started < 15  # not the 20 s connect timeout
        assert len(errors) == 1 and isinstance(errors[0], TunnelError) and "closed" in str(errors[0])
        assert ssh_pids(tmp_path) == set()
    finally:
        silent.close()


def test_missing_ssh_client_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no ssh anywhere
    with pytest.raises(SSHUnavailableError, match="openssh-client"):
        find_ssh()
    with pytest.raises(SSHUnavailableError):
        SSHTunnel(SSHTarget(host="203.0.113.9", user="ubuntu"), {"waa": 5000})
    monkeypatch.undo()
    if find_ssh():
        assert ssh_version().startswith("OpenSSH")
