"""The WAA HTTP API over the real desktop (routes, payloads, status codes and error shapes of
WAA's server, notes/waa.md).

Kept from WAA: every uncaught exception, unknown route, wrong method or malformed JSON body
answers 500 ``{"status": "error", "message": ...}``; the yes/no routes answer 200 or 400;
``/execute`` answers 200 with the return code of a failing command and 500 past its 120 s
timeout; ``/setup/launch`` starts anything through the shell and answers 200 at once;
``/execute_windows`` needs ``/update_computer`` first; ``/revert_to_snapshot`` answers 501.

Where this desktop differs, on purpose (docs/desktop.md):

* ``/platform`` says ``Linux``; paths of the Windows profile ``C:\\Users\\Docker`` are the user's
  home (paths.py); ``/accessibility`` is AT-SPI's tree for both backends (tree.py);
* ``/execute_windows`` runs only ``computer.*`` calls with literal arguments (computer.py);
* ``/setup/open_file`` waits for the file's window (a new window, or one titled with the file's
  name: a new tab) and then for its program to fall idle (no CPU for ``OPEN_QUIET_SECONDS``),
  at most ``OPEN_WAIT_SECONDS`` in all, instead of WAA's fixed 5 s;
  ``/setup/activate_window`` waits up to ``ACTIVATE_WAIT_SECONDS`` for a matching window (a
  program launched just before), raises it in both modes (WAA's non-strict mode only checks
  that it exists) and waits (as long again at most) for its program to fall idle; ``/cursor_position`` answers the pointer's position (WAA's handler always
  fails);
* ``/screenshot`` has no pointer drawn in (WAA pastes a cursor image);
* routes that need Windows (``/library_folders``, clock and image-tag checks, recording,
  wallpaper changes, ``/terminal``) answer 500 saying this desktop does not have them;
* ``GET /desktop/info`` says what this server is (this product's addition).
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from flask import Flask, Response, jsonify, request

from . import LABEL, commands, computer as computer_code, tree
from .display import Display, wait_idle
from .paths import PathRefused, local_path

# How long /setup/open_file and /setup/activate_window wait for a window: under the client's
# 60 s deadline for open_file (adapters/waa/client.py), long enough for LibreOffice under TCG.
OPEN_WAIT_SECONDS = 45.0
ACTIVATE_WAIT_SECONDS = 20.0
OPEN_QUIET_SECONDS = 1.5
HUMAN_INPUT = "Question: No question asked yet\nAnswer: No answer given yet"


class NotOnThisDesktop(RuntimeError):
    """A WAA route whose work needs Windows."""


class Session:
    """What the routes share: the display, the session's environment, the computer object."""

    def __init__(self, display: Display, env: dict[str, str], home: str) -> None:
        self.display = display
        self.env = env
        self.home = home
        self.computer: computer_code.Computer | None = None
        self.lock = threading.Lock()  # one computer.* action at a time: keys from two requests must not mix
        self.tree_lock = threading.Lock()
        self._pyautogui: Any = None

    @property
    def pyautogui(self) -> Any:
        if self._pyautogui is None:
            os.environ.setdefault("DISPLAY", self.display.name)
            import pyautogui  # the real one, on this session's X display

            self._pyautogui = pyautogui
        return self._pyautogui

    def path(self, given: Any) -> str:
        return local_path(given if isinstance(given, str) else "", self.home)


def _json() -> dict[str, Any]:
    body = request.get_json(force=True)  # a malformed body raises: 500, as on WAA
    if not isinstance(body, dict):
        raise TypeError("the request body must be a JSON object")
    return body


