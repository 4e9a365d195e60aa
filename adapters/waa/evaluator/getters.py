"""State getters: how a WAA evaluator spec's `result` / `expected` entries become values.

A spec entry `{"type": T, ...}` is resolved by `GETTERS[T](ctx, entry)`. Each getter mirrors the
WAA function `get_<T>` in `client/desktop_env/evaluators/getters/` (named in its docstring),
including what it returns when something is missing, because the metric's verdict depends on
that value (`exact_match` compares with plain `==`).

Where WAA's HTTP controller turns a failed request into `None`/`False` (any non-200 answer), the
getters do the same with a `WAAHTTPError` from our client and leave a note in `ctx.notes` so the
outcome's reason can say what happened. A `WAAConnectionError` (VM unreachable) is never turned
into a value: it propagates, and the engine reports an infrastructure error.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from adapters.host_paths import PathEscapeError, inside
from adapters.registry import Registry
from adapters.transfer_errors import BROKEN_TRANSFER
from adapters.waa.errors import WAAHTTPError
from adapters.waa.evaluator.archive_limits import MAX_FILE_BYTES, check_file, file_too_large
from adapters.waa.evaluator.errors import EvaluationConfigError, HostNetworkError, require
from adapters.waa.downloads import cached_download_path
from adapters.waa.host_fetch import FetchPolicy, FetchRefused
from adapters.waa.task_paths import time_stamp, time_suffixed
from adapters.waa.evaluator.vm import VMConnection


@dataclass
class GetterContext:
    """What a getter may use: the VM, the task's cache directory and the download cache."""

    vm: VMConnection
    cache_dir: Path
    offline: bool = False
    download_dir: Path | None = None
    """Where cloud_file keeps downloads (keyed by URL); defaults to `cache_dir / "downloads"`."""
    notes: list[str] = field(default_factory=list)
    """Things worth telling the user (a soft failure WAA turns into a value)."""
    download_timeout: float = 60.0
    devtools_url: str | None = None
    """The browser's DevTools HTTP endpoint on the VM (port 9222), for tab and page getters."""
    flavor: str = "waa"
    """The suite's flavour ("waa", "waa-v2"): which version of a metric that differs scores it."""
    fetch_policy: FetchPolicy = field(default_factory=FetchPolicy.from_env)
    """Which URLs getters may fetch on the host (adapters/waa/host_fetch.py)."""

    @property
    def downloads(self) -> Path:
        return self.download_dir if self.download_dir is not None else self.cache_dir / "downloads"


Getter = Callable[[GetterContext, dict[str, Any]], Any]
GETTERS: Registry[Getter] = Registry("getter type")

_F = TypeVar("_F", bound=Getter)


def getter(name: str) -> Callable[[_F], _F]:
    """Register a getter under the spec `type` it serves."""
    return GETTERS.register(name)


def cache_path(ctx: GetterContext, name: Any, what: str) -> str:
    """Where a getter writes or reads `name` in the task's cache dir: always inside it
    (adapters/host_paths.py). A name that leads out (absolute, '..') is an evaluation error
    naming the field, never a file written or read elsewhere on the host."""
    try:
        return str(inside(ctx.cache_dir, name, what=what))
    except PathEscapeError as exc:
        raise EvaluationConfigError(str(exc)) from None


def local_name(vm_path: str) -> str:
    """The file name a VM path is copied under: its last component in Windows or POSIX form
    (WAA splits on '/' only, so a Windows path would become one name full of backslashes and a
    drive letter; the name is local bookkeeping and does not change any score)."""
    return re.split(r"[/\\]", vm_path)[-1] or "file"


def soft_call(ctx: GetterContext, what: str, call: Callable[[], Any], default: Any) -> Any:
    """Call the VM; an unexpected HTTP status becomes `default`, as WAA's controller does."""
    try:
        return call()
    except WAAHTTPError as exc:
        ctx.notes.append(f"{what} failed ({exc}); WAA treats this as {default!r}")
        return default


def _execute_as_dict(ctx: GetterContext, command: list[str] | str, shell: bool, what: str) -> dict | None:
    """POST /execute shaped like WAA's `execute_shell_command` answer: the JSON dict, or None."""
    result = soft_call(ctx, what, lambda: ctx.vm.execute(command, shell=shell), None)
    if result is None:
        return None
    return {
        "status": result.status,
        "output": result.output,
        "error": result.error,
        "returncode": result.returncode,
    }


