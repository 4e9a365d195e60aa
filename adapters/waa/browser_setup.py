"""Browser setup steps of WAA tasks: open/close tabs over Chrome DevTools, and fake history.

WAA's setup controller (`client/desktop_env/controllers/setup.py`) drives the browser in the VM
with Playwright `connect_over_cdp("http://VM:9222")` (Caddy on 9222 forwards to the browser's
`--remote-debugging-port=1337`). This module does the same work with the DevTools *HTTP*
endpoints only (`/json/version`, `/json/list`, `/json/new`, `/json/close`, `/json/activate`), so
the host needs no Playwright. The same endpoints serve Chrome and Edge.

Step types covered (see `open_tabs`, `close_tabs`, `build_history_db`, `update_browse_history`):

* `chrome_open_tabs` / `edge_open_tabs` `{urls_to_open}` (WAA's two functions are identical);
* `chrome_close_tabs` `{urls_to_close}`;
* `update_browse_history` / `update_browse_history_edge` `{history: [{url, title,
  visit_time_from_now_in_seconds}]}`: a History SQLite file built on the host and uploaded over
  the profile's `Default/History`.

Everything taken from a task file (URLs, titles) is data: URLs travel percent-encoded in a
DevTools query string, history rows go into SQLite only as bound parameters, and the one program
run on the VM (`history_upload_path`) is a constant of this module.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlparse, urlunparse

import requests

from adapters.waa.client import error_message

logger = logging.getLogger(__name__)

Browser = Literal["chrome", "edge"]
BROWSERS: tuple[str, ...] = ("chrome", "edge")

# WAA's connect loop: 15 attempts, 5 s apart (`for attempt in range(15)` ... `time.sleep(5)`).
CONNECT_TRIES = 15
CONNECT_INTERVAL_SECONDS = 5.0
# `_chrome_close_tabs_setup` starts with `time.sleep(5)  # Wait for Chrome to finish launching`.
CLOSE_TABS_INITIAL_WAIT_SECONDS = 5.0
# Statuses worth retrying while the browser starts: Caddy answers 502 until Chrome listens.
_RETRY_STATUSES = frozenset({502, 503, 504})


class BrowserSetupError(RuntimeError):
    """A browser setup step could not be done (base of the errors of this module)."""


class DevToolsError(BrowserSetupError):
    """A DevTools HTTP request failed; the message names the DevTools URL and what failed.

    `status` is the HTTP status the endpoint answered, or None when there was no answer.
    """

    def __init__(self, url: str, what: str, status: int | None = None) -> None:
        super().__init__(f"Chrome DevTools at {url}: {what}")
        self.url = url
        self.status = status


class HistoryPathError(BrowserSetupError):
    """The History file's path on the VM could not be determined."""


@dataclass(frozen=True)
class Tab:
    """One page target of /json/list."""

    id: str
    url: str
    title: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> "Tab":
        return cls(id=str(body.get("id", "")), url=str(body.get("url", "")), title=str(body.get("title", "")), raw=body)


