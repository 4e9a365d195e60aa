"""Deployment definitions, the baselines file and the model-update comparison (no server needed;
tests/deployments/test_deployments_server.py runs them against a real Prefect server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.serve import build_deployment, build_deployments
from flows.baselines import (
    BaselinesFileError,
    baseline_config,
    compare_runs,
    comparison_markdown,
    load_baselines,
    model_update_config,
    slug,
)
from flows.notify import model_updated_event
from tests.agents.fake_model_servers import FakeModelServer, openai_completion

PROJECT = Path(__file__).resolve().parents[2]


def test_deployment_defaults_round_trip() -> None:
    deployment = build_deployment()
    assert deployment.name == "on-demand" and deployment.entrypoint == "flows/baselines.py:evaluate_baseline"
    assert deployment.parameters == {"baseline": "scripted-bundled-local"}
    (baseline,) = [b for b in load_baselines(PROJECT / "deployments" / "baselines.toml") if b.name == "scripted-bundled-local"]
    config = baseline_config(baseline)
    assert config.agent == "scripted" and config.provider == "local"
    assert (config.suite_dir / "test_all.json").exists()


# What a served flow's caller (anyone who reaches the Prefect API) may choose: names only.
NAME_PARAMETERS = {"baseline", "run_id", "model", "endpoint", "checkpoint"}


def test_served_flows_take_names_not_configurations() -> None:
    import inspect

    for deployment in build_deployments():
        module, function = deployment.entrypoint.split(":")
        flow = getattr(__import__(module.removesuffix(".py").replace("/", "."), fromlist=[function]), function)
        parameters = set(inspect.signature(flow.fn).parameters)
        assert parameters <= NAME_PARAMETERS, (deployment.name, parameters - NAME_PARAMETERS)
        assert set(deployment.parameters) <= NAME_PARAMETERS


def test_build_deployments_schedule_and_trigger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARENA_NIGHTLY_TIMEZONE", "Europe/Berlin")
    by_name = {d.name: d for d in build_deployments()}
    assert set(by_name) == {"on-demand", "nightly-baselines", "on-model-update"}
    nightly = by_name["nightly-baselines"]
    assert nightly.entrypoint == "flows/baselines.py:nightly_baselines"
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "Europe/Berlin"
    on_update = by_name["on-model-update"]
    (trigger,) = on_update.triggers
    assert trigger.expect == {"model.updated"}
    assert trigger.match.model_dump() == {"prefect.resource.id": "model.*"}
    assert set(trigger.parameters) == {"model", "endpoint", "checkpoint"}
    assert "model.updated" in trigger.description and "plan-replay-local" in trigger.description
    assert on_update.parameters["baseline"] == "plan-replay-local"  # the shipped baseline that calls a model


def test_on_model_update_is_not_served_for_a_baseline_that_calls_no_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ARENA_MODEL_BASELINE", "scripted-bundled-local")
    names = {d.name for d in build_deployments()}
    assert names == {"on-demand", "nightly-baselines"}
    err = capsys.readouterr().err
    assert "on-model-update is not served: baseline 'scripted-bundled-local' runs the 'scripted' agent" in err


def test_model_template_strips_the_resource_prefix() -> None:
    """The trigger's templates give the flow the model name and the payload fields. The server
    renders a single-expression template as `{{ expr | tojson }}` and parses the JSON (so a
    missing payload field becomes None); this renders them the same way."""
    import json

    from jinja2.sandbox import SandboxedEnvironment

    from deployments.serve import MODEL_UPDATE_PARAMETERS

    event = model_updated_event("org/ckpt-7", "http://h:8000/v1", None)
    context = {"event": {"resource": {"id": event["resource"]["prefect.resource.id"]}, "payload": event["payload"]}}
    env = SandboxedEnvironment()
    rendered = {
        k: json.loads(env.from_string("{{ " + v.strip()[2:-2].strip() + " | tojson }}").render(context))
        for k, v in MODEL_UPDATE_PARAMETERS.items()
    }
    assert rendered == {"model": "org/ckpt-7", "endpoint": "http://h:8000/v1", "checkpoint": None}


def test_shipped_baselines_file_loads() -> None:
    baselines = load_baselines(PROJECT / "deployments" / "baselines.toml")
    assert [b.name for b in baselines] == ["scripted-bundled-local", "plan-replay-local"]
    demo = baselines[1]
    assert demo.agent == "openai" and demo.model_updates is not None and not demo.nightly
    config = baseline_config(baselines[0], run_id="r1")
    assert config.agent == "scripted" and config.provider == "local" and config.run_id == "r1"
    assert (config.suite_dir / "test_all.json").exists()


def test_model_update_config_replaces_model_and_endpoint(tmp_path: Path) -> None:
    file = tmp_path / "b.toml"
    file.write_text(
        'version = 1\n[[baselines]]\nname = "q"\nagent = "openai"\n'
        '[baselines.agent_options]\nmodel = "base"\nbase_url = "http://old/v1"\napi_key_env = "K"\n'
    )
    (baseline,) = load_baselines(file)
    config = model_update_config(baseline, "ckpt-9", "http://new/v1")
    assert config.agent_options.model == "ckpt-9" and config.agent_options.base_url == "http://new/v1"
    assert config.agent_options.api_key_env == "K"
    assert model_update_config(baseline, "ckpt-9").agent_options.base_url == "http://old/v1"
    assert config.model_checkpoint is None
    assert model_update_config(baseline, "ckpt-9", checkpoint="s3://c/9").model_checkpoint == "s3://c/9"
    assert baseline_config(baseline).agent_options.model == "base"


def test_a_baselines_trials_reach_its_runs(tmp_path: Path) -> None:
    file = tmp_path / "b.toml"
    file.write_text('version = 1\n[[baselines]]\nname = "s"\nagent = "scripted"\ntrials = 3\n')
    (baseline,) = load_baselines(file)
    assert baseline.trials == 3 and baseline_config(baseline).trials == 3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("version = 2\n[[baselines]]\nname='a'\nagent='scripted'\n", "'version' must be 1"),
        ("version = 1\n", "no baselines"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'gpt'\n", "baseline #1 ('a'): agent: Value error, unknown agent 'gpt'"),
        ("version = 1\n[[baselines]]\nname = 'A b'\nagent = 'scripted'\n", "baseline #1 ('A b'): name"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'scripted'\npool = 3\n", "pool: Extra inputs are not permitted"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'scripted'\n[[baselines]]\nname = 'a'\nagent = 'random'\n",
         "baseline #2 ('a'): duplicate name 'a'"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'openai'\n[baselines.agent_options]\nmodle = 'x'\n",
         "unknown agent option(s) modle"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'scripted'\nsuite = 'nowhere'\n", "has no test_all.json"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'scripted'\nprovider = 'existing'\nreset_level = 'setup'\n",
         "needs at least one WAA server URL"),
        ("version = 1\n[[baselines]\n", "not valid TOML"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'scripted'\ntrials = 0\n",
         "baseline #1 ('a'): trials: Input should be greater than or equal to 1"),
        ("version = 1\n[[baselines]]\nname = 'a'\nagent = 'scripted'\ntrials = 'three'\n", "baseline #1 ('a'): trials:"),
    ],
)
def test_load_baselines_errors_name_file_and_entry(tmp_path: Path, content: str, message: str) -> None:
    file = tmp_path / "baselines.toml"
    file.write_text(content)
    with pytest.raises(BaselinesFileError) as info:
        load_baselines(file)
    assert str(file) in str(info.value) and message in str(info.value)


def test_load_baselines_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BaselinesFileError, match="not found"):
        load_baselines(tmp_path / "absent.toml")


def _row(task_id: str, domain: str, success: bool) -> dict:
    return {"task_id": task_id, "domain": domain, "success": success, "outcome": "success" if success else "agent_failure"}


def test_compare_runs_rates_and_flips() -> None:
    base = [_row("n1", "notepad", True), _row("n2", "notepad", False), _row("s1", "settings", True), _row("old", "vlc", True)]
    new = [_row("n1", "notepad", True), _row("n2", "notepad", True), _row("s1", "settings", False), _row("x", "chrome", False)]
    c = compare_runs(base, new, "base-run", "new-run")
    rows = {d.domain: d for d in c.domains}
    assert [d.domain for d in c.domains] == ["chrome", "notepad", "settings", "vlc", "ALL"]
    assert (rows["notepad"].baseline_rate, rows["notepad"].new_rate, rows["notepad"].delta) == (0.5, 1.0, 0.5)
    assert rows["settings"].delta == -1.0
    assert rows["vlc"].new_rate is None and rows["vlc"].delta is None
    assert rows["chrome"].baseline_total == 0 and rows["chrome"].new_rate == 0.0
    assert (rows["ALL"].baseline_successes, rows["ALL"].baseline_total, rows["ALL"].new_successes) == (3, 4, 2)
    assert [f.task_id for f in c.fixed] == ["n2"] and [f.task_id for f in c.broken] == ["s1"]
    assert c.broken[0].new_outcome == "agent_failure"
    assert c.only_in_baseline == ["old"] and c.only_in_new == ["x"]
    md = comparison_markdown(c, "ckpt vs base")
    assert "| notepad | 50.0% (1/2) | 100.0% (2/2) | +50.0 pts |" in md
    assert "## Broken (succeeded before, fail now): 1" in md and "`s1` (settings)" in md


def test_compare_identical_runs_has_no_flips() -> None:
    rows = [_row("a", "d", True), _row("b", "d", False)]
    c = compare_runs(rows, rows, "r1", "r2")
    assert c.fixed == [] and c.broken == [] and c.domains[-1].delta == 0.0


def test_artifact_keys_are_lowercase_dashes() -> None:
    assert slug("Qwen/Qwen2.5-VL_7B") == "qwen-qwen2-5-vl-7b"


def test_model_updated_event_format() -> None:
    event = model_updated_event("ckpt-3", None, "s3://bucket/ckpt-3")
    assert event == {
        "event": "model.updated",
        "resource": {"prefect.resource.id": "model.ckpt-3", "prefect.resource.name": "ckpt-3"},
        "payload": {"endpoint": None, "checkpoint": "s3://bucket/ckpt-3"},
    }
    with pytest.raises(ValueError):
        model_updated_event(" ", None, None)


def test_nightly_baselines_runs_each_and_reports_failures(prefect_server: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every baseline runs (as its own subflow); a broken one ends the night Failed ("Failed
    night: ..." naming the baseline) without stopping the others."""
    import duckdb

    from flows.baselines import nightly_baselines

    db = tmp_path / "arena.duckdb"
    common = f'suite = "bundled"\ntask_ids = ["notepad-append-line"]\npool_size = 1\ndb_path = "{db}"\nartifacts_dir = "{tmp_path / "a"}"\n'
    file = tmp_path / "baselines.toml"
    file.write_text(
        f'version = 1\n[[baselines]]\nname = "broken-http"\nagent = "http"\n{common}'
        f'[[baselines]]\nname = "scripted-one"\nagent = "scripted"\n{common}'
    )
    monkeypatch.setenv("ARENA_BASELINES_FILE", str(file))  # the operator's file, not a parameter
    state = nightly_baselines(return_state=True)
    assert state.is_failed() and state.name == "Failed"  # the name Prefect's automations match
    assert state.message.startswith("Failed night: 1 of 2 baselines not completed")
    assert "broken-http: failed" in state.message
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT agent, status FROM runs").fetchall()
    assert rows == [("scripted", "completed")]


