"""The run report as ONE self-contained HTML file: open it from disk, no server, no network.

What is in it: the run's provenance, headline rates with Wilson 95% intervals, outcome counts,
feasible vs infeasible, effort and cost, a per-domain chart (inline SVG: success rate per
domain with its interval as whiskers), a table of every task, and per task a collapsible
section with outcome, score, the evaluator's reason or error, timings, attempts, the reference
comparison, and the trajectory: each step's screenshot with the action drawn on it, the action
as text, the agent's reasoning, agent/env seconds and the step's error.

Choices:

* Screenshots are embedded as ``data:`` URIs, scaled down to at most ``MAX_SCREENSHOT_WIDTH``
  (640) pixels wide and encoded as WebP (quality 70): on the simulated desktop that is about 3 KB
  a step, against 11 KB as PNG and 13 KB as JPEG at the same size, and every current browser
  shows it. A Pillow built without WebP falls back to JPEG.
* The action is drawn as an SVG overlay whose ``viewBox`` is the *original* screenshot's pixel
  size, so the marker lands on the stored click point whatever size the image is shown at:
  a ring for a click, a double ring for a double-click, a square for a right-click, an arrow for
  a drag, and the target element's box when the action names one. Normalised coordinates are
  scaled by the original screenshot's size.
* Unsolved tasks come first, and three radio buttons filter the task list with CSS alone.
  There is no JavaScript.
* Everything that comes from tasks, agents, models or evaluators is data: it is HTML-escaped
  (``html.escape`` with quotes) wherever it is written, text or attribute.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError, features

from adapters.benchmark import ActionType, BenchmarkAction
from adapters.results.metrics import (
    DomainMetrics,
    Rate,
    References,
    RunMetrics,
    TaskMetrics,
    click_point,
    compute_run_metrics,
    stored_action,
)
from adapters.results.rates import is_sound
from adapters.results.reference import ReferenceTrajectory
from adapters.results.report_text import (
    PROVENANCE_FIELDS,
    SIMULATION_LABEL,
    ci,
    environment_label,
    fraction,
    incomplete_text,
    left_out,
    left_out_text,
    number,
    outcome_counts,
    pct,
    provenance_value,
    rate_text,
    reference_line,
    score_text,
    seconds,
    unpriced_note,
    usd,
)
from adapters.store.duckdb_store import ResultStore
from adapters.whole_files import replace_text

MAX_SCREENSHOT_WIDTH = 640
"""Screenshots wider than this are scaled down (aspect kept) before embedding."""

_WEBP = features.check("webp")
_IMAGE_FORMAT, _IMAGE_MIME, _IMAGE_OPTIONS = (
    ("WEBP", "image/webp", {"quality": 70, "method": 2}) if _WEBP else ("JPEG", "image/jpeg", {"quality": 75})
)


class ReportError(ValueError):
    """The report cannot be written where asked; the message names the path."""


# Near the top of every report this code writes: what tells a report that may be replaced from
# any other file at the path asked for (reports written before it carried the marker start
# with the same head up to the title, checked too).
REPORT_GENERATOR = '<meta name="generator" content="waa-arena report">'
_OLDER_REPORT_TITLE = "<title>WAA run "
_REPORT_HEAD_BYTES = 2048


def _check_replaceable(path: Path) -> None:
    """ReportError unless `path` is absent or holds a report of this product: writing the report
    loses nothing else (a results database or any other file given as --html by mistake)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_REPORT_HEAD_BYTES).decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there (writing will say why it cannot, if it cannot)
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the file there to see whether it is a report: {exc}") from exc
    if not (head.startswith("<!DOCTYPE html>") and (REPORT_GENERATOR in head or _OLDER_REPORT_TITLE in head)):
        raise ReportError(f"{path}: exists and is not a run report; the report never replaces another file "
                          "(give a new file name, or remove that file first)")


def esc(value: Any) -> str:
    """Any value as HTML text, safe inside elements and quoted attributes."""
    return html.escape("" if value is None else str(value), quote=True)


# --- screenshots -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedImage:
    """A screenshot ready for the page: its data URI and the original's pixel size."""

    data_uri: str
    width: int
    height: int
    shown_width: int
    shown_height: int


def embed_screenshot(path: Path) -> EmbeddedImage:
    """The image at `path` scaled to MAX_SCREENSHOT_WIDTH and encoded as a data URI.

    OSError when the file cannot be read, ValueError when it is not an image.
    """
    try:
        with Image.open(path) as image:
            width, height = image.size
            shown = ((MAX_SCREENSHOT_WIDTH, max(1, round(height * MAX_SCREENSHOT_WIDTH / width)))
                     if width > MAX_SCREENSHOT_WIDTH else (width, height))
            # Scaled straight from the file: converting an RGB PNG to RGB first cost more than
            # decoding it (6 of a screenshot's 16 ms, measured). reducing_gap=1: shrink by the
            # largest integer factor first (box filter, fast), then resample the rest.
            source = image if image.mode == "RGB" else image.convert("RGB")
            picture = source.resize(shown, Image.Resampling.LANCZOS, reducing_gap=1.0)
    except UnidentifiedImageError as exc:
        raise ValueError(f"not an image: {exc}") from exc
    buffer = io.BytesIO()
    picture.save(buffer, _IMAGE_FORMAT, **_IMAGE_OPTIONS)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return EmbeddedImage(f"data:{_IMAGE_MIME};base64,{encoded}", width, height, picture.width, picture.height)


