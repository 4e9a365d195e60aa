"""Tests of adapters/waa/browser_setup.py against a fake Chrome DevTools HTTP server."""

from __future__ import annotations

import calendar
import json
import socket
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from adapters.waa.browser_setup import (
    VISIT_TRANSITION,
    DevToolsClient,
    DevToolsError,
    HistoryPathError,
    build_history_db,
    chrome_time,
    close_tabs,
    history_upload_path,
    open_tabs,
    update_browse_history,
    urls_match,
)
from adapters.waa.client import ExecuteResult

HOSTILE = "'); DROP TABLE urls; --"
SIM_MESSAGE = "no browser in the WAA simulation: Chrome DevTools is not available"


def no_sleep(seconds: float) -> None:
    pass


# -- fake DevTools server ----------------------------------------------------------------------


class FakeBrowser(ThreadingHTTPServer):
    """A browser's DevTools HTTP endpoints, with tabs kept like Chrome (newest first)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.tabs: list[dict[str, str]] = []
        self.next_id = 1
        self.get_new_405 = True  # Chrome >= 111: GET /json/new is refused
        self.put_new_405 = False  # Chrome < 111 knew only GET
        self.simulation_501 = False  # the WAA simulation's answer to every DevTools request
        self.fail_first = 0  # answer 502 (a proxy whose browser is not up yet) this many times
        self.requests: list[tuple[str, str]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_tab(self, url: str, title: str = "") -> dict[str, str]:
        with self.lock:
            tab = {"id": f"T{self.next_id}", "type": "page", "url": url, "title": title or url}
            self.next_id += 1
            self.tabs.insert(0, tab)
            return tab

    def urls(self) -> list[str]:
        return [t["url"] for t in self.tabs]


class _Handler(BaseHTTPRequestHandler):
    server: FakeBrowser

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: object) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def _handle(self, method: str) -> None:
        srv = self.server
        srv.requests.append((method, self.path))
        if srv.simulation_501:
            return self._send(501, {"status": "error", "message": SIM_MESSAGE})
        if srv.fail_first > 0:
            srv.fail_first -= 1
            return self._send(502, "Bad Gateway")
        parts = urlsplit(self.path)
        path = parts.path
        if path == "/json/version":
            return self._send(200, {"Browser": "Chrome/120.0", "Protocol-Version": "1.3"})
        if path in ("/json", "/json/list"):
            worker = {"id": "W1", "type": "service_worker", "url": "chrome-extension://x/sw.js", "title": "sw"}
            return self._send(200, list(srv.tabs) + [worker])
        if path == "/json/new":
            if method == "PUT" and srv.put_new_405:
                return self._send(405, "Method Not Allowed")
            if method == "GET" and srv.get_new_405:
                return self._send(405, "Using unsafe HTTP verb GET to invoke /json/new. This action supports only PUT verb.")
            url = unquote(parts.query) if parts.query else "about:blank"
            return self._send(200, srv.add_tab(url))
        if path.startswith("/json/close/") or path.startswith("/json/activate/"):
            target = unquote(path.rsplit("/", 1)[1])
            with srv.lock:
                match = [t for t in srv.tabs if t["id"] == target]
                if not match:
                    return self._send(404, f"No such target id: {target}")
                if "/close/" in path:
                    srv.tabs.remove(match[0])
                    return self._send(200, "Target is closing")
                srv.tabs.remove(match[0])
                srv.tabs.insert(0, match[0])
                return self._send(200, "Target activated")
        return self._send(404, f"Unknown command: {path}")


@pytest.fixture
def browser() -> Iterator[FakeBrowser]:
    server = FakeBrowser()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def devtools(browser: FakeBrowser) -> Iterator[DevToolsClient]:
    client = DevToolsClient(browser.base_url, timeout=5)
    yield client
    client.close()


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


# -- DevToolsClient ----------------------------------------------------------------------------


def test_version_tabs_and_page_filter(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    browser.add_tab("chrome://newtab/", "New Tab")
    assert devtools.version()["Browser"].startswith("Chrome")
    tabs = devtools.tabs()
    assert [t.url for t in tabs] == ["chrome://newtab/"]  # the service worker is not a tab


def test_open_tab_uses_put_then_get_on_405(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    tab = devtools.open_tab("https://example.com/a")
    assert tab.url == "https://example.com/a"
    assert [m for m, p in browser.requests if p.startswith("/json/new")] == ["PUT"]

    # A browser that only knows GET (Chrome before 111): PUT answers 405, the client uses GET.
    browser.put_new_405 = True
    browser.get_new_405 = False
    browser.requests.clear()
    tab = devtools.open_tab("https://example.com/b")
    assert tab.url == "https://example.com/b"
    assert [m for m, p in browser.requests if p.startswith("/json/new")] == ["PUT", "GET"]


def test_open_tab_url_is_data(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    url = "https://www.drugs.com/tamiflu.html?a=1&b=" + HOSTILE + "#side-effects"
    tab = devtools.open_tab(url)
    assert tab.url == url
    assert browser.urls() == [url]


def test_close_and_activate(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    a = browser.add_tab("https://a.example/")
    browser.add_tab("https://b.example/")
    devtools.activate(a["id"])
    assert browser.urls()[0] == "https://a.example/"
    devtools.close_tab(a["id"])
    assert browser.urls() == ["https://b.example/"]
    with pytest.raises(DevToolsError) as info:
        devtools.close_tab("nope")
    assert info.value.status == 404 and "No such target id: nope" in str(info.value)


def test_unreachable_port_names_url_and_tries() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    slept: list[float] = []
    client = DevToolsClient(url, timeout=2)
    with pytest.raises(DevToolsError) as info:
        client.wait_until_available(tries=4, interval=5.0, sleep=slept.append)
    message = str(info.value)
    assert url in message and "not reachable after 4 tries" in message
    assert slept == [5.0, 5.0, 5.0]
    assert info.value.status is None


def test_wait_defaults_are_waas() -> None:
    import inspect

    params = inspect.signature(DevToolsClient.wait_until_available).parameters
    assert params["tries"].default == 15 and params["interval"].default == 5.0


def test_wait_retries_502_until_browser_is_up(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    browser.fail_first = 2
    slept: list[float] = []
    assert devtools.wait_until_available(tries=5, interval=1.5, sleep=slept.append)["Browser"]
    assert slept == [1.5, 1.5]


def test_simulation_501_message_surfaces_without_retries(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    browser.simulation_501 = True
    slept: list[float] = []
    with pytest.raises(DevToolsError) as info:
        devtools.wait_until_available(sleep=slept.append)
    assert info.value.status == 501
    assert SIM_MESSAGE in str(info.value) and browser.base_url in str(info.value)
    assert slept == [] and len(browser.requests) == 1
    with pytest.raises(DevToolsError, match="no browser in the WAA simulation"):
        open_tabs(devtools, ["https://example.com"], sleep=no_sleep)


# -- open_tabs / close_tabs --------------------------------------------------------------------


def test_open_tabs_closes_the_default_tab_after_the_first_url(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    browser.add_tab("chrome://newtab/", "New Tab")
    urls = ["https://www.lonelyplanet.com", "https://www.airbnb.com", "https://www.tripadvisor.com"]
    opened = open_tabs(devtools, urls, sleep=no_sleep)
    assert [t.url for t in opened] == urls
    assert sorted(browser.urls()) == sorted(urls)  # the startup tab is gone, nothing reused
    new_and_close = [(m, p.split("?")[0].rsplit("/", 1)[0]) for m, p in browser.requests
                     if p.startswith(("/json/new", "/json/close"))]
    assert new_and_close == [("PUT", "/json"), ("GET", "/json/close"), ("PUT", "/json"), ("PUT", "/json")]


def test_open_tabs_keeps_other_preexisting_tabs(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    browser.add_tab("chrome://newtab/")  # oldest: the default tab
    browser.add_tab("https://keep.example/")
    open_tabs(devtools, ["https://x.example/"], sleep=no_sleep)
    assert sorted(browser.urls()) == ["https://keep.example/", "https://x.example/"]


def test_open_tabs_with_no_tab_closes_nothing(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    open_tabs(devtools, ["https://x.example/", "https://y.example/"], sleep=no_sleep)
    assert sorted(browser.urls()) == ["https://x.example/", "https://y.example/"]


def test_open_tabs_rejects_non_string_urls(devtools: DevToolsClient) -> None:
    with pytest.raises(ValueError, match=r"urls_to_open\[1\]"):
        open_tabs(devtools, ["https://x.example/", 3], sleep=no_sleep)  # type: ignore[list-item]


def test_close_tabs_task_06fe7178(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    """The real chrome task: open three sites, then close tripadvisor."""
    browser.add_tab("chrome://newtab/")
    open_tabs(devtools, ["https://www.lonelyplanet.com", "https://www.airbnb.com", "https://www.tripadvisor.com"],
              sleep=no_sleep)
    # The browser has since followed redirects: trailing slash added.
    for tab in browser.tabs:
        tab["url"] += "/"
    slept: list[float] = []
    closed = close_tabs(devtools, ["https://www.tripadvisor.com"], sleep=slept.append)
    assert [t.url for t in closed] == ["https://www.tripadvisor.com/"]
    assert sorted(browser.urls()) == ["https://www.airbnb.com/", "https://www.lonelyplanet.com/"]
    assert slept[0] == 5.0  # WAA's "wait for Chrome to finish launching"


def test_close_tabs_is_normalised_equality_not_prefix(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    browser.add_tab("https://example.com/page/sub")
    browser.add_tab("https://example.com/page?q=1")
    browser.add_tab("HTTPS://WWW.Example.COM/page")
    closed = close_tabs(devtools, ["https://example.com/page", "https://example.com/nothing"], initial_wait=0,
                        sleep=no_sleep)
    assert [t.url for t in closed] == ["HTTPS://WWW.Example.COM/page"]
    assert sorted(browser.urls()) == ["https://example.com/page/sub", "https://example.com/page?q=1"]


def test_close_tabs_one_tab_per_entry_oldest_first(browser: FakeBrowser, devtools: DevToolsClient) -> None:
    first = browser.add_tab("https://dup.example/")
    second = browser.add_tab("https://dup.example/")
    third = browser.add_tab("https://dup.example/")
    closed = close_tabs(devtools, ["https://dup.example"], initial_wait=0, sleep=no_sleep)
    assert [t.id for t in closed] == [first["id"]]
    closed = close_tabs(devtools, ["https://dup.example", "https://dup.example"], initial_wait=0, sleep=no_sleep)
    assert [t.id for t in closed] == [second["id"], third["id"]]
    assert browser.tabs == []


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("https://www.tripadvisor.com", "https://tripadvisor.com/", True),
        ("HTTPS://Example.com/Path", "https://example.com/Path", True),
        ("https://example.com/Path", "https://example.com/path", False),
        ("https://example.com/a", "https://example.com/a/b", False),
        ("https://example.com/a?x=1", "https://example.com/a", False),
        ("https://example.com/a#f", "https://example.com/a", False),
        ("http://example.com", "https://example.com", False),
        (None, None, True),
        (None, "https://example.com", False),
    ],
)
def test_urls_match(a: str | None, b: str | None, same: bool) -> None:
    assert urls_match(a, b) is same


# -- history -----------------------------------------------------------------------------------


def _open_db(data: bytes, tmp_path: Path) -> "closing[sqlite3.Connection]":
    """The built file, written out and opened; `with` closes it."""
    path = tmp_path / "History"
    path.write_bytes(data)
    return closing(sqlite3.connect(path))


NOW = datetime(2024, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
# Unix epoch in Chrome time is 11644473600 s after 1601-01-01.
NOW_CHROME_US = (calendar.timegm(NOW.utctimetuple()) + 11_644_473_600) * 1_000_000


def test_chrome_time() -> None:
    assert chrome_time(datetime(1601, 1, 1, tzinfo=timezone.utc)) == 0
    assert chrome_time(datetime(1970, 1, 1, tzinfo=timezone.utc)) == 11_644_473_600_000_000
    assert chrome_time(NOW) == NOW_CHROME_US
    assert chrome_time(NOW.replace(tzinfo=None)) == NOW_CHROME_US  # naive is UTC
    plus_two = NOW.astimezone(timezone(timedelta(hours=2)))
    assert chrome_time(plus_two) == NOW_CHROME_US


def test_build_history_db_rows_and_timestamps(tmp_path: Path) -> None:
    history = [
        {"url": "https://www.youtube.com/watch?v=dQw4w9WgXcQ", "title": "Rick Astley", "visit_time_from_now_in_seconds": 3600},
        {"url": "https://www.youtube.com/watch?v=9bZkp7q19f0", "title": "PSY - GANGNAM STYLE(강남스타일) M/V",
         "visit_time_from_now_in_seconds": 1631},
        {"url": "https://www.nytimes.com/", "title": "The New York Times", "visit_time_from_now_in_seconds": 0.5},
        {"url": "https://www.nytimes.com/", "title": "The New York Times", "visit_time_from_now_in_seconds": 300},
    ]
    with _open_db(build_history_db(history, now=NOW), tmp_path) as db:
        urls = db.execute("SELECT id, url, title, visit_count, typed_count, last_visit_time, hidden FROM urls ORDER BY id").fetchall()
        visits = db.execute("SELECT url, visit_time, from_visit, transition, segment_id, visit_duration FROM visits ORDER BY id").fetchall()
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    expected_times = [NOW_CHROME_US - 3600_000_000, NOW_CHROME_US - 1631_000_000, NOW_CHROME_US - 500_000,
                      NOW_CHROME_US - 300_000_000]
    assert urls == [
        (i + 1, h["url"], h["title"], 1, 0, t, 0) for i, (h, t) in enumerate(zip(history, expected_times))
    ]
    assert visits == [(i + 1, t, 0, VISIT_TRANSITION, 0, 0) for i, t in enumerate(expected_times)]
    assert VISIT_TRANSITION == 805306368
    assert meta == {"mmap_status": "-1", "version": "68", "last_compatible_version": "16"}


def test_build_history_db_schema_matches_what_chrome_and_waa_read(tmp_path: Path) -> None:
    with _open_db(build_history_db([], now=NOW), tmp_path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        url_cols = [r[1] for r in db.execute("PRAGMA table_info(urls)")]
        visit_cols = [r[1] for r in db.execute("PRAGMA table_info(visits)")]
        assert db.execute("SELECT count(*) FROM urls").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM downloads").fetchone() == (0,)
    assert {"meta", "urls", "visits", "visit_source", "keyword_search_terms", "downloads", "segments",
            "segment_usage", "content_annotations", "context_annotations", "clusters", "visited_links"} <= tables
    assert url_cols == ["id", "url", "title", "visit_count", "typed_count", "last_visit_time", "hidden"]
    assert visit_cols[:8] == ["id", "url", "visit_time", "from_visit", "external_referrer_url", "transition",
                              "segment_id", "visit_duration"]


def test_build_history_db_hostile_text_is_stored_verbatim(tmp_path: Path) -> None:
    history = [{"url": "https://evil.example/?q=" + HOSTILE, "title": HOSTILE + '"; SELECT 1; --', "visit_time_from_now_in_seconds": 10}]
    with _open_db(build_history_db(history, now=NOW, browser="edge"), tmp_path) as db:
        assert db.execute("SELECT url, title FROM urls").fetchall() == [(history[0]["url"], history[0]["title"])]
        assert db.execute("SELECT count(*) FROM visits").fetchone() == (1,)


def test_build_history_db_default_now_is_current(tmp_path: Path) -> None:
    before = chrome_time(datetime.now(timezone.utc))
    data = build_history_db([{"url": "u", "title": "t", "visit_time_from_now_in_seconds": 60}])
    after = chrome_time(datetime.now(timezone.utc))
    with _open_db(data, tmp_path) as db:
        (stamp,) = db.execute("SELECT last_visit_time FROM urls").fetchone()
    assert before - 60_000_000 <= stamp <= after - 60_000_000


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"url": 1, "title": "t", "visit_time_from_now_in_seconds": 1}, r"history\[0\].url"),
        ({"url": "u", "visit_time_from_now_in_seconds": 1}, r"history\[0\].title"),
        ({"url": "u", "title": "t", "visit_time_from_now_in_seconds": "1"}, "visit_time_from_now_in_seconds"),
        ({"url": "u", "title": "t", "visit_time_from_now_in_seconds": True}, "visit_time_from_now_in_seconds"),
    ],
)
def test_build_history_db_rejects_bad_entries(entry: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        build_history_db([entry], now=NOW)


def test_build_history_db_rejects_unknown_browser() -> None:
    with pytest.raises(ValueError, match="browser"):
        build_history_db([], browser="firefox")  # type: ignore[arg-type]


# -- upload path -------------------------------------------------------------------------------


@dataclass
class FakeVM:
    """Answers /execute like the VM's Python would run the path program."""

    system: str = "Windows"
    env: dict[str, str] | None = None
    returncode: int = 0
    error: str = ""

    def __post_init__(self) -> None:
        self.commands: list[object] = []
        self.uploads: list[tuple[str, bytes]] = []

    def execute(self, command: list[str] | str, shell: bool = False) -> ExecuteResult:
        self.commands.append(command)
        assert isinstance(command, list) and command[:2] == ["python", "-c"] and not shell
        if self.returncode:
            return ExecuteResult("success", "", self.error, self.returncode)
        # Evaluate the program's path table the way the VM would, with ntpath for Windows.
        import ntpath
        import posixpath

        program = command[2]
        browser_dirs = ("Microsoft", "Edge") if "'Edge'" in program else ("Google", "Chrome")
        env = self.env if self.env is not None else {"USERPROFILE": r"C:\Users\Docker", "HOME": "/home/user"}
        if self.system == "Windows":
            base = env.get("USERPROFILE")
            path = ntpath.join(base, "AppData", "Local", *browser_dirs, "User Data", "Default", "History") if base else ""
        elif self.system == "Linux":
            base = env.get("HOME")
            folder = "microsoft-edge" if browser_dirs[0] == "Microsoft" else "google-chrome"
            path = posixpath.join(base, ".config", folder, "Default", "History") if base else ""
        else:
            path = ""
        return ExecuteResult("success", f"{self.system}\r\n{path}\r\n", "", 0)

    def setup_upload(self, path: str, data: bytes) -> None:
        self.uploads.append((path, data))


