"""The kvm guests' network: cut off from the host and beyond, except what the operator allows.

The guests use QEMU's user-mode network (libslirp). Without ``restrict=on`` a guest reaches the
services bound to the host's 127.0.0.1 (the Prefect API, PostgreSQL: the gateway address
10.0.2.2 is the host's loopback), the host's other addresses and, through QEMU's NAT, anything
the host reaches (measured: /work/shared/notes/kvm.md). A guest that runs an agent's commands
(the Windows preset, any real desktop) must reach none of it. So every VM's network is
``restrict=on``: libslirp answers a guest's TCP connection attempt with a reset, drops its UDP
(DNS included) and its ICMP to anything but the gateway itself (libslirp 4.7: tcp_input.c,
udp.c, ip_icmp.c). The ``hostfwd`` forwards from 127.0.0.1 into the guest still work: that is
how the controller reaches the WAA server.

The operator opens it, one service at a time, with ``guest_allow`` (``[kvm]`` section, or
``ARENA_KVM__GUEST_ALLOW``, comma-separated like ``ARENA_FETCH_ALLOW``): ``HOST:PORT`` entries.
Entry number *i* (from 0) becomes a ``guestfwd``: the guest connects to the user network's
address ``.100 + i`` (10.0.2.100, 10.0.2.101, ... on the default 10.0.2.0/24) on the entry's
port, and each such connection is relayed to HOST:PORT from the host (kvm_relay.py, started by
QEMU per connection: guestfwd's ``cmd:`` form). Only TCP, only that address and port; the
gateway address still reaches nothing, and HOST is resolved by the host when the guest connects.

Why ``cmd:`` and not QEMU's ``guestfwd=...-tcp:HOST:PORT`` (a chardev): a chardev is one
connection, opened when QEMU starts (QEMU refuses to start when HOST is down) and shared by
every guest connection, so a second connection from the guest mixes into the first.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SETTING = "[kvm] guest_allow (ARENA_KVM__GUEST_ALLOW)"
RELAY_SCRIPT = Path(__file__).resolve().with_name("kvm_relay.py")
FIRST_FORWARD = 100  # entry i is reached at the guest network's address .100 + i
MAX_ENTRIES = 32
RELAY_MAX_CONNECTIONS = 16  # relayed connections open at once, per VM (each is a process)
DEFAULT_NET = "10.0.2.0/24"
# user_net may shape the guest's addresses, never what the guest reaches: that is guest_allow's
# (smb and tftp serve host directories to the guest, restricted or not).
_OPENING_OPTIONS = ("restrict", "hostfwd", "guestfwd", "smb", "tftp")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


@dataclass(frozen=True)
class AllowEntry:
    """One ``HOST:PORT`` the operator lets the guests connect to."""

    host: str  # a host name, an IPv4 address or an IPv6 address (without brackets)
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class GuestForward:
    """An allowed entry as the guest sees it: `guest_ip`:`port` relays to `entry`."""

    guest_ip: str
    entry: AllowEntry

    @property
    def guest_port(self) -> int:
        return self.entry.port

    def describe(self) -> str:
        """``10.0.2.100:8080 -> files.internal:8080`` (for the VM's details and the docs)."""
        return f"{self.guest_ip}:{self.guest_port} -> {self.entry}"


def _refuse(entry: str, why: str) -> ValueError:
    return ValueError(f"{SETTING}: {entry!r} {why}")


def parse_entry(text: str) -> AllowEntry:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address) as an entry; ValueError (one line,
    naming the setting) for anything else: no URLs, networks, wildcards or port ranges."""
    entry = text.strip()
    shape = "is not HOST:PORT (a host name or IP address and a port 1-65535, e.g. files.internal:8080)"
    if "/" in entry:
        raise _refuse(entry, shape + "; no URLs, paths or networks")
    if entry.startswith("["):
        host, sep, port_text = entry[1:].partition("]:")
        if not sep:
            raise _refuse(entry, shape)
    else:
        host, sep, port_text = entry.rpartition(":")
        if not sep or ":" in host:
            raise _refuse(entry, shape + ("; write an IPv6 address in brackets, [::1]:80" if ":" in host else ""))
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _refuse(entry, f"has no port 1-65535 after the last ':' ({port_text!r})")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        if address.is_unspecified or address.is_multicast or str(address) == "255.255.255.255":
            raise _refuse(entry, "names no single host (unspecified, multicast or broadcast address)")
        if address.version == 6 and not entry.startswith("["):
            raise _refuse(entry, shape)
        return AllowEntry(str(address), int(port_text))
    if entry.startswith("["):
        raise _refuse(entry, "has brackets around something that is not an IPv6 address")
    if not _HOST_NAME.fullmatch(host) or len(host) > 253:
        raise _refuse(entry, f"has no valid host name or IP address before the port ({host!r})")
    if all(label.isdigit() for label in host.rstrip(".").split(".")):
        raise _refuse(entry, f"is not a valid IPv4 address ({host!r})")
    return AllowEntry(host.lower().rstrip("."), int(port_text))


def parse_allow(value: Iterable[str] | str | None) -> tuple[AllowEntry, ...]:
    """The entries of `value` (a list, or one comma-separated string as in the environment);
    empty items are skipped, a repeated entry or more than MAX_ENTRIES is refused."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    entries: list[AllowEntry] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{SETTING}: {item!r} is not a string HOST:PORT")
        if not item.strip():
            continue
        entry = parse_entry(item)
        if entry in entries:
            raise _refuse(item.strip(), "is listed twice")
        entries.append(entry)
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"{SETTING}: {len(entries)} entries; at most {MAX_ENTRIES}")
    return tuple(entries)


