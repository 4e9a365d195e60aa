"""Browser getters and metrics (Chrome / Edge tasks) against an in-memory VM and a fake DevTools.

The fake VM (conftest's FakeVM) serves real profile files: Preferences / Bookmarks JSON, History
and Cookies SQLite databases built here, desktop .lnk/.url files, and the accessibility tree. A
small http.server on 127.0.0.1 plays the browser's DevTools HTTP endpoints and a web server.
Every evaluator spec below is the one of a real WAA chrome/msedge task.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import threading
from contextlib import closing
from datetime import datetime
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote
from xml.sax.saxutils import quoteattr

import pytest

from adapters.waa.browser_setup import build_history_db
from adapters.waa.client import ExecuteResult
from adapters.waa.evaluator import GETTERS, METRICS, GetterContext
from adapters.waa.evaluator import getters_browser as gb
from adapters.waa.evaluator import metrics_browser as mb
from adapters.waa.evaluator.errors import EvaluationConfigError

LOCAL = r"C:\Users\Docker\AppData\Local"
HOME = r"C:\Users\Docker"
# What the VM's Python prints for PROFILE_PATHS_PROGRAM on a WAA VM (os.path.join keeps the '/'
# of WAA's relative paths).
PATHS = {
    "chrome/Preferences": LOCAL + r"\Google/Chrome/User Data/Default/Preferences",
    "chrome/Local State": LOCAL + r"\Google/Chrome/User Data/Local State",
    "chrome/Bookmarks": LOCAL + r"\Google/Chrome/User Data/Default/Bookmarks",
    "chrome/Cookies": LOCAL + r"\Google/Chrome/User Data/Default/Network/Cookies",
    "chrome/History": HOME + r"\AppData\Local\Google\Chrome\User Data\Default\History",
    "edge/Preferences": LOCAL + r"\Microsoft/Edge/User Data/Default/Preferences",
    "edge/Secure Preferences": LOCAL + r"\Microsoft/Edge/User Data/Default/Secure Preferences",
    "edge/Bookmarks": LOCAL + r"\Microsoft/Edge/User Data/Default/Bookmarks",
    "edge/Cookies": LOCAL + r"\Microsoft/Edge/User Data/Default/Network/Cookies",
    "edge/History": HOME + r"\AppData\Local\Microsoft\Edge\User Data\Default\History",
}
DESKTOP = r"C:\Users\Docker\Desktop"
TASKS = Path("/work/shared/waa-tasks/examples")


def _key(command: list[str]) -> str:
    return " ".join(command)


@pytest.fixture
def bvm(vm):
    """The conftest FakeVM, set up as a WAA VM with a browser profile (files added per test)."""
    vm.commands[_key(gb.PROFILE_PATHS_COMMAND)] = ExecuteResult("success", json.dumps(PATHS) + "\n", "", 0)
    vm.commands[_key(gb.KILL_EDGE_COMMAND)] = ExecuteResult("success", "", "", 0)
    vm.directories[DESKTOP] = {"type": "directory", "name": "Desktop", "children": []}
    return vm


def put(vm, key: str, content: Any) -> None:
    """Store a profile file (a dict/list becomes JSON) under the path FakeVM looks up."""
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    vm.files[PATHS[key].replace("/", "\\")] = data


def put_desktop(vm, name: str, data: bytes) -> None:
    vm.files[DESKTOP + "\\" + name] = data
    vm.directories[DESKTOP]["children"].append({"type": "file", "name": name})


def ctx_for(vm, tmp_path, **kwargs) -> GetterContext:
    return GetterContext(vm=vm, cache_dir=tmp_path / "cache", **kwargs)


def cookies_db(host_keys: list[str]) -> bytes:
    """A Cookies database with Chrome's leading columns (host_key is column 1)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Cookies"
        with closing(sqlite3.connect(path)) as conn:
            conn.execute(
                "CREATE TABLE cookies(creation_utc INTEGER NOT NULL, host_key TEXT NOT NULL, "
                "top_frame_site_key TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, "
                "encrypted_value BLOB NOT NULL, path TEXT NOT NULL, expires_utc INTEGER NOT NULL)"
            )
            for index, host in enumerate(host_keys):
                conn.execute(
                    "INSERT INTO cookies VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (13300000000000000 + index, host, "", f"c{index}", "v", b"", "/", 0),
                )
            conn.commit()
        return path.read_bytes()


def lnk_file(description: str, arguments: str = "") -> bytes:
    """A minimal Shell Link (.lnk): header + NAME_STRING (+ COMMAND_LINE_ARGUMENTS), Unicode."""
    flags = 0x04 | 0x80 | (0x20 if arguments else 0)  # HasName | IsUnicode | HasArguments
    clsid = bytes.fromhex("0114020000000000c000000000000046")
    header = struct.pack("<I16sIIQQQIIIHHII", 0x4C, clsid, flags, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0)

    def string(text: str) -> bytes:
        return struct.pack("<H", len(text)) + text.encode("utf-16-le")

    return header + string(description) + (string(arguments) if arguments else b"") + b"\0\0\0\0"


def a11y(address: str | None) -> str:
    """A uia accessibility tree as WAA's server renders it, with Chrome's address bar."""
    bar = "" if address is None else (
        f'<pane name=""><edit name="Address and search bar" val:value={quoteattr(address)}/></pane>'
    )
    return (
        '<desktop xmlns:val="uri:deskat:value.at-spi.gnome.org" '
        'xmlns:st="uri:deskat:state.at-spi.gnome.org">'
        '<pane name="Taskbar"><edit name="Address and search bar" val:value="decoy.example"/></pane>'
        f'<chrome_widgetwin_1 name="Page - Google Chrome">{bar}</chrome_widgetwin_1>'
        "</desktop>"
    )


# -- a fake browser: DevTools HTTP endpoints + a web server -------------------------------------