class DevToolsClient:
    """The Chrome DevTools HTTP endpoints at `base_url` (for a WAA VM: http://VM:9222)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0, session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = session or requests.Session()

    def __repr__(self) -> str:
        return f"DevToolsClient({self.base_url!r})"

    def close(self) -> None:
        self._session.close()

    # -- transport -------------------------------------------------------------------------

    def _request(self, method: str, path: str, what: str, *, ok_statuses: tuple[int, ...] = (200,)) -> requests.Response:
        url = self.base_url + path
        try:
            response = self._session.request(method, url, timeout=self.timeout)
        except requests.Timeout as exc:
            raise DevToolsError(self.base_url, f"{what} ({method} {path}): no answer within {self.timeout:g} s ({exc})") from exc
        except requests.RequestException as exc:
            raise DevToolsError(self.base_url, f"{what} ({method} {path}): cannot connect ({exc})") from exc
        if response.status_code not in ok_statuses:
            raise DevToolsError(
                self.base_url,
                f"{what} ({method} {path}) failed: HTTP {response.status_code}: {error_message(response)}",
                status=response.status_code,
            )
        return response

    def _json(self, response: requests.Response, what: str) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise DevToolsError(self.base_url, f"{what}: answer is not JSON ({response.text[:200]!r})",
                                status=response.status_code) from exc

    # -- endpoints -------------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """GET /json/version: browser name, protocol version, webSocketDebuggerUrl."""
        body = self._json(self._request("GET", "/json/version", "version"), "version")
        if not isinstance(body, dict):
            raise DevToolsError(self.base_url, "version: answer is not a JSON object")
        return body

    def tabs(self) -> list[Tab]:
        """GET /json/list, page targets only, in the browser's order (most recently active first)."""
        body = self._json(self._request("GET", "/json/list", "list tabs"), "list tabs")
        if not isinstance(body, list):
            raise DevToolsError(self.base_url, "list tabs: answer is not a JSON list")
        return [Tab.from_json(t) for t in body if isinstance(t, dict) and t.get("type") == "page"]

    def open_tab(self, url: str) -> Tab:
        """Open `url` in a new foreground tab (PUT /json/new?<url>; GET when PUT answers 405).

        The URL is percent-encoded completely (Chrome unescapes the query), so '#', '&' and
        spaces in it reach the browser instead of being cut by the HTTP layer.
        """
        if not isinstance(url, str) or not url:
            raise DevToolsError(self.base_url, f"open tab: URL must be a non-empty string, got {url!r:.100}")
        path = "/json/new?" + quote(url, safe="")
        what = f"open tab {url!r:.200}"
        try:
            response = self._request("PUT", path, what)
        except DevToolsError as exc:
            if exc.status != 405:
                raise
            response = self._request("GET", path, what)  # Chrome before 111 only knew GET
        body = self._json(response, what)
        if not isinstance(body, dict) or "id" not in body:
            raise DevToolsError(self.base_url, f"{what}: answer has no target id")
        return Tab.from_json(body)

    def close_tab(self, target_id: str) -> None:
        """GET /json/close/<id> (Chrome answers "Target is closing"; closing is asynchronous)."""
        self._request("GET", "/json/close/" + quote(str(target_id), safe=""), f"close tab {target_id}")

    def activate(self, target_id: str) -> None:
        """GET /json/activate/<id>: bring the tab to the front."""
        self._request("GET", "/json/activate/" + quote(str(target_id), safe=""), f"activate tab {target_id}")

    def wait_until_available(
        self,
        tries: int = CONNECT_TRIES,
        interval: float = CONNECT_INTERVAL_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any]:
        """Poll /json/version until it answers, like WAA's 15 connection attempts 5 s apart.

        Connection failures, timeouts and 502/503/504 (a proxy whose browser is not up yet) are
        retried; any other HTTP error (for example the WAA simulation's 501) is raised at once.
        Returns the /json/version body.
        """
        tries = max(1, int(tries))
        last: DevToolsError | None = None
        for attempt in range(tries):
            if attempt:
                sleep(interval)
            try:
                return self.version()
            except DevToolsError as exc:
                if exc.status is not None and exc.status not in _RETRY_STATUSES:
                    raise
                last = exc
                logger.info("DevTools at %s not available (attempt %d/%d): %s", self.base_url, attempt + 1, tries, exc)
        raise DevToolsError(self.base_url, f"not reachable after {tries} tries (last error: {last})",
                            status=last.status if last else None)


# -- tabs ------------------------------------------------------------------------------------


def urls_match(url1: str | None, url2: str | None) -> bool:
    """WAA's URL equality for closing tabs (`compare_urls` in evaluators/metrics/utils.py).

    Both URLs are normalised, then compared for equality: a missing scheme becomes http, scheme
    and host are lower-cased, every "www." in the host is removed, and a path of exactly "/"
    becomes empty. Path case, query, params and fragment must be identical. None equals only None.
    """
    if url1 is None or url2 is None:
        return url1 == url2
    return _normalise_url(url1) == _normalise_url(url2)


def _normalise_url(url: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(
        scheme=(parts.scheme or "http").lower(),
        netloc=parts.netloc.lower().replace("www.", ""),
        path="" if parts.path == "/" else parts.path,
    ))


