"""Errors raised when talking to a WAA server, split by whose fault they are.

A `WAAConnectionError` means the VM could not be reached or did not answer in time: an
infrastructure problem that is retried, never scored. A `WAAHTTPError` means the server answered
with a status the caller did not expect for that endpoint.
"""

from __future__ import annotations


class WAAError(Exception):
    """Any failure talking to a WAA server; `endpoint` names the route that failed."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"WAA {endpoint}: {message}")
        self.endpoint = endpoint
        self.message = message


class WAAConnectionError(WAAError):
    """The server could not be reached, or did not answer within the endpoint's timeout."""


class WAAHTTPError(WAAError):
    """The server answered with an unexpected HTTP status."""

    def __init__(self, endpoint: str, status: int, message: str) -> None:
        super().__init__(endpoint, f"HTTP {status}: {message}")
        self.status = status


class WAAAnswerTooLarge(WAAError):
    """The server's answer is larger than the caller allowed (`max_bytes`): an agent can make a VM
    file as large as the VM's disk. The caller's limit, not a server failure; `size` is the
    declared size when the answer said it (Content-Length), else None."""

    def __init__(self, endpoint: str, size: int | None, limit: int) -> None:
        said = f"answer of {size:,} bytes" if size is not None else "answer"
        super().__init__(endpoint, f"{said} is over the caller's limit of {limit:,} bytes; not read")
        self.size = size
        self.limit = limit