def test_path_program_is_valid_python_and_has_waa_paths() -> None:
    from adapters.waa.browser_setup import _PATH_PROGRAMS

    for browser, program in _PATH_PROGRAMS.items():
        compile(program, f"<{browser}>", "exec")
    assert "'Google', 'Chrome', 'User Data', 'Default', 'History'" in _PATH_PROGRAMS["chrome"]
    assert "'Microsoft', 'Edge', 'User Data', 'Default', 'History'" in _PATH_PROGRAMS["edge"]


def test_path_program_runs_here() -> None:
    """The constant program itself, run by this Python: platform and a path ending in History."""
    import subprocess
    import sys

    from adapters.waa.browser_setup import _PATH_PROGRAMS

    out = subprocess.run([sys.executable, "-c", _PATH_PROGRAMS["chrome"]], capture_output=True, text=True, check=True)
    import platform

    system, path = out.stdout.splitlines()
    assert system == platform.system()
    assert path.endswith("History") and ("Chrome" in path or "google-chrome" in path)


def test_history_upload_path_windows() -> None:
    vm = FakeVM()
    assert history_upload_path(vm, "chrome") == r"C:\Users\Docker\AppData\Local\Google\Chrome\User Data\Default\History"
    assert history_upload_path(vm, "edge") == r"C:\Users\Docker\AppData\Local\Microsoft\Edge\User Data\Default\History"
    assert len(vm.commands) == 2


