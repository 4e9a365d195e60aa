"""The kvm guests' network policy without QEMU: the operator's allow-list (``guest_allow``), the
guest addresses its entries get, the ``-netdev`` options, and the relay QEMU runs per allowed
connection (a real process on a real socket pair, talking to a real listener).
tests/vms/test_kvm_isolation.py tries the same from inside a real guest."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from adapters.vms import kvm_net
from adapters.vms.kvm import KVMSettings
from adapters.vms.kvm_net import AllowEntry, GuestForward, guest_forwards, parse_allow, parse_entry
from adapters.vms.kvm_qemu import Disk, MachineSpec, VMPaths, build_command
from adapters.vms.settings import load_cloud_settings

# -- the allow-list ---------------------------------------------------------------------------


def test_entries_that_name_one_service_are_taken() -> None:
    assert parse_entry("files.internal:8080") == AllowEntry("files.internal", 8080)
    assert parse_entry(" Mirror.Example.ORG.:443 ") == AllowEntry("mirror.example.org", 443)
    assert parse_entry("10.20.0.5:5432") == AllowEntry("10.20.0.5", 5432)
    assert parse_entry("127.0.0.1:4200") == AllowEntry("127.0.0.1", 4200)  # the operator's own choice
    assert parse_entry("[::1]:80") == AllowEntry("::1", 80) and str(parse_entry("[::1]:80")) == "[::1]:80"
    assert parse_allow("a.internal:1, b.internal:2,,") == (AllowEntry("a.internal", 1), AllowEntry("b.internal", 2))
    assert parse_allow(None) == () and parse_allow([]) == ()


@pytest.mark.parametrize(("entry", "says"), [
    ("files.internal", "is not HOST:PORT"),
    ("files.internal:0", "no port 1-65535"),
    ("files.internal:70000", "no port 1-65535"),
    ("files.internal:80-90", "no port 1-65535"),
    ("files.internal:http", "no port 1-65535"),
    (":8080", "no valid host name"),
    ("*:80", "no valid host name"),
    ("http://files.internal:80", "no URLs, paths or networks"),
    ("10.0.0.0/8:80", "no URLs, paths or networks"),
    ("files.internal:80/mirror", "no URLs, paths or networks"),
    ("files internal:80", "no valid host name"),
    ("-files.internal:80", "no valid host name"),
    ("999.1.1.1:80", "not a valid IPv4 address"),
    ("0.0.0.0:80", "names no single host"),
    ("224.0.0.1:80", "names no single host"),
    ("255.255.255.255:80", "names no single host"),
    ("::1:80", "write an IPv6 address in brackets"),
    ("[files.internal]:80", "not an IPv6 address"),
    ("[::1]80", "is not HOST:PORT"),
])
def test_nonsense_entries_are_refused_in_one_line_naming_the_setting(entry: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_allow([entry])
    message = str(refused.value)
    assert "\n" not in message and says in message
    assert message.startswith("[kvm] guest_allow (ARENA_KVM__GUEST_ALLOW): ") and repr(entry.strip()) in message


def test_repeats_and_too_many_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="'A.internal:1' is listed twice"):
        parse_allow("a.internal:1,A.internal:1")
    with pytest.raises(ValueError, match="33 entries; at most 32"):
        parse_allow([f"h{i}.internal:80" for i in range(33)])


def test_allow_list_from_the_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "arena.toml"
    config.write_text('[kvm]\nguest_allow = ["files.internal:8080"]\n')
    monkeypatch.delenv("ARENA_KVM__GUEST_ALLOW", raising=False)
    section = load_cloud_settings(config).kvm
    assert section is not None and section.guest_allow == ["files.internal:8080"]
    # The environment's form is ARENA_FETCH_ALLOW's: comma-separated, and it wins over the file.
    monkeypatch.setenv("ARENA_KVM__GUEST_ALLOW", "mirror.internal:80, 10.20.0.5:443")
    section = load_cloud_settings(config).kvm
    assert section is not None and section.guest_allow == ["mirror.internal:80", "10.20.0.5:443"]
    assert [f.describe() for f in section.guest_forwards()] == [
        "10.0.2.100:80 -> mirror.internal:80", "10.0.2.101:443 -> 10.20.0.5:443"]
    monkeypatch.setenv("ARENA_KVM__GUEST_ALLOW", "mirror.internal:80,10.0.0.0/8")
    with pytest.raises(ValueError) as refused:
        load_cloud_settings(config)
    message = str(refused.value)
    assert "\n" not in message and "kvm.guest_allow" in message
    assert "'10.0.0.0/8' is not HOST:PORT" in message and "no URLs, paths or networks" in message


# -- guest addresses and QEMU's options ----------------------------------------------------------


def entries(*ports: int) -> tuple[AllowEntry, ...]:
    return tuple(AllowEntry(f"h{port}.internal", port) for port in ports)


def test_each_entry_gets_its_own_guest_address_on_the_guest_network() -> None:
    default = guest_forwards(entries(443, 443, 80))
    assert [f.describe() for f in default] == [
        "10.0.2.100:443 -> h443.internal:443", "10.0.2.101:443 -> h443.internal:443",
        "10.0.2.102:80 -> h80.internal:80"]
    dockur = KVMSettings(preset="waa-windows11", disk_image=Path("/nonexistent/data.img"),
                         guest_allow=["files.internal:445"])  # dockur's 20.20.20.0/24, DHCP from .21
    assert [f.describe() for f in dockur.guest_forwards()] == ["20.20.20.100:445 -> files.internal:445"]
    # The DHCP range (16 addresses from dhcpstart), the gateway and the DNS address are skipped.
    moved = guest_forwards(entries(1, 2), "net=10.9.0.0/24,dhcpstart=10.9.0.100")
    assert [f.guest_ip for f in moved] == ["10.9.0.116", "10.9.0.117"]
    with pytest.raises(ValueError, match=r"the guest network 10\.9\.0\.0/28 has no room for h1\.internal:1"):
        guest_forwards(entries(1), "net=10.9.0.0/28")


def test_user_net_cannot_open_the_network_behind_the_allow_list() -> None:
    for option in ("restrict=off", "hostfwd=tcp::2222-:22", "guestfwd=tcp:10.0.2.100:80-cmd:nc x 80",
                   "smb=/home", "tftp=/etc"):
        with pytest.raises(ValueError) as refused:
            KVMSettings(user_net=f"net=10.0.2.0/24,{option}")
        message = str(refused.value)
        assert "[kvm] user_net may not set " + option.split("=")[0] in message and "guest_allow" in message
    assert KVMSettings(user_net="net=10.0.2.0/24,dns=10.0.2.3").user_net  # addresses are fine


def spec(**overrides) -> MachineSpec:
    values = dict(binary="qemu-system-x86_64", accel="tcg", machine="pc-i440fx-7.2", cpu="max", memory_mib=512,
                  vcpus=1, disks=(Disk(None),), guest_ports=(5000,))
    values.update(overrides)
    return MachineSpec(**values)


def netdev(cmd: list[str]) -> str:
    return cmd[cmd.index("-netdev") + 1]


def test_the_guest_network_is_restricted_by_default(tmp_path: Path) -> None:
    plain = spec()
    cmd = build_command(plain, VMPaths.in_dir(tmp_path, "vm", plain), system_disk=tmp_path / "vm.qcow2")
    options = netdev(cmd).split(",")
    assert "restrict=on" in options and not any(o.startswith("guestfwd") for o in options)
    assert "hostfwd=tcp:127.0.0.1:0-:5000" in options  # the controller still reaches the server
    assert VMPaths.in_dir(tmp_path, "vm", plain).relay_dir is None


def test_an_allowed_entry_is_a_guestfwd_to_the_relay(tmp_path: Path) -> None:
    forward = GuestForward("10.0.2.100", AllowEntry("files.internal", 8080))
    allowed = spec(guest_forwards=(forward,))
    paths = VMPaths.in_dir(tmp_path / "run,dir", "vm", allowed)  # a comma in a path is escaped for QEMU
    assert paths.relay_dir == tmp_path / "run,dir" / "vm.relay" and paths.relay_dir in paths.all()
    options = netdev(build_command(allowed, paths, system_disk=paths.overlay))
    assert options.startswith("user,id=net0,restrict=on,guestfwd=tcp:10.0.2.100:8080-cmd:")
    command = options.split("-cmd:", 1)[1].split(",hostfwd=")[0].replace(",,", ",")
    assert shlex.split(command) == [sys.executable, "-I", "-S", str(kvm_net.RELAY_SCRIPT), "--slots",
                                    str(paths.relay_dir), "--max", "16", "--", "files.internal", "8080"]
    assert "run,,dir" in options


def test_state_identity_names_the_network_policy() -> None:
    base = spec().state_identity()
    assert spec(restrict_net=False).state_identity() != base
    forward = GuestForward("10.0.2.100", AllowEntry("files.internal", 8080))
    assert spec(guest_forwards=(forward,)).state_identity() != base


# -- the relay, as QEMU runs it ----------------------------------------------------------------


class Echo:
    """A host service that answers every line with the line in capitals."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data.upper())


