"""Browser getters: Chrome and Edge profile state, desktop shortcuts, tabs and web pages.

These mirror WAA's `getters/chrome.py`, `getters/edge.py`, `getters/msedge.py` and the relative
time rule of `getters/misc.py`, on WAA's Windows VMs, including the value each returns when a
profile file is missing or unreadable (they differ: "false", "Google", None, [], 0.0, "error",
a default font dict...), because `exact_match` compares that value with plain `==`.

How state is read:

* Profile files. WAA asks the VM's Python for the file's path (`/execute python -c ...` with
  `os.path.join(os.getenv('LOCALAPPDATA'), 'Google/Chrome/User Data/Default/Preferences')`, the
  History files from USERPROFILE) and then fetches it with `/file`. Here one constant program,
  `PROFILE_PATHS_PROGRAM`, prints every such path (joined by the VM's Python exactly as WAA joins
  them) as JSON; nothing from a task file goes into it. WAA prefixes its program with
  `import pyautogui` (its controller's `pkgs_prefix`); that import has no bearing on the path and
  is left out. Only the Windows branch of WAA's getters is followed (WAA VMs are Windows).
* History and Cookies are SQLite files copied into the task's cache dir and read with fixed
  queries (`SELECT url, title, last_visit_time FROM urls`, `SELECT * FROM cookies`).
* Desktop shortcuts: `/desktop_path` + `/list_directory` + `/file`; `.lnk` files are dumped with
  LnkParse3's `print_json(print_all=True)`, exactly the text WAA's metric parses.
* The active tab's URL comes from the `uia` accessibility tree (the Address and search bar of a
  `chrome_widgetwin_1` window), as in WAA's `get_active_url_from_accessTree`.
* WAA drives the VM's browser with Playwright over CDP at VM:9222 for `open_tabs_info` and
  `active_tab_info`; here the DevTools *HTTP* endpoints do it (`DevToolsClient` of
  `adapters.waa.browser_setup`), at `ctx.devtools_url`.
* `page_info` and `pdf_from_url` fetch the page on the evaluation host with requests (see their
  docstrings and `BROWSER_DEVIATIONS` for what that changes).

Failures: a `WAAConnectionError` always propagates (infrastructure). A `WAAHTTPError` on a route
WAA's controller maps to None becomes None here too, with a note in `ctx.notes`.
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
import sqlite3
import time
from contextlib import closing, redirect_stdout
from datetime import datetime, timedelta
from html.parser import HTMLParser
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse
from xml.etree import ElementTree

from adapters.transfer_errors import BROKEN_TRANSFER
from adapters.waa.errors import WAAHTTPError
from adapters.waa.evaluator.errors import EvaluationConfigError, HostNetworkError, require
from adapters.waa.evaluator.getters import GetterContext, cache_path, getter, soft_call
from adapters.waa.host_fetch import FetchRefused

BROWSER_DEVIATIONS: list[str] = [
    "Browser getters follow only the Windows branch of WAA's getters (WAA VMs run Windows); the "
    "profile-path program omits WAA's `import pyautogui` prefix, which does not affect the path.",
    "cookie_data / cookie_data_for_edge with `user_data_dir`: WAA pastes that task string into the "
    "Python program it runs on the VM; we never put task text into a VM program, so the option is "
    "an evaluation_error (no WAA task uses it).",
    "open_tabs_info reads /json/list (titles as the browser reports them, no wait for network "
    "idle; order reversed to approximate creation order). When DevTools fails (browser not "
    "running) it returns [] with a note; WAA first relaunches Chrome through /setup/launch and "
    "returns [] only if that fails too.",
    "active_tab_info opens the active tab's URL in a new tab of the browser's default profile over "
    "/json/new, waits until its URL and title stop changing (WAA: a fresh incognito-like context "
    "and the load event), reads title and final URL, closes the tab, and returns content None: "
    "the DevTools HTTP endpoints cannot read the DOM (WAA returns the page HTML; no WAA task "
    "metric uses it for this getter).",
    "page_info fetches the URL on the evaluation host with requests (WAA loads it in a new tab of "
    "the VM's browser, with the agent's cookies and session). Pages that depend on the VM's "
    "session, such as a Steam cart, therefore do not show the agent's work. Title is the "
    "whitespace-collapsed <title>, content the raw HTML (WAA: the serialised DOM), load_state is "
    "not used.",
    "pdf_from_url fetches the URL on the host with requests and keeps the body when it is a PDF; "
    "an HTML page is an evaluation_error, because WAA prints it to PDF with the VM's Chrome "
    "(Playwright page.pdf), which needs a browser.",
    "rule_relativeTime returns a converted copy of the rules; WAA rewrites the task's config in "
    "place (same value for the evaluation, but later reads of the task would see the date).",
    "When DevTools cannot be reached, the tab getters give WAA's value for a failed connect "
    "(open_tabs_info [], active_tab_info None) unless the WAA server cannot be reached either, "
    "which is an infrastructure_error.",
]

# -- VM access helpers ----------------------------------------------------------------------------


# The one program run on the VM to find profile files. Each value is joined by the VM's Python
# from the same environment variable and relative path WAA's getters use (None when the variable
# is unset). Nothing from a task file goes into it.
PROFILE_PATHS_PROGRAM = (
    "import json, os; "
    "la = os.getenv('LOCALAPPDATA'); up = os.getenv('USERPROFILE'); "
    "j = lambda base, *parts: os.path.join(base, *parts) if base else None; "
    "print(json.dumps({"
    "'chrome/Preferences': j(la, 'Google/Chrome/User Data/Default/Preferences'), "
    "'chrome/Local State': j(la, 'Google/Chrome/User Data/Local State'), "
    "'chrome/Bookmarks': j(la, 'Google/Chrome/User Data/Default/Bookmarks'), "
    "'chrome/Cookies': j(la, 'Google/Chrome/User Data/Default/Network/Cookies'), "
    "'chrome/History': j(up, 'AppData', 'Local', 'Google', 'Chrome', 'User Data', 'Default', 'History'), "
    "'edge/Preferences': j(la, 'Microsoft/Edge/User Data/Default/Preferences'), "
    "'edge/Secure Preferences': j(la, 'Microsoft/Edge/User Data/Default/Secure Preferences'), "
    "'edge/Bookmarks': j(la, 'Microsoft/Edge/User Data/Default/Bookmarks'), "
    "'edge/Cookies': j(la, 'Microsoft/Edge/User Data/Default/Network/Cookies'), "
    "'edge/History': j(up, 'AppData', 'Local', 'Microsoft', 'Edge', 'User Data', 'Default', 'History')"
    "}))"
)
PROFILE_PATHS_COMMAND = ["python", "-c", PROFILE_PATHS_PROGRAM]

# WAA's get_cookie_data_for_edge kills Edge first ("otherwise we can't access the cookies").
KILL_EDGE_PROGRAM = "import os; os.system('taskkill /F /IM msedge.exe /T')"
KILL_EDGE_COMMAND = ["python", "-c", KILL_EDGE_PROGRAM]

# WAA's controller.get_all_installed_apps(): one string, sent without `shell` (False).
INSTALLED_APPS_COMMAND = (
    'powershell -Command "Get-AppxPackage | Select-Object Name,PackageFullName | ConvertTo-Json"'
)


def profile_file_path(ctx: GetterContext, key: str) -> str | None:
    """The VM path of profile file `key` ("chrome/Preferences", "edge/History", ...), or None.

    WAA reads `['output'].strip()` of its /execute answer outside any try: an /execute that
    answers with an HTTP error makes WAA raise, and so does this (the WAAHTTPError propagates).
    When the program fails or prints no usable path, WAA goes on with an empty path, its /file
    request fails and it sees no content; None here leads to the same missing-file value.
    """
    result = ctx.vm.execute(PROFILE_PATHS_COMMAND, shell=False)
    try:
        paths = json.loads(result.output)
        path = paths[key] if isinstance(paths, dict) else None
    except ValueError:
        path = None
    if not isinstance(path, str) or not path:
        detail = (result.error or result.output or "no output").strip()[-300:]
        ctx.notes.append(f"could not find {key} on the VM (python exited {result.returncode}: {detail})")
        return None
    return path


def _profile_file(ctx: GetterContext, key: str) -> bytes | None:
    """The bytes of a profile file, or None when it is missing or /file fails (as in WAA)."""
    path = profile_file_path(ctx, key)
    if path is None:
        return None
    content = soft_call(ctx, f"reading {path}", lambda: ctx.vm.get_file(path), None)
    if content is None:
        ctx.notes.append(f"{key}: {path} could not be read from the VM")
    return content


def _note_fallback(ctx: GetterContext, name: str, exc: Exception, value: Any) -> None:
    ctx.notes.append(f"{name}: {type(exc).__name__}: {exc}; WAA returns {value!r}")


# -- Chrome Preferences / Local State / Bookmarks -----------------------------------------------

_CHROME_ENGINES = {
    "485bf7d3-0215-45af-87dc-538868000001": "Google",
    "485bf7d3-0215-45af-87dc-538868000003": "Bing",
    "485bf7d3-0215-45af-87dc-538868000002": "Yahoo!",
    "485bf7d3-0215-45af-87dc-538868000092": "DuckDuckGo",
}
_EDGE_ENGINES = {
    "485bf7d3-0215-45af-87dc-538868000001": "Bing",
    "485bf7d3-0215-45af-87dc-538868000002": "Yahoo!",
    "485bf7d3-0215-45af-87dc-538868000003": "Google",
    "485bf7d3-0215-45af-87dc-538868000092": "DuckDuckGo",
    "485bf7d3-0215-45af-87dc-538868000015": "Yandex",
}


def _from_profile_json(
    ctx: GetterContext, name: str, key: str, read: Callable[[Any], Any], fallback: Any
) -> Any:
    """Parse a profile JSON file and apply `read`; any failure (missing file, bad JSON, a value of
    the wrong shape) gives `fallback`, as WAA's `except Exception` does."""
    content = _profile_file(ctx, key)
    try:
        return read(json.loads(content))  # json.loads(None) raises TypeError, as in WAA
    except Exception as exc:  # noqa: BLE001 - WAA catches everything here
        value = fallback() if callable(fallback) else fallback
        _note_fallback(ctx, name, exc, value)
        return value


