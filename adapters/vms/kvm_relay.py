"""One connection a kvm guest may make to a host service the operator allowed (kvm_net.py).

QEMU starts this per connection (``guestfwd=tcp:GUEST_IP:PORT-cmd:...``) with the guest's
connection as its stdin, stdout and stderr, and it copies bytes both ways between that and
HOST:PORT. It runs as ``python -I -S`` (no environment, no site packages): standard library
only, nothing of the product. It writes nothing of its own to the guest: a failure just closes
the connection.

At most ``--max`` of them run at once per VM (a lock on one of the slot files in ``--slots``):
a guest opening connections in a loop costs short-lived processes, not the host's memory. An
idle connection (no byte either way for ``--idle`` seconds) is closed.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import selectors
import socket
import sys
from pathlib import Path

CONNECT_SECONDS = 10.0
CHUNK = 65536


def take_slot(directory: Path, count: int) -> int | None:
    """An open, exclusively locked slot file in `directory` (held until this process ends), or
    None when all `count` are taken."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for index in range(count):
        fd = os.open(directory / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            os.close(fd)
    return None


def pump(guest: socket.socket, upstream: socket.socket, idle_seconds: float) -> None:
    """Copy bytes both ways until both sides have finished, or nothing moved for `idle_seconds`."""
    selector = selectors.DefaultSelector()
    peers = {guest: upstream, upstream: guest}
    for sock in peers:
        selector.register(sock, selectors.EVENT_READ)
    open_sides = 2
    while open_sides:
        ready = selector.select(idle_seconds)
        if not ready:
            return
        for key, _ in ready:
            source = key.fileobj
            assert isinstance(source, socket.socket)
            data = source.recv(CHUNK)
            if data:
                peers[source].sendall(data)
                continue
            selector.unregister(source)  # this side finished sending: pass the end on
            open_sides -= 1
            try:
                peers[source].shutdown(socket.SHUT_WR)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvm_relay", description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=Path, required=True)
    parser.add_argument("--max", type=int, default=16)
    parser.add_argument("--idle", type=float, default=300.0)
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    args = parser.parse_args(argv)
    slot = take_slot(args.slots, args.max)
    if slot is None:
        return 2
    guest = socket.socket(fileno=os.dup(0))
    try:
        upstream = socket.create_connection((args.host, args.port), timeout=CONNECT_SECONDS)
    except OSError:
        return 1
    for sock in (guest, upstream):
        sock.settimeout(args.idle)  # a side that stops reading ends it too
    try:
        pump(guest, upstream, args.idle)
    except OSError:
        return 1
    finally:
        upstream.close()
        guest.close()
    return 0


if __name__ == "__main__":
    # stderr is the guest's connection too: never let a traceback (host paths) reach it.
    with open(os.devnull, "w") as _quiet:
        os.dup2(_quiet.fileno(), 2)
    sys.exit(main())
