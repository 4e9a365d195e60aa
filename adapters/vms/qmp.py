"""A small QMP (QEMU Machine Protocol) client over TCP or a Unix socket, standard library only.

WAA's Windows-in-QEMU container exposes the QEMU monitor as QMP on TCP port 7200. The cloud
providers use it for the guest-level resets (see :mod:`adapters.vms.guest_reset`): ``savevm`` /
``loadvm`` of an internal snapshot and ``system_reset``. The kvm provider runs QEMU itself and
gives each VM's monitor a Unix socket in a private directory (:func:`qmp_client` takes either
address), so nothing but this host's owner can reach it.

Protocol, as QEMU speaks it:

* On connect the server sends a greeting ``{"QMP": {"version": {...}, "capabilities": [...]}}``.
* The client must send ``{"execute": "qmp_capabilities"}`` first; the answer is ``{"return": {}}``.
* Each command is ``{"execute": NAME, "arguments": {...}, "id": ID}``; the reply echoes ``"id"``
  and carries either ``{"return": ...}`` or ``{"error": {"class": ..., "desc": ...}}``.
* Asynchronous events ``{"event": NAME, "data": {...}, "timestamp": {...}}`` may arrive at any
  time, also between a command and its reply (``savevm``/``loadvm`` emit STOP and RESUME before
  their reply). They are skipped and kept in :attr:`QMPClient.events`.
* Messages are JSON objects, each followed by CRLF.

``savevm``, ``loadvm``, ``delvm`` and ``info snapshots`` have no stable QMP command across QEMU
versions, so they go through ``human-monitor-command``, whose reply is the HMP text. HMP reports
failures as text in a *successful* reply (e.g. ``"Error: Snapshot 'x' does not exist in one or
more devices\\r\\n"``); :meth:`QMPClient.human` detects that and raises :class:`QMPError` with the
class ``"HMPError"`` (not a QEMU class; it marks text errors).

Safety: no shell and no eval. Snapshot names are checked against :data:`SNAPSHOT_NAME_RE` before
anything is sent, so a name cannot smuggle a second monitor command or an option; a name must
start with a letter because QEMU also looks snapshots up by their numeric ID (``loadvm 1`` would
load the snapshot whose *ID* is 1).
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
from typing import Any

SNAPSHOT_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
"""Allowed snapshot names: a letter, then up to 63 letters, digits, ``_``, ``.`` or ``-``."""

HMP_ERROR_CLASS = "HMPError"
"""The error class given to failures that HMP reported as text."""

_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

QMPAddress = tuple[str, int] | str
"""Where a monitor listens: ``(host, port)`` for TCP, or the path of a Unix socket."""

# One row of "info snapshots": ID, TAG, VM SIZE ("1.28 GiB", "0 B", "75M"), DATE, VM CLOCK...
# The date is the anchor; QEMU pads columns with spaces but a long VM clock can run into the date.
_SNAPSHOT_ROW_RE = re.compile(
    r"^\s*(?P<id>\S+)\s+(?P<tag>.+?)\s+(?P<size>\d[\d.]*\s*[A-Za-z]*)\s+"
    r"(?P<date>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})"
)


class QMPError(RuntimeError):
    """QEMU answered a command with an error (or HMP printed one)."""

    def __init__(self, command: str, error_class: str, desc: str) -> None:
        self.command = command
        self.error_class = error_class
        self.desc = desc
        super().__init__(f"QMP {command!r} failed: {error_class}: {desc}")


class QMPConnectionError(ConnectionError):
    """The monitor could not be reached, closed the connection, sent garbage or did not answer in time."""

    def __init__(self, address: str, command: str, reason: str) -> None:
        self.address = address
        self.command = command
        self.reason = reason
        super().__init__(f"QMP monitor {address}: {command}: {reason}")


def validate_snapshot_name(name: str) -> str:
    """Return `name` when it is an allowed snapshot name; ValueError otherwise."""
    if not isinstance(name, str) or not SNAPSHOT_NAME_RE.match(name):
        raise ValueError(
            f"invalid snapshot name {name!r}: use 1-64 characters [A-Za-z0-9_.-] starting with a letter"
        )
    return name


def hmp_error_text(output: str) -> str | None:
    """The error HMP printed in `output`, or None when it reports none.

    HMP prefixes errors with ``Error:`` (``hmp_handle_error``) and answers ``unknown command:``
    for a command it does not know; older QEMUs printed savevm/loadvm failures without a prefix,
    which :meth:`QMPClient.savevm` / :meth:`QMPClient.loadvm` catch separately.
    """
    for line in output.splitlines():
        stripped = line.strip()
        lowered = stripped.lower()
        if lowered.startswith("error") or lowered.startswith("unknown command"):
            return stripped
    return None


def parse_snapshot_list(output: str) -> list[str]:
    """Tags of the loadable snapshots in ``info snapshots`` output, in QEMU's order.

    Only the "present on all disks" section counts; snapshots listed under "List of partial
    (non-loadable) snapshots" cannot be loaded and are left out. "There is no snapshot
    available.", "None" and "No available block device supports snapshots" give [].
    """
    names: list[str] = []
    for line in output.splitlines():
        stripped = line.strip()
        if stripped.lower().startswith("list of partial"):
            break
        if not stripped or stripped.startswith("List of") or stripped.startswith("ID "):
            continue
        match = _SNAPSHOT_ROW_RE.match(stripped)
        if match:
            names.append(match.group("tag").strip())
    return names


class QMPClient:
    """One QMP session with the monitor at ``host:port`` (or a Unix socket); use it as a context manager.

    ``timeout`` bounds connecting and each command (the whole wait for its reply, however many
    events arrive meanwhile); a command may pass its own ``timeout``. After a timeout the
    session is closed, since a late reply would be out of step, and later calls raise
    :class:`QMPConnectionError`.
    """

    def __init__(self, host: str, port: int | None, timeout: float = 30.0) -> None:
        """TCP to ``host:port``; with ``port=None``, ``host`` is the path of a Unix socket."""
        self.host = host
        self.port = None if port is None else int(port)
        self.timeout = float(timeout)
        self.greeting: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._ids = itertools.count(1)
        self._broken: str | None = None

    @property
    def address(self) -> str:
        return f"unix:{self.host}" if self.port is None else f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"QMPClient({self.address!r})"

    # -- session -----------------------------------------------------------------------------

    def __enter__(self) -> QMPClient:
        self.connect()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def connect(self) -> None:
        """Connect, read the greeting and negotiate capabilities (none are enabled)."""
        if self._sock is not None:
            return
        deadline = time.monotonic() + self.timeout
        try:
            if self.port is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                try:
                    sock.connect(self.host)
                except OSError:
                    sock.close()
                    raise
                self._sock = sock
            else:
                self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise QMPConnectionError(self.address, "connect", f"cannot connect ({exc})") from exc
        self._broken = None
        self._buffer = b""
        try:
            while True:
                message = self._read_message("greeting", deadline, self.timeout)
                if "QMP" in message:
                    self.greeting = message
                    break
                if "event" in message:
                    self.events.append(message)
                    continue
                raise QMPConnectionError(self.address, "greeting", f"expected a QMP greeting, got {message!r:.200}")
            self.execute("qmp_capabilities", timeout=max(0.001, deadline - time.monotonic()))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buffer = b""

    # -- transport ---------------------------------------------------------------------------

    def _fail(self, command: str, reason: str, exc: BaseException | None = None) -> QMPConnectionError:
        self._broken = reason
        self.close()
        error = QMPConnectionError(self.address, command, reason)
        if exc is not None:
            error.__cause__ = exc
        return error

    def _read_message(self, command: str, deadline: float, limit: float) -> dict[str, Any]:
        """The next JSON object from the monitor, waiting until `deadline` at most."""
        assert self._sock is not None
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(command, f"timed out: no answer within {limit:g} s")
            self._sock.settimeout(remaining)
            try:
                chunk = self._sock.recv(65536)
            except socket.timeout as exc:
                raise self._fail(command, f"timed out: no answer within {limit:g} s", exc) from exc
            except OSError as exc:
                raise self._fail(command, f"connection error ({exc})", exc) from exc
            if not chunk:
                raise self._fail(command, "the monitor closed the connection")
            self._buffer += chunk
            if len(self._buffer) > _MAX_MESSAGE_BYTES:
                raise self._fail(command, f"message larger than {_MAX_MESSAGE_BYTES} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        text = line.decode("utf-8", errors="replace").strip()
        if not text:
            return self._read_message(command, deadline, limit)
        try:
            message = json.loads(text)
        except ValueError as exc:
            raise self._fail(command, f"the monitor sent invalid JSON: {text[:200]!r}", exc) from exc
        if not isinstance(message, dict):
            raise self._fail(command, f"the monitor sent a non-object: {text[:200]!r}")
        return message

    # -- commands ----------------------------------------------------------------------------

    def execute(self, command: str, arguments: dict[str, Any] | None = None, *, timeout: float | None = None,
                fds: list[int] | None = None) -> Any:
        """Run one QMP command and return its ``"return"`` value.

        Events received while waiting are appended to :attr:`events`; replies carrying another
        id are ignored. Raises :class:`QMPError` on ``{"error"}`` and :class:`QMPConnectionError`
        on timeouts and connection failures. ``fds`` (Unix sockets only) are passed along with
        the command, as ``getfd`` needs.
        """
        if fds and self.port is not None:
            raise ValueError(f"QMP monitor {self.address}: file descriptors can only be passed over a Unix socket")
        if self._sock is None:
            if self._broken:
                raise QMPConnectionError(self.address, command, f"session unusable after: {self._broken}")
            raise QMPConnectionError(self.address, command, "not connected (use QMPClient as a context manager)")
        request_id = f"waa-{next(self._ids)}"
        request: dict[str, Any] = {"execute": command, "id": request_id}
        if arguments is not None:
            request["arguments"] = arguments
        limit = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        try:
            self._sock.settimeout(limit)
            payload = json.dumps(request).encode("utf-8") + b"\r\n"
            if fds:
                # SCM_RIGHTS travels with the first byte; the rest follows as plain data.
                sent = socket.send_fds(self._sock, [payload], fds)
                self._sock.sendall(payload[sent:])
            else:
                self._sock.sendall(payload)
        except OSError as exc:
            raise self._fail(command, f"cannot send ({exc})", exc) from exc
        while True:
            message = self._read_message(command, deadline, limit)
            if "event" in message:
                self.events.append(message)
                continue
            if "return" not in message and "error" not in message:
                continue  # e.g. a repeated greeting: nothing to do with this command
            if "id" in message and message["id"] != request_id:
                continue  # a stale reply to another request
            if "error" in message:
                error = message["error"] if isinstance(message["error"], dict) else {}
                # An error without an id answers a request QEMU could not parse: ours.
                raise QMPError(command, str(error.get("class", "GenericError")), str(error.get("desc", message)))
            if "id" not in message:
                continue  # a reply without our id cannot be ours
            return message["return"]

    def human(self, command_line: str, *, timeout: float | None = None) -> str:
        """Run an HMP command through ``human-monitor-command``; its text output.

        Raises :class:`QMPError` (class ``"HMPError"``) when the output reports an error.
        """
        if not isinstance(command_line, str) or not command_line.strip():
            raise ValueError("empty monitor command line")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in command_line):
            raise ValueError(f"control characters in monitor command line {command_line!r}")
        output = self.execute("human-monitor-command", {"command-line": command_line}, timeout=timeout)
        text = "" if output is None else str(output)
        error = hmp_error_text(text)
        if error is not None:
            raise QMPError(command_line, HMP_ERROR_CLASS, error)
        return text

    def _snapshot_command(self, verb: str, name: str, timeout: float | None) -> None:
        validate_snapshot_name(name)
        command_line = f"{verb} {name}"
        output = self.human(command_line, timeout=timeout)
        # savevm/loadvm/delvm print nothing on success; older QEMUs printed failures without an
        # "Error:" prefix ("Device 'x' does not have the requested snapshot 'y'"). Warnings pass.
        problems = [line.strip() for line in output.splitlines()
                    if line.strip() and not line.strip().lower().startswith("warning")]
        if problems:
            raise QMPError(command_line, HMP_ERROR_CLASS, " ".join(problems))

    def savevm(self, name: str, *, timeout: float | None = None) -> None:
        """Save RAM, devices and disks as internal snapshot `name` (replacing one of that name)."""
        self._snapshot_command("savevm", name, timeout)

    def loadvm(self, name: str, *, timeout: float | None = None) -> None:
        """Restore internal snapshot `name`. On failure QEMU leaves the VM stopped ("restore-vm")."""
        self._snapshot_command("loadvm", name, timeout)

    def delvm(self, name: str, *, timeout: float | None = None) -> None:
        """Delete internal snapshot `name`."""
        self._snapshot_command("delvm", name, timeout)

    def snapshots(self) -> list[str]:
        """Tags of the loadable internal snapshots (``info snapshots``)."""
        return parse_snapshot_list(self.human("info snapshots"))

    def system_reset(self) -> None:
        """Reset the machine like the reset button; the guest reboots. RAM and disk are kept."""
        self.execute("system_reset")

    def status(self) -> str:
        """The run state from ``query-status``: "running", "paused", "restore-vm", "shutdown"..."""
        answer = self.execute("query-status")
        if not isinstance(answer, dict) or "status" not in answer:
            raise QMPError("query-status", "GenericError", f"unexpected answer {answer!r:.200}")
        return str(answer["status"])

    def stop(self) -> None:
        self.execute("stop")

    def cont(self) -> None:
        self.execute("cont")

    def events_named(self, name: str) -> list[dict[str, Any]]:
        """The recorded events called `name` (e.g. "RESET", "STOP", "RESUME")."""
        return [event for event in self.events if event.get("event") == name]


def qmp_client(address: QMPAddress, timeout: float = 30.0) -> QMPClient:
    """A client for the monitor at `address`: ``(host, port)`` or a Unix socket's path."""
    if isinstance(address, str):
        return QMPClient(address, None, timeout=timeout)
    host, port = address
    return QMPClient(host, port, timeout=timeout)


def describe_address(address: QMPAddress) -> str:
    """`address` as messages show it: ``host:port`` or ``unix:PATH``."""
    return f"unix:{address}" if isinstance(address, str) else f"{address[0]}:{address[1]}"