def open_tabs(
    devtools: DevToolsClient,
    urls: Sequence[str],
    *,
    tries: int = CONNECT_TRIES,
    interval: float = CONNECT_INTERVAL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Tab]:
    """Open each URL in a new tab, in order; the `chrome_open_tabs` / `edge_open_tabs` step.

    WAA's behaviour, kept: no existing tab is reused. Every URL gets a new tab
    (`context.new_page()` then `page.goto(url)`), and right after the *first* URL is opened the
    browser's default tab is closed (`default_page = context.pages[0]; default_page.close()`), so
    a freshly launched browser ends up with exactly the task's tabs; any further pre-existing tabs
    stay open. The default tab here is the pre-existing page target that was least recently
    active (the last of /json/list), the startup tab of a fresh browser. Waits for DevTools first
    with WAA's retry policy (15 tries, 5 s apart).

    Differences: WAA waits up to 60 s for each page's load event and only logs a timeout; the
    DevTools HTTP API cannot wait for loading, so tabs are returned as soon as they are created.
    When no tab existed before, WAA's `context.pages[0]` would be the tab it just opened and it
    would close the first task URL; here nothing is closed in that case. Errors raise
    DevToolsError instead of being logged. Returns the tabs opened.
    """
    urls = list(urls)
    for index, url in enumerate(urls):
        if not isinstance(url, str) or not url:
            raise ValueError(f"urls_to_open[{index}] must be a non-empty string, got {url!r:.100}")
    devtools.wait_until_available(tries=tries, interval=interval, sleep=sleep)
    before = devtools.tabs()
    default_tab = before[-1] if before else None
    opened: list[Tab] = []
    for index, url in enumerate(urls):
        tab = devtools.open_tab(url)
        opened.append(tab)
        logger.info("opened tab %d: %s", index + 1, url)
        if index == 0 and default_tab is not None:
            devtools.close_tab(default_tab.id)
            logger.info("closed the default tab %s (%s)", default_tab.id, default_tab.url)
    return opened


def close_tabs(
    devtools: DevToolsClient,
    urls: Sequence[str],
    *,
    initial_wait: float = CLOSE_TABS_INITIAL_WAIT_SECONDS,
    tries: int = CONNECT_TRIES,
    interval: float = CONNECT_INTERVAL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Tab]:
    """Close, for each URL, one tab showing it; the `chrome_close_tabs` step.

    WAA's behaviour, kept: first sleep 5 s ("Wait for Chrome to finish launching"), connect with
    the 15 x 5 s retry, then for each URL close the *first* tab whose URL is equal to it under
    `urls_match` (WAA's `compare_urls`: normalised *equality*, not prefix or substring; scheme,
    host case, "www." and a lone trailing "/" are ignored) and stop looking (`break`), so one
    entry closes at most one tab, and listing a URL twice closes two tabs showing it. A URL that
    matches no tab is skipped silently (logged here).

    "First" is WAA's page order (order of creation). /json/list is ordered by recent activity, so
    tabs are searched from the end of the list (least recently active first), the closest
    equivalent. Returns the tabs closed.
    """
    urls = list(urls)
    for index, url in enumerate(urls):
        if not isinstance(url, str):
            raise ValueError(f"urls_to_close[{index}] must be a string, got {url!r:.100}")
    if initial_wait > 0:
        sleep(initial_wait)
    devtools.wait_until_available(tries=tries, interval=interval, sleep=sleep)
    closed: list[Tab] = []
    closed_ids: set[str] = set()  # /json/close is asynchronous: a closed tab may still be listed
    for index, url in enumerate(urls):
        for tab in reversed(devtools.tabs()):
            if tab.id in closed_ids or not urls_match(tab.url, url):
                continue
            devtools.close_tab(tab.id)
            closed_ids.add(tab.id)
            closed.append(tab)
            logger.info("closed tab for %s (%s)", url, tab.url)
            break
        else:
            logger.info("no open tab matches %s; nothing to close (as in WAA)", url)
    return closed


# -- history ---------------------------------------------------------------------------------