@getter("enable_do_not_track")
def get_enable_do_not_track(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_enable_do_not_track`: "true" when Preferences' `enable_do_not_track` is truthy,
    else "false"; "false" also when the file is missing or unreadable."""
    return _from_profile_json(
        ctx, "enable_do_not_track", "chrome/Preferences",
        lambda data: "true" if data.get("enable_do_not_track", {}) else "false", "false",
    )


@getter("enable_enhanced_safety_browsing")
def get_enable_enhanced_safety_browsing(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_enable_enhanced_safety_browsing`: "true"/"false" from `safebrowsing.enhanced`.
    Kept WAA quirk: a missing or unreadable file gives "Google"."""
    return _from_profile_json(
        ctx, "enable_enhanced_safety_browsing", "chrome/Preferences",
        lambda data: "true" if data.get("safebrowsing", {}).get("enhanced", {}) else "false", "Google",
    )


@getter("data_delete_automacally")
def get_data_delete_automacally(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_data_delete_automacally`: "true" when `profile` has any
    `default_content_setting_values` entry (WAA checks only its presence), else "false".
    Kept WAA quirk: a missing file or a Preferences without `profile` gives "Google"."""
    return _from_profile_json(
        ctx, "data_delete_automacally", "chrome/Preferences",
        lambda data: "true" if data["profile"].get("default_content_setting_values", None) is not None else "false",
        "Google",
    )


def _chrome_search_engine(data: Any) -> Any:
    engine = _CHROME_ENGINES.get(data.get("default_search_provider", {}).get("guid"))
    if not engine:
        engine = data.get("default_search_provider_data", {}).get("template_url_data", {}).get("short_name", "Google")
    return engine


@getter("default_search_engine")
def get_default_search_engine(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_default_search_engine`: the name for `default_search_provider.guid` (Google, Bing,
    Yahoo!, DuckDuckGo), else `default_search_provider_data.template_url_data.short_name`, else
    "Google"; "Google" when the file is missing or unreadable."""
    return _from_profile_json(ctx, "default_search_engine", "chrome/Preferences", _chrome_search_engine, "Google")


@getter("profile_name")
def get_profile_name(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_profile_name`: Preferences' `profile.name`, None when absent or unreadable."""
    return _from_profile_json(
        ctx, "profile_name", "chrome/Preferences", lambda data: data.get("profile", {}).get("name", None), None
    )


@getter("chrome_font_size")
def get_chrome_font_size(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_chrome_font_size`: Preferences' `webkit.webprefs` dict. Kept WAA quirk: without
    that key the default has three entries (fixed 13, default 16, minimum 13), while a missing or
    unreadable file gives two (fixed 13, default 16)."""
    return _from_profile_json(
        ctx, "chrome_font_size", "chrome/Preferences",
        lambda data: data.get("webkit", {}).get(
            "webprefs", {"default_fixed_font_size": 13, "default_font_size": 16, "minimum_font_size": 13}
        ),
        lambda: {"default_fixed_font_size": 13, "default_font_size": 16},
    )


@getter("enabled_experiments")
def get_enabled_experiments(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_enabled_experiments`: `browser.enabled_labs_experiments` of `Local State`
    (entries like "name@1"), [] when absent or unreadable."""
    return _from_profile_json(
        ctx, "enabled_experiments", "chrome/Local State",
        lambda data: data.get("browser", {}).get("enabled_labs_experiments", []), lambda: [],
    )


def _bookmark_roots(ctx: GetterContext, key: str) -> Any:
    """WAA `get_bookmarks`/`get_favorites`: [] for a missing or empty file; otherwise the JSON's
    `roots` ({} when absent). Not guarded in WAA: invalid JSON raises."""
    content = _profile_file(ctx, key)
    if not content:
        return []
    return json.loads(content).get("roots", {})


@getter("bookmarks")
def get_bookmarks(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_bookmarks`: the Chrome Bookmarks file's `roots` dict; [] when there is none."""
    return _bookmark_roots(ctx, "chrome/Bookmarks")


@getter("favorites")
def get_favorites(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_favorites`: the Edge Bookmarks file's `roots` dict; [] when there is none."""
    return _bookmark_roots(ctx, "edge/Bookmarks")


# -- SQLite profile files -------------------------------------------------------------------------


def _cache_target(ctx: GetterContext, dest: Any) -> str:
    """Where a copied VM file goes: `dest` inside the task cache dir (never outside it)."""
    if not isinstance(dest, str) or not dest:
        raise TypeError(f"dest must be a non-empty file name, got {dest!r:.100}")
    return cache_path(ctx, dest, "dest")


def _sqlite_rows(ctx: GetterContext, name: str, key: str, config: dict[str, Any], query: str) -> list[tuple] | None:
    """Copy the SQLite profile file `key` into the cache dir as `dest` and run a fixed query."""
    return _sqlite_rows_from(ctx, name, _profile_file(ctx, key), config, query)


_HISTORY_QUERY = "SELECT url, title, last_visit_time FROM urls"
_COOKIES_QUERY = "SELECT * FROM cookies"


def _refuse_user_data_dir(name: str, config: dict[str, Any]) -> None:
    if "user_data_dir" in config:
        raise EvaluationConfigError(
            f"{name}: 'user_data_dir' is not supported (WAA runs it as code on the VM; this evaluator "
            "never puts task text into a VM program)"
        )


@getter("history")
def get_history(ctx: GetterContext, config: dict[str, Any]) -> list[tuple] | None:
    """WAA `get_history`: rows (url, title, last_visit_time) of Chrome's History `urls` table as a
    list of tuples; None when the file is missing or unreadable."""
    return _sqlite_rows(ctx, "history", "chrome/History", config, _HISTORY_QUERY)


@getter("history_for_edge")
def get_history_for_edge(ctx: GetterContext, config: dict[str, Any]) -> list[tuple] | None:
    """WAA `get_history_for_edge`: as `history`, for Edge's History file."""
    return _sqlite_rows(ctx, "history_for_edge", "edge/History", config, _HISTORY_QUERY)


@getter("cookie_data")
def get_cookie_data(ctx: GetterContext, config: dict[str, Any]) -> list[tuple] | None:
    """WAA `get_cookie_data`: every row of Chrome's `Network/Cookies` `cookies` table (tuples, so
    index 1 is host_key); None when the file is missing, locked or unreadable."""
    _refuse_user_data_dir("cookie_data", config)
    return _sqlite_rows(ctx, "cookie_data", "chrome/Cookies", config, _COOKIES_QUERY)


@getter("cookie_data_for_edge")
def get_cookie_data_for_edge(ctx: GetterContext, config: dict[str, Any]) -> list[tuple] | None:
    """WAA `get_cookie_data_for_edge`: kills msedge.exe on the VM first (as WAA does, so the file
    is not locked), then as `cookie_data` for Edge's `Network/Cookies`. A failed kill command
    (HTTP error) gives None, as in WAA, where it happens inside the guarded block."""
    _refuse_user_data_dir("cookie_data_for_edge", config)
    path = profile_file_path(ctx, "edge/Cookies")
    killed = soft_call(ctx, "taskkill msedge", lambda: ctx.vm.execute(KILL_EDGE_COMMAND, shell=False), None)
    if killed is None:
        return None
    content = None
    if path is not None:
        content = soft_call(ctx, f"reading {path}", lambda: ctx.vm.get_file(path), None)
        if content is None:
            ctx.notes.append(f"edge/Cookies: {path} could not be read from the VM")
    return _sqlite_rows_from(ctx, "cookie_data_for_edge", content, config, _COOKIES_QUERY)


def _sqlite_rows_from(
    ctx: GetterContext, name: str, content: bytes | None, config: dict[str, Any], query: str
) -> list[tuple] | None:
    """Write `content` to `dest` in the cache dir and run a fixed query (no task text in it).
    None on any failure (no content, no `dest`, not a database, no such table), as in WAA."""
    try:
        local = _cache_target(ctx, config["dest"])
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with open(local, "wb") as out:
            out.write(content)
        with closing(sqlite3.connect(local)) as conn:
            return conn.execute(query).fetchall()
    except EvaluationConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - WAA returns None for any error here
        _note_fallback(ctx, name, exc, None)
        return None


# -- Edge Preferences ---------------------------------------------------------------------------

_EDGE_CLEAR_ON_EXIT = {
    "browsing_history": True, "cache": True, "cookies": True, "download_history": True,
    "form_data": True, "hosted_apps_data": False, "passwords": True, "site_settings": True,
}


@getter("enable_do_not_track_from_edge")
def get_enable_do_not_track_from_edge(ctx: GetterContext, config: dict[str, Any]) -> float:
    """WAA `get_enable_do_not_track_from_edge`: 1.0 when `enable_do_not_track` is truthy, else
    0.0 (also for a missing or unreadable file)."""
    return _from_profile_json(
        ctx, "enable_do_not_track_from_edge", "edge/Preferences",
        lambda data: 1.0 if data.get("enable_do_not_track", {}) else 0.0, 0.0,
    )


@getter("enable_enhanced_safety_browsing_from_edge")
def get_enable_enhanced_safety_browsing_from_edge(ctx: GetterContext, config: dict[str, Any]) -> float:
    """WAA `get_enable_enhanced_safety_browsing_from_edge`: 1.0 when
    `edge.super_duper_secure_mode.enabled` is truthy, else 0.0 (also when any key is missing)."""
    return _from_profile_json(
        ctx, "enable_enhanced_safety_browsing_from_edge", "edge/Preferences",
        lambda data: 1.0 if data["edge"]["super_duper_secure_mode"]["enabled"] else 0.0, 0.0,
    )


@getter("data_delete_automacally_from_edge")
def get_data_delete_automacally_from_edge(ctx: GetterContext, config: dict[str, Any]) -> float:
    """WAA `get_data_delete_automacally_from_edge`: 1.0 when `browser.clear_data_on_exit` equals
    WAA's exact target (everything True except hosted_apps_data False), else 0.0."""
    return _from_profile_json(
        ctx, "data_delete_automacally_from_edge", "edge/Preferences",
        lambda data: 1.0 if data["browser"].get("clear_data_on_exit", None) == _EDGE_CLEAR_ON_EXIT else 0.0, 0.0,
    )


@getter("edge_font_size")
def get_edge_font_size(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_edge_font_size`: `webkit.webprefs`; {fixed 13, default 16} when absent or
    unreadable."""
    return _from_profile_json(
        ctx, "edge_font_size", "edge/Preferences",
        lambda data: data.get("webkit", {}).get("webprefs", {"default_fixed_font_size": 13, "default_font_size": 16}),
        lambda: {"default_fixed_font_size": 13, "default_font_size": 16},
    )


def _edge_search_engine(data: Any) -> Any:
    engine = _EDGE_ENGINES.get(data.get("default_search_provider", {}).get("synced_guid"), {})
    return engine if engine else "Unknown"


@getter("default_search_engine_from_edge")
def get_default_search_engine_from_edge(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_default_search_engine_from_edge`: the name for
    `default_search_provider.synced_guid` (Edge's GUID table: ...01 Bing, ...03 Google, ...),
    else "Unknown" (also for a missing or unreadable file)."""
    return _from_profile_json(
        ctx, "default_search_engine_from_edge", "edge/Preferences", _edge_search_engine, "Unknown"
    )


@getter("profile_name_from_edge")
def get_profile_name_from_edge(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_profile_name_from_edge`: Edge Preferences' `profile.name`, else None."""
    return _from_profile_json(
        ctx, "profile_name_from_edge", "edge/Preferences", lambda data: data.get("profile", {}).get("name", None), None
    )


def _edge_home_page(data: Any) -> Any:
    home = data.get("homepage", {})
    if home:
        return home.replace("https://", "").replace("http://", "").replace("/", "")
    return "False"


@getter("edge_home_page")
def get_edge_home_page(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_edge_home_page` (msedge.py): `homepage` of Edge's *Secure Preferences* with
    "https://", "http://" and every "/" removed; the string "False" when it is unset or empty;
    "error" when the file is missing or unreadable."""
    return _from_profile_json(ctx, "edge_home_page", "edge/Secure Preferences", _edge_home_page, "error")


def _download_folder(data: Any) -> Any:
    folder = data.get("download", {}).get("default_directory", {})
    return folder if folder else "False"


@getter("edge_default_download_folder")
def get_edge_default_download_folder(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_edge_default_download_folder` (msedge.py): `download.default_directory`; "False"
    when unset or empty; "error" when the file is missing or unreadable."""
    return _from_profile_json(ctx, "edge_default_download_folder", "edge/Preferences", _download_folder, "error")


@getter("validate_pwa_installed")
def get_validate_pwa_installed(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_validate_pwa_installed` (msedge.py): lists Appx packages with PowerShell
    (`ConvertTo-Json`) and answers "app_installed" when a package Name contains "pwabuilder"
    (any case), "app_not_installed" when none does or the output is empty, and "error" when
    /execute fails or the output cannot be read. Kept WAA quirk: when exactly one package is
    installed, ConvertTo-Json prints an object instead of a list and the answer is "error"."""
    result = soft_call(ctx, "Get-AppxPackage", lambda: ctx.vm.execute(INSTALLED_APPS_COMMAND, shell=False), None)
    try:
        output = result.output if result is not None else None
        if output is None:
            raise TypeError("/execute failed")
        if output:
            packages = json.loads(output)
            if [pkg for pkg in packages if "pwabuilder" in pkg["Name"].lower()]:
                return "app_installed"
    except Exception as exc:  # noqa: BLE001 - WAA returns "error" for any error here
        _note_fallback(ctx, "validate_pwa_installed", exc, "error")
        return "error"
    return "app_not_installed"


# -- desktop shortcuts ----------------------------------------------------------------------------


def _desktop_files(ctx: GetterContext, name: str, extension: str) -> tuple[str, list[str]]:
    desktop = soft_call(ctx, "desktop_path", ctx.vm.desktop_path, None)
    if desktop is None:
        # WAA lists the directory None; the server fails and WAA indexes None: a TypeError.
        raise TypeError(f"{name}: the VM's desktop path could not be read")
    tree = soft_call(ctx, f"list_directory {desktop}", lambda: ctx.vm.list_directory(desktop), None)
    if tree is None:
        raise TypeError(f"{name}: the VM could not list {desktop}")
    names = [entry["name"] for entry in tree["children"] if entry["name"].endswith(extension)]
    return desktop, names


def _desktop_file(ctx: GetterContext, desktop: str, file_name: str) -> bytes | None:
    # WAA joins with the host's os.path (posixpath in its Linux container); Windows accepts '/'.
    path = posixpath.join(desktop, file_name)
    return soft_call(ctx, f"reading {path}", lambda: ctx.vm.get_file(path), None)


@getter("shortcuts_on_desktop")
def get_shortcuts_on_desktop(ctx: GetterContext, config: dict[str, Any]) -> dict[str, str]:
    """WAA `get_shortcuts_on_desktop`: {file name: LnkParse3 JSON dump} for every `.lnk` entry on
    the VM's desktop (top level only). Not guarded in WAA: an unreadable or malformed `.lnk`
    raises. Needs LnkParse3."""
    LnkParse3 = require("LnkParse3", what="shortcuts_on_desktop", packages="LnkParse3", extra="browser")  # noqa: N806
    desktop, names = _desktop_files(ctx, "shortcuts_on_desktop", ".lnk")
    shortcuts: dict[str, str] = {}
    for file_name in names:
        data = _desktop_file(ctx, desktop, file_name)
        with BytesIO(data) as stream:
            parsed = LnkParse3.lnk_file(stream)
        captured = StringIO()
        with redirect_stdout(captured):
            parsed.print_json(print_all=True)
        shortcuts[file_name] = captured.getvalue()
    return shortcuts


@getter("url_shortcuts_on_desktop")
def get_url_shortcuts_on_desktop(ctx: GetterContext, config: dict[str, Any]) -> dict[str, str]:
    """WAA `get_url_shortcuts_on_desktop` (edge.py): {file name: text} for every `.url` entry on
    the VM's desktop (top level only), decoded as UTF-8. Not guarded in WAA: an unreadable or
    non-UTF-8 file raises."""
    desktop, names = _desktop_files(ctx, "url_shortcuts_on_desktop", ".url")
    shortcuts: dict[str, str] = {}
    for file_name in names:
        data = _desktop_file(ctx, desktop, file_name)
        if data is None:
            raise AttributeError(f"url_shortcuts_on_desktop: {file_name} could not be read ('NoneType' has no decode)")
        shortcuts[file_name] = data.decode("utf-8")
    return shortcuts


# -- the active tab (accessibility tree) ----------------------------------------------------------

_VALUE_ATTRIBUTE = "{uri:deskat:value.at-spi.gnome.org}value"
_ADDRESS_BAR_NAME = "Address and search bar"
_BROWSER_WINDOW_TAG = "chrome_widgetwin_1"
_ENCODING_DECLARATION = re.compile(r"^<\?xml[^>]*\bencoding\s*=", re.IGNORECASE)


def active_tab_url(ctx: GetterContext, config: dict[str, Any]) -> str | None:
    """WAA `get_active_url_from_accessTree` on Windows: the `uia` accessibility tree's last
    element named "Address and search bar" inside a `chrome_widgetwin_1` element (the CSS
    selector WAA uses), its value attribute prefixed with `goto_prefix` (default "https://").
    None when the tree cannot be had, holds no such element or the value is empty. Kept from
    WAA: malformed XML raises, and an element without a value attribute raises KeyError."""
    tree = soft_call(ctx, "accessibility (uia)", lambda: ctx.vm.accessibility("uia"), None)
    if tree is None:
        return None
    if isinstance(tree, str) and _ENCODING_DECLARATION.match(tree):
        # lxml refuses str input with an encoding declaration (ValueError), which WAA catches.
        ctx.notes.append("accessibility tree has an XML encoding declaration; WAA cannot parse it and returns None")
        return None
    root = ElementTree.fromstring(tree)
    found = []

    def walk(element: ElementTree.Element, inside_window: bool) -> None:
        if inside_window and element.get("name") == _ADDRESS_BAR_NAME:
            found.append(element)
        below = inside_window or element.tag == _BROWSER_WINDOW_TAG
        for child in element:
            walk(child, below)

    walk(root, False)
    if not found:
        ctx.notes.append("no Address and search bar in the accessibility tree (no browser window?)")
        return None
    text = found[-1].attrib[_VALUE_ATTRIBUTE]
    if not text:
        ctx.notes.append("the address bar is empty")
        return None
    return f"{config.get('goto_prefix', 'https://')}{text}"


@getter("active_tab_url_parse")
def get_active_tab_url_parse(ctx: GetterContext, config: dict[str, Any]) -> dict[str, str] | None:
    """WAA `get_active_tab_url_parse`: the first value of each `parse_keys` query parameter of
    the active tab's URL ('' when absent); `replace` renames keys, `or` falls back to another
    key's value when empty. None when there is no active tab URL."""
    url = active_tab_url(ctx, config)
    if url is None:
        return None
    query = parse_qs(urlparse(url).query)
    params = {key: query.get(key, [""])[0] for key in config["parse_keys"]}
    for old, new in config.get("replace", {}).items():
        params[new] = params.pop(old)
    for key, fallback in config.get("or", {}).items():
        params[key] = params[key] or params[fallback]
    return params


@getter("url_dashPart")
def get_url_dashPart(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_url_dashPart`: the `partIndex`-th '/'-separated part of the active tab's URL
    (query cut when `needDeleteId`), as a str (`returnType` "string") or {key: part} ("json");
    None for another returnType or when there is no active tab URL."""
    url = active_tab_url(ctx, config)
    if url is None:
        return None
    part = url.split("/")[config["partIndex"]]
    if config["needDeleteId"]:
        part = part.split("?")[0]
    if config["returnType"] == "string":
        return part
    if config["returnType"] == "json":
        return {config["key"]: part}
    return None


# -- DevTools ------------------------------------------------------------------------------------

# active_tab_info: how often to look at the new tab and how long to wait for it to settle.
TAB_POLL_SECONDS = 0.5
TAB_SETTLE_TIMEOUT_SECONDS = 30.0
DEVTOOLS_TIMEOUT_SECONDS = 10.0


def _devtools(ctx: GetterContext, name: str) -> Any:
    url = getattr(ctx, "devtools_url", None)
    if not url:
        raise EvaluationConfigError(f"{name} needs the browser DevTools URL (VM:9222); none was given")
    from adapters.waa.browser_setup import DevToolsClient

    return DevToolsClient(url, timeout=DEVTOOLS_TIMEOUT_SECONDS)


def _devtools_down(ctx: GetterContext, name: str, exc: Exception, value: Any) -> Any:
    """A DevTools failure gives WAA's value (its Playwright connect failed), with a note.

    The browser's port answers nothing both when the agent closed the browser (socat/Caddy in
    front of it then refuse or drop the connection) and when the whole VM is gone; the WAA server
    tells them apart: when it cannot be reached either, the WAAConnectionError propagates and the
    outcome is an infrastructure error.
    """
    if getattr(exc, "status", None) is None:
        try:
            ctx.vm.desktop_path()
        except WAAHTTPError:
            pass
    ctx.notes.append(f"{name}: {exc}; WAA returns {value!r}")
    return value


@getter("open_tabs_info")
def get_open_tabs_info(ctx: GetterContext, config: dict[str, Any]) -> list[dict[str, str]]:
    """WAA `get_open_tabs_info`: [{'title', 'url'}] of every open page, oldest first (see
    BROWSER_DEVIATIONS for how this differs from Playwright)."""
    from adapters.waa.browser_setup import DevToolsError

    devtools = _devtools(ctx, "open_tabs_info")
    try:
        tabs = devtools.tabs()
    except DevToolsError as exc:
        return _devtools_down(ctx, "open_tabs_info", exc, [])
    finally:
        devtools.close()
    return [{"title": tab.title, "url": tab.url} for tab in reversed(tabs)]


@getter("active_tab_info")
def get_active_tab_info(ctx: GetterContext, config: dict[str, Any]) -> dict[str, Any] | None:
    """WAA `get_active_tab_info`: opens the active tab's URL (from the accessibility tree) in a
    new tab and returns {'title', 'url' (after redirects), 'content'}; None when there is no
    active tab URL or the browser cannot be reached or the URL not opened. `content` is None
    here (see BROWSER_DEVIATIONS)."""
    from adapters.waa.browser_setup import DevToolsError

    devtools = _devtools(ctx, "active_tab_info")
    try:
        url = active_tab_url(ctx, config)
        if url is None:
            return None
        try:
            devtools.version()
        except DevToolsError as exc:
            return _devtools_down(ctx, "active_tab_info", exc, None)
        try:
            tab = devtools.open_tab(url)
        except DevToolsError as exc:
            ctx.notes.append(f"active_tab_info: could not open {url}: {exc}; WAA returns None")
            return None
        try:
            title, final_url = _settled(devtools, tab, ctx)
        finally:
            try:
                devtools.close_tab(tab.id)
            except DevToolsError as exc:
                ctx.notes.append(f"active_tab_info: could not close the tab it opened: {exc}")
        return {"title": title, "url": final_url, "content": None}
    finally:
        devtools.close()


def _settled(devtools: Any, tab: Any, ctx: GetterContext) -> tuple[str, str]:
    """Poll /json/list until the tab's URL and title are the same twice in a row."""
    deadline = time.monotonic() + TAB_SETTLE_TIMEOUT_SECONDS
    last: tuple[str, str] | None = None
    current = (tab.title, tab.url)
    while True:
        time.sleep(TAB_POLL_SECONDS)
        listed = {t.id: t for t in devtools.tabs()}
        if tab.id not in listed:
            ctx.notes.append("active_tab_info: the opened tab disappeared; using its last known state")
            return current
        current = (listed[tab.id].title, listed[tab.id].url)
        if current == last:
            return current
        last = current
        if time.monotonic() >= deadline:
            ctx.notes.append(f"active_tab_info: the tab did not settle within {TAB_SETTLE_TIMEOUT_SECONDS:g} s")
            return current


# -- pages fetched on the host ------------------------------------------------------------------


class _TitleParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.title: str | None = None
        self._parts: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "title" and self.title is None and self._parts is None:
            self._parts = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._parts is not None:
            self.title = "".join(self._parts)
            self._parts = None

    def handle_data(self, data: str) -> None:
        if self._parts is not None:
            self._parts.append(data)


def _page_title(html: str) -> str:
    parser = _TitleParser()
    try:
        parser.feed(html)
        parser.close()
    except Exception:  # noqa: BLE001 - a broken page just has no title
        pass
    title = parser.title if parser.title is not None else "".join(parser._parts or [])
    return " ".join(title.split())  # document.title collapses whitespace


def _fetch(ctx: GetterContext, name: str, url: Any) -> Any:
    if not isinstance(url, str) or not url:
        raise TypeError(f"{name}: url must be a non-empty string, got {url!r:.100}")
    if ctx.offline:
        raise EvaluationConfigError(f"{name}: {url} must be fetched from the web and offline mode is on")

    try:
        return ctx.fetch_policy.get(url, timeout=ctx.download_timeout)
    except FetchRefused as exc:
        raise EvaluationConfigError(f"{name}: {exc}") from None
    except BROKEN_TRANSFER as exc:
        raise HostNetworkError(f"{name}: cannot fetch {url}: {exc}") from exc


@getter("page_info")
def get_page_info(ctx: GetterContext, config: dict[str, Any]) -> dict[str, str]:
    """WAA `get_page_info`: {'title', 'url', 'content'} of the page at `url`, fetched on the host
    (see BROWSER_DEVIATIONS). Like Playwright's goto, an HTTP error status is still a page."""
    response = _fetch(ctx, "page_info", config["url"])
    content = response.text
    return {"title": _page_title(content), "url": response.url, "content": content}


@getter("pdf_from_url")
def get_pdf_from_url(ctx: GetterContext, config: dict[str, Any]) -> str:
    """WAA `get_pdf_from_url`: the URL `path` as a PDF in the cache dir under `dest`; returns
    its local path. Only a URL that serves a PDF can be kept without a browser; an HTML page is
    an evaluation error (WAA prints it with the VM's Chrome)."""
    url = config["path"]
    local = _cache_target(ctx, config["dest"])
    response = _fetch(ctx, "pdf_from_url", url)
    if response.status_code != 200:
        raise EvaluationConfigError(f"pdf_from_url: GET {url} answered HTTP {response.status_code}")
    body = response.content
    if not body.lstrip()[:5] == b"%PDF-":
        raise EvaluationConfigError(
            f"pdf_from_url: {url} is not a PDF ({response.headers.get('Content-Type', 'no content type')}); "
            "WAA prints the page to PDF with the VM's Chrome, which this evaluator cannot do"
        )
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    with open(local, "wb") as out:
        out.write(body)
    return local


# -- relative dates (host only) ------------------------------------------------------------------

_DAY_ABBR = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTH_ABBR = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_FULL = ("January", "February", "March", "April", "May", "June", "July", "August",
               "September", "October", "November", "December")
# WAA's table of known phrases: a number of days, or "special" for the phrases computed below.
_RELATIVE_DAYS: dict[str, Any] = {
    "tomorrow": 1,
    "5th next month": "special",
    "10th next month": "special",
    "11th next month": "special",
    "this month": "special",
    "this Saturday": "special",
    "this Sunday": "special",
    "next Monday": "special",
    "next Friday": "special",
    "first monday four months later": "special",
}


def _now() -> datetime:
    """The host's local time, as WAA uses (UTC in its container). Tests replace this."""
    return datetime.now()


def format_day(pattern: str, day: datetime) -> str:
    """WAA's `apply_rules_to_timeFormat`: each placeholder replaced once, in WAA's order."""
    replacements = (
        ("{DoW}", _DAY_ABBR[day.weekday()]),
        ("{Month}", _MONTH_ABBR[day.month - 1]),
        ("{DayD}", str(day.day)),
        ("{Year}", str(day.year)),
        ("{Month0D}", f"{day.month:02d}"),
        ("{month}", _MONTH_FULL[day.month - 1].lower()),
        ("{MonthFull}", _MONTH_FULL[day.month - 1]),
        ("{Day0D}", f"{day.day:02d}"),
    )
    for placeholder, value in replacements:
        pattern = pattern.replace(placeholder, value, 1)
    return pattern


def _next_month_day(now: datetime, day: int) -> datetime:
    return datetime(now.year + 1 if now.month == 12 else now.year, now.month + 1 if now.month < 12 else 1, day)


def _unknown_phrase(phrase: str) -> UnboundLocalError:
    # WAA leaves its date variable unassigned for phrases it has no branch for.
    return UnboundLocalError(f"rule_relativeTime: WAA computes no date for {phrase!r} here")


def _single_day(phrase: str, now: datetime) -> datetime:
    days = _RELATIVE_DAYS[phrase]  # an unknown phrase raises KeyError, as in WAA
    if days != "special":
        return now + timedelta(days=days)
    if phrase == "5th next month":
        return _next_month_day(now, 5)
    if phrase == "10th next month":
        return _next_month_day(now, 10)
    if phrase == "this month":
        return now
    if phrase == "next Monday":
        return now + timedelta(days=(6 - now.weekday()) + 1)
    if phrase == "first monday four months later":
        # Kept WAA bug: August gives month 0 (ValueError) and the year rolls over from September.
        first = datetime(now.year + 1 if now.month >= 9 else now.year, (now.month + 4) % 12, 1)
        return first + timedelta(days=((6 - first.weekday()) + 1) % 7)
    raise _unknown_phrase(phrase)


def _from_day(phrase: str, now: datetime) -> datetime:
    days = _RELATIVE_DAYS[phrase]
    if days != "special":
        return now + timedelta(days=days)
    if phrase == "this Saturday":
        return now + timedelta(days=5 - now.weekday())
    if phrase == "10th next month":
        return _next_month_day(now, 10)
    if phrase == "next Monday":
        return now + timedelta(days=(6 - now.weekday()) + 1)
    raise _unknown_phrase(phrase)


def _to_day(phrase: str, from_phrase: str, now: datetime) -> datetime:
    days = _RELATIVE_DAYS[phrase]
    if days != "special":
        return now + timedelta(days=days)
    if phrase == "this Sunday":
        return now + timedelta(days=6 - now.weekday())
    if phrase == "11th next month":
        return _next_month_day(now, 11)
    if phrase == "next Friday":
        if now.weekday() < 4 and from_phrase in ["next Monday"]:
            return now + timedelta(days=(4 - now.weekday()) + 7)
        return now + timedelta(days=(4 - now.weekday()) if now.weekday() < 4 else (6 - now.weekday()) + 5)
    raise _unknown_phrase(phrase)


@getter("rule_relativeTime")
def get_rule_relativeTime(ctx: GetterContext, config: dict[str, Any]) -> Any:
    """WAA `get_rule_relativeTime`: the spec's `rules` with the date placeholders of
    `expected.time` (or `expected.from`/`expected.to` when `relativeTime` has a "to") filled in
    from today's date and the phrase in `relativeTime` ("tomorrow", "next Monday", ...).
    Returns a copy; the spec is not changed (WAA rewrites it in place)."""
    rules = copy.deepcopy(config["rules"])
    relative = rules["relativeTime"]
    now = _now()
    if "to" not in relative.keys():
        rules["expected"]["time"] = format_day(rules["expected"]["time"], _single_day(relative["from"], now))
    else:
        start, end = relative["from"], relative["to"]
        rules["expected"]["from"] = format_day(rules["expected"]["from"], _from_day(start, now))
        rules["expected"]["to"] = format_day(rules["expected"]["to"], _to_day(end, start, now))
    return rules


__all__ = [
    "BROWSER_DEVIATIONS",
    "INSTALLED_APPS_COMMAND",
    "KILL_EDGE_COMMAND",
    "PROFILE_PATHS_COMMAND",
    "PROFILE_PATHS_PROGRAM",
    "active_tab_url",
    "format_day",
    "profile_file_path",
]
