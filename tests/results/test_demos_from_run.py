"""`arena demos build --from-run`: a library built from the scripted run loads with the library's
own loader, lets the demo agent solve the suite against a model that only follows the demo in its
prompt, keeps provenance, and never holds (so never hands out) a held-out task's demo."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from fake_model_servers import FakeModelServer, RecordedRequest, element_id, openai_completion, user_text  # noqa: E402

from adapters.agents.demos import LexicalDemoRetriever, load_demo_library  # noqa: E402
from adapters.benchmark import ActionType, BenchmarkAction  # noqa: E402
from adapters.training.demo_builder import PROVENANCE, DemoBuildError, build_demo_library, demo_step_text  # noqa: E402
from adapters.training.suites import SUITE_FILE  # noqa: E402
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir  # noqa: E402

CATALOG = WAATaskCatalog(bundled_suite_dir())
_STEP = re.compile(r'^(CLICK|DOUBLE_CLICK|RIGHT_CLICK) the (\S+) (".*")$')


def follow_the_demo(request: RecordedRequest) -> dict:
    """A model that does exactly what the demonstration in its prompt says, step by step: the
    next demo step after as many as the prompt lists under "Previous actions"."""
    text = user_text(request)
    steps_block = text.split("Steps:\n", 1)[1].split("\n\n", 1)[0]
    steps = [re.sub(r"^\d+\. ", "", line) for line in steps_block.splitlines()]
    history = text.split("Previous actions:\n", 1)[1].split("\n\n", 1)[0]
    done = 0 if history.startswith("(none yet)") else len(re.findall(r"^\d+\. ", history, re.M))
    step = steps[min(done, len(steps) - 1)]
    match = _STEP.match(step)
    if match:
        reply = f"{match.group(1)}([{element_id(text, match.group(2), json.loads(match.group(3)))}])"
    elif step.startswith("TYPE "):
        reply = f"TYPE({step[5:]})"
    elif step.startswith("PRESS "):
        reply = f'KEY("{step[6:]}")'
    else:
        reply = f"{step}()"
    return openai_completion(f"Following the demonstration, step {done + 1}.\n{reply}")


def _held_out_suite(root: Path, task_id: str) -> Path:
    """A suite folder holding one bundled task, marked held out."""
    domain = CATALOG.load(task_id).domain
    (root / "examples" / domain).mkdir(parents=True)
    (root / "test_all.json").write_text(json.dumps({domain: [task_id]}))
    source = bundled_suite_dir() / "examples" / domain / f"{task_id}.json"
    (root / "examples" / domain / f"{task_id}.json").write_text(source.read_text())
    (root / SUITE_FILE).write_text("held_out = true\n")
    return root


def test_demo_step_lines() -> None:
    click = BenchmarkAction(type=ActionType.CLICK, target_node_id="7", target_role="Button", target_name='Say "hi"')
    assert demo_step_text(click) == 'CLICK the Button "Say \\"hi\\""'
    assert demo_step_text(BenchmarkAction(type=ActionType.CLICK, target_node_id="7"), (640.0, 400.5)) == \
        "CLICK at (640, 400.5)"
    assert demo_step_text(BenchmarkAction(type=ActionType.KEY, key="s", modifiers=["ctrl"])) == "PRESS ctrl+s"
    assert demo_step_text(BenchmarkAction(type=ActionType.TYPE, text="a\nb")) == 'TYPE "a\\nb"'
    with pytest.raises(DemoBuildError, match="neither an element nor a point"):
        demo_step_text(BenchmarkAction(type=ActionType.CLICK, target_node_id="7"))


def test_library_from_the_scripted_run_solves_the_suite_and_keeps_held_out_tasks_out(
        bundled_run_db, tmp_path: Path) -> None:
    from adapters.agents import AgentOptions
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    held_task = "notepad-append-line"
    held = _held_out_suite(tmp_path / "held", held_task)
    library = tmp_path / "library"
    summary = build_demo_library(bundled_run_db.db, [bundled_run_db.scripted, bundled_run_db.random], library,
                                 held_out=[held])
    demos = load_demo_library(library)
    feasible = [t.task_id for t in CATALOG.tasks() if not t.infeasible]
    # One demo per solved feasible task (the random run solved nothing: no duplicate), none held out.
    assert sorted(d.source_task_id for d in demos) == sorted(t for t in feasible if t != held_task)
    assert any(held_task in line and "held out" in line for line in summary.skipped)
    provenance = [json.loads(line) for line in (library / PROVENANCE).read_text().splitlines()]
    assert {p["run_id"] for p in provenance} == {bundled_run_db.scripted}
    assert all(p["suite_fingerprint"] == CATALOG.content_hash() for p in provenance)

    # The held-out task's demo is never retrieved, whatever the retriever is allowed.
    for allow in (False, True):
        retriever = LexicalDemoRetriever(demos, allow_same_task=allow)
        assert all(d.source_task_id != held_task for d in retriever.retrieve(CATALOG.load(held_task), k=len(demos)))
    # Without permission, no task ever gets its own recording.
    strict = LexicalDemoRetriever(demos)
    for task in CATALOG.tasks():
        assert all(d.source_task_id != task.task_id for d in strict.retrieve(task, k=3))

    # With permission, a model that merely follows the demo solves every task that has one.
    solvable = [t for t in feasible if t != held_task]
    with FakeModelServer("openai") as server:
        server.add(*[follow_the_demo] * 200)
        outcome = run_suite(SuiteRunConfig(
            agent="demo",
            agent_options=AgentOptions(model="gpt-test", base_url=server.url, observation="a11y_tree",
                                       demo_library=library, demo_allow_same_task=True),
            task_ids=solvable, pool_size=2, db_path=tmp_path / "demo.duckdb", artifacts_dir=tmp_path / "artifacts",
            run_id="demo-from-run",
        ))
    assert {r.task_id: r.outcome.value for r in outcome.results} == {t: "success" for t in solvable}


def test_build_refuses_what_it_cannot_make(bundled_run_db, tmp_path: Path) -> None:
    with pytest.raises(DemoBuildError, match="no successful episode"):
        build_demo_library(bundled_run_db.db, [bundled_run_db.random], tmp_path / "none")
    assert not (tmp_path / "none").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.json").write_text("{}")
    with pytest.raises(DemoBuildError, match="not an empty directory"):
        build_demo_library(bundled_run_db.db, [bundled_run_db.scripted], tmp_path / "busy")
    assert (tmp_path / "busy" / "mine.json").read_text() == "{}"
    with pytest.raises(DemoBuildError, match="is not an earlier demo library"):
        build_demo_library(bundled_run_db.db, [bundled_run_db.scripted], tmp_path / "busy", overwrite=True)
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["mine.json"]
    # An earlier library is what overwriting replaces.
    first = build_demo_library(bundled_run_db.db, [bundled_run_db.scripted], tmp_path / "lib")
    (tmp_path / "lib" / "stale.json").write_text("{}")
    again = build_demo_library(bundled_run_db.db, [bundled_run_db.scripted], tmp_path / "lib", overwrite=True)
    assert len(again.demos) == len(first.demos) and not (tmp_path / "lib" / "stale.json").exists()


def test_cli_demos_build(bundled_run_db, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    out = tmp_path / "lib"
    assert main(["demos", "build", "--from-run", bundled_run_db.scripted, "--out", str(out),
                 "--db", str(bundled_run_db.db)]) == 0
    printed = capsys.readouterr().out
    assert "14 demo(s)" in printed and "infeasible task" in printed and "--demo-library" in printed
    assert len(load_demo_library(out)) == 14