def resolve_screenshot(store: ResultStore, stored: str) -> Path:
    """The absolute path of a stored screenshot path (relative ones are under the DB's folder)."""
    return store.resolve_path(stored)


# --- the action drawn on the screenshot ----------------------------------------------------------


def _scaled(x: float, y: float, normalized: bool, width: int, height: int) -> tuple[float, float]:
    # Normalised coordinates map to pixels the way the WAA translation does: x * (width - 1).
    return (x * (width - 1), y * (height - 1)) if normalized else (x, y)


def action_point(
    row: Mapping[str, Any], action: BenchmarkAction | None, width: int, height: int
) -> tuple[float, float] | None:
    """The screenshot pixel a pointer action (or a drag's start) aimed at, or None when unknown.

    The stored `click_x`/`click_y` when set, else the action's x/y (normalised ones scaled by the
    screenshot size), else the centre of its target box.
    """
    return click_point(row, action, (width, height))


def _marker_shape(kind: ActionType, x: float, y: float, r: float) -> str:
    """The SVG of one pointer marker centred on (x, y)."""
    dot = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r / 5:.1f}" class="dot"/>'
    if kind is ActionType.DOUBLE_CLICK:
        return (
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}"/>'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r * 0.6:.1f}"/>{dot}'
        )
    if kind is ActionType.RIGHT_CLICK:
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}"/>{dot}'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}"/>{dot}'


def action_overlay(row: Mapping[str, Any], action: BenchmarkAction | None, image: EmbeddedImage) -> str:
    """An SVG drawn over the screenshot: the action's target box and its click/drag marker.

    Its viewBox is the original screenshot's pixel size, so stored pixel coordinates need no
    rescaling. Empty when the action has nothing to draw.
    """
    w, h = image.width, image.height
    r = max(w, h) * 0.018
    parts: list[str] = []
    if action is not None and action.target_bbox is not None:
        left, top, right, bottom = action.target_bbox
        parts.append(
            f'<rect class="target-box" x="{left}" y="{top}" width="{right - left}" height="{bottom - top}"/>'
        )
    point = action_point(row, action, w, h)
    if point is not None and action is not None:
        x, y = point
        kind = action.type
        if kind is ActionType.DRAG and action.end_x is not None and action.end_y is not None:
            ex, ey = _scaled(action.end_x, action.end_y, action.normalized, w, h)
            shape = (
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{ex:.1f}" y2="{ey:.1f}"/>'
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r / 2:.1f}"/>'
                f'<circle cx="{ex:.1f}" cy="{ey:.1f}" r="{r:.1f}"/>'
            )
        else:
            shape = _marker_shape(kind, x, y, r)
        parts.append(f'<g class="click-marker" data-action="{esc(kind.value)}">{shape}</g>')
    if not parts:
        return ""
    return (
        f'<svg class="action-overlay" viewBox="0 0 {w} {h}" preserveAspectRatio="none" '
        f'aria-hidden="true">{"".join(parts)}</svg>'
    )


# --- page pieces -------------------------------------------------------------------------------

_CSS = """
:root { --ok: #1a7f37; --bad: #c62828; --warn: #b26a00; --muted: #5f6b7a; --line: #d8dee4; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 0 auto; max-width: 1180px; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; } h3 { font-size: 15px; margin: 16px 0 6px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: 8px; border-radius: 6px;
      margin: 4px 0; }
.banner { background: #fff4e5; border: 1px solid #f0c36d; padding: 6px 10px; border-radius: 6px;
          display: inline-block; font-weight: 600; }
.headline { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 200px; }
.card .big { font-size: 24px; font-weight: 700; } .card .sub { color: var(--muted); font-size: 12.5px; }
.card.status.incomplete { border: 2px solid var(--warn); background: #fff4e5; }
.warn { color: var(--warn); }
video.episode { max-width: 100%; border: 1px solid var(--line); }
.history-chart svg { max-width: 100%; height: auto; } pre.history-table { overflow-x: auto; }
.card.status.incomplete .big { color: var(--warn); } .card.status.complete .big { color: var(--ok); }
table { border-collapse: collapse; margin: 6px 0; } th, td { border-bottom: 1px solid var(--line);
        padding: 3px 8px; text-align: left; vertical-align: top; } th { background: #f6f8fa; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.ci { white-space: nowrap; }
table.prov th { width: 170px; } table.prov td { word-break: break-all; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600;
         color: #fff; background: var(--bad); }
.badge.outcome-success { background: var(--ok); } .badge.outcome-infrastructure_error,
.badge.outcome-setup_failure, .badge.outcome-evaluation_error { background: var(--warn); }
.chart { width: 100%; max-width: 760px; height: auto; display: block; } .chart .bar { fill: #4878a8; } .chart .track { fill: #eef2f6; }
.chart .whisker { stroke: #1f2328; stroke-width: 1.5; } .chart text { font-size: 12px; fill: #1f2328; }
.chart .grid { stroke: #d0d7de; stroke-dasharray: 3 3; }
.filters { margin: 8px 0; } .filters label { margin-right: 14px; cursor: pointer; }
#filter-unsolved:checked ~ .task-list .task.solved { display: none; }
#filter-solved:checked ~ .task-list .task.unsolved { display: none; }
details.task { border: 1px solid var(--line); border-radius: 8px; margin: 8px 0; }
details.task > summary { padding: 8px 12px; cursor: pointer; }
details.task.unsolved > summary { background: #fff5f5; } details.task.solved > summary { background: #f3faf4; }
.task-body { padding: 4px 14px 12px; }
dl.facts { display: grid; grid-template-columns: 170px 1fr; gap: 2px 12px; margin: 6px 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; word-break: break-word; white-space: pre-wrap; }
ol.steps { list-style: none; padding: 0; margin: 0; }
li.step { display: flex; flex-wrap: wrap; gap: 14px; border-top: 1px solid var(--line); padding: 10px 0; }
/* align-self: the step's text may be far taller than its screenshot; stretched, the overlay
   (height 100%) would stretch with it and the marker leave its element. */
.shot { position: relative; display: inline-block; max-width: 100%; flex: 0 1 auto; line-height: 0;
        align-self: flex-start; }
.shot img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
.shot svg.action-overlay { position: absolute; left: 0; top: 0; width: 100%; height: 100%; pointer-events: none; }
.click-marker circle, .click-marker rect, .click-marker line { fill: none; stroke: #e3116c; stroke-width: 3;
        vector-effect: non-scaling-stroke; }
.click-marker .dot { fill: #e3116c; }
.target-box { fill: rgba(255, 196, 0, 0.12); stroke: #d89b00; stroke-width: 2; vector-effect: non-scaling-stroke; }
.step-text { flex: 1 1 300px; min-width: 260px; line-height: 1.45; }
.missing { color: var(--bad); font-style: italic; padding: 8px; border: 1px dashed var(--bad); line-height: 1.4; }
.reasoning { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: 6px 8px;
             border-radius: 6px; margin: 4px 0; }
.step-error { color: var(--bad); white-space: pre-wrap; word-break: break-word; }
.muted { color: var(--muted); }
ol.reference li.matched::marker { color: var(--ok); } ol.reference .yes { color: var(--ok); }
ol.reference .no { color: var(--bad); }
"""


