"""The live adapter, setup runner and client against a real local WAA simulation process."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkTask
from adapters.outcomes import EnvironmentFault
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAConnectionError, WAAHTTPError
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter
from adapters.waa.localenv.launcher import LocalEnvHandle
from adapters.waa.setup_steps import SetupRunner, SetupStepError
from adapters.waa.settle import SettlePolicy

HOSTILE = [
    "'); import os; os.system('x') #",
    'say "hi" and \'bye\'',
    "two\nlines",
    "back\\slash {braces} $(whoami) `id`",
]


@pytest.fixture()
def client(sim: LocalEnvHandle) -> Iterator[WAAClient]:
    c = WAAClient(sim.base_url)
    c._session.post(sim.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    yield c
    c.close()


@pytest.fixture()
def adapter(client: WAAClient, tmp_path: Path) -> WAALiveAdapter:
    return WAALiveAdapter(client, WAATaskCatalog(bundled_suite_dir()), tmp_path, LiveAdapterSettings(settle=SettlePolicy.fixed(0)))


def _notepad_task() -> BenchmarkTask:
    return BenchmarkTask(
        task_id="t-notepad",
        instruction="type",
        domain="notepad",
        raw_config={"config": [{"type": "launch", "parameters": {"command": "notepad"}}]},
        evaluation_spec={"func": "exact_match", "result": {"type": "rule", "rules": {}}, "expected": {"type": "rule", "rules": {}}},
    )


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_typed_never_run(adapter: WAALiveAdapter, client: WAAClient, text: str) -> None:
    before = client.list_directory("C:\\Users\\Docker")
    observation = adapter.reset(_notepad_task())
    editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
    adapter.step(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
    observation, done, info = adapter.step(BenchmarkAction(type=ActionType.TYPE, text=text))
    assert not done and "error" not in info
    editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
    assert editor.attributes["value"] == text
    assert client.list_directory("C:\\Users\\Docker") == before


def test_rejected_action_is_reported_not_raised(adapter: WAALiveAdapter) -> None:
    adapter.reset(_notepad_task())
    # An element id that is not on screen cannot be translated: the step reports it.
    with pytest.raises(Exception, match="not on screen"):
        adapter.apply(BenchmarkAction(type=ActionType.CLICK, target_node_id="no-such-id"))


def test_setup_failures_name_the_step(client: WAAClient, tmp_path: Path) -> None:
    runner = SetupRunner(client, tmp_path, sleep=lambda s: None)
    with pytest.raises(SetupStepError, match=r"setup step 0 \(teleport\): unsupported step type"):
        runner.run([{"type": "teleport", "parameters": {}}])
    with pytest.raises(SetupStepError, match=r"setup step 1 \(activate_window\): no window matching 'Nowhere'"):
        runner.run([{"type": "sleep", "parameters": {"seconds": 0}}, {"type": "activate_window", "parameters": {"window_name": "Nowhere"}}])
    with pytest.raises(SetupStepError, match=r"\(open\): file to open does not exist"):
        runner.run([{"type": "open", "parameters": {"path": "C:\\Users\\Docker\\missing.txt"}}])
    with pytest.raises(SetupStepError, match=r"bad parameters"):
        runner.run([{"type": "launch", "parameters": {"program": "notepad"}}])


def test_execute_until_retries_and_gives_up(client: WAAClient, tmp_path: Path) -> None:
    sleeps: list[float] = []
    runner = SetupRunner(client, tmp_path, sleep=sleeps.append)
    registry = "powershell -Command \"Get-ItemPropertyValue -Path 'HKCU:\\Control Panel\\Desktop' -Name 'WallPaper'\""
    runner.run([{"type": "execute", "parameters": {"command": registry, "until": {"returncode": 0}, "stdout": "out.txt"}}])
    assert sleeps == [] and (tmp_path / "out.txt").exists()
    with pytest.raises(SetupStepError, match="never met"):
        runner.run([{"type": "execute", "parameters": {"command": registry, "until": {"stdout": "never-printed"}}}])
    assert len(sleeps) >= 50


def test_fixed_waits_are_skipped_only_where_the_vm_acts_at_once(client: WAAClient, tmp_path: Path) -> None:
    """A task's `sleep` steps wait on a real VM; on one that acts synchronously (the simulation
    without its slow start-up quirks) they wait for nothing and are skipped."""
    from adapters.vms.local import LocalSimulationProvider

    steps = [{"type": "sleep", "parameters": {"seconds": 0.3}}, {"type": "sleep", "parameters": {"seconds": 2}}]
    real: list[float] = []
    SetupRunner(client, tmp_path, sleep=real.append).run(steps)
    assert real == [0.3, 2.0]
    synchronous: list[float] = []
    SetupRunner(client, tmp_path, sleep=synchronous.append, fixed_waits=False).run(steps)
    assert synchronous == []
    with pytest.raises(SetupStepError, match="negative"):
        SetupRunner(client, tmp_path, fixed_waits=False).run([{"type": "sleep", "parameters": {"seconds": -1}}])
    # Which providers vouch for it: the plain simulation does, the one with slow app start-up does not.
    assert LocalSimulationProvider(tmp_path / "a").acts_synchronously
    assert not LocalSimulationProvider(tmp_path / "b", quirks=True).acts_synchronously


class _FlakyHandler(http.server.BaseHTTPRequestHandler):
    hits: dict[str, int] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        count = self.hits[self.path] = self.hits.get(self.path, 0) + 1
        if self.path.startswith("/screenshot") and count <= 2:
            self.send_response(500)
            self.end_headers()
            return
        body = b"file-content" if self.path.startswith("/download") else b"\x89PNG"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) * (10 if self.path.startswith("/download/cut") else 1)))
        self.end_headers()
        self.wfile.write(body)  # then the connection closes: short of a /download/cut answer's length

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def flaky_server() -> Iterator[str]:
    _FlakyHandler.hits = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_reads_retry_on_5xx_and_writes_do_not(flaky_server: str) -> None:
    client = WAAClient(flaky_server, backoff_seconds=0.01)
    assert client.screenshot() == b"\x89PNG"
    assert _FlakyHandler.hits["/screenshot"] == 3
    with pytest.raises(WAAHTTPError) as info:
        client.setup_close_all()  # POST to a server without that route: not retried
    assert info.value.endpoint == "/setup/close_all"


def test_unreachable_server_is_a_connection_error() -> None:
    client = WAAClient("http://127.0.0.1:9", read_retries=1, backoff_seconds=0.01)
    with pytest.raises(WAAConnectionError, match="/screenshot"):
        client.screenshot()
    assert client.probe() is False
    with pytest.raises(WAAConnectionError, match="not ready"):
        client.wait_until_ready(0.2, poll_seconds=0.05)


def test_download_is_fetched_once_then_uploaded(client: WAAClient, flaky_server: str, tmp_path: Path) -> None:
    runner = SetupRunner(client, tmp_path)
    step = {"type": "download", "parameters": {"files": [{"url": flaky_server + "/download/a.txt", "path": "C:\\Users\\Docker\\Downloads\\a.txt"}]}}
    runner.run([step])
    runner.run([step])
    assert _FlakyHandler.hits["/download/a.txt"] == 1
    assert client.get_file("C:\\Users\\Docker\\Downloads\\a.txt") == b"file-content"


def test_a_download_the_file_host_cuts_short_is_infrastructure(client: WAAClient, flaky_server: str, tmp_path: Path) -> None:
    runner = SetupRunner(client, tmp_path)
    url = flaky_server + "/download/cut.txt"
    with pytest.raises(EnvironmentFault, match="host download"):
        runner.run([{"type": "download", "parameters": {"files": [{"url": url, "path": "C:\\Users\\Docker\\cut.txt"}]}}])
    assert not runner.download_cache_path(url, "cut.txt").exists()  # nothing half-fetched is kept


def test_launch_is_verified_by_a_new_window(client: WAAClient, tmp_path: Path) -> None:
    runner = SetupRunner(client, tmp_path, launch_verify_seconds=0.5)
    runner.run([{"type": "launch", "parameters": {"command": ["cmd", "/c", "start ms-settings:storagesense"]}}])
    assert "Settings" in client.obs_winagent().window_names
    # The simulation, like WAA, answers 200 for a program it cannot start: verification catches it.
    with pytest.raises(
        SetupStepError, match=r"setup step 0 \(launch\): 'vlc' was launched but neither a new window nor a new 'vlc'"
    ):
        runner.run([{"type": "launch", "parameters": {"command": "vlc"}}])
    # socat (launched by 23 real tasks) does not exist on Windows: skipped and noted, not failed.
    runner.run([{"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}}])
    assert any("socat" in note for note in runner.notes)
    # Commands with no window to check (process control) are not verified.
    runner.run([{"type": "launch", "parameters": {"command": ["powershell", "-Command", "Stop-Process", "-Name", "vlc"]}}])
