"""Watching a run as it goes: a local page with each VM's latest screen, its task, step and last
action (and, for kvm VMs, how to open the VM's VNC display).

    BOARD.attempt_started(...) / BOARD.attempt_ended(vm_id)    what each lane is doing (flows/attempt.py)
    with LiveView() as view: view.url                          the page, for the run's lifetime
    link_run_page(run_id)                                      the page linked from the run's Prefect page

`arena run` serves it from its own process while the run goes (a thread, nothing that outlives
the run) and prints its address; the flow links it from the run's Prefect page. It listens on
127.0.0.1 unless the operator sets ARENA_LIVE_HOST, and then only with ARENA_LIVE_TOKEN, which
every request must carry (`?token=`). The page is plain HTML that reloads itself every two
seconds (no script); screens are read from the files the run writes anyway (the steps'
screenshots), by lane, never by a path from the request.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from adapters.episode import EpisodeOutcome

HOST_ENV = "ARENA_LIVE_HOST"
TOKEN_ENV = "ARENA_LIVE_TOKEN"
REFRESH_SECONDS = 2


@dataclass
class Lane:
    """One VM's current attempt."""

    vm_id: str
    task_id: str
    trial: int
    attempt: int
    episode: EpisodeOutcome
    screenshot_dir: Path | None
    vnc: str | None  # how to open the VM's display, for kvm VMs
    started: float


class LiveBoard:
    """What each lane of this process's runs is doing now (thread-safe)."""

    def __init__(self) -> None:
        self._lanes: dict[str, Lane] = {}
        self._lock = threading.Lock()

    def attempt_started(self, vm_id: str, task_id: str, trial: int, attempt: int, episode: EpisodeOutcome,
                        screenshot_dir: Path | None, details: dict[str, Any] | None = None) -> None:
        """An attempt began on `vm_id`; its episode fills `episode` as it goes."""
        with self._lock:
            self._lanes[vm_id] = Lane(vm_id, task_id, trial, attempt, episode, screenshot_dir,
                                      vnc_hint(details or {}), time.time())

    def attempt_ended(self, vm_id: str) -> None:
        with self._lock:
            self._lanes.pop(vm_id, None)

    def lanes(self) -> list[Lane]:
        with self._lock:
            return sorted(self._lanes.values(), key=lambda lane: lane.vm_id)

    def lane(self, vm_id: str) -> Lane | None:
        with self._lock:
            return self._lanes.get(vm_id)


BOARD = LiveBoard()
_current: list[str] = []  # the address of this process's live view while it serves


def current_url() -> str | None:
    """The live view this process serves now, or None."""
    return _current[-1] if _current else None


def vnc_hint(details: dict[str, Any]) -> str | None:
    """How to open a kvm VM's display: its VNC address and where its password is."""
    address = details.get("vnc")
    if not address:
        return None
    password = details.get("vnc_password_file")
    return f"vncviewer {address}" + (f" (password in {password})" if password else "")


def latest_screen(lane: Lane) -> Path | None:
    """The newest screenshot of the lane's attempt: the screen its agent sees now."""
    if lane.screenshot_dir is None or not lane.screenshot_dir.is_dir():
        return None
    shots = sorted(lane.screenshot_dir.glob("step_*.png"))
    return shots[-1] if shots else None


def lane_state(lane: Lane) -> dict[str, Any]:
    """A lane as the page and /state.json show it."""
    episode = lane.episode
    action = episode.last_action
    return {
        "vm": lane.vm_id, "task": lane.task_id, "trial": lane.trial, "attempt": lane.attempt,
        "step": len(episode.steps), "phase": episode.phase,
        "last_action": action.describe() if action is not None else None,
        "seconds": round(time.time() - lane.started, 1), "vnc": lane.vnc,
    }


