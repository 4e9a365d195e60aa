"""Metrics for VS Code keybindings, zip archives and VLC's configuration file (vlcrc).

Each metric mirrors the WAA function of the same name in
`client/desktop_env/evaluators/metrics/{vscode,vlc}.py` on every input, including the return type
(WAA's VLC checks return the ints 1/0) and where it raises: the VLC checks read the file and the
rule's expected value outside their error handling, so a missing file, bytes that are not UTF-8
or a rule without its key raise (an evaluation error here, as WAA's evaluate() fails), while
everything inside is turned into 0.

How the VLC checks read vlcrc (WAA's way, kept exactly):
* the file is split on "\\n" only and each value is the text after the *last* '=' of a line,
  stripped (so a "\\r" of CRLF files disappears);
* every line that *contains* the key counts, commented-out lines ("#qt-bgcone=1") included, and
  the last such line wins; a file without the key gives VLC's default;
* `is_vlc_recordings_folder` alone skips comments and empty lines and stops at the first line
  mentioning input-record-path;
* an int expected value is compared as its str (so 0 matches "0"; True becomes "True").
"""

from __future__ import annotations

import io
import json
import zipfile
from difflib import SequenceMatcher
from typing import Any

from adapters.waa.evaluator.errors import require
from adapters.waa.evaluator.metrics import metric

# -- VS Code -----------------------------------------------------------------------------------------


def _load_json_list(path: Any, skip_first_line: bool) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            if skip_first_line:
                handle.readline()
            return json.load(handle)
    except Exception:  # noqa: BLE001 - WAA's bare except: unreadable or invalid JSON is None
        return None


@metric("check_json_keybindings", files=1)
def check_json_keybindings(actual: Any, expected: Any, **options: Any) -> float:
    """WAA `check_json_keybindings` (vscode.py): 1.0 iff `expected["expected"]` (one keybinding
    object) equals an entry of the JSON list in `actual`.

    The file is parsed as JSON, or, failing that, as JSON after dropping its first line (VS Code
    starts keybindings.json with a // comment). Anything else (no file, None, other comments,
    a JSON value that is not a list) is 0.0, as in WAA. Extra options are accepted and ignored.
    """
    for skip_first_line in (False, True):
        data = _load_json_list(actual, skip_first_line)
        if data is not None and type(data) is list:
            break
    else:
        return 0.0
    return 1.0 if expected["expected"] in data else 0.0


# -- zip archives ------------------------------------------------------------------------------------------


def _pdf_text(content: bytes) -> str:
    pypdf2 = require("PyPDF2", what="compare_zip_files (PDF members)", packages="PyPDF2", extra="office")
    reader = pypdf2.PdfReader(io.BytesIO(content))
    return "".join(page.extract_text() for page in reader.pages)


def pdf_texts_similar(first: bytes, second: bytes, threshold: float) -> bool:
    """WAA's `compare_pdf_content`: difflib's ratio of the two PDFs' PyPDF2 texts >= threshold.
    (WAA writes each PDF to ./temp.pdf first; we read them from memory.)"""
    return SequenceMatcher(None, _pdf_text(first), _pdf_text(second)).ratio() >= threshold


@metric("compare_zip_files", files=2)
def compare_zip_files(actual: Any, expected: Any, **options: Any) -> float:
    """WAA `compare_zip_files` (vscode.py): 1.0 iff both zip archives list the same member names
    and every member has the same bytes, except .pdf members (any case), which only need texts
    at least 95% similar (PyPDF2 extraction; the 'office' extra).

    An empty/None `actual` is 0.0; a missing or corrupt archive raises (FileNotFoundError,
    zipfile.BadZipFile), as in WAA. Extra options are accepted and ignored.
    """
    if not actual:
        return 0.0
    with zipfile.ZipFile(actual, "r") as ours, zipfile.ZipFile(expected, "r") as gold:
        names = set(ours.namelist())
        if names != set(gold.namelist()):
            return 0.0
        for name in names:
            mine, theirs = ours.read(name), gold.read(name)
            if name.lower().endswith(".pdf"):
                if not pdf_texts_similar(mine, theirs, 0.95):
                    return 0.0
            elif mine != theirs:
                return 0.0
    return 1.0


# -- VLC (vlcrc) ---------------------------------------------------------------------------------------------


def _read_vlcrc(path: Any) -> str:
    """The whole file as WAA reads it: bytes decoded as strict UTF-8, no newline translation."""
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8")


def _as_text(value: Any) -> Any:
    return str(value) if isinstance(value, int) else value


def _last_value(text: str, needle: str, default: str) -> str:
    """The value after the last '=' of the last line containing `needle`, else `default`."""
    value = default
    for line in text.split("\n"):
        if needle in line:
            value = line.split("=")[-1].strip()
    return value


def _setting_check(path: Any, rule: Any, rule_key: str, needle: str, default: str) -> int:
    text = _read_vlcrc(path)
    wanted = _as_text(rule[rule_key])
    return 1 if _last_value(text, needle, default) == wanted else 0


