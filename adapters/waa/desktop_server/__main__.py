"""Serve WAA's API for the desktop session: ``python3 -m adapters.waa.desktop_server --port 5000``.

Run in the guest only, as the desktop user, after ``adapters.waa.desktop_server.session``
started the desktop: this server runs whatever commands it is sent. The guest's network is
isolated and the kvm provider forwards only 127.0.0.1 on the host to this port (docs/kvm.md).
It listens on the guest's addresses because QEMU's user network delivers forwarded connections
to the guest's own address.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from werkzeug.serving import make_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m adapters.waa.desktop_server")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--display", default=":0")
    parser.add_argument("--home", default="/home/user")
    args = parser.parse_args(argv)

    from .app import Session, create_app
    from .display import Display
    from .session import session_env

    env = {**os.environ, **session_env(args.home, args.display)}
    os.environ.update(env)  # pyautogui (in this process, for /execute_windows) reads DISPLAY
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = make_server(args.host, args.port, create_app(Session(Display(args.display), env, args.home)),
                         threaded=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"waa-desktop: serving WAA's API for the real desktop on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