def create_app(session: Session) -> Flask:  # noqa: C901 - one function per route, as WAA's server
    """The Flask app serving WAA's API for one desktop session."""
    app = Flask("waa_desktop")

    @app.errorhandler(Exception)
    def failed(exc: Exception):  # WAA's server turns everything into 500 JSON
        app.logger.debug("request failed: %s", traceback.format_exc())
        return jsonify({"status": "error", "message": str(exc) or type(exc).__name__}), 500

    # -- observation ------------------------------------------------------------------------
    @app.route("/probe", methods=["GET"])
    def probe():
        return jsonify({"status": "Probe successful", "message": "Service is operational"}), 200

    @app.route("/desktop/info", methods=["GET"])
    def info():
        width, height = session.display.size()
        return jsonify({"desktop": LABEL, "simulation": False, "windows": False, "platform": "Linux",
                        "width": width, "height": height, "display": session.display.name, "home": session.home})

    @app.route("/platform", methods=["GET"])
    def platform():
        return "Linux"

    @app.route("/screenshot", methods=["GET"])
    def screenshot():
        return Response(session.display.png(), mimetype="image/png")

    @app.route("/accessibility", methods=["GET"])
    def accessibility():
        backend = request.args.get("backend", "win32")
        if backend not in {"win32", "uia"}:
            return "Invalid backend specified", 400
        with session.tree_lock:  # libatspi is not thread-safe
            return jsonify({"AT": tree.build_xml()})

    @app.route("/obs_winagent", methods=["GET"])
    def obs_winagent():
        active = session.display.active()
        width, height = session.display.size()
        rect = list(active.rect) if active is not None else [0, 0, width, height]
        image = base64.b64encode(session.display.png(tuple(rect))).decode("ascii")  # type: ignore[arg-type]
        names = [w.title for w in reversed(session.display.windows()) if w.title and not w.hidden]
        return jsonify({"image": image, "window_title": active.title if active is not None else "Desktop",
                        "rect": rect, "window_names_str": "\n".join(names),
                        "computer_clipboard": session.display.clipboard(), "human_input": HUMAN_INPUT,
                        "status": "success"})

    @app.route("/screen_size", methods=["POST"])
    def screen_size():
        width, height = session.display.size()
        return jsonify({"width": width, "height": height})

    @app.route("/desktop_path", methods=["POST"])
    def desktop_path():
        return jsonify(desktop_path=os.path.join(session.home, "Desktop"))

    @app.route("/documents_path", methods=["POST"])
    def documents_path():
        return jsonify(documents_path=os.path.join(session.home, "Documents"))

    @app.route("/cursor_position", methods=["GET"])
    def cursor_position():
        x, y = session.pyautogui.position()
        return jsonify([int(x), int(y)])

    @app.route("/wallpaper", methods=["POST"])
    def wallpaper():
        raise NotOnThisDesktop("404 Not Found: Wallpaper file not found (this desktop has no wallpaper)")

    # -- actions ----------------------------------------------------------------------------
    @app.route("/execute", methods=["POST"])
    @app.route("/setup/execute", methods=["POST"])
    def execute():
        data = _json()
        shell = bool(data.get("shell", False))
        command = data.get("command", "" if shell else [])
        return jsonify(commands.execute(command, shell, session.env))  # concurrent, as on WAA

    @app.route("/execute_windows", methods=["POST"])
    def execute_windows():
        code = _json().get("command")
        if not isinstance(code, str):
            raise TypeError("exec() arg 1 must be a string, bytes or code object")
        with session.lock:
            computer_code.run(code, session.computer)
        return jsonify({"status": "success"})

    @app.route("/update_computer", methods=["POST"])
    def update_computer():
        data = _json()
        from PIL import Image

        Image.open(io.BytesIO(base64.b64decode(data.get("screenshot")))).load()  # as WAA: a broken one fails
        marks = computer_code.Marks(
            rects=[list(map(float, r)) for r in data.get("rects") or []],
            window_rect=list(map(float, data.get("window_rect") or [0, 0])), scale=list(data.get("scale") or [1, 1]),
            clipboard_content=data.get("clipboard_content"), swap_ctrl_alt=bool(data.get("swap_ctrl_alt", False)))
        session.computer = computer_code.Computer(marks, session.display.set_clipboard, session.pyautogui)
        return jsonify(success=True)

    # -- files ------------------------------------------------------------------------------
    @app.route("/file", methods=["POST"])
    def get_file():
        if "file_path" not in request.form:
            return jsonify({"error": "file_path is required"}), 400
        try:
            path = session.path(request.form["file_path"])
        except PathRefused:
            return jsonify({"error": "File not found"}), 404
        if not os.path.exists(path):
            return jsonify({"error": "File not found"}), 404
        with open(path, "rb") as handle:  # a folder raises IsADirectoryError: 500, as on WAA
            data = handle.read()
        return Response(data, mimetype="application/octet-stream",
                        headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(os.path.basename(path))}"})

    @app.route("/list_directory", methods=["POST"])
    def list_directory():
        data = _json()
        if "path" not in data:
            return jsonify(error="Missing 'path' parameter"), 400
        try:
            path = session.path(data["path"])
        except PathRefused:
            path = ""
        if not path or not os.path.isdir(path):
            return jsonify(error="The provided path is not a directory"), 400
        return jsonify(directory_tree=_tree(path, os.path.basename(path) or path))

    def _exists(kind: str):
        data = _json()
        key = "folder_name" if kind == "folder" else "file_name"
        if key not in data:
            return jsonify({"error": f"{key} required"}), 400
        if "path" not in data:
            return jsonify({"error": "path required"}), 400
        name, folder = str(data[key]), data["path"]
        try:
            full = os.path.join(session.path(folder), name)
        except PathRefused:
            full = ""
        hit = bool(full) and (os.path.isdir(full) if kind == "folder" else os.path.isfile(full))
        label = "Folder" if kind == "folder" else "File"
        if hit:
            return jsonify({"status": "success", "message": f"{label} {name} exists in {folder}."}), 200
        return jsonify({"status": "error", "message": f"{label} {name} does not exist in {folder}."}), 400

    @app.route("/folder_exists", methods=["POST"])
    def folder_exists():
        return _exists("folder")

    @app.route("/file_exists", methods=["POST"])
    def file_exists():
        return _exists("file")

    # -- setup ------------------------------------------------------------------------------
    @app.route("/setup/launch", methods=["POST"])
    def setup_launch():
        command = _json().get("command", "")
        commands.launch(command, session.env)
        return f"{command} launched successfully"

    @app.route("/setup/open_file", methods=["POST"])
    def setup_open_file():
        given = _json().get("path")
        if not given:
            return "Path not supplied!", 400
        try:
            path = session.path(given)
        except PathRefused:
            return f"File not found: {given}", 404
        if not os.path.exists(path):
            return f"File not found: {given}", 404
        before = {(w.xid, w.title) for w in session.display.windows()}
        name = os.path.basename(path.rstrip("/")) or path
        commands.launch(commands.opener(path, os.path.isdir(path)), session.env)
        deadline = time.monotonic() + OPEN_WAIT_SECONDS
        while time.monotonic() < deadline:
            # A new window, or a window (a new tab of a running editor) now titled with the file;
            # then its program's CPU falling quiet: under TCG, LibreOffice shows its window tens
            # of seconds before the file is loaded into it, and keys sent meanwhile are lost.
            windows = {(w.xid, w.title): w for w in session.display.windows()}
            opened = [w for key, w in windows.items() if key not in before
                      and (key[0] not in {x for x, _ in before} or name in key[1])]
            if opened:
                wait_idle(opened[0].pid, OPEN_QUIET_SECONDS, deadline)
                return "File opened successfully"
            time.sleep(0.2)
        raise TimeoutError(f"no window opened for {given} within {OPEN_WAIT_SECONDS:g} s")

    @app.route("/setup/activate_window", methods=["POST"])
    def setup_activate_window():
        data = _json()
        name = data.get("window_name")
        if not name:
            return "window_name required", 400
        found = session.display.find(str(name), by_class=bool(data.get("by_class", False)))
        deadline = time.monotonic() + ACTIVATE_WAIT_SECONDS
        while not found and time.monotonic() < deadline:  # a program launched just before
            time.sleep(0.25)
            found = session.display.find(str(name), by_class=bool(data.get("by_class", False)))
        if not found:
            return f"Window {name} not found (empty results)", 404
        active = session.display.activate(found[0])
        # As after opening a file: a window just launched is drawn before its program is ready.
        wait_idle(found[0].pid, OPEN_QUIET_SECONDS, time.monotonic() + ACTIVATE_WAIT_SECONDS)
        if data.get("strict", False) and not active:
            raise AssertionError(f"window {found[0].title!r} did not become active")
        return "Window activated successfully", 200

    @app.route("/setup/close_window", methods=["POST"])
    def setup_close_window():
        data = _json()
        if "window_name" not in data:
            return "window_name required", 400
        name = str(data["window_name"])
        found = session.display.find(name, by_class=bool(data.get("by_class", False)))
        if not found:
            return f"Window {name} not found (empty results)", 404
        session.display.close(found[0])
        return "Window closed successfully.", 200

    @app.route("/setup/close_all", methods=["POST"])
    def setup_close_all():
        for window in session.display.windows():
            session.display.close(window)
        return "All windows closed successfully.", 200

    @app.route("/setup/clear_task_files", methods=["POST"])
    def setup_clear_task_files():
        folder = os.path.join(session.home, "Downloads")
        removed, failed = [], []
        for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            full = os.path.join(folder, entry)
            try:
                os.remove(full)
                removed.append(full)
            except OSError:
                failed.append(full)  # folders are left, as WAA's os.remove leaves them
        if failed:
            return f"Failed to remove ({failed}) from {folder!r}.", 200
        if removed:
            return f"All task files ({removed}) cleared successfully from {folder!r}.", 200
        return f"No task files to clear from {folder!r}.", 200

    @app.route("/setup/upload", methods=["POST"])
    def setup_upload():
        if "file_path" not in request.form or "file_data" not in request.files:
            return jsonify({"error": "file_path and file_data are required"}), 400
        path = session.path(request.form["file_path"])
        request.files["file_data"].save(path)  # a missing folder raises, as WAA's save does
        return "File Uploaded"

    @app.route("/setup/create_folder", methods=["POST"])
    def setup_create_folder():
        data = _json()
        if "path" not in data:
            return jsonify({"error": "path required"}), 400
        given = data["path"]
        try:
            path = session.path(given)
            if os.path.exists(path):
                return jsonify({"status": "success", "message": f"{given} already exists."}), 200
            os.makedirs(path)
        except (OSError, PathRefused):
            return jsonify({"status": "error", "message": f"Failed to create {given}."}), 400
        return jsonify({"status": "success", "message": f"{given} created."}), 200

    @app.route("/setup/create_file", methods=["POST"])
    def setup_create_file():
        data = _json()
        if "path" not in data:
            return jsonify({"error": "path required"}), 400
        given = str(data["path"])
        try:
            path = session.path(given if "/" in given or "\\" in given or given.startswith("~")
                                else os.path.join(session.home, "Desktop", given))
            if os.path.isdir(path):
                return jsonify({"status": "error", "message": "path is not a file"}), 400
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(str(data.get("content", "")))
        except (OSError, PathRefused):
            return jsonify({"status": "error", "message": f"Failed to create {given}."}), 400
        return jsonify({"status": "success", "message": f"{given} created."}), 200

    @app.route("/setup/recycle", methods=["POST"])
    def setup_recycle():
        data = _json()
        if "path" not in data:
            return jsonify(error="Missing 'path' parameter"), 400
        given = data["path"]
        try:
            _trash(session.path(given), session.home)
        except (OSError, PathRefused):
            return jsonify({"status": "error", "message": f"Failed to recycle {given}"}), 400
        return jsonify({"status": "success", "message": f"{given} recycled"}), 200

    @app.route("/window_size", methods=["POST"])
    def window_size():
        name = request.form.get("app_class_name", "")
        found = session.display.find(name, by_class=True)
        if not found:
            raise NotOnThisDesktop(f"no window of class {name!r}")
        left, top, right, bottom = found[0].rect
        return jsonify({"width": right - left, "height": bottom - top})

    @app.route("/revert_to_snapshot", methods=["POST"])
    def revert_to_snapshot():
        return jsonify({"error": "Restore snapshot no implemented"}), 501

    for route in ("/library_folders", "/is_details_view", "/are_files_sorted_by_modified_time",
                  "/is_directory_read_only_for_user", "/are_all_images_tagged", "/check_if_timer_started",
                  "/check_if_world_clock_exists", "/start_recording", "/end_recording", "/setup/change_wallpaper",
                  "/setup/download_file", "/save_state", "/shutdown"):
        def unsupported(route: str = route):
            raise NotOnThisDesktop(f"{route} is not available on this Linux desktop")
        app.add_url_rule(route, f"unsupported_{route}", unsupported, methods=["POST"])

    @app.route("/terminal", methods=["GET"])
    def terminal():
        raise NotOnThisDesktop("/terminal is not available on this Linux desktop (it has no terminal window)")

    return app


def _tree(path: str, name: str) -> dict[str, Any]:
    if not os.path.isdir(path):
        return {"type": "file", "name": name}
    children = [_tree(os.path.join(path, entry), entry) for entry in sorted(os.listdir(path))]
    return {"type": "directory", "name": name, "children": children}


def _trash(path: str, home: str) -> None:
    """Move `path` into the user's trash (the freedesktop.org layout the file manager reads)."""
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    trash = Path(home) / ".local/share/Trash"
    (trash / "files").mkdir(parents=True, exist_ok=True)
    (trash / "info").mkdir(parents=True, exist_ok=True)
    name, number = os.path.basename(path), 1
    while (trash / "files" / name).exists():
        number += 1
        name = f"{os.path.basename(path)}.{number}"
    (trash / "info" / f"{name}.trashinfo").write_text(
        f"[Trash Info]\nPath={quote(path)}\nDeletionDate={datetime.now().strftime('%Y-%m-%dT%H:%M:%S')}\n")
    shutil.move(path, trash / "files" / name)
