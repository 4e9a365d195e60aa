"""The WAA server's HTTP API (``vm/setup/server/main.py``) served from the simulation.

Same routes, payloads, status codes and quirks as the real server, including: every uncaught
exception, unknown route, wrong method or malformed JSON answers 500
``{"status": "error", "message": ...}``; yes/no routes answer by status code (200 yes, 400 no);
``/setup/launch`` answers 200 even for unknown programs; ``/cursor_position`` always fails with
500 and ``/wallpaper`` answers 500 when the wallpaper file is missing. Deviations: ``/setup/open_file``
does not sleep 5 s after opening (the simulated app is ready at once); ``/setup/activate_window``
with strict=true raises the window without the real minimise/restore pauses; routes that need
UI Automation we do not model (``/are_files_sorted_by_modified_time``, ``/is_directory_read_only_for_user``,
``/are_all_images_tagged``, clock checks, recording) answer 500 saying so.

``/accessibility`` answers 500 with lxml's "All strings must be XML compatible ..." while any
window title or text holds a control character (the real server serializes with lxml), and
``/execute`` of ``tasklist /fo csv /nh`` lists the simulated processes (:mod:`.processes`).

Simulation-only routes, under ``/sim/``: ``POST /sim/snapshot/save {"name"}``,
``POST /sim/snapshot/load {"name"}`` (404 for an unknown name), ``GET /sim/info``,
``POST /sim/restart`` (the WAA server process restarts: ``computer`` is None again until the next
``/update_computer``) and ``GET|POST /sim/faults`` (injected server faults, :mod:`.faults`).

Chrome DevTools stand-in: WAA's VM exposes Chrome's debugging port (9222); the simulation has no
browser, so ``/json``, ``/json/list``, ``/json/version``, ``/json/protocol``, ``/json/new``,
``/json/close/<id>`` and ``/json/activate/<id>`` answer 501 with :data:`DEVTOOLS_REFUSAL`, and
``/sim/info`` says ``"devtools": false``.

Quirks mode (:mod:`.quirks`) adds the real server's slowness: readiness delay, slow
``/accessibility``, delayed ``/setup/launch`` windows, the fail-safe in ``/execute_windows``, a
screen and tree that repaint late after actions, strict activations that fail, live regions
(a blinking caret, a turning ring, a ticking clock) and Notepad's save prompt on close.

With a slow repaint (quirks' ``repaint_delay``), every ``/screenshot`` PNG carries two tEXt chunks
no pixel comparison sees: ``sim-actions-run`` (actions run so far) and ``sim-actions-shown`` (how
many of them the frame shows; fewer while the repaint is pending), so a test can tell a stale
observation from a fresh one.

``/execute`` refuses a command line over Windows' 32,766 characters and stops a program past its
120 s timeout, as the real server does on Windows (:mod:`.environment`).
"""

from __future__ import annotations

import base64
import io
import ntpath
import time
import traceback
from typing import Any

from flask import Flask, Response, jsonify, request

from . import SIMULATION_LABEL, actioncode
from .environment import SimEnvironment
from .faults import FaultSpecError
from .filesystem import USER_HOME, PathError, parse_winpath
from .launch import launch, open_path
from .render import png_bytes, render


DEVTOOLS_REFUSAL = {"status": "error",
                    "message": "no browser in the WAA simulation: the Chrome DevTools endpoint is not available"}


class SimulationUnsupported(RuntimeError):
    """A route whose real implementation needs Windows internals we do not simulate."""


