"""QMP client protocol and errors against a fake monitor, and guest resets against the real
local WAA simulation bridged to the fake monitor's savevm/loadvm/system_reset hooks."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vms has no __init__.py

from fake_qmp import FakeQMPServer  # noqa: E402

from adapters.vms.base import ProviderError, ResetLevel  # noqa: E402
from adapters.vms.guest_reset import ResetTiming, reboot_reset, snapshot_reset, take_baseline_snapshot  # noqa: E402
from adapters.vms.qmp import (  # noqa: E402
    HMP_ERROR_CLASS,
    QMPClient,
    QMPConnectionError,
    QMPError,
    parse_snapshot_list,
    validate_snapshot_name,
)

DESKTOP = "C:\\Users\\Docker\\Desktop"
JUNK = DESKTOP + "\\junk"


@pytest.fixture
def fake() -> Iterator[FakeQMPServer]:
    with FakeQMPServer() as server:
        yield server


def connect(server: FakeQMPServer, timeout: float = 5.0) -> QMPClient:
    return QMPClient(*server.address, timeout=timeout)


# -- protocol ------------------------------------------------------------------------------------


def test_greeting_and_capabilities_negotiated_first(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        assert qmp.greeting is not None and qmp.greeting["QMP"]["version"]["qemu"]["major"] == 8
        assert qmp.status() == "running"
    assert fake.executed() == ["qmp_capabilities", "query-status"]
    assert "arguments" not in fake.commands[0]  # no capability (oob) enabled


def test_every_command_carries_a_fresh_id_and_replies_match_it(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        qmp.status()
        qmp.stop()
        qmp.cont()
    ids = [c["id"] for c in fake.commands]
    assert len(set(ids)) == len(ids) == 4
    assert all(isinstance(i, str) and i for i in ids)


def test_commands_before_negotiation_are_refused_by_the_fake(fake: FakeQMPServer) -> None:
    # The fake, like QEMU, refuses anything before qmp_capabilities: talk to it raw.
    with socket.create_connection(fake.address, timeout=5) as sock:
        f = sock.makefile("rwb")
        assert "QMP" in json.loads(f.readline())
        f.write(b'{"execute": "query-status", "id": 7}\r\n')
        f.flush()
        reply = json.loads(f.readline())
    assert reply["id"] == 7 and reply["error"]["class"] == "CommandNotFound"


def test_events_interleaved_with_replies_are_skipped_and_recorded() -> None:
    with FakeQMPServer(events_before_reply=True) as server, connect(server) as qmp:
        assert qmp.status() == "running"
        qmp.savevm("snap1")  # STOP, RESUME and a noise event all precede the reply
        assert qmp.snapshots() == ["snap1"]
        names = [e["event"] for e in qmp.events]
    assert names.count("FAKE_NOISE") == 4  # capabilities, query-status, savevm, info snapshots
    assert names.index("STOP") < names.index("RESUME")
    assert all("timestamp" in e for e in qmp.events)


def test_stale_replies_with_other_ids_are_ignored(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        # Queue a reply carrying a foreign id ahead of ours, as a late answer would be.
        assert qmp._sock is not None
        qmp._sock.sendall(b'{"execute": "query-status", "id": "someone-else"}\r\n')
        time.sleep(0.1)
        assert qmp.status() == "running"
        qmp.stop()
        assert qmp.status() == "paused"


def test_system_reset_emits_reset_event_after_reply(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        qmp.system_reset()
        assert qmp.status() == "running"  # reading the next reply collects the RESET event
        resets = qmp.events_named("RESET")
    assert fake.resets == 1
    assert resets and resets[0]["data"] == {"guest": False, "reason": "host-qmp-system-reset"}


def test_snapshot_lifecycle_and_info_snapshots_parsing(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        assert qmp.snapshots() == []
        qmp.savevm("waa-baseline")
        qmp.savevm("second.one")
        qmp.savevm("waa-baseline")  # replaces
        assert sorted(qmp.snapshots()) == ["second.one", "waa-baseline"]
        qmp.loadvm("second.one")
        qmp.delvm("second.one")
        assert qmp.snapshots() == ["waa-baseline"]
    assert fake.command_lines() == [
        "info snapshots", "savevm waa-baseline", "savevm second.one", "savevm waa-baseline",
        "info snapshots", "loadvm second.one", "delvm second.one", "info snapshots",
    ]


def test_parse_snapshot_list_real_layouts() -> None:
    text = (
        "List of snapshots present on all disks:\r\n"
        "ID        TAG               VM SIZE                DATE     VM CLOCK     ICOUNT\r\n"
        "--        suspended         892 MiB 2026-09-21 15:33:50 00:14:32.785\r\n"
        "--        long-clock        2.5 GiB 2026-09-07 00:03:12160:20:54.942\r\n"
        "--        tiny                  0 B 2026-09-07 00:03:12 00:00:00.000          5\r\n"
        "\r\nList of partial (non-loadable) snapshots on 'drive0':\r\n"
        "ID        TAG               VM SIZE                DATE     VM CLOCK     ICOUNT\r\n"
        "1         partial           1 GiB 2026-09-07 00:03:12 00:00:01.000\r\n"
    )
    assert parse_snapshot_list(text) == ["suspended", "long-clock", "tiny"]
    old = ("ID        TAG                 VM SIZE                DATE       VM CLOCK\n"
           "1         clean                  75M 2026-09-09 11:41:45   00:10:07.753\n")
    assert parse_snapshot_list(old) == ["clean"]
    for empty in ("There is no snapshot available.\r\n", "None\r\n", "No available block device supports snapshots\r\n"):
        assert parse_snapshot_list(empty) == []


# -- errors --------------------------------------------------------------------------------------


def test_qmp_error_carries_class_and_desc(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        with pytest.raises(QMPError) as info:
            qmp.execute("no-such-command")
        assert info.value.error_class == "CommandNotFound"
        assert "no-such-command" in info.value.desc and info.value.command == "no-such-command"
        assert qmp.status() == "running"  # the session survives a command error


def test_scripted_qmp_error() -> None:
    with FakeQMPServer(qmp_errors={"system_reset": ("GenericError", "boom")}) as server, connect(server) as qmp:
        with pytest.raises(QMPError, match="GenericError: boom"):
            qmp.system_reset()


def test_loadvm_of_unknown_snapshot_raises_text_error_and_leaves_vm_stopped(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        with pytest.raises(QMPError) as info:
            qmp.loadvm("missing")
        assert info.value.error_class == HMP_ERROR_CLASS
        assert info.value.desc == "Error: Snapshot 'missing' does not exist in one or more devices"
        assert qmp.status() == "restore-vm"


def test_savevm_text_error_raises() -> None:
    raw_disk = "Device 'pflash1' is writable but does not support snapshots"
    with FakeQMPServer(hmp_errors={"savevm": raw_disk}) as server, connect(server) as qmp:
        with pytest.raises(QMPError, match="does not support snapshots"):
            qmp.savevm("waa-baseline")
        assert qmp.snapshots() == []


def test_unprefixed_savevm_output_counts_as_failure() -> None:
    # Old QEMUs printed savevm/loadvm failures without "Error:"; any non-warning output fails.
    class Old(FakeQMPServer):
        def _hmp(self, conn, command_line):  # type: ignore[override]
            if command_line.startswith("loadvm"):
                return "Device 'drive0' does not have the requested snapshot 'x'\r\n"
            return super()._hmp(conn, command_line)

    with Old() as server, connect(server) as qmp:
        with pytest.raises(QMPError, match="does not have the requested snapshot"):
            qmp.loadvm("x")


def test_human_unknown_command_raises(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        assert qmp.human("info status") == "VM status: running\r\n"
        with pytest.raises(QMPError, match="unknown command"):
            qmp.human("frobnicate now")


@pytest.mark.parametrize("bad", ["", "a b", "x;quit", "snap\nquit", "1", "-opt", "a" * 65, "näme", "snap\"q"])
def test_bad_snapshot_names_rejected_before_sending(fake: FakeQMPServer, bad: str) -> None:
    with connect(fake) as qmp:
        for call in (qmp.savevm, qmp.loadvm, qmp.delvm):
            with pytest.raises(ValueError):
                call(bad)
    assert fake.executed() == ["qmp_capabilities"]
    with pytest.raises(ValueError):
        validate_snapshot_name(bad)


def test_control_characters_rejected_in_human_command_lines(fake: FakeQMPServer) -> None:
    with connect(fake) as qmp:
        with pytest.raises(ValueError):
            qmp.human("info status\nquit")
    assert fake.executed() == ["qmp_capabilities"]


# -- timeouts and connection errors ------------------------------------------------------------


def test_hanging_greeting_times_out_within_the_timeout() -> None:
    with FakeQMPServer(hang_greeting=True) as server:
        start = time.monotonic()
        with pytest.raises(QMPConnectionError) as info:
            with QMPClient(*server.address, timeout=0.5):
                pass
        elapsed = time.monotonic() - start
    assert 0.4 <= elapsed < 10  # the greeting never comes; the default timeout is 30 s
    assert f"127.0.0.1:{server.port}" in str(info.value) and "greeting" in str(info.value)


def test_hanging_command_times_out_and_session_is_closed() -> None:
    with FakeQMPServer(hang_on={"loadvm"}, snapshots=["snap"]) as server:
        with QMPClient(*server.address, timeout=60) as qmp:
            start = time.monotonic()
            with pytest.raises(QMPConnectionError) as info:
                qmp.loadvm("snap", timeout=0.4)
            assert time.monotonic() - start < 20  # the command's own timeout, not the session's 60 s
            assert "human-monitor-command" in str(info.value) and "timed out" in str(info.value)
            with pytest.raises(QMPConnectionError, match="unusable"):
                qmp.status()


def test_events_without_reply_do_not_extend_the_deadline() -> None:
    class Chatty(FakeQMPServer):
        def _handle(self, conn, text, negotiated):  # type: ignore[override]
            if '"query-status"' in text:
                while not self._stopping.wait(0.05):  # events keep coming, the reply never does
                    self._event(conn, "NOISE")
                return negotiated
            return super()._handle(conn, text, negotiated)

    with Chatty() as server, QMPClient(*server.address, timeout=0.5) as qmp:
        start = time.monotonic()
        with pytest.raises(QMPConnectionError, match="timed out"):
            qmp.status()
        assert time.monotonic() - start < 10  # the events would go on for ever
        assert qmp.events_named("NOISE")


def test_connection_refused_names_address() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(QMPConnectionError, match=f"127.0.0.1:{port}: connect"):
        with QMPClient("127.0.0.1", port, timeout=1):
            pass


def test_server_closing_connection_is_a_connection_error() -> None:
    with FakeQMPServer(snapshots=["snap"]) as server, QMPClient(*server.address, timeout=2) as qmp:
        server.stop()
        with pytest.raises(QMPConnectionError):
            qmp.status()


# -- guest resets against the local WAA simulation ---------------------------------------------


def bridged(sim, **options) -> FakeQMPServer:
    """A fake monitor whose savevm/loadvm save/restore the simulation's state."""

    def save(name: str) -> None:
        requests.post(sim.base_url + "/sim/snapshot/save", json={"name": name}, timeout=5).raise_for_status()

    def load(name: str) -> None:
        response = requests.post(sim.base_url + "/sim/snapshot/load", json={"name": name}, timeout=5)
        if response.status_code != 200:
            raise RuntimeError(f"simulation has no snapshot {name!r} ({response.status_code})")

    return FakeQMPServer(on_savevm=save, on_loadvm=load, **options)