def test_history_upload_path_linux() -> None:
    assert history_upload_path(FakeVM(system="Linux"), "edge") == "/home/user/.config/microsoft-edge/Default/History"


@pytest.mark.parametrize(
    ("vm", "browser", "fragment"),
    [
        (FakeVM(returncode=1, error="'python' is not available in the WAA simulation\n"), "edge",
         r"update_browse_history_edge \(edge\).*exited with 1.*not available in the WAA simulation"),
        (FakeVM(system="Plan9"), "chrome", r"update_browse_history \(chrome\).*unsupported operating system 'Plan9'"),
        (FakeVM(env={}), "chrome", r"update_browse_history \(chrome\).*USERPROFILE is not set"),
    ],
)
def test_history_upload_path_errors(vm: FakeVM, browser: str, fragment: str) -> None:
    with pytest.raises(HistoryPathError, match=fragment):
        history_upload_path(vm, browser)  # type: ignore[arg-type]


def test_history_upload_path_wraps_client_errors() -> None:
    from adapters.waa.errors import WAAConnectionError

    class Down:
        def execute(self, command: object, shell: bool = False) -> ExecuteResult:
            raise WAAConnectionError("/execute", "cannot connect")

    with pytest.raises(HistoryPathError, match=r"\(edge\).*/execute failed.*cannot connect"):
        history_upload_path(Down(), "edge")