# The tables of WAA's `desktop_env/assets/history_empty.sqlite` (Chrome History schema version
# 68), which `_update_browse_history(_edge)_setup` copies before inserting. WAA's asset also
# carries leftover rows of the profile it was taken from (downloads, search terms, clusters...);
# those are left out: the file built here holds only the task's history.
_HISTORY_SCHEMA = """
CREATE TABLE meta(key LONGVARCHAR NOT NULL UNIQUE PRIMARY KEY, value LONGVARCHAR);
CREATE TABLE urls(id INTEGER PRIMARY KEY AUTOINCREMENT, url LONGVARCHAR, title LONGVARCHAR,
    visit_count INTEGER DEFAULT 0 NOT NULL, typed_count INTEGER DEFAULT 0 NOT NULL,
    last_visit_time INTEGER NOT NULL, hidden INTEGER DEFAULT 0 NOT NULL);
CREATE TABLE visits(id INTEGER PRIMARY KEY AUTOINCREMENT, url INTEGER NOT NULL,
    visit_time INTEGER NOT NULL, from_visit INTEGER, external_referrer_url TEXT,
    transition INTEGER DEFAULT 0 NOT NULL, segment_id INTEGER,
    visit_duration INTEGER DEFAULT 0 NOT NULL,
    incremented_omnibox_typed_score BOOLEAN DEFAULT FALSE NOT NULL, opener_visit INTEGER,
    originator_cache_guid TEXT, originator_visit_id INTEGER, originator_from_visit INTEGER,
    originator_opener_visit INTEGER, is_known_to_sync BOOLEAN DEFAULT FALSE NOT NULL,
    consider_for_ntp_most_visited BOOLEAN DEFAULT FALSE NOT NULL,
    visited_link_id INTEGER DEFAULT 0 NOT NULL);
CREATE TABLE visit_source(id INTEGER PRIMARY KEY, source INTEGER NOT NULL);
CREATE INDEX visits_url_index ON visits (url);
CREATE INDEX visits_from_index ON visits (from_visit);
CREATE INDEX visits_time_index ON visits (visit_time);
CREATE INDEX visits_originator_id_index ON visits (originator_visit_id);
CREATE TABLE keyword_search_terms (keyword_id INTEGER NOT NULL, url_id INTEGER NOT NULL,
    term LONGVARCHAR NOT NULL, normalized_term LONGVARCHAR NOT NULL);
CREATE INDEX keyword_search_terms_index1 ON keyword_search_terms (keyword_id, normalized_term);
CREATE INDEX keyword_search_terms_index2 ON keyword_search_terms (url_id);
CREATE INDEX keyword_search_terms_index3 ON keyword_search_terms (term);
CREATE TABLE downloads (id INTEGER PRIMARY KEY, guid VARCHAR NOT NULL,
    current_path LONGVARCHAR NOT NULL, target_path LONGVARCHAR NOT NULL,
    start_time INTEGER NOT NULL, received_bytes INTEGER NOT NULL, total_bytes INTEGER NOT NULL,
    state INTEGER NOT NULL, danger_type INTEGER NOT NULL, interrupt_reason INTEGER NOT NULL,
    hash BLOB NOT NULL, end_time INTEGER NOT NULL, opened INTEGER NOT NULL,
    last_access_time INTEGER NOT NULL, transient INTEGER NOT NULL, referrer VARCHAR NOT NULL,
    site_url VARCHAR NOT NULL, embedder_download_data VARCHAR NOT NULL, tab_url VARCHAR NOT NULL,
    tab_referrer_url VARCHAR NOT NULL, http_method VARCHAR NOT NULL, by_ext_id VARCHAR NOT NULL,
    by_ext_name VARCHAR NOT NULL, by_web_app_id VARCHAR NOT NULL, etag VARCHAR NOT NULL,
    last_modified VARCHAR NOT NULL, mime_type VARCHAR(255) NOT NULL,
    original_mime_type VARCHAR(255) NOT NULL);
CREATE TABLE downloads_url_chains (id INTEGER NOT NULL, chain_index INTEGER NOT NULL,
    url LONGVARCHAR NOT NULL, PRIMARY KEY (id, chain_index));
CREATE TABLE downloads_slices (download_id INTEGER NOT NULL, offset INTEGER NOT NULL,
    received_bytes INTEGER NOT NULL, finished INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (download_id, offset));
CREATE TABLE segments (id INTEGER PRIMARY KEY, name VARCHAR, url_id INTEGER NON NULL);
CREATE INDEX segments_name ON segments(name);
CREATE INDEX segments_url_id ON segments(url_id);
CREATE TABLE segment_usage (id INTEGER PRIMARY KEY, segment_id INTEGER NOT NULL,
    time_slot INTEGER NOT NULL, visit_count INTEGER DEFAULT 0 NOT NULL);
CREATE INDEX segment_usage_time_slot_segment_id ON segment_usage(time_slot, segment_id);
CREATE INDEX segments_usage_seg_id ON segment_usage(segment_id);
CREATE TABLE content_annotations(visit_id INTEGER PRIMARY KEY, visibility_score NUMERIC,
    floc_protected_score NUMERIC, categories VARCHAR, page_topics_model_version INTEGER,
    annotation_flags INTEGER NOT NULL, entities VARCHAR, related_searches VARCHAR,
    search_normalized_url VARCHAR, search_terms LONGVARCHAR, alternative_title VARCHAR,
    page_language VARCHAR, password_state INTEGER DEFAULT 0 NOT NULL,
    has_url_keyed_image BOOLEAN NOT NULL);
CREATE TABLE context_annotations(visit_id INTEGER PRIMARY KEY,
    context_annotation_flags INTEGER NOT NULL, duration_since_last_visit INTEGER,
    page_end_reason INTEGER, total_foreground_duration INTEGER,
    browser_type INTEGER DEFAULT 0 NOT NULL, window_id INTEGER DEFAULT -1 NOT NULL,
    tab_id INTEGER DEFAULT -1 NOT NULL, task_id INTEGER DEFAULT -1 NOT NULL,
    root_task_id INTEGER DEFAULT -1 NOT NULL, parent_task_id INTEGER DEFAULT -1 NOT NULL,
    response_code INTEGER DEFAULT 0 NOT NULL);
CREATE TABLE clusters(cluster_id INTEGER PRIMARY KEY AUTOINCREMENT,
    should_show_on_prominent_ui_surfaces BOOLEAN NOT NULL, label VARCHAR NOT NULL,
    raw_label VARCHAR NOT NULL, triggerability_calculated BOOLEAN NOT NULL,
    originator_cache_guid TEXT NOT NULL, originator_cluster_id INTEGER NOT NULL);
CREATE TABLE clusters_and_visits(cluster_id INTEGER NOT NULL, visit_id INTEGER NOT NULL,
    score NUMERIC DEFAULT 0 NOT NULL, engagement_score NUMERIC DEFAULT 0 NOT NULL,
    url_for_deduping LONGVARCHAR NOT NULL, normalized_url LONGVARCHAR NOT NULL,
    url_for_display LONGVARCHAR NOT NULL, interaction_state INTEGER DEFAULT 0 NOT NULL,
    PRIMARY KEY(cluster_id, visit_id)) WITHOUT ROWID;
CREATE INDEX clusters_for_visit ON clusters_and_visits(visit_id);
CREATE TABLE cluster_keywords(cluster_id INTEGER NOT NULL, keyword VARCHAR NOT NULL,
    type INTEGER NOT NULL, score NUMERIC NOT NULL, collections VARCHAR NOT NULL);
CREATE INDEX cluster_keywords_cluster_id_index ON cluster_keywords(cluster_id);
CREATE TABLE cluster_visit_duplicates(visit_id INTEGER NOT NULL,
    duplicate_visit_id INTEGER NOT NULL, PRIMARY KEY(visit_id, duplicate_visit_id)) WITHOUT ROWID;
CREATE TABLE visited_links(id INTEGER PRIMARY KEY AUTOINCREMENT, link_url_id INTEGER NOT NULL,
    top_level_url LONGVARCHAR NOT NULL, frame_url LONGVARCHAR NOT NULL,
    visit_count INTEGER DEFAULT 0 NOT NULL);
CREATE INDEX visited_links_index ON visited_links (link_url_id, top_level_url, frame_url);
CREATE TABLE history_sync_metadata (storage_key INTEGER PRIMARY KEY NOT NULL, value BLOB);
CREATE INDEX urls_url_index ON urls (url);
"""