def desktop_entries(sim) -> list[str]:
    response = requests.post(sim.base_url + "/list_directory", json={"path": DESKTOP}, timeout=5)
    assert response.status_code == 200
    return [child["name"] for child in response.json()["directory_tree"].get("children", [])]


def create_junk(sim) -> None:
    response = requests.post(sim.base_url + "/setup/create_folder", json={"path": JUNK}, timeout=5)
    assert response.status_code == 200


def test_snapshot_reset_restores_the_simulated_disk(sim) -> None:
    with bridged(sim) as fake:
        baseline = take_baseline_snapshot(fake.address, sim.base_url, name="waa-baseline", ready_deadline=10,
                                          poll_seconds=0.05)
        assert isinstance(baseline, ResetTiming) and baseline.level is ResetLevel.SNAPSHOT
        assert "junk" not in desktop_entries(sim)

        create_junk(sim)
        assert "junk" in desktop_entries(sim)

        timing = snapshot_reset(fake.address, sim.base_url, "waa-baseline", ready_deadline=10, poll_seconds=0.05)
        assert "junk" not in desktop_entries(sim)

        assert timing.level is ResetLevel.SNAPSHOT
        assert timing.monitor_seconds >= 0 and timing.ready_seconds >= 0
        assert timing.total_seconds >= timing.monitor_seconds + timing.ready_seconds - 1e-6
        assert fake.command_lines() == ["savevm waa-baseline", "info snapshots", "loadvm waa-baseline"]
        assert fake.status == "running"
        # A second task's changes are undone too: the snapshot is reusable.
        create_junk(sim)
        snapshot_reset(fake.address, sim.base_url, "waa-baseline", ready_deadline=10, poll_seconds=0.05)
        assert "junk" not in desktop_entries(sim)