class FakeBrowser:
    def __init__(self) -> None:
        self.tabs: list[dict[str, Any]] = []  # most recently active first, like /json/list
        self.pages: dict[str, tuple[int, str, bytes]] = {}  # path -> (status, content type, body)
        self.redirects: dict[str, str] = {}  # URL opened -> URL the tab ends on
        self.titles: dict[str, str] = {}
        self.devtools_status: int | None = None  # answer every /json call with this status
        self.requests: list[str] = []
        self._next = 0

    def reset(self) -> None:
        self.__init__()

    def add_tab(self, url: str, title: str = "") -> dict[str, Any]:
        self._next += 1
        tab = {"id": f"T{self._next}", "type": "page", "url": url, "title": title or url}
        self.tabs.insert(0, tab)
        return tab


class _Handler(BaseHTTPRequestHandler):
    browser: FakeBrowser

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode())

    def _devtools(self) -> None:
        b = self.browser
        b.requests.append(f"{self.command} {self.path}")
        if b.devtools_status is not None:
            self._send(b.devtools_status, b"Bad Gateway", "text/plain")
            return
        if self.path == "/json/version":
            self._json({"Browser": "Chrome/120.0", "Protocol-Version": "1.3"})
        elif self.path == "/json/list":
            self._json(b.tabs + [{"id": "W1", "type": "service_worker", "url": "chrome-extension://x"}])
        elif self.path.startswith("/json/new?"):
            url = unquote(self.path[len("/json/new?"):])
            final = b.redirects.get(url, url)
            self._json(b.add_tab(final, b.titles.get(final, final)))
        elif self.path.startswith("/json/close/"):
            target = self.path.rsplit("/", 1)[1]
            b.tabs[:] = [t for t in b.tabs if t["id"] != target]
            self._send(200, b"Target is closing", "text/plain")
        else:
            self._send(404, b"unknown", "text/plain")

    def do_GET(self) -> None:
        if self.path.startswith("/json"):
            self._devtools()
            return
        status, content_type, body = self.browser.pages.get(self.path, (404, "text/html", b"<title>404</title>"))
        self._send(status, body, content_type)

    def do_PUT(self) -> None:
        self._devtools()


@pytest.fixture(scope="module")
def _server():
    browser = FakeBrowser()
    handler = type("Handler", (_Handler,), {"browser": browser})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield browser, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def browser(_server, monkeypatch):
    state, url = _server
    state.reset()
    state.url = url
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(gb, "TAB_POLL_SECONDS", 0.01)
    return state


# -- the real tasks' evaluator specs ---------------------------------------------------------------

SPEC = {
    "dnt": {"func": "exact_match", "result": {"type": "enable_do_not_track"},
            "expected": {"type": "rule", "rules": {"expected": "true"}}},
    "tabs": {"func": "is_expected_tabs", "result": {"type": "open_tabs_info"},
             "expected": {"type": "rule", "rules": {"type": "url", "urls": [
                 "https://www.lonelyplanet.com", "https://www.airbnb.com", "https://www.tripadvisor.com"]}}},
    "profile": {"func": "exact_match", "result": {"type": "profile_name"},
                "expected": {"type": "rule", "rules": {"expected": "Thomas"}}},
    "shortcut": {"func": "is_shortcut_on_desktop", "result": {"type": "shortcuts_on_desktop"},
                 "expected": {"type": "rule", "rules": {"type": "description", "description":
                              "Play Puzzle Game 2048. Use your arrow keys to move the tiles."}}},
    "history": {"func": "check_history_deleted", "result": {"type": "history", "dest": "history.sqlite"},
                "expected": {"type": "rule", "rules": {"type": "keywords", "keywords": ["youtube"]}}},
    "experiments": {"func": "check_enabled_experiments", "result": {"type": "enabled_experiments"},
                    "expected": {"type": "rule", "rules": {"type": "names",
                                 "names": ["show-performance-metrics-hud"]}}},
    "bookmarks": {"func": "is_expected_bookmarks", "result": {"type": "bookmarks"},
                  "expected": {"type": "rule", "rules": {"type": "bookmark_bar_websites_urls",
                               "urls": ["https://jalammar.github.io/illustrated-transformer/"]}}},
    "cookies": {"func": "is_cookie_deleted", "result": {"type": "cookie_data", "dest": "Cookies"},
                "expected": {"type": "rule", "rules": {"type": "domains", "domains": [".amazon.com"]}}},
    "flight": {"func": "check_direct_json_object",
               "result": {"type": "active_tab_url_parse", "goto_prefix": "https://www.",
                          "parse_keys": ["fromStation", "toStation", "departing"], "replace": {"departing": "time"}},
               "expected": {"type": "rule_relativeTime", "rules": {"relativeTime": {"from": "next Monday"},
                            "expected": {"fromStation": "BOM", "toStation": "STO",
                                         "time": "{Year}-{Month0D}-{Day0D}"}}}},
    "safety": {"func": "exact_match", "result": {"type": "enable_enhanced_safety_browsing"},
               "expected": {"type": "rule", "rules": {"expected": "true"}}},
    "autodelete": {"func": "exact_match", "result": {"type": "data_delete_automacally"},
                   "expected": {"type": "rule", "rules": {"expected": "true"}}},
    "active": {"func": "is_expected_active_tab", "result": {"type": "active_tab_info", "goto_prefix": "https://"},
               "expected": {"type": "rule", "rules": {"type": "url",
                            "url": "https://discussions.flightaware.com/t/the-banter-thread/4412"}}},
    "font": {"func": "check_font_size", "result": {"type": "chrome_font_size"},
             "expected": {"type": "rule", "rules": {"type": "range", "min": 16, "max": 99999}}},
    "dash": {"func": ["exact_match", "exact_match"], "conj": "or",
             "result": [{"type": "url_dashPart", "goto_prefix": "https://www.", "partIndex": -1,
                         "needDeleteId": False, "returnType": "string"}] * 2,
             "expected": [{"type": "rule", "rules": {"expected": "tamiflu.html#side-effects"}},
                          {"type": "rule", "rules": {"expected": "tamiflu-side-effects.html"}}]},
    "engine": {"func": "exact_match", "result": {"type": "default_search_engine"},
               "expected": {"type": "rule", "rules": {"expected": "Bing"}}},
    "edge_dnt": {"func": "exact_match", "result": {"type": "enable_do_not_track_from_edge"},
                 "expected": {"type": "rule", "rules": {"expected": 1.0}}},
    "favorites": {"func": "is_expected_bookmarks", "result": {"type": "favorites"},
                  "expected": {"type": "rule", "rules": {"type": "bookmark_bar_websites_urls",
                               "urls": ["https://jalammar.github.io/illustrated-transformer/"]}}},
    "edge_history": {"func": "check_history_deleted", "result": {"type": "history_for_edge", "dest": "history.sqlite"},
                     "expected": {"type": "rule", "rules": {"type": "keywords", "keywords": ["youtube"]}}},
    "edge_profile": {"func": "exact_match", "result": {"type": "profile_name_from_edge"},
                     "expected": {"type": "rule", "rules": {"expected": "Thomas"}}},
    "edge_autodelete": {"func": "exact_match", "result": {"type": "data_delete_automacally_from_edge"},
                        "expected": {"type": "rule", "rules": {"expected": 1.0}}},
    "edge_font": {"func": "check_edge_font_size", "result": {"type": "edge_font_size"},
                  "expected": {"type": "rule", "rules": {"type": "range", "min": 24, "max": 99999}}},
    "edge_cookies": {"func": "is_cookie_deleted", "result": {"type": "cookie_data_for_edge", "dest": "Cookies"},
                     "expected": {"type": "rule", "rules": {"type": "domains", "domains": [".amazon.com"]}}},
    "edge_download": {"func": "exact_match", "result": {"type": "edge_default_download_folder"},
                      "expected": {"type": "rule", "rules": {"expected": "C:\\"}}},
    "edge_engine": {"func": "exact_match", "result": {"type": "default_search_engine_from_edge"},
                    "expected": {"type": "rule", "rules": {"expected": "DuckDuckGo"}}},
    "edge_safety": {"func": "exact_match", "result": {"type": "enable_enhanced_safety_browsing_from_edge"},
                    "expected": {"type": "rule", "rules": {"expected": 1.0}}},
    "pwa": {"func": "exact_match", "result": {"type": "validate_pwa_installed"},
            "expected": {"type": "rule", "rules": {"expected": "app_installed"}}},
    "url_shortcut": {"func": "is_url_shortcut_on_desktop", "result": {"type": "url_shortcuts_on_desktop"},
                     "expected": {"type": "rule", "rules": {"type": "url",
                                  "url_content": "https://www.mathsisfun.com/games/2048.html"}}},
    "home": {"func": "exact_match", "result": {"type": "edge_home_page"},
             "expected": {"type": "rule", "rules": {"expected": "www.wikipedia.org"}}},
}


