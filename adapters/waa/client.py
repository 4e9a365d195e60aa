"""HTTP client for the WAA server that runs inside a Windows VM (or the local simulation).

One method per server route, typed results, a timeout per route, and retries with backoff only
where a repeat is harmless (adapters/outcomes.py R10): reads, WAA's reset and clean-up calls
(`/setup/close_all`, `/setup/clear_task_files`), window activation and read-only commands
(`setup_execute(..., read_only=True)`). Calls that act (launches, task commands, actions) are sent
once. The client hides none of the server's quirks from callers
that need them (yes/no answers carried by status codes, /execute answering 200 for a failed
command) but turns each into a typed value, and every failure into a `WAAError` that names the
route (see adapters/waa/errors.py).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from adapters.transfer_errors import ANSWER_CUT_SHORT
from adapters.waa.errors import WAAAnswerTooLarge, WAAConnectionError, WAAError, WAAHTTPError


@dataclass(frozen=True)
class WAATimeouts:
    """Deadlines in seconds per kind of route, each covering the call's retries and back-off.

    The accessibility tree can take minutes on a busy desktop; 300 s is WAA's own client timeout.
    """

    connect: float = 5.0
    default: float = 30.0
    accessibility: float = 300.0
    execute: float = 130.0  # the server's own subprocess timeout is 120 s
    probe: float = 5.0


@dataclass(frozen=True)
class ExecuteResult:
    """The answer of POST /execute: HTTP 200 even when the command failed (check returncode)."""

    status: str
    output: str
    error: str
    returncode: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True)
class WinAgentObservation:
    """The answer of GET /obs_winagent."""

    image_png: bytes | None
    window_title: str
    window_rect: list[int] | None
    window_names: str
    clipboard: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


def _read_bounded(response: requests.Response, route: str, limit: int) -> None:
    """Read a streamed answer's body, refusing one over `limit` bytes without reading past it
    (by its Content-Length, or as it arrives); then `response.content` holds it as usual."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        response.close()
        raise WAAAnswerTooLarge(route, int(declared), limit)
    body = bytearray()
    for chunk in response.iter_content(chunk_size=1 << 16):
        body += chunk
        if len(body) > limit:
            response.close()
            raise WAAAnswerTooLarge(route, None, limit)
    response._content = bytes(body)  # where requests keeps a body it has read (Response.content)


