"""Browser metrics: WAA's `metrics/chrome.py`, `metrics/edge.py` and `check_direct_json_object`.

Each function takes what the matching getter of `getters_browser` returns and behaves as WAA's
function of the same name on every input: the same return values (some WAA metrics return the
ints 0/1, others the floats 0./1.), the same exceptions where WAA's code raises (a None state,
an unknown rule type), and WAA's quirks (strict `<` in `check_font_size` but `<=` for Edge,
order-sensitive experiment lists, substring matches). URLs are compared with WAA's
`compare_urls` (`urls_match` of `adapters.waa.browser_setup`).
"""

from __future__ import annotations

import json
import re
from itertools import product
from typing import Any

from adapters.waa.browser_setup import urls_match
from adapters.waa.evaluator.metrics import metric, metric_variant


def _unsupported(rule_type: Any) -> TypeError:
    return TypeError(f"{rule_type} not support yet!")


@metric("is_shortcut_on_desktop")
def is_shortcut_on_desktop(shortcuts: Any, rule: Any) -> float:
    """WAA `is_shortcut_on_desktop`: rule `name` looks for "Name=<name>\\n" in a shortcut's
    text; rule `description` parses each shortcut's text as JSON (the LnkParse3 dump) and looks
    for the rule's description inside `data.description` (any error for one shortcut is
    skipped). Other types (`url`, `id`, ...) raise TypeError, as in WAA."""
    kind = rule["type"]
    if kind == "name":
        for content in shortcuts.values():
            if "Name=" + rule["name"] + "\n" in content:
                return 1.0
        return 0.0
    if kind == "description":
        for content in shortcuts.values():
            try:
                if rule["description"] in json.loads(content)["data"]["description"]:
                    return 1.0
            except Exception:  # noqa: BLE001 - WAA's bare except skips this shortcut
                continue
        return 0.0
    raise _unsupported(kind)


@metric_variant("waa-v2", "is_shortcut_on_desktop")
def is_shortcut_on_desktop_v2(shortcuts: Any, rule: Any) -> float:
    """WAA-V2's `is_shortcut_on_desktop`: WAA's, plus rule `url`, which WAA rejects. For each
    shortcut: when its text is JSON with `data.url` (the LnkParse3 dump), that URL is compared;
    JSON without it but containing "URL=" compares the first line starting "URL="; text that is
    not JSON compares the first "URL=..." found anywhere in it. Every error is swallowed, as V2's
    bare excepts do, so a rule without a `url` key (V2's own task 35253b65 names its URL
    `description`) scores 0, never an error."""
    if rule["type"] != "url":
        return is_shortcut_on_desktop(shortcuts, rule)
    for content in shortcuts.values():
        try:
            data = json.loads(content)
            if "data" in data and "url" in data["data"]:
                if urls_match(rule["url"], data["data"]["url"]):
                    return 1.0
            elif "URL=" in content:
                line = next((ln for ln in content.split("\n") if ln.startswith("URL=")), None)
                if line and urls_match(rule["url"], line[4:]):
                    return 1.0
        except Exception:  # noqa: BLE001 - V2's bare except: try the raw "URL=" form instead
            try:
                found = re.search(r"URL=(.+?)(\n|$)", content)
                if found and urls_match(rule["url"], found.group(1)):
                    return 1.0
            except Exception:  # noqa: BLE001 - V2 skips this shortcut
                pass
    return 0.0


@metric("check_font_size")
def check_font_size(font_size: Any, rule: Any) -> float:
    """WAA `check_font_size` (Chrome): `default_font_size` equal to rule `value`, or strictly
    between `min` and `max` for rule `range`. A missing key raises KeyError."""
    size = font_size["default_font_size"]
    kind = rule["type"]
    if kind == "value":
        return 1.0 if size == rule["value"] else 0.0
    if kind == "range":
        return 1.0 if rule["min"] < size < rule["max"] else 0.0
    raise _unsupported(kind)


