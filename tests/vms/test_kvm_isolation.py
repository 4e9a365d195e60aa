"""The kvm guests' isolation, tried from inside a guest: the Debian guest's own kernel and network
stack connect to what a hostile guest would try (services on the host's 127.0.0.1, the host's
other addresses, the world beyond the host, DNS, ICMP), through the very QEMU command line the
provider builds (KVMProvider.machine_spec), and every attempt must fail, while a service the
operator allowed (guest_allow) answers at its guest address.

How the probe runs in the guest: the boot script on the code disk (kvm_image.BOOT_SCRIPT) runs
probe.py from a third, read-only disk when the kernel command line says ``waa.probe=vdc``, and
prints its results on the serial console (``-serial file:``), which the test reads. Two guests
cold-boot at once (10-30 s under TCG here; a probe needs its own kernel command line, so the
pool's ready state cannot serve): one with the default settings, one with an allowed entry.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from adapters.vms import kvm_image
from adapters.vms.kvm import KVMProvider, KVMSettings
from adapters.vms.kvm_qemu import Disk, VMPaths, create_overlay, start_qemu

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vms has no __init__.py

from kvm_guest import qemu_under, skip_reason  # noqa: E402

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

PROBE_SECONDS = 300.0  # a cold boot under TCG on a loaded 2-core host, and the probe itself
ENDED = "waa-probe: end"

# Runs inside the guest (Debian's python3, no product code): every attempt at once, each bounded,
# one JSON line per target on the console.
PROBE = r'''
import json, os, socket, struct, threading, time

spec = json.load(open("/run/probe/targets.json"))
results = {}


def tcp(target):
    family = socket.AF_INET6 if ":" in target["host"] else socket.AF_INET
    deadline = time.monotonic() + 8
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(4)
        try:
            sock.connect((target["host"], target["port"]))
        except ConnectionRefusedError:
            return "refused", ""
        except socket.timeout:
            return "timeout", ""
        except OSError as exc:
            # An IPv6 address may still be on its way (router advertisement, duplicate check).
            if time.monotonic() < deadline and family == socket.AF_INET6:
                time.sleep(0.5)
                continue
            return "error", os.strerror(exc.errno or 0)
        try:
            greeting = sock.recv(200).decode(errors="replace").strip()
            sock.sendall(("hello from " + spec["label"] + "\n").encode())
            time.sleep(0.3)
        except OSError as exc:
            greeting = "(" + str(exc) + ")"
        sock.close()
        return "connected", greeting


def dns(target):
    query = struct.pack(">HHHHHH", 0x5741, 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(p)]) + p.encode() for p in "deb.debian.org".split(".")) + b"\0"
    query += struct.pack(">HH", 1, 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(4)
    try:
        sock.sendto(query, (target["host"], target["port"]))
        data, _ = sock.recvfrom(512)
        return "answered", str(len(data)) + " bytes"
    except socket.timeout:
        return "timeout", ""
    except OSError as exc:
        return "error", os.strerror(exc.errno or 0)


def checksum(data):
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def icmp(target):
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.settimeout(1)
    header = struct.pack("!BBHHH", 8, 0, 0, 0x5741, 1) + b"waa-probe"
    packet = header[:2] + struct.pack("!H", checksum(header)) + header[4:]
    try:
        sock.sendto(packet, (target["host"], 0))
    except OSError as exc:
        return "error", os.strerror(exc.errno or 0)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        try:
            data, peer = sock.recvfrom(1024)
        except socket.timeout:
            continue
        if peer[0] == target["host"] and data[20] == 0:
            return "reply", ""
    return "timeout", ""


def attempt(target):
    try:
        results[target["name"]] = {"tcp": tcp, "dns": dns, "icmp": icmp}[target["kind"]](target)
    except Exception as exc:
        results[target["name"]] = ("error", repr(exc))


# The network is up once the gateway answers at all (a reset counts: the guest reached QEMU).
for _ in range(100):
    if tcp({"host": "10.0.2.2", "port": 9})[0] in ("refused", "connected"):
        break
    time.sleep(0.2)
threads = [threading.Thread(target=attempt, args=(t,)) for t in spec["targets"]]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for name, (result, detail) in sorted(results.items()):
    print("waa-probe: " + json.dumps({"name": name, "result": result, "detail": detail}), flush=True)
'''


class Listener:
    """A TCP service on the host that records who connected and what they said."""

    def __init__(self, address: str) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(16)
        self.address, self.port = address, self.sock.getsockname()[1]
        self.greeting = f"host service {secrets.token_hex(6)}"
        self.heard: list[str] = []
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.settimeout(10)
                try:
                    conn.sendall((self.greeting + "\n").encode())
                    self.heard.append(conn.recv(200).decode(errors="replace").strip())
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def host_address() -> str:
    """One of this host's addresses other than loopback (what the guest could reach by NAT)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return str(address.address)
    pytest.skip("this host has no IPv4 address besides loopback")


def outside_address() -> tuple[str, int] | None:
    """An address beyond the host that the host itself reaches (Debian's mirror), or None."""
    try:
        with socket.create_connection(("deb.debian.org", 80), timeout=5) as sock:
            return str(sock.getpeername()[0]), 80
    except OSError:
        return None


def loopback6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


def probe_disk(directory: Path, targets: dict) -> Path:
    root = directory / "probe-root"
    root.mkdir()
    (root / "probe.py").write_text(PROBE)
    (root / "targets.json").write_text(json.dumps(targets))
    image = directory / "probe.img"
    subprocess.run(["mke2fs", "-q", "-t", "ext4", "-d", str(root), str(image), "4M"], check=True)
    return image