@metric("is_vlc_recordings_folder", files=1)
def is_vlc_recordings_folder(actual_config_path: Any, rule: Any) -> int:
    """WAA `is_vlc_recordings_folder`: 1 iff the first non-comment, non-blank line mentioning
    input-record-path has the value `rule["recording_file_path"]` (exact string); 0 when it
    differs or no such line exists."""
    text = _read_vlcrc(actual_config_path)
    wanted = rule["recording_file_path"]
    for line in text.split("\n"):
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:
            return 1 if line.split("=")[-1].strip() == wanted else 0
    return 0


@metric("check_qt_bgcone", files=1)
def check_qt_bgcone(actual_config_path: Any, rule: Any) -> int:
    """WAA `check_qt_bgcone`: 1 iff qt-bgcone (default "1") equals `rule["expected_qt_bgcone"]`."""
    return _setting_check(actual_config_path, rule, "expected_qt_bgcone", "qt-bgcone=", "1")


@metric("check_qt_max_volume", files=1)
def check_qt_max_volume(actual_config_path: Any, rule: Any) -> int:
    """WAA `check_qt_max_volume`: 1 iff qt-max-volume (default "125") equals
    `rule["expected_qt_max_volume"]`."""
    return _setting_check(actual_config_path, rule, "expected_qt_max_volume", "qt-max-volume=", "125")


@metric("check_qt_minimal_view", files=1)
def check_qt_minimal_view(actual_config_path: Any, rule: Any) -> int:
    """WAA `check_qt_minimal_view`: 1 iff qt-minimal-view (default "0") equals
    `rule["expected_qt_minimal_view"]`."""
    return _setting_check(actual_config_path, rule, "expected_qt_minimal_view", "qt-minimal-view=", "0")


@metric("check_qt_video_resize", files=1)
def check_qt_video_resize(actual_config_path: Any, rule: Any) -> int:
    """WAA `check_qt_video_resize`: 1 iff qt-video-autoresize (default "0") equals
    `rule["qt-video-autoresize"]` (WAA's rule key is the setting's own name)."""
    return _setting_check(actual_config_path, rule, "qt-video-autoresize", "qt-video-autoresize=", "0")


@metric("check_one_instance_when_started_from_file", files=1)
def check_one_instance_when_started_from_file(actual_config_path: Any, rule: Any) -> int:
    """WAA `check_one_instance_when_started_from_file`: 1 iff one-instance-when-started-from-file
    (default "1") equals `rule["expected_one_instance_when_started_from_file"]`."""
    return _setting_check(
        actual_config_path,
        rule,
        "expected_one_instance_when_started_from_file",
        "one-instance-when-started-from-file=",
        "1",
    )


@metric("check_global_key_play_pause", files=1)
def check_global_key_play_pause(actual_config_path: Any, rule: Any) -> int:
    """WAA `check_global_key_play_pause`: the global play/pause hotkey counts as "1" when the last
    line containing global-key-play-pause= has a non-empty value and "0" otherwise (also when no
    line has it, or the last one is the commented default "#global-key-play-pause="); 1 iff that
    equals `rule["expected_global_key_play_pause"]`."""
    text = _read_vlcrc(actual_config_path)
    wanted = _as_text(rule["expected_global_key_play_pause"])
    state = "0"
    for line in text.split("\n"):
        if "global-key-play-pause=" in line:
            state = "0" if line.split("=")[-1].strip() == "" else "1"
    return 1 if state == wanted else 0


DEFAULT_SLIDER_COLOURS = "153;210;153;20;210;20;255;199;15;245;39;29"


@metric("check_qt_slider_colours", files=1)
def check_qt_slider_colours(actual_config_path: Any, rule: Any) -> int | None:
    """WAA `check_qt_slider_colours`: the value of the last line containing qt-slider-colours
    (VLC's default when none) is checked by `rule["type"]`:

    * "match": 1 iff it equals `rule["expected_qt_slider_colours"]`;
    * "blackish": 1 iff every complete R;G;B triple has all three components below 100.

    Any error inside (a rule without its keys, a non-number component) is 0, as in WAA. Kept WAA
    quirk: another `type` returns None (WAA falls off the end of the function), which the engine
    reports as an evaluation error rather than a score.
    """
    text = _read_vlcrc(actual_config_path)
    try:
        colours = _last_value(text, "qt-slider-colours", DEFAULT_SLIDER_COLOURS)
        kind = rule["type"]
        if kind == "match":
            return 1 if colours == rule["expected_qt_slider_colours"] else 0
        if kind == "blackish":
            values = [int(part) for part in colours.split(";")]
            triples = zip(values[0::3], values[1::3], values[2::3])
            return 1 if all(all(component < 100 for component in rgb) for rgb in triples) else 0
    except Exception:  # noqa: BLE001 - WAA logs any error here and scores 0
        return 0
    return None
