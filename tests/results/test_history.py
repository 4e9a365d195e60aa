"""A baseline's history (adapters/results/history.py): nights with trial-aware intervals, the change
test (exact, conditional on each task's trials), flips, configuration notes, unpriced nights, the
`arena history` command and its HTML with charts; and ten real nights of a baseline run through the
pipeline, one of them with a domain broken on purpose."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkResult, ModelUsage, OutcomeKind
from adapters.results.history import baseline_history, flag_changes, night_change, Night, TaskNight
from adapters.store import ResultStore, RunInfo

DOMAINS = {"notepad": 6, "settings": 5, "file_explorer": 5}
START = dt.datetime(2026, 12, 1, 2, 0)


def _tasks() -> list[tuple[str, str]]:
    return [(domain, f"{domain}-{i}") for domain, count in DOMAINS.items() for i in range(count)]


def _record_night(store: ResultStore, night: int, solved: dict[str, list[bool]], *, baseline: str = "nightly-b",
                  fingerprint: dict[str, str] | None = None, model_calls: int = 0, cost: float | None = 0.0,
                  infra: int = 0, agent_config: dict | None = None) -> str:
    run_id = f"night-{night:02d}"
    started = START + dt.timedelta(days=night)
    store.start_run(RunInfo(run_id=run_id, agent="scripted", suite="s", baseline=baseline, started_at=started,
                            agent_config=agent_config or {}, run_config={"trigger": "nightly"},
                            task_count=len(solved)))
    for task_id, trials in solved.items():
        domain = task_id.rsplit("-", 1)[0]
        attempt = 1
        for _ in range(infra if task_id == next(iter(solved)) else 0):
            store.record_result(run_id, BenchmarkResult(task_id=task_id, domain=domain, attempt=attempt,
                                                        outcome=OutcomeKind.INFRASTRUCTURE_ERROR))
            attempt += 1
        for trial, success in enumerate(trials, start=1):
            usage = ModelUsage(calls=model_calls, cost_usd=cost if cost is not None else 0.0)
            result = BenchmarkResult(
                task_id=task_id, domain=domain, attempt=attempt, trial=trial, success=success, score=float(success),
                outcome=OutcomeKind.SUCCESS if success else OutcomeKind.AGENT_FAILURE, usage=usage,
                task_fingerprint=(fingerprint or {}).get(task_id, "v1"))
            if cost is None:  # a model without a price: its cost is not known (NULL)
                result = result.model_copy(update={"usage": usage.model_copy(update={"cost_usd": None})})
            store.record_result(run_id, result)
            attempt += 1
    with store.writing() as conn:
        conn.execute("UPDATE runs SET status = 'completed', finished_at = ? WHERE run_id = ?",
                     [started + dt.timedelta(minutes=12 + night), run_id])
    return run_id


def _all(value: bool, broken_domain: str | None = None, trials: int = 1) -> dict[str, list[bool]]:
    return {task: [value and domain != broken_domain] * trials for domain, task in _tasks()}


def test_ten_nights_one_broken_domain_is_flagged_and_no_other(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    with ResultStore(db) as store:
        for night in range(1, 11):
            _record_night(store, night, _all(True, "notepad" if night == 6 else None))
    history = baseline_history(db, "nightly-b")
    assert [n.run_id for n in history.changes] == ["night-06"]
    change = history.nights[5].change
    assert change is not None and change.kind == "regression" and change.continuing_since is None
    assert change.looked_at == [f"night-{i:02d}" for i in range(1, 6)] and change.observed == 10
    # The next nights are held to the good ones, not to the broken night.
    assert all(n.change is None for n in history.nights[6:])
    assert history.nights[5].rate == pytest.approx(10 / 16)
    assert {d.domain: d.rate for d in history.nights[5].domains} == {"file_explorer": 1.0, "notepad": 0.0,
                                                                     "settings": 1.0}
    assert history.since_previous is not None and not history.since_previous.broken
    # Night 7 fixed the notepad tasks again: flips between night 6 and 7.
    assert len(baseline_history(db, "nightly-b", until="night-07").since_previous.fixed) == 6


def test_a_regression_that_stays_is_flagged_once_then_continuing(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    with ResultStore(db) as store:
        for night in range(1, 9):
            _record_night(store, night, _all(True, "settings" if night >= 5 else None))
    history = baseline_history(db, "nightly-b")
    assert [n.run_id for n in history.changes] == ["night-05"]
    assert [n.change.continuing_since for n in history.nights[5:]] == ["night-05"] * 3
    # Since the last good night (night 4), the settings tasks broke.
    assert history.since_last_good is not None and history.since_last_good.since == "night-04"
    assert sorted(f.task_id for f in history.since_last_good.broken) == [f"settings-{i}" for i in range(5)]


def test_nights_with_trials_have_trial_aware_intervals(tmp_path: Path) -> None:
    pytest.importorskip("scipy")
    db = tmp_path / "arena.duckdb"
    rng = random.Random(3)
    with ResultStore(db) as store:
        for night in range(1, 4):
            _record_night(store, night, {task: [rng.random() < 0.7 for _ in range(3)] for _, task in _tasks()})
    history = baseline_history(db, "nightly-b")
    night = history.nights[-1]
    assert night.trials_per_task == 3 and night.interval_method == "trials, tasks like these"
    # Trials of a task are not independent draws: the interval is wider than Wilson over trials.
    from adapters.results.stats import wilson_interval

    naive = wilson_interval(night.solved, 3 * len(night.tasks))
    assert night.interval[1] - night.interval[0] > naive[1] - naive[0]


def test_the_change_test_keeps_its_level_for_a_noisy_agent() -> None:
    """Equal nights of an agent whose tasks succeed with random probabilities: false flags at
    most about alpha (the exact conditional test is conservative where it is discrete)."""
    rng = random.Random(11)
    flagged = tested = 0
    for _ in range(150):
        probabilities = [rng.random() for _ in range(20)]
        nights = [Night(run_id=f"n{k}", started_at=None, finished_at=None, status="completed", trigger=None,
                        agent=None, model_id=None, agent_config_hash=None, selected=20, trials_per_task=1,
                        tasks=[TaskNight(task_id=f"t{i}", domain="d", trials=1, successes=int(rng.random() < p))
                               for i, p in enumerate(probabilities)]) for k in range(8)]
        flag_changes(nights, window=7)
        tested += 7
        flagged += sum(1 for n in nights[1:] if n.change is not None)
    assert flagged / tested <= 0.07, flagged / tested


def test_a_task_of_another_version_is_not_compared_and_configuration_changes_are_noted(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    with ResultStore(db) as store:
        for night in range(1, 4):
            _record_night(store, night, _all(True))
        changed = {task: "v2" for _, task in _tasks() if task.startswith("notepad")}
        _record_night(store, 4, _all(True, "notepad"), fingerprint=changed, agent_config={"temperature": 0.5})
    history = baseline_history(db, "nightly-b")
    assert history.nights[-1].change is None  # the notepad tasks changed version: not held to the old ones
    assert len(history.since_previous.changed_versions) == 6 and not history.since_previous.broken
    assert any("agent_config_hash differ" in note for note in history.notes)
    assert any("6 task(s) changed version" in note for note in history.notes)


def test_cost_duration_infrastructure_and_unpriced_nights(tmp_path: Path) -> None:
    db = tmp_path / "arena.duckdb"
    with ResultStore(db) as store:
        _record_night(store, 1, _all(True), model_calls=3, cost=0.01, infra=2)
        _record_night(store, 2, _all(True), model_calls=3, cost=None)
    first, second = baseline_history(db, "nightly-b").nights
    assert first.cost_usd == pytest.approx(0.16) and first.infrastructure_errors == 2
    assert first.duration_seconds == 13 * 60
    assert second.cost_usd is None and "without a known price" in second.cost_note


def test_arena_history_prints_flags_exits_1_on_a_regression_and_writes_charts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    from flows.cli import main

    db = tmp_path / "arena.duckdb"
    with ResultStore(db) as store:
        for night in range(1, 6):
            _record_night(store, night, _all(True, "file_explorer" if night == 5 else None))
    page = tmp_path / "history.html"
    assert main(["history", "nightly-b", "--db", str(db), "--html", str(page)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION (p=" in out and "4 nights" in out
    assert "flipped since the previous night (night-04):" in out and "broken (5)" in out
    text = page.read_text()
    assert text.count("<svg") == 3 and "<script" not in text and "http" not in text.split("<body>")[1][:200]
    assert main(["history", "--db", str(db)]) == 0
    assert "nightly-b: 5 run(s)" in capsys.readouterr().out
    assert main(["history", "nope", "--db", str(db)]) == 2
    assert "no run of baseline 'nope'; baselines with runs: nightly-b (5)" in capsys.readouterr().err


def test_night_change_needs_a_past() -> None:
    night = Night(run_id="n", started_at=None, finished_at=None, status="completed", trigger=None, agent=None,
                  model_id=None, agent_config_hash=None, selected=1, trials_per_task=1,
                  tasks=[TaskNight(task_id="t", domain="d", trials=1, successes=0)])
    assert night_change(night, []) is None
    assert json.loads(night.model_dump_json())["run_id"] == "n"


@pytest.mark.scenario
def test_nights_of_a_baseline_run_through_the_pipeline_flag_the_broken_one(
        prefect_server: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Six nights of a baseline on the local environment, the fifth with its notepad tasks broken
    on purpose (their solution plans replaced by giving up): `arena history` flags that night and
    no other, and names the tasks that flipped."""
    from adapters.agents import AgentOptions
    from adapters.waa.catalog import bundled_suite_dir
    from flows.cli import main
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    tasks = ["notepad-append-line", "notepad-draft-documents", "notepad-replace-notes",
             "settings-notifications-off", "settings-storage-sense-on"]
    plans = json.loads((bundled_suite_dir() / "solutions.json").read_text())
    broken = tmp_path / "broken-plans.json"
    broken.write_text(json.dumps({k: ([{"done": True}] if k.startswith("notepad") else v) for k, v in plans.items()}))
    db = tmp_path / "arena.duckdb"
    for night in range(1, 7):
        options = AgentOptions(plans_path=broken) if night == 5 else AgentOptions()
        outcome = run_suite(SuiteRunConfig(task_ids=tasks, pool_size=2, db_path=db, artifacts_dir=tmp_path / "art",
                                           run_id=f"hist-{night}", baseline="hist", trigger="nightly",
                                           agent_options=options))
        assert outcome.status == "completed"
    history = baseline_history(db, "hist")
    assert [n.run_id for n in history.changes] == ["hist-5"] and history.nights[4].change.kind == "regression"
    assert main(["history", "hist", "--db", str(db), "--nights", "5"]) == 0  # the latest night is fine
    out = capsys.readouterr().out
    assert "hist-5" in out and "REGRESSION" in out
    since = baseline_history(db, "hist", until="hist-5").since_previous
    assert sorted(f.task_id for f in since.broken) == sorted(t for t in tasks if t.startswith("notepad"))
    # The broken night's HTML report: the baseline's history up to it, and its flipped tasks'
    # episodes as videos the page plays (the video extra).
    pytest.importorskip("imageio_ffmpeg")
    from flows.cli.results import write_run_report

    _, page = write_run_report(db, "hist-5", tmp_path / "hist-5.html", videos=True)
    html = page.read_text()
    assert "History of baseline hist" in html and "REGRESSION" in html
    assert html.count('<video class="episode"') == 3 and "data:video/mp4;base64," in html
    assert "media-src data:" in html
    _, plain = write_run_report(db, "hist-6", tmp_path / "hist-6.html")  # what `arena run` writes: no videos
    assert "<video" not in plain.read_text() and "History of baseline hist" in plain.read_text()
