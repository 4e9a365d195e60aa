"""The test servers' ports: out of the kernel's reach, in this worker's slice, never given twice."""

from __future__ import annotations

import socket

import pytest

from ports import _bindable, _ephemeral_low, _slice, server_port


@pytest.mark.skipif(len(_slice()) < 100, reason="this machine's ephemeral port range leaves no room below it")
def test_a_server_port_is_one_the_kernel_never_hands_out_by_itself() -> None:
    ports = [server_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(port in _slice() and port < _ephemeral_low() for port in ports)
    # What the kernel chooses for a port-0 bind (as other tests' servers and every outgoing
    # connection get theirs) comes from its own range, never from these.
    chosen = []
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            chosen.append(sock.getsockname()[1])
    assert min(chosen) >= _ephemeral_low()


def test_a_port_something_listens_on_is_not_free() -> None:
    port = server_port()
    assert _bindable(port)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        assert not _bindable(port)
