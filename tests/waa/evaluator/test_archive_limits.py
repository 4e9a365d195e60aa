"""Decompression bombs and oversized files end an evaluation as an evaluation_error naming the limit.

Every bomb here is a real file made in the test (megabytes of zeros packed to kilobytes, a docx or
xlsx with one bombed member, a zip of too many members), read from its directory by
adapters/waa/evaluator/archive_limits.py, through the engine (in-memory VM) and through the WAA
client against the local simulation and a loopback server.
"""

from __future__ import annotations

import http.server
import io
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAAnswerTooLarge
from adapters.waa.evaluator import evaluate_task
from adapters.waa.evaluator.archive_limits import (
    MAX_FILE_BYTES,
    MAX_MEMBER_BYTES,
    MAX_MEMBERS,
    MAX_UNPACKED_BYTES,
    MiB,
    LimitExceeded,
    check_file,
)
from adapters.waa.localenv.launcher import LocalEnvHandle

DESKTOP = "C:\\Users\\Docker\\Desktop\\"
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


# -- bombs, made for real -----------------------------------------------------------------------------


def zip_of_zeros(mib: int, name: str = "a.bin") -> bytes:
    """A zip whose one member is `mib` MiB of zeros (deflate packs it about 1000:1)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        with archive.open(name, "w", force_zip64=True) as member:
            for _ in range(mib):
                member.write(bytes(MiB))
    return out.getvalue()


def zip_of_many(count: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for index in range(count):
            archive.writestr(f"f{index}", b"")
    return out.getvalue()


def seven_zip(files: dict[str, bytes]) -> bytes:
    py7zr = pytest.importorskip("py7zr")
    out = io.BytesIO()
    with py7zr.SevenZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writef(io.BytesIO(data), name)
    return out.getvalue()


def real_docx(text: str = "hello") -> bytes:
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def real_xlsx() -> bytes:
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    book.active.append(["city", "rank"])
    book.active.append(["Paris", 1])
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def with_bombed_member(package: bytes, member: str, mib: int) -> bytes:
    """`package` (a docx or xlsx) with `member` replaced by valid XML padded with `mib` MiB of
    spaces: a document every reader would open and parse."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(package)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        original = source.read(member)
        for info in source.infolist():
            if info.filename != member:
                target.writestr(info, source.read(info.filename))
        head, _, tail = original.partition(b"?>")
        with target.open(member, "w", force_zip64=True) as bombed:
            bombed.write(head + b"?>")
            for _ in range(mib):
                bombed.write(b" " * MiB)
            bombed.write(tail)
    return out.getvalue()