def steam_spec(url: str) -> dict[str, Any]:
    return {"func": "is_added_to_steam_cart", "result": {"type": "page_info", "url": url, "load_state": "networkidle"},
            "expected": {"type": "rule", "rules": {"items": ["The Dota 2 Official Soundtrack"]}}}


def score(evaluate, spec, **kwargs) -> float:
    outcome = evaluate(spec, **kwargs)
    assert outcome.kind == "scored", outcome.reason
    return outcome.score


# -- Chrome / Edge Preferences through the engine --------------------------------------------------


@pytest.mark.parametrize(
    "name, key, right, wrong",
    [
        ("dnt", "chrome/Preferences", {"enable_do_not_track": True}, {"enable_do_not_track": False}),
        ("profile", "chrome/Preferences", {"profile": {"name": "Thomas"}}, {"profile": {"name": "Tom"}}),
        ("safety", "chrome/Preferences", {"safebrowsing": {"enhanced": True}}, {"safebrowsing": {"enabled": True}}),
        ("autodelete", "chrome/Preferences", {"profile": {"default_content_setting_values": {"cookies": 4}}},
         {"profile": {"name": "x"}}),
        ("engine", "chrome/Preferences", {"default_search_provider": {"guid": "485bf7d3-0215-45af-87dc-538868000003"}},
         {"default_search_provider": {"guid": "485bf7d3-0215-45af-87dc-538868000001"}}),
        ("font", "chrome/Preferences", {"webkit": {"webprefs": {"default_font_size": 24}}},
         {"webkit": {"webprefs": {"default_font_size": 16}}}),
        ("experiments", "chrome/Local State", {"browser": {"enabled_labs_experiments": ["show-performance-metrics-hud@1"]}},
         {"browser": {"enabled_labs_experiments": ["show-performance-metrics-hud@1", "smooth-scrolling@2"]}}),
        ("edge_dnt", "edge/Preferences", {"enable_do_not_track": True}, {}),
        ("edge_profile", "edge/Preferences", {"profile": {"name": "Thomas"}}, {"profile": {}}),
        ("edge_autodelete", "edge/Preferences", {"browser": {"clear_data_on_exit": dict(gb._EDGE_CLEAR_ON_EXIT)}},
         {"browser": {"clear_data_on_exit": {**gb._EDGE_CLEAR_ON_EXIT, "hosted_apps_data": True}}}),
        ("edge_font", "edge/Preferences", {"webkit": {"webprefs": {"default_font_size": 24}}},
         {"webkit": {"webprefs": {"default_font_size": 23}}}),
        ("edge_download", "edge/Preferences", {"download": {"default_directory": "C:\\"}},
         {"download": {"default_directory": "C:\\Users\\Docker\\Downloads"}}),
        ("edge_engine", "edge/Preferences", {"default_search_provider": {"synced_guid": "485bf7d3-0215-45af-87dc-538868000092"}},
         {"default_search_provider": {"guid": "485bf7d3-0215-45af-87dc-538868000092"}}),
        ("edge_safety", "edge/Preferences", {"edge": {"super_duper_secure_mode": {"enabled": True}}},
         {"edge": {"super_duper_secure_mode": {"enabled": False}}}),
        ("home", "edge/Secure Preferences", {"homepage": "https://www.wikipedia.org/"}, {"homepage": "https://www.bing.com/"}),
    ],
)
def test_preference_tasks_right_and_wrong(bvm, evaluate, name, key, right, wrong):
    put(bvm, key, right)
    assert score(evaluate, SPEC[name]) == 1.0
    put(bvm, key, wrong)
    assert score(evaluate, SPEC[name]) == 0.0


