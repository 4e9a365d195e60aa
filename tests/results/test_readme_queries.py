"""The "## Querying results" queries (docs/results.md, linked from the README) run as written (with DuckDB and with `arena sql`) and
give sensible answers.

Each query is a ```sql block preceded by a `<!-- query: NAME -->` line. They run against a
database made by the real flow: the bundled suite with the scripted agent (run id
'nightly-scripted', which solves every task) and then with the random agent ('nightly-random').
Queries with a known NAME have their results checked; any other query must at least run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

from adapters.results.compare import compare_stored_runs
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

README = Path(__file__).resolve().parents[2] / "docs" / "results.md"  # moved there from the README
SECTION = "## Querying results"
BASELINE, NEW = "nightly-scripted", "nightly-random"
REQUIRED = ("success-by-domain", "flips")

Rows = list[dict[str, Any]]


def parse_readme_queries(text: str) -> tuple[list[tuple[str, str]] | None, list[str]]:
    """(name, sql) of every marked block of the section (None when the section is absent), and
    the problems found: a ```sql block without a marker, or a name used twice, would leave a
    documented query untested."""
    heading = re.search(rf"^{re.escape(SECTION)}[ \t]*$", text, re.M)
    if heading is None:
        return None, []
    following = re.search(r"^## ", text[heading.end() :], re.M)
    section = text[heading.end() : heading.end() + following.start() if following else len(text)]
    marked = re.findall(r"<!-- query: ([A-Za-z0-9_-]+) -->\s*\n```sql\n(.*?)```", section, re.S)
    problems = []
    unmarked = section.count("```sql\n") - len(marked)
    if unmarked:
        problems.append(f"{unmarked} sql block(s) lack a <!-- query: NAME --> line")
    names = [name for name, _ in marked]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"query names used twice: {', '.join(twice)}")
    return marked, problems


QUERIES, PROBLEMS = parse_readme_queries(README.read_text()) if README.exists() else (None, [])


@pytest.fixture(scope="module")
def readme_queries_db(request: pytest.FixtureRequest) -> Path:
    """Two runs of the bundled suite through the real flow, scripted then random (shared with the
    report tests), under the run ids the README's queries name."""
    if not QUERIES:
        pytest.skip(f"{README} has no {SECTION!r} section with queries yet")
    # Only now: a skipped module should not start a Prefect server.
    runs = request.getfixturevalue("bundled_run_db")
    assert (runs.scripted, runs.random) == (BASELINE, NEW)
    return runs.db


def _run(db: Path, sql: str) -> Rows:
    with duckdb.connect(str(db), read_only=True) as con:
        cursor = con.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def _facts(db: Path) -> dict[str, Any]:
    """What the queries should find, read independently of them."""
    final = _run(db, "SELECT run_id, task_id, domain, success, num_steps FROM latest_task_results")
    by_run: dict[str, dict[str, dict[str, Any]]] = {}
    for row in final:
        by_run.setdefault(row["run_id"], {})[row["task_id"]] = row
    return {"scripted": by_run[BASELINE], "random": by_run[NEW]}


def _domains() -> dict[str, int]:
    """Tasks per domain of the bundled suite."""
    return WAATaskCatalog(bundled_suite_dir()).counts()


def check_runs(rows: Rows, db: Path) -> None:
    facts = _facts(db)
    assert [r["run_id"] for r in rows] == [NEW, BASELINE]  # newest first
    by_id = {r["run_id"]: r for r in rows}
    assert (by_id[BASELINE]["agent"], by_id[NEW]["agent"]) == ("scripted", "random")
    assert by_id[BASELINE]["tasks"] == by_id[NEW]["tasks"] == sum(_domains().values())
    assert by_id[BASELINE]["solved"] == by_id[BASELINE]["tasks"] and by_id[BASELINE]["success_pct"] == 100.0
    random_solved = sum(r["success"] for r in facts["random"].values())
    assert by_id[NEW]["solved"] == random_solved
    assert by_id[NEW]["success_pct"] == round(100 * random_solved / by_id[NEW]["tasks"], 1)
    assert by_id[BASELINE]["infra_errors"] == by_id[NEW]["infra_errors"] == 0


def check_success_by_domain(rows: Rows, db: Path) -> None:
    domains = _domains()
    assert [r["domain"] for r in rows] == sorted(domains)
    for row in rows:
        assert row["tasks"] == row["solved"] == domains[row["domain"]], row
        assert row["success_pct"] == 100.0, row


