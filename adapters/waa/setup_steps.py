"""Run WAA task setup steps (a task's `config`, and `postconfig` before evaluation).

Each step is `{"type": T, "parameters": {...}}` as in WAA's task files. Unlike WAA's own setup
controller, which logs most HTTP failures and carries on, a step that fails here raises (except a
strict window activation the server could not complete, which WAA logs and so do we), sorted
by adapters/outcomes.py rule R6: a problem of the task's own data (a missing file or program, a
window that never appears) raises `SetupStepError` naming the step and carrying the server's
message (a setup failure, not retried); a server that failed the call for its own reasons
(connection trouble, 5xx) raises `EnvironmentFault` (infrastructure, retried from a fresh reset).

Launches are verified: WAA's `/setup/launch` answers 200 for any command, even a program the VM
does not have, so a launch counts only when a new window or a new process of the program appears
(the process list comes from `tasklist` through `/setup/execute`).
"""

from __future__ import annotations

import csv
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PureWindowsPath
from typing import Any

import requests

from adapters.host_paths import inside
from adapters.outcomes import EnvironmentFault, Fault, classify_download_error, classify_setup_error
from adapters.registry import Registry
from adapters.waa.browser_setup import BrowserSetupError, DevToolsClient, close_tabs, open_tabs, update_browse_history
from adapters.waa.client import ExecuteResult, WAAClient
from adapters.waa.downloads import cached_download_path
from adapters.waa.errors import WAAConnectionError, WAAError, WAAHTTPError
from adapters.waa.host_fetch import FetchPolicy

# WAA's `until` loop: retry every 0.3 s, give up after 5 failed requests. WAA retries forever
# while requests succeed but the condition is unmet; we stop after UNTIL_MAX_ATTEMPTS (~30 s).
UNTIL_POLL_SECONDS = 0.3
UNTIL_MAX_FAILURES = 5
UNTIL_MAX_ATTEMPTS = 100


# The longest a `sleep` step may wait, and all of one list of steps together: WAA's task files
# sleep 0.5, 1, 2 or (twice) 3 s a step. A longer wait is a task's mistake or an attempt to hold
# the VM (and, through /evaluate, a server thread): refused before any step runs, as the task's
# own setup failure (check_sleeps), rather than a task that hangs until its stage's deadline.
MAX_SLEEP_SECONDS = 60.0
MAX_TOTAL_SLEEP_SECONDS = 300.0

# 23 real WAA tasks launch `socat`, a Linux port forwarder that does not exist on Windows.
NO_OP_PROGRAMS = ("socat",)
# Launches that stop programs (8 real tasks: `Stop-Process -Name vlc`) start nothing to verify.
_STOPPING = ("stop-process", "taskkill")
# The process list a launch is verified against: `tasklist` in CSV without a header.
TASKLIST_COMMAND = ["tasklist", "/fo", "csv", "/nh"]


def launched_program(command: str | list[str]) -> str:
    """The program a launch command starts, looking through `start` and `cmd /c start` wrappers."""
    parts = command.split() if isinstance(command, str) else [str(p) for p in command]
    parts = [p for part in parts for p in part.split()]
    while parts and parts[0].lower() in ("start", "cmd", "/c", 'start""'):
        parts = parts[1:]
    if not parts:
        return ""
    program = parts[0].strip('"').lower()
    return program.rsplit("\\", 1)[-1].removesuffix(".exe")


def stops_programs(command: str | list[str]) -> bool:
    """Whether a launch command only stops programs (Stop-Process, taskkill)."""
    text = command if isinstance(command, str) else " ".join(str(p) for p in command)
    return any(word in text.lower() for word in _STOPPING)


def parse_tasklist(output: str) -> dict[int, str]:
    """Image names by PID from `tasklist /fo csv /nh` output (malformed lines are skipped)."""
    processes: dict[int, str] = {}
    for row in csv.reader(io.StringIO(output)):
        if len(row) >= 2 and row[1].strip().isdigit():
            processes[int(row[1])] = row[0].strip()
    return processes


def is_process_of(image: str, program: str) -> bool:
    """Whether a process image (e.g. "Code.exe") belongs to a launched program (e.g. "code")."""
    stem = image.lower().removesuffix(".exe")
    name = program.removeprefix("google-")  # WAA's server rewrites google-chrome to chrome
    return bool(stem and name) and (stem.startswith(name) or name.startswith(stem))


# WAA step type -> the SetupRunner method that runs it (parameters are WAA's, by keyword).
STEP_HANDLERS: Registry[Callable[..., None]] = Registry("setup step type")
step = STEP_HANDLERS.register


