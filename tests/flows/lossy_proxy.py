"""A reverse proxy on 127.0.0.1 in front of a real Prefect server that loses chosen answers.

Requests go through to the server unchanged; for the first request `lose` picks, the server's
answer is replaced by a 503, which the Prefect client retries: the server has then taken the
request once already, as when an answer is lost on a loaded machine or a proxy blips.
WebSocket upgrades (Prefect's events) are piped through untouched.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import requests

# Hop-by-hop headers and those the proxy sets itself.
_DROPPED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}


class LossyProxy:
    """The proxy's address and what it lost (the path of the one answer it replaced)."""

    def __init__(self, upstream: str, lose: Callable[[str, str, bytes], bool]) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.upstream_base = f"{parts.scheme}://{parts.netloc}"
        self.lose = lose
        self.lost: list[str] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
                pass

            def _forward(self) -> None:
                if self.headers.get("Upgrade", "").lower() == "websocket":
                    self._pipe()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _DROPPED}
                answer = requests.request(self.command, proxy.upstream_base + self.path, headers=headers, data=body,
                                          timeout=120, allow_redirects=False)
                with proxy._lock:
                    losing = not proxy.lost and proxy.lose(self.command, self.path, body)
                    if losing:
                        proxy.lost.append(self.path)
                status, content = (503, b"") if losing else (answer.status_code, answer.content)
                self.send_response(status)
                for key, value in answer.headers.items():
                    if key.lower() not in _DROPPED and not losing:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def _pipe(self) -> None:
                upstream = socket.create_connection((proxy.upstream_host, proxy.upstream_port))
                head = f"{self.requestline}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()) + "\r\n"
                upstream.sendall(head.encode("latin-1"))
                ends = [self.connection, upstream]
                try:
                    while True:
                        readable, _, _ = select.select(ends, [], [], 1.0)
                        for end in readable:
                            data = end.recv(65536)
                            if not data:
                                return
                            (upstream if end is self.connection else self.connection).sendall(data)
                except OSError:
                    return
                finally:
                    upstream.close()
                    self.close_connection = True

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

        return Handler


@contextmanager
def lossy_proxy(upstream: str, lose: Callable[[str, str, bytes], bool]) -> Iterator[LossyProxy]:
    """A `LossyProxy` to `upstream` (a server's base URL, e.g. http://127.0.0.1:4200) for the block."""
    proxy = LossyProxy(upstream, lose)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
        thread.join(10)