def test_update_browse_history_uploads_db(tmp_path: Path) -> None:
    vm = FakeVM()
    history = [{"url": "https://www.bbc.co.uk/", "title": "BBC", "visit_time_from_now_in_seconds": 1500}]
    path = update_browse_history(vm, history, "chrome", now=NOW)
    assert path.endswith(r"Google\Chrome\User Data\Default\History")
    [(uploaded_path, data)] = vm.uploads
    assert uploaded_path == path
    with _open_db(data, tmp_path) as db:
        assert db.execute("SELECT url, last_visit_time FROM urls").fetchall() == [
            ("https://www.bbc.co.uk/", NOW_CHROME_US - 1500_000_000)
        ]


def test_update_browse_history_validates_before_touching_the_vm() -> None:
    vm = FakeVM()
    with pytest.raises(ValueError):
        update_browse_history(vm, [{"url": "u"}], "edge")
    assert vm.commands == [] and vm.uploads == []


WAA_ASSET = Path("/tmp/waa/src/win-arena-container/client/desktop_env/assets/history_empty.sqlite")


@pytest.mark.skipif(not WAA_ASSET.exists(), reason="WAA's history_empty.sqlite is not checked out")
def test_schema_equals_waas_asset(tmp_path: Path) -> None:
    """Same tables, columns (type, default, NOT NULL, key) and indexes as the file WAA copies."""

    def shape(db: sqlite3.Connection) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, kind in db.execute("SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"):
            pragma = "table_info" if kind == "table" else "index_info"
            out[name] = (kind, db.execute(f"PRAGMA {pragma}('{name}')").fetchall())
        return out

    with _open_db(build_history_db([], now=NOW), tmp_path) as ours, closing(sqlite3.connect(f"file:{WAA_ASSET}?mode=ro", uri=True)) as theirs:
        assert shape(ours) == shape(theirs)
