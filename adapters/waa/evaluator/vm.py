"""What the evaluator needs from a WAA server: the `VMConnection` protocol.

The evaluator never speaks HTTP itself. It is handed any object with these methods; in production
that is `adapters.waa.client.WAAClient` (a real VM or the local simulation), in unit tests an
in-memory fake. Failures are signalled the way the client signals them
(`adapters.waa.errors`): `WAAConnectionError` when the VM cannot be reached or times out,
`WAAHTTPError` when a route answers with a status the client did not expect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # the client imports requests; the protocol itself needs nothing at runtime
    from adapters.waa.client import ExecuteResult


@runtime_checkable
class VMConnection(Protocol):
    """The WAA server routes the evaluator's getters read state through."""

    def get_file(self, path: str) -> bytes | None:
        """POST /file: the file's bytes, or None when the server answers 404 (no such file).
        A connection that also takes `max_bytes` (WAAClient does) stops reading a larger file
        there and raises `WAAAnswerTooLarge`; the evaluator then passes its limit
        (archive_limits.MAX_FILE_BYTES), and checks the bytes of one that does not."""
        ...

    def list_directory(self, path: str) -> dict[str, Any] | None:
        """POST /list_directory: the `directory_tree` dict, or None when `path` is no directory."""
        ...

    def execute(self, command: list[str] | str, shell: bool = False) -> ExecuteResult:
        """POST /execute: status/output/error/returncode (HTTP 200 even when returncode != 0)."""
        ...

    def desktop_path(self) -> str:
        """POST /desktop_path."""
        ...

    def documents_path(self) -> str:
        """POST /documents_path."""
        ...

    def file_exists(self, folder: str, file_name: str) -> bool:
        """POST /file_exists: True when `file_name` is a file inside `folder` (200 yes, 400 no)."""
        ...

    def folder_exists(self, folder: str, folder_name: str) -> bool:
        """POST /folder_exists: True when `folder_name` is a directory inside `folder`."""
        ...

    def accessibility(self, backend: str = "uia") -> str:
        """GET /accessibility: the accessibility tree as XML."""
        ...