def create_app(env: SimEnvironment) -> Flask:
    """The Flask app serving the WAA API for one simulated environment."""
    app = Flask("waa_simulation")
    lock = env.lock

    @app.errorhandler(Exception)
    def handle_exception(e: Exception):  # the real server turns *everything* into 500 JSON
        app.logger.debug("request failed: %s", traceback.format_exc())
        return jsonify({"status": "error", "message": str(e)}), 500

    @app.before_request
    def not_ready_yet():
        # Quirks mode, before the readiness delay is over. The simulation's own HTTP server
        # (__main__) resets these connections before they get here; this 503 with an empty body
        # is the fallback for apps served any other way.
        if not env.is_ready() and not request.path.startswith("/sim/"):
            return Response(b"", status=503)
        return None

    # -- observation -------------------------------------------------------------------
    @app.route("/probe", methods=["GET"])
    def probe():
        return jsonify({"status": "Probe successful", "message": "Service is operational"}), 200

    @app.route("/platform", methods=["GET"])
    def platform():
        return "Windows"

    @app.route("/screenshot", methods=["GET"])
    def screenshot():
        with lock:
            img = render(env.shown_desk(), live_at=env.live_at())
            label = ({"sim-actions-shown": str(env.shown_actions()), "sim-actions-run": str(env.actions_run)}
                     if env.quirks.repaint_delay > 0 else None)
        return Response(png_bytes(img, label), mimetype="image/png")

    @app.route("/accessibility", methods=["GET"])
    def accessibility():
        from .accessibility import build_xml

        backend = request.args.get("backend", "win32")
        if backend not in {"win32", "uia"}:
            return "Invalid backend specified", 400
        if env.quirks.accessibility_delay > 0:
            time.sleep(env.quirks.accessibility_delay)  # the real tree walk is slow; lock not held
        with lock:
            xml = build_xml(env.shown_desk(), backend)
        return jsonify({"AT": xml})

    @app.route("/obs_winagent", methods=["GET"])
    def obs_winagent():
        with lock:
            desk = env.shown_desk()
            img = render(desk, live_at=env.live_at())
            win = desk.focused_window()
            if win is None:
                rect: list[int] = [0, 0, desk.width, desk.height]
                title = "Desktop"
            else:
                rect = list(win.rect)
                title = win.title
                img = img.crop(tuple(max(0, v) for v in win.rect))
            names = [w.title for w in desk.windows if not w.minimized and w.title] + ["Program Manager"]
            clip = env.computer.clipboard_content if env.computer is not None else None
        b64 = base64.b64encode(png_bytes(img)).decode("ascii")
        return jsonify({"image": b64, "window_title": title, "rect": rect, "window_names_str": "\n".join(names),
                        "computer_clipboard": clip,
                        "human_input": "Question: No question asked yet\nAnswer: No answer given yet",
                        "status": "success", "simulation": True})

    @app.route("/screen_size", methods=["POST"])
    def screen_size():
        return jsonify({"width": env.desk.width, "height": env.desk.height})

    @app.route("/desktop_path", methods=["POST"])
    def desktop_path():
        return jsonify(desktop_path=f"{USER_HOME}\\Desktop")

    @app.route("/documents_path", methods=["POST"])
    def documents_path():
        return jsonify(documents_path=f"{USER_HOME}\\Documents")

    @app.route("/cursor_position", methods=["GET"])
    def cursor_position():
        # The real handler returns a bare (x, y) tuple, which Flask rejects: always a 500.
        raise TypeError("The view function did not return a valid response tuple. The tuple must have the form "
                        "(body, status, headers), (body, status), or (body, headers).")

    @app.route("/wallpaper", methods=["POST"])
    def wallpaper():
        with lock:
            path = env.desk.registry.get(r"HKCU\Control Panel\Desktop", "WallPaper")
            if not path:
                raise RuntimeError("404 Not Found: Wallpaper file not found")
            try:
                data = env.fs.read_bytes(str(path))
            except (OSError, PathError):
                raise RuntimeError("500 Internal Server Error: Unable to serve the wallpaper file") from None
        return Response(data, mimetype="image/png")

    # -- actions -----------------------------------------------------------------------
    @app.route("/execute", methods=["POST"])
    @app.route("/setup/execute", methods=["POST"])
    def execute():
        data = request.json
        shell = data.get("shell", False)
        command = data.get("command", "" if shell else [])
        return jsonify(env.execute(command, bool(shell)))

    @app.route("/execute_windows", methods=["POST"])
    def execute_windows():
        data = request.get_json()
        command = data.get("command")
        try:
            if not isinstance(command, str):
                raise actioncode.ActionError("TypeError", "exec() arg 1 must be a string, bytes or code object")
            out = env.execute_windows(command)
            if "error" in out.lower():  # the real server fails when the code printed "error"
                raise actioncode.ActionError("Exception", out)
            return jsonify({"status": "success"})
        except actioncode.ActionError as exc:
            return jsonify({"status": "error", "message": exc.message}), 500

    @app.route("/update_computer", methods=["POST"])
    def update_computer():
        data = request.json
        rects = data.get("rects")
        window_rect = data.get("window_rect")
        screenshot = data.get("screenshot")
        # The real server decodes the screenshot with PIL; a missing or broken one fails the same way.
        from PIL import Image

        Image.open(io.BytesIO(base64.b64decode(screenshot))).load()
        scale = data.get("scale") or [1.0, 1.0]
        with lock:
            env.computer = actioncode.ComputerState(
                rects=rects, window_rect=window_rect, scale=list(scale),
                clipboard_content=data.get("clipboard_content"), swap_ctrl_alt=bool(data.get("swap_ctrl_alt", False)))
        return jsonify(success=True)

    # -- files -------------------------------------------------------------------------
    @app.route("/file", methods=["POST"])
    def get_file():
        if "file_path" not in request.form:
            return jsonify({"error": "file_path is required"}), 400
        path = request.form["file_path"]
        with lock:
            try:
                if not env.fs.exists(path):
                    return jsonify({"error": "File not found"}), 404
            except PathError:
                return jsonify({"error": "File not found"}), 404
            if env.fs.is_dir(path):
                raise IsADirectoryError(f"[Errno 13] Permission denied: '{path}'")
            data = env.fs.read_bytes(path)
        name = ntpath.basename(path.replace("/", "\\"))
        return Response(data, mimetype="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @app.route("/list_directory", methods=["POST"])
    def list_directory():
        data = request.get_json()
        if "path" not in data:
            return jsonify(error="Missing 'path' parameter"), 400
        path = data["path"]
        with lock:
            try:
                ok = env.fs.is_dir(path)
            except PathError:
                ok = False
            if not ok:
                return jsonify(error="The provided path is not a directory"), 400
            tree = env.fs.tree(path, ntpath.basename(path))
        return jsonify(directory_tree=tree)

    def _exists(kind: str):
        data = request.json
        key = "folder_name" if kind == "folder" else "file_name"
        if key not in data:
            return jsonify({"error": f"{key} required"}), 400
        if "path" not in data:
            return jsonify({"error": "path required"}), 400
        name, path = data[key], data["path"]
        full = ntpath.join(path, name)
        with lock:
            try:
                hit = env.fs.is_dir(full) if kind == "folder" else env.fs.is_file(full)
            except PathError:
                hit = False
        label = "Folder" if kind == "folder" else "File"
        if hit:
            return jsonify({"status": "success", "message": f"{label} {name} exists in {path}."}), 200
        return jsonify({"status": "error", "message": f"{label} {name} does not exist in {path}."}), 400

    @app.route("/folder_exists", methods=["POST"])
    def folder_exists():
        return _exists("folder")

    @app.route("/file_exists", methods=["POST"])
    def file_exists():
        return _exists("file")

    @app.route("/is_details_view", methods=["POST"])
    def is_details_view():
        data = request.json
        if "path" not in data:
            return jsonify({"error": "path is required"}), 400
        # The simulated Explorer only has one view, a plain list; it is never Details view.
        return jsonify({"status": "error", "message": "File Explorer is not in Details view", "is_details_view": False}), 400

    @app.route("/library_folders", methods=["POST"])
    def library_folders():
        data = request.json
        if "library_name" not in data:
            return jsonify({"error": "library_name is required"}), 400
        # Libraries are not simulated: report the library as missing, as the real route does for unknown ones.
        return jsonify({"error": f"{data['library_name']} does not exist"}), 400

    # -- setup -------------------------------------------------------------------------
    @app.route("/setup/launch", methods=["POST"])
    def setup_launch():
        data = request.json
        command = data.get("command", "")
        if env.quirks.launch_delay > 0:
            env.launch_later(command, env.quirks.launch_delay)  # Popen returns before the window opens
        else:
            with lock:
                launch(env.desk, command)
        return f"{command} launched successfully"

    @app.route("/setup/open_file", methods=["POST"])
    def setup_open_file():
        data = request.json
        path = data.get("path", None)
        if not path:
            return "Path not supplied!", 400
        with lock:
            try:
                exists = env.fs.exists(path)
            except PathError:
                exists = False
            if not exists:
                return f"File not found: {path}", 404
            open_path(env.desk, path)
        return "File opened successfully"

    @app.route("/setup/activate_window", methods=["POST"])
    def setup_activate_window():
        data = request.json
        name = data.get("window_name", None)
        if not name:
            return "window_name required", 400
        if data.get("by_class", False):
            return "Get window by class name is currently not supported on Windows.", 500
        with lock:
            wins = env.desk.find_windows(name)
            if not wins:
                return f"Window {name} not found (empty results)", 404
            if data.get("strict", False):
                if env.quirks.strict_activation_fails:
                    # The real handler minimises and restores the window, then `assert window.isActive`
                    # fails (Windows' foreground lock): a 500 with an empty message.
                    wins[0].minimized = False
                    raise AssertionError()
                env.desk.activate(wins[0])  # non-strict only checks existence, as in the real server
        return "Window activated successfully", 200

    @app.route("/setup/close_window", methods=["POST"])
    def setup_close_window():
        data = request.json
        if "window_name" not in data:
            return "window_name required", 400
        name = data["window_name"]
        if data.get("by_class", False):
            return "Get window by class name is not supported on Windows currently.", 500
        with lock:
            wins = env.desk.find_windows(name)
            if not wins:
                return f"Window {name} not found (empty results)", 404
            if data.get("strict", False):
                # Real server bug kept: strict mode compares a title with a window object, never matches.
                return f"Window {name} not found (strict mode).", 404
            wins[0].close(env.desk)
        return "Window closed successfully.", 200

    @app.route("/setup/close_all", methods=["POST"])
    def setup_close_all():
        # As WAA's: every window open now is asked to close (WM_CLOSE); an app may answer with a
        # prompt of its own (quirks' save_prompts), which opens after this pass and so stays.
        with lock:
            for w in list(env.desk.windows):
                if w in env.desk.windows:
                    w.close(env.desk)
        return "All windows closed successfully.", 200

    @app.route("/setup/clear_task_files", methods=["POST"])
    def setup_clear_task_files():
        folder = f"{USER_HOME}\\Downloads"
        removed, failed = [], []
        with lock:
            for name in env.fs.listdir(folder):
                full = f"{folder}\\{name}"
                if full.lower() == f"{folder}\\desktop.ini".lower():
                    continue
                try:
                    env.fs.remove_file(full)
                    removed.append(full)
                except OSError:
                    failed.append(full)  # folders cannot be os.remove()d, as on the real VM
        if failed and removed:
            return f"Failed to remove ({failed}) but sucessfully cleared ({removed}) from {folder!r}.", 200
        if failed:
            return f"Failed to remove ({failed}) from {folder!r}.", 200
        if removed:
            return f"All task files ({removed}) cleared successfully from {folder!r}.", 200
        return f"No task files to clear from {folder!r}.", 200

    @app.route("/setup/upload", methods=["POST"])
    def setup_upload():
        if "file_path" in request.form and "file_data" in request.files:
            data = request.files["file_data"].read()
            path = request.form["file_path"]
            with lock:
                try:
                    env.fs.write_bytes(path, data)
                except (FileNotFoundError, PathError):
                    # What the real server's file.save raises on Windows for a folder that does
                    # not exist (a Linux path included: it names a folder missing from C:\).
                    raise FileNotFoundError(f"[Errno 2] No such file or directory: {path!r}") from None
            return "File Uploaded"
        return jsonify({"error": "file_path and file_data are required"}), 400

    @app.route("/setup/create_folder", methods=["POST"])
    def setup_create_folder():
        data = request.json
        if "path" not in data:
            return jsonify({"error": "path required"}), 400
        path = data["path"]
        with lock:
            try:
                if env.fs.exists(path):
                    return jsonify({"status": "success", "message": f"{path} already exists."}), 200
                env.fs.makedirs(path)
            except (OSError, PathError):
                return jsonify({"status": "error", "message": f"Failed to create {path}."}), 400
        return jsonify({"status": "success", "message": f"{path} created."}), 200

    @app.route("/setup/create_file", methods=["POST"])
    def setup_create_file():
        data = request.json
        if "path" not in data:
            return jsonify({"error": "path required"}), 400
        raw = str(data["path"])
        # A bare file name goes to the Desktop, as the real route's docstring intends.
        path = raw if ":" in raw or raw.startswith(("\\", "/", "~", "%")) else f"{USER_HOME}\\Desktop\\{raw}"
        with lock:
            try:
                if env.fs.is_dir(path):
                    return jsonify({"status": "error", "message": "path is not a file"}), 400
                wp = parse_winpath(path)
                env.fs.makedirs(wp.parent)
                # Real server writes text mode on Windows: "\n" becomes CRLF.
                env.fs.write_bytes(wp, str(data.get("content", "")).replace("\n", "\r\n").encode("utf-8"))
            except (OSError, PathError):
                return jsonify({"status": "error", "message": f"Failed to create {path}."}), 400
        return jsonify({"status": "success", "message": f"{path} created."}), 200

    @app.route("/setup/recycle", methods=["POST"])
    def setup_recycle():
        data = request.json
        if "path" not in data:
            return jsonify(error="Missing 'path' parameter"), 400
        with lock:
            try:
                env.fs.recycle(data["path"])
            except (OSError, PathError):
                return jsonify({"status": "error", "message": f"Failed to recycle {data['path']}"}), 400
        return jsonify({"status": "success", "message": f"{data['path']} recycled"}), 200

    # -- routes whose real implementation needs Windows internals we do not simulate -----
    for route in ("/are_files_sorted_by_modified_time", "/is_directory_read_only_for_user", "/are_all_images_tagged",
                  "/check_if_timer_started", "/check_if_world_clock_exists", "/start_recording", "/end_recording",
                  "/setup/change_wallpaper", "/setup/download_file", "/window_size"):
        def unsupported(route: str = route):
            raise SimulationUnsupported(f"{route} is not available in the WAA simulation")
        app.add_url_rule(route, f"unsupported_{route}", unsupported, methods=["POST"])

    @app.route("/terminal", methods=["GET"])
    def terminal():
        return "Currently not implemented for platform Windows (WAA simulation).", 500

    @app.route("/revert_to_snapshot", methods=["POST"])
    def revert_to_snapshot():
        return jsonify({"error": "Restore snapshot no implemented"}), 501

    # -- simulation-only control routes ------------------------------------------------
    @app.route("/sim/snapshot/save", methods=["POST"])
    def sim_save():
        name = _snapshot_name(request.json)
        env.save_snapshot(name)
        return jsonify({"status": "success"})

    @app.route("/sim/snapshot/load", methods=["POST"])
    def sim_load():
        name = _snapshot_name(request.json)
        if not env.load_snapshot(name):
            return jsonify({"status": "error", "message": f"no snapshot named {name!r}"}), 404
        return jsonify({"status": "success"})

    @app.route("/sim/restart", methods=["POST"])
    def sim_restart():
        env.restart_server()
        return jsonify({"status": "success"})

    @app.route("/sim/faults", methods=["GET", "POST"])
    def sim_faults():
        if request.method == "POST":
            try:
                env.faults.configure(request.get_json(silent=True))
            except FaultSpecError as exc:
                return jsonify({"status": "error", "message": str(exc)}), 400
        return jsonify({"faults": env.faults.describe()})

    @app.route("/sim/info", methods=["GET"])
    def sim_info():
        with lock:
            names = sorted(env.snapshots)
            failsafe_now = env.server_failsafe
        return jsonify({"simulation": True, "label": SIMULATION_LABEL, "width": env.desk.width,
                        "height": env.desk.height, "snapshots": names, "devtools": False,
                        "quirks": env.quirks_on, "quirk_settings": env.quirks.to_dict(),
                        "ready": env.is_ready(), "ready_in": round(env.ready_in(), 3),
                        "server_failsafe": failsafe_now})

    # -- Chrome DevTools stand-in --------------------------------------------------------
    def devtools_refusal(target_id: str | None = None):
        return jsonify(DEVTOOLS_REFUSAL), 501

    for rule in ("/json", "/json/", "/json/list", "/json/version", "/json/protocol", "/json/new"):
        app.add_url_rule(rule, f"devtools_{rule}", devtools_refusal, methods=["GET", "PUT", "POST"])
    for rule in ("/json/close/<path:target_id>", "/json/activate/<path:target_id>"):
        app.add_url_rule(rule, f"devtools_{rule}", devtools_refusal, methods=["GET", "PUT", "POST"])

    return app


def _snapshot_name(data: Any) -> str:
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("snapshot name (non-empty string 'name') required")
    return name