def test_baseline_waits_for_probe_before_savevm() -> None:
    saved_at: list[float] = []
    with ProbeStub() as stub, FakeQMPServer(on_savevm=lambda name: saved_at.append(time.monotonic())) as fake:
        stub.down_for(0.4)
        timing = take_baseline_snapshot(fake.address, stub.url, name="later", ready_deadline=5, poll_seconds=0.05)
    assert timing.ready_seconds >= 0.3
    assert stub.first_ok_at is not None and saved_at and saved_at[0] >= stub.first_ok_at
    assert fake.command_lines() == ["savevm later", "info snapshots"]


def test_baseline_refused_when_waa_never_answers() -> None:
    with FakeQMPServer() as fake, ProbeStub() as stub:
        stub.down_for(60)
        with pytest.raises(ProviderError, match="before savevm"):
            take_baseline_snapshot(fake.address, stub.url, ready_deadline=0.3, poll_seconds=0.05)
        assert fake.command_lines() == []  # never connected to save


def test_snapshot_reset_unknown_snapshot_is_provider_error(sim) -> None:
    with bridged(sim) as fake:
        with pytest.raises(ProviderError) as info:
            snapshot_reset(fake.address, sim.base_url, "never-saved", ready_deadline=5, poll_seconds=0.05)
    message = str(info.value)
    assert f"127.0.0.1:{fake.port}" in message and sim.base_url in message
    assert "loadvm never-saved" in message and "does not exist" in message and "restore-vm" in message