@pytest.mark.parametrize(
    "getter_name, missing, without_key",
    [
        ("enable_do_not_track", "false", "false"),
        ("enable_enhanced_safety_browsing", "Google", "false"),
        ("data_delete_automacally", "Google", "Google"),
        ("default_search_engine", "Google", "Google"),
        ("profile_name", None, None),
        ("chrome_font_size", {"default_fixed_font_size": 13, "default_font_size": 16},
         {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}),
        ("enabled_experiments", [], []),
        ("bookmarks", [], {}),
        ("favorites", [], {}),
        ("enable_do_not_track_from_edge", 0.0, 0.0),
        ("enable_enhanced_safety_browsing_from_edge", 0.0, 0.0),
        ("data_delete_automacally_from_edge", 0.0, 0.0),
        ("edge_font_size", {"default_fixed_font_size": 13, "default_font_size": 16},
         {"default_fixed_font_size": 13, "default_font_size": 16}),
        ("default_search_engine_from_edge", "Unknown", "Unknown"),
        ("profile_name_from_edge", None, None),
        ("edge_home_page", "error", "False"),
        ("edge_default_download_folder", "error", "False"),
    ],
)
def test_profile_getters_missing_file_and_missing_key_values(bvm, tmp_path, getter_name, missing, without_key):
    """WAA's exact value (and type) when the profile file is missing, and when it lacks the key."""
    ctx = ctx_for(bvm, tmp_path)
    value = GETTERS[getter_name](ctx, {"type": getter_name})
    assert value == missing and type(value) is type(missing)
    for key in PATHS:
        put(bvm, key, {"unrelated": 1})
    value = GETTERS[getter_name](ctx, {"type": getter_name})
    assert value == without_key and type(value) is type(without_key)


def test_profile_getters_odd_values(bvm, tmp_path):
    ctx = ctx_for(bvm, tmp_path)
    # Fallback to default_search_provider_data's short_name when the guid is unknown.
    put(bvm, "chrome/Preferences", {"default_search_provider": {"guid": "x"},
                                    "default_search_provider_data": {"template_url_data": {"short_name": "Ecosia"}}})
    assert GETTERS["default_search_engine"](ctx, {}) == "Ecosia"
    # Invalid JSON: the guarded getters fall back, bookmarks raises (WAA does not guard it).
    put(bvm, "chrome/Preferences", b"{not json")
    assert GETTERS["enable_do_not_track"](ctx, {}) == "false"
    assert GETTERS["enable_enhanced_safety_browsing"](ctx, {}) == "Google"
    put(bvm, "chrome/Bookmarks", b"{not json")
    with pytest.raises(ValueError):
        GETTERS["bookmarks"](ctx, {})
    put(bvm, "chrome/Bookmarks", b"")
    assert GETTERS["bookmarks"](ctx, {}) == []
    # A truthy non-string homepage makes WAA's .replace fail: "error".
    put(bvm, "edge/Secure Preferences", {"homepage": {"url": "x"}})
    assert GETTERS["edge_home_page"](ctx, {}) == "error"


def test_profile_path_comes_from_the_constant_program(bvm, tmp_path):
    put(bvm, "chrome/Preferences", {"profile": {"name": "Thomas"}})
    ctx = ctx_for(bvm, tmp_path)
    assert GETTERS["profile_name"](ctx, {"type": "profile_name", "path": "C:/evil"}) == "Thomas"
    assert ("execute", _key(gb.PROFILE_PATHS_COMMAND)) in bvm.calls
    assert ("get_file", PATHS["chrome/Preferences"]) in bvm.calls
    assert "'chrome/Preferences': j(la, 'Google/Chrome/User Data/Default/Preferences')" in gb.PROFILE_PATHS_PROGRAM


def test_profile_path_program_failure_gives_the_missing_file_value(bvm, tmp_path):
    bvm.commands[_key(gb.PROFILE_PATHS_COMMAND)] = ExecuteResult("success", "", "Traceback: boom", 1)
    ctx = ctx_for(bvm, tmp_path)
    assert GETTERS["enable_do_not_track"](ctx, {}) == "false"
    assert any("could not find chrome/Preferences" in note for note in ctx.notes)


def test_vm_http_error_on_file_is_the_missing_value_with_a_note(bvm, tmp_path):
    put(bvm, "chrome/Preferences", {"enable_do_not_track": True})
    bvm.http_errors[PATHS["chrome/Preferences"]] = 500
    ctx = ctx_for(bvm, tmp_path)
    assert GETTERS["enable_do_not_track"](ctx, {}) == "false"
    assert any("HTTP 500" in note for note in ctx.notes)


def test_unreachable_vm_is_an_infrastructure_error(bvm, evaluate):
    bvm.down = True
    for name in ("dnt", "history", "edge_cookies", "shortcut", "pwa", "dash"):
        assert evaluate(SPEC[name]).kind == "infrastructure_error", name


# -- SQLite files -----------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def history_db(*rows: tuple[str, str]) -> bytes:
    """A History file (the setup step's own builder), built once per content."""
    return build_history_db([{"url": u, "title": t, "visit_time_from_now_in_seconds": 60} for u, t in rows])


HISTORY = (("https://www.youtube.com/watch?v=1", "video"), ("https://example.com/", "Example"))


@pytest.mark.parametrize("name, key", [("history", "chrome/History"), ("edge_history", "edge/History")])
def test_history_tasks(bvm, evaluate, tmp_path, name, key):
    put(bvm, key, history_db(*HISTORY))
    assert score(evaluate, SPEC[name]) == 0.0
    put(bvm, key, history_db(*HISTORY[1:]))
    assert score(evaluate, SPEC[name]) == 1.0
    # Rows are (url, title, last_visit_time) tuples, as WAA's fetchall gives them.
    rows = GETTERS[SPEC[name]["result"]["type"]](ctx_for(bvm, tmp_path), SPEC[name]["result"])
    assert isinstance(rows, list) and rows[0][:2] == ("https://example.com/", "Example")
    assert isinstance(rows[0], tuple) and isinstance(rows[0][2], int)
    # "YouTube" in a title or an upper-case URL does not count: WAA matches the URL, case-sensitively.
    put(bvm, key, history_db(("https://YOUTUBE.com/", "youtube")))
    assert score(evaluate, SPEC[name]) == 1.0


