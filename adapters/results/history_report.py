"""A baseline's history (adapters/results/history.py) as people read it: a terminal table
(`arena history`), markdown (the nightly's Prefect artifact) and an HTML section with charts
(`arena history --html`, and the HTML report of a baseline's run).

The charts are drawn by matplotlib as SVG, inline in the page: self-contained, no script, usable
offline. matplotlib is the `charts` extra; without it the section says so in one line and keeps
its tables.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import Any

from adapters.results.history import BaselineHistory, Flips, Night

CHARTS_EXTRA_HINT = "charts need matplotlib: pip install 'waa-arena[charts]'"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def interval_text(night: Night) -> str:
    if night.interval is None:
        return "-"
    low, high = night.interval
    return f"[{100 * low:.0f}-{100 * high:.0f}%]"


def cost_text(night: Night) -> str:
    """"$0.1234", or "unpriced" (the reason is in `cost_note`)."""
    return "unpriced" if night.cost_usd is None else f"${night.cost_usd:.4f}"


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def change_text(night: Night) -> str:
    change = night.change
    if change is None:
        return ""
    word = change.kind.upper() if change.continuing_since is None else f"{change.kind} continuing"
    return f"{word} (p={change.p_value:.2g}, {len(change.looked_at)} nights)"


def _when(night: Night) -> str:
    return f"{night.started_at:%Y-%m-%d %H:%M}" if night.started_at else "-"


def _domains(history: BaselineHistory) -> list[str]:
    return sorted({d.domain for n in history.nights for d in n.domains})


def _flips_lines(label: str, flips: Flips | None) -> list[str]:
    if flips is None:
        return []
    if not (flips.broken or flips.fixed or flips.changed_versions):
        return [f"{label} ({flips.since}): no task changed"]
    lines = [f"{label} ({flips.since}):"]
    for name, items in (("broken", flips.broken), ("fixed", flips.fixed)):
        if items:
            shown = ", ".join(f"{f.task_id} ({pct(f.before)} -> {pct(f.after)})" for f in items)
            lines.append(f"  {name} ({len(items)}): {shown}")
    if flips.changed_versions:
        lines.append(f"  changed version, not compared ({len(flips.changed_versions)}): "
                     f"{', '.join(flips.changed_versions)}")
    return lines


def history_text(history: BaselineHistory) -> str:
    """The terminal table: a line per night, then the flips and notes."""
    domains = _domains(history)
    head = (f"Baseline {history.baseline}: {len(history.nights)} night(s) in {history.store}; each night is tested "
            f"against up to {history.window} earlier ones (alpha {history.alpha:g})")
    columns = ["night", "run id", "status", "rate", "95%", *domains, "cost", "time", "infra", "change"]
    rows = []
    for night in history.nights:
        rates = {d.domain: pct(d.rate) for d in night.domains}
        rows.append([_when(night), night.run_id, night.status or "-", pct(night.rate), interval_text(night),
                     *(rates.get(d, "-") for d in domains), cost_text(night),
                     duration_text(night.duration_seconds), str(night.infrastructure_errors), change_text(night)])
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]
    lines = [head, "", "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.append("")
    flagged = history.changes
    lines.append(f"changes: {len(flagged)} night(s) flagged" + (": " + "; ".join(
        f"{n.run_id} {n.change.describe()}" for n in flagged if n.change) if flagged else ""))
    lines += _flips_lines("flipped since the previous night", history.since_previous)
    lines += _flips_lines("flipped since the last good night", history.since_last_good)
    unpriced = [n for n in history.nights if n.cost_usd is None]
    if unpriced:
        lines.append(f"{unpriced[-1].cost_note} (a price override sets it: docs/agents.md)")
    lines += [f"note: {note}" for note in history.notes]
    return "\n".join(lines) + "\n"


def history_markdown(history: BaselineHistory) -> str:
    """The same as markdown (a Prefect artifact)."""
    domains = _domains(history)
    out = [f"## Baseline {history.baseline}: {len(history.nights)} night(s)", "",
           f"Each night is tested against up to {history.window} earlier ones (exact conditional test, "
           f"alpha {history.alpha:g}).", "",
           "| night | run | status | rate | 95% | " + " | ".join(domains) + " | cost | time | infra | change |",
           "|" + " --- |" * (9 + len(domains))]
    for night in history.nights:
        rates = {d.domain: pct(d.rate) for d in night.domains}
        out.append(f"| {_when(night)} | `{night.run_id}` | {night.status or '-'} | {pct(night.rate)} | "
                   f"{interval_text(night)} | " + " | ".join(rates.get(d, "-") for d in domains)
                   + f" | {cost_text(night)} | {duration_text(night.duration_seconds)} | "
                   f"{night.infrastructure_errors} | {change_text(night)} |")
    out.append("")
    for label, flips in (("Flipped since the previous night", history.since_previous),
                         ("Flipped since the last good night", history.since_last_good)):
        out += [f"- {line.strip()}" for line in _flips_lines(label, flips)]
    out += [f"- note: {note}" for note in history.notes]
    return "\n".join(out) + "\n"


# --- HTML and charts -----------------------------------------------------------------------------


def history_html(history: BaselineHistory) -> str:
    """The HTML section: the charts (or the line naming their extra), the table, flips, notes."""
    e = html.escape
    try:
        charts = "".join(f'<figure class="history-chart">{svg}</figure>' for svg in history_charts(history))
    except ImportError:
        charts = f'<p class="muted">{e(CHARTS_EXTRA_HINT)}</p>'
    text = history_text(history)
    table_start = text.index("\n\n") + 2
    table, _, rest = text[table_start:].partition("\n\n")
    return (f'<section id="history"><h2>History of baseline {e(history.baseline)}</h2>'
            f"<p>{e(text[:table_start].strip())}</p>{charts}"
            f'<pre class="history-table">{e(table)}</pre><pre>{e(rest)}</pre></section>')


def history_page(history: BaselineHistory) -> str:
    """A whole page for `arena history --html`."""
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>Baseline {html.escape(history.baseline)}</title>"
            "<style>body{font:14px/1.45 system-ui,sans-serif;max-width:1180px;margin:0 auto;padding:16px 24px}"
            "pre{overflow-x:auto;background:#f6f8fa;padding:8px}figure{margin:12px 0}"
            ".muted{color:#5f6b7a}svg{max-width:100%;height:auto}</style></head><body>"
            f"{history_html(history)}</body></html>")


def history_charts(history: BaselineHistory) -> list[str]:
    """Inline SVGs: success over nights with its 95 % band (flagged nights marked), one small
    chart per domain, and cost and duration. ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("svg")  # no display; also keeps matplotlib from looking for one
    from matplotlib.figure import Figure

    nights = history.nights
    x = list(range(len(nights)))
    labels = _labels(nights)
    charts = [_success_chart(Figure, nights, x, labels, history.baseline),
              _domain_charts(Figure, history, x, labels),
              _effort_chart(Figure, nights, x, labels)]
    return charts


