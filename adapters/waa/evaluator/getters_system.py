"""Getters for the Windows system apps: File Explorer, Clock, Settings, Paint, VLC, the wallpaper.

Each getter mirrors the WAA function `get_<type>` in
`client/desktop_env/evaluators/getters/{fileexplorer,windows_clock,settings,microsoftpaint,vlc,info}.py`
(named in its docstring), including its return *type*: many of these feed `exact_match`, so the
string "true" is not True, and the clock checks answer the strings "True"/"False".

How WAA's controller reacts to a failed request decides the value, so we follow it route by route:

* yes/no routes (`/is_details_view`, `/check_if_timer_started`, ...) answer 200 for yes and 400 for
  no; WAA maps *every* non-200 answer to no, so an unexpected status (a `WAAHTTPError` from our
  client) becomes that same no, with a note in `ctx.notes`;
* `/file`, `/list_directory`, `/library_folders`, `/desktop_path`, `/wallpaper` give None on any
  non-200 answer; WAA then often fails a step later (e.g. `None + "\\"`), which we reproduce as the
  same kind of exception, so the engine scores it exactly as WAA does;
* Python run through `/execute` (WAA's `execute_python_command`): WAA returns the server's JSON even
  for a non-200 answer, i.e. `{"status": "error", "message": ...}` for the server's 500, and the
  caller then usually fails on `["output"]` (KeyError). We return that same dict.

A `WAAConnectionError` is never turned into a value: it propagates and the engine reports an
infrastructure error. Paint's circle check needs numpy (the 'media' extra); the 7-Zip check needs
py7zr (the 'office' extra).
"""

from __future__ import annotations

import ast
import io
import json
import os
import posixpath
import tempfile
from typing import Any, Callable, Protocol, runtime_checkable

from adapters.waa.errors import WAAHTTPError
from adapters.waa.evaluator.archive_limits import check_seven_zip
from adapters.waa.evaluator.errors import EvaluationConfigError, require
from adapters.waa.evaluator.getters import (
    GetterContext,
    _execute_as_dict,
    _registry_value,
    cache_path,
    get_vm_file,
    getter,
    local_name,
    soft_call,
)
from adapters.waa.evaluator.vm import VMConnection


@runtime_checkable
class SystemVMConnection(VMConnection, Protocol):
    """The routes these getters use beyond `VMConnection` (all present on `WAAClient`)."""

    def wallpaper(self) -> bytes | None: ...

    def is_details_view(self, path: str) -> bool: ...

    def are_files_sorted_by_modified_time(self, directory: str) -> bool: ...

    def is_directory_read_only_for_user(self, directory: str, user: str) -> bool: ...

    def are_all_images_tagged(self, directory: str, tag: str) -> bool: ...

    def check_if_timer_started(self, hours: int, minutes: int, seconds: int) -> bool: ...

    def check_if_world_clock_exists(self, city: str, country: str) -> bool: ...

    def library_folders(self, library_name: str) -> list[str] | None: ...


def _route(ctx: GetterContext, method: str, getter_name: str) -> Callable[..., Any]:
    """The VM connection's method for a route outside `VMConnection`, or a clear error."""
    bound = getattr(ctx.vm, method, None)
    if not callable(bound):
        raise EvaluationConfigError(
            f"{getter_name} needs the VM connection to offer {method}() (see SystemVMConnection); "
            f"{type(ctx.vm).__name__} does not"
        )
    return bound


# -- Python through /execute, the way WAA's execute_python_command sends it ------------------------

PYTHON_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
"""WAA's controller prepends this to every Python snippet it runs with `python -c`."""


def python_command(code: str) -> list[str]:
    """The exact argv WAA's `execute_python_command(code)` asks /execute to run (shell false)."""
    return ["python", "-c", PYTHON_PREFIX + code]