@metric("check_edge_font_size")
def check_edge_font_size(font_size: Any, rule: Any) -> float:
    """WAA `check_edge_font_size`: as `check_font_size` but `min <= size < max` for `range`."""
    size = font_size["default_font_size"]
    kind = rule["type"]
    if kind == "value":
        return 1.0 if size == rule["value"] else 0.0
    if kind == "range":
        return 1.0 if rule["min"] <= size < rule["max"] else 0.0
    raise _unsupported(kind)


@metric("is_expected_active_tab")
def is_expected_active_tab(active_tab_info: Any, rule: Any) -> float:
    """WAA `is_expected_active_tab`: 0. for an empty/None state; for rule type `url`, 1 (int)
    when the tab's `url` (or the state itself when it is not a dict) equals rule `url` under
    `compare_urls`, else 0 (int); another rule type gives 0 (WAA only logs it)."""
    if not active_tab_info:
        return 0.0
    if rule["type"] != "url":
        return 0
    actual = active_tab_info.get("url", None) if isinstance(active_tab_info, dict) else active_tab_info
    return 1 if urls_match(rule["url"], actual) else 0


@metric("is_expected_tabs")
def is_expected_tabs(open_tabs: Any, rule: Any) -> float:
    """WAA `is_expected_tabs`: for rule type `url`, 1 (int) when the open tabs' URLs and rule
    `urls` have the same length and every expected URL matches some open tab under
    `compare_urls` (WAA's `are_lists_equal`), else 0; another rule type gives 0. A None state
    raises TypeError."""
    if rule["type"] != "url":
        return 0
    expected = rule["urls"]
    actual = [tab["url"] for tab in open_tabs]
    if len(expected) != len(actual):
        return 0
    return 1 if all(any(urls_match(want, have) for have in actual) for want in expected) else 0


@metric("is_expected_bookmarks")
def is_expected_bookmarks(bookmarks: Any, rule: Any) -> float:
    """WAA `is_expected_bookmarks`, on the `roots` dict of a Bookmarks file: 0. for an empty or
    None state; rule `bookmark_bar_folders_names` / `bookmark_bar_websites_urls`: 1. when the
    rule's names/urls are a subset of the bookmark bar's folder names / URLs (exact strings);
    `liked_authors_websites_urls`: 1. when the bar's "Liked Authors" folder holds exactly one of
    the allowed URL combinations. Another rule type raises TypeError."""
    if not bookmarks:
        return 0.0
    kind = rule["type"]
    if kind == "bookmark_bar_folders_names":
        names = [b["name"] for b in bookmarks["bookmark_bar"]["children"] if b["type"] == "folder"]
        return 1.0 if set(rule["names"]).issubset(set(names)) else 0.0
    if kind == "bookmark_bar_websites_urls":
        urls = [b["url"] for b in bookmarks["bookmark_bar"]["children"] if b["type"] == "url"]
        return 1.0 if set(rule["urls"]).issubset(set(urls)) else 0.0
    if kind == "liked_authors_websites_urls":
        folder = next(
            (b for b in bookmarks["bookmark_bar"]["children"] if b["type"] == "folder" and b["name"] == "Liked Authors"),
            None,
        )
        if not folder:
            return 0.0
        liked = [b["url"] for b in folder["children"] if b["type"] == "url"]
        # WAA wraps single URLs into lists in the rule itself; a copy gives the same result.
        choices = [[url] if isinstance(url, str) else url for url in rule["urls"]]
        return 1.0 if any(set(combo) == set(liked) for combo in product(*choices)) else 0.0
    raise _unsupported(kind)


@metric("is_cookie_deleted")
def is_cookie_deleted(cookie_data: Any, rule: Any) -> float:
    """WAA `is_cookie_deleted`: rule `domains`: 0. when any cookie row's host_key (column 1)
    equals one of the domains under `compare_urls` (so ".amazon.com" matches only that exact
    host key, not "www.amazon.com"), else 1. A None state raises TypeError."""
    if rule["type"] != "domains":
        raise _unsupported(rule["type"])
    hosts = [cookie[1] for cookie in cookie_data]
    for domain in rule["domains"]:
        if any(urls_match(domain, host) for host in hosts):
            return 0.0
    return 1.0