def test_missing_history_makes_the_metric_raise(bvm, evaluate, tmp_path):
    assert GETTERS["history"](ctx_for(bvm, tmp_path), SPEC["history"]["result"]) is None
    outcome = evaluate(SPEC["history"])
    assert outcome.kind == "evaluation_error" and "check_history_deleted" in outcome.reason


@pytest.mark.parametrize("name, key", [("cookies", "chrome/Cookies"), ("edge_cookies", "edge/Cookies")])
def test_cookie_tasks(bvm, evaluate, tmp_path, name, key):
    put(bvm, key, cookies_db([".amazon.com", "www.example.com"]))
    assert score(evaluate, SPEC[name]) == 0.0
    # compare_urls equality: only the exact host key ".amazon.com" counts, not www.amazon.com.
    put(bvm, key, cookies_db(["www.amazon.com", ".example.com"]))
    assert score(evaluate, SPEC[name]) == 1.0
    rows = GETTERS[SPEC[name]["result"]["type"]](ctx_for(bvm, tmp_path), SPEC[name]["result"])
    assert isinstance(rows[0], tuple) and rows[0][1] == "www.amazon.com" and len(rows[0]) == 8
    assert (tmp_path / "cache" / "Cookies").exists()


def test_edge_cookies_kill_edge_first_and_missing_file_is_none(bvm, tmp_path):
    ctx = ctx_for(bvm, tmp_path)
    assert GETTERS["cookie_data_for_edge"](ctx, {"dest": "Cookies"}) is None
    executed = [call[1] for call in bvm.calls if call[0] == "execute"]
    assert _key(gb.KILL_EDGE_COMMAND) in executed
    put(bvm, "edge/Cookies", b"not a database")
    assert GETTERS["cookie_data_for_edge"](ctx, {"dest": "Cookies"}) is None
    put(bvm, "edge/Cookies", cookies_db([]))
    assert GETTERS["cookie_data_for_edge"](ctx, {"dest": "Cookies"}) == []
    with pytest.raises(EvaluationConfigError):
        GETTERS["cookie_data"](ctx, {"dest": "Cookies", "user_data_dir": "%APPDATA%"})
    with pytest.raises(EvaluationConfigError):
        GETTERS["cookie_data"](ctx, {"dest": "../../escape"})


# -- bookmarks -------------------------------------------------------------------------------------


def bookmarks_file(*urls: str) -> dict[str, Any]:
    children = [{"type": "url", "name": u, "url": u} for u in urls]
    children.append({"type": "folder", "name": "Liked Authors", "children": [
        {"type": "url", "name": "a", "url": "https://a.example/"}]})
    return {"checksum": "0", "roots": {"bookmark_bar": {"children": children, "type": "folder"},
                                       "other": {"children": [], "type": "folder"}}, "version": 1}


@pytest.mark.parametrize("name, key", [("bookmarks", "chrome/Bookmarks"), ("favorites", "edge/Bookmarks")])
def test_bookmark_tasks(bvm, evaluate, name, key):
    put(bvm, key, bookmarks_file("https://jalammar.github.io/illustrated-transformer/", "https://x.org/"))
    assert score(evaluate, SPEC[name]) == 1.0
    # Exact strings: a missing trailing slash is another URL.
    put(bvm, key, bookmarks_file("https://jalammar.github.io/illustrated-transformer"))
    assert score(evaluate, SPEC[name]) == 0.0
    bvm.files.clear()
    assert score(evaluate, SPEC[name]) == 0.0  # no file: [] -> 0.


def test_bookmark_metric_other_rule_types():
    roots = bookmarks_file("https://x.org/")["roots"]
    assert mb.is_expected_bookmarks(roots, {"type": "bookmark_bar_folders_names", "names": ["Liked Authors"]}) == 1.0
    rule = {"type": "liked_authors_websites_urls", "urls": [["https://b.example/", "https://a.example/"]]}
    assert mb.is_expected_bookmarks(roots, rule) == 1.0
    assert rule["urls"] == [["https://b.example/", "https://a.example/"]]
    assert mb.is_expected_bookmarks(roots, {"type": "liked_authors_websites_urls", "urls": ["https://b.example/"]}) == 0.0
    with pytest.raises(TypeError):
        mb.is_expected_bookmarks(roots, {"type": "other"})


# -- desktop shortcuts ----------------------------------------------------------------------------


def test_lnk_shortcut_task(bvm, evaluate, tmp_path):
    assert score(evaluate, SPEC["shortcut"]) == 0.0  # empty desktop
    put_desktop(bvm, "Other.lnk", lnk_file("Something else"))
    put_desktop(bvm, "notes.txt", b"Play Puzzle Game 2048. Use your arrow keys to move the tiles.")
    assert score(evaluate, SPEC["shortcut"]) == 0.0
    put_desktop(bvm, "2048.lnk", lnk_file("Play Puzzle Game 2048. Use your arrow keys to move the tiles.",
                                          "--profile-directory=Default --app-id=abc"))
    assert score(evaluate, SPEC["shortcut"]) == 1.0
    value = GETTERS["shortcuts_on_desktop"](ctx_for(bvm, tmp_path), {})
    assert sorted(value) == ["2048.lnk", "Other.lnk"]
    assert json.loads(value["2048.lnk"])["data"]["command_line_arguments"].startswith("--profile-directory")
    # Shortcut files are read at desktop + '/' + name, as WAA's posixpath.join builds it.
    assert ("get_file", DESKTOP + "/2048.lnk") in bvm.calls