def _model_baseline(name: str, endpoint: str, db: Path, artifacts: Path, **extra: str) -> str:
    """A [[baselines]] table of the openai agent on `endpoint`, admitting ckpt-* models there."""
    lines = "".join(f"{k} = {v}\n" for k, v in extra.items())
    return (f'[[baselines]]\nname = "{name}"\nagent = "openai"\nsuite = "bundled"\npool_size = 1\n{lines}'
            f'db_path = "{db}"\nartifacts_dir = "{artifacts}"\n'
            f'[baselines.agent_options]\nmodel = "base-model"\nbase_url = "{endpoint}"\napi_key_env = "FAKE_MODEL_KEY"\n'
            f'[baselines.model_updates]\nmodels = ["ckpt-*"]\nendpoints = ["{endpoint}"]\n')


@pytest.fixture()
def model_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    """An OpenAI-compatible endpoint whose model gives up at once (FAIL), for model updates."""
    monkeypatch.setenv("FAKE_MODEL_KEY", "not-a-secret")
    with FakeModelServer("openai", default=openai_completion("FAIL()")) as server:
        server.models = ["base-model", "ckpt-003", "ckpt-004", "ckpt-fail"]
        yield server


def test_model_update_compares_with_the_named_baselines_own_run(
    prefect_server: None, tmp_path: Path, model_endpoint: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of new models never stand in for the baseline: the comparison names the baseline's
    run, found by baseline name, agent, model, suite and configuration hash stored on the run; and
    each new model is really asked (the endpoint sees its name)."""
    import duckdb

    from flows.baselines import evaluate_model_update

    db = tmp_path / "arena.duckdb"
    file = tmp_path / "baselines.toml"
    file.write_text("version = 1\n" + _model_baseline("model-one", model_endpoint.url, db, tmp_path / "a",
                                                      task_ids='["notepad-append-line"]'))
    monkeypatch.setenv("ARENA_BASELINES_FILE", str(file))
    first = evaluate_model_update("ckpt-003", baseline="model-one")
    second = evaluate_model_update("ckpt-004", endpoint=model_endpoint.url, baseline="model-one")
    with duckdb.connect(str(db), read_only=True) as con:
        runs = dict(con.execute("SELECT run_id, coalesce(baseline, '-') || '/' || coalesce(model_id, '-') FROM runs").fetchall())
    assert runs[first.baseline_run_id] == "model-one/base-model"
    assert second.baseline_run_id == first.baseline_run_id  # not the ckpt-003 run
    assert runs[first.new_run_id] == "-/ckpt-003" and runs[second.new_run_id] == "-/ckpt-004"
    asked = {r.body["model"] for r in model_endpoint.requests if r.method == "POST"}
    assert asked == {"base-model", "ckpt-003", "ckpt-004"}


def test_model_update_exports_the_new_checkpoints_failures_and_links_them(
    prefect_server: None, tmp_path: Path, model_endpoint: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ARENA_MODEL_UPDATE_EXPORT_DIR: the new run's agent failures land as trajectories under
    <dir>/<run id>, and the comparison artifact links that export."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.baselines import evaluate_model_update

    file = tmp_path / "baselines.toml"
    file.write_text("version = 1\n" + _model_baseline(
        "model-two", model_endpoint.url, tmp_path / "arena.duckdb", tmp_path / "a",
        task_ids='["notepad-append-line", "explorer-rename-file"]', max_steps="2"))
    monkeypatch.setenv("ARENA_BASELINES_FILE", str(file))
    monkeypatch.setenv("ARENA_MODEL_UPDATE_EXPORT_DIR", str(tmp_path / "failures"))
    comparison = evaluate_model_update("ckpt-fail", baseline="model-two")
    export = tmp_path / "failures" / comparison.new_run_id
    records = [json.loads(line) for line in (export / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == ["explorer-rename-file", "notepad-append-line"]
    assert {r["outcome"] for r in records} == {"agent_failure"} and all(r["steps"] for r in records)
    assert json.loads((export / "manifest.json").read_text())["runs"][0]["run_id"] == comparison.new_run_id
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["model-update-model-two"])))
    assert any("Failures exported for training**: 2 episode(s)" in (a.data or "") and export.as_uri() in a.data
               for a in artifacts)


def _baselines(tmp_path: Path, endpoint: str) -> Path:
    file = tmp_path / "baselines.toml"
    file.write_text(
        "version = 1\n" + _model_baseline("model-one", endpoint, tmp_path / "db.duckdb", tmp_path / "a")
        + '[[baselines]]\nname = "scripted-one"\nagent = "scripted"\nsuite = "bundled"\n'
    )
    return file


@pytest.mark.parametrize("baseline, model, endpoint, refusal", [
    ("scripted-one", "ckpt-1", None, "runs the 'scripted' agent, which calls no model"),
    ("model-one", "other-model", None, "matches none of the admitted models ['ckpt-*']"),
    ("model-one", "ckpt-1", "http://attacker.example:8000/v1", "is not one of the admitted endpoints"),
    ("model-one", "ckpt-1\nDROP", None, "is not a model name"),
    ("model-one", "../../etc", None, "is not a model name"),
])
def test_a_model_update_the_baseline_does_not_admit_is_refused_naming_it(
    tmp_path: Path, baseline: str, model: str, endpoint: str | None, refusal: str
) -> None:
    from flows.baselines import ModelUpdateRefused, find_baseline

    chosen = find_baseline(load_baselines(_baselines(tmp_path, "http://gpu-host:8000/v1")), baseline)
    with pytest.raises(ModelUpdateRefused) as caught:
        chosen.check_model_update(model, endpoint, None)
    assert refusal in str(caught.value) and f"baseline {baseline!r}" in str(caught.value)
    model_one = find_baseline(load_baselines(_baselines(tmp_path, "http://gpu-host:8000/v1")), "model-one")
    model_one.check_model_update("ckpt-7", "http://gpu-host:8000/v1/", "s3://ckpts/7")  # admitted


def test_model_updates_on_an_agent_without_a_model_are_a_file_error(tmp_path: Path) -> None:
    file = tmp_path / "baselines.toml"
    file.write_text('version = 1\n[[baselines]]\nname = "s"\nagent = "scripted"\nsuite = "bundled"\n'
                    '[baselines.model_updates]\nmodels = ["x"]\n')
    with pytest.raises(BaselinesFileError, match="model_updates on the 'scripted' agent, which calls no model"):
        load_baselines(file)


def test_scheduled_nights_are_named_as_the_nights_that_ran(prefect_server: None, own_prefect_server: str) -> None:
    """Prefect's scheduler creates upcoming runs under generated names; the serve process renames
    them from their scheduled time as the flow names a night (deployments/scheduled_names.py)."""
    import datetime as dt

    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    from deployments.scheduled_names import name_scheduled_runs
    from deployments.serve import build_nightly_deployment
    from flows.baselines import nightly_run_name

    deployment_id = build_nightly_deployment().apply()
    when = dt.datetime(2030, 1, 2, 2, 0, tzinfo=dt.timezone.utc)
    with get_client(sync_client=True) as client:
        runs = [client.create_flow_run_from_deployment(deployment_id, state=Scheduled(scheduled_time=when + dt.timedelta(days=k)))
                for k in range(2)]
        assert not any(r.name.startswith("nightly-") for r in runs)  # Prefect's generated names
        assert name_scheduled_runs(client, "nightly-baselines/nightly-baselines", nightly_run_name) == 2
        assert [client.read_flow_run(r.id).name for r in runs] == ["nightly-2030-01-02-0200utc",
                                                                     "nightly-2030-01-03-0200utc"]
        assert name_scheduled_runs(client, "nightly-baselines/nightly-baselines", nightly_run_name) == 0