@metric_variant("waa-v2", "is_cookie_deleted")
def is_cookie_deleted_v2(cookie_data: Any, rule: Any) -> float:
    """WAA-V2's `is_cookie_deleted`: no cookie data at all (the store is gone or empty) counts
    as deleted (1.0) whatever the rule, where WAA raises on None; otherwise WAA's rule."""
    if cookie_data is None or len(cookie_data) == 0:
        return 1.0
    return is_cookie_deleted(cookie_data, rule)


@metric("check_history_deleted")
def check_history_deleted(history_data: Any, rule: Any) -> float:
    """WAA `check_history_deleted`: rule `keywords`: 0. when a keyword is a (case-sensitive)
    substring of any history row's URL (column 0), else 1. A None state raises TypeError."""
    if rule["type"] != "keywords":
        raise _unsupported(rule["type"])
    urls = [row[0] for row in history_data]
    for keyword in rule["keywords"]:
        if any(keyword in url for url in urls):
            return 0.0
    return 1.0


@metric("check_enabled_experiments")
def check_enabled_experiments(enabled_experiments: Any, rule: Any) -> float:
    """WAA `check_enabled_experiments`: the experiment names (text before '@') must *equal* rule
    `names` as a list (order and count matter). Another rule type raises TypeError."""
    names = [experiment.split("@")[0] for experiment in enabled_experiments]
    if rule["type"] != "names":
        raise _unsupported(rule["type"])
    return 1.0 if names == rule["names"] else 0.0


@metric("is_added_to_steam_cart")
def is_added_to_steam_cart(active_tab_info: Any, rule: Any) -> float:
    """WAA `is_added_to_steam_cart`: 1. when every rule item is a substring of the page's
    `content`. A None state or content raises TypeError."""
    content = active_tab_info["content"]
    return 1.0 if all(item in content for item in rule["items"]) else 0.0


@metric("check_direct_json_object")
def check_direct_json_object(result: Any, rules: Any) -> float:
    """WAA `check_direct_json_object` (general.py): a str result is stripped, its ' turned into "
    and parsed as JSON (invalid JSON raises, as in WAA); None gives 0. Without
    `expect_in_result` every key of `rules["expected"]` must have an equal value in the result;
    with it, a list expected value needs one of its items in the result's list and a str must be
    a substring of the result's value (other types give 0). Any error while comparing gives 0."""
    if isinstance(result, str):
        result = json.loads(result.strip().replace("'", '"'))
    if result is None:
        return 0.0
    try:
        expected = rules["expected"]
        if not rules.get("expect_in_result", False):
            for key in expected.keys():
                if expected.get(key) != result.get(key):
                    return 0.0
            return 1.0
        for key in expected.keys():
            wanted = expected.get(key)
            if isinstance(wanted, list):
                have = result.get(key)
                if not any(isinstance(have, list) and item in have for item in wanted):
                    return 0.0
            elif isinstance(wanted, str):
                if wanted not in result.get(key):
                    return 0.0
            else:
                return 0.0
        return 1.0
    except Exception:  # noqa: BLE001 - WAA's bare except scores 0
        return 0.0


@metric("is_url_shortcut_on_desktop")
def is_url_shortcut_on_desktop(shortcuts: Any, rule: Any) -> float:
    """WAA `is_url_shortcut_on_desktop` (edge.py): rule `url`: 1. when `url_content` is a
    substring of any `.url` file's text. Another rule type raises TypeError."""
    if rule["type"] != "url":
        raise _unsupported(rule["type"])
    return 1.0 if any(rule["url_content"] in content for content in shortcuts.values()) else 0.0