def test_shortcut_metric_rule_types():
    assert mb.is_shortcut_on_desktop({"a.desktop": "[Desktop Entry]\nName=2048\n"}, {"type": "name", "name": "2048"}) == 1.0
    assert mb.is_shortcut_on_desktop({"a.lnk": "not json"}, {"type": "description", "description": "x"}) == 0.0
    assert mb.is_shortcut_on_desktop({}, {"type": "name"}) == 0.0
    with pytest.raises(TypeError):
        mb.is_shortcut_on_desktop({}, {"type": "url"})


def test_url_shortcut_task(bvm, evaluate, tmp_path):
    assert score(evaluate, SPEC["url_shortcut"]) == 0.0
    put_desktop(bvm, "Math.url", b"[InternetShortcut]\r\nURL=https://www.mathsisfun.com/games/2048.html\r\n")
    assert score(evaluate, SPEC["url_shortcut"]) == 1.0
    value = GETTERS["url_shortcuts_on_desktop"](ctx_for(bvm, tmp_path), {})
    assert value == {"Math.url": "[InternetShortcut]\r\nURL=https://www.mathsisfun.com/games/2048.html\r\n"}
    bvm.files[DESKTOP + "\\Math.url"] = b"[InternetShortcut]\r\nURL=https://www.mathsisfun.com/\r\n"
    assert score(evaluate, SPEC["url_shortcut"]) == 0.0
    bvm.directories.pop(DESKTOP)  # WAA indexes the failed listing (None) and raises
    assert evaluate(SPEC["url_shortcut"]).score == 0.0
    with pytest.raises(TypeError):
        GETTERS["url_shortcuts_on_desktop"](ctx_for(bvm, tmp_path), {})


# -- PWA (PowerShell) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output, expected",
    [
        (json.dumps([{"Name": "Microsoft.WindowsCalculator"}, {"Name": "www.pwabuilder.com-1A2B"}]), "app_installed"),
        (json.dumps([{"Name": "Microsoft.WindowsCalculator"}, {"Name": "Microsoft.Paint"}]), "app_not_installed"),
        ("", "app_not_installed"),
        (json.dumps({"Name": "www.PWABuilder.com"}), "error"),  # one package: an object, WAA fails
        ("garbage", "error"),
    ],
)
def test_pwa_task(bvm, evaluate, output, expected):
    bvm.commands[gb.INSTALLED_APPS_COMMAND] = ExecuteResult("success", output, "", 0)
    assert score(evaluate, SPEC["pwa"]) == (1.0 if expected == "app_installed" else 0.0)
    ctx = GetterContext(vm=bvm, cache_dir=Path("."))
    assert GETTERS["validate_pwa_installed"](ctx, {}) == expected


# -- accessibility-tree URL getters -----------------------------------------------------------------


FIXED_NOW = datetime(2024, 11, 20, 15, 30)  # a Wednesday


@pytest.fixture
def fixed_now(monkeypatch):
    monkeypatch.setattr(gb, "_now", lambda: FIXED_NOW)


def test_flight_task_with_relative_date(bvm, evaluate, fixed_now):
    flight = "qatarairways.com/app/booking/flight-selection?widget=QR&fromStation=BOM&toStation=STO&departing={}&adults=1"
    bvm.xml = a11y(flight.format("2024-11-25"))  # next Monday after Wed 2024-11-20
    assert score(evaluate, SPEC["flight"]) == 1.0
    assert ("accessibility", "uia") in bvm.calls
    bvm.xml = a11y(flight.format("2024-11-18"))
    assert score(evaluate, SPEC["flight"]) == 0.0
    bvm.xml = a11y(None)  # no Chrome window: None scores 0
    assert score(evaluate, SPEC["flight"]) == 0.0
    assert SPEC["flight"]["expected"]["rules"]["expected"]["time"] == "{Year}-{Month0D}-{Day0D}"  # not mutated


def test_active_tab_url_parse_values(bvm, tmp_path):
    ctx = ctx_for(bvm, tmp_path)
    bvm.xml = a11y("example.com/s?a=1&a=2&c=")
    config = {"parse_keys": ["a", "b", "c"], "replace": {"a": "x"}, "or": {"c": "x"}}
    assert GETTERS["active_tab_url_parse"](ctx, config) == {"b": "", "c": "1", "x": "1"}
    bvm.xml = "<desktop><broken"
    with pytest.raises(Exception):
        GETTERS["active_tab_url_parse"](ctx, config)
    bvm.xml = '<?xml version="1.0" encoding="utf-8"?>' + a11y("example.com/?a=1")
    assert GETTERS["active_tab_url_parse"](ctx, config) is None


def test_url_dash_part_task(bvm, evaluate, tmp_path):
    bvm.xml = a11y("drugs.com/tamiflu.html#side-effects")
    assert score(evaluate, SPEC["dash"]) == 1.0
    bvm.xml = a11y("drugs.com/sfx/tamiflu-side-effects.html")
    assert score(evaluate, SPEC["dash"]) == 1.0
    bvm.xml = a11y("drugs.com/tamiflu.html")
    assert score(evaluate, SPEC["dash"]) == 0.0
    ctx = ctx_for(bvm, tmp_path)
    bvm.xml = a11y("shop.com/item/part?id=7")
    config = {"partIndex": -1, "needDeleteId": True, "returnType": "json", "key": "k"}
    assert GETTERS["url_dashPart"](ctx, config) == {"k": "part"}
    assert GETTERS["url_dashPart"](ctx, {**config, "returnType": "other"}) is None


