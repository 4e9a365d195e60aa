"""File Explorer, Clock, Settings, Paint, VLC and VS Code checks, getter + metric, through the engine.

Each task shape comes from the WAA task files (examples/<domain>/*.json); the VM is the in-memory
FakeVM from conftest, wrapped (by composition) with the extra routes these getters use and a tiny
Python-snippet interpreter for the /execute checks. Right and wrong answers for every pair.
"""

from __future__ import annotations

import io
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
from PIL import Image, ImageDraw

from adapters.waa.client import ExecuteResult
from adapters.waa.errors import WAAHTTPError
from adapters.waa.evaluator import GETTERS, METRICS, evaluate_task, unsupported_names
from adapters.waa.evaluator import getters_system, metrics_system  # noqa: F401 - register names
from adapters.waa.evaluator.getters import GetterContext, cloud_cache_path, registry_query_command

PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "


class SystemVM:
    """FakeVM (conftest) plus the yes/no routes, /library_folders, /wallpaper and a handler for
    Python run through /execute. Unknown attributes are the wrapped FakeVM's."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.yes: set[tuple[Any, ...]] = set()  # (route, *args) answered 200
        self.route_status: dict[str, int] = {}  # route -> unexpected HTTP status
        self.libraries: dict[str, list[str]] = {}
        self.wallpaper_bytes: bytes | None = None
        self.python: Callable[[str], ExecuteResult] | None = None
        self.python_seen: list[str] = []
        self.execute_status: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def _ask(self, route: str, *args: Any) -> bool:
        self.base._check("/" + route)
        if route in self.route_status:
            raise WAAHTTPError("/" + route, self.route_status[route], "server error")
        return (route, *args) in self.yes

    def is_details_view(self, path: str) -> bool:
        return self._ask("is_details_view", path)

    def are_files_sorted_by_modified_time(self, directory: str) -> bool:
        return self._ask("are_files_sorted_by_modified_time", directory)

    def is_directory_read_only_for_user(self, directory: str, user: str) -> bool:
        return self._ask("is_directory_read_only_for_user", directory, user)

    def are_all_images_tagged(self, directory: str, tag: str) -> bool:
        return self._ask("are_all_images_tagged", directory, tag)

    def check_if_timer_started(self, hours: int, minutes: int, seconds: int) -> bool:
        return self._ask("check_if_timer_started", hours, minutes, seconds)

    def check_if_world_clock_exists(self, city: str, country: str) -> bool:
        return self._ask("check_if_world_clock_exists", city, country)

    def library_folders(self, library_name: str) -> list[str] | None:
        self.base._check("/library_folders")
        if "library_folders" in self.route_status:
            raise WAAHTTPError("/library_folders", self.route_status["library_folders"], "server error")
        return self.libraries.get(library_name)

    def wallpaper(self) -> bytes | None:
        self.base._check("/wallpaper")
        return self.wallpaper_bytes

    def execute(self, command: list[str] | str, shell: bool = False) -> ExecuteResult:
        is_python = isinstance(command, list) and command[:2] == ["python", "-c"]
        if not is_python or self.python is None:
            return self.base.execute(command, shell)
        self.base._check("/execute")
        if self.execute_status is not None:
            raise WAAHTTPError("/execute", self.execute_status, "boom")
        assert not shell and command[2].startswith(PREFIX)
        code = command[2][len(PREFIX):]
        self.python_seen.append(code)
        return self.python(code)


def ok(output: str, returncode: int = 0) -> ExecuteResult:
    return ExecuteResult(status="success", output=output, error="", returncode=returncode)


@pytest.fixture
def svm(vm) -> SystemVM:
    return SystemVM(vm)


@pytest.fixture
def run(svm, tmp_path) -> Callable[..., Any]:
    counter = iter(range(10_000))

    def evaluate(spec: dict, **kwargs: Any):
        kwargs.setdefault("cache_dir", tmp_path / f"cache{next(counter)}")
        return evaluate_task(spec, kwargs.pop("vm", svm), last_action="DONE", **kwargs)

    return evaluate


@pytest.fixture
def ctx(svm, tmp_path) -> GetterContext:
    return GetterContext(vm=svm, cache_dir=tmp_path / "ctx")


def rule(expected: Any) -> dict:
    return {"type": "rule", "rules": {"expected": expected}}


def exact(result: dict, expected: Any) -> dict:
    return {"func": "exact_match", "result": result, "expected": rule(expected)}


# -- registration ----------------------------------------------------------------------------------------

OUR_GETTERS = [
    "check_if_world_clock_exists", "check_if_timer_started", "is_all_docx_in_archive", "is_details_view",
    "vm_library_folders", "is_directory_read_only_for_user", "all_png_file_names", "are_all_images_tagged",
    "are_files_sorted_by_modified_time", "is_files_moved_downloads", "zipped_folder_in_desktop",
    "is_file_desktop", "vm_active_window_title", "is_file_hidden", "is_file_saved_desktop",
    "image_dimension_matches_input", "is_red_circle_present_on_canvas", "desktop_background",
    "system_timezone", "night_light_state", "vlc_config", "vm_wallpaper",
]
OUR_METRICS_SYSTEM = [
    "compare_zip_files", "check_json_keybindings", "check_qt_max_volume", "check_qt_video_resize",
    "check_qt_slider_colours", "check_qt_bgcone", "is_vlc_recordings_folder",
    "check_one_instance_when_started_from_file", "check_qt_minimal_view", "check_global_key_play_pause",
]
OUR_METRICS_MEDIA = ["compare_images", "compare_audios", "compare_videos"]
DOMAINS = ["file_explorer", "clock", "settings", "microsoft_paint", "vlc", "vs_code", "windows_calc"]
EXAMPLES = Path("/work/shared/waa-tasks/examples")


def test_our_names_are_registered():
    from adapters.waa.evaluator import metrics_media  # noqa: F401 - registers the media metrics

    assert [name for name in OUR_GETTERS if name not in GETTERS] == []
    assert [name for name in OUR_METRICS_SYSTEM + OUR_METRICS_MEDIA if name not in METRICS] == []
    assert all(GETTERS[name].__module__ == getters_system.__name__ for name in OUR_GETTERS)


def test_every_name_the_domains_use_is_registered():
    if not EXAMPLES.is_dir():
        pytest.skip(f"{EXAMPLES} is not present")
    from adapters.waa.evaluator import metrics_media  # noqa: F401

    ours = set(OUR_GETTERS + OUR_METRICS_SYSTEM + OUR_METRICS_MEDIA)
    used: set[str] = set()
    missing: dict[str, list[str]] = {}
    for domain in DOMAINS:
        for path in sorted((EXAMPLES / domain).glob("*.json")):
            spec = json.loads(path.read_text(encoding="utf-8"))["evaluator"]
            funcs = spec["func"] if isinstance(spec["func"], list) else [spec["func"]]
            entries = [spec.get(key) for key in ("result", "expected")]
            types = [e["type"] for v in entries for e in (v if isinstance(v, list) else [v]) if isinstance(e, dict) and "type" in e]
            used.update(name for name in funcs + types if name in ours)
            if unsupported_names(spec):
                missing[path.name] = unsupported_names(spec)
    assert missing == {}
    assert used, "the examples use none of our names: wrong directory?"


# -- Clock -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "result, route_args",
    [
        ({"type": "check_if_timer_started", "hours": 0, "minutes": 30, "seconds": 0}, ("check_if_timer_started", 0, 30, 0)),
        ({"type": "check_if_world_clock_exists", "city": "Kyoto", "country": "Japan"}, ("check_if_world_clock_exists", "Kyoto", "Japan")),
    ],
)
def test_clock_checks_answer_strings(run, svm, ctx, result, route_args):
    spec = exact(result, "True")
    assert GETTERS[result["type"]](ctx, result) == "False"
    assert run(spec).score == 0.0
    svm.yes.add(route_args)
    assert GETTERS[result["type"]](ctx, result) == "True"
    assert run(spec).score == 1.0
    assert run(exact(result, True)).score == 0.0  # the string "True" is not the bool True
    svm.route_status[route_args[0]] = 500
    outcome = run(spec, scoring="waa-compat")
    assert (outcome.kind, outcome.score) == ("scored", 0.0) and "WAA treats this as False" in outcome.reason
    assert run(spec).kind == "infrastructure_error"  # strict scoring (R9)


def test_yes_no_route_unreachable_is_infrastructure(run, svm):
    svm.base.down = True
    outcome = run(exact({"type": "check_if_world_clock_exists", "city": "Munich", "country": "Germany"}, "True"))
    assert outcome.kind == "infrastructure_error"


# -- File Explorer: yes/no routes ----------------------------------------------------------------------------


def test_is_details_view(run, svm, ctx):
    spec = exact({"type": "is_details_view", "folder_path": "C:/Users/Docker/Documents"}, True)
    assert run(spec).score == 0.0
    svm.yes.add(("is_details_view", "C:/Users/Docker/Documents"))
    assert run(spec).score == 1.0
    assert GETTERS["is_details_view"](ctx, {"folder_path": ""}) is False


def test_are_files_sorted_by_modified_time(run, svm, ctx):
    directory = "C:\\Users\\Docker\\Documents"
    spec = exact({"type": "are_files_sorted_by_modified_time", "directory": directory}, True)
    assert run(spec).score == 0.0
    svm.yes.add(("are_files_sorted_by_modified_time", directory))
    assert run(spec).score == 1.0
    assert GETTERS["are_files_sorted_by_modified_time"](ctx, {"directory": ""}) is False


def test_is_directory_read_only_for_user(run, svm, ctx):
    result = {"type": "is_directory_read_only_for_user", "directory": "C:\\Users\\Docker\\Pictures\\Vacation Photos", "user": "TestAccount"}
    assert run(exact(result, True)).score == 0.0
    svm.yes.add(("is_directory_read_only_for_user", result["directory"], "TestAccount"))
    assert run(exact(result, True)).score == 1.0
    with pytest.raises(ValueError):
        GETTERS["is_directory_read_only_for_user"](ctx, {**result, "user": ""})


def test_are_all_images_tagged(run, svm, ctx):
    result = {"type": "are_all_images_tagged", "directory": "C:\\Users\\Docker\\Pictures\\Summer Trip", "tag": "2023Vacation"}
    assert run(exact(result, True)).score == 0.0
    svm.yes.add(("are_all_images_tagged", result["directory"], "2023Vacation"))
    assert GETTERS["are_all_images_tagged"](ctx, result) is True
    assert run(exact(result, True)).score == 1.0
    outcome = run(exact({**result, "tag": ""}, True))
    assert outcome.score == 0.0 and "ValueError" in outcome.reason  # WAA raises, the getter scores 0


def test_vm_library_folders(run, svm):
    folders = ["C:\\Users\\Docker\\Downloads\\Arena Code", "C:\\Users\\Docker\\Downloads\\Arena Data", "C:\\Users\\Docker\\Downloads\\Arena Docs"]
    spec = exact({"type": "vm_library_folders", "library_name": "Arena"}, folders)
    assert run(spec).score == 0.0  # no such library: None
    svm.libraries["Arena"] = folders[::-1]
    assert run(spec).score == 0.0  # order matters to exact_match
    svm.libraries["Arena"] = list(folders)
    assert run(spec).score == 1.0
    svm.route_status["library_folders"] = 500
    assert run(spec).score == 0.0
    assert "ValueError" in run(exact({"type": "vm_library_folders"}, folders)).reason


# -- File Explorer: files and listings ---------------------------------------------------------------------------


DESKTOP = "C:\\Users\\Docker\\Desktop"


def test_is_file_desktop(run, svm, ctx):
    spec = exact({"type": "is_file_desktop", "filename": "example.txt"}, "true")
    assert run(spec).score == 0.0
    svm.files[DESKTOP + "\\example.txt"] = b""
    assert GETTERS["is_file_desktop"](ctx, {"filename": "example.txt"}) == "true"  # even empty
    assert run(spec).score == 1.0
    assert run(exact({"type": "is_file_desktop", "filename": "example.txt"}, True)).score == 0.0


@pytest.mark.parametrize(
    "filename, text",
    [("report.txt", "testing.bin"), ("numdays.txt", "230 days"), ("Differences.txt", "43 years, 9 months, 3 weeks, 4 days")],
)
def test_is_file_saved_desktop(run, svm, filename, text):
    spec = exact({"type": "is_file_saved_desktop", "filename": filename, "textcontent": text}, "true")
    assert run(spec).score == 0.0  # no file
    svm.files[DESKTOP + "\\" + filename] = b"something else\r\n"
    assert run(spec).score == 0.0
    svm.files[DESKTOP + "\\" + filename] = f"Result: {text}\r\n".encode("utf-8") + b"\xff"
    assert run(spec).score == 1.0


def test_is_file_saved_desktop_without_desktop_path(run, svm, monkeypatch):
    def broken() -> str:
        raise WAAHTTPError("/desktop_path", 500, "boom")

    monkeypatch.setattr(svm.base, "desktop_path", broken)
    spec = exact({"type": "is_file_saved_desktop", "filename": "a.txt", "textcontent": "x"}, "true")
    outcome = run(spec, scoring="waa-compat")  # WAA's own handling of the server's 500
    assert outcome.score == 0.0 and "TypeError" in outcome.reason
    strict = run(spec)  # the default: a server failure during evaluation is never scored (R9)
    assert strict.kind == "infrastructure_error" and "the server failed /desktop_path" in strict.reason


def _tree(name: str, children: list[dict]) -> dict:
    return {"type": "directory", "name": name, "children": children}


def _file(name: str) -> dict:
    return {"type": "file", "name": name}


def test_is_files_moved_downloads(run, svm):
    spec = exact({"type": "is_files_moved_downloads", "folder_name": "Test", "file_name": "example.txt"}, "true")
    downloads, old = "C:\\Users\\Docker\\Downloads", "C:\\Users\\Docker\\OldDownloads"
    svm.directories[downloads] = _tree("Downloads", [_file("other.pdf")])
    svm.directories[old] = _tree("OldDownloads", [_tree("Test", [_file("example.txt")])])
    assert run(spec).score == 1.0
    svm.directories[old] = _tree("OldDownloads", [_tree("Test", [_file("else.txt")]), _file("example.txt")])
    assert run(spec).score == 0.0
    # still in Downloads (both names occur anywhere in its JSON text): "false"
    svm.directories[old] = _tree("OldDownloads", [_tree("Test", [_file("example.txt")])])
    svm.directories[downloads] = _tree("Downloads", [_tree("Test", [_file("example.txt")])])
    assert run(spec).score == 0.0
    del svm.directories[downloads]  # no Downloads folder: the text "null"
    assert run(spec).score == 1.0
    del svm.directories[old]
    outcome = run(spec)
    assert outcome.score == 0.0 and "TypeError" in outcome.reason


def test_is_file_hidden(run, svm):
    path = "C:\\Users\\Docker\\Documents\\secret.txt"
    spec = exact({"type": "is_file_hidden", "file_path": path}, "true")
    svm.python = lambda code: ok("1\r\n")
    assert run(spec).score == 1.0
    assert svm.python_seen[-1] == (
        f"import os; print(1 if os.path.basename(r'{path}').startswith('.') or "
        f"(os.name == 'nt' and bool(os.stat(r'{path}').st_file_attributes & 2)) else 0)"
    )
    svm.python = lambda code: ok("0\n")
    assert run(spec).score == 0.0
    svm.python = lambda code: ok("", returncode=1)  # the file does not exist
    assert run(spec).score == 0.0
    svm.python = lambda code: ok("garbage")
    assert run(spec).score == 0.0
    svm.execute_status = 500  # WAA: status 'error' -> "false", not an exception
    outcome = run(spec, scoring="waa-compat")
    assert (outcome.kind, outcome.score) == ("scored", 0.0) and "without 'output'" in outcome.reason
    assert run(spec).kind == "infrastructure_error"  # strict scoring (R9)


def test_vm_active_window_title(run, svm):
    spec = exact({"type": "vm_active_window_title"}, "Documents")
    svm.python = lambda code: ok("Documents\r\n")
    assert run(spec).score == 1.0
    assert svm.python_seen[-1] == "import pyautogui; print(pyautogui.getActiveWindowTitle())"
    svm.python = lambda code: ok("Downloads\n")
    assert run(spec).score == 0.0
    svm.execute_status = 500
    outcome = run(spec, scoring="waa-compat")
    assert outcome.score == 0.0 and "KeyError" in outcome.reason
    assert run(spec).kind == "infrastructure_error"  # strict scoring (R9)


class MiniFS:
    """Answers the Python snippets of all_png_file_names and is_all_docx_in_archive from dicts."""

    def __init__(self, folders: dict[str, list[str]], texts: dict[str, str] | None = None) -> None:
        self.folders = folders  # folder -> file names (sub-folders are listed as folders)
        self.texts = texts or {}

    def __call__(self, code: str) -> ExecuteResult:
        if "File content:" in code:
            file_path = re.search(r"open\(r'([^']*)'", code).group(1)
            folder = re.search(r"os\.listdir\(r'([^']*)'\)", code).group(1)
            if file_path not in self.texts:
                return ok(f"File {file_path} does not exist\n")
            if folder not in self.folders:
                return ExecuteResult("success", "", "FileNotFoundError", 1)
            listed = set(self.texts[file_path].splitlines())
            pngs = {n for n in self.folders[folder] if n.lower().endswith(".png")}
            verdict = "true" if listed == pngs else "false"
            return ok(f"File content: {sorted(listed)!r}\nPNG files: {sorted(pngs)!r}\nResult: {verdict}\n")
        exists = re.fullmatch(r"import os; print\(os\.path\.exists\('([^']*)'\)\)", code)
        if exists:
            return ok(f"{exists.group(1) in self.folders}\n")
        listing = re.fullmatch(r"import os; print\(','\.join\(\[f for f in os\.listdir\('([^']*)'\) .*", code)
        if listing:
            return ok(",".join(self.folders[listing.group(1)]) + "\n")
        raise AssertionError(f"unexpected snippet {code!r}")


def test_all_png_file_names(run, svm):
    folder, listing = "C:/Users/Docker/Pictures", "C:/Users/Docker/Pictures/png_files.txt"
    spec = exact({"type": "all_png_file_names", "folder_path": folder, "file_path": listing}, "true")
    svm.python = MiniFS({folder: ["a.png", "B.PNG", "c.jpg", "png_files.txt"]}, {listing: "B.PNG\na.png\na.png\n"})
    assert run(spec).score == 1.0
    assert svm.python_seen[-1].startswith("\nimport os\n")
    svm.python = MiniFS({folder: ["a.png", "B.PNG"]}, {listing: "a.png\n"})
    assert run(spec).score == 0.0
    svm.python = MiniFS({folder: ["a.png"]})  # the text file does not exist: "false"
    assert run(spec).score == 0.0
    svm.python = MiniFS({}, {listing: "a.png"})  # the folder cannot be listed: WAA's parsing raises
    outcome = run(spec)
    assert outcome.score == 0.0 and "IndexError" in outcome.reason
    svm.python = lambda code: ExecuteResult("error", "", "", 1)
    assert run(spec).score == 0.0


def test_all_png_file_names_script_really_runs(tmp_path):
    import subprocess

    (tmp_path / "x.png").write_bytes(b"")
    (tmp_path / "y.PNG").write_bytes(b"")
    (tmp_path / "z.txt").write_bytes(b"")
    listing = tmp_path / "list.txt"
    listing.write_text("y.PNG\nx.png\n")
    script = getters_system.png_names_script(str(listing), str(tmp_path))
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert output.strip().split("\n")[2] == "Result: true"
    listing.write_text("x.png\n")
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert output.strip().split("\n")[2] == "Result: false"
    missing = getters_system.png_names_script(str(tmp_path / "nope.txt"), str(tmp_path))
    output = subprocess.run([sys.executable, "-c", missing], capture_output=True, text=True, check=True).stdout
    assert output.strip() == f"File {tmp_path / 'nope.txt'} does not exist"


def test_is_all_docx_in_archive(run, svm, ctx):
    docs = "C:/Users/Docker/Documents"
    spec = exact({"type": "is_all_docx_in_archive", "folder_path": docs}, "true")
    svm.python = MiniFS({docs: ["notes.txt", "Archive"], docs + "/Archive": ["a.docx", "B.DOCX"]})
    assert run(spec).score == 1.0
    svm.python = MiniFS({docs: ["left.docx"], docs + "/Archive": ["a.docx"]})
    assert run(spec).score == 0.0
    svm.python = MiniFS({docs: ["notes.txt"], docs + "/Archive": ["a.docx", "b.pdf"]})
    assert run(spec).score == 0.0
    svm.python = MiniFS({docs: ["notes.txt"], docs + "/Archive": []})  # empty Archive: "false" (WAA quirk)
    assert run(spec).score == 0.0
    svm.python = MiniFS({docs: ["a.docx"]})  # no Archive folder
    assert run(spec).score == 0.0
    assert GETTERS["is_all_docx_in_archive"](ctx, {"folder_path": ""}) == "false"
    svm.execute_status = 500
    outcome = run(spec, scoring="waa-compat")
    assert outcome.score == 0.0 and "KeyError" in outcome.reason
    assert run(spec).kind == "infrastructure_error"  # strict scoring (R9)


def _seven_zip(password: str | None, members: dict[str, bytes]) -> bytes:
    py7zr = pytest.importorskip("py7zr")
    buffer = io.BytesIO()
    with py7zr.SevenZipFile(buffer, mode="w", password=password) as archive:
        for name, content in members.items():
            archive.writef(io.BytesIO(content), name)
    return buffer.getvalue()


def test_zipped_folder_in_desktop(run, svm, monkeypatch):
    path = DESKTOP + "\\OldProjects.7z"
    spec = exact({"type": "zipped_folder_in_desktop", "filename": path, "password": "12345"}, "true")
    svm.files[path] = _seven_zip("12345", {"OldProjects/example.txt": b"hello", "OldProjects/b.txt": b"x"})
    assert run(spec).score == 1.0
    svm.files[path] = _seven_zip("12345", {"OldProjects/other.txt": b"hello"})
    assert run(spec).score == 0.0
    svm.files[path] = _seven_zip(None, {"OldProjects/example.txt": b"hello"})
    assert run(spec).score == 1.0  # WAA quirk: needs_password() is true whenever a password is given
    no_password = exact({"type": "zipped_folder_in_desktop", "filename": path, "password": None}, "false")
    assert run(no_password).score == 1.0
    svm.files[path] = _seven_zip("12345", {"OldProjects/example.txt": b"hello"})
    svm.files[path] = _seven_zip("wrong", {"OldProjects/example.txt": b"hello" * 100})
    assert run(spec).score == 0.0  # py7zr raises on the wrong password, as in WAA
    del svm.files[path]
    outcome = run(spec)
    assert outcome.score == 0.0 and "does not exist" in outcome.reason
    monkeypatch.setitem(sys.modules, "py7zr", None)
    outcome = run(spec)
    assert outcome.kind == "evaluation_error" and "py7zr" in outcome.reason and "office" in outcome.reason


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def _pdf(text: str, producer: str) -> bytes:
    """A one-page PDF showing `text`, built by hand (offsets computed)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Producer ({producer}) >>".encode("latin-1"),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info 6 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def test_compare_zip_files(run, svm, tmp_path):
    url = "https://example.invalid/DocumentsBackup.zip"
    gold = _zip({"a.txt": b"A", "docs/b.txt": b"B"})
    downloads = tmp_path / "downloads"
    target = cloud_cache_path(downloads, url, "DownloadsBackup_gold.zip")
    target.parent.mkdir(parents=True)
    target.write_bytes(gold)
    vm_path = "C:\\Users\\Docker\\Downloads\\DownloadssBackup.zip"
    spec = {
        "func": "compare_zip_files",
        "expected": {"type": "cloud_file", "path": url, "dest": "DownloadsBackup_gold.zip"},
        "result": {"type": "vm_file", "path": vm_path, "dest": "DownloadsBackup.zip"},
    }
    offline = {"offline": True, "download_dir": downloads}
    svm.files[vm_path] = _zip({"docs/b.txt": b"B", "a.txt": b"A"})  # order does not matter
    assert run(spec, **offline).score == 1.0
    svm.files[vm_path] = _zip({"a.txt": b"A", "docs/b.txt": b"b"})
    assert run(spec, **offline).score == 0.0
    svm.files[vm_path] = _zip({"a.txt": b"A"})
    assert run(spec, **offline).score == 0.0
    del svm.files[vm_path]
    assert (run(spec, **offline).kind, run(spec, **offline).score) == ("scored", 0.0)  # None: 0.0
    svm.files[vm_path] = b"not a zip"
    assert "BadZipFile" in run(spec, **offline).reason  # WAA raises: an evaluation error


