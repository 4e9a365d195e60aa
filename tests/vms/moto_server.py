"""A real moto server process-in-a-thread for the AWS provider tests, plus botocore fault hooks.

One `ThreadedMotoServer` on 127.0.0.1 (a free port) per test module, starting empty; `reset()`
wipes its state (POST /moto-api/reset) between tests. boto3 reaches it over HTTP through
`endpoint_url`, so the provider's real request path (serialization, retries, waiters, paginators)
runs unchanged.

moto lacks throttling, capacity errors and CreateReplaceRootVolumeTask; `canned_response` builds
the EC2 XML a botocore `before-send` hook returns instead of sending the request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from urllib.parse import parse_qs

import requests
from botocore.awsrequest import AWSResponse
from machine_pace import scaled


class MotoServer:
    """A running ThreadedMotoServer; `url` is its endpoint."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        # moto keeps its accounts' resources in the process, not in the server: without this a
        # new server would show what an earlier test's server left (seen: a security group of
        # another module's provider, in a test that asserts it leaves nothing behind).
        self.reset()

    def reset(self) -> None:
        # Resetting every service's backends in the server's own thread: seconds on a busy machine
        # (10 s was overrun twice with two suites at once, load 12-15).
        response = requests.post(self.url + "/moto-api/reset", timeout=scaled(10))
        response.raise_for_status()

    def stop(self) -> None:
        self._server.stop()


class _Raw:
    """The minimal raw body AWSResponse reads (`stream()`)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: object):
        yield self._data


def canned_response(url: str, status: int, body: str) -> AWSResponse:
    """An HTTP response for botocore to parse as if EC2 had sent it."""
    return AWSResponse(url, status, {"Content-Type": "text/xml"}, _Raw(body.encode()))


def ec2_error(url: str, status: int, code: str, message: str = "injected by the test") -> AWSResponse:
    """EC2's error document (`<Response><Errors><Error>...`)."""
    return canned_response(
        url,
        status,
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>",
    )


def request_params(request) -> dict[str, str]:
    """The form parameters of an EC2 (query protocol) request a hook intercepted."""
    body = request.body
    if isinstance(body, bytes):
        body = body.decode()
    return {k: v[0] for k, v in parse_qs(body or "").items()}


@contextlib.contextmanager
def moto_with_dummy_credentials() -> Iterator[MotoServer]:
    """A moto server, with boto3's credential chain given dummy keys and nothing of the
    developer's own (~/.aws, profiles, instance metadata) while it runs."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server = MotoServer()
        try:
            yield server
        finally:
            server.stop()