def test_rule_relative_time_phrases(monkeypatch):
    ctx = GetterContext(vm=None, cache_dir=Path("."))  # host only

    def at(now: datetime, relative: dict, expected: dict) -> dict:
        monkeypatch.setattr(gb, "_now", lambda: now)
        return GETTERS["rule_relativeTime"](ctx, {"rules": {"relativeTime": relative, "expected": expected}})["expected"]

    wed = FIXED_NOW
    assert at(wed, {"from": "tomorrow"}, {"time": "{DoW}, {Month} {DayD} {Year}"})["time"] == "Thu, Nov 21 2024"
    assert at(datetime(2024, 11, 25), {"from": "next Monday"}, {"time": "{Day0D}"})["time"] == "02"  # Monday + 7
    assert at(datetime(2024, 12, 3), {"from": "5th next month"}, {"time": "{Year}-{Month0D}-{Day0D} {MonthFull} {month}"})[
        "time"] == "2025-01-05 January january"
    span = at(wed, {"from": "this Saturday", "to": "this Sunday"}, {"from": "{DayD}", "to": "{DayD}"})
    assert span == {"from": "23", "to": "24"}
    span = at(wed, {"from": "next Monday", "to": "next Friday"}, {"from": "{DayD}", "to": "{DayD}"})
    assert span == {"from": "25", "to": "29"}
    assert at(datetime(2024, 3, 5), {"from": "first monday four months later"}, {"time": "{Year}-{Month0D}-{Day0D}"})[
        "time"] == "2024-07-01"
    with pytest.raises(ValueError):  # WAA's month arithmetic gives month 0 in August
        at(datetime(2024, 8, 5), {"from": "first monday four months later"}, {"time": "{Year}"})
    with pytest.raises(UnboundLocalError):  # a known phrase WAA has no branch for here
        at(wed, {"from": "this Sunday"}, {"time": "{Year}"})
    with pytest.raises(KeyError):
        at(wed, {"from": "yesterday"}, {"time": "{Year}"})


def test_check_direct_json_object_edges():
    rules = {"expected": {"a": "1"}}
    assert mb.check_direct_json_object("{'a': '1', 'b': 2}", rules) == 1.0
    assert mb.check_direct_json_object(None, rules) == 0.0
    assert mb.check_direct_json_object({"a": 1}, rules) == 0.0
    assert mb.check_direct_json_object(["not", "a", "dict"], rules) == 0.0
    with pytest.raises(ValueError):
        mb.check_direct_json_object("not json", rules)
    inside = {"expect_in_result": True, "expected": {"a": "ell", "b": ["x", "y"], "c": 3}}
    assert mb.check_direct_json_object({"a": "hello", "b": ["y"]}, {**inside, "expected": {"a": "ell", "b": ["x", "y"]}}) == 1.0
    assert mb.check_direct_json_object({"a": "hello", "b": ["y"], "c": 3}, inside) == 0.0


# -- DevTools getters ------------------------------------------------------------------------------


def test_open_tabs_task(bvm, evaluate, browser):
    for url in ("https://www.tripadvisor.com/", "https://www.airbnb.com/", "https://www.lonelyplanet.com/"):
        browser.add_tab(url, "t")
    assert score(evaluate, SPEC["tabs"], devtools_url=browser.url) == 1.0
    browser.tabs.pop(0)
    assert score(evaluate, SPEC["tabs"], devtools_url=browser.url) == 0.0
    ctx = ctx_for(bvm, Path("."), devtools_url=browser.url)
    assert GETTERS["open_tabs_info"](ctx, {}) == [
        {"title": "t", "url": "https://www.tripadvisor.com/"}, {"title": "t", "url": "https://www.airbnb.com/"}]


def test_open_tabs_when_the_browser_is_down(bvm, evaluate, browser):
    browser.devtools_status = 502
    ctx = ctx_for(bvm, Path("."), devtools_url=browser.url)
    assert GETTERS["open_tabs_info"](ctx, {}) == []
    assert any("502" in note for note in ctx.notes)
    assert GETTERS["open_tabs_info"](ctx_for(bvm, Path("."), devtools_url="http://127.0.0.1:9"), {}) == []
    bvm.down = True  # no DevTools answer and no WAA server either: infrastructure
    assert evaluate(SPEC["tabs"], devtools_url="http://127.0.0.1:9").kind == "infrastructure_error"


def test_devtools_url_is_required(bvm, evaluate):
    outcome = evaluate(SPEC["tabs"])
    assert outcome.kind == "evaluation_error" and "DevTools URL" in outcome.reason
    with pytest.raises(EvaluationConfigError, match="DevTools URL"):
        GETTERS["active_tab_info"](GetterContext(vm=bvm, cache_dir=Path(".")), {})


def test_active_tab_task(bvm, evaluate, browser):
    opened = "https://discussions.flightaware.com/t/the-banter-thread/4412/"
    browser.redirects[opened] = "https://discussions.flightaware.com/t/the-banter-thread/4412"
    browser.titles[browser.redirects[opened]] = "The Banter Thread"
    browser.add_tab("https://discussions.flightaware.com/", "Home")
    bvm.xml = a11y("discussions.flightaware.com/t/the-banter-thread/4412/")
    assert score(evaluate, SPEC["active"], devtools_url=browser.url) == 1.0
    assert [t["url"] for t in browser.tabs] == ["https://discussions.flightaware.com/"]  # its tab was closed
    ctx = ctx_for(bvm, Path("."), devtools_url=browser.url)
    assert GETTERS["active_tab_info"](ctx, {"goto_prefix": "https://"}) == {
        "title": "The Banter Thread", "url": "https://discussions.flightaware.com/t/the-banter-thread/4412", "content": None}
    bvm.xml = a11y("discussions.flightaware.com/c/general")
    assert score(evaluate, SPEC["active"], devtools_url=browser.url) == 0.0
    bvm.xml = a11y(None)
    assert score(evaluate, SPEC["active"], devtools_url=browser.url) == 0.0
    browser.devtools_status = 502
    bvm.xml = a11y("discussions.flightaware.com/t/the-banter-thread/4412")
    assert GETTERS["active_tab_info"](ctx, {}) is None


def test_is_expected_active_tab_return_types():
    rule = {"type": "url", "url": "https://www.a.com/x"}
    assert mb.is_expected_active_tab({"url": "http://a.com/x"}, rule) == 0
    assert mb.is_expected_active_tab({"url": "HTTPS://A.com/x"}, rule) == 1 and type(mb.is_expected_active_tab("https://a.com/x", rule)) is int
    assert type(mb.is_expected_active_tab(None, rule)) is float
    assert mb.is_expected_active_tab({"url": "x"}, {"type": "title"}) == 0


# -- pages fetched on the host -----------------------------------------------------------------------


