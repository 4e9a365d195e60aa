"""adapters/waa/host_fetch.py: what the evaluation host fetches for a task, against real servers
on 127.0.0.1 (which stand in for the controller's own services here)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from adapters.waa.host_fetch import FetchPolicy, FetchRefused


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, list[str]]]:
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            seen.append(self.path)
            if self.path.startswith("/redirect-to/"):
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/redirect-to/"))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"hello"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_port, seen
    httpd.shutdown()


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/x", "http://localhost:{port}/x", "http://127.0.0.2:{port}/x", "http://[::1]:{port}/x",
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.1.1/", "http://100.64.0.1/",
    "http://0.0.0.0:{port}/",
])
def test_the_default_policy_refuses_non_public_addresses_before_sending_anything(
    server: tuple[int, list[str]], url: str
) -> None:
    port, seen = server
    before = len(seen)
    with pytest.raises(FetchRefused, match="not a public address"):
        FetchPolicy().get(url.format(port=port), timeout=5)
    assert len(seen) == before


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.org/x", "gopher://x/", "http://", 7, ""])
def test_only_http_urls_are_fetched(url: object) -> None:
    with pytest.raises(FetchRefused):
        FetchPolicy().get(url, timeout=5)  # type: ignore[arg-type]


def test_the_operator_allows_hosts_and_networks_by_name(server: tuple[int, list[str]]) -> None:
    port, _ = server
    assert FetchPolicy.parse("127.0.0.1").get(f"http://127.0.0.1:{port}/a", timeout=5).text == "hello"
    assert FetchPolicy.parse("127.0.0.0/8").get(f"http://127.0.0.2:{port}/a", timeout=5).text == "hello"
    assert FetchPolicy.parse(" localhost. ").get(f"http://localhost:{port}/a", timeout=5).text == "hello"
    with pytest.raises(FetchRefused):  # allowing a name does not allow its address under another name
        FetchPolicy.parse("localhost").get(f"http://127.0.0.1:{port}/a", timeout=5)
    with pytest.raises(ValueError, match="ARENA_FETCH_ALLOW: 'not a host'"):
        FetchPolicy.parse("10.0.0.0/8, not a host")


def test_every_redirect_hop_is_checked(server: tuple[int, list[str]]) -> None:
    port, seen = server
    inward = f"http://127.0.0.1:{port}/redirect-to/http://127.0.0.2:{port}/secret"
    with pytest.raises(FetchRefused, match="127.0.0.2"):
        FetchPolicy.parse("127.0.0.1").get(inward, timeout=5)
    assert "/secret" not in seen
    assert FetchPolicy.parse("127.0.0.0/8").get(inward, timeout=5).text == "hello"


def test_environment_proxies_are_not_used(server: tuple[int, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    port, _ = server
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    assert FetchPolicy.parse("127.0.0.1").get(f"http://127.0.0.1:{port}/p", timeout=5).text == "hello"


def test_the_policy_comes_from_the_operators_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARENA_FETCH_ALLOW", raising=False)
    assert FetchPolicy.from_env() == FetchPolicy()
    monkeypatch.setenv("ARENA_FETCH_ALLOW", "files.internal,10.20.0.0/16")
    policy = FetchPolicy.from_env()
    assert policy.allowed_hosts == {"files.internal"} and [str(n) for n in policy.allowed_networks] == ["10.20.0.0/16"]
