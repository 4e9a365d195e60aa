"""`arena export --format sft|trajectories|inspect`: round trips through the trainer-side
libraries' own loaders (Hugging Face `datasets`, inspect_ai's log reader), filters, the leakage
guard, and an export that fails leaving nothing behind."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from installed import require
from PIL import Image

from adapters.agents.action_grammar import format_grammar_help, parse_action
from adapters.benchmark import OutcomeKind
from adapters.results.source import UnknownRunError
from adapters.store.duckdb_store import ResultStore
from adapters.training.export import TRAJECTORY_SCHEMA, TRAJECTORY_SCHEMA_VERSION, export_training
from adapters.training.selection import EpisodeFilter
from adapters.training.suites import SUITE_FILE, LeakageError
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

require("datasets")
CATALOG = WAATaskCatalog(bundled_suite_dir())


def _stored_steps(db: Path, run_id: str) -> dict[tuple[str, int], dict]:
    with ResultStore(db, read_only=True) as store, store.reading([run_id], with_steps=True) as conn:
        rows = conn.execute(
            "SELECT s.task_id, s.step_index, s.action, s.screenshot_path, s.click_x, s.click_y FROM steps s "
            "JOIN latest_task_results t USING (run_id, task_id, attempt) WHERE s.run_id = ?", [run_id]).fetchall()
    return {(r[0], r[1]): {"action": json.loads(r[2]), "screenshot": db.parent / r[3] if r[3] else None,
                           "click": (r[4], r[5])} for r in rows}


def _pixels(image: Image.Image) -> bytes:
    return image.convert("RGB").tobytes()


def test_sft_files_load_as_an_imagefolder_and_rerender_the_stored_step(bundled_run_db, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "sft"
    summary = export_training(bundled_run_db.db, EpisodeFilter(run_ids=[bundled_run_db.scripted]), "sft", out)
    stored = _stored_steps(bundled_run_db.db, bundled_run_db.scripted)
    assert summary.samples == len(stored) == summary.images and summary.episodes == 16

    import datasets  # here, not at collection (tests/installed.py)

    dataset = datasets.load_dataset("imagefolder", data_dir=str(out), split="train",
                                    cache_dir=str(tmp_path / "hf-cache"))
    assert dataset.num_rows == summary.samples
    # Re-render a click step: the image is the stored screenshot, the target the stored action.
    row = next(r for r in dataset if stored[(r["task_id"], r["step_index"])]["action"]["type"] == "click")
    step = stored[(row["task_id"], row["step_index"])]
    assert _pixels(row["image"]) == _pixels(Image.open(step["screenshot"]))
    system, user, assistant = row["messages"]
    assert format_grammar_help() in system["content"][0]["text"]
    assert CATALOG.load(row["task_id"]).instruction in user["content"][1]["text"]
    assert user["content"][0]["type"] == "image"
    action = parse_action(assistant["content"][0]["text"])
    assert action.type.value == step["action"]["type"]
    assert (action.x, action.y) == pytest.approx(step["click"])  # the element's centre, in pixels
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["task_ids"]) == sorted(t.task_id for t in CATALOG.tasks())
    assert manifest["runs"][0]["suite_fingerprint"] == CATALOG.content_hash()


def test_sft_embedded_is_openai_chat_jsonl_with_the_stored_png(bundled_run_db, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "embed"
    export_training(bundled_run_db.db, EpisodeFilter(run_ids=[bundled_run_db.scripted], domains=["notepad"]),
                    "sft", out, images="embed")
    assert not (out / "images").exists()
    import datasets  # here, not at collection (tests/installed.py)

    dataset = datasets.load_dataset("json", data_files=str(out / "train.jsonl"), split="train",
                                    cache_dir=str(tmp_path / "hf-cache"))
    stored = _stored_steps(bundled_run_db.db, bundled_run_db.scripted)
    row = dataset[0]
    url = next(part["image_url"]["url"] for part in row["messages"][1]["content"] if part["type"] == "image_url")
    png = base64.b64decode(url.removeprefix("data:image/png;base64,"))
    meta = row["metadata"]
    assert png == stored[(meta["task_id"], meta["step_index"])]["screenshot"].read_bytes()
    assert {m["role"] for m in row["messages"]} == {"system", "user", "assistant"}


def test_trajectories_hold_every_step_with_outcome_and_timings(bundled_run_db, tmp_path: Path) -> None:
    out = tmp_path / "traj"
    export_training(bundled_run_db.db, EpisodeFilter(run_ids=[bundled_run_db.scripted, bundled_run_db.random]),
                    "trajectories", out)
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 32
    with ResultStore(bundled_run_db.db, read_only=True) as store, store.reading() as conn:
        stored = {(r[0], r[1]): r[2:] for r in conn.execute(
            "SELECT run_id, task_id, outcome, score, num_steps, total_time_seconds FROM latest_task_results").fetchall()}
    for record in records:
        assert record["schema"] == TRAJECTORY_SCHEMA and record["schema_version"] == TRAJECTORY_SCHEMA_VERSION
        outcome, score, num_steps, total = stored[(record["run_id"], record["task_id"])]
        assert (record["outcome"], record["score"], len(record["steps"])) == (outcome, score, num_steps)
        assert record["timings"]["total"] == pytest.approx(total)
        assert [s["index"] for s in record["steps"]] == list(range(num_steps))
        for step in record["steps"]:
            assert (out / step["screenshot"]).is_file()
            assert parse_action(step["action_text"]).type.value == step["action"]["type"]
    assert {r["agent"] for r in records} == {"scripted", "random"}


def test_inspect_log_is_read_back_by_inspect_ai(bundled_run_db, tmp_path: Path) -> None:
    inspect_log = pytest.importorskip("inspect_ai.log")
    out = tmp_path / "inspect"
    summary = export_training(bundled_run_db.db, EpisodeFilter(run_ids=[bundled_run_db.random]), "inspect", out)
    log = inspect_log.read_eval_log(str(summary.files[0]))
    assert log.status == "success" and len(log.samples) == 16
    assert log.results.scores[0].metrics["success_rate"].value == 0.0
    sample = log.samples[0]
    assert sample.scores["waa_evaluator"].answer in {o.value for o in OutcomeKind}
    assert sample.input == CATALOG.load(sample.metadata["task_id"]).instruction
    images = [part.image for m in sample.messages if isinstance(m.content, list) for part in m.content
              if part.type == "image"]
    assert images and all((out / image).is_file() for image in images)


def test_filters_select_episodes(bundled_run_db, metrics_edge_runs, tmp_path: Path) -> None:
    both = [bundled_run_db.scripted, bundled_run_db.random]

    def count(db: Path, **kwargs) -> int:
        out = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
        return export_training(db, EpisodeFilter(**kwargs), "trajectories", out, images="none").episodes

    with ResultStore(bundled_run_db.db, read_only=True) as store, store.reading() as conn:
        failures = conn.execute("SELECT count(*) FROM latest_task_results WHERE outcome = 'agent_failure'").fetchone()[0]
        solved = conn.execute("SELECT count(*) FROM latest_task_results WHERE success").fetchone()[0]
    assert failures > 0
    assert count(bundled_run_db.db, run_ids=both, success_only=True) == solved
    assert count(bundled_run_db.db, run_ids=both, outcomes=[OutcomeKind.AGENT_FAILURE]) == failures
    assert count(bundled_run_db.db, run_ids=both, domains=["notepad"]) == 12
    assert count(bundled_run_db.db, run_ids=both, task_ids=["notepad-append-line"]) == 2
    # Edge store: "retried-task" has two attempts; the final one only, unless all attempts.
    assert count(metrics_edge_runs.db, run_ids=[metrics_edge_runs.mixed]) == 5
    assert count(metrics_edge_runs.db, run_ids=[metrics_edge_runs.mixed], final_attempts_only=False) == 7
    import datetime as dt

    with pytest.raises(ValueError, match="matches the filter"):
        count(bundled_run_db.db, run_ids=both, until=dt.date(2000, 1, 1))
    with pytest.raises(ValueError, match="matches the filter"):
        count(bundled_run_db.db, run_ids=both, models=["no-such-model"])


def test_held_out_suite_is_refused_and_nothing_is_written(bundled_run_db, tmp_path: Path) -> None:
    held = tmp_path / "held"
    held.mkdir()
    # A copy of the suite's index and two of its tasks, marked held out: the ids carry the mark.
    index = json.loads((bundled_suite_dir() / "test_all.json").read_text())
    domain, ids = next(iter(index.items()))
    (held / "test_all.json").write_text(json.dumps({domain: ids[:2]}))
    examples = held / "examples" / domain
    examples.mkdir(parents=True)
    for task_id in ids[:2]:
        (examples / f"{task_id}.json").write_text((bundled_suite_dir() / "examples" / domain / f"{task_id}.json").read_text())
    (held / SUITE_FILE).write_text("held_out = true\n")

    out = tmp_path / "out"
    selection = EpisodeFilter(run_ids=[bundled_run_db.scripted])
    with pytest.raises(LeakageError, match=f"refusing to export 2 held-out task.*{ids[0]}"):
        export_training(bundled_run_db.db, selection, "sft", out, held_out=[held])
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))

    export_training(bundled_run_db.db, selection, "trajectories", out, held_out=[held], allow_held_out=True,
                    images="none")
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(t["task_id"] for t in manifest["held_out_tasks_included"]) == sorted(ids[:2])
    # Filtering them out is the other way.
    rest = EpisodeFilter(run_ids=[bundled_run_db.scripted], task_ids=[t.task_id for t in CATALOG.tasks()
                                                                      if t.task_id not in ids[:2]])
    assert export_training(bundled_run_db.db, rest, "trajectories", tmp_path / "rest", held_out=[held],
                           images="none").episodes == 14


def test_bad_inputs_name_what_is_wrong(bundled_run_db, tmp_path: Path) -> None:
    selection = EpisodeFilter(run_ids=[bundled_run_db.scripted])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(ValueError, match="not an empty directory"):
        export_training(bundled_run_db.db, selection, "sft", tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    with pytest.raises(ValueError, match="is not an earlier training export"):
        export_training(bundled_run_db.db, selection, "sft", tmp_path / "full", overwrite=True)
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["x"]
    # An earlier export is what overwriting replaces.
    export_training(bundled_run_db.db, selection, "trajectories", tmp_path / "t", images="none")
    (tmp_path / "t" / "stale.jsonl").write_text("")
    export_training(bundled_run_db.db, selection, "trajectories", tmp_path / "t", images="none", overwrite=True)
    assert (tmp_path / "t" / "manifest.json").is_file() and not (tmp_path / "t" / "stale.jsonl").exists()
    with pytest.raises(ValueError, match="unknown export format"):
        export_training(bundled_run_db.db, selection, "csv", tmp_path / "o")  # type: ignore[arg-type]
    with pytest.raises(UnknownRunError, match="unknown run 'nope'"):
        export_training(bundled_run_db.db, EpisodeFilter(run_ids=["nope"]), "sft", tmp_path / "o")


def test_cli_export_and_its_one_line_errors(bundled_run_db, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    db = str(bundled_run_db.db)
    assert main(["export", bundled_run_db.scripted, "--db", db, "--format", "trajectories", "--out",
                 str(tmp_path / "t"), "--success-only", "--domain", "notepad", "--images", "embed"]) == 0
    assert "trajectories: 6 episode(s)" in capsys.readouterr().out
    assert main(["export", bundled_run_db.scripted, "--db", db, "--format", "sft"]) == 2
    assert "--out DIR" in capsys.readouterr().err
    assert main(["export", bundled_run_db.scripted, bundled_run_db.random, "--db", db, "--parquet",
                 str(tmp_path / "p")]) == 2
    assert "one run at a time" in capsys.readouterr().err


def test_hostile_text_and_missing_screenshots(metrics_edge_runs, tmp_path: Path) -> None:
    """The edge run's hostile reasoning stays data; a step whose screenshot is gone gives no SFT
    sample and says why, the others are exported."""
    out = tmp_path / "edge"
    summary = export_training(metrics_edge_runs.db, EpisodeFilter(run_ids=[metrics_edge_runs.mixed]),
                              "trajectories", out)
    text = (out / "trajectories.jsonl").read_text()
    assert "<script>" in text  # carried verbatim as a JSON string, never interpreted
    assert all(json.loads(line)["schema"] == TRAJECTORY_SCHEMA for line in text.splitlines())
    assert summary.images < summary.steps  # the missing screenshot is not invented
