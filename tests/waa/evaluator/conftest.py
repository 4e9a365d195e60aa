"""An in-memory VMConnection for unit-testing the evaluator's pure logic (no server involved)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from adapters.waa.client import ExecuteResult
from adapters.waa.errors import WAAConnectionError, WAAHTTPError


class FakeVM:
    """Files and command answers held in dicts; `down=True` makes every call unreachable."""

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.files: dict[str, bytes] = dict(files or {})
        self.commands: dict[str, ExecuteResult] = {}
        self.http_errors: dict[str, int] = {}  # path -> status for /file
        self.directories: dict[str, dict] = {}
        self.existing: set[str] = set()  # "folder|name" for the yes/no routes
        self.desktop = r"C:\Users\Docker\Desktop"
        self.documents = r"C:\Users\Docker\Documents"
        self.xml = "<root/>"
        self.down = False
        self.calls: list[tuple[str, Any]] = []

    def _check(self, route: str) -> None:
        if self.down:
            raise WAAConnectionError(route, "cannot connect to fake VM")

    def get_file(self, path: str) -> bytes | None:
        self._check("/file")
        self.calls.append(("get_file", path))
        if path in self.http_errors:
            raise WAAHTTPError("/file", self.http_errors[path], "boom")
        # Windows accepts '/' as a separator (WAA joins folder and file name with posixpath)
        return self.files.get(path.replace("/", "\\"))

    def list_directory(self, path: str) -> dict | None:
        self._check("/list_directory")
        return self.directories.get(path)

    def execute(self, command: list[str] | str, shell: bool = False) -> ExecuteResult:
        self._check("/execute")
        key = command if isinstance(command, str) else " ".join(command)
        self.calls.append(("execute", key))
        if key not in self.commands:
            return ExecuteResult(status="success", output="", error="not found", returncode=1)
        return self.commands[key]

    def desktop_path(self) -> str:
        self._check("/desktop_path")
        return self.desktop

    def documents_path(self) -> str:
        self._check("/documents_path")
        return self.documents

    def file_exists(self, folder: str, file_name: str) -> bool:
        self._check("/file_exists")
        return f"{folder}|{file_name}" in self.existing

    def folder_exists(self, folder: str, folder_name: str) -> bool:
        self._check("/folder_exists")
        return f"{folder}|{folder_name}" in self.existing

    def accessibility(self, backend: str = "uia") -> str:
        self._check("/accessibility")
        self.calls.append(("accessibility", backend))
        return self.xml


@pytest.fixture
def vm() -> FakeVM:
    return FakeVM()


@pytest.fixture
def evaluate(vm: FakeVM, tmp_path) -> Callable[..., Any]:
    """evaluate(spec, last_action="DONE", **kw) against the fixture VM and a temp cache dir."""
    from adapters.waa.evaluator import evaluate_task

    def run(spec: dict, last_action: str | None = "DONE", **kwargs: Any):
        kwargs.setdefault("cache_dir", tmp_path / "cache")
        return evaluate_task(spec, kwargs.pop("vm", vm), last_action=last_action, **kwargs)

    return run