class SetupStepError(RuntimeError):
    """A setup step failed; the message names the step's position and type."""

    def __init__(self, index: int, step_type: str, message: str) -> None:
        super().__init__(f"setup step {index} ({step_type}): {message}")
        self.index = index
        self.step_type = step_type


def _sleep_problem(seconds: float) -> str | None:
    """What is wrong with a sleep step of `seconds`, or None."""
    if seconds < 0:
        return f"seconds must not be negative: {seconds:g}"
    if not seconds <= MAX_SLEEP_SECONDS:  # NaN and infinity included
        return f"seconds must be at most {MAX_SLEEP_SECONDS:g} (MAX_SLEEP_SECONDS), got {seconds:g}"
    return None


def check_sleeps(steps: list[Any]) -> None:
    """Refuse, before any step runs, a sleep step over MAX_SLEEP_SECONDS or sleep steps that wait
    more than MAX_TOTAL_SLEEP_SECONDS together; a sleep step whose seconds are no number is left
    to say so when it runs."""
    total = 0.0
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or step.get("type") != "sleep" or not isinstance(step.get("parameters"), dict):
            continue
        try:
            seconds = float(step["parameters"].get("seconds"))
        except (TypeError, ValueError):
            continue
        problem = _sleep_problem(seconds)
        if problem is not None:
            raise SetupStepError(index, "sleep", problem)
        total += seconds
        if total > MAX_TOTAL_SLEEP_SECONDS:
            raise SetupStepError(
                index, "sleep", f"the sleep steps up to this one wait {total:g} s in all, over the "
                f"{MAX_TOTAL_SLEEP_SECONDS:g} s one list of steps may wait (MAX_TOTAL_SLEEP_SECONDS)"
            )