def check_domain_deltas(rows: Rows, db: Path) -> None:
    comparison = compare_stored_runs(db, BASELINE, NEW)
    product = {d.domain: d for d in comparison.domains}
    assert [r["domain"] for r in rows] == sorted(_domains())
    for row in rows:
        d = product[row["domain"]]
        assert row["paired_tasks"] == d.paired_tasks and row["baseline_pct"] == 100.0
        assert row["delta_pts"] == round(100 * d.delta, 1)  # type: ignore[operator]
        assert row["fixed"] == 0 and row["broken"] == sum(f.domain == row["domain"] for f in comparison.broken)


def check_flips(rows: Rows, db: Path) -> None:
    facts = _facts(db)
    expected = {t for t, r in facts["scripted"].items() if r["success"] and not facts["random"][t]["success"]}
    assert {r["task_id"] for r in rows} == expected and len(rows) == len(expected)
    assert {r["change"] for r in rows} == {"broken"}
    assert all(r["baseline_outcome"] == "success" and r["new_outcome"] != "success" for r in rows)
    # Scripted solves all 16 bundled tasks; random (seed 0) solves none of them.
    assert len(rows) == sum(_domains().values()) - sum(r["success"] for r in facts["random"].values())
    assert {r["task_id"] for r in rows} == {f.task_id for f in compare_stored_runs(db, BASELINE, NEW).broken}


def check_task_steps(rows: Rows, db: Path) -> None:
    final = _facts(db)["scripted"]["notepad-append-line"]
    assert [r["step_index"] for r in rows] == list(range(final["num_steps"])) and rows
    assert rows[-1]["action_type"] == "done" and all(r["screenshot_path"] for r in rows)


CHECKS: dict[str, Callable[[Rows, Path], None]] = {
    "runs": check_runs,
    "success-by-domain": check_success_by_domain,
    "domain-deltas": check_domain_deltas,
    "flips": check_flips,
    "task-steps": check_task_steps,
}


def test_readme_section_is_well_formed() -> None:
    if QUERIES is None:
        pytest.skip(f"{README} has no {SECTION!r} section yet")
    assert PROBLEMS == [], f"{README}, {SECTION!r}: {'; '.join(PROBLEMS)}"
    names = [name for name, _ in QUERIES]
    assert set(REQUIRED) <= set(names), f"{README}: {SECTION!r} lacks {sorted(set(REQUIRED) - set(names))}"


def test_parser_finds_marked_blocks_only_in_the_section() -> None:
    text = (
        "# T\n```sql\nSELECT 0;\n```\n"
        f"{SECTION}\n\n<!-- query: one -->\n```sql\nSELECT 1;\n```\n"
        "<!-- query: two -->\n\n```sql\nSELECT 2\nFROM t;\n```\n```sql\nSELECT 3;\n```\n"
        "## Next\n<!-- query: three -->\n```sql\nSELECT 4;\n```\n"
    )
    queries, problems = parse_readme_queries(text)
    assert queries == [("one", "SELECT 1;\n"), ("two", "SELECT 2\nFROM t;\n")]
    assert problems == ["1 sql block(s) lack a <!-- query: NAME --> line"]
    assert parse_readme_queries("# no section\n") == (None, [])
    _, problems = parse_readme_queries(f"{SECTION}\n<!-- query: a -->\n```sql\nX\n```\n<!-- query: a -->\n```sql\nY\n```\n")
    assert problems == ["query names used twice: a"]


@pytest.mark.parametrize(("name", "sql"), QUERIES or [("(none)", "")], ids=[n for n, _ in QUERIES or [("(none)", "")]])
def test_readme_query_runs_as_written(name: str, sql: str, readme_queries_db: Path) -> None:
    rows = _run(readme_queries_db, sql)
    check = CHECKS.get(name)
    if check is not None:
        check(rows, readme_queries_db)


@pytest.mark.parametrize(("name", "sql"), QUERIES or [("(none)", "")], ids=[n for n, _ in QUERIES or [("(none)", "")]])
def test_readme_query_runs_with_arena_sql(name: str, sql: str, readme_queries_db: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The documented way to run them: `arena sql "QUERY"` prints the same rows."""
    import csv

    from flows.cli import main

    assert main(["sql", sql, "--db", str(readme_queries_db), "--csv"]) == 0
    printed = list(csv.reader(capsys.readouterr().out.splitlines()))
    rows = _run(readme_queries_db, sql)
    assert len(printed) == len(rows) + 1  # the header, then a line per row
    if rows:
        assert printed[0] == list(rows[0])
