"""What `arena` prints a user can act on at once: hints that work when pasted as printed, errors
that name the option, a short usage with "did you mean" for a misspelling, a complete run that
says so, and `arena localenv` on its own."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli import build_parser, main
from flows.cli.common import invoked_as
from flows.cli.run import rerun_command
from ports import server_port

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("argv, usage, says", [
    (["run", "--pol-size", "2"], "usage: arena run [options]",
     "arena run: error: unrecognized arguments: --pol-size 2; did you mean --pool-size?"),
    (["run", "--agent", "clade"], "usage: arena run [options]", "did you mean claude?"),
    (["rn"], "usage: arena COMMAND ...", "arena: error: unknown command 'rn' (choose from 'run', "),
    (["tasks", "lst"], "usage: arena tasks COMMAND ...",
     "arena tasks: error: unknown command 'lst' (choose from 'list', 'new', 'lint', 'coverage', 'stability'); did you mean list?"),
    (["report", "latest", "--dbb", "x.duckdb"], "usage: arena report [options] run", "did you mean --db?"),
    (["export", "r", "--format", "parket", "--out", "o"], "usage: arena export [options] run", "did you mean parquet?"),
])
def test_a_misspelling_gets_one_usage_line_and_a_suggestion(
    argv: list[str], usage: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _error_of(argv, capsys)
    assert len(lines) == 2, lines  # not the 27 lines of every option
    assert lines[0].startswith(usage) and "--help shows all" in lines[0], lines
    assert says in lines[1], lines
    if argv == ["rn"]:
        assert lines[1].endswith("did you mean run?")


def test_nothing_close_suggests_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _error_of(["run", "--agent", "zzzzzz"], capsys)
    assert "did you mean" not in lines[1] and "invalid choice: 'zzzzzz'" in lines[1]


@pytest.mark.parametrize("argv, says", [
    (["--pool-size", "0"], "arena: error: --pool-size 0: Input should be greater than or equal to 1"),
    (["--max-steps", "0"], "arena: error: --max-steps 0: Input should be greater than or equal to 1"),
    (["--episode-timeout", "-1"], "arena: error: --episode-timeout -1.0: Input should be greater than 0"),
    (["--max-cost", "-5"], "arena: error: --max-cost -5.0: Input should be greater than or equal to 0"),
    (["--waa-url", "http://127.0.0.1:9"],
     "arena: error: existing WAA servers cannot be reset at level 'snapshot'; use 'setup'"),
    (["--server-wait", "0"], "arena: error: --server-wait 0.0: Input should be greater than 0"),
])
def test_run_errors_name_the_option_not_the_field(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1, err
    assert "settings:" not in err and "Value error" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_run_field_table_names_real_options() -> None:
    from adapters.agents import AgentOptions
    from flows.cli.run import FIELD_OPTIONS
    from flows.run_config import SuiteRunConfig

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # noqa: SLF001
    options = {o for action in run._actions for o in action.option_strings}  # noqa: SLF001
    assert set(FIELD_OPTIONS.values()) <= options
    fields = set(SuiteRunConfig.model_fields) | set(AgentOptions.model_fields)
    assert set(FIELD_OPTIONS) <= fields


def test_existing_output_names_the_overwrite_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from adapters.store import ResultStore, RunInfo

    db = tmp_path / "r.duckdb"
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="r1", agent="scripted", suite="x"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "runs.parquet").write_text("an earlier export")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine")
    for argv in (["export", "r1", "--parquet", str(tmp_path / "out")],
                 ["export", "r1", "--format", "trajectories", "--out", str(tmp_path / "full")],
                 ["demos", "build", "--from-run", "r1", "--out", str(tmp_path / "full")]):
        assert main([*argv, "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("arena: error: ") and "add --overwrite to replace" in err, err
        assert "overwrite=True" not in err and err.count("\n") == 1
    assert (tmp_path / "out" / "runs.parquet").read_text() == "an earlier export"
    assert (tmp_path / "full" / "keep").read_text() == "mine"

    # --overwrite replaces an earlier export or library only: `--out . --overwrite` in a project
    # folder deleted the project. Any other directory, or a file, is refused and left as it was.
    (tmp_path / "file").write_text("mine too")
    for argv, kind in ((["export", "r1", "--format", "trajectories"], "training export (no manifest.json in it)"),
                       (["demos", "build", "--from-run", "r1"], "demo library (no provenance.jsonl in it)")):
        assert main([*argv, "--out", str(tmp_path / "full"), "--overwrite", "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert err == (f"arena: error: {tmp_path / 'full'} holds files and is not an earlier {kind}; overwriting "
                       "replaces only one of those, so give a new or empty directory\n"), err
        assert main([*argv, "--out", str(tmp_path / "file"), "--overwrite", "--db", str(db)]) == 2
        assert f"{tmp_path / 'file'} is a file; give a new or empty directory" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["keep"]
    assert (tmp_path / "file").read_text() == "mine too"


def test_the_rerun_hint_repeats_every_option_given() -> None:
    parser = build_parser()
    argv = ["run", "--task", "a b", "--task", "c", "--db", "x/r.duckdb", "--artifacts", "x/art", "--quirks",
            "--settle", "3", "--agent", "random", "--seed", "0", "--stage-timeout", "setup=5", "--pool"]
    argv += ["2"]  # an abbreviation argparse accepts: the hint spells the option out
    args = parser.parse_args(argv)
    args.command_parser = parser.command_parser(args)
    hint = rerun_command(args, "r-1")
    words = shlex.split(hint)
    assert words[0] == "arena" and "--pool-size" in words and "--run-id" in words
    again = parser.parse_args(words[1:])
    expected = parser.parse_args([*argv, "--run-id", "r-1"])
    assert vars(again) == vars(expected)


def test_hints_name_the_command_as_it_was_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "venv bin" / "arena"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(script), "run"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert invoked_as() == shlex.quote(str(script))  # not on PATH: the path it was started by
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert invoked_as() == "arena"  # on PATH (an activated venv): the name
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])
    assert invoked_as() == "arena"  # from Python: the documented name


def test_a_run_prints_a_report_hint_that_works_pasted_and_a_complete_run_says_so(
    prefect_server: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "elsewhere" / "my runs.duckdb"
    argv = ["run", "--task", "notepad-append-line", "--pool-size", "1", "--db", str(db), "--artifacts",
            str(tmp_path / "art"), "--run-id", "hinted"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    hint = out.split("(in the terminal: ", 1)[1].split(")\n", 1)[0]
    assert shlex.split(hint) == ["arena", "report", "hinted", "--db", str(db)]
    pasted = subprocess.run(hint, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"})
    assert pasted.returncode == 0 and "hinted" in pasted.stdout, pasted.stderr[-2000:]
    assert "already complete" not in out

    assert main(argv) == 0  # again: nothing left to run, and it says so
    out = capsys.readouterr().out
    assert "Run hinted was already complete: every selected task has a final result, so nothing ran" in out


def test_a_completed_run_whose_report_cannot_be_written_keeps_its_exit_status_and_says_how_to_write_it(
    prefect_server: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "runs.duckdb"
    (tmp_path / "reports").write_text("a file where the reports folder goes")
    argv = ["run", "--task", "notepad-append-line", "--pool-size", "1", "--db", str(db), "--artifacts",
            str(tmp_path / "art"), "--run-id", "unreported"]
    assert main(argv) == 0  # the results are stored: the run completed
    captured = capsys.readouterr()
    assert "status: completed" in captured.out and "HTML report:" not in captured.out
    (warning,) = [line for line in captured.err.splitlines() if line.startswith("arena: warning:")]
    assert str(tmp_path / "reports" / "unreported.html") in warning and "cannot write the report" in warning
    assert warning.endswith(f"write it again with: arena report unreported --db {db}")


def test_localenv_serves_the_simulation_alone_until_ctrl_c(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = server_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "localenv", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        banner = [proc.stdout.readline() for _ in range(4)]
        listening = proc.stdout.readline()
        assert "SIMULATED Windows desktop" in banner[0] and f"http://127.0.0.1:{port}" in banner[0], banner
        assert banner[1].split("check it:")[1].split() == ["arena", "probe", f"http://127.0.0.1:{port}"]
        assert f"--waa-url http://127.0.0.1:{port} --reset-level setup" in banner[2]
        assert listening.startswith(f"WAA SIMULATION listening on http://127.0.0.1:{port}"), listening
        root = Path(listening.split("root ", 1)[1].rstrip(")\n"))
        assert root.is_dir()
        assert main(["probe", f"http://127.0.0.1:{port}"]) == 0
        assert "verdict: all layers work" in capsys.readouterr().out
        # A second one on the same port is one line, not a traceback.
        assert main(["localenv", "--port", str(port)]) == 2
        assert capsys.readouterr().err == f"arena: error: --port {port}: in use; give another port\n"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "WAA SIMULATION stopped" in rest and "Traceback" not in rest
    deadline = time.monotonic() + 5
    while root.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not root.exists()  # its temporary C: drive is gone with it


def test_localenv_refuses_a_root_holding_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--root` is the simulated disk, which a snapshot's restore replaces whole: a folder holding
    anything else is refused in one line before the banner, and left as it was."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine\n")
    assert main(["localenv", "--port", str(server_port()), "--root", str(project)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"arena: error: --root {project}: not empty and not a simulated disk (no .waa-simulated-disk); "
                   "the simulation replaces everything in its folder when it restores a snapshot, so give a new or "
                   "empty folder\n")
    assert [p.name for p in project.iterdir()] == ["notes.txt"]
