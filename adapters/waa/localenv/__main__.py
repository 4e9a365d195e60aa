"""Run the WAA simulation: ``python -m adapters.waa.localenv --root DIR [--port 0] ...``.

With ``--port 0`` a free port is chosen; once listening, the port number is written to
``--port-file`` (via a temporary file and a rename, so readers never see half a number) and
``WAA SIMULATION listening on http://HOST:PORT`` is printed. The API is unauthenticated, like
the real server, so a non-loopback host is refused unless ``--allow-remote`` is given.
SIGTERM and SIGINT stop the server cleanly.

``--quirks`` turns on quirks mode (see :mod:`.quirks`), tuned by ``--ready-delay``,
``--accessibility-delay``, ``--launch-delay``, ``--failsafe/--no-failsafe``,
``--action-fault-rate``, ``--fault-seed``, ``--repaint-delay``,
``--strict-activation-fails/--no-strict-activation-fails``, ``--live-regions/--no-live-regions`` and
``--save-prompts/--no-save-prompts``. Injected faults (:mod:`.faults`, ``POST
/sim/faults``) are applied here, before the request reaches the app, because only this server
can drop a connection without an answer or cut one short. While the
readiness delay runs, the HTTP server resets (TCP RST, no answer) every connection whose request
is not for ``/sim/*``, as a VM whose WAA server is not up yet; the port file is written when
that delay starts, so a launcher can return at once and leave the waiting to its caller.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from werkzeug.serving import WSGIRequestHandler, make_server

from .environment import SimEnvironment
from .filesystem import ForeignRootError
from .quirks import QuirkSettings
from .server import create_app


def _gated_handler(env: SimEnvironment) -> type[WSGIRequestHandler]:
    """A request handler that resets connections while the simulated server is not up yet, and
    applies injected faults (:mod:`.faults`) before a request reaches the app."""

    class GatedHandler(WSGIRequestHandler):
        def run_wsgi(self) -> None:
            path = urlsplit(self.path).path
            if not env.is_ready() and not path.startswith("/sim/"):
                self._reset()  # not up yet: no HTTP answer at all
                return
            fault = env.faults.match(path)
            if fault is not None:
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.drop:
                    self._reset()
                    return
                if fault.cut:
                    self._answer_cut()
                    return
                if fault.returncode is not None:
                    self._answer_json(200, fault.execute_answer(path))
                    return
                if fault.status != 200:
                    self._answer_error(fault.status, fault.body_message(path))
                    return
            super().run_wsgi()

        def _reset(self) -> None:
            # SO_LINGER 0 makes close() send RST at once, so the client sees "connection reset"
            # as from a port nobody serves properly.
            self.close_connection = True
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass

        def _answer_cut(self) -> None:
            # The headers promise the whole body; half of it is sent before the connection goes,
            # as when the VM or its server stops mid-answer.
            body = json.dumps({"status": "success", "output": "x" * 256, "error": "", "returncode": 0}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self._reset()

        def _answer_error(self, status: int, message: str) -> None:
            self._answer_json(status, {"status": "error", "message": message})

        def _answer_json(self, status: int, answer: dict) -> None:
            body = json.dumps(answer).encode()
            self.close_connection = True  # the request body was never read
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return GatedHandler


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _stop_when_orphaned(server: object, parent: int) -> None:
    """Shut the server down once `parent`, the process that started this one, is gone (the child
    is then re-parented, so getppid() changes): a controller killed with SIGKILL, or a cancelled
    flow run's process, must not leave simulations running. The parent names itself: one killed
    while this process was still starting has already handed it to init, and a getppid() read
    here would watch init for ever (an orphan of a shard killed mid-start lived on after the suite)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        server.shutdown()  # type: ignore[attr-defined]

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    p = argparse.ArgumentParser(prog="python -m adapters.waa.localenv", description="WAA simulation server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--root", required=True, type=Path, help="directory holding the simulated C: drive")
    p.add_argument("--port-file", type=Path)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=800)
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host (no authentication!)")
    p.add_argument("--exit-with-parent", type=int, metavar="PID",
                   help="stop when process PID, the one that starts this one, is gone (even by SIGKILL)")
    d = QuirkSettings()
    q = p.add_argument_group("quirks mode", "the real server's slow/awkward behaviours (only with --quirks)")
    q.add_argument("--quirks", action="store_true", help="turn quirks mode on")
    q.add_argument("--ready-delay", type=float, help=f"seconds the server pretends not to be up (default {d.ready_delay})")
    q.add_argument("--accessibility-delay", type=float,
                   help=f"seconds GET /accessibility sleeps (default {d.accessibility_delay})")
    q.add_argument("--launch-delay", type=float,
                   help=f"seconds before a /setup/launch window opens (default {d.launch_delay})")
    q.add_argument("--failsafe", action=argparse.BooleanOptionalAction, default=None,
                   help=f"pyautogui fail-safe in the server process (default {'on' if d.failsafe else 'off'})")
    q.add_argument("--action-fault-rate", type=float,
                   help="share of /execute and /execute_windows requests that fail server-side (default 0)")
    q.add_argument("--fault-seed", type=int, help="seed of the fault draws (default 0)")
    q.add_argument("--repaint-delay", type=float,
                   help=f"seconds the screen and tree lag each action (slow repaint; default {d.repaint_delay})")
    q.add_argument("--strict-activation-fails", action=argparse.BooleanOptionalAction, default=None,
                   help="a strict /setup/activate_window of an existing window answers 500 (WAA's failed assert)")
    q.add_argument("--live-regions", action=argparse.BooleanOptionalAction, default=None,
                   help="a blinking caret, a turning progress ring and a clock with seconds on screen")
    q.add_argument("--save-prompts", action=argparse.BooleanOptionalAction, default=None,
                   help=f"closing an unsaved Notepad asks to save (default {'on' if d.save_prompts else 'off'})")
    args = p.parse_args(argv)
    knobs = {"ready_delay": args.ready_delay, "accessibility_delay": args.accessibility_delay,
             "launch_delay": args.launch_delay, "failsafe": args.failsafe,
             "action_fault_rate": args.action_fault_rate, "fault_seed": args.fault_seed,
             "repaint_delay": args.repaint_delay, "strict_activation_fails": args.strict_activation_fails,
             "live_regions": args.live_regions, "save_prompts": args.save_prompts}
    knobs = {k: v for k, v in knobs.items() if v is not None}
    if knobs and not args.quirks:
        print(f"quirk settings {sorted(knobs)} need --quirks", file=sys.stderr)
        return 2
    try:
        quirks = QuirkSettings.from_dict(knobs) if args.quirks else None
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if not _is_loopback(args.host) and not args.allow_remote:
        print(f"refusing to listen on non-loopback host {args.host!r}: the WAA API is unauthenticated; "
              "pass --allow-remote to insist", file=sys.stderr)
        return 2
    if args.width < 320 or args.height < 240:
        print("screen too small (minimum 320x240)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    try:
        env = SimEnvironment(args.root, args.width, args.height, quirks=quirks)
    except ForeignRootError as exc:
        print(f"--root {exc}", file=sys.stderr)
        return 2
    env.save_snapshot("initial")
    server = make_server(args.host, args.port, create_app(env), threaded=True, request_handler=_gated_handler(env))
    port = server.socket.getsockname()[1]
    env.start_ready_clock()
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(str(port))
        os.replace(tmp, args.port_file)

    def stop(signum, frame):  # shutdown() blocks until serve_forever returns, so use a thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.exit_with_parent is not None:
        _stop_when_orphaned(server, args.exit_with_parent)
    mode = f", quirks {quirks.to_dict()}" if quirks else ""
    print(f"WAA SIMULATION listening on http://{args.host}:{port} "
          f"(simulated Windows desktop {args.width}x{args.height}, root {args.root}{mode})", flush=True)
    try:
        server.serve_forever(poll_interval=0.05)  # SIGTERM is answered within 50 ms
    finally:
        server.server_close()
    print("WAA SIMULATION stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