def read(path: Path) -> str:
    """The file's text so far ("" until QEMU has made it)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def run_probe(settings: KVMSettings, directory: Path, targets: dict) -> dict[str, tuple[str, str]]:
    """Cold-boot the provider's own machine with the probe disk; the probe's results by name."""
    directory.mkdir(parents=True)
    spec = KVMProvider(settings, "isolation-probe").machine_spec()
    spec = dataclasses.replace(spec, append=f"{spec.append} waa.probe=vdc",
                               disks=spec.disks + (Disk(probe_disk(directory, targets), "raw", readonly=True),))
    paths = VMPaths.in_dir(directory, "probe", spec)
    create_overlay(kvm_image.base_image().golden, "qcow2", paths.overlay)
    process = start_qemu(spec, paths, name=targets["label"], system_disk=paths.overlay)
    try:
        deadline = time.monotonic() + PROBE_SECONDS
        while ENDED not in (console := read(paths.serial_log)):
            assert process.alive(), process.exit_description()
            assert time.monotonic() < deadline, f"the probe did not end within {PROBE_SECONDS:g} s: {console[-2000:]}"
            time.sleep(0.5)
    finally:
        process.stop()
    results = {}
    for line in console.splitlines():
        if line.startswith("waa-probe: {"):
            found = json.loads(line.removeprefix("waa-probe: "))
            results[found["name"]] = (found["result"], found["detail"])
    print(f"{targets['label']}: {json.dumps(results)}")
    return results


@pytest.fixture(scope="module")
def probed() -> Iterator[dict]:
    """Both guests' results, and the host's listeners; the two guests boot at once."""
    base = Path(tempfile.mkdtemp(prefix="wki-", dir="/tmp"))
    listeners = {"loopback": Listener("127.0.0.1"), "other": Listener(host_address()), "allowed": Listener("127.0.0.1")}
    if loopback6():
        listeners["loopback6"] = Listener("::1")
    outside = outside_address()
    targets = [
        {"name": "host loopback", "kind": "tcp", "host": "10.0.2.2", "port": listeners["loopback"].port},
        {"name": "host loopback, allowed port", "kind": "tcp", "host": "10.0.2.2", "port": listeners["allowed"].port},
        {"name": "host address", "kind": "tcp", "host": listeners["other"].address, "port": listeners["other"].port},
        {"name": "dns", "kind": "dns", "host": "10.0.2.3", "port": 53},
        {"name": "allowed entry", "kind": "tcp", "host": "10.0.2.100", "port": listeners["allowed"].port},
    ]
    if "loopback6" in listeners:  # libslirp's IPv6 gateway fec0::2 is the host's ::1
        targets.append({"name": "host loopback ipv6", "kind": "tcp", "host": "fec0::2",
                        "port": listeners["loopback6"].port})
    if outside is not None:
        targets += [{"name": "outside", "kind": "tcp", "host": outside[0], "port": outside[1]},
                    {"name": "outside icmp", "kind": "icmp", "host": outside[0], "port": 0}]
    common = dict(allow_tcg=True, runtime_dir=base / "run", ready_timeout_seconds=PROBE_SECONDS)
    guests = {
        "default": KVMSettings(**common),
        "allowing": KVMSettings(**common, guest_allow=[f"127.0.0.1:{listeners['allowed'].port}"]),
    }
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def probe(label: str) -> None:
        try:
            results[label] = run_probe(guests[label], base / label, {"label": label, "targets": targets})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=probe, args=(label,)) for label in guests]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        yield {"results": results, "listeners": listeners, "outside": outside,
               "names": [t["name"] for t in targets]}
    finally:
        for listener in listeners.values():
            listener.close()
        assert qemu_under(base) == []
        shutil.rmtree(base, ignore_errors=True)


REACHED = ("connected", "answered", "reply")


def test_a_default_guest_reaches_nothing_on_the_host_or_beyond(probed: dict) -> None:
    results = probed["results"]["default"]
    assert set(results) == set(probed["names"])  # every attempt was made and reported
    reached = {name: result for name, result in results.items() if result[0] in REACHED}
    assert reached == {}
    # TCP attempts are answered with a reset by QEMU itself: refused at once, not left to time out.
    assert results["host loopback"][0] == "refused" and results["host address"][0] == "refused"
    # Another guest's allowance is not this one's (no host answers at 10.0.2.100 here).
    assert results["allowed entry"][0] in ("refused", "error")


def test_an_allowed_entry_answers_at_its_guest_address_and_nothing_else_opens(probed: dict) -> None:
    results = probed["results"]["allowing"]
    listener = probed["listeners"]["allowed"]
    assert results["allowed entry"] == ("connected", listener.greeting)  # the host service's own words
    assert "hello from allowing" in listener.heard  # and what the guest said reached the service
    reached = {name: result for name, result in results.items() if result[0] in REACHED}
    assert set(reached) == {"allowed entry"}
    # The same service through the gateway address stays closed: only the entry's guest address opens.
    assert results["host loopback, allowed port"][0] == "refused"


def test_no_host_service_heard_from_a_guest(probed: dict) -> None:
    listeners = probed["listeners"]
    assert {name: listener.accepted for name, listener in listeners.items() if name != "allowed"} == {
        name: 0 for name in listeners if name != "allowed"}
    assert listeners["allowed"].accepted == 1  # the allowing guest's one connection, relayed
    if probed["outside"] is None:
        print("the host reaches nothing outside here: the outside attempts were not made")