class WAAClient:
    """A client for one WAA server at `base_url` (for example http://127.0.0.1:5000)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeouts: WAATimeouts | None = None,
        read_retries: int = 3,
        backoff_seconds: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or WAATimeouts()
        self.read_retries = read_retries
        self.backoff_seconds = backoff_seconds
        self._session = session or requests.Session()

    def close(self) -> None:
        self._session.close()

    def __repr__(self) -> str:
        return f"WAAClient({self.base_url!r})"

    # -- transport -------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        route: str,
        *,
        timeout: float | None = None,
        idempotent: bool = False,
        ok_statuses: tuple[int, ...] = (200,),
        max_body: int | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        """Send one request; retry connection errors and 5xx only when `idempotent`.

        `timeout` (default: the route kind's timeout) is one deadline for the whole call, retries
        and back-off included: each try waits only for what is left of it, so a hanging route
        costs its timeout once, not once per try. `max_body` bounds a success answer's body
        (`WAAAnswerTooLarge` past it); a body cut short is retried like any dropped answer.
        """
        budget = timeout if timeout is not None else self.timeouts.default
        deadline = time.monotonic() + budget
        attempts = 1 + (self.read_retries if idempotent else 0)
        last_error: WAAError | None = None
        for attempt in range(attempts):
            if attempt:
                pause = self.backoff_seconds * (2 ** (attempt - 1))
                if deadline - time.monotonic() <= pause:
                    break
                time.sleep(pause)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                response = self._session.request(
                    method,
                    self.base_url + route,
                    timeout=(min(self.timeouts.connect, remaining), remaining),
                    stream=max_body is not None,
                    **kwargs,
                )
                if max_body is not None and response.status_code in ok_statuses:
                    _read_bounded(response, route, max_body)
            except requests.Timeout as exc:
                last_error = WAAConnectionError(route, f"no answer within {budget:g} s ({type(exc).__name__})")
                continue
            except requests.ConnectionError as exc:
                last_error = WAAConnectionError(route, f"cannot connect to {self.base_url} ({exc})")
                continue
            except ANSWER_CUT_SHORT as exc:
                last_error = WAAConnectionError(route, f"answer cut short: {self.base_url} stopped mid-answer ({exc})")
                continue
            if response.status_code in ok_statuses:
                return response
            error = WAAHTTPError(route, response.status_code, error_message(response))
            if response.status_code >= 500 and idempotent:
                last_error = error
                continue
            raise error
        if last_error is None:
            last_error = WAAConnectionError(route, f"no answer within {budget:g} s")
        raise last_error

    def _json(self, response: requests.Response, route: str) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise WAAHTTPError(route, response.status_code, f"answer is not JSON: {exc}") from exc

    def _yes_no(self, route: str, payload: dict[str, Any]) -> bool:
        """The yes/no routes answer 200 for yes and 400 for no."""
        response = self._request("POST", route, json=payload, idempotent=True, ok_statuses=(200, 400))
        return response.status_code == 200

    # -- readiness -------------------------------------------------------------------------

    def probe(self) -> bool:
        """True when GET /probe answers 200 right now; never raises."""
        try:
            self._request("GET", "/probe", timeout=self.timeouts.probe)
        except WAAError:
            return False
        return True

    def wait_until_ready(self, deadline_seconds: float, poll_seconds: float = 1.0) -> float:
        """Poll /probe until it answers; returns the seconds waited, raises on the deadline."""
        start = time.monotonic()
        while True:
            if self.probe():
                return time.monotonic() - start
            waited = time.monotonic() - start
            if waited >= deadline_seconds:
                raise WAAConnectionError("/probe", f"server not ready after {waited:.1f} s at {self.base_url}")
            time.sleep(min(poll_seconds, max(0.0, deadline_seconds - waited)))

    # -- observation -----------------------------------------------------------------------

    def screenshot(self) -> bytes:
        """PNG bytes of the whole screen (GET /screenshot)."""
        return self._request("GET", "/screenshot", idempotent=True).content

    def accessibility(self, backend: str = "uia") -> str:
        """The accessibility tree as XML (GET /accessibility); slow on real VMs."""
        response = self._request(
            "GET",
            "/accessibility",
            params={"backend": backend},
            timeout=self.timeouts.accessibility,
            idempotent=True,
        )
        body = self._json(response, "/accessibility")
        if not isinstance(body, dict) or "AT" not in body:
            raise WAAHTTPError("/accessibility", response.status_code, "answer has no 'AT' key")
        return str(body["AT"])

    def obs_winagent(self) -> WinAgentObservation:
        """Foreground window picture, title, rect and window list (GET /obs_winagent)."""
        response = self._request("GET", "/obs_winagent", idempotent=True)
        body = self._json(response, "/obs_winagent")
        image = body.get("image")
        return WinAgentObservation(
            image_png=base64.b64decode(image) if image else None,
            window_title=str(body.get("window_title") or ""),
            window_rect=body.get("rect"),
            window_names=str(body.get("window_names_str") or ""),
            clipboard=str(body.get("computer_clipboard") or ""),
            raw={k: v for k, v in body.items() if k != "image"},
        )

    def platform(self) -> str:
        return self._request("GET", "/platform", idempotent=True).text.strip()

    def screen_size(self) -> tuple[int, int]:
        body = self._json(self._request("POST", "/screen_size", idempotent=True), "/screen_size")
        return int(body["width"]), int(body["height"])

    def desktop_path(self) -> str:
        body = self._json(self._request("POST", "/desktop_path", idempotent=True), "/desktop_path")
        return str(body["desktop_path"])

    def documents_path(self) -> str:
        body = self._json(self._request("POST", "/documents_path", idempotent=True), "/documents_path")
        return str(body["documents_path"])

    # -- actions ---------------------------------------------------------------------------

    def execute(self, command: list[str] | str, shell: bool = False) -> ExecuteResult:
        """Run a command on the VM (POST /execute). A failed command is a result, not an error."""
        return self._execute("/execute", command, shell)

    def _execute(self, route: str, command: list[str] | str, shell: bool, idempotent: bool = False) -> ExecuteResult:
        response = self._request(
            "POST", route, json={"command": command, "shell": shell}, timeout=self.timeouts.execute,
            idempotent=idempotent,
        )
        body = self._json(response, route)
        return ExecuteResult(
            status=str(body.get("status", "")),
            output=str(body.get("output") or ""),
            error=str(body.get("error") or ""),
            returncode=int(body.get("returncode", -1)),
        )

    def execute_windows(self, code: str) -> None:
        """Run `computer.*` code in the server process (POST /execute_windows); 500 = failure."""
        self._request("POST", "/execute_windows", json={"command": code}, timeout=self.timeouts.execute)

    def update_computer(self, payload: dict[str, Any]) -> None:
        """Send Set-of-Marks rects and the screenshot the ids refer to (POST /update_computer)."""
        self._request("POST", "/update_computer", json=payload)

    # -- files -----------------------------------------------------------------------------

    def get_file(self, path: str, *, max_bytes: int | None = None) -> bytes | None:
        """The bytes of a VM file (POST /file), or None when it does not exist (404). With
        `max_bytes`, a larger file raises `WAAAnswerTooLarge` after at most `max_bytes` of it
        were read (an agent can make a VM file as large as the VM's disk)."""
        response = self._request(
            "POST", "/file", data={"file_path": path}, idempotent=True, ok_statuses=(200, 404), max_body=max_bytes
        )
        return response.content if response.status_code == 200 else None

    def list_directory(self, path: str) -> dict[str, Any] | None:
        """The directory tree under `path` (POST /list_directory), or None when it is no directory."""
        response = self._request(
            "POST", "/list_directory", json={"path": path}, idempotent=True, ok_statuses=(200, 400)
        )
        if response.status_code == 400:
            return None
        return self._json(response, "/list_directory").get("directory_tree")

    def wallpaper(self) -> bytes | None:
        """The desktop wallpaper image (POST /wallpaper); None when none is set (WAA answers 404/500)."""
        response = self._request("POST", "/wallpaper", idempotent=False, ok_statuses=(200, 404, 500))
        return response.content if response.status_code == 200 else None

    def cursor_position(self) -> tuple[int, int]:
        """GET /cursor_position. The real route returns a bare tuple Flask rejects: expect a WAAHTTPError 500."""
        body = self._json(self._request("GET", "/cursor_position"), "/cursor_position")
        return int(body[0]), int(body[1])

    def is_details_view(self, path: str) -> bool:
        """Whether File Explorer shows `path` in Details view (200 yes, 400 no)."""
        return self._yes_no("/is_details_view", {"path": path})

    def are_files_sorted_by_modified_time(self, directory: str) -> bool:
        return self._yes_no("/are_files_sorted_by_modified_time", {"directory": directory})

    def is_directory_read_only_for_user(self, directory: str, user: str) -> bool:
        return self._yes_no("/is_directory_read_only_for_user", {"directory": directory, "user": user})

    def are_all_images_tagged(self, directory: str, tag: str) -> bool:
        return self._yes_no("/are_all_images_tagged", {"directory": directory, "tag": tag})

    def check_if_timer_started(self, hours: int, minutes: int, seconds: int) -> bool:
        return self._yes_no("/check_if_timer_started", {"hours": hours, "minutes": minutes, "seconds": seconds})

    def check_if_world_clock_exists(self, city: str, country: str) -> bool:
        return self._yes_no("/check_if_world_clock_exists", {"city": city, "country": country})

    def library_folders(self, library_name: str) -> list[str] | None:
        """Folders of a Windows library (POST /library_folders); None when the library does not exist."""
        response = self._request(
            "POST", "/library_folders", json={"library_name": library_name}, idempotent=True, ok_statuses=(200, 400)
        )
        if response.status_code == 400:
            return None
        return list(self._json(response, "/library_folders").get("output") or [])

    def terminal_output(self) -> str | None:
        """GET /terminal: Linux only on WAA; a Windows server answers 500."""
        return self._json(self._request("GET", "/terminal", idempotent=True), "/terminal").get("output")

    def window_size(self, app_class_name: str) -> dict[str, Any]:
        """POST /window_size (form field app_class_name): Linux only on WAA."""
        return self._json(self._request("POST", "/window_size", data={"app_class_name": app_class_name}), "/window_size")

    def start_recording(self) -> None:
        self._request("POST", "/start_recording", json={})

    def end_recording(self) -> dict[str, Any]:
        """Stops the screen recording; WAA answers JSON, not the video."""
        return self._json(self._request("POST", "/end_recording", json={}, timeout=120), "/end_recording")

    def file_exists(self, folder: str, file_name: str) -> bool:
        """True when `file_name` is a file inside `folder` (POST /file_exists: 200 yes, 400 no)."""
        return self._yes_no("/file_exists", {"path": folder, "file_name": file_name})

    def folder_exists(self, folder: str, folder_name: str) -> bool:
        """True when `folder_name` is a directory inside `folder` (POST /folder_exists)."""
        return self._yes_no("/folder_exists", {"path": folder, "folder_name": folder_name})

    # -- setup -----------------------------------------------------------------------------

    def setup_launch(self, command: str | list[str], shell: bool = False) -> None:
        """Start a program without waiting; WAA answers 200 even when it does not exist."""
        self._request("POST", "/setup/launch", json={"command": command, "shell": shell})

    def setup_open_file(self, path: str) -> bool:
        """Open a file with its default program; False when the file does not exist (404)."""
        response = self._request(
            "POST", "/setup/open_file", json={"path": path}, timeout=60, ok_statuses=(200, 404)
        )
        return response.status_code == 200

    def setup_activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool:
        """True when a matching window exists (and, strictly, became active); False on 404.
        Bringing a window to the front twice is the same as once: retried like a read (R10)."""
        response = self._request(
            "POST",
            "/setup/activate_window",
            json={"window_name": window_name, "strict": strict, "by_class": by_class},
            ok_statuses=(200, 404),
            idempotent=True,
        )
        return response.status_code == 200

    def setup_close_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> bool:
        response = self._request(
            "POST",
            "/setup/close_window",
            json={"window_name": window_name, "strict": strict, "by_class": by_class},
            ok_statuses=(200, 404),
        )
        return response.status_code == 200

    def setup_close_all(self) -> None:
        """Close every titled window (WAA's reset); closing what is already closed changes
        nothing, so it is retried like a read (R10)."""
        self._request("POST", "/setup/close_all", json={}, idempotent=True)

    def setup_clear_task_files(self) -> None:
        """Delete the files in Downloads (WAA's clean-up); retried like a read (R10)."""
        self._request("POST", "/setup/clear_task_files", json={}, idempotent=True)

    def setup_create_folder(self, path: str) -> None:
        self._request("POST", "/setup/create_folder", json={"path": path})

    def setup_create_file(self, path: str, content: str = "") -> None:
        self._request("POST", "/setup/create_file", json={"path": path, "content": content})

    def setup_recycle(self, path: str) -> None:
        self._request("POST", "/setup/recycle", json={"path": path})

    def setup_change_wallpaper(self, path: str) -> None:
        self._request("POST", "/setup/change_wallpaper", json={"path": path})

    def setup_download_file(self, url: str, path: str) -> None:
        """The VM downloads `url` itself (WAA's client never uses this; the host downloads instead)."""
        self._request("POST", "/setup/download_file", json={"url": url, "path": path}, timeout=300)

    def shutdown(self) -> None:
        """POST /shutdown: powers the VM off (used when building a golden image)."""
        self._request("POST", "/shutdown", json={})

    def save_state(self) -> None:
        """POST /save_state: broken on WAA's server; kept for completeness."""
        self._request("POST", "/save_state", json={})

    def revert_to_snapshot(self) -> None:
        """POST /revert_to_snapshot: WAA answers 501; snapshots are the VM provider's job."""
        self._request("POST", "/revert_to_snapshot", json={})

    def setup_upload(self, path: str, data: bytes) -> None:
        """Write `data` to `path` on the VM (multipart POST /setup/upload)."""
        self._request(
            "POST",
            "/setup/upload",
            data={"file_path": path},
            files={"file_data": ("file", data)},
            timeout=max(self.timeouts.default, 120.0),
        )

    def setup_execute(self, command: list[str] | str, shell: bool = False, *, read_only: bool = False) -> ExecuteResult:
        """The same handler as /execute, under the setup prefix WAA's setup controller uses.
        `read_only=True` says the command changes nothing on the VM (e.g. `tasklist`), so a
        dropped connection or a 5xx is retried like a read (R10); task commands are sent once."""
        return self._execute("/setup/execute", command, shell, idempotent=read_only)


def error_message(response: requests.Response) -> str:
    """The server's own error message when it sent one, else a short body excerpt. A long
    message keeps its start and its end (WAA's timeout message ends in "timed out after 120
    seconds" after the whole command)."""
    try:
        body = response.json()
        if isinstance(body, dict) and "message" in body:
            message = str(body["message"] or "")
            if not message:
                return f"{body.get('status', 'error')} (the server gave no message)"
            return message if len(message) <= 500 else message[:240] + " ... " + message[-240:]
    except ValueError:
        pass
    return response.text[:200] or response.reason or "no body"