def _labels(nights: Sequence[Night]) -> list[str]:
    """Each night's label on the charts: its date, or date and time when two share a date (runs
    started by hand), or its run id when even those repeat."""
    for pattern in ("%m-%d", "%m-%d %H:%M", "%m-%d %H:%M:%S"):
        labels = [n.started_at.strftime(pattern) if n.started_at else n.run_id for n in nights]
        if len(set(labels)) == len(labels):
            return labels
    return [n.run_id for n in nights]


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # the XML prologue and doctype do not belong inside HTML


def _axis(ax: Any, x: Sequence[int], labels: Sequence[str]) -> None:
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    ax.grid(True, alpha=0.3)


def _success_chart(Figure: Any, nights: Sequence[Night], x: Sequence[int], labels: Sequence[str], title: str) -> str:
    figure = Figure(figsize=(9, 3.2))
    ax = figure.add_subplot()
    rates = [100 * n.rate if n.rate is not None else float("nan") for n in nights]
    lows = [100 * n.interval[0] if n.interval else float("nan") for n in nights]
    highs = [100 * n.interval[1] if n.interval else float("nan") for n in nights]
    ax.fill_between(x, lows, highs, alpha=0.2, color="#0969da", label="95% interval")
    ax.plot(x, rates, marker="o", color="#0969da", label="success (sound environment)")
    for i, night in enumerate(nights):
        if night.change is not None and night.change.continuing_since is None:
            colour = "#c62828" if night.change.kind == "regression" else "#1a7f37"
            ax.scatter([i], [rates[i]], s=160, facecolors="none", edgecolors=colour, linewidths=2,
                       label=night.change.kind)
    ax.set_ylim(0, 100)
    ax.set_ylabel("success %")
    ax.set_title(f"{title}: success over nights")
    _axis(ax, x, labels)
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower left")
    return _svg(figure)


def _domain_charts(Figure: Any, history: BaselineHistory, x: Sequence[int], labels: Sequence[str]) -> str:
    domains = _domains(history)
    columns = min(3, max(1, len(domains)))
    rows = (len(domains) + columns - 1) // columns or 1
    figure = Figure(figsize=(9, 2.2 * rows))
    for k, domain in enumerate(domains):
        ax = figure.add_subplot(rows, columns, k + 1)
        values = []
        lows, highs = [], []
        for night in history.nights:
            found = next((d for d in night.domains if d.domain == domain), None)
            values.append(100 * found.rate if found and found.rate is not None else float("nan"))
            lows.append(100 * found.interval[0] if found and found.interval else float("nan"))
            highs.append(100 * found.interval[1] if found and found.interval else float("nan"))
        ax.fill_between(x, lows, highs, alpha=0.2, color="#8250df")
        ax.plot(x, values, marker=".", color="#8250df")
        ax.set_ylim(0, 100)
        ax.set_title(domain or "(none)", fontsize=9)
        _axis(ax, x, labels)
    figure.suptitle("per domain", fontsize=10)
    figure.tight_layout()
    return _svg(figure)


def _effort_chart(Figure: Any, nights: Sequence[Night], x: Sequence[int], labels: Sequence[str]) -> str:
    figure = Figure(figsize=(9, 2.6))
    cost_ax = figure.add_subplot(1, 2, 1)
    priced = [(i, n.cost_usd) for i, n in enumerate(nights) if n.cost_usd is not None]
    cost_ax.bar([i for i, _ in priced], [c for _, c in priced], color="#bf8700")
    for i, night in enumerate(nights):
        if night.cost_usd is None:
            cost_ax.text(i, 0, "unpriced", rotation=90, fontsize=7, ha="center", va="bottom")
    cost_ax.set_ylim(bottom=0)
    cost_ax.set_title("cost (USD)", fontsize=9)
    _axis(cost_ax, x, labels)
    time_ax = figure.add_subplot(1, 2, 2)
    time_ax.bar(x, [(n.duration_seconds or 0) / 60 for n in nights], color="#57606a")
    time_ax.set_ylim(bottom=0)
    time_ax.set_title("duration (minutes)", fontsize=9)
    _axis(time_ax, x, labels)
    figure.tight_layout()
    return _svg(figure)