def test_compare_zip_files_pdf_members_compare_text(tmp_path):
    pytest.importorskip("PyPDF2")
    gold = tmp_path / "gold.zip"
    gold.write_bytes(_zip({"r.pdf": _pdf("Quarterly report", "gold")}))
    same_text = tmp_path / "same.zip"
    same_text.write_bytes(_zip({"r.pdf": _pdf("Quarterly report", "another producer")}))
    other_text = tmp_path / "other.zip"
    other_text.write_bytes(_zip({"r.pdf": _pdf("Something else entirely", "gold")}))
    assert _pdf("Quarterly report", "gold") != _pdf("Quarterly report", "another producer")
    assert METRICS["compare_zip_files"](str(same_text), str(gold)) == 1.0
    assert METRICS["compare_zip_files"](str(other_text), str(gold)) == 0.0


# -- Paint ----------------------------------------------------------------------------------------------


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _canvas(shape: str) -> bytes:
    image = Image.new("RGB", (200, 150), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    if shape == "ring":
        draw.ellipse((60, 40, 140, 120), outline=(230, 20, 30), width=3)
    elif shape == "disc":
        draw.ellipse((60, 40, 140, 120), fill=(230, 20, 30))
    elif shape == "blue ring":
        draw.ellipse((60, 40, 140, 120), outline=(20, 20, 230), width=3)
    return _png(image)


def test_is_red_circle_present_on_canvas(run, svm, ctx):
    pytest.importorskip("numpy")
    path = "C:\\Users\\Docker\\Downloads\\Screenshot.png"
    spec = exact({"type": "is_red_circle_present_on_canvas", "filepath": path}, True)
    svm.files[path] = _canvas("ring")
    assert run(spec).score == 1.0
    svm.files[path] = _canvas("disc")  # red inside, not white
    assert run(spec).score == 0.0
    svm.files[path] = _canvas("blue ring")
    assert GETTERS["is_red_circle_present_on_canvas"](ctx, {"filepath": path}) is False
    del svm.files[path]
    missing = GETTERS["is_red_circle_present_on_canvas"](ctx, {"filepath": path})
    assert missing == 0 and type(missing) is int  # WAA's int 0
    assert run(spec).score == 0.0
    assert run(exact({"type": "is_red_circle_present_on_canvas", "filepath": path}, False)).score == 1.0  # 0 == False
    assert GETTERS["is_red_circle_present_on_canvas"](ctx, {"filepath": ""}) is False


def test_image_dimension_matches_input(run, svm, ctx):
    path = "C:\\Users\\Docker\\Downloads\\CanvasSize.png"
    spec = exact({"type": "image_dimension_matches_input", "filepath": path, "width": "800", "height": "600"}, True)
    svm.files[path] = _png(Image.new("RGB", (800, 600), "white"))
    assert run(spec).score == 1.0
    assert (ctx.cache_dir.parent / "cache0" / "CanvasSize.png").exists()  # named after the path's last part
    svm.files[path] = _png(Image.new("RGB", (600, 800), "white"))
    assert run(spec).score == 0.0
    del svm.files[path]
    outcome = run(spec)
    assert outcome.score == 0.0 and "raised" in outcome.reason
    assert GETTERS["image_dimension_matches_input"](ctx, {"filepath": path, "width": "", "height": "600"}) is False


# -- Settings ----------------------------------------------------------------------------------------------

NIGHT_LIGHT_COMMAND = registry_query_command(getters_system.NIGHT_LIGHT_KEY, "Data")


def _night_light_bytes(on: bool, start: tuple[int, int] | None, end: tuple[int, int] = (7, 0)) -> str:
    """The 'Data' value as PowerShell prints it, one byte per line, laid out as WAA decodes it."""
    data = ["67"] * 48
    data[24] = "1" if on else "0"
    if start is None:
        data[28] = "202"
    else:
        data[28] = str(start[0])
        data[29], data[30] = ("46", str(start[1])) if start[1] else ("0", "0")
        at = 33 if start[1] == 0 else 35
        data[at] = str(end[0])
        data[at + 1], data[at + 2] = ("46", str(end[1])) if end[1] else ("0", "0")
    return "\n".join(data) + "\n"


def test_night_light_state(run, svm, ctx):
    spec = exact({"type": "night_light_state"}, [True, "07:00 PM", "07:00 AM"])
    svm.commands[NIGHT_LIGHT_COMMAND] = ok(_night_light_bytes(True, (19, 0)))
    assert GETTERS["night_light_state"](ctx, {}) == [True, "07:00 PM", "07:00 AM"]
    assert run(spec).score == 1.0
    svm.commands[NIGHT_LIGHT_COMMAND] = ok(_night_light_bytes(True, (21, 30), (6, 15)))
    assert GETTERS["night_light_state"](ctx, {}) == [True, "09:30 PM", "06:15 AM"]
    assert run(spec).score == 0.0
    svm.commands[NIGHT_LIGHT_COMMAND] = ok(_night_light_bytes(True, None))
    assert GETTERS["night_light_state"](ctx, {}) == [True]
    svm.commands[NIGHT_LIGHT_COMMAND] = ok(_night_light_bytes(False, (19, 0)))
    assert GETTERS["night_light_state"](ctx, {}) is False
    assert run(spec).score == 0.0
    svm.commands[NIGHT_LIGHT_COMMAND] = ok("1\n2\n")  # too short: WAA's IndexError scores 0
    outcome = run(spec)
    assert outcome.score == 0.0 and "IndexError" in outcome.reason
    assert getters_system.clock_time(12, 5) == "00:05 PM" and getters_system.clock_time(0, 0) == "00:00 AM"


TIMEZONE_COMMAND = 'powershell -Command "Get-TimeZone | Select-Object -Property DisplayName, StandardName | ConvertTo-Json"'


def test_system_timezone(run, svm, ctx):
    spec = exact({"type": "system_timezone"}, "(UTC-08:00) Pacific Time (US & Canada)")
    answer = {"DisplayName": "(UTC-08:00) Pacific Time (US & Canada)", "StandardName": "Pacific Standard Time"}
    svm.commands[TIMEZONE_COMMAND] = ok(json.dumps(answer, indent=4) + "\r\n")
    assert run(spec).score == 1.0
    svm.commands[TIMEZONE_COMMAND] = ok(json.dumps({**answer, "DisplayName": "(UTC+01:00) Amsterdam"}))
    assert run(spec).score == 0.0
    svm.commands[TIMEZONE_COMMAND] = ok(json.dumps({**answer, "StandardName": ""}))
    assert GETTERS["system_timezone"](ctx, {}) == "Unable to get time zone"
    svm.commands[TIMEZONE_COMMAND] = ok("not json")
    assert GETTERS["system_timezone"](ctx, {}) == "Error getting the timezone"
    svm.base.down = True
    assert run(spec).kind == "infrastructure_error"


def test_desktop_background(run, svm):
    command = registry_query_command("HKCU:Control Panel\\Desktop", "WallPaper")
    spec = exact({"type": "desktop_background"}, "True")
    svm.commands[command] = ok("\n")
    assert run(spec).score == 1.0
    svm.commands[command] = ok("C:\\Windows\\Web\\Wallpaper\\img0.jpg\n")
    assert run(spec).score == 0.0
    assert run(exact({"type": "desktop_background"}, True)).score == 0.0  # a string, not a bool


# -- VLC -----------------------------------------------------------------------------------------------------

VLCRC_PATH = "C:\\Users\\Docker\\AppData\\Roaming\\vlc\\vlcrc"
VLCRC_DEFAULTS = (
    "###\n### vlc 3.0.20\n###\n\n[qt] # Qt interface\n"
    "# Minimal view (boolean)\n#qt-minimal-view=0\n\n"
    "#qt-bgcone=1\n\n"
    "# Maximum Volume displayed (integer)\n#qt-max-volume=125\n\n"
    "#qt-video-autoresize=1\n\n"
    "#qt-slider-colours=153;210;153;20;210;20;255;199;15;245;39;29\n\n"
    "#one-instance-when-started-from-file=1\n\n"
    "# Record directory (string)\n#input-record-path=\n\n"
    "# Play/Pause (string)\n#global-key-play-pause=\n#key-play-pause=Space\n"
)


def vlc_spec(func: str, rules: dict) -> dict:
    return {"func": func, "expected": {"type": "rule", "rules": rules}, "result": {"type": "vlc_config", "dest": "vlcrc"}}


@pytest.mark.parametrize(
    "func, rules, right, wrong",
    [
        ("check_qt_bgcone", {"expected_qt_bgcone": 0}, "qt-bgcone=0", "qt-bgcone=1"),
        ("check_qt_max_volume", {"expected_qt_max_volume": 200}, "qt-max-volume=200", "qt-max-volume=100"),
        ("check_qt_max_volume", {"expected_qt_max_volume": 100}, "qt-max-volume=100", "qt-max-volume=125"),
        ("check_qt_minimal_view", {"expected_qt_minimal_view": 1}, "qt-minimal-view=1", "qt-minimal-view=0"),
        ("check_qt_video_resize", {"qt-video-autoresize": 0}, "qt-video-autoresize=0", "qt-video-autoresize=1"),
        ("check_one_instance_when_started_from_file", {"expected_one_instance_when_started_from_file": 0},
         "one-instance-when-started-from-file=0", "one-instance-when-started-from-file=1"),
        ("check_global_key_play_pause", {"expected_global_key_play_pause": 1}, "global-key-play-pause=Space", "global-key-play-pause="),
        ("check_qt_slider_colours", {"type": "blackish"}, "qt-slider-colours=0;0;0;20;20;20;99;99;99;10;10;10",
         "qt-slider-colours=0;0;0;20;20;20;100;99;99;10;10;10"),
        ("is_vlc_recordings_folder", {"recording_file_path": "C:\\Users\\Docker\\Desktop"},
         "input-record-path=C:\\Users\\Docker\\Desktop", "input-record-path=C:\\Users\\Docker\\Downloads"),
        ("is_vlc_recordings_folder", {"recording_file_path": "C:\\Users\\Docker\\Downloads"},
         "input-record-path=C:\\Users\\Docker\\Downloads", "input-record-path=C:\\Users\\Docker\\Desktop"),
    ],
)
def test_vlc_settings_right_and_wrong(run, svm, func, rules, right, wrong):
    spec = vlc_spec(func, rules)
    svm.files[VLCRC_PATH] = (VLCRC_DEFAULTS + right + "\r\n").replace("\n", "\r\n").encode("utf-8")
    assert run(spec).score == 1.0
    svm.files[VLCRC_PATH] = (VLCRC_DEFAULTS + wrong + "\n").encode("utf-8")
    assert run(spec).score == 0.0


def test_vlc_metrics_return_waa_ints_and_read_commented_defaults(tmp_path):
    path = tmp_path / "vlcrc"
    path.write_text(VLCRC_DEFAULTS, encoding="utf-8")
    p = str(path)
    # every line containing the key counts, commented defaults included (WAA quirk)
    assert METRICS["check_qt_video_resize"](p, {"qt-video-autoresize": 1}) == 1
    assert METRICS["check_qt_bgcone"](p, {"expected_qt_bgcone": 1}) == 1
    assert METRICS["check_qt_max_volume"](p, {"expected_qt_max_volume": "125"}) == 1
    assert METRICS["check_global_key_play_pause"](p, {"expected_global_key_play_pause": 0}) == 1
    assert METRICS["check_qt_slider_colours"](p, {"type": "blackish"}) == 0
    assert METRICS["check_qt_slider_colours"](p, {"type": "match", "expected_qt_slider_colours": "153;210;153;20;210;20;255;199;15;245;39;29"}) == 1
    assert METRICS["is_vlc_recordings_folder"](p, {"recording_file_path": ""}) == 0  # comments are skipped here
    result = METRICS["check_qt_minimal_view"](p, {"expected_qt_minimal_view": 0})
    assert result == 1 and type(result) is int
    path.write_text("[qt]\n", encoding="utf-8")  # no keys at all: VLC's defaults
    assert METRICS["check_qt_max_volume"](p, {"expected_qt_max_volume": 125}) == 1
    assert METRICS["check_one_instance_when_started_from_file"](p, {"expected_one_instance_when_started_from_file": 1}) == 1
    assert METRICS["check_qt_slider_colours"](p, {"type": "match"}) == 0  # KeyError inside: 0
    assert METRICS["check_qt_slider_colours"](p, {"type": "rainbow"}) is None  # falls off the end in WAA
    with pytest.raises(KeyError):
        METRICS["check_qt_bgcone"](p, {})  # read outside WAA's try


def test_vlc_odd_cases_through_the_engine(run, svm):
    spec = vlc_spec("check_qt_slider_colours", {"type": "rainbow"})
    svm.files[VLCRC_PATH] = VLCRC_DEFAULTS.encode("utf-8")
    assert run(spec).kind == "evaluation_error"  # None is no score
    del svm.files[VLCRC_PATH]
    outcome = run(vlc_spec("check_qt_bgcone", {"expected_qt_bgcone": 0}))
    assert (outcome.kind, outcome.score) == ("scored", 0.0) and "TypeError" in outcome.reason
    svm.files[VLCRC_PATH] = b"qt-bgcone=0\n\xff\xfe"
    assert run(vlc_spec("check_qt_bgcone", {"expected_qt_bgcone": 0})).kind == "evaluation_error"  # strict UTF-8


def test_vm_wallpaper(run, svm, ctx, monkeypatch):
    svm.wallpaper_bytes = _png(Image.new("RGB", (8, 8), "red"))
    local = GETTERS["vm_wallpaper"](ctx, {"dest": "result_wallpaper.png"})
    assert Path(local).read_bytes() == svm.wallpaper_bytes and Path(local).name == "result_wallpaper.png"
    svm.wallpaper_bytes = None
    with pytest.raises(TypeError):
        GETTERS["vm_wallpaper"](ctx, {"dest": "result_wallpaper.png"})

    class Minimal:  # a VMConnection without /wallpaper
        pass

    outcome = run({"func": "compare_images", "result": {"type": "vm_wallpaper", "dest": "w.png"},
                   "expected": {"type": "rule", "rules": {}}}, vm=Minimal())
    assert outcome.kind == "evaluation_error" and "wallpaper()" in outcome.reason


def test_vm_wallpaper_with_compare_images(run, svm, tmp_path):
    pytest.importorskip("numpy")
    pytest.importorskip("scipy")
    from adapters.waa.evaluator import metrics_media  # noqa: F401

    image = Image.new("RGB", (40, 30), "white")
    ImageDraw.Draw(image).rectangle((5, 5, 25, 20), fill=(10, 20, 200))
    gold = _png(image)
    url = "https://example.invalid/interstellar.png"
    target = cloud_cache_path(tmp_path / "dl", url, "interstellar_wallpaper_gold.png")
    target.parent.mkdir(parents=True)
    target.write_bytes(gold)
    spec = {
        "func": "compare_images",
        "expected": {"type": "cloud_file", "path": url, "dest": "interstellar_wallpaper_gold.png"},
        "result": {"type": "vm_wallpaper", "dest": "result_wallpaper.png"},
    }
    svm.wallpaper_bytes = gold
    assert run(spec, offline=True, download_dir=tmp_path / "dl").score == 1.0
    svm.wallpaper_bytes = _png(Image.new("RGB", (40, 30), "white"))
    assert run(spec, offline=True, download_dir=tmp_path / "dl").score < 1.0
    svm.wallpaper_bytes = None
    outcome = run(spec, offline=True, download_dir=tmp_path / "dl")
    assert (outcome.kind, outcome.score) == ("scored", 0.0)


# -- VS Code -----------------------------------------------------------------------------------------------

KEYBINDINGS = "C:\\Users\\Docker\\AppData\\Roaming\\Code\\User\\keybindings.json"


def keybinding_spec(expected: dict) -> dict:
    return {
        "func": "check_json_keybindings",
        "expected": {"type": "rule", "rules": {"expected": expected}},
        "result": {"type": "vm_file", "path": KEYBINDINGS, "dest": "keybindings.json"},
    }


def test_check_json_keybindings(run, svm):
    wanted = {"key": "ctrl+j", "command": "workbench.action.focusActiveEditorGroup", "when": "terminalFocus"}
    spec = keybinding_spec(wanted)
    other = {"key": "ctrl+f", "command": "-list.find", "when": "listFocus && listSupportsFind"}
    header = "// Place your key bindings in this file to override the defaults\n"
    svm.files[KEYBINDINGS] = (header + json.dumps([other, dict(reversed(list(wanted.items())))], indent=4)).encode()
    assert run(spec).score == 1.0  # the first-line comment is skipped; key order is irrelevant
    svm.files[KEYBINDINGS] = json.dumps([other]).encode()
    assert run(spec).score == 0.0
    assert run(keybinding_spec(other)).score == 1.0
    svm.files[KEYBINDINGS] = json.dumps([{**wanted, "when": "editorFocus"}]).encode()
    assert run(spec).score == 0.0
    svm.files[KEYBINDINGS] = (header + "[\n  // a comment inside\n" + json.dumps(wanted) + "\n]").encode()
    assert run(spec).score == 0.0  # WAA's json cannot read comments beyond the first line
    svm.files[KEYBINDINGS] = json.dumps({"key": "ctrl+j"}).encode()
    assert run(spec).score == 0.0  # not a list
    del svm.files[KEYBINDINGS]
    outcome = run(spec)
    assert (outcome.kind, outcome.score) == ("scored", 0.0)  # vm_file None: 0.0