# -- host-only getters ---------------------------------------------------------------------------


@getter("rule")
def get_rule(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_rule`: the spec's `rules` value, unchanged."""
    return config["rules"]


@getter("cache_file")
def get_cache_file(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_cache_file`: a path relative to the task's cache dir, which must exist
    (WAA asserts it; the AssertionError is treated like any other getter exception)."""
    local = cache_path(ctx, config["path"], "cache_file path")
    if not os.path.exists(local):
        raise AssertionError(f"cache_file: {local} does not exist")
    return local


def _files_and_gives(config: dict[str, Any]) -> tuple[list[Any], list[Any], set[int]]:
    if config.get("multi", False):
        paths, dests = list(config["path"]), list(config["dest"])
    else:
        paths, dests = [config["path"]], [config["dest"]]
    return paths, dests, set(config.get("gives", [0]))


def _one_or_list(values: list[Any]) -> Any:
    """WAA returns the single given file as a value, otherwise the list (possibly empty)."""
    return values[0] if len(values) == 1 else values


@getter("cloud_file")
def get_cloud_file(ctx: GetterContext, config: dict[str, Any]) -> str | list[str]:
    """WAA `get_cloud_file`: download each URL on the evaluation host and return local paths.

    Supports `multi` (path/dest are lists) and `gives` (indices returned, default [0]) like WAA.
    Deviation in caching only: WAA caches by `dest` in the task's cache dir; we cache by a
    sha256 of the URL (so a gold file is downloaded once for all tasks and attempts), keeping the
    `dest` file name so metrics that look at the extension see the same name. With
    `ctx.offline`, a URL that is not cached is an evaluation error naming it.
    """
    paths, dests, gives = _files_and_gives(config)
    given: list[str] = []
    for index, (url, dest) in enumerate(zip(paths, dests)):
        local = _cached_download(ctx, str(url), str(dest))
        if index in gives:
            given.append(str(local))
    return _one_or_list(given)


def cloud_cache_path(download_dir: Path, url: str, dest: str) -> Path:
    """Where cloud_file keeps `url`: the download cache setup steps share (adapters/waa/downloads.py)."""
    return cached_download_path(download_dir, url, dest)


def _cached_download(ctx: GetterContext, url: str, dest: str) -> Path:
    target = cloud_cache_path(ctx.downloads, url, dest)
    if target.exists():
        return target
    if ctx.offline:
        raise EvaluationConfigError(f"cloud_file: {url} is not in the download cache and offline mode is on")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with ctx.fetch_policy.get(url, stream=True, timeout=ctx.download_timeout) as response:
            if response.status_code != 200:
                # WAA calls raise_for_status(), which raises out of evaluate(): not a score.
                raise EvaluationConfigError(f"cloud_file: GET {url} answered HTTP {response.status_code}")
            fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in response.iter_content(chunk_size=65536):
                        if chunk:
                            out.write(chunk)
                        if out.tell() > MAX_FILE_BYTES:  # stop at the limit, not at the end of the file
                            raise file_too_large(url, None)
                os.replace(tmp_name, target)
            except BaseException:
                if os.path.exists(tmp_name):
                    os.unlink(tmp_name)
                raise
    except FetchRefused as exc:
        raise EvaluationConfigError(f"cloud_file: {exc}") from None
    except BROKEN_TRANSFER as exc:
        raise HostNetworkError(f"cloud_file: cannot download {url}: {exc}") from exc
    return target


# -- file getters (POST /file) ---------------------------------------------------------------------


@getter("vm_file")
def get_vm_file(ctx: GetterContext, config: dict[str, Any]) -> str | None | list[str | None]:
    """WAA `get_vm_file`: copy VM file(s) into the task cache dir, return the local path(s).

    A file the VM does not have gives None (not an exception), so metrics score it (most return
    0 for None). `multi`/`gives` as in WAA; `time_suffix`/`time_format` (single file only) insert
    today's date before the first '.' of path and dest, exactly as WAA does.
    """
    paths, dests, gives = _files_and_gives(config)
    if not config.get("multi", False) and config.get("time_suffix"):
        stamp = time_stamp(config)  # the name task loading checked (adapters/waa/task_paths.py)
        paths = [time_suffixed(p, stamp) for p in paths]
        dests = [time_suffixed(d, stamp) for d in dests]
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    given: list[str | None] = []
    for index, (vm_path, dest) in enumerate(zip(paths, dests)):
        noted = len(ctx.notes)
        content = soft_call(ctx, f"reading {vm_path}", lambda p=vm_path: ctx.vm.get_file(p), None)
        if content is None:
            if len(ctx.notes) == noted:  # a 404; a failed read has its own note
                ctx.notes.append(f"vm_file: {vm_path} does not exist on the VM")
            if index in gives:
                given.append(None)
            continue
        local = cache_path(ctx, dest, "vm_file dest")
        with open(local, "wb") as out:
            out.write(content)
        if index in gives:
            given.append(local)
    return _one_or_list(given)


@getter("content_from_vm_file")
def get_content_from_vm_file(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_content_from_vm_file`: config {path, file_type, file_content}.

    Only file_type 'xlsx' with file_content 'last_row' yields a value (the last row of the first
    sheet, every cell as str); another xlsx file_content gives None, another file_type raises
    NotImplementedError, as in WAA. Needs pandas + openpyxl (the 'metrics' extra).
    """
    vm_path = config["path"]
    local = get_vm_file(ctx, {"path": vm_path, "dest": local_name(vm_path)})
    file_type, file_content = config["file_type"], config["file_content"]
    if file_type != "xlsx":
        raise NotImplementedError(f"content_from_vm_file: file type {file_type} not supported")
    if file_content != "last_row":
        return None
    pandas = require("pandas", what="content_from_vm_file (xlsx)", packages="pandas and openpyxl", extra="office")
    if isinstance(local, str):  # None (no such file) fails in read_excel, as in WAA
        check_file(local, vm_path)
    frame = pandas.read_excel(local)
    return frame.iloc[-1].astype(str).tolist()


@getter("vm_file_exists_in_vm_folder")
def get_vm_file_exists_in_vm_folder(ctx: GetterContext, config: dict[str, Any]) -> float:
    """WAA `get_vm_file_exists_in_vm_folder`: 1.0 when POST /file returns non-empty content for
    folder_name joined with file_name, else 0.0 (also 0.0 when either name is empty).

    Kept WAA quirks: the two are joined with '/' (WAA runs posixpath.join on its Linux host; the
    Windows server accepts it) and an empty file counts as absent (WAA tests the bytes' truth).
    """
    folder_name, file_name = config["folder_name"], config["file_name"]
    if not folder_name or not file_name:
        return 0.0
    vm_path = posixpath.join(folder_name, file_name)
    content = soft_call(ctx, f"reading {vm_path}", lambda: ctx.vm.get_file(vm_path), None)
    if content is None:
        ctx.notes.append(f"vm_file_exists_in_vm_folder: {vm_path} does not exist on the VM")
    elif not content:
        ctx.notes.append(f"vm_file_exists_in_vm_folder: {vm_path} is empty, which WAA counts as absent")
    return 1.0 if content else 0.0


# -- yes/no routes ----------------------------------------------------------------------------------


@getter("vm_folder_exists_in_documents")
def get_vm_folder_exists_in_documents(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_vm_folder_exists_in_documents`: True/False (bools) from POST /folder_exists
    with the VM's Documents folder. Any failed route answer is False, as in WAA."""
    documents = soft_call(ctx, "documents_path", ctx.vm.documents_path, None)
    folder_name = config["folder_name"]
    return bool(
        soft_call(ctx, "folder_exists", lambda: ctx.vm.folder_exists(documents, folder_name), False)
    )


@getter("vm_file_exists_in_desktop")
def get_vm_file_exists_in_desktop(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_vm_file_exists_in_desktop`: True/False (bools) from POST /file_exists with the
    VM's Desktop folder. Any failed route answer is False, as in WAA."""
    desktop = soft_call(ctx, "desktop_path", ctx.vm.desktop_path, None)
    file_name = config["file_name"]
    return bool(soft_call(ctx, "file_exists", lambda: ctx.vm.file_exists(desktop, file_name), False))


@getter("list_directory")
def get_list_directory(ctx: GetterContext, config: dict[str, Any]) -> dict | None:
    """WAA `get_list_directory`: the `directory_tree` dict of POST /list_directory, or None."""
    path = config["path"]
    return soft_call(ctx, f"list_directory {path}", lambda: ctx.vm.list_directory(path), None)


# -- /execute ---------------------------------------------------------------------------------------


@getter("vm_command_line")
def get_vm_command_line(ctx: GetterContext, config: dict[str, Any]) -> str | None:
    """WAA `get_vm_command_line`: the command's stdout, whatever its return code; None only
    when /execute itself fails (non-200: the server raised or timed out)."""
    result = _execute_as_dict(ctx, config["command"], config.get("shell", False), "vm_command_line")
    if result is not None and result["returncode"] != 0:
        ctx.notes.append(f"vm_command_line: command exited with {result['returncode']} (stdout still used)")
    return None if result is None else result["output"]


@getter("vm_command_error")
def get_vm_command_error(ctx: GetterContext, config: dict[str, Any]) -> str | None:
    """WAA `get_vm_command_error`: the command's stderr; None when /execute fails."""
    result = _execute_as_dict(ctx, config["command"], config.get("shell", False), "vm_command_error")
    return None if result is None else result["error"]


def registry_query_command(key_path: str, value_name: str) -> str:
    """The exact PowerShell line WAA's controller (`get_registry_key`) runs through /execute."""
    return f"powershell -Command \"Get-ItemPropertyValue -Path '{key_path}' -Name '{value_name}'\""


def _registry_value(ctx: GetterContext, key_path: str, value_name: str) -> dict | None:
    """WAA `get_registry_key` + `execute_shell_command`: the /execute JSON dict, None on failure.
    The command is sent as one string with shell false (WAA sends no `shell` field)."""
    return _execute_as_dict(ctx, registry_query_command(key_path, value_name), False, f"registry {value_name}")


STORAGE_POLICY_KEY = r"HKCU:\Software\Microsoft\Windows\CurrentVersion\StorageSense\Parameters\StoragePolicy"
PUSH_NOTIFICATIONS_KEY = r"HKCU:Software\Microsoft\Windows\CurrentVersion\PushNotifications"


@getter("storage_sense_run_frequency")
def get_storage_sense_run_frequency(ctx: GetterContext, config: dict[str, Any]) -> str | None:
    """WAA `get_storage_sense_run_frequency`: when value '01' of the StoragePolicy key reads
    exactly "1\\n" (Storage Sense on), the first line of value '2048' (the run frequency) as a
    str; otherwise None.

    A failed /execute (None) makes WAA index None and raise a TypeError; we raise the same kind
    of error so the engine treats it exactly like WAA's exception.
    """
    enabled = _registry_value(ctx, STORAGE_POLICY_KEY, "01")
    if enabled is None:
        raise TypeError("storage_sense_run_frequency: /execute failed for registry value '01'")
    if enabled["status"] == "success" and enabled["output"] == "1\n":
        frequency = _registry_value(ctx, STORAGE_POLICY_KEY, "2048")
        if frequency is None:
            raise TypeError("storage_sense_run_frequency: /execute failed for registry value '2048'")
        if frequency["status"] == "success":
            return frequency["output"].split("\n")[0]
    return None


@getter("system_notifications")
def get_system_notifications(ctx: GetterContext, config: dict[str, Any]) -> str | None:
    """WAA `get_system_notifications`: reads ToastEnabled under PushNotifications and answers
    the *string* 'True' when notifications are turned off (value 0) and 'False' when the value
    is missing/empty or /execute failed. Kept WAA quirk: any other non-empty value (e.g. 1)
    falls through WAA's branches and gives None.
    """
    answer = _registry_value(ctx, PUSH_NOTIFICATIONS_KEY, "ToastEnabled")
    if answer is None or answer["output"] == "":
        return "False"
    if answer["output"].replace("\n", "") == "0":
        return "True"
    ctx.notes.append(f"system_notifications: ToastEnabled={answer['output']!r} gives None, as in WAA")
    return None


@getter("accessibility_tree")
def get_accessibility_tree(ctx: GetterContext, config: dict[str, Any]) -> str | None:
    """WAA `get_accessibility_tree`: the accessibility tree XML, None when the route fails.

    WAA's controller sends no backend here, so the server uses its own default, win32 (not the
    uia the agent's observations use); we ask for win32 explicitly to get the same tree.
    """
    return soft_call(ctx, "accessibility", lambda: ctx.vm.accessibility("win32"), None)
