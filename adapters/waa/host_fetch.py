"""What the evaluation host may fetch for a task: public web servers, and only what the operator
adds; never the controller's own services.

WAA's tasks make the *host* (not the VM) fetch URLs named in the task file: setup ``download``
steps (67 of the 154 tasks, from raw.githubusercontent.com/rogeriobonatti/winarenafiles), the
evaluator's ``cloud_file`` gold files (47 tasks, same host), and ``page_info`` / ``pdf_from_url``,
which WAA loads in the VM's browser and this evaluator fetches on the host (live public sites).
A task file is data from outside, so without a rule a hostile task (or a caller of the /evaluate
endpoint) could make the controller fetch its own loopback services (the Prefect API, the local
WAA environment), the cloud's metadata service (169.254.169.254) or anything on the private
network, and read the answer back through a score.

The rule (`FetchPolicy`):

- only ``http`` and ``https`` URLs;
- the host must resolve only to public (globally routable) addresses: loopback, private
  (RFC 1918), link-local, carrier-grade NAT, multicast and reserved addresses are refused;
- an IPv6 address that carries an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
  ``::a.b.c.d``, IPv4-translated ``::ffff:0:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``,
  Teredo ``2001::/32``) is judged by that IPv4 address as well as by itself:
  ``[64:ff9b::a9fe:a9fe]`` reaches 169.254.169.254 through a NAT64 gateway, ``[::127.0.0.1]``
  names loopback. The local-use NAT64 prefix ``64:ff9b:1::/48`` (RFC 8215) is never public,
  whatever it carries (where the IPv4 address sits in it depends on the operator's prefix);
- unless the operator allows them by name or network in ``ARENA_FETCH_ALLOW`` (comma-separated:
  ``files.internal, 10.20.0.0/16, 127.0.0.1``), e.g. for a task-file mirror inside the network;
- the check happens when each connection is made, on the address actually connected to (every
  redirect hop included, at most 5), so a name that resolves differently a moment later (DNS
  rebinding) or a public URL that redirects inward is refused too;
- proxies from the environment (``HTTPS_PROXY``) are not used for these fetches: a proxy would
  make the request on our behalf where the check cannot see it.

A refused URL raises `FetchRefused` naming the URL and the address; callers turn it into the
task's own failure (a setup failure, an evaluation error), never an infrastructure error.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.connection import create_connection

ALLOW_ENV = "ARENA_FETCH_ALLOW"
MAX_REDIRECTS = 5
_SCHEMES = ("http", "https")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class FetchRefused(ValueError):
    """A task asked the host to fetch a URL the fetch policy refuses; the message says why."""


@dataclass(frozen=True)
class FetchPolicy:
    """Which URLs the evaluation host may fetch for a task (see the module docstring)."""

    allowed_hosts: frozenset[str] = frozenset()
    allowed_networks: tuple[IPNetwork, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, text: str | None, *, source: str = ALLOW_ENV) -> FetchPolicy:
        """The policy allowing the comma-separated host names and networks in `text`; a value
        that is neither is a ValueError naming `source`."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for item in (text or "").split(","):
            entry = item.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if "/" in entry or ":" in entry or any(c.isspace() for c in entry):
                raise ValueError(f"{source}: {entry!r} is neither a host name nor an IP network such as 10.20.0.0/16")
            hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    @classmethod
    def from_env(cls) -> FetchPolicy:
        """The operator's policy: public addresses plus what ARENA_FETCH_ALLOW names."""
        return cls.parse(os.environ.get(ALLOW_ENV))

    def check_url(self, url: Any) -> tuple[str, int]:
        """(host, port) of `url`, or `FetchRefused` when its form is not one the host fetches."""
        if not isinstance(url, str) or not url.strip():
            raise FetchRefused(f"URL must be a non-empty string, got {url!r:.100}")
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as exc:
            raise FetchRefused(f"{url!r:.200} is not a valid URL: {exc}") from None
        if parts.scheme.lower() not in _SCHEMES:
            raise FetchRefused(f"{url!r:.200}: only http and https URLs are fetched for tasks")
        if not parts.hostname:
            raise FetchRefused(f"{url!r:.200} names no host")
        return parts.hostname, port or (443 if parts.scheme.lower() == "https" else 80)

    def address_for(self, host: str, port: int) -> str:
        """The first address of `host` this policy lets the host connect to; `FetchRefused`
        when any address it resolves to is refused (a name must not straddle the line)."""
        name = host.lower().rstrip(".").strip("[]")
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve {host}: {exc}") from exc  # a network problem, not the task's
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if name in self.allowed_hosts:
            return addresses[0]
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            if not self._allowed(ip):
                named = host if address == name else f"{host} ({address})"
                carried = ", ".join(str(v4) for v4 in embedded_ipv4(ip))
                named += f", which carries IPv4 {carried}," if carried else ""
                raise FetchRefused(
                    f"{named} is not a public address: tasks may not make the host fetch its own or its "
                    f"network's services (an operator can allow it in {ALLOW_ENV})"
                )
        return addresses[0]

    def _allowed(self, ip: IPAddress) -> bool:
        if any(ip in network for network in self.allowed_networks):
            return True
        return all(_public(address) for address in (ip, *embedded_ipv4(ip)))

    def session(self) -> requests.Session:
        """A requests session whose every connection (redirects included) obeys this policy."""
        session = requests.Session()
        session.trust_env = False  # no proxies from the environment: see the module docstring
        session.max_redirects = MAX_REDIRECTS
        adapter = _CheckedAdapter(self)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    def get(self, url: str, *, timeout: float, **kwargs: Any) -> requests.Response:
        """GET `url` under this policy (`FetchRefused` before anything is sent when refused)."""
        self.check_url(url)
        with self.session() as session:
            return session.get(url, timeout=timeout, **kwargs)