# meta rows of WAA's asset (its fourth row, early_expiration_threshold, is profile residue).
_HISTORY_META = (("mmap_status", "-1"), ("version", "68"), ("last_compatible_version", "16"))

# The values WAA writes for every entry.
VISIT_TRANSITION = 805306368  # 0x30000000: PAGE_TRANSITION_LINK | CHAIN_START | CHAIN_END
_CHROME_EPOCH = datetime(1601, 1, 1, tzinfo=timezone.utc)


def chrome_time(moment: datetime) -> int:
    """Chrome/Edge time: whole microseconds since 1601-01-01 UTC (a naive datetime is UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - _CHROME_EPOCH) // timedelta(microseconds=1)


def _check_browser(browser: str) -> None:
    if browser not in BROWSERS:
        raise ValueError(f"browser must be one of {', '.join(BROWSERS)}, got {browser!r:.50}")


def _history_rows(history: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    if not isinstance(history, (list, tuple)):
        raise ValueError(f"history must be a list of entries, got {type(history).__name__}")
    rows = []
    for index, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise ValueError(f"history[{index}] must be an object, got {type(entry).__name__}")
        url, title = entry.get("url"), entry.get("title")
        seconds = entry.get("visit_time_from_now_in_seconds")
        if not isinstance(url, str):
            raise ValueError(f"history[{index}].url must be a string, got {url!r:.100}")
        if not isinstance(title, str):
            raise ValueError(f"history[{index}].title must be a string, got {title!r:.100}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ValueError(f"history[{index}].visit_time_from_now_in_seconds must be a number, got {seconds!r:.50}")
        rows.append((url, title, seconds))
    return rows


def build_history_db(
    history: Sequence[dict[str, Any]],
    *,
    now: datetime | None = None,
    browser: Browser = "chrome",
) -> bytes:
    """The bytes of a History SQLite file holding `history`, as WAA's history steps build it.

    Each entry `{url, title, visit_time_from_now_in_seconds}` becomes, in list order, one `urls`
    row (url, title, visit_count=1, typed_count=0, last_visit_time=t, hidden=0) and one `visits`
    row (url=<that urls.id>, visit_time=t, from_visit=0, transition=805306368, segment_id=0,
    visit_duration=0), where t = chrome_time(now - seconds). Duplicate URLs get separate rows,
    as in WAA. `now` defaults to the current UTC time (WAA uses the host's naive local time,
    which equals UTC in its Docker container). Chrome and Edge files are identical (WAA's two
    functions differ only in the upload path); `browser` is checked and otherwise unused.
    """
    _check_browser(browser)
    rows = _history_rows(history)
    moment = now if now is not None else datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="waa-history-") as tmp:
        path = os.path.join(tmp, "History")
        with closing(sqlite3.connect(path)) as conn:
            conn.executescript(_HISTORY_SCHEMA)
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", _HISTORY_META)
            for url, title, seconds in rows:
                stamp = chrome_time(moment - timedelta(seconds=seconds))
                cursor = conn.execute(
                    "INSERT INTO urls (url, title, visit_count, typed_count, last_visit_time, hidden)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (url, title, 1, 0, stamp, 0),
                )
                conn.execute(
                    "INSERT INTO visits (url, visit_time, from_visit, transition, segment_id, visit_duration)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (cursor.lastrowid, stamp, 0, VISIT_TRANSITION, 0, 0),
                )
            conn.commit()
        with open(path, "rb") as handle:
            return handle.read()


# -- upload path -----------------------------------------------------------------------------


class _Executes(Protocol):
    def execute(self, command: list[str] | str, shell: bool = False) -> Any: ...


# Constant programs (nothing from a task file goes into them). Like WAA, the VM's Python reports
# its platform and joins the profile path from USERPROFILE (Windows) or HOME (macOS, Linux);
# both are printed, one per line, so a failure can say which part was missing.
_PATH_PROGRAMS: dict[str, str] = {
    "chrome": (
        "import os, platform; s = platform.system(); t = {"
        "'Windows': ('USERPROFILE', ('AppData', 'Local', 'Google', 'Chrome', 'User Data', 'Default', 'History')), "
        "'Darwin': ('HOME', ('Library', 'Application Support', 'Google', 'Chrome', 'Default', 'History')), "
        "'Linux': ('HOME', ('.config', 'google-chrome', 'Default', 'History'))}.get(s); "
        "b = os.getenv(t[0]) if t else None; print(s); print(os.path.join(b, *t[1]) if b else '')"
    ),
    "edge": (
        "import os, platform; s = platform.system(); t = {"
        "'Windows': ('USERPROFILE', ('AppData', 'Local', 'Microsoft', 'Edge', 'User Data', 'Default', 'History')), "
        "'Darwin': ('HOME', ('Library', 'Application Support', 'Microsoft', 'Edge', 'Default', 'History')), "
        "'Linux': ('HOME', ('.config', 'microsoft-edge', 'Default', 'History'))}.get(s); "
        "b = os.getenv(t[0]) if t else None; print(s); print(os.path.join(b, *t[1]) if b else '')"
    ),
}


def history_upload_path(client: _Executes, browser: Browser) -> str:
    """The VM path of the browser's `Default` profile History file, asked of the VM's Python.

    WAA runs `platform.system()` and then, on Windows,
    `os.path.join(os.getenv('USERPROFILE'), "AppData", "Local", "Google", "Chrome", "User Data",
    "Default", "History")` (Edge: "Microsoft", "Edge" instead of "Google", "Chrome"; macOS and
    Linux use HOME and their own profile folders) through `/execute` `python -c`. One constant
    program does both here, through `client.execute`. Raises HistoryPathError naming the browser
    when the command fails, the platform is unsupported or the variable is unset.
    """
    _check_browser(browser)
    step = "update_browse_history" if browser == "chrome" else "update_browse_history_edge"
    where = f"{step} ({browser}): cannot determine the History path on the VM"
    try:
        result = client.execute(["python", "-c", _PATH_PROGRAMS[browser]], shell=False)
    except Exception as exc:  # WAAError and friends: report them under this step's name
        raise HistoryPathError(f"{where}: /execute failed: {exc}") from exc
    returncode = getattr(result, "returncode", -1)
    output = str(getattr(result, "output", "") or "")
    if returncode != 0:
        error = str(getattr(result, "error", "") or "").strip()
        raise HistoryPathError(f"{where}: python exited with {returncode}: {error[-300:] or output[-300:] or 'no output'}")
    lines = [line.strip() for line in output.splitlines()]
    system = lines[0] if lines else ""
    path = lines[1] if len(lines) > 1 else ""
    if system not in ("Windows", "Darwin", "Linux"):
        raise HistoryPathError(f"{where}: unsupported operating system {system!r:.50}")
    if not path:
        variable = "USERPROFILE" if system == "Windows" else "HOME"
        raise HistoryPathError(f"{where}: {variable} is not set on the {system} VM")
    return path


def update_browse_history(
    client: Any,
    history: Sequence[dict[str, Any]],
    browser: Browser = "chrome",
    *,
    now: datetime | None = None,
) -> str:
    """The `update_browse_history(_edge)` step: build the History file, upload it, return its path.

    `client` needs `execute` and `setup_upload(path, data)` (a WAAClient). The browser must not
    be running: it keeps History open and the upload would fail or be overwritten (WAA's tasks
    run this step before launching the browser). WAA then runs a Linux-only `sudo chown`, which
    does nothing on Windows; it is not repeated here.
    """
    data = build_history_db(history, now=now, browser=browser)
    path = history_upload_path(client, browser)
    client.setup_upload(path, data)
    logger.info("uploaded %d history entries (%d bytes) to %s", len(history), len(data), path)
    return path
