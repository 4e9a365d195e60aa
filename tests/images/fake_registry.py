"""A tiny container registry on 127.0.0.1 speaking the v2 API's manifest HEAD with an anonymous
Bearer token challenge, as Docker Hub does (realm, service, scope; then Docker-Content-Digest)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TOKEN = "fake-registry-token"


class FakeRegistry:
    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str, str]] = []  # method, path, Authorization
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def _reply(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD" and body:
                    self.wfile.write(body)

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                auth = self.headers.get("Authorization", "")
                registry.requests.append((self.command, parts.path, auth))
                if parts.path == "/token":
                    query = parse_qs(parts.query)
                    ok = query.get("service") == ["fake-registry"] and query.get("scope", [""])[0].startswith(
                        "repository:")
                    self._reply(200 if ok else 400, {"Content-Type": "application/json"},
                                json.dumps({"token": TOKEN} if ok else {}).encode())
                    return
                if not parts.path.startswith("/v2/") or "/manifests/" not in parts.path:
                    self._reply(404, {})
                    return
                repo, _, tag = parts.path[4:].partition("/manifests/")
                if auth != f"Bearer {TOKEN}":
                    realm = f"http://127.0.0.1:{registry.port}/token"
                    self._reply(401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake-registry",'
                                                          f'scope="repository:{repo}:pull"'})
                    return
                digest = registry.manifests.get((repo, tag))
                if digest is None:
                    self._reply(404, {"Content-Type": "application/json"}, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                    return
                self._reply(200, {"Docker-Content-Digest": digest,
                                  "Content-Type": "application/vnd.oci.image.index.v1+json"}, b"{}")

            do_GET = do_HEAD = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def push(self, repo: str, tag: str) -> str:
        """Publish a manifest for repo:tag; returns its digest."""
        digest = "sha256:" + hashlib.sha256(f"{repo}:{tag}:{len(self.manifests)}".encode()).hexdigest()
        self.manifests[(repo, tag)] = digest
        return digest

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
