"""A fast `arena`: building the parser and parsing any command's options import no Prefect,
pydantic or DuckDB, and the commands that run no flow never import Prefect.

Each check runs in a fresh interpreter, as `arena` does, and looks at `sys.modules` afterwards.
The start-up time itself is measured by bench/cli_startup.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Prints the modules loaded after `code` ran (SystemExit from --help included).
_PROBE = """
import json, sys
try:
    {code}
except SystemExit:
    pass
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def _output_and_modules_after(code: str, cwd: Path = ROOT) -> tuple[str, set[str]]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(code=code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    marker = done.stdout.rindex("MODULES ")
    return done.stdout[:marker], set(json.loads(done.stdout[marker + len("MODULES "):]))


def _modules_after(code: str, cwd: Path = ROOT) -> set[str]:
    return _output_and_modules_after(code, cwd)[1]


def _top(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_arena_help_imports_no_heavy_package() -> None:
    modules = _modules_after("from flows.cli import main; main(['--help'])")
    assert not _top(modules) & {"prefect", "pydantic", "duckdb", "requests", "flask", "PIL"}, sorted(modules)
    assert not {m for m in modules if m.startswith("adapters.") and m not in {
        "adapters.interrupts", "adapters.secrets", "adapters.store_location", "adapters.vms", "adapters.vms.defaults"}}
    assert len(modules) < 200, len(modules)  # was 1,467 with Prefect


@pytest.mark.parametrize(("command", "listed"), [
    ("run", ["noisy-scripted", "azure", "kvm", "reboot"]),  # agents, providers, reset levels
    ("doctor", ["claude", "http"]),
    ("export", ["infrastructure_error", "setup_failure"]),  # outcome kinds
])
def test_a_commands_help_lists_its_choices_without_loading_what_they_name(command: str, listed: list[str]) -> None:
    """The choices come from their tables (the agents', the providers', the outcome kinds'); the
    agents' and providers' own modules, with their cloud settings, SDKs and HTTP client, load
    only when one is built (`arena run --help` took 0.45-0.64 s with them, 0.22-0.25 s without)."""
    shown, modules = _output_and_modules_after(f"from flows.cli import main\n    main([{command!r}, '--help'])")
    assert all(name in shown for name in listed), shown
    heavy = {"prefect", "duckdb", "requests", "pydantic_settings", "boto3", "azure", "anthropic", "openai", "flask"}
    assert not _top(modules) & heavy, sorted(_top(modules) & heavy)
    named = {m for m in modules if m.startswith(("adapters.agents.", "adapters.vms."))}
    assert named <= {"adapters.vms.base", "adapters.vms.defaults", "adapters.vms.registry"}, sorted(named)
    if command == "export":
        assert "pydantic" not in _top(modules)


# Every leaf command, with the arguments it requires: parsing them loads no Prefect.
COMMANDS = [
    ["run"], ["localenv"], ["probe", "http://127.0.0.1:5000"], ["notify", "model-updated", "m"], ["status"],
    ["janitor"], ["pool", "up", "--provider", "aws", "--name", "n", "--size", "1"],
    ["pool", "status", "--provider", "aws", "--name", "n"], ["doctor", "--agent", "openai"], ["plan"],
    ["report", "latest"], ["compare", "a", "b"], ["history"], ["export", "r", "--out", "d"],
    ["demos", "build", "--from-run", "r", "--out", "d"], ["sql", "SELECT 1"], ["store", "migrate", "f.duckdb"],
    ["tasks", "list"], ["tasks", "coverage"], ["tasks", "lint", "d"], ["tasks", "new", "--list"], ["tasks", "stability"],
    ["image", "status", "n", "--provider", "aws"],
]


def test_every_command_is_covered() -> None:
    from flows.cli import build_parser
    from flows.cli.common import subcommands

    def leaves(parser: object, path: list[str]) -> list[list[str]]:
        nested = subcommands(parser)  # type: ignore[arg-type]
        return [leaf for name, sub in nested.items() for leaf in leaves(sub, [*path, name])] if nested else [path]

    covered = {tuple(c[:2]) if c[0] in {"notify", "pool", "demos", "store", "tasks", "image"} else (c[0],)
               for c in COMMANDS}
    assert {tuple(leaf) for leaf in leaves(build_parser(), [])} - covered <= {("pool", "down"), ("image", "build")}


def test_parsing_any_command_imports_no_prefect() -> None:
    code = "from flows.cli import build_parser\n    p = build_parser()\n" + "".join(
        f"    p.parse_args({argv!r})\n" for argv in COMMANDS)
    modules = _modules_after(code)
    assert "prefect" not in _top(modules), sorted(m for m in modules if m.startswith("prefect"))[:5]


@pytest.mark.parametrize("argv", [
    ["tasks", "list"],
    ["tasks", "coverage"],
    ["plan", "--db", "none.duckdb"],
    ["sql", "SELECT count(*) FROM runs", "--db", "r.duckdb"],
    ["report", "latest", "--db", "r.duckdb"],
])
def test_commands_that_run_no_flow_never_import_prefect(argv: list[str], tmp_path: Path) -> None:
    from adapters.store import ResultStore, RunInfo

    with ResultStore(tmp_path / "r.duckdb") as store:
        store.start_run(RunInfo(run_id="r1", agent="scripted", suite="x"))
    modules = _modules_after(f"from flows.cli import main\n    assert main({argv!r}) == 0, 'exit status'", cwd=tmp_path)
    assert "prefect" not in _top(modules)


@pytest.mark.parametrize("argv", [["run"], ["run", "--agent", "scripted", "--domain", "notepad", "--trials", "2"]])
def test_a_runs_checks_come_before_prefect(argv: list[str], tmp_path: Path) -> None:
    """`arena run` checks its configuration (the suite, the paths, the agent) before Prefect is
    imported, so that the local Prefect server can start while it imports Prefect; a module of
    the configuration that pulled Prefect in (flows/run_config.py did, through the attempt's
    stage limits) would put the server's start after those imports again."""
    code = ("from flows.cli import build_parser\n    from flows.cli.run import _config\n"
            "    from adapters.agents import build_agent\n"
            f"    config = _config(build_parser().parse_args({argv!r}))\n    config.preflight()\n"
            "    build_agent(config.agent, config.resolved_agent_options())")
    modules = _modules_after(code, cwd=tmp_path)
    assert "prefect" not in _top(modules), sorted(m for m in modules if m.startswith("prefect"))[:5]
    assert "flows.run_config" in modules and "adapters.waa.catalog" in modules  # the checks did run


def test_the_local_servers_supervisor_does_not_import_prefect() -> None:
    """The supervisor (`python -m flows.local_server`) only starts the server's process: importing
    Prefect there cost about a second of every stopped server's start."""
    modules = _modules_after("from flows.local_server import server_command\n    server_command(4200, 3)")
    assert "prefect" not in _top(modules), sorted(m for m in modules if m.startswith("prefect"))[:5]