def relay(slots: Path, port: int, *, max_connections: int = 16) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """The relay as QEMU's guestfwd cmd: starts it: its stdin, stdout and stderr one end of a
    socket pair (the guest's connection); the other end returned as the guest."""
    guest, theirs = socket.socketpair()
    command = [sys.executable, "-I", "-S", str(kvm_net.RELAY_SCRIPT), "--slots", str(slots), "--max",
               str(max_connections), "--", "127.0.0.1", str(port)]
    process = subprocess.Popen(command, stdin=theirs, stdout=theirs, stderr=theirs, start_new_session=True)
    theirs.close()
    guest.settimeout(10)
    return process, guest


def test_the_relay_carries_a_connection_both_ways_and_ends_with_it(tmp_path: Path) -> None:
    echo = Echo()
    process, guest = relay(tmp_path / "slots", echo.port)
    try:
        guest.sendall(b"hello from the guest\n")
        assert guest.recv(100) == b"HELLO FROM THE GUEST\n"
        guest.shutdown(socket.SHUT_WR)  # the guest is done: the relay passes it on and ends
        assert guest.recv(100) == b"" and process.wait(10) == 0
    finally:
        process.kill()
        echo.sock.close()


def test_the_relay_caps_connections_per_vm_and_tells_the_guest_nothing(tmp_path: Path) -> None:
    echo = Echo()
    first, first_guest = relay(tmp_path / "slots", echo.port, max_connections=1)
    try:
        first_guest.sendall(b"x")
        assert first_guest.recv(10) == b"X"  # it holds the only slot
        second, second_guest = relay(tmp_path / "slots", echo.port, max_connections=1)
        assert second.wait(10) == 2 and second_guest.recv(100) == b""  # closed at once, no words
        closed = socket.create_server(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()  # nothing listens there now
        first_guest.close()
        assert first.wait(10) == 0
        third, third_guest = relay(tmp_path / "slots", port, max_connections=1)
        assert third.wait(15) == 1 and third_guest.recv(1000) == b""  # no traceback reaches the guest
    finally:
        first.kill()
        echo.sock.close()


def test_an_idle_relayed_connection_is_closed(tmp_path: Path) -> None:
    echo = Echo()
    guest, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-I", "-S", str(kvm_net.RELAY_SCRIPT), "--slots",
                                str(tmp_path / "slots"), "--idle", "0.5", "--", "127.0.0.1", str(echo.port)],
                               stdin=theirs, stdout=theirs, stderr=theirs)
    theirs.close()
    try:
        guest.settimeout(10)
        start = time.monotonic()
        assert guest.recv(10) == b"" and process.wait(10) == 0
        print(f"closed after {time.monotonic() - start:.2f} s idle")
    finally:
        process.kill()
        echo.sock.close()