BOMBS: dict[str, tuple[Any, str]] = {
    "zip-ratio": (lambda: zip_of_zeros(4), "MAX_RATIO"),
    "zip-unpacked": (lambda: zip_of_zeros(MAX_UNPACKED_BYTES // MiB + 1), "MAX_UNPACKED_BYTES"),
    "zip-member": (lambda: zip_of_zeros(MAX_MEMBER_BYTES // MiB + 1), "MAX_MEMBER_BYTES"),
    "zip-members": (lambda: zip_of_many(MAX_MEMBERS + 1), "MAX_MEMBERS"),
    "7z-ratio": (lambda: seven_zip({"OldProjects/example.txt": bytes(4 * MiB)}), "MAX_RATIO"),
    "docx-member": (lambda: with_bombed_member(real_docx(), "word/document.xml", 4), "MAX_RATIO"),
    "xlsx-member": (lambda: with_bombed_member(real_xlsx(), "xl/worksheets/sheet1.xml", 4), "MAX_RATIO"),
}


# -- the check itself -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(BOMBS))
def test_each_bomb_is_refused_by_its_directory_naming_the_limit(tmp_path: Path, kind: str) -> None:
    make, limit = BOMBS[kind]
    bomb = tmp_path / f"bomb-{kind}"
    bomb.write_bytes(make())
    with pytest.raises(LimitExceeded, match=limit) as refused:
        check_file(bomb)
    assert f"bomb-{kind}" in str(refused.value) and str(tmp_path) not in str(refused.value)


def test_a_file_over_the_size_limit_is_refused_whatever_it_holds(tmp_path: Path) -> None:
    big = tmp_path / "recording.mp4"
    with open(big, "wb") as out:
        out.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk spent
    with pytest.raises(LimitExceeded, match="MAX_FILE_BYTES") as refused:
        check_file(big, "C:\\Users\\Docker\\Videos\\recording.mp4")
    assert "C:\\Users\\Docker\\Videos\\recording.mp4" in str(refused.value)


@pytest.mark.parametrize("content", [
    lambda: real_docx("a real document " * 1000),
    real_xlsx,
    lambda: _zip({}),
    lambda: seven_zip({"OldProjects/example.txt": b"hello"}),
    # A small member may pack far better than 100:1 without being a bomb (under the 1 MiB floor).
    lambda: _zip({"spaces.txt": b" " * (MiB // 2)}),
    # Pictures and media pack about 1:1: a large member is fine.
    lambda: _zip({"photo.raw": os.urandom(3 * MiB)}),
], ids=["docx", "xlsx", "empty-zip", "7z", "small-member", "incompressible"])
def test_real_files_pass(tmp_path: Path, content: Any) -> None:
    path = tmp_path / "file"
    path.write_bytes(content())
    check_file(path)


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


# -- through the engine (in-memory VM) ----------------------------------------------------------------


@pytest.mark.parametrize("metric, kind, dest", [
    ("compare_zip_files", "zip-ratio", "project.zip"),
    ("compare_docx_files", "docx-member", "report.docx"),
    ("compare_table", "xlsx-member", "cities.xlsx"),
])
def test_a_metric_never_opens_a_bomb(evaluate: Any, vm: Any, metric: str, kind: str, dest: str) -> None:
    make, limit = BOMBS[kind]
    vm.files[DESKTOP + dest] = make()
    vm.files[DESKTOP + "gold-" + dest] = make()
    outcome = evaluate({"func": metric,
                        "result": {"type": "vm_file", "path": DESKTOP + dest, "dest": dest},
                        "expected": {"type": "vm_file", "path": DESKTOP + "gold-" + dest, "dest": "gold-" + dest}})
    assert outcome.kind == "evaluation_error", outcome.reason
    assert f"metric {metric}: its result file {dest}" in outcome.reason and limit in outcome.reason


def test_a_getter_that_parses_an_xlsx_never_opens_a_bomb(evaluate: Any, vm: Any) -> None:
    vm.files[DESKTOP + "cities.xlsx"] = BOMBS["xlsx-member"][0]()
    outcome = evaluate({"func": "exact_match",
                        "result": {"type": "content_from_vm_file", "path": DESKTOP + "cities.xlsx",
                                   "file_type": "xlsx", "file_content": "last_row"},
                        "expected": {"type": "rule", "rules": {"expected": ["Paris", "1"]}}})
    assert outcome.kind == "evaluation_error", outcome.reason
    assert DESKTOP + "cities.xlsx" in outcome.reason and "MAX_RATIO" in outcome.reason


def test_an_in_memory_vms_oversized_file_is_refused_too(evaluate: Any, vm: Any) -> None:
    """A VM connection that cannot stop reading at the limit has its answer checked."""
    vm.files[DESKTOP + "huge.txt"] = bytes(MAX_FILE_BYTES + 1)
    outcome = evaluate({"func": "exact_match",
                        "result": {"type": "is_file_saved_desktop", "filename": "huge.txt", "textcontent": "x"},
                        "expected": {"type": "rule", "rules": {"expected": "true"}}})
    assert outcome.kind == "evaluation_error" and "MAX_FILE_BYTES" in outcome.reason, outcome.reason


# -- through the WAA client, against the local simulation -------------------------------------------------


SEVEN_ZIP_SPEC = {"func": "exact_match",
                  "result": {"type": "zipped_folder_in_desktop", "filename": DESKTOP + "OldProjects.7z", "password": "x"},
                  "expected": {"type": "rule", "rules": {"expected": "true"}}}


def test_the_7zip_getter_unpacks_nothing_of_a_bomb(sim: LocalEnvHandle, tmp_path: Path) -> None:
    client = WAAClient(sim.base_url)
    client.setup_upload(DESKTOP + "OldProjects.7z", seven_zip({"OldProjects/example.txt": b"kept"}))
    good = evaluate_task(SEVEN_ZIP_SPEC, client, last_action="DONE", cache_dir=tmp_path / "good")
    assert (good.kind, good.score) == ("scored", 1.0), good.reason
    client.setup_upload(DESKTOP + "OldProjects.7z", BOMBS["7z-ratio"][0]())
    bomb = evaluate_task(SEVEN_ZIP_SPEC, client, last_action="DONE", cache_dir=tmp_path / "bomb")
    assert bomb.kind == "evaluation_error", bomb.reason
    assert DESKTOP + "OldProjects.7z" in bomb.reason and "MAX_RATIO" in bomb.reason


def test_a_vm_file_over_the_limit_is_not_read(sim: LocalEnvHandle, tmp_path: Path) -> None:
    client = WAAClient(sim.base_url)
    client.setup_upload(DESKTOP + "huge.log", bytes(MAX_FILE_BYTES + 1))
    outcome = evaluate_task({"func": "compare_text_file",
                             "result": {"type": "vm_file", "path": DESKTOP + "huge.log", "dest": "huge.log"},
                             "expected": {"type": "vm_file", "path": DESKTOP + "huge.log", "dest": "gold.log"}},
                            client, last_action="DONE", cache_dir=tmp_path / "cache")
    assert outcome.kind == "evaluation_error", outcome.reason
    assert DESKTOP + "huge.log" in outcome.reason and "MAX_FILE_BYTES" in outcome.reason
    assert not (tmp_path / "cache" / "huge.log").exists()


@pytest.fixture
def endless_file_server() -> Iterator[tuple[str, list[int]]]:
    """A server that answers every request with zeros for ever, chunked and without a
    Content-Length (no WAA server does; an agent that replaced the VM's server could, and so
    could a web server a task downloads from); records the bytes it sent."""
    sent: list[int] = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"%x\r\n%s\r\n" % (MiB, bytes(MiB))
            try:
                while sent[0] < 50 * MAX_FILE_BYTES:
                    self.wfile.write(chunk)
                    sent[0] += MiB
            except OSError:
                pass  # the client stopped reading: what the test wants

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", sent
    server.shutdown()
    server.server_close()


def test_a_download_stops_at_the_limit(endless_file_server: tuple[str, list[int]], evaluate: Any, tmp_path: Path) -> None:
    """cloud_file (a task's gold file from the web) stops writing at MAX_FILE_BYTES."""
    from adapters.waa.host_fetch import FetchPolicy

    url, _ = endless_file_server
    outcome = evaluate({"func": "compare_text_file", "result": {"type": "cloud_file", "path": url + "/gold.txt", "dest": "gold.txt"},
                        "expected": {"type": "cloud_file", "path": url + "/gold.txt", "dest": "gold.txt"}},
                       fetch_policy=FetchPolicy.parse("127.0.0.1"), download_dir=tmp_path / "downloads")
    assert outcome.kind == "evaluation_error" and "MAX_FILE_BYTES" in outcome.reason, outcome.reason
    assert url + "/gold.txt" in outcome.reason
    assert [f for f in (tmp_path / "downloads").rglob("*") if f.is_file()] == []  # the partial file is gone


def test_the_client_stops_reading_a_file_at_the_limit(endless_file_server: tuple[str, list[int]]) -> None:
    url, sent = endless_file_server
    with pytest.raises(WAAAnswerTooLarge, match="over the caller's limit of 4,194,304 bytes"):
        WAAClient(url).get_file("C:\\huge.bin", max_bytes=4 * MiB)
    assert sent[0] < 50 * MAX_FILE_BYTES  # it stopped long before the server ran out
