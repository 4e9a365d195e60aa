"""A proxy in front of a real Prefect server that loses the answer to the first flow-run creation,
as a server that answers after the client's timeout does: the client sends the creation again."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import requests


@dataclass
class LossyProxy:
    """Where the proxy listens (`api_url`, to use as PREFECT_API_URL) and the creations it saw
    (the request paths, in order; the first one's answer was never sent)."""

    api_url: str
    creations: list[str] = field(default_factory=list)


@contextmanager
def losing_first_creation(upstream_api_url: str) -> Iterator[LossyProxy]:
    """A proxy on 127.0.0.1 forwarding every request to the Prefect API at `upstream_api_url`
    (…/api), except that it closes the connection instead of answering the first
    `POST …/create_flow_run` the server carried out. Plain HTTP, no websockets: for API calls,
    not a whole run's events."""
    upstream = upstream_api_url.removesuffix("/").removesuffix("/api")
    proxy = LossyProxy(api_url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
            answer = requests.request(self.command, upstream + self.path, data=body, headers=headers, timeout=120)
            if self.command == "POST" and self.path.endswith("/create_flow_run"):
                proxy.creations.append(self.path)
                if len(proxy.creations) == 1:
                    self.close_connection = True  # the run exists; its answer never arrives
                    return
            self.send_response(answer.status_code)
            for key, value in answer.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    proxy.api_url = f"http://127.0.0.1:{server.server_address[1]}/api"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
