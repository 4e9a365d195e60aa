"""A fake QEMU monitor speaking QMP over real TCP, for tests of the QMP client and guest resets.

``FakeQMPServer`` listens on 127.0.0.1 (a free port) and serves each connection in a thread the
way QEMU does: a greeting, capability negotiation (commands before it are refused with
CommandNotFound), replies echoing the request ``"id"``, and asynchronous events. It models:

* ``human-monitor-command``: ``savevm NAME``, ``loadvm NAME``, ``delvm NAME``,
  ``info snapshots`` (QEMU's table layout) and ``info status``; anything else answers
  ``unknown command: '...'`` as text. Failures are text in a successful reply, as in QEMU:
  ``Error: Snapshot 'x' does not exist in one or more devices``.
* savevm and loadvm stop the VM (STOP event) and resume it (RESUME) before replying; a failed
  loadvm leaves it stopped in "restore-vm", as ``hmp_loadvm`` does.
* ``system_reset`` replies, then emits RESET (``reason: host-qmp-system-reset``).
* ``query-status``, ``stop``, ``cont``; unknown commands get CommandNotFound.

Hooks bridge it to something real: ``on_savevm(name)``, ``on_loadvm(name)`` and ``on_reset()``
run while the command executes (an exception becomes an ``Error: ...`` text reply for the
snapshot commands, a GenericError for system_reset). Tests point them at the WAA simulation's
``POST /sim/snapshot/save|load {"name"}`` so a loadvm restores the simulated VM exactly.

Scripted trouble: ``hang_greeting`` (accept, never greet), ``hang_on`` (command names or HMP
verbs that never get a reply), ``events_before_reply`` (an extra event before every reply),
``hmp_errors`` (HMP verb -> error text), ``qmp_errors`` (command -> (class, desc)) and ``delays``
(command or HMP verb -> seconds). Every request received is kept in ``commands``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

GREETING = {
    "QMP": {
        "version": {"qemu": {"micro": 0, "minor": 2, "major": 8}, "package": "fake-qmp"},
        "capabilities": ["oob"],
    }
}


def _timestamp() -> dict[str, int]:
    now = time.time()
    return {"seconds": int(now), "microseconds": int((now % 1) * 1_000_000)}


class FakeQMPServer:
    """A scripted QMP server on 127.0.0.1; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        *,
        on_savevm: Callable[[str], Any] | None = None,
        on_loadvm: Callable[[str], Any] | None = None,
        on_reset: Callable[[], Any] | None = None,
        snapshots: Iterable[str] = (),
        status: str = "running",
        hang_greeting: bool = False,
        hang_on: Iterable[str] = (),
        events_before_reply: bool = False,
        hmp_errors: dict[str, str] | None = None,
        qmp_errors: dict[str, tuple[str, str]] | None = None,
        delays: dict[str, float] | None = None,
    ) -> None:
        self.on_savevm = on_savevm
        self.on_loadvm = on_loadvm
        self.on_reset = on_reset
        self.hang_greeting = hang_greeting
        self.hang_on = set(hang_on)
        self.events_before_reply = events_before_reply
        self.hmp_errors = dict(hmp_errors or {})
        self.qmp_errors = dict(qmp_errors or {})
        self.delays = dict(delays or {})
        self.status = status
        self.snapshots: dict[str, dict[str, Any]] = {}
        self._next_snapshot_id = 1
        for name in snapshots:
            self._store_snapshot(name)
        self.commands: list[dict[str, Any]] = []
        self.raw_lines: list[str] = []
        self.events_sent: list[dict[str, Any]] = []
        self.connections = 0
        self.resets = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._clients: list[socket.socket] = []
        self.host = "127.0.0.1"
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> FakeQMPServer:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(16)
        listener.settimeout(0.02)
        self._listener = listener
        self.port = listener.getsockname()[1]
        thread = threading.Thread(target=self._accept_loop, name="fake-qmp-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            clients = list(self._clients)
        for conn in clients:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        for thread in self._threads:
            thread.join(timeout=2)

    def __enter__(self) -> FakeQMPServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- inspection --------------------------------------------------------------------------

    def executed(self) -> list[str]:
        """The command names received, in order (``qmp_capabilities`` included)."""
        return [str(c.get("execute")) for c in self.commands]

    def command_lines(self) -> list[str]:
        """The ``human-monitor-command`` command lines received, in order."""
        return [str((c.get("arguments") or {}).get("command-line")) for c in self.commands
                if c.get("execute") == "human-monitor-command"]

    # -- serving -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._clients.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), name="fake-qmp-conn", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _send(self, conn: socket.socket, message: dict[str, Any]) -> None:
        conn.sendall(json.dumps(message).encode("utf-8") + b"\r\n")

    def _event(self, conn: socket.socket, name: str, data: dict[str, Any] | None = None) -> None:
        event: dict[str, Any] = {"event": name, "timestamp": _timestamp()}
        if data is not None:
            event["data"] = data
        self.events_sent.append(event)
        self._send(conn, event)

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.hang_greeting:
                self._stopping.wait()
                return
            self._send(conn, GREETING)
            negotiated = False
            buffer = b""
            while not self._stopping.is_set():
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, _, buffer = buffer.partition(b"\n")
                    text = line.decode("utf-8", errors="replace").strip()
                    if not text:
                        continue
                    self.raw_lines.append(text)
                    negotiated = self._handle(conn, text, negotiated)
        except OSError:
            return
        finally:
            conn.close()

    def _reply(self, conn: socket.socket, request: dict[str, Any], body: dict[str, Any]) -> None:
        if self.events_before_reply:
            self._event(conn, "FAKE_NOISE", {"before": request.get("execute")})
        if "id" in request:
            body = {**body, "id": request["id"]}
        self._send(conn, body)

    def _error(self, conn: socket.socket, request: dict[str, Any], error_class: str, desc: str) -> None:
        self._reply(conn, request, {"error": {"class": error_class, "desc": desc}})

    def _handle(self, conn: socket.socket, text: str, negotiated: bool) -> bool:
        try:
            request = json.loads(text)
        except ValueError:
            # QEMU answers unparsable input without an id.
            self._send(conn, {"error": {"class": "GenericError", "desc": "JSON parse error, invalid literal"}})
            return negotiated
        if not isinstance(request, dict) or not isinstance(request.get("execute"), str):
            self._send(conn, {"error": {"class": "GenericError", "desc": "QMP input must be a JSON object"}})
            return negotiated
        with self._lock:
            self.commands.append(request)
        command = request["execute"]
        arguments = request.get("arguments") or {}
        verb = str(arguments.get("command-line", "")).split(" ", 1)[0] if command == "human-monitor-command" else ""
        for key in (command, verb):
            if key and key in self.delays:
                time.sleep(self.delays[key])
        if command in self.hang_on or (verb and verb in self.hang_on):
            self._stopping.wait()
            return negotiated
        if command == "qmp_capabilities":
            if negotiated:
                self._error(conn, request, "CommandNotFound",
                            "Capabilities negotiation is already complete, command ignored")
                return True
            self._reply(conn, request, {"return": {}})
            return True
        if not negotiated:
            self._error(conn, request, "CommandNotFound", "Expecting capabilities negotiation with 'qmp_capabilities'")
            return False
        if command in self.qmp_errors:
            error_class, desc = self.qmp_errors[command]
            self._error(conn, request, error_class, desc)
            return True
        if command == "human-monitor-command":
            if "command-line" not in arguments:
                self._error(conn, request, "GenericError", "Parameter 'command-line' is missing")
                return True
            self._reply(conn, request, {"return": self._hmp(conn, str(arguments["command-line"]))})
        elif command == "system_reset":
            try:
                if self.on_reset is not None:
                    self.on_reset()
            except Exception as exc:  # noqa: BLE001 - reported to the client like QEMU would
                self._error(conn, request, "GenericError", f"reset failed: {exc}")
                return True
            self.resets += 1
            self._reply(conn, request, {"return": {}})
            self._event(conn, "RESET", {"guest": False, "reason": "host-qmp-system-reset"})
        elif command == "query-status":
            self._reply(conn, request, {"return": {"status": self.status, "running": self.status == "running",
                                                   "singlestep": False}})
        elif command == "stop":
            if self.status == "running":
                self.status = "paused"
                self._event(conn, "STOP")
            self._reply(conn, request, {"return": {}})
        elif command == "cont":
            if self.status != "running":
                self.status = "running"
                self._event(conn, "RESUME")
            self._reply(conn, request, {"return": {}})
        else:
            self._error(conn, request, "CommandNotFound", f"The command {command} has not been found")
        return True

    # -- HMP ---------------------------------------------------------------------------------

    def _store_snapshot(self, name: str) -> None:
        with_id = self._next_snapshot_id
        self.snapshots[name] = {"id": str(with_id), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "vm_clock": "00:01:23.456", "size": "1.28 GiB"}
        self._next_snapshot_id = with_id + 1

    def _hmp(self, conn: socket.socket, command_line: str) -> str:
        """The text QEMU's HMP would print for `command_line` (CRLF line ends)."""
        verb, _, rest = command_line.strip().partition(" ")
        name = rest.strip()
        if verb in self.hmp_errors:
            return f"Error: {self.hmp_errors[verb]}\r\n"
        if verb == "savevm":
            return self._savevm(conn, name)
        if verb == "loadvm":
            return self._loadvm(conn, name)
        if verb == "delvm":
            if not name:
                return "Parameter 'name' is missing\r\n"
            if self.snapshots.pop(name, None) is None:
                return "Error: Error while deleting snapshot on device 'drive0': Can't find the snapshot\r\n"
            return ""
        if command_line.strip() == "info snapshots":
            return self._info_snapshots()
        if command_line.strip() == "info status":
            return f"VM status: {self.status}\r\n"
        return f"unknown command: '{verb}'\r\n"

    def _savevm(self, conn: socket.socket, name: str) -> str:
        if not name:
            name = f"vm-{time.strftime('%Y%m%d%H%M%S')}"
        was_running = self.status == "running"
        self.status = "save-vm"
        self._event(conn, "STOP")
        try:
            if self.on_savevm is not None:
                self.on_savevm(name)
        except Exception as exc:  # noqa: BLE001
            self.status = "running" if was_running else "paused"
            if was_running:
                self._event(conn, "RESUME")
            return f"Error: Error while writing VM state: {exc}\r\n"
        self.snapshots.pop(name, None)  # savevm replaces a snapshot of the same name
        self._store_snapshot(name)
        self.status = "running" if was_running else "paused"
        if was_running:
            self._event(conn, "RESUME")
        return ""

    def _loadvm(self, conn: socket.socket, name: str) -> str:
        if not name:
            return "Parameter 'name' is missing\r\n"
        was_running = self.status == "running"
        self.status = "restore-vm"  # hmp_loadvm stops the VM first and resumes only on success
        self._event(conn, "STOP")
        if name not in self.snapshots:
            return f"Error: Snapshot '{name}' does not exist in one or more devices\r\n"
        try:
            if self.on_loadvm is not None:
                self.on_loadvm(name)
        except Exception as exc:  # noqa: BLE001
            return f"Error: Error -22 while loading VM state: {exc}\r\n"
        self.status = "running" if was_running else "paused"
        if was_running:
            self._event(conn, "RESUME")
        return ""

    def _info_snapshots(self) -> str:
        if not self.snapshots:
            return "There is no snapshot available.\r\n"
        lines = ["List of snapshots present on all disks:",
                 f"{'ID':<10}{'TAG':<17}{'VM SIZE':>8}{'DATE':>20}{'VM CLOCK':>13}{'ICOUNT':>11}"]
        for tag, info in self.snapshots.items():
            lines.append(f"{'--':<9} {tag:<16} {info['size']:>8}{info['date']:>20}{info['vm_clock']:>13}")
        return "\r\n".join(lines) + "\r\n"