def _page(board: LiveBoard, token: str | None) -> str:
    suffix = f"?token={token}" if token else ""
    e = html.escape
    cards = []
    for lane in board.lanes():
        state = lane_state(lane)
        trial = f" trial {state['trial']}" if state["trial"] > 1 else ""
        vnc = f"<div class='vnc'>{e(state['vnc'])}</div>" if state["vnc"] else ""
        cards.append(
            f"<div class='lane'><h2>{e(lane.vm_id)}</h2>"
            f"<div>{e(lane.task_id)}{e(trial)}, attempt {state['attempt']}: step {state['step']}, "
            f"{e(state['phase'])}, {state['seconds']:.0f} s</div>"
            f"<div class='action'>last action: {e(state['last_action'] or '-')}</div>{vnc}"
            f"<img alt='latest screen of {e(lane.vm_id)}' src='/screen/{e(lane.vm_id)}{suffix}'></div>")
    body = "".join(cards) or "<p>No attempt is running now (between tasks, or the run has ended).</p>"
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'><title>arena run: live</title>"
            "<style>body{font:14px system-ui,sans-serif;margin:16px}.lanes{display:flex;flex-wrap:wrap;gap:16px}"
            ".lane{width:640px}.lane img{width:100%;border:1px solid #d8dee4}.action,.vnc{color:#5f6b7a}"
            "h2{font-size:16px;margin:4px 0}</style></head><body><h1>arena run: what the agents see</h1>"
            f"<div class='lanes'>{body}</div></body></html>")


_SAFE_VM = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def _handler(board: LiveBoard, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # the run's terminal is for the run

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            parts = urlsplit(self.path)
            given = parse_qs(parts.query).get("token", [""])[0]
            if token is not None and not hmac.compare_digest(given.encode(), token.encode()):
                self._send(401, "text/plain", b"missing or wrong token\n")
                return
            if parts.path == "/":
                self._send(200, "text/html; charset=utf-8", _page(board, token).encode())
            elif parts.path == "/state.json":
                body = json.dumps([lane_state(lane) for lane in board.lanes()]).encode()
                self._send(200, "application/json", body)
            elif parts.path.startswith("/screen/") and _SAFE_VM.match(vm := parts.path[len("/screen/"):]):
                lane = board.lane(vm)
                screen = latest_screen(lane) if lane is not None else None
                try:
                    data = screen.read_bytes() if screen is not None else None
                except OSError:  # replaced by the next step meanwhile
                    data = None
                if data is None:
                    self._send(404, "text/plain", b"no screen yet\n")
                else:
                    self._send(200, "image/png", data)
            else:
                self._send(404, "text/plain", b"not found\n")

    return Handler


def _listen_settings() -> tuple[str, str | None]:
    """(host, token) from the operator's environment; ValueError naming the variable when a
    non-loopback host comes without a token of 16 characters or more."""
    host = os.environ.get(HOST_ENV) or "127.0.0.1"
    token = os.environ.get(TOKEN_ENV) or None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback and (token is None or len(token) < 16):
        raise ValueError(f"{HOST_ENV}={host} serves the live view beyond this machine: set {TOKEN_ENV} "
                         "(16 characters or more) too; every request must then carry it")
    return host, token


class LiveView:
    """The live page of `board`, served from a thread while the block runs."""

    def __init__(self, board: LiveBoard = BOARD, port: int = 0) -> None:
        host, self._token = _listen_settings()
        self._server = ThreadingHTTPServer((host, port), _handler(board, self._token))
        self._server.daemon_threads = True
        shown = f"[{host}]" if ":" in host else host
        query = f"/?token={self._token}" if self._token else "/"
        self.url = f"http://{shown}:{self._server.server_address[1]}{query}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="arena-live-view", daemon=True)

    def __enter__(self) -> LiveView:
        self._thread.start()
        _current.append(self.url)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.url in _current:
            _current.remove(self.url)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def link_run_page(run_id: str) -> None:
    """This process's live view, when it serves one, linked from the run's Prefect page: a local
    address, for whoever watches on this machine."""
    url = current_url()
    if url is None:
        return
    from prefect.artifacts import create_link_artifact

    from flows.bookkeeping import best_effort, slug

    best_effort("linking the live view", lambda: create_link_artifact(
        key=f"waa-live-{slug(run_id)}", link=url, link_text="what the agents see now (this machine only)",
        description=f"WAA run {run_id}: each VM's latest screen, task, step and action, while the run goes"))
