"""Ports for the tests' servers that are told a port on their command line.

A port the kernel chooses (bind to port 0) and the test then lets go of can be taken by any other
process before the server binds it: the kernel hands out the same range for other tests' port-0
binds and for every outgoing connection's local port, and four pytest workers start servers at
once. A server that lost the race fails with "address already in use"; worse, a test could reach
another test's server on it. So these ports come from below the kernel's ephemeral range, where
nothing is handed out automatically, and each pytest worker draws from a slice of its own.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

# Below the kernel's ephemeral range and above the ports services usually claim.
LOWEST = 10_000
# Slices of the range: one per pytest worker (gw0, gw1, ...), wrapping beyond this many.
SLICES = 8
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_lock = threading.Lock()
_given: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel chooses by itself (Linux's default, 32768, elsewhere)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _slice() -> range:
    """This pytest worker's share of the ports below the ephemeral range (empty on a machine whose
    ephemeral range starts too low to leave room)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % SLICES if worker.isdigit() else 0
    size = max(0, (_ephemeral_low() - LOWEST) // SLICES)
    return range(LOWEST + index * size, LOWEST + (index + 1) * size)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def server_port() -> int:
    """A port on 127.0.0.1 that nothing listens on and that no port-0 bind or outgoing connection
    can take before a server started with it binds it; never the same twice in one process."""
    ports = _slice()
    if len(ports) < 100:  # no room below the ephemeral range: the kernel's choice, racy as it is
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    start = random.randrange(len(ports))
    with _lock:
        for offset in range(len(ports)):
            port = ports[(start + offset) % len(ports)]
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} for a test server")
