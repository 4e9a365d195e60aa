"""Run the WAA simulation: ``python -m adapters.waa.localenv --root DIR [--port 0] ...``.

With ``--port 0`` a free port is chosen; once listening, the port number is written to
``--port-file`` (via a temporary file and a rename, so readers never see half a number) and
``WAA SIMULATION listening on http://HOST:PORT`` is printed. The API is unauthenticated, like
the real server, so a non-loopback host is refused unless ``--allow-remote`` is given.
SIGTERM and SIGINT stop the server cleanly.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from werkzeug.serving import make_server

from .environment import SimEnvironment
from .server import create_app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    args = p.parse_args(argv)
    if not _is_loopback(args.host) and not args.allow_remote:
        print(f"refusing to listen on non-loopback host {args.host!r}: the WAA API is unauthenticated; "
              "pass --allow-remote to insist", file=sys.stderr)
        return 2
    if args.width < 320 or args.height < 240:
        print("screen too small (minimum 320x240)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    env = SimEnvironment(args.root, args.width, args.height)
    env.save_snapshot("initial")
    server = make_server(args.host, args.port, create_app(env), threaded=True)
    port = server.socket.getsockname()[1]
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(str(port))
        os.replace(tmp, args.port_file)

    def stop(signum, frame):  # shutdown() blocks until serve_forever returns, so use a thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"WAA SIMULATION listening on http://{args.host}:{port} "
          f"(simulated Windows desktop {args.width}x{args.height}, root {args.root})", flush=True)
    try:
        server.serve_forever(poll_interval=0.05)  # SIGTERM is answered within 50 ms
    finally:
        server.server_close()
    print("WAA SIMULATION stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
