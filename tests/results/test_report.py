"""The terminal and HTML run reports, on real runs of the bundled suite and hand-built edge cases."""

from __future__ import annotations

import base64
import html
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest
from PIL import Image

from adapters.benchmark import ActionType, BenchmarkAction
from adapters.results.metrics import compute_run_metrics, references_for_run
from adapters.results.report_html import (
    MAX_SCREENSHOT_WIDTH,
    EmbeddedImage,
    ReportError,
    action_overlay,
    action_point,
    embed_screenshot,
    write_html_report,
)
from adapters.results.report_text import render_text_report
from adapters.store.duckdb_store import ResultStore, StoreError

from .conftest import HOSTILE_REASONING, BundledRuns, EdgeRuns


class _Page(HTMLParser):
    """Tags (with attributes), and the page's text, as a browser's parser sees them."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[tuple[str, dict[str, str | None]]] = []
        self.ends: list[str] = []
        self.text: list[str] = []
        self.feed(source)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        self.ends.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def tags(self, tag: str, cls: str | None = None) -> list[dict[str, str | None]]:
        return [a for t, a in self.starts if t == tag and (cls is None or cls in (a.get("class") or "").split())]

    @property
    def all_text(self) -> str:
        return " ".join(self.text)


# --- terminal report -----------------------------------------------------------------------------


def test_text_report_of_the_scripted_run(bundled_run_db: BundledRuns, bundled_run_store: ResultStore) -> None:
    run_id = bundled_run_db.scripted
    report = render_text_report(bundled_run_store, run_id, references_for_run(bundled_run_store, run_id))
    run = bundled_run_store.get_run(run_id)
    assert run is not None and run.suite_hash
    assert report.startswith(f"WAA run report {run_id}  [LOCAL SIMULATION, not a Windows VM]")
    for needle in (
        "agent: scripted", f"suite hash: {run.suite_hash[:12]}", f"code revision: {run.code_revision or '-'}",
        f"Prefect flow run: {run.prefect_flow_run_id}", "status: completed", "reset level: snapshot",
        "success rate (sound environment): 16/16 100.0% [80.6%, 100.0%]",
        "feasible tasks: 14/14 100.0% [78.5%, 100.0%]   infeasible tasks: 2/2 100.0% [34.2%, 100.0%]",
        "outcomes: success=16", "attempts: 16 for 16 tasks (0 retries; 0 tasks retried)",
        "reference trajectories: 16 of 16 tasks; step accuracy 100.0%", "not solved: 0 of 16 tasks",
    ):
        assert needle in report, needle
    table = {line.split()[0]: line.split() for line in report.splitlines() if line.split()[:1] in (
        ["file_explorer"], ["notepad"], ["settings"], ["ALL"])}
    assert table["ALL"][1:4] == ["16", "16", "100.0%"]
    assert int(table["notepad"][1]) + int(table["settings"][1]) + int(table["file_explorer"][1]) == 16


def test_text_report_lists_unsolved_tasks(bundled_run_db: BundledRuns, bundled_run_store: ResultStore) -> None:
    report = render_text_report(bundled_run_store, bundled_run_db.random)
    assert "success rate (raw, all tasks with a result): 0/16 0.0% [0.0%, 19.4%]" in report
    assert "not solved: 16 of 16 tasks" in report
    assert "reference trajectories: none given" in report
    assert "notepad-draft-documents" in report and "agent_failure" in report


def test_text_report_edge_cases(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore) -> None:
    report = render_text_report(metrics_edge_store, metrics_edge_runs.mixed)
    assert "\x1b" not in report  # an evaluator's escape sequence cannot reach the terminal
    assert "reset failed ?[31magain?[0m" in report
    assert "success rate (sound environment): 2/3 66.7%" in report
    assert "success rate (raw, all tasks with a result): 2/5 40.0%" in report
    assert "left out: setup failures 1, infrastructure errors 1" in report
    # 6 selected, 4 final: the run's status says so even though it ended "completed".
    assert "INCOMPLETE: 2 of 6 selected tasks have no final result (run status: completed)" in report
    assert "attempts: 7 for 5 tasks (2 retries; 2 tasks retried)" in report
    assert "average score: 0.500" in report
    all_infra = render_text_report(metrics_edge_store, metrics_edge_runs.all_infra)
    assert "success rate (sound environment): 0/0 -" in all_infra
    empty = render_text_report(metrics_edge_store, metrics_edge_runs.empty, references={})
    assert "no task results recorded for this run" in empty
    assert "success rate (raw, all tasks with a result): 0/0 -" in empty
    assert "reference trajectories: none of the 0 tasks has one" in empty
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        render_text_report(metrics_edge_store, "nope")


# --- HTML report ---------------------------------------------------------------------------------


def test_html_report_is_self_contained(bundled_run_db: BundledRuns, bundled_run_store: ResultStore, tmp_path: Path) -> None:
    run_id = bundled_run_db.scripted
    references = references_for_run(bundled_run_store, run_id)
    out = write_html_report(bundled_run_store, run_id, tmp_path / "out" / "report.html", references)
    assert out == (tmp_path / "out" / "report.html").resolve() and out.is_file()
    source = out.read_text(encoding="utf-8")
    page = _Page(source)
    # Nothing is fetched: no scripts, stylesheets or frames, every image a data URI.
    assert not page.tags("script") and not page.tags("link") and not page.tags("iframe")
    assert not re.search(r"(src|href)=\"(https?:|//)", source)
    images = page.tags("img")
    assert images and all((a.get("src") or "").startswith("data:image/") for a in images)
    step_rows = [
        step for task_id in (t.task_id for t in compute_run_metrics(bundled_run_store, run_id).tasks)
        for step in bundled_run_store.steps(run_id, task_id)
    ]
    assert len(images) == sum(1 for s in step_rows if s["screenshot_path"]) == len(step_rows)
    # Screenshots are scaled to at most 640 px and decode as images.
    src = images[0]["src"] or ""
    decoded = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    assert decoded.width <= MAX_SCREENSHOT_WIDTH and decoded.width == int(images[0]["width"] or 0)
    # One chart bar per domain, one task section per task, one click marker per pointer step.
    assert len(page.tags("rect", "bar")) == 3
    assert len(page.tags("details", "task")) == 16
    pointer_steps = [s for s in step_rows if s["action_type"] in ("click", "double_click", "right_click")]
    assert len(page.tags("g", "click-marker")) == len(pointer_steps) > 0
    text = page.all_text
    for needle in ("success rate", "16 of 16", "[80.6%, 100.0%]", "LOCAL SIMULATION, not a Windows VM",
                   "step accuracy 100.0%", "notepad-draft-documents", bundled_run_db.scripted):
        assert needle in text, needle
    assert len(source) < 3_000_000  # about 3 KB a screenshot: the file stays small


def test_html_report_unsolved_first(bundled_run_db: BundledRuns, bundled_run_store: ResultStore, tmp_path: Path) -> None:
    out = write_html_report(bundled_run_store, bundled_run_db.random, tmp_path / "random.html")
    page = _Page(out.read_text(encoding="utf-8"))
    tasks = page.tags("details", "task")
    assert len(tasks) == 16 and all("unsolved" in (t.get("class") or "") for t in tasks)
    assert "not solved (16)" in page.all_text and "solved (0)" in page.all_text
    # The random agent clicks normalised coordinates: markers are still drawn.
    assert page.tags("g", "click-marker")


def test_html_escapes_everything_from_tasks_and_models(
    metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore, tmp_path: Path
) -> None:
    out = write_html_report(metrics_edge_store, metrics_edge_runs.mixed, tmp_path / "edge.html")
    source = out.read_text(encoding="utf-8")
    assert HOSTILE_REASONING not in source and "<script>" not in source and "<b>bold</b>" not in source
    assert html.escape(HOSTILE_REASONING, quote=True) in source
    page = _Page(source)
    assert not page.tags("script")
    # The data's "</details>" closed nothing: open and close tags still pair up.
    assert len(page.tags("details")) == page.ends.count("details")
    assert len(page.tags("details", "task")) == 5
    text = page.all_text
    assert HOSTILE_REASONING in text  # shown to the reader as text, exactly
    assert "half the lines </details> are right" in text and "element <not> found" in text
    assert '{"demo_id": "<demo>"}' in text


def test_html_edge_cases(metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore, tmp_path: Path) -> None:
    out = write_html_report(metrics_edge_store, metrics_edge_runs.mixed, tmp_path / "edge.html")
    page = _Page(out.read_text(encoding="utf-8"))
    text = page.all_text
    # A screenshot file gone from disk is reported, with the path it was expected at.
    assert f"screenshot missing: {metrics_edge_runs.missing_screenshot}" in text
    # The screenshot under the DB's folder (stored relative) and the one outside it both load.
    assert len(page.tags("img")) == 2
    rows = metrics_edge_store.steps(metrics_edge_runs.mixed, "frac-task")
    assert not Path(rows[0]["screenshot_path"]).is_absolute()
    assert Path(rows[1]["screenshot_path"]) == metrics_edge_runs.outside_screenshot
    # Markers: a click on a box (with the box drawn) and a double-click at normalised coordinates.
    assert [m.get("data-action") for m in page.tags("g", "click-marker")] == ["click", "double_click"]
    assert len(page.tags("rect", "target-box")) == 1
    # Retries are listed, infrastructure errors and the missing task are in the summary.
    assert "Attempts" in text and "VM unreachable" in text
    assert "INCOMPLETE: 2 of 6 selected tasks have no final result (run status: completed)" in text
    (card,) = page.tags("div", "incomplete")
    assert card.get("id") == "incomplete"
    for run_id in (metrics_edge_runs.all_infra, metrics_edge_runs.empty):
        other = _Page(write_html_report(metrics_edge_store, run_id, tmp_path / f"{run_id}.html").read_text())
        assert "success rate" in other.all_text
    empty = _Page((tmp_path / f"{metrics_edge_runs.empty}.html").read_text())
    assert "no task results recorded" in empty.all_text and not empty.tags("rect", "bar")


def test_html_report_errors_name_their_input(
    metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore, tmp_path: Path
) -> None:
    with pytest.raises(StoreError, match="unknown run 'nope'"):
        write_html_report(metrics_edge_store, "nope", tmp_path / "x.html")
    with pytest.raises(ReportError, match=re.escape(str(tmp_path))):
        write_html_report(metrics_edge_store, metrics_edge_runs.mixed, tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError, match="cannot write the report"):
        write_html_report(metrics_edge_store, metrics_edge_runs.mixed, blocker / "report.html")


def test_the_html_report_replaces_only_a_report(
    metrics_edge_runs: EdgeRuns, metrics_edge_store: ResultStore, tmp_path: Path
) -> None:
    """`--html` given an existing file by mistake (the results database, a system file when run
    as root) replaced it with the report. Only a report of this product is replaced now; anything
    else is refused naming the path, and left as it was."""
    run = metrics_edge_runs.mixed
    database = tmp_path / "arena.duckdb"
    with duckdb.connect(str(database)) as conn:
        conn.execute("CREATE TABLE kept AS SELECT 42 AS answer")
    notes = tmp_path / "notes.html"
    notes.write_text("<!DOCTYPE html>\n<html><head><title>My notes</title></head><body>mine</body></html>\n")
    for other in (database, notes, tmp_path / "empty"):
        other.touch()
        before = other.read_bytes()
        with pytest.raises(ReportError, match=f"{re.escape(str(other))}: exists and is not a run report"):
            write_html_report(metrics_edge_store, run, other)
        assert other.read_bytes() == before
    with duckdb.connect(str(database), read_only=True) as conn:
        assert conn.execute("SELECT answer FROM kept").fetchall() == [(42,)]

    # A report is replaced: written by this code (it carries the marker), or by an older version
    # (the same head without it).
    report = write_html_report(metrics_edge_store, run, tmp_path / "report.html")
    assert '<meta name="generator" content="waa-arena report">' in report.read_text()[:2048]
    older = tmp_path / "older.html"
    older.write_text(report.read_text().replace('<meta name="generator" content="waa-arena report">', "", 1))
    assert write_html_report(metrics_edge_store, run, older).read_text() == report.read_text()
    assert write_html_report(metrics_edge_store, run, report).read_text() == older.read_text()


@pytest.mark.parametrize(("mode", "size", "shown"), [
    ("RGB", (1280, 800), (640, 400)),
    ("RGBA", (1281, 801), (640, 400)),  # a screenshot with an alpha channel: kept opaque
    ("P", (1920, 1080), (640, 360)),  # a palette PNG
    ("L", (500, 300), (500, 300)),  # narrower than the page's width: not scaled
])
def test_a_screenshot_is_embedded_scaled_to_the_page_in_any_mode(
        tmp_path: Path, mode: str, size: tuple[int, int], shown: tuple[int, int]) -> None:
    path = tmp_path / f"shot-{mode}.png"
    picture = Image.new("RGB", size, (32, 80, 128))
    picture.paste((240, 240, 240), (size[0] // 4, size[1] // 4, size[0] // 2, size[1] // 2))
    picture.convert(mode).save(path)

    image = embed_screenshot(path)
    assert (image.width, image.height, image.shown_width, image.shown_height) == (*size, *shown)
    mime, _, data = image.data_uri.removeprefix("data:").partition(";base64,")
    with Image.open(io.BytesIO(base64.b64decode(data))) as embedded:
        assert embedded.size == shown and embedded.mode == "RGB" and mime == f"image/{embedded.format.lower()}"
        # The picture survives the scaling: the light box is where it was, the rest is the background.
        inside = embedded.getpixel((shown[0] * 3 // 8, shown[1] * 3 // 8))
        outside = embedded.getpixel((shown[0] * 7 // 8, shown[1] * 7 // 8))
    assert min(inside) > 200 and max(outside) < 150, (inside, outside)


def test_marker_positions() -> None:
    image = EmbeddedImage("data:,", width=1281, height=801, shown_width=640, shown_height=400)
    normalized = BenchmarkAction(type=ActionType.CLICK, x=0.5, y=0.25, normalized=True)
    assert action_point({}, normalized, image.width, image.height) == (640.0, 200.0)
    boxed = BenchmarkAction(type=ActionType.RIGHT_CLICK, target_node_id="3", target_bbox=(10, 20, 30, 40))
    assert action_point({}, boxed, image.width, image.height) == (20.0, 30.0)
    assert action_point({"click_x": 5.0, "click_y": 6.0}, boxed, image.width, image.height) == (5.0, 6.0)
    assert action_point({}, BenchmarkAction(type=ActionType.CLICK, target_node_id="3"), 100, 100) is None
    overlay = action_overlay({}, boxed, image)
    assert 'viewBox="0 0 1281 801"' in overlay and 'data-action="right_click"' in overlay
    drag = BenchmarkAction(type=ActionType.DRAG, x=1, y=2, end_x=300, end_y=400)
    assert '<line x1="1.0" y1="2.0" x2="300.0" y2="400.0"/>' in action_overlay({}, drag, image)
    assert action_overlay({}, BenchmarkAction(type=ActionType.TYPE, text="<x>"), image) == ""