def test_snapshot_reset_monitor_unreachable_is_provider_error(sim) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ProviderError, match=f"VM 127.0.0.1:{port} .*loadvm waa-baseline failed"):
        snapshot_reset(("127.0.0.1", port), sim.base_url, ready_deadline=1, monitor_timeout=1)


def test_snapshot_reset_waa_not_ready_after_loadvm_is_provider_error() -> None:
    with FakeQMPServer(snapshots=["waa-baseline"]) as fake, ProbeStub() as stub:
        stub.down_for(60)
        with pytest.raises(ProviderError, match="after loadvm waa-baseline: WAA server not ready"):
            snapshot_reset(fake.address, stub.url, ready_deadline=0.3, poll_seconds=0.05)


def test_bad_name_rejected_before_any_connection() -> None:
    with FakeQMPServer() as fake:
        with pytest.raises(ValueError):
            snapshot_reset(fake.address, "http://127.0.0.1:9", "x; quit", ready_deadline=1)
        assert fake.connections == 0


def test_reboot_reset_calls_system_reset_and_waits_for_readiness() -> None:
    with ProbeStub() as stub, FakeQMPServer(on_reset=lambda: stub.down_for(0.5)) as fake:
        timing = reboot_reset(fake.address, stub.url, ready_deadline=5, poll_seconds=0.05, settle_seconds=0)
    assert fake.resets == 1 and "system_reset" in fake.executed()
    assert timing.level is ResetLevel.REBOOT and timing.ready_seconds >= 0.4
    assert timing.total_seconds >= timing.ready_seconds


def test_reboot_reset_keeps_disk_and_resumes_a_stopped_guest(sim) -> None:
    with bridged(sim, status="paused") as fake:
        create_junk(sim)
        timing = reboot_reset(fake.address, sim.base_url, ready_deadline=5, poll_seconds=0.05, settle_seconds=0.1)
        assert fake.status == "running" and fake.executed()[-3:] == ["query-status", "cont", "query-status"]
    assert "junk" in desktop_entries(sim)  # a reboot is not a restore
    assert timing.total_seconds >= 0.1  # the settle pause counts in the total
    requests.post(sim.base_url + "/setup/recycle", json={"path": JUNK}, timeout=5)


# -- a /probe stub that can be taken down for a while ------------------------------------------


class ProbeStub:
    """An HTTP server answering GET /probe with 200, or 503 while 'down'."""

    def __init__(self) -> None:
        self.down_until = 0.0
        self.first_ok_at: float | None = None
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                up = time.monotonic() >= stub.down_until
                if up and stub.first_ok_at is None:
                    stub.first_ok_at = time.monotonic()
                self.send_response(200 if up else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def down_for(self, seconds: float) -> None:
        self.down_until = time.monotonic() + seconds
        self.first_ok_at = None

    def __enter__(self) -> ProbeStub:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()
