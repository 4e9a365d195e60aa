"""The HTML report opened from disk in headless Chromium: it renders, with no server and no network."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from adapters.results.metrics import references_for_run
from adapters.results.report_html import write_html_report
from adapters.store.duckdb_store import ResultStore

from .conftest import BundledRuns

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture()
def chromium_page():  # type: ignore[no-untyped-def] - playwright's types exist only when it is installed
    """A page of headless Debian Chromium, or a clean skip when Chromium or playwright is missing."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found (Debian package 'chromium')")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (test extra)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def test_report_renders_in_chromium(
    chromium_page, bundled_run_db: BundledRuns, bundled_run_store: ResultStore, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    page = chromium_page
    run_id = bundled_run_db.random
    out = write_html_report(bundled_run_store, run_id, tmp_path / "report.html", references_for_run(bundled_run_store, run_id))
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(out.as_uri())

    # The summary is visible, with the run id and the headline rate.
    summary = page.locator("#summary")
    assert summary.is_visible()
    assert "0 of 16" in summary.inner_text() and run_id in page.locator("h1").inner_text()
    # One bar per domain in the chart, each with its interval whisker.
    assert page.locator("svg.domain-chart rect.bar").count() == 3
    assert page.locator("svg.domain-chart g.whisker").count() == 3

    # Open the first task that has a pointer step; its screenshots decode and a marker is drawn on one.
    task = page.locator("details.task", has=page.locator("g.click-marker")).first
    task.locator(":scope > summary").click()
    page.wait_for_function(
        "el => [...el.querySelectorAll('img')].every(i => i.complete && i.naturalWidth > 0)",
        arg=task.element_handle(),
    )
    widths = task.locator("img").evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
    assert widths and all(0 < w <= 640 for w in widths)
    marker = task.locator("g.click-marker").first
    assert marker.is_visible()
    shot = task.locator(".shot", has=page.locator("g.click-marker")).first.locator("img").bounding_box()
    box = marker.bounding_box()
    assert shot is not None and box is not None and box["width"] > 0
    centre = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert shot["x"] <= centre[0] <= shot["x"] + shot["width"]
    assert shot["y"] <= centre[1] <= shot["y"] + shot["height"]

    # The CSS-only filter hides solved tasks / unsolved ones without any script.
    visible = "els => els.filter(e => e.offsetParent !== null).length"
    assert page.locator("details.task").evaluate_all(visible) == 16
    page.locator("label[for=filter-solved]").click()
    assert page.locator("details.task").evaluate_all(visible) == 0
    page.locator("label[for=filter-unsolved]").click()
    assert page.locator("details.task").evaluate_all(visible) == 16

    # Nothing was fetched but the file itself (images are data URIs).
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []

    path = tmp_path / "report-full-page.png"
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    with Image.open(io.BytesIO(data)) as image:
        assert image.width >= 1000 and image.height > 2000
        # Not a blank page: many distinct colours (text, chart, screenshots).
        assert len(image.convert("RGB").resize((300, 600)).getcolors(maxcolors=1 << 16) or []) > 100


def test_click_marker_stays_on_its_element_beside_long_text(chromium_page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A step whose text column is far taller than its screenshot (long model reasoning, the
    action JSON opened): the overlay keeps the screenshot's size and the marker stays on the
    clicked point."""
    from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
    from adapters.store.duckdb_store import RunInfo

    from .conftest import _screenshot

    shot = _screenshot(tmp_path / "artifacts" / "long" / "step_000.png")  # the button's centre is (650, 400)
    reasoning = "I should save the file first. " * 400
    step = StepRecord(index=0, action=BenchmarkAction(type=ActionType.CLICK, x=650, y=400, reasoning=reasoning),
                      screenshot_path=shot)
    with ResultStore(tmp_path / "arena.duckdb") as store:
        store.start_run(RunInfo(run_id="long", agent="claude", suite="x", task_count=1))
        store.record_result("long", BenchmarkResult(task_id="t1", domain="notepad", outcome=OutcomeKind.AGENT_FAILURE,
                                                    steps=[step], num_steps=1))
        out = write_html_report(store, "long", tmp_path / "report.html", [])
    page = chromium_page
    page.goto(out.as_uri())
    task = page.locator("details.task").first
    task.locator(":scope > summary").click()
    task.locator("li.step details > summary").first.click()  # open the action JSON too
    page.wait_for_function("() => [...document.images].every(i => i.complete && i.naturalWidth > 0)")
    img = task.locator(".shot img").first.bounding_box()
    overlay = task.locator("svg.action-overlay").first.bounding_box()
    text = task.locator(".step-text").first.bounding_box()
    marker = task.locator("g.click-marker").first.bounding_box()
    assert img and overlay and text and marker
    assert text["height"] > 2 * img["height"]  # the case this test is about
    assert abs(overlay["height"] - img["height"]) < 2 and abs(overlay["width"] - img["width"]) < 2
    centre = (marker["x"] + marker["width"] / 2, marker["y"] + marker["height"] / 2)
    expected = (img["x"] + img["width"] * 650 / 1280, img["y"] + img["height"] * 400 / 800)
    assert abs(centre[0] - expected[0]) < 4 and abs(centre[1] - expected[1]) < 4, (centre, expected)
    page.screenshot(path=str(tmp_path / "long-step.png"), full_page=False)