def _user_net_options(user_net: str | None) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in (user_net or "").split(","):
        key, _, value = item.strip().partition("=")
        if key:
            options[key.strip()] = value.strip()
    return options


def check_user_net(user_net: str | None) -> None:
    """ValueError (one line) when the extra user-network options would open the guest's network,
    serve it host files or forward ports: those come from guest_allow and guest_port/devtools_port
    only."""
    found = sorted(set(_user_net_options(user_net)) & set(_OPENING_OPTIONS))
    if found:
        raise ValueError(f"[kvm] user_net may not set {', '.join(found)}: the guests' network is restricted, "
                         f"and what they may reach is {SETTING}")


def guest_forwards(entries: Iterable[AllowEntry], user_net: str | None = None) -> tuple[GuestForward, ...]:
    """Each entry at its guest address: the user network's .100, .101, ... (skipping the
    gateway, the DNS address and the DHCP range); ValueError when the network has no room."""
    options = _user_net_options(user_net)
    try:
        network = ipaddress.ip_network(options.get("net") or DEFAULT_NET, strict=False)
    except ValueError as exc:
        raise ValueError(f"[kvm] user_net: net={options.get('net')!r} is not an IPv4 network: {exc}") from None
    if network.version != 4:
        raise ValueError(f"[kvm] user_net: net={network} is not an IPv4 network")
    base = int(network.network_address)
    reserved = {base + 2, base + 3}  # libslirp's defaults for host= and dns=
    for key in ("host", "dns"):
        if options.get(key):
            reserved.add(int(ipaddress.ip_address(options[key])))
    dhcp = int(ipaddress.ip_address(options["dhcpstart"])) if options.get("dhcpstart") else base + 15
    reserved.update(range(dhcp, dhcp + 16))  # libslirp hands out 16 addresses from dhcpstart
    forwards = []
    candidate = base + FIRST_FORWARD
    for entry in entries:
        while candidate in reserved:
            candidate += 1
        address = ipaddress.ip_address(candidate)
        if address not in network or address == network.broadcast_address:
            raise ValueError(f"{SETTING}: the guest network {network} has no room for {entry} "
                             f"(entries get addresses from .{FIRST_FORWARD} on)")
        forwards.append(GuestForward(str(address), entry))
        candidate += 1
    return tuple(forwards)


def _qemu_value(text: str) -> str:
    """`text` as one value of a QEMU option list (a comma is written twice)."""
    return text.replace(",", ",,")


def netdev_options(forwards: Iterable[GuestForward], relay_dir: Path | None, *, restrict: bool = True) -> list[str]:
    """The ``-netdev user`` options that isolate the guest and add its allowed forwards."""
    options = ["restrict=on"] if restrict else []
    for forward in forwards:
        if relay_dir is None:
            raise ValueError("allowed guest connections need a per-VM relay directory")
        command = shlex.join([sys.executable, "-I", "-S", str(RELAY_SCRIPT), "--slots", str(relay_dir),
                              "--max", str(RELAY_MAX_CONNECTIONS), "--", forward.entry.host, str(forward.entry.port)])
        options.append(_qemu_value(f"guestfwd=tcp:{forward.guest_ip}:{forward.guest_port}-cmd:{command}"))
    return options
