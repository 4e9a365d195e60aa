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
