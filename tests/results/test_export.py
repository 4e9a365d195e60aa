"""Parquet export of one run, read back with DuckDB."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, ModelUsage, OutcomeKind, StepRecord
from adapters.results.source import UnknownRunError
from adapters.results.export import ExportError, export_run_parquet, sql_string_literal
from adapters.store.duckdb_store import ResultStore, RunInfo

RUN = "export-run"
OTHER = "other-run"
NAMES = ["runs.parquet", "task_results.parquet", "steps.parquet", "latest_task_results.parquet"]


def _result(task_id: str, outcome: OutcomeKind, attempt: int, steps: int) -> BenchmarkResult:
    return BenchmarkResult(
        task_id=task_id,
        domain="notepad",
        outcome=outcome,
        success=outcome is OutcomeKind.SUCCESS,
        score=1.0 if outcome is OutcomeKind.SUCCESS else 0.0,
        attempt=attempt,
        num_steps=steps,
        timings={"reset_seconds": 1.5, "custom_stage": 0.25},
        usage=ModelUsage(calls=steps, input_tokens=100 * steps, output_tokens=10 * steps, cost_usd=0.01 * steps),
        agent_details={"demo_id": f"demo-{task_id}", "nested": {"k": [1, 2]}},
        steps=[
            StepRecord(
                index=i,
                action=BenchmarkAction(type=ActionType.TYPE, text=f"it's step {i} \\ \"quoted\""),
                screenshot_path=f"/artifacts/{task_id}/step_{i:03d}.png",
                usage=ModelUsage(calls=1, input_tokens=100, output_tokens=10, cost_usd=0.01),
            )
            for i in range(steps)
        ],
    )


@pytest.fixture()
def export_store(tmp_path: Path) -> Iterator[ResultStore]:
    """A run with three tasks (one retried after an infrastructure error) and a second run."""
    with ResultStore(tmp_path / "export.duckdb") as store:
        store.start_run(
            RunInfo(run_id=RUN, agent="openai", suite="bundled", model_id="qwen-ft",
                    agent_config={"temperature": 0.2, "stop": ["DONE()"], "api_key": "sk-secret"})
        )
        store.start_run(RunInfo(run_id=OTHER, agent="random", suite="bundled"))
        store.record_result(RUN, _result("a", OutcomeKind.INFRASTRUCTURE_ERROR, 1, 2))
        store.record_result(RUN, _result("a", OutcomeKind.SUCCESS, 2, 3))
        store.record_result(RUN, _result("b", OutcomeKind.AGENT_FAILURE, 1, 4))
        store.record_result(RUN, _result("c", OutcomeKind.SUCCESS, 1, 0))
        store.record_result(OTHER, _result("a", OutcomeKind.SUCCESS, 1, 5))
        yield store


def _read(path: Path, sql: str = "SELECT * FROM t") -> list[dict[str, Any]]:
    with duckdb.connect() as con:
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({sql_string_literal(str(path))})")
        cursor = con.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def test_export_writes_the_run_and_reads_back(export_store: ResultStore, tmp_path: Path) -> None:
    # A directory name with a quote, a backslash and a space, which must reach DuckDB intact.
    out = tmp_path / "it's a \\dir" / "nested"
    paths = export_run_parquet(export_store, RUN, out)
    assert [p.name for p in paths] == NAMES and all(p.parent == out.resolve() for p in paths)
    assert sorted(p.name for p in out.iterdir()) == sorted(NAMES)  # no temporary files left

    runs = _read(paths[0])
    assert len(runs) == 1 and runs[0]["run_id"] == RUN and runs[0]["model_id"] == "qwen-ft"
    # JSON survives as JSON, with the secret already scrubbed by the store.
    assert json.loads(runs[0]["agent_config"]) == {"temperature": 0.2, "stop": ["DONE()"]}

    results = _read(paths[1])
    assert [(r["task_id"], r["attempt"], r["outcome"]) for r in results] == [
        ("a", 1, "infrastructure_error"), ("a", 2, "success"), ("b", 1, "agent_failure"), ("c", 1, "success"),
    ]
    assert {r["run_id"] for r in results} == {RUN}
    assert json.loads(results[1]["agent_details"]) == {"demo_id": "demo-a", "nested": {"k": [1, 2]}}
    assert json.loads(results[1]["timings"]) == {"reset_seconds": 1.5, "custom_stage": 0.25}
    assert results[1]["reset_seconds"] == 1.5 and results[1]["input_tokens"] == 300
    assert results[1]["recorded_at"] == export_store.results(RUN)[1]["recorded_at"]

    steps = _read(paths[2])
    assert len(steps) == 2 + 3 + 4 and {s["run_id"] for s in steps} == {RUN}
    assert [(s["task_id"], s["attempt"], s["step_index"]) for s in steps][:3] == [("a", 1, 0), ("a", 1, 1), ("a", 2, 0)]
    action = json.loads(steps[0]["action"])
    assert action["type"] == "type" and action["text"] == "it's step 0 \\ \"quoted\""

    latest = _read(paths[3])
    assert [(r["task_id"], r["attempt"]) for r in latest] == [("a", 2), ("b", 1), ("c", 1)]
    # Every column of the view is there, in the table's order.
    assert list(latest[0]) == list(results[0])
    # The exported rows are the database's rows.
    assert [r["task_id"] for r in latest] == [r["task_id"] for r in export_store.latest_attempts(RUN)]


def test_export_from_a_path_reads_the_file_read_only(export_store: ResultStore, tmp_path: Path) -> None:
    path = export_store.path
    export_store.close()
    paths = export_run_parquet(path, OTHER, tmp_path / "out")
    assert _read(paths[1], "SELECT count(*) AS n FROM t") == [{"n": 1}]
    assert _read(paths[2], "SELECT count(*) AS n FROM t") == [{"n": 5}]


def test_existing_files_are_refused_unless_overwrite(export_store: ResultStore, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export_run_parquet(export_store, OTHER, out)
    before = (out / "task_results.parquet").read_bytes()
    with pytest.raises(ExportError) as info:
        export_run_parquet(export_store, RUN, out)
    assert str(out) in str(info.value) and "runs.parquet" in str(info.value) and "overwrite=True" in str(info.value)
    assert (out / "task_results.parquet").read_bytes() == before
    paths = export_run_parquet(export_store, RUN, out, overwrite=True)
    assert _read(paths[1], "SELECT count(*) AS n FROM t") == [{"n": 4}]


def test_one_existing_file_is_enough_to_refuse(export_store: ResultStore, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "steps.parquet").write_text("keep me")
    with pytest.raises(ExportError, match="steps.parquet already exist"):
        export_run_parquet(export_store, RUN, out)
    assert sorted(p.name for p in out.iterdir()) == ["steps.parquet"]
    assert (out / "steps.parquet").read_text() == "keep me"


def test_unknown_run_is_named_and_creates_nothing(export_store: ResultStore, tmp_path: Path) -> None:
    out = tmp_path / "never"
    with pytest.raises(UnknownRunError) as info:
        export_run_parquet(export_store, "no-such-run", out)
    assert "unknown run 'no-such-run'" in str(info.value)
    assert not out.exists()


def test_bad_output_directory_and_run_id(export_store: ResultStore, tmp_path: Path) -> None:
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(ExportError, match="output directory is a file"):
        export_run_parquet(export_store, RUN, file)
    with pytest.raises(ExportError, match="run_id must be a non-empty string"):
        export_run_parquet(export_store, "", tmp_path / "o")


def test_sql_string_literal_escapes_quotes_only() -> None:
    assert sql_string_literal("/tmp/it's") == "'/tmp/it''s'"
    assert sql_string_literal("a\\b") == "'a\\b'"
    with duckdb.connect() as con:
        for text in ["it's", "''", "a\\'b", "x'); DROP TABLE t; --"]:
            assert con.execute(f"SELECT {sql_string_literal(text)}").fetchone() == (text,)
    with pytest.raises(ExportError, match="NUL"):
        sql_string_literal("a\x00b")
