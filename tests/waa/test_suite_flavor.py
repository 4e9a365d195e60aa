"""Suite flavours: WAA-V2's task folder is recognised (or named in arena-suite.toml), and its
suites are scored with WAA-V2's versions of the metrics that differ, through the whole pipeline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.coverage import task_coverage
from adapters.waa.evaluator.metrics import metric_for
from adapters.waa.suite_settings import read_suite_settings, suite_flavor

V2_MIRROR = Path("/work/.mirror/GAIR-NLP+WindowsAgentArena-V2/repo")
V2_TASKS = "src/win-arena-container/client/evaluation_examples_windows"
URL_SHORTCUT = "[InternetShortcut]\nURL=https://www.example.com/docs\n"


def test_flavour_comes_from_the_override_the_settings_file_or_a_v2_checkout(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert suite_flavor(plain) == "waa"
    (plain / "arena-suite.toml").write_text('flavor = "waa-v2"\n')
    assert suite_flavor(plain) == "waa-v2" and suite_flavor(plain, "waa") == "waa"
    checkout = tmp_path / "client" / "evaluation_examples_windows"
    checkout.mkdir(parents=True)
    (tmp_path / "client" / "check_setup.py").write_text("# WAA-V2's initial-state checker\n")
    assert suite_flavor(checkout) == "waa-v2"
    (plain / "arena-suite.toml").write_text('flavor = "v3"\n')
    with pytest.raises(ValueError, match="arena-suite.toml: flavor must be one of waa, waa-v2"):
        read_suite_settings(plain)
    with pytest.raises(ValueError, match="suite flavour 'v9'"):
        suite_flavor(plain, "v9")


def test_v2_metric_versions_differ_where_v2_changed_them() -> None:
    url_rule = {"type": "url", "url": "https://www.example.com/docs"}
    with pytest.raises(TypeError, match="url"):
        metric_for("is_shortcut_on_desktop", "waa")({"a.url": URL_SHORTCUT}, url_rule)
    assert metric_for("is_shortcut_on_desktop", "waa-v2")({"a.url": URL_SHORTCUT}, url_rule) == 1.0
    assert metric_for("is_shortcut_on_desktop", "waa-v2")({"a.url": "URL=https://other.example/"}, url_rule) == 0.0
    assert metric_for("is_shortcut_on_desktop", "waa-v2")({"a.lnk": "Name=Docs\n"},
                                                        {"type": "name", "name": "Docs"}) == 1.0
    with pytest.raises(TypeError):
        metric_for("is_cookie_deleted", "waa")(None, {"type": "domains", "domains": [".example.com"]})
    assert metric_for("is_cookie_deleted", "waa-v2")(None, {"type": "domains", "domains": [".example.com"]}) == 1.0
    rows = [("x", ".example.com")]
    assert metric_for("is_cookie_deleted", "waa-v2")(rows, {"type": "domains", "domains": [".example.com"]}) == 0.0
    assert metric_for("exact_match", "waa-v2") is metric_for("exact_match", "waa")


def _shortcut_suite(root: Path, flavor: str | None) -> Path:
    """One task scored by is_shortcut_on_desktop with a `url` rule (rule getters: no VM state)."""
    suite = root / (flavor or "plain")
    (suite / "examples" / "notepad").mkdir(parents=True)
    task = {"id": "shortcut-url", "snapshot": "notepad", "instruction": "Put a shortcut to the docs on the desktop.",
            "source": "test", "config": [], "trajectory": "", "related_apps": [],
            "evaluator": {"func": "is_shortcut_on_desktop",
                          "result": {"type": "rule", "rules": {"C:\\Users\\Docker\\Desktop\\docs.url": URL_SHORTCUT}},
                          "expected": {"type": "rule", "rules": {"type": "url", "url": "https://www.example.com/docs"}}}}
    (suite / "examples" / "notepad" / "shortcut-url.json").write_text(json.dumps(task))
    (suite / "test_all.json").write_text(json.dumps({"notepad": ["shortcut-url"]}))
    if flavor:
        (suite / "arena-suite.toml").write_text(f'flavor = "{flavor}"\n')
    return suite


def test_a_v2_suite_is_scored_by_v2_and_a_v1_suite_by_v1(prefect_server: None, tmp_path: Path) -> None:
    from adapters.agents import AgentOptions
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"shortcut-url": [{"done": True}]}))
    outcomes = {}
    for flavor in ("waa-v2", None):
        suite = _shortcut_suite(tmp_path, flavor)
        result = run_suite(SuiteRunConfig(suite_dir=suite, agent_options=AgentOptions(plans_path=plans), pool_size=1,
                                          db_path=tmp_path / "r.duckdb", artifacts_dir=tmp_path / "a",
                                          run_id=f"flavor-{flavor or 'waa'}"))
        outcomes[flavor or "waa"] = (result.results[0].outcome.value, result.results[0].score)
    assert outcomes["waa-v2"] == ("success", 1.0)
    assert outcomes["waa"][0] == "evaluation_error"  # WAA raises on the url rule: never an agent failure


@pytest.fixture(scope="module")
def v2_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (V2_MIRROR / "HEAD").exists() and not (V2_MIRROR / ".git").exists():
        pytest.skip(f"WAA-V2's repository is not mirrored at {V2_MIRROR}")
    root = tmp_path_factory.mktemp("waa-v2")
    archive = subprocess.run(["git", "-C", str(V2_MIRROR), "archive", "HEAD", "src/win-arena-container/client"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root / V2_TASKS


def test_every_v2_task_loads_and_is_covered(v2_tasks: Path) -> None:
    catalog = WAATaskCatalog(v2_tasks)
    coverages = [task_coverage(t) for t in catalog.tasks()]
    assert len(coverages) == 141 and all(c.supported for c in coverages), [c.reason for c in coverages if not c.supported]
    assert suite_flavor(v2_tasks) == "waa-v2"


def test_v1_against_v2_pairs_only_identical_task_definitions(v2_tasks: Path, waa_tasks_dir: Path) -> None:
    v1, v2 = WAATaskCatalog(waa_tasks_dir), WAATaskCatalog(v2_tasks)
    common = set(v1.select()) & set(v2.select())
    changed = {t for t in common if v1.load(t).fingerprint != v2.load(t).fingerprint}
    assert len(common) == 141 and len(set(v1.select()) - common) == 13  # V2 dropped the 13 infeasible tasks
    assert 0 < len(changed) < 10  # a few task files were edited; the rest pair
    assert all(v1.load(t).infeasible for t in set(v1.select()) - common)


def test_bundled_suite_is_plain_waa() -> None:
    assert suite_flavor(bundled_suite_dir()) == "waa"


def _initial_state_suite(root: Path, flavor: str | None, domain: str, launch: list[str] | None) -> Path:
    """One task of `domain` whose setup launches `launch` (or nothing: the desktop stays in front)."""
    suite = root / f"{flavor or 'waa'}-{domain}-{bool(launch)}"
    (suite / "examples" / domain).mkdir(parents=True)
    config = [{"type": "launch", "parameters": {"command": launch}}] if launch else []
    task = {"id": "starts-right", "snapshot": domain, "instruction": "Check the starting state.", "source": "test",
            "config": config, "trajectory": "", "related_apps": [],
            "evaluator": {"func": "exact_match", "result": {"type": "rule", "rules": "x"},
                          "expected": {"type": "rule", "rules": {"expected": "x"}}}}
    (suite / "examples" / domain / "starts-right.json").write_text(json.dumps(task))
    (suite / "test_all.json").write_text(json.dumps({domain: ["starts-right"]}))
    if flavor:
        (suite / "arena-suite.toml").write_text(f'flavor = "{flavor}"\n')
    return suite


def test_initial_state_problems() -> None:
    import io

    from PIL import Image, ImageDraw

    from adapters.waa.initial_state import initial_state_problem

    def png(draw: bool) -> bytes:
        image = Image.new("RGB", (1280, 800), (255, 255, 255))
        if draw:
            ImageDraw.Draw(image).rectangle((100, 100, 900, 600), fill=(20, 60, 120))
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()

    assert "desktop is in front" in initial_state_problem("chrome", png(True), "Program Manager")
    assert "screen is blank" in initial_state_problem("vs_code", png(False), "Visual Studio Code")
    assert initial_state_problem("vs_code", png(True), "main.py - Visual Studio Code") is None
    assert initial_state_problem("notepad", png(False), "Desktop") is None  # V2 does not check these domains


def test_a_failed_initial_state_is_a_setup_failure_on_v2_only(prefect_server: None, tmp_path: Path) -> None:
    from adapters.agents import AgentOptions
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig

    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"starts-right": [{"done": True}]}))
    cases = {("waa-v2", None): "setup_failure", (None, None): "success",
             ("waa-v2", ("notepad",)): "success"}  # the app opened: the check passes
    for (flavor, launch), expected in cases.items():
        suite = _initial_state_suite(tmp_path, flavor, "vs_code", list(launch) if launch else None)
        result = run_suite(SuiteRunConfig(suite_dir=suite, agent_options=AgentOptions(plans_path=plans), pool_size=1,
                                          db_path=tmp_path / "r.duckdb", artifacts_dir=tmp_path / "a",
                                          run_id=f"initial-{flavor}-{bool(launch)}"))
        got = result.results[0]
        assert got.outcome.value == expected, (flavor, launch, got.error)
        if expected == "setup_failure":
            assert "initial_state_check" in got.error and "desktop is in front" in got.error
            assert "after 3 tries" in got.error