class SetupRunner:
    """Applies setup steps to one VM through its WAA client."""

    def __init__(
        self,
        client: WAAClient,
        cache_dir: Path,
        *,
        sleep: Callable[[float], None] = time.sleep,
        download_timeout: float = 120.0,
        launch_verify_seconds: float = 30.0,
        fixed_waits: bool = True,
        devtools_url: str | None = None,
        download_dir: Path | None = None,
        fetch_policy: FetchPolicy | None = None,
    ) -> None:
        self.client = client
        # What the host may download for a task (adapters/waa/host_fetch.py): a refused URL is
        # the task's own setup failure.
        self.fetch_policy = fetch_policy or FetchPolicy.from_env()
        self.cache_dir = cache_dir
        # Downloads are keyed by URL and may be shared between attempts (and so between
        # threads); everything else in cache_dir belongs to one attempt.
        self.download_dir = download_dir if download_dir is not None else cache_dir / "downloads"
        self._sleep = sleep
        self.download_timeout = download_timeout
        # WAA's /setup/launch answers 200 even when nothing starts: wait this long for a window.
        self.launch_verify_seconds = launch_verify_seconds
        # The task's `sleep` steps (skipped on a VM that acts at once: they wait for nothing).
        self.fixed_waits = fixed_waits
        self.devtools_url = devtools_url
        self.notes: list[str] = []

    @property
    def supported_types(self) -> list[str]:
        return sorted(STEP_HANDLERS)

    def run(self, steps: list[dict[str, Any]]) -> None:
        """Run steps in order; the first failure raises SetupStepError (connection errors pass)."""
        check_sleeps(steps)
        for index, step in enumerate(steps):
            if not isinstance(step, dict) or not isinstance(step.get("type"), str):
                raise SetupStepError(index, "?", f"step is not {{'type': ..., 'parameters': ...}}: {step!r:.200}")
            step_type = step["type"]
            handler = STEP_HANDLERS.get(step_type)
            if handler is None:
                raise SetupStepError(
                    index, step_type, f"unsupported step type; supported: {', '.join(self.supported_types)}"
                )
            parameters = step.get("parameters") or {}
            if not isinstance(parameters, dict):
                raise SetupStepError(index, step_type, f"parameters must be an object, got {type(parameters).__name__}")
            try:
                handler(self, **parameters)
            except EnvironmentFault:
                raise
            except WAAError as exc:
                if classify_setup_error(exc) is Fault.ENVIRONMENT:
                    raise EnvironmentFault(f"setup step {index} ({step_type})", exc.endpoint, exc.message) from exc
                raise SetupStepError(index, step_type, str(exc)) from exc
            except requests.RequestException as exc:
                if classify_download_error(exc) is Fault.ENVIRONMENT:
                    raise EnvironmentFault(f"setup step {index} ({step_type})", "host download", str(exc)) from exc
                raise SetupStepError(index, step_type, str(exc)) from exc
            except TypeError as exc:
                raise SetupStepError(index, step_type, f"bad parameters {sorted(parameters)}: {exc}") from exc
            except (BrowserSetupError, ValueError, OSError) as exc:
                raise SetupStepError(index, step_type, str(exc)) from exc

    # -- step handlers: keyword names are WAA's parameter names --------------------------------

    @step("launch")
    def _launch(self, command: str | list[str], shell: bool = False) -> None:
        if not command:
            raise ValueError("empty command")
        if not shell and isinstance(command, str) and len(command.split()) > 1:
            command = command.split()  # as WAA's setup controller does
        program = launched_program(command)
        if program in NO_OP_PROGRAMS:
            self.notes.append(f"launch of {program!r} skipped: it does not exist on Windows (WAA data bug)")
            return
        if self.launch_verify_seconds <= 0 or stops_programs(command):
            self.client.setup_launch(command, shell)
            return
        windows, processes = self._window_titles(), self._processes()
        self.client.setup_launch(command, shell)
        if windows is None and processes is None:
            self.notes.append(f"launch of {program!r} not verified: the VM lists neither windows nor processes")
            return
        self._wait_for_start(program, windows or set(), processes or {})

    def _window_titles(self) -> set[str] | None:
        """Titles of the open windows, or None when the server cannot list them."""
        try:
            names = self.client.obs_winagent().window_names
        except WAAConnectionError:
            raise
        except WAAError as exc:
            self.notes.append(f"window list unavailable: {exc}")
            return None
        return {line.strip() for line in names.splitlines() if line.strip()}

    def _processes(self) -> dict[int, str] | None:
        """Running processes by PID (`tasklist`), or None when the VM cannot list them."""
        try:
            result = self.client.setup_execute(TASKLIST_COMMAND, read_only=True)
        except WAAConnectionError:
            raise
        except WAAError as exc:
            self.notes.append(f"process list unavailable: {exc}")
            return None
        if not result.ok:
            return None
        return parse_tasklist(result.output)

    def _wait_for_start(self, program: str, windows: set[str], processes: dict[int, str]) -> None:
        """Wait for a new window, or a new process of `program`, to show that the launch worked."""
        deadline = time.monotonic() + self.launch_verify_seconds
        while True:
            titles = self._window_titles()
            if titles is not None and titles - windows:
                return
            now = self._processes()
            if now is not None and any(
                pid not in processes and is_process_of(image, program) for pid, image in now.items()
            ):
                return
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"{program!r} was launched but neither a new window nor a new {program!r} process "
                    f"appeared within {self.launch_verify_seconds:g} s (WAA's /setup/launch answers 200 "
                    "even for a program the VM does not have)"
                )
            self._sleep(0.25)

    @step("open")
    def _open(self, path: str) -> None:
        if not self.client.setup_open_file(path):
            raise ValueError(f"file to open does not exist on the VM: {path}")

    @step("sleep")
    def _sleep_step(self, seconds: float) -> None:
        seconds = float(seconds)
        problem = _sleep_problem(seconds)
        if problem is not None:
            raise ValueError(problem)
        if self.fixed_waits:
            self._sleep(seconds)

    @step("activate_window")
    def _activate_window(self, window_name: str, strict: bool = False, by_class: bool = False) -> None:
        """WAA's activate_window. A strict activation of a window that exists but that the
        server fails to bring to the front (WAA's handler asserts `window.isActive`: a 500) is
        logged and setup carries on, as WAA's setup controller does (adapters/outcomes.py R6);
        the window must still exist (a non-strict check), else the step fails."""
        try:
            found = self.client.setup_activate_window(window_name, strict=strict, by_class=by_class)
        except WAAHTTPError as exc:
            if not (strict and exc.status >= 500 and classify_setup_error(exc) is Fault.ENVIRONMENT):
                raise
            if not self.client.setup_activate_window(window_name, strict=False, by_class=by_class):
                raise ValueError(
                    f"no window matching {window_name!r} (the strict activation failed: {exc.message})"
                ) from exc
            self.notes.append(
                f"strict activation of {window_name!r} failed on the VM ({exc.message}); the window exists but may "
                "not be in front. WAA's setup controller logs this and carries on, and so does this run "
                "(adapters/outcomes.py R6)"
            )
            return
        if not found:
            raise ValueError(f"no window matching {window_name!r}")

    @step("execute")
    @step("command")
    def _execute(
        self,
        command: str | list[str],
        stdout: str = "",
        stderr: str = "",
        shell: bool = False,
        until: dict[str, Any] | None = None,
    ) -> None:
        if not command:
            raise ValueError("empty command")
        until = until or {}
        failures = 0
        for _attempt in range(UNTIL_MAX_ATTEMPTS):
            try:
                result = self.client.setup_execute(command, shell=shell)
            except WAAConnectionError:
                raise
            except WAAError as exc:
                # Without `until` one failure ends the step; `run` sorts it by R6 and keeps the
                # server's own message. With `until`, WAA retries up to UNTIL_MAX_FAILURES times.
                failures += 1
                if not until or failures >= UNTIL_MAX_FAILURES or classify_setup_error(exc) is Fault.TASK_DATA:
                    raise
                self._sleep(UNTIL_POLL_SECONDS)
                continue
            self._save_output(stdout, result.output)
            self._save_output(stderr, result.error)
            if not until:
                # WAA ignores the exit code here, and real tasks rely on it (postconfig
                # `taskkill` of a browser the agent already closed exits 128): keep a note.
                if not result.ok:
                    self.notes.append(f"command exited {result.returncode}: {command!r:.120}")
                return
            if _until_met(until, result):
                return
            self._sleep(UNTIL_POLL_SECONDS)
        raise ValueError(f"'until' condition {until} never met for {command!r:.200}")

    def _save_output(self, name: str, text: str) -> None:
        if name:
            target = inside(self.cache_dir, name, what="command output file")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    @step("create_folder")
    def _create_folder(self, path: str) -> None:
        if not path:
            raise ValueError("empty path")
        self.client.setup_create_folder(path)

    @step("create_file")
    def _create_file(self, path: str, content: str = "") -> None:
        if not path:
            raise ValueError("empty path")
        self.client.setup_create_file(path, content)

    @step("recycle_file")
    def _recycle_file(self, path: str) -> None:
        if not path:
            raise ValueError("empty path")
        self.client.setup_recycle(path)

    @step("close_all")
    def _close_all(self) -> None:
        self.client.setup_close_all()

    def _devtools(self) -> DevToolsClient:
        if not self.devtools_url:
            raise ValueError("this VM has no browser DevTools endpoint configured")
        return DevToolsClient(self.devtools_url)

    @step("chrome_open_tabs")
    @step("edge_open_tabs")
    def _open_tabs(self, urls_to_open: list[str]) -> None:
        open_tabs(self._devtools(), urls_to_open, sleep=self._sleep)

    @step("chrome_close_tabs")
    def _close_tabs(self, urls_to_close: list[str]) -> None:
        close_tabs(self._devtools(), urls_to_close, sleep=self._sleep)

    @step("update_browse_history")
    def _update_history_chrome(self, history: list[dict[str, Any]]) -> None:
        update_browse_history(self.client, history, "chrome")

    @step("update_browse_history_edge")
    def _update_history_edge(self, history: list[dict[str, Any]]) -> None:
        update_browse_history(self.client, history, "edge")

    @step("download")
    def _download(self, files: list[dict[str, str]]) -> None:
        for entry in files:
            url, path = entry.get("url"), entry.get("path")
            if not url or not path:
                raise ValueError(f"download entry needs url and path, got {entry!r}")
            self.client.setup_upload(path, self._fetch_cached(url, PureWindowsPath(path).name))

    def download_cache_path(self, url: str, name: str) -> Path:
        """Where the host keeps its copy of a downloaded file (one per URL, shared with the
        evaluator's cloud_file: adapters/waa/downloads.py)."""
        return cached_download_path(self.download_dir, url, name)

    def _fetch_cached(self, url: str, name: str) -> bytes:
        """Download on the host once per URL (WAA's behaviour), then reuse the cached copy."""
        cached = self.download_cache_path(url, name)
        if cached.exists():
            return cached.read_bytes()
        response = self.fetch_policy.get(url, timeout=self.download_timeout)
        response.raise_for_status()
        cached.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file of this writer's own, renamed into place: two attempts fetching the
        # same URL at once never write into the file the other is reading.
        with tempfile.NamedTemporaryFile(dir=cached.parent, prefix=cached.name, suffix=".part", delete=False) as part:
            part.write(response.content)
        Path(part.name).replace(cached)
        return response.content


def _until_met(until: dict[str, Any], result: ExecuteResult) -> bool:
    """WAA's `until`: any one of returncode / stdout substring / stderr substring matches."""
    return bool(
        ("returncode" in until and result.returncode == until["returncode"])
        or ("stdout" in until and str(until["stdout"]) in result.output)
        or ("stderr" in until and str(until["stderr"]) in result.error)
    )