def _rate_card(title: str, rate: Rate, note: str = "") -> str:
    return (
        f'<div class="card"><div class="sub">{esc(title)}</div><div class="big">{esc(pct(rate.rate))}</div>'
        f'<div class="sub">{esc(rate.successes)} of {esc(rate.total)} &middot; 95% CI {esc(ci(rate))}'
        f"{esc(note)}</div></div>"
    )


def _provenance_table(provenance: Mapping[str, Any]) -> str:
    rows = [f"<tr><th>run id</th><td class=\"mono\">{esc(provenance.get('run_id'))}</td></tr>"]
    rows += [
        f'<tr><th>{esc(label)}</th><td class="mono">{esc(provenance_value(dict(provenance), column))}</td></tr>'
        for label, column in PROVENANCE_FIELDS
    ]
    blocks = []
    for column in ("agent_config", "run_config"):
        value = provenance.get(column)
        if value:
            text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
            blocks.append(f"<details><summary>{esc(column)}</summary><pre>{esc(text)}</pre></details>")
    return f'<table class="prov">{"".join(rows)}</table>{"".join(blocks)}'


def domain_chart(per_domain: Sequence[DomainMetrics]) -> str:
    """Inline SVG: one bar per domain (the headline, sound-environment success rate) with Wilson 95%
    whiskers and a 0-100% axis."""
    label_w, plot_w, row_h, top = 170, 440, 30, 24
    height = top + row_h * len(per_domain) + 8
    x0 = label_w
    parts = [
        f'<svg class="chart domain-chart" viewBox="0 0 {label_w + plot_w + 150} {height}" role="img" '
        f'aria-label="success rate (sound environment) per domain with 95% confidence intervals">'
    ]
    for tick in (0, 25, 50, 75, 100):
        x = x0 + plot_w * tick / 100
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 4}"/>')
        parts.append(f'<text x="{x:.1f}" y="{top - 10}" text-anchor="middle">{tick}%</text>')
    for i, d in enumerate(per_domain):
        y = top + i * row_h
        rate = d.success_sound.rate or 0.0
        mid = y + row_h / 2
        parts.append(f'<text x="{x0 - 8}" y="{mid + 4:.1f}" text-anchor="end">{esc(d.domain or "(none)")}</text>')
        parts.append(f'<rect class="track" x="{x0}" y="{y + 6}" width="{plot_w}" height="{row_h - 12}"/>')
        parts.append(
            f'<rect class="bar" x="{x0}" y="{y + 6}" width="{plot_w * rate:.1f}" height="{row_h - 12}">'
            f"<title>{esc(d.domain)}: {esc(rate_text(d.success_sound))}</title></rect>"
        )
        if d.success_sound.ci95 is not None:
            low, high = (x0 + plot_w * v for v in d.success_sound.ci95)
            parts.append(
                f'<g class="whisker"><line x1="{low:.1f}" y1="{mid:.1f}" x2="{high:.1f}" y2="{mid:.1f}"/>'
                f'<line x1="{low:.1f}" y1="{mid - 7:.1f}" x2="{low:.1f}" y2="{mid + 7:.1f}"/>'
                f'<line x1="{high:.1f}" y1="{mid - 7:.1f}" x2="{high:.1f}" y2="{mid + 7:.1f}"/></g>'
            )
        parts.append(
            f'<text x="{x0 + plot_w + 10}" y="{mid + 4:.1f}">{esc(pct(d.success_sound.rate))} '
            f"({esc(d.success_sound.successes)}/{esc(d.success_sound.total)})</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _domain_table(metrics: RunMetrics) -> str:
    with_reference = metrics.references_given
    head = (
        "<tr><th>domain</th><th class=num>tasks</th><th class=num>solved</th><th class=num>sound env.</th>"
        "<th>95% CI</th><th class=num>raw</th><th class=num>left out</th><th class=num>feasible</th>"
        "<th class=num>infeasible</th><th class=num>avg score</th><th class=num>attempts</th>"
        + ("<th class=num>step acc.</th><th class=num>grounding</th>" if with_reference else "")
        + "</tr>"
    )
    rows = []
    for d in [*metrics.per_domain, metrics.overall]:
        cells = [
            f"<td>{'<b>ALL</b>' if d is metrics.overall else esc(d.domain)}</td>",
            f"<td class=num>{d.tasks}</td>", f"<td class=num>{d.success.successes}</td>",
            f"<td class=num>{esc(pct(d.success_sound.rate))}</td>", f"<td class=ci>{esc(ci(d.success_sound))}</td>",
            f"<td class=num>{esc(pct(d.success.rate))}</td>",
            f'<td class=num title="{esc(left_out_text(d.outcomes))}">{left_out(d)}</td>',
            f"<td class=num>{esc(fraction(d.feasible))}</td>",
            f"<td class=num>{esc(fraction(d.infeasible))}</td>",
            f"<td class=num>{esc(score_text(d.avg_score))}</td>",
            f"<td class=num>{d.attempts}</td>",
        ]
        if with_reference and d.reference is not None:
            cells.append(f"<td class=num>{esc(pct(d.reference.step_accuracy))}</td>")
            cells.append(f"<td class=num>{esc(pct(d.reference.grounding_accuracy))}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _effort_table(overall: DomainMetrics) -> str:
    unpriced = overall.spent.unpriced_attempts > 0
    rows = [
        ("steps", number(overall.steps.mean), number(overall.steps.total)),
        ("time", seconds(overall.time_seconds.mean), seconds(overall.time_seconds.total)),
        ("agent (model) time", seconds(overall.agent_seconds.mean), seconds(overall.agent_seconds.total)),
        ("env (VM) time", seconds(overall.env_seconds.mean), seconds(overall.env_seconds.total)),
        ("input tokens", number(overall.input_tokens.mean), number(overall.input_tokens.total)),
        ("output tokens", number(overall.output_tokens.mean), number(overall.output_tokens.total)),
        ("model cost", usd(overall.cost_usd.mean, unpriced=unpriced), usd(overall.cost_usd.total, unpriced=unpriced)),
    ]
    body = "".join(f"<tr><td>{esc(a)}</td><td class=num>{esc(b)}</td><td class=num>{esc(c)}</td></tr>" for a, b, c in rows)
    spent = overall.spent
    return (
        "<table><tr><th>per task (final attempt)</th><th class=num>mean</th><th class=num>total</th></tr>"
        f"{body}</table><p>All attempts, retries included: time {esc(seconds(spent.time_seconds))}, "
        f"VM time {esc(seconds(spent.vm_seconds))}, tokens {spent.input_tokens:,} in / {spent.output_tokens:,} out, "
        f"model cost {esc(usd(spent.cost_usd, unpriced=unpriced))}.</p>"
        + (f"<p class=warn>{esc(unpriced_note(spent.unpriced_attempts))}</p>" if unpriced else "")
    )


def _status_card(metrics: RunMetrics) -> str:
    """The run's status beside the rates: a warning card when tasks have no final result."""
    status = metrics.run_status()
    incomplete = incomplete_text(status)
    if incomplete is None:
        return (
            '<div class="card status complete"><div class="sub">run status</div><div class="big">completed</div>'
            f'<div class="sub">{esc(status.final)} of {esc(status.selected if status.selected is not None else status.final)}'
            " selected tasks have a final result</div></div>"
        )
    detail = (
        f"{status.missing} of {status.selected} selected tasks have no final result"
        if status.missing else "the run did not complete"
    )
    return (
        '<div class="card status incomplete" id="incomplete"><div class="sub">run status: '
        f'{esc(status.status or "unknown")}</div><div class="big">incomplete</div>'
        f'<div class="sub">{esc(detail)}</div></div>'
    )


def _trial_rate_cards(trials: Any, metrics: RunMetrics) -> list[str]:
    """A run with repeated trials (`trials`: its TrialStatistics): the headline as the mean of
    per-task fractions with the interval that groups trials by task, and the raw rate as a count
    of trials without an interval that would treat them as independent."""
    overall, rate = metrics.overall, trials.rate
    return [
        f'<div class="card"><div class="sub">success rate (sound environment, mean over tasks)</div><div class="big">'
        f'{esc(pct(rate.rate))}</div><div class="sub">{esc(rate.tasks)} tasks x K={esc(trials.k)} trials &middot; '
        f"95% CI {esc(_interval_text(rate.tasks_like_these.interval))} (tasks like these, trials grouped by task)"
        f" · left out: {esc(left_out_text(overall.outcomes))}</div></div>",
        f'<div class="card"><div class="sub">success rate (raw, every trial with a result)</div><div class="big">'
        f'{esc(pct(overall.success.rate))}</div><div class="sub">{esc(overall.success.successes)} of '
        f"{esc(overall.success.total)} trials</div></div>",
    ]


def _interval_text(interval: tuple[float, float] | None) -> str:
    """An interval as "[56.6%, 100.0%]"; "-" when there is none."""
    return "-" if interval is None else f"[{pct(interval[0])}, {pct(interval[1])}]"


def _summary_section(metrics: RunMetrics, trials: Any = None) -> str:
    overall = metrics.overall
    status = metrics.run_status()
    incomplete = incomplete_text(status)
    banner = f'<p class="banner incomplete">{esc(incomplete)}</p>' if incomplete else ""
    scoring = f'<p class="scoring">{esc(status.scoring_line())}</p>'
    headline = _trial_rate_cards(trials, metrics) if trials is not None else [
        _rate_card("success rate (sound environment)", overall.success_sound,
                   f" · left out: {left_out_text(overall.outcomes)}"),
        _rate_card("success rate (raw, all tasks with a result)", overall.success),
    ]
    cards = "".join(
        [
            *headline,
            _status_card(metrics),
            _rate_card("feasible tasks", overall.feasible),
            _rate_card("infeasible tasks", overall.infeasible),
            f'<div class="card"><div class="sub">average score</div><div class="big">'
            f"{esc(score_text(overall.avg_score))}</div><div class=\"sub\">sound env. "
            f"{esc(score_text(overall.avg_score_sound))} · fractional scores kept</div></div>",
        ]
    )
    return (
        f'<section id="summary"><h2>Summary</h2>{banner}{scoring}<div class="headline">{cards}</div>'
        f"<p>Outcomes (final attempt of each task): {esc(outcome_counts(overall))}. "
        f"Attempts: {overall.attempts} for {overall.tasks} tasks ({overall.retries} retries, "
        f"{overall.retried_tasks} tasks retried).</p>"
        f"<p>{esc(reference_line(metrics))}</p>"
        f"<h3>Success rate (sound environment) per domain</h3>{banner}{domain_chart(metrics.per_domain)}{_domain_table(metrics)}"
        f"<h3>Effort and cost</h3>{_effort_table(overall)}"
        f"<h3>Provenance</h3>{_provenance_table(metrics.provenance)}</section>"
    )


def _task_index(tasks: Sequence[TaskMetrics], anchors: Mapping[tuple[str, int], str]) -> str:
    rows = []
    for t in tasks:
        step_acc = pct(t.reference.step_accuracy) if t.reference else "-"
        rows.append(
            f'<tr><td><a href="#{anchors[t.task_id, t.attempt]}">{esc(t.task_id)}</a></td><td>{esc(t.domain)}</td>'
            f'<td><span class="badge outcome-{esc(t.outcome)}">{esc(t.outcome)}</span></td>'
            f"<td class=num>{esc(score_text(t.score))}</td><td class=num>{esc(number(t.num_steps))}</td>"
            f"<td class=num>{esc(seconds(t.total_time_seconds))}</td><td class=num>{t.attempts}</td>"
            f"<td class=num>{esc(step_acc)}</td></tr>"
        )
    return (
        "<table><tr><th>task</th><th>domain</th><th>outcome</th><th class=num>score</th><th class=num>steps</th>"
        f"<th class=num>time</th><th class=num>attempts</th><th class=num>step acc.</th></tr>{''.join(rows)}</table>"
    )


# --- one task ----------------------------------------------------------------------------------


def _describe(action: BenchmarkAction | None, row: Mapping[str, Any]) -> str:
    """The action in words, e.g. "click [12] on Button 'Save'"."""
    if action is None:
        return f"{row.get('action_type') or 'unknown action'} (stored action is not a valid action)"
    text = action.describe()
    if action.target_role or action.target_name:
        text += f" on {action.target_role or 'element'} {action.target_name or ''!r}"
    if action.type is ActionType.WAIT:
        text += f" {action.seconds:g} s"
    return text


# A screenshot embedded for the page, or why it could not be.
Embedded = EmbeddedImage | OSError | ValueError


def _embed_or_error(path: Path) -> Embedded:
    try:
        return embed_screenshot(path)
    except (OSError, ValueError) as exc:
        return exc


def embed_screenshots(paths: Sequence[Path]) -> dict[Path, Embedded]:
    """Each distinct screenshot embedded once, several at a time: decoding, scaling and encoding
    run in Pillow's C code, which releases the GIL, so a report's screenshots use every core."""
    distinct = list(dict.fromkeys(paths))
    if len(distinct) <= 1:
        return {path: _embed_or_error(path) for path in distinct}
    with ThreadPoolExecutor(max_workers=min(len(distinct), os.cpu_count() or 1, 8),
                            thread_name_prefix="report-images") as pool:
        return dict(zip(distinct, pool.map(_embed_or_error, distinct)))


def _step_html(store: ResultStore, row: Mapping[str, Any], images: Mapping[Path, Embedded]) -> str:
    action = stored_action(row)
    stored_path = row.get("screenshot_path")
    if not stored_path:
        figure = '<div class="missing">no screenshot recorded</div>'
    else:
        path = resolve_screenshot(store, stored_path)
        image = images[path] if path in images else _embed_or_error(path)
        if isinstance(image, FileNotFoundError):
            figure = f'<div class="missing">screenshot missing: {esc(path)}</div>'
        elif isinstance(image, (OSError, ValueError)):
            figure = f'<div class="missing">screenshot unreadable: {esc(path)} ({esc(image)})</div>'
        else:
            figure = (
                f'<div class="shot"><img src="{image.data_uri}" width="{image.shown_width}" '
                f'height="{image.shown_height}" alt="screen before step {esc(row.get("step_index"))}">'
                f"{action_overlay(row, action, image)}</div>"
            )
    reasoning = row.get("reasoning") or (action.reasoning if action else None)
    usage = ""
    if row.get("model_calls"):
        usage = (
            f" · {row.get('input_tokens') or 0} in / {row.get('output_tokens') or 0} out tokens"
            f" · {esc(usd(row.get('cost_usd'), unpriced=row.get('cost_usd') is None))}"
        )
    raw = json.dumps(row.get("action"), indent=2, sort_keys=True, default=str, ensure_ascii=False)
    text = (
        f'<div class="step-text"><b>step {esc(row.get("step_index"))}</b>: '
        f'<code class="action">{esc(_describe(action, row))}</code>'
        f'<div class="muted">agent {esc(seconds(row.get("agent_seconds")))} · env {esc(seconds(row.get("env_seconds")))}'
        f"{usage}{' · window ' + esc(repr(row['window_title'])) if row.get('window_title') else ''}</div>"
        + (f'<div class="reasoning">{esc(reasoning)}</div>' if reasoning else "")
        + (f'<div class="step-error">error: {esc(row["error"])}</div>' if row.get("error") else "")
        + f"<details><summary class=muted>action JSON</summary><pre>{esc(raw)}</pre></details></div>"
    )
    return f'<li class="step">{figure}{text}</li>'


def _facts(task: TaskMetrics, final: Mapping[str, Any]) -> str:
    timings = ", ".join(
        f"{stage} {seconds(final.get(f'{stage}_seconds'))}"
        for stage in ("reset", "setup", "episode", "evaluate", "agent", "env")
        if final.get(f"{stage}_seconds") is not None
    )
    pairs = [
        ("outcome", task.outcome),
        ("score", score_text(task.score)),
        ("feasibility", "infeasible task" if task.infeasible else "feasible task"),
        ("evaluator reason", task.reason or "-"),
        ("error", task.error or "-"),
        ("time", f"{seconds(task.total_time_seconds)} total" + (f" ({timings})" if timings else "")),
        ("steps", number(task.num_steps)),
        ("model usage", f"{number(task.input_tokens)} input / {number(task.output_tokens)} output tokens, "
                        f"cost {usd(task.cost_usd, unpriced=bool(task.input_tokens) and task.cost_usd is None)}"),
        ("VM", final.get("vm_id") or "-"),
    ]
    details = final.get("agent_details")
    if details:
        pairs.append(("agent details", json.dumps(details, sort_keys=True, default=str, ensure_ascii=False)))
    return "<dl class=facts>" + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs) + "</dl>"


def _attempts_table(attempts: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td class=num>{esc(a['attempt'])}</td><td>{esc(a['outcome'])}</td><td>{esc(a.get('vm_id') or '-')}</td>"
        f"<td class=num>{esc(seconds(a.get('total_time_seconds')))}</td>"
        f"<td>{esc(a.get('error') or a.get('reason') or '')}</td></tr>"
        for a in attempts
    )
    return (
        "<h3>Attempts</h3><table><tr><th class=num>attempt</th><th>outcome</th><th>VM</th><th class=num>time</th>"
        f"<th>error / reason</th></tr>{rows}</table>"
    )


_HIT_NOTES = {True: " (element hit)", False: " (wrong element)", None: " (element cannot be checked)"}


def _reference_html(task: TaskMetrics, reference: ReferenceTrajectory | None) -> str:
    if reference is None:
        return ""
    score = task.reference
    if score is None:
        return (
            f"<h3>Reference ({esc(reference.source)}: {esc(reference.source_ref)})</h3>"
            "<p class=muted>not scored: the final attempt was an infrastructure error or a setup failure</p>"
        )
    by_ref = {p.reference_index: p for p in score.pairs}
    items = []
    for index, step in enumerate(reference.steps):
        pair = by_ref.get(index)
        if pair is None:
            mark = '<span class="no">not reproduced</span>'
        elif pair.matched:
            mark = f'<span class="yes">matched by step {pair.step_index}</span>'
        else:
            hit = _HIT_NOTES[pair.hit] if step.is_pointer else ""
            mark = f'<span class="no">aligned with step {pair.step_index}, not a match{hit}</span>'
        items.append(f'<li class="{"matched" if pair and pair.matched else ""}"><code>{esc(step.description)}</code> '
                     f"&mdash; {mark}</li>")
    return (
        f"<h3>Reference ({esc(reference.source)}: {esc(reference.source_ref)})</h3>"
        f"<p>step accuracy {esc(pct(score.step_accuracy))} ({score.matched_steps}/{score.reference_steps}); "
        f"grounding accuracy {esc(pct(score.grounding_accuracy))} ({score.pointer_hits}/{score.pointer_pairs}"
        f"{f', {score.pointer_unverifiable} unverifiable' if score.pointer_unverifiable else ''})</p>"
        f'<ol class="reference" start="0">{"".join(items)}</ol>'
    )


def _task_html(
    store: ResultStore,
    task: TaskMetrics,
    anchor: str,
    attempts: Sequence[Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
    reference: ReferenceTrajectory | None,
    images: Mapping[Path, Embedded],
    video: str | None = None,
) -> str:
    final = next((a for a in attempts if a["attempt"] == task.attempt), {})
    state = "solved" if task.success else "unsolved"
    summary = (
        f'<summary><span class="badge outcome-{esc(task.outcome)}">{esc(task.outcome)}</span> '
        f"<code>{esc(task.task_id)}</code> <span class=muted>{esc(task.domain)} · score {esc(score_text(task.score))}"
        f" · {esc(number(task.num_steps))} steps · {esc(seconds(task.total_time_seconds))}"
        f"{f' · {task.attempts} attempts' if task.attempts > 1 else ''}</span></summary>"
    )
    step_list = "".join(_step_html(store, row, images) for row in steps) or "<li class=muted>no steps recorded</li>"
    return (
        f'<details class="task {state} outcome-{esc(task.outcome)}" id="{anchor}">{summary}<div class="task-body">'
        f"{_facts(task, final)}{_attempts_table(attempts) if len(attempts) > 1 else ''}"
        f"{_reference_html(task, reference)}"
        + (f'<h3>Video (attempt {task.attempt})</h3><video class="episode" controls preload="metadata" '
           f'src="{video}"></video>' if video else "")
        + f"<h3>Trajectory (attempt {task.attempt})</h3><ol class=steps>{step_list}</ol></div></details>"
    )


def _tasks_section(store: ResultStore, metrics: RunMetrics, references: References | None,
                   videos: Mapping[tuple[str, int], str] | None = None) -> str:
    # Unsolved first, then by domain and id, so problems are at the top.
    tasks = sorted(metrics.tasks, key=lambda t: (t.success, t.domain, t.task_id))
    # By task and final attempt: with repeated trials a task has a row per trial, each ending in
    # an attempt of its own.
    anchors = {(t.task_id, t.attempt): f"task-{i}" for i, t in enumerate(tasks)}
    attempts: dict[str, list[dict[str, Any]]] = {}
    for row in store.results(metrics.run_id):
        attempts.setdefault(row["task_id"], []).append(row)
    unsolved = sum(not t.success for t in tasks)
    steps = store.run_steps(metrics.run_id)
    shown = [steps.get((t.task_id, t.attempt), []) for t in tasks]
    images = embed_screenshots([resolve_screenshot(store, row["screenshot_path"])
                                for rows in shown for row in rows if row.get("screenshot_path")])
    blocks = "".join(
        _task_html(store, t, anchors[t.task_id, t.attempt], attempts.get(t.task_id, []), rows,
                   references.get(t.task_id) if references else None, images, (videos or {}).get((t.task_id, t.attempt)))
        for t, rows in zip(tasks, shown)
    )
    return (
        f'<section id="tasks"><h2>Tasks</h2>{_task_index(tasks, anchors)}'
        '<h3>Trajectories</h3><div class="filters">'
        f'<input type="radio" name="task-filter" id="filter-all" checked><label for="filter-all">all ({len(tasks)})</label>'
        f'<input type="radio" name="task-filter" id="filter-unsolved"><label for="filter-unsolved">not solved ({unsolved})</label>'
        f'<input type="radio" name="task-filter" id="filter-solved"><label for="filter-solved">solved ({len(tasks) - unsolved})</label>'
        f'<div class="task-list">{blocks or "<p class=muted>no task results recorded</p>"}</div></div></section>'
    )


def _trial_statistics(store: ResultStore, run_id: str) -> Any:
    """The run's repeated-trial statistics for its K (trials/report.py `trial_section`): None for
    a single-trial run, one line when SciPy is missing."""
    from adapters.results.report_text import configured_trials
    from adapters.results.trials.report import trial_section

    return trial_section(store.latest_attempts(run_id), configured_trials(store, run_id))


def _trials_section(store: ResultStore, run_id: str, statistics: Any = None) -> str:
    """A run with repeated trials: its statistics (`statistics`: `_trial_statistics`, pass@k for
    the run's K), each task's trials side by side (final attempt of each), its success fraction,
    and the flaky tasks (outcomes that differ between trials) with their trial outcomes, those of
    a deterministic agent flagged as pointing at the environment (adapters/results/trials/flaky.py).
    Empty for a single-trial run."""
    from adapters.results.trials.flaky import task_stability

    rows = store.latest_attempts(run_id)
    if statistics is None or not rows:
        return ""
    stats_lines = [statistics] if isinstance(statistics, str) else statistics.lines()
    stats_html = "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in stats_lines) + "</ul>"
    run = store.get_run(run_id)
    agent = run.agent if run is not None else ""
    by_task: dict[str, dict[int, Mapping[str, Any]]] = {}
    for row in rows:
        by_task.setdefault(str(row["task_id"]), {})[int(row["trial"])] = row
    k = max(max(trials) for trials in by_task.values())
    header = "".join(f"<th>trial {n}</th>" for n in range(1, k + 1))
    lines = []
    for task_id, trials in sorted(by_task.items()):
        cells = "".join(
            f'<td><span class="badge outcome-{esc(trials[n]["outcome"])}">{esc(trials[n]["outcome"])}</span></td>'
            if n in trials else "<td class=muted>-</td>" for n in range(1, k + 1))
        sound = [r for r in trials.values() if is_sound(str(r["outcome"]))]
        fraction = f"{sum(bool(r['success']) for r in sound)}/{len(sound)}" if sound else "-"
        domain = next(iter(trials.values())).get("domain") or ""
        lines.append(f"<tr><td><code>{esc(task_id)}</code></td><td>{esc(domain)}</td>{cells}"
                     f"<td class=num>{esc(fraction)}</td></tr>")
    groups = task_stability({**r, "run_id": run_id, "agent": agent} for r in rows)
    flaky = [g for g in groups if g.flaky]
    items = "".join(
        f"<li><code>{esc(g.task_id)}</code> ({esc(g.domain)}): {esc(g.successes)}/{esc(g.sound_trials)} sound trials "
        f"succeeded: {esc(', '.join(f'trial {t.trial} {t.outcome}' for t in g.trials))}"
        + (" <strong>(deterministic agent: the environment varied)</strong>" if g.points_at_environment else "")
        + "</li>" for g in flaky)
    return (
        f'<section id="trials"><h2>Trials</h2>{stats_html}<p>{len(by_task)} task(s), up to {k} trials each (the final '
        "attempt of each trial; success over sound trials). The task list below shows each trial's trajectory.</p>"
        f"<table><tr><th>task</th><th>domain</th>{header}<th class=num>success</th></tr>{''.join(lines)}</table>"
        f"<h3>Flaky tasks: {len(flaky)}</h3>"
        + (f"<ul>{items}</ul>" if items else "<p class=muted>no task's outcome differed between its trials</p>")
        + "</section>"
    )


def render_html_report(metrics: RunMetrics, store: ResultStore, references: References | None = None,
                       extras: ReportExtras | None = None) -> str:
    """The whole HTML page for already computed metrics (screenshots read from disk via `store`);
    `extras`: the baseline's history and the episodes' videos (`report_extras`)."""
    extras = extras or ReportExtras()
    label = environment_label(metrics.provenance)
    banner = f'<p class="banner">{esc(label)}</p>' if label == SIMULATION_LABEL else f"<p>environment: {esc(label)}</p>"
    statistics = _trial_statistics(store, metrics.run_id)
    headline = None if isinstance(statistics, str) else statistics
    return (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{REPORT_GENERATOR}"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # No network: images are data URIs; the policy makes any other load fail loudly.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; media-src data:; "
        "style-src 'unsafe-inline'\">"
        f"<title>WAA run {esc(metrics.run_id)}</title><style>{_CSS}</style></head><body>"
        f"<h1>WAA run report <code>{esc(metrics.run_id)}</code></h1>{banner}"
        f"{_summary_section(metrics, headline)}{_trials_section(store, metrics.run_id, statistics)}"
        f"{extras.history}{extras.videos_note}"
        f"{_tasks_section(store, metrics, references, extras.videos)}</body></html>\n"
    )


@dataclass
class ReportExtras:
    """What a report shows besides the run itself: its baseline's history (an HTML section) and
    videos of some episodes (data URLs by (task id, attempt)), with a note on what was left out."""

    history: str = ""
    videos: dict[tuple[str, int], str] = field(default_factory=dict)
    videos_note: str = ""


# Videos take about a second each to encode and 30-60 KB each in the page: the report embeds
# at most this many (the flipped tasks first, then the failed ones); the rest are one command away.
MAX_REPORT_VIDEOS = 10


def report_extras(store: ResultStore, metrics: RunMetrics, *, videos: bool) -> ReportExtras:
    """The baseline's history up to this run (when it is a baseline's run), and with `videos`,
    the videos of its flipped and failed tasks (the `video` extra; one line when missing)."""
    from adapters.results.episode_video import VideoError, VideoExtraMissing, as_data_url, episode_video
    from adapters.results.history import UnknownBaselineError, baseline_history
    from adapters.results.history_report import history_html

    extras = ReportExtras()
    flipped: list[str] = []
    baseline = metrics.provenance.get("baseline")
    if baseline:
        try:
            history = baseline_history(store, str(baseline), until=metrics.run_id)
        except (UnknownBaselineError, ValueError):
            history = None
        if history is not None:
            extras.history = history_html(history)
            if history.since_previous is not None:
                flipped = [f.task_id for f in history.since_previous.broken + history.since_previous.fixed]
    if not videos:
        return extras
    wanted = [t for t in metrics.tasks if t.task_id in flipped]
    wanted += [t for t in metrics.tasks if not t.success and t.task_id not in flipped and is_sound(t.outcome)]
    try:
        for task in wanted[:MAX_REPORT_VIDEOS]:
            try:
                extras.videos[task.task_id, task.attempt] = as_data_url(
                    episode_video(store, metrics.run_id, task.task_id, task.attempt))
            except VideoError:
                continue
    except VideoExtraMissing as exc:
        extras.videos_note = f'<p class="muted">{esc(str(exc))}</p>'
        return extras
    if len(wanted) > MAX_REPORT_VIDEOS:
        extras.videos_note = (f'<p class="muted">Videos of {MAX_REPORT_VIDEOS} of the {len(wanted)} flipped and failed '
                              f"tasks are in the task list; the others: <code>arena export {esc(metrics.run_id)} "
                              "--format video --out DIR</code></p>")
    return extras


def write_html_report(
    store: ResultStore, run_id: str, out_path: Path, references: References | None = None,
    metrics: RunMetrics | None = None, *, videos: bool = False,
) -> Path:
    """Write the run's self-contained HTML report to `out_path` and return its absolute path.

    StoreError naming the run when it is unknown; ReportError naming `out_path` when it is a
    directory, a file other than a report (never replaced), or cannot be written. The file is
    replaced atomically, so a reader never sees half a report. Missing screenshot files are
    reported in the page, never an error. `metrics`, when the caller has computed them already
    (compute_run_metrics with the same references), are used as they are. A baseline's run shows
    the baseline's history up to it; with `videos`, its flipped and failed tasks' episodes play
    in the page (`report_extras`).
    """
    out_path = Path(out_path).expanduser().resolve()
    if out_path.is_dir():
        raise ReportError(f"{out_path}: is a directory; give the report's file name, e.g. {out_path / 'report.html'}")
    _check_replaceable(out_path)
    if metrics is None:
        metrics = compute_run_metrics(store, run_id, references)
    page = render_html_report(metrics, store, references, report_extras(store, metrics, videos=videos))
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(out_path, page)  # another process may be writing the same report
    except OSError as exc:
        raise ReportError(f"{out_path}: cannot write the report: {exc}") from exc
    return out_path