def _run_python(ctx: GetterContext, code: str, what: str) -> dict[str, Any]:
    """The /execute answer as WAA's `execute_python_command` returns it: the JSON dict, also for
    the server's error answer (`{"status": "error", "message": ...}`), so callers indexing
    ["output"] fail with KeyError exactly where WAA's do."""
    try:
        result = ctx.vm.execute(python_command(code), shell=False)
    except WAAHTTPError as exc:
        ctx.notes.append(f"{what}: /execute failed ({exc}); WAA gets the server's error answer, without 'output'")
        return {"status": "error", "message": exc.message}
    return {"status": result.status, "output": result.output, "error": result.error, "returncode": result.returncode}


# -- yes/no routes ------------------------------------------------------------------------------------


def _yes_no(ctx: GetterContext, what: str, call: Callable[[], bool]) -> bool:
    return bool(soft_call(ctx, what, call, False))


@getter("check_if_timer_started")
def get_check_if_timer_started(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_check_if_timer_started` (windows_clock.py): the *string* "True" when the Clock app
    has a started timer of hours/minutes/seconds, else "False" (also for any failed answer)."""
    route = _route(ctx, "check_if_timer_started", "check_if_timer_started")
    hours, minutes, seconds = config["hours"], config["minutes"], config["seconds"]
    started = _yes_no(ctx, "check_if_timer_started", lambda: route(hours, minutes, seconds))
    return "True" if started else "False"


@getter("check_if_world_clock_exists")
def get_check_if_world_clock_exists(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_check_if_world_clock_exists`: the *string* "True"/"False" for a world clock of
    city/country in the Clock app (any failed answer is "False")."""
    route = _route(ctx, "check_if_world_clock_exists", "check_if_world_clock_exists")
    city, country = config["city"], config["country"]
    exists = _yes_no(ctx, "check_if_world_clock_exists", lambda: route(city, country))
    return "True" if exists else "False"


@getter("is_details_view")
def get_is_details_view(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_is_details_view`: True/False (bools) whether File Explorer shows `folder_path` in
    Details view; an empty folder_path is False without asking the VM."""
    if not config["folder_path"]:
        return False
    route = _route(ctx, "is_details_view", "is_details_view")
    path = config["folder_path"]
    return _yes_no(ctx, "is_details_view", lambda: route(path))


@getter("are_files_sorted_by_modified_time")
def get_are_files_sorted_by_modified_time(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_are_files_sorted_by_modified_time`: True/False; an empty directory is False."""
    if not config["directory"]:
        return False
    route = _route(ctx, "are_files_sorted_by_modified_time", "are_files_sorted_by_modified_time")
    directory = config["directory"]
    return _yes_no(ctx, "are_files_sorted_by_modified_time", lambda: route(directory))


@getter("is_directory_read_only_for_user")
def get_is_directory_read_only_for_user(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_is_directory_read_only_for_user`: True/False; an empty directory or user raises
    ValueError, as in WAA."""
    if not config["directory"]:
        raise ValueError("is_directory_read_only_for_user: directory is required")
    if not config["user"]:
        raise ValueError("is_directory_read_only_for_user: user is required")
    route = _route(ctx, "is_directory_read_only_for_user", "is_directory_read_only_for_user")
    directory, user = config["directory"], config["user"]
    return _yes_no(ctx, "is_directory_read_only_for_user", lambda: route(directory, user))


@getter("are_all_images_tagged")
def get_are_all_images_tagged(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_are_all_images_tagged`: True/False; an empty directory or tag raises ValueError."""
    if not config["directory"]:
        raise ValueError("are_all_images_tagged: directory is required")
    if not config["tag"]:
        raise ValueError("are_all_images_tagged: tag is required")
    route = _route(ctx, "are_all_images_tagged", "are_all_images_tagged")
    directory, tag = config["directory"], config["tag"]
    return _yes_no(ctx, "are_all_images_tagged", lambda: route(directory, tag))


@getter("vm_library_folders")
def get_vm_library_folders(ctx: GetterContext, config: dict[str, Any]) -> list[str] | None:
    """WAA `get_vm_library_folders`: the folder paths of the Windows library `library_name`
    (a list, in the server's order), or None when the library does not exist or the route
    fails. A config without library_name raises ValueError, as in WAA."""
    if "library_name" not in config:
        raise ValueError("vm_library_folders: library_name is required")
    route = _route(ctx, "library_folders", "vm_library_folders")
    name = config["library_name"]
    return soft_call(ctx, f"library_folders {name}", lambda: route(name), None)


# -- File Explorer checks built on /file, /list_directory and /execute ----------------------------------


def _desktop(ctx: GetterContext) -> str | None:
    return soft_call(ctx, "desktop_path", ctx.vm.desktop_path, None)


def _desktop_file_path(ctx: GetterContext, file_name: str) -> str:
    desktop = _desktop(ctx)
    if desktop is None:
        # WAA concatenates None + '\\' and fails with this TypeError.
        raise TypeError("the desktop path is unknown (/desktop_path failed), so WAA cannot build the file path")
    return desktop + "\\" + file_name


@getter("is_file_desktop")
def get_is_file_desktop(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_is_file_desktop`: the string "true" when Desktop\\<filename> can be read through
    /file (even an empty file), else "false"."""
    path = _desktop_file_path(ctx, config["filename"])
    content = soft_call(ctx, f"reading {path}", lambda: ctx.vm.get_file(path), None)
    return "true" if content is not None else "false"


@getter("is_file_saved_desktop")
def get_is_file_saved_desktop(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_is_file_saved_desktop`: "true" when Desktop\\<filename> exists and its text
    contains `textcontent` (a plain substring test), else "false".

    WAA reads the file as `requests`' response text: the server sends text files as UTF-8, and
    undecodable bytes become U+FFFD; line endings are kept as they are.
    """
    path = _desktop_file_path(ctx, config["filename"])
    content = soft_call(ctx, f"reading {path}", lambda: ctx.vm.get_file(path), None)
    if content is None:
        return "false"
    text = content.decode("utf-8", errors="replace")
    return "true" if config["textcontent"] in text else "false"


DOWNLOADS_DIR = "C:\\Users\\Docker\\Downloads"
OLD_DOWNLOADS_DIR = "C:\\Users\\Docker\\OldDownloads"


@getter("is_files_moved_downloads")
def get_is_files_moved_downloads(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_is_files_moved_downloads`: "true" when OldDownloads holds a folder `folder_name`
    (directly) containing an entry `file_name`, unless both names still occur in Downloads.

    Kept WAA quirks: "still in Downloads" is a substring test of both names against the JSON text
    of the Downloads tree (so a name inside another name, or in the folder's own name, counts,
    and non-ASCII names are JSON-escaped and never match); a missing Downloads folder is the text
    "null"; a missing OldDownloads folder (None) raises TypeError, as iterating None does in WAA.
    """
    file_name, folder_name = config["file_name"], config["folder_name"]
    downloads = soft_call(ctx, "list_directory Downloads", lambda: ctx.vm.list_directory(DOWNLOADS_DIR), None)
    downloads_text = json.dumps(downloads)
    old = soft_call(ctx, "list_directory OldDownloads", lambda: ctx.vm.list_directory(OLD_DOWNLOADS_DIR), None)
    if file_name in downloads_text and folder_name in downloads_text:
        return "false"
    if old is None:
        raise TypeError(f"is_files_moved_downloads: {OLD_DOWNLOADS_DIR} is not a directory on the VM (WAA iterates None)")
    for key in old:
        entries = old[key]
        if type(entries) is not list:
            continue
        for entry in entries:
            if entry["type"] == "directory" and entry["name"] == folder_name:
                if any(child["name"] == file_name for child in entry["children"]):
                    return "true"
    return "false"


@getter("is_file_hidden")
def get_is_file_hidden(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_is_file_hidden`: "true" when the file's name starts with '.' or it has the Windows
    hidden attribute, else "false". Asked with a Python one-liner on the VM; any failure (missing
    file, non-zero exit, unparseable output, failed /execute answer) is "false", as in WAA."""
    if not config or "file_path" not in config:
        return "false"
    path = config["file_path"]
    code = (
        f"import os; print(1 if os.path.basename(r'{path}').startswith('.') or "
        f"(os.name == 'nt' and bool(os.stat(r'{path}').st_file_attributes & 2)) else 0)"
    )
    answer = _run_python(ctx, code, "is_file_hidden")
    if answer["status"] != "success" or answer.get("returncode") != 0:
        return "false"
    try:
        flag = int(answer["output"].strip())
    except ValueError:
        return "false"
    return "true" if flag == 1 else "false"


@getter("vm_active_window_title")
def get_vm_active_window_title(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_vm_active_window_title`: pyautogui's active window title (stdout, stripped; the
    string "None" when no window is active). A failed /execute answer raises KeyError, as in WAA."""
    answer = _run_python(ctx, "import pyautogui; print(pyautogui.getActiveWindowTitle())", "vm_active_window_title")
    return answer["output"].strip()


def png_names_script(file_path: str, folder_path: str) -> str:
    """The check `all_png_file_names` runs on the VM, observably the same as WAA's: it prints
    "File <file_path> does not exist" and stops, or three lines "File content: [...]",
    "PNG files: [...]", "Result: true|false" comparing the set of the text file's lines with the
    set of names in the folder ending in .png (any case). As in WAA, the existence test uses a
    plain string literal and the reads use raw ones; a folder that cannot be listed makes the
    script fail before printing anything."""
    return (
        "\nimport os\n"
        "from sys import exit\n"
        f"if not os.path.exists('{file_path}'):\n"
        f"    print(\"File {file_path} does not exist\")\n"
        "    exit()\n"
        f"with open(r'{file_path}', 'r') as handle:\n"
        "    listed = set(handle.read().splitlines())\n"
        f"pngs = set(name for name in os.listdir(r'{folder_path}') if name.lower().endswith('.png'))\n"
        "print('File content:', repr(list(listed)))\n"
        "print('PNG files:', repr(list(pngs)))\n"
        "print('Result:', 'true' if listed == pngs else 'false')\n"
    )


@getter("all_png_file_names")
def get_all_png_file_names(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_all_png_file_names`: "true"/"false" whether the text file `file_path` lists
    exactly the .png files of `folder_path` (one name per line, order and duplicates ignored).

    "false" when /execute reports no success or the text file does not exist. Output that is not
    the three expected lines raises (IndexError/SyntaxError/ValueError), as WAA's parsing does.
    Deviation in safety only: WAA `eval`s the two listed sets it prints (for logging); we parse
    them with `ast.literal_eval`, which accepts everything the script prints.
    """
    file_path, folder_path = config["file_path"], config["folder_path"]
    answer = _run_python(ctx, png_names_script(file_path, folder_path), "all_png_file_names")
    if answer["status"] != "success":
        return "false"
    lines = answer["output"].strip().split("\n")
    if lines[0] == f"File {file_path} does not exist":
        return "false"
    ast.literal_eval(lines[0].split(":", 1)[1])  # raises where WAA's eval raises
    ast.literal_eval(lines[1].split(":", 1)[1])
    return lines[2].split(":", 1)[1].strip()


@getter("is_all_docx_in_archive")
def get_is_all_docx_in_archive(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_is_all_docx_in_archive`: "true" when `folder_path` exists, has a subfolder
    "Archive" whose files all end in .docx (any case), and no .docx file is left directly in
    `folder_path`; otherwise "false".

    Kept WAA quirks: "Archive" is joined with '/' (WAA's Linux host joins with posixpath); an
    empty Archive folder is "false" (its listing is one empty name, which is no .docx); paths are
    embedded in plain string literals on the VM. A failed /execute answer raises KeyError.
    """
    folder_path = config["folder_path"]
    if not folder_path:
        return "false"
    exists = _run_python(ctx, f"import os; print(os.path.exists('{folder_path}'))", "is_all_docx_in_archive")
    if exists["output"].strip().lower() != "true":
        return "false"
    archive = posixpath.join(folder_path, "Archive")
    archive_exists = _run_python(ctx, f"import os; print(os.path.exists('{archive}'))", "is_all_docx_in_archive")
    if archive_exists["output"].strip().lower() != "true":
        return "false"
    archive_files = _run_python(ctx, _list_files_code(archive), "is_all_docx_in_archive")["output"].strip().split(",")
    if not all(name.lower().endswith(".docx") for name in archive_files):
        return "false"
    folder_files = _run_python(ctx, _list_files_code(folder_path), "is_all_docx_in_archive")["output"].strip().split(",")
    if any(name.lower().endswith(".docx") for name in folder_files):
        return "false"
    return "true"


def _list_files_code(folder: str) -> str:
    """One line of Python printing the comma-joined names of the regular files in `folder`."""
    return (
        f"import os; print(','.join([f for f in os.listdir('{folder}') "
        f"if os.path.isfile(os.path.join('{folder}', f))]))"
    )


@getter("zipped_folder_in_desktop")
def get_zipped_folder_in_desktop(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_zipped_folder_in_desktop`: "true" when the 7-Zip archive at `filename` (a full VM
    path) opens with `password` and holds the file "OldProjects/example.txt", else "false".

    Kept WAA quirk: WAA means to answer "false" for an archive without a password, but py7zr's
    `needs_password()` is true whenever a password is *given* (always, in WAA's tasks), so an
    unprotected archive with the file also gives "true"; only a null `password` gives "false".

    A missing file, a file that is no 7z archive, or a wrong password raise (py7zr's errors), as in
    WAA. WAA reads every member with `readall()`, which py7zr 1.x no longer has; there we extract
    to a temporary directory instead, which decrypts and checks the same data. An archive over
    archive_limits' limits (what its header says it unpacks to) is an evaluation error, before
    anything is unpacked.
    """
    py7zr = require("py7zr", what="zipped_folder_in_desktop", packages="py7zr", extra="office")
    vm_path = config["filename"]
    content = soft_call(ctx, f"reading {vm_path}", lambda: ctx.vm.get_file(vm_path), None)
    if content is None:
        ctx.notes.append(f"zipped_folder_in_desktop: {vm_path} does not exist on the VM")
        content = b""  # WAA wraps None in BytesIO, i.e. an empty stream, which py7zr rejects
    with py7zr.SevenZipFile(io.BytesIO(content), mode="r", password=config["password"]) as archive:
        check_seven_zip(vm_path, archive, len(content))  # before anything is unpacked
        if not archive.needs_password():
            return "false"
        names = _seven_zip_member_names(archive)
    return "true" if "OldProjects/example.txt" in names else "false"


def _seven_zip_member_names(archive: Any) -> list[str]:
    if hasattr(archive, "readall"):  # py7zr < 1.0, as WAA uses it
        return list(archive.readall())
    with tempfile.TemporaryDirectory(prefix="waa-7z-") as target:
        archive.extractall(path=target)
        names = []
        for root, _dirs, files in os.walk(target):
            for name in files:
                names.append(os.path.relpath(os.path.join(root, name), target).replace(os.sep, "/"))
        return names


# -- Paint ------------------------------------------------------------------------------------------


def find_red_circle(image: bytes | None) -> bool | int:
    """WAA's `find_red_circle` test on a screenshot (PNG bytes): 0 (the int) for no bytes; False
    when no pixel is red (R 150-255, G and B 0-100); otherwise whether more than 80% of the
    square around the red pixels' centroid (half side = their mean distance to it, truncated) is
    white (all channels >= 200). Kept WAA quirk: a square reaching past the top/left edge is
    sliced with negative indices, as numpy does for WAA."""
    if not image:
        return 0
    np = require("numpy", what="is_red_circle_present_on_canvas", packages="numpy", extra="media")
    from PIL import Image

    pixels = np.array(Image.open(io.BytesIO(image)).convert("RGB"))
    red = ((pixels >= np.array([150, 0, 0])) & (pixels <= np.array([255, 100, 100]))).all(axis=-1)
    white = ((pixels >= np.array([200, 200, 200])) & (pixels <= np.array([255, 255, 255]))).all(axis=-1)
    rows, cols = np.where(red)
    if rows.size == 0:
        return False
    centre_x, centre_y = np.mean(cols), np.mean(rows)
    radius = int(np.mean(np.sqrt((cols - centre_x) ** 2 + (rows - centre_y) ** 2)))
    left, top = int(centre_x - radius), int(centre_y - radius)
    right, bottom = int(centre_x + radius), int(centre_y + radius)
    inside = white[top:bottom, left:right]
    if inside.size == 0:
        return False
    return bool(np.sum(inside) / inside.size > 0.8)


@getter("is_red_circle_present_on_canvas")
def get_is_red_circle_present_on_canvas(ctx: GetterContext, config: dict[str, Any]) -> bool | int:
    """WAA `get_is_red_circle_present_on_canvas`: `find_red_circle` on the VM file `filepath`
    (True/False; the int 0 when the file is missing or empty; False for an empty filepath)."""
    if not config["filepath"]:
        return False
    path = config["filepath"]
    return find_red_circle(soft_call(ctx, f"reading {path}", lambda: ctx.vm.get_file(path), None))


@getter("image_dimension_matches_input")
def get_image_dimension_matches_input(ctx: GetterContext, config: dict[str, Any]) -> bool:
    """WAA `get_image_dimension_matches_input`: True when the image at `filepath` is exactly
    `width` x `height` pixels (given as strings or numbers; compared as floats), else False;
    False when any of the three is empty. A missing file raises (Pillow cannot open None), as in
    WAA. The local copy is named after the path's last component (`local_name`)."""
    if not config["filepath"] or not config["width"] or not config["height"]:
        return False
    from PIL import Image

    path = config["filepath"]
    width, height = float(config["width"]), float(config["height"])
    local = get_vm_file(ctx, {"path": path, "dest": local_name(path)})
    with Image.open(local) as image:
        size = image.size
    return size[0] == width and size[1] == height


# -- Settings (registry and PowerShell through /execute) ------------------------------------------------

NIGHT_LIGHT_KEY = (
    r"HKCU:\Software\Microsoft\Windows\CurrentVersion\CloudStore\Store\DefaultAccount\Current"
    r"\default$windows.data.bluelightreduction.settings\windows.data.bluelightreduction.settings"
)
DESKTOP_KEY = r"HKCU:Control Panel\Desktop"
TIMEZONE_COMMAND = (
    "powershell -Command \"Get-TimeZone | Select-Object -Property DisplayName, StandardName | ConvertTo-Json\""
)


def clock_time(hour: int, minute: int) -> str:
    """WAA's `generate_time`: "HH:MM AM/PM" with WAA's quirk that 12 o'clock reads "00:MM PM"
    (and midnight "00:MM AM")."""
    if hour < 12:
        return f"{hour:02d}:{minute:02d} AM"
    return f"{hour - 12:02d}:{minute:02d} PM"


@getter("night_light_state")
def get_night_light_state(ctx: GetterContext, config: dict[str, Any]) -> list[Any] | bool:
    """WAA `get_night_light_state`: decodes the bluelightreduction 'Data' registry value, which
    PowerShell prints one byte (decimal) per line.

    Byte 24 == "1" means night light is on: then [True, start, end] when a schedule is set (byte 28,
    the start hour, is not 202), else [True]; off is False. Minutes follow an hour only when the
    byte after it is not '0' (WAA's marker test), which moves the end hour from index 33 to 35.
    Output too short, or a non-number where a number is read, raises (IndexError/ValueError);
    a failed /execute answer raises TypeError: all as in WAA.
    """
    answer = _registry_value(ctx, NIGHT_LIGHT_KEY, "Data")
    if answer is None:
        raise TypeError("night_light_state: /execute failed for the registry read")
    data = answer["output"].split("\n")
    if data[24] != "1":
        return False
    start_hour = int(data[28])
    if start_hour == 202:
        return [True]
    start_minute = int(data[30] if data[29] != "0" else "0")
    end_index = 33 if start_minute == 0 else 35
    end_hour = int(data[end_index])
    end_minute = int(data[end_index + 2] if data[end_index + 1] != "0" else "0")
    return [True, clock_time(start_hour, start_minute), clock_time(end_hour, end_minute)]


@getter("system_timezone")
def get_system_timezone(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_system_timezone`: the time zone's DisplayName, e.g. "(UTC-08:00) Pacific Time (US &
    Canada)", read with PowerShell's Get-TimeZone as JSON. When DisplayName or StandardName is
    empty: "Unable to get time zone"; when anything fails (failed /execute, output that is not a
    JSON object): "Error getting the timezone". These strings are WAA's."""
    answer = _execute_as_dict(ctx, TIMEZONE_COMMAND, False, "system_timezone")  # a connection error propagates
    try:
        data = json.loads(answer["output"])  # type: ignore[index]
        display_name = data.get("DisplayName", None)
        standard_name = data.get("StandardName", None)
        if display_name and standard_name:
            return display_name
    except Exception:  # noqa: BLE001 - WAA turns every failure into this string
        return "Error getting the timezone"
    return "Unable to get time zone"


@getter("desktop_background")
def get_desktop_background(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_desktop_background`: the *string* "True" when the WallPaper registry value is
    empty (no picture: a solid colour background), else "False". A failed /execute answer raises
    TypeError, as in WAA."""
    answer = _registry_value(ctx, DESKTOP_KEY, "WallPaper")
    if answer is None:
        raise TypeError("desktop_background: /execute failed for the registry read")
    return "True" if answer["output"].replace("\n", "") == "" else "False"


# -- VLC and the wallpaper (files copied into the cache dir) ----------------------------------------------

VLC_CONFIG_PATH = "C:\\Users\\Docker\\AppData\\Roaming\\vlc\\vlcrc"


def _write_cache_file(ctx: GetterContext, dest: str, content: bytes | None, what: str) -> str:
    local = cache_path(ctx, dest, f"{what} dest")
    if content is None:
        # WAA writes None into the file and fails with this TypeError (the getter scores 0).
        raise TypeError(f"{what}: the VM returned no content, so WAA cannot write {dest}")
    ctx.cache_dir.mkdir(parents=True, exist_ok=True)
    with open(local, "wb") as out:
        out.write(content)
    return local


@getter("vlc_config")
def get_vlc_config(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_vlc_config` (Windows branch): copy C:\\Users\\Docker\\AppData\\Roaming\\vlc\\vlcrc
    to `dest` in the cache dir and return the local path. A missing vlcrc raises TypeError, as in
    WAA. (WAA first asks the VM for its platform; a WAA VM is always Windows, so we do not.)"""
    content = soft_call(ctx, f"reading {VLC_CONFIG_PATH}", lambda: ctx.vm.get_file(VLC_CONFIG_PATH), None)
    return _write_cache_file(ctx, config["dest"], content, "vlc_config")


@getter("vm_wallpaper")
def get_vm_wallpaper(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_vm_wallpaper` (info.py): the wallpaper image (POST /wallpaper) saved as `dest` in
    the cache dir; the local path. No wallpaper (any non-200 answer) raises TypeError, as in WAA."""
    route = _route(ctx, "wallpaper", "vm_wallpaper")
    content = soft_call(ctx, "wallpaper", route, None)
    return _write_cache_file(ctx, config["dest"], content, "vm_wallpaper")
