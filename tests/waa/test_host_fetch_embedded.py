"""adapters/waa/host_fetch.py: IPv6 addresses that carry an IPv4 address are judged by it too.

Each form (IPv4-mapped, IPv4-compatible, IPv4-translated, NAT64 and its local-use prefix, 6to4,
Teredo) with loopback, private and the cloud metadata address inside is refused before any
connection, end to end through `FetchPolicy.get` with the bracketed literal in the URL (a real
HTTP server on this host counts what reaches it). With a public address inside, the address is
judged as Python's `is_global` says of both it and the address it carries.
"""

from __future__ import annotations

import http.server
import ipaddress
import threading
from collections.abc import Callable, Iterator

import pytest

from adapters.waa.host_fetch import FetchPolicy, FetchRefused, embedded_ipv4

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address
TEREDO_SERVER = V4("65.54.227.120")  # a public Teredo server, as in RFC 4380's example


def _teredo(client: V4) -> V6:
    # 2001:0000:<server>:<flags>:<port, inverted>:<client, inverted> (RFC 4380).
    return V6((0x20010000 << 96) | (int(TEREDO_SERVER) << 64) | (0x8000 << 48) | (0x63BF << 32)
              | (int(client) ^ 0xFFFFFFFF))


FORMS: dict[str, Callable[[V4], V6]] = {
    "ipv4-mapped": lambda v4: V6((0xFFFF << 32) | int(v4)),
    "ipv4-compatible": lambda v4: V6(int(v4)),
    "ipv4-translated": lambda v4: V6((0xFFFF << 48) | int(v4)),
    "nat64": lambda v4: V6((0x0064FF9B << 96) | int(v4)),
    "nat64-local-use": lambda v4: V6((0x0064FF9B0001 << 80) | int(v4)),
    "6to4": lambda v4: V6((0x2002 << 112) | (int(v4) << 80) | 1),
    "teredo": _teredo,
}
INWARD = {"loopback": V4("127.0.0.1"), "private": V4("10.1.2.3"), "metadata": V4("169.254.169.254"),
          "cgnat": V4("100.64.0.1")}
PUBLIC = V4("8.8.8.8")
LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, list[str]]]:
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_port, seen
    httpd.shutdown()


@pytest.mark.parametrize("inner", list(INWARD), ids=list(INWARD))
@pytest.mark.parametrize("form", list(FORMS))
def test_an_inward_ipv4_address_inside_an_ipv6_literal_is_refused_before_connecting(
    server: tuple[int, list[str]], form: str, inner: str
) -> None:
    port, seen = server
    ip = FORMS[form](INWARD[inner])
    if form != "nat64-local-use":
        assert INWARD[inner] in embedded_ipv4(ip)
    before = len(seen)
    with pytest.raises(FetchRefused, match="not a public address") as refused:
        FetchPolicy().get(f"http://[{ip}]:{port}/secret", timeout=5)
    assert len(seen) == before
    if form != "nat64-local-use":  # the line says which IPv4 address it would have reached
        assert "carries IPv4" in str(refused.value) and str(INWARD[inner]) in str(refused.value)


@pytest.mark.parametrize("form", list(FORMS))
def test_a_public_ipv4_address_inside_is_judged_by_both_addresses(form: str) -> None:
    ip = FORMS[form](PUBLIC)
    expected = ip.is_global and PUBLIC.is_global and ip not in LOCAL_USE
    if expected:
        assert ipaddress.ip_address(FetchPolicy().address_for(str(ip), 443)) == ip
    else:
        with pytest.raises(FetchRefused, match="not a public address"):
            FetchPolicy().address_for(str(ip), 443)


def test_the_metadata_address_through_nat64_is_refused_in_any_spelling(server: tuple[int, list[str]]) -> None:
    port, seen = server
    before = len(seen)
    for literal in ("64:ff9b::a9fe:a9fe", "64:ff9b::169.254.169.254", "0064:FF9B:0000::A9FE:A9FE",
                    "::169.254.169.254", "::127.0.0.1", "2002:7f00:1::1"):
        with pytest.raises(FetchRefused):
            FetchPolicy().get(f"http://[{literal}]:{port}/latest/meta-data/", timeout=5)
    assert len(seen) == before


def test_plain_addresses_carry_nothing() -> None:
    assert embedded_ipv4(V4("8.8.8.8")) == ()
    assert embedded_ipv4(V6("2001:4860:4860::8888")) == ()
    assert FetchPolicy().address_for("2001:4860:4860::8888", 443) == "2001:4860:4860::8888"