def test_steam_cart_task(bvm, evaluate, browser):
    browser.pages["/cart/"] = (200, "text/html", b"<html><head><title>\n Shopping  Cart </title></head>"
                               b"<body>The Dota 2 Official Soundtrack</body></html>")
    spec = steam_spec(browser.url + "/cart/")
    assert score(evaluate, spec) == 1.0
    info = GETTERS["page_info"](ctx_for(bvm, Path(".")), spec["result"])
    assert info["title"] == "Shopping Cart" and info["url"] == browser.url + "/cart/"
    browser.pages["/cart/"] = (200, "text/html", b"<title>Cart</title><body>Your cart is empty</body>")
    assert score(evaluate, spec) == 0.0
    outcome = evaluate(spec, offline=True)
    assert outcome.kind == "evaluation_error" and browser.url + "/cart/" in outcome.reason


def test_pdf_from_url(bvm, browser, tmp_path):
    browser.pages["/paper.pdf"] = (200, "application/pdf", b"%PDF-1.4\n%fake\n")
    browser.pages["/post/"] = (200, "text/html", b"<title>Post</title>")
    ctx = ctx_for(bvm, tmp_path)
    path = GETTERS["pdf_from_url"](ctx, {"path": browser.url + "/paper.pdf", "dest": "gold.pdf"})
    assert path == str((tmp_path / "cache" / "gold.pdf").resolve()) and Path(path).read_bytes().startswith(b"%PDF-")
    with pytest.raises(EvaluationConfigError, match="not a PDF"):
        GETTERS["pdf_from_url"](ctx, {"path": browser.url + "/post/", "dest": "g.pdf"})
    with pytest.raises(EvaluationConfigError, match="/paper.pdf"):
        GETTERS["pdf_from_url"](ctx_for(bvm, tmp_path, offline=True), {"path": browser.url + "/paper.pdf", "dest": "g.pdf"})


# -- the metrics on their own ------------------------------------------------------------------------


def test_font_size_metrics_bounds():
    assert mb.check_font_size({"default_font_size": 16}, {"type": "range", "min": 16, "max": 99999}) == 0.0
    assert mb.check_edge_font_size({"default_font_size": 24}, {"type": "range", "min": 24, "max": 99999}) == 1.0
    assert mb.check_font_size({"default_font_size": 20}, {"type": "value", "value": 20}) == 1.0
    with pytest.raises(KeyError):
        mb.check_font_size({"default_fixed_font_size": 13}, {"type": "range", "min": 1, "max": 2})
    with pytest.raises(TypeError):
        mb.check_edge_font_size({"default_font_size": 20}, {"type": "other"})


def test_metrics_raise_on_none_state_like_waa():
    for fn, rule in [
        (mb.is_cookie_deleted, {"type": "domains", "domains": ["a"]}),
        (mb.check_history_deleted, {"type": "keywords", "keywords": ["a"]}),
        (mb.check_enabled_experiments, {"type": "names", "names": []}),
        (mb.is_added_to_steam_cart, {"items": ["a"]}),
        (mb.is_expected_tabs, {"type": "url", "urls": []}),
    ]:
        with pytest.raises(TypeError):
            fn(None, rule)
    assert mb.is_expected_tabs(None, {"type": "title"}) == 0
    assert mb.check_enabled_experiments(["b@1", "a@1"], {"type": "names", "names": ["a", "b"]}) == 0.0


# -- every name the real chrome/msedge tasks use is registered ---------------------------------------

MINE_GETTERS = {
    "url_dashPart", "enable_do_not_track", "shortcuts_on_desktop", "chrome_font_size", "bookmarks", "cookie_data",
    "active_tab_info", "active_tab_url_parse", "rule_relativeTime", "default_search_engine", "page_info",
    "data_delete_automacally", "enable_enhanced_safety_browsing", "enabled_experiments", "history", "pdf_from_url",
    "open_tabs_info", "profile_name", "history_for_edge", "profile_name_from_edge", "url_shortcuts_on_desktop",
    "enable_do_not_track_from_edge", "cookie_data_for_edge", "edge_home_page", "validate_pwa_installed",
    "edge_font_size", "edge_default_download_folder", "favorites", "default_search_engine_from_edge",
    "enable_enhanced_safety_browsing_from_edge", "data_delete_automacally_from_edge",
}
MINE_METRICS = {
    "is_shortcut_on_desktop", "check_font_size", "is_expected_active_tab", "check_direct_json_object",
    "is_added_to_steam_cart", "check_enabled_experiments", "is_expected_tabs", "is_expected_bookmarks",
    "is_cookie_deleted", "check_history_deleted", "is_url_shortcut_on_desktop", "check_edge_font_size",
}
# Used by these tasks but implemented in other modules (compare_pdfs: the PDF metrics).
ELSEWHERE = {"compare_pdfs"}


def test_browser_names_are_registered():
    assert MINE_GETTERS <= set(GETTERS)
    assert MINE_METRICS <= set(METRICS)


@pytest.mark.skipif(not TASKS.is_dir(), reason="the WAA task files (/work/shared/waa-tasks) are not here")
def test_every_name_used_by_chrome_and_msedge_tasks_is_registered():
    used_getters, used_metrics = set(), set()
    for task_file in sorted(TASKS.glob("chrome/*.json")) + sorted(TASKS.glob("msedge/*.json")):
        spec = json.loads(task_file.read_text(encoding="utf-8"))["evaluator"]
        funcs = spec["func"] if isinstance(spec["func"], list) else [spec["func"]]
        used_metrics.update(funcs)
        for key in ("result", "expected"):
            entries = spec.get(key) if isinstance(spec.get(key), list) else [spec.get(key)]
            used_getters.update(e["type"] for e in entries if isinstance(e, dict) and "type" in e)
    assert used_getters - set(GETTERS) == set()
    assert used_metrics - set(METRICS) - ELSEWHERE == set()
    assert (used_getters - {"rule", "vm_file"}) <= MINE_GETTERS
    assert used_metrics - {"exact_match"} - ELSEWHERE == MINE_METRICS