# IPv6 ranges whose addresses carry an IPv4 address in their last 32 bits: IPv4-compatible
# (deprecated, RFC 4291; `::` and `::1` are in it too, and judged as themselves), IPv4-translated
# (SIIT, RFC 2765) and NAT64's well-known prefix (RFC 6052).
_LAST_32_BITS = tuple(ipaddress.IPv6Network(n) for n in ("::/96", "::ffff:0:0:0/96", "64:ff9b::/96"))
# Never public, though Python 3.11's is_global says it is: the local-use NAT64 prefix (RFC 8215,
# "not globally reachable" in IANA's registry; later Python versions agree).
_NOT_GLOBAL = (ipaddress.IPv6Network("64:ff9b:1::/48"),)


def embedded_ipv4(ip: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries (IPv4-mapped, IPv4-compatible, IPv4-translated,
    NAT64, 6to4, Teredo's server and client), which a connection to it may reach; empty for any
    other."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ()
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if any(ip in network for network in _LAST_32_BITS):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return tuple(dict.fromkeys(found))


def _public(ip: IPAddress) -> bool:
    """Whether `ip`, as itself, is a public unicast address."""
    return bool(ip.is_global) and not ip.is_multicast and not any(ip in network for network in _NOT_GLOBAL)


def _checked_connection(base: type[HTTPConnection], policy: FetchPolicy) -> type[HTTPConnection]:
    """`base` (HTTP or HTTPS connection) that connects only to an address `policy` allows; TLS
    still verifies the certificate against the URL's host name."""

    class Checked(base):  # type: ignore[valid-type, misc]
        def _new_conn(self) -> socket.socket:
            address = policy.address_for(self._dns_host, self.port)
            return create_connection(
                (address, self.port), self.timeout, source_address=self.source_address,
                socket_options=self.socket_options,
            )

    return Checked


class _CheckedAdapter(HTTPAdapter):
    def __init__(self, policy: FetchPolicy) -> None:
        self._policy = policy
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        policy = self._policy
        http_pool = type("CheckedHTTPPool", (HTTPConnectionPool,),
                         {"ConnectionCls": _checked_connection(HTTPConnection, policy)})
        https_pool = type("CheckedHTTPSPool", (HTTPSConnectionPool,),
                          {"ConnectionCls": _checked_connection(HTTPSConnection, policy)})
        self.poolmanager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}
