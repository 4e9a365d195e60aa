"""`arena run`: evaluate a task suite, print its summary, where its results are and the commands
that go on from there (the report, a resume), written to be pasted as printed. And `arena
localenv`: the local WAA environment `arena run` uses by default, alone, for `arena probe`, `arena
run --waa-url` and developing an agent against it."""

from __future__ import annotations

import argparse
import contextlib
import errno
import shutil
import socket
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.vms.defaults import DEFAULT_SERVER_WAIT_SECONDS
from flows.cli.common import (AGENT_CHOICES, DB_HELP, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STORE_FAILED,
                              EXIT_TERMINATED, RESET_LEVEL_CHOICES, RUN_EXIT_CODES, RUN_PROVIDER_CHOICES, command_line,
                              CtrlC, option_errors, pairs, seconds, settle, store_location)
from flows.cli.results import write_run_report

if TYPE_CHECKING:  # imported when a run starts: `arena --help` must stay quick
    from flows.local_server import ServerStart
    from flows.run_config import RunOutcome, SuiteRunConfig

# The run configuration's fields (flows/run_config.py SuiteRunConfig) and the options that set
# them one to one; errors in a field name its option.
_CONFIG_OPTIONS = {
    "suite_dir": "--suite", "difficulty": "--difficulty", "domains": "--domain", "task_ids": "--task",
    "agent": "--agent", "pool_size": "--pool-size", "reset_level": "--reset-level", "max_steps": "--max-steps",
    "settle": "--settle", "episode_timeout_seconds": "--episode-timeout", "max_attempts": "--max-attempts",
    "trials": "--trials", "hedging": "--hedging", "hedge_allowance": "--hedge-allowance",
    "artifacts_dir": "--artifacts", "run_id": "--run-id", "change_selection": "--change-selection",
    "quirks": "--quirks", "provider": "--provider", "cloud_config": "--cloud-config", "warm_pool": "--warm-pool",
    "suite_flavor": "--suite-flavor", "scoring": "--scoring", "max_wall_seconds": "--max-wall-seconds",
    "max_cost_usd": "--max-cost", "max_tokens": "--max-tokens", "vm_hour_price_usd": "--vm-hour-price",
    "shards": "--shards", "server_wait_seconds": "--server-wait",
}
# The agent's options (adapters/agents AgentOptions) likewise.
_AGENT_OPTIONS = {
    "plans_path": "--plans", "seed": "--seed", "model": "--model", "base_url": "--base-url",
    "api_key_env": "--api-key-env", "observation": "--observation", "prices_path": "--prices",
    "tool_version": "--tool-version", "demo_library": "--demo-library", "demo_retriever": "--demo-retriever",
    "demo_backend": "--demo-backend", "demo_allow_same_task": "--demo-allow-same-task", "policy_url": "--policy-url",
}
# Fields set from an option in another form.
_OTHER_OPTIONS = {
    "db_path": "--db", "store_url": "--db", "stage_timeouts": "--stage-timeout", "waa_urls": "--waa-url",
    "policy_headers_env": "--policy-header-env",
}
FIELD_OPTIONS = {**_CONFIG_OPTIONS, **_AGENT_OPTIONS, **_OTHER_OPTIONS}


def _given(args: argparse.Namespace, options: dict[str, str]) -> dict[str, Any]:
    """The fields whose option was given (an unset flag leaves the field to its default)."""
    values = {field: getattr(args, option[2:].replace("-", "_")) for field, option in options.items()}
    return {field: value for field, value in values.items() if value is not None and value is not False}


def _config(args: argparse.Namespace) -> Any:
    """The run's SuiteRunConfig from the options; ValueError naming the option at fault."""
    from pydantic import ValidationError

    from adapters.agents import AgentOptions
    from flows.run_config import SuiteRunConfig

    headers = dict(pairs("--policy-header-env", "HEADER=ENV_VAR", args.policy_header_env))
    stage_timeouts = {stage: seconds("--stage-timeout", stage, value)
                      for stage, value in pairs("--stage-timeout", "STAGE=SECONDS", args.stage_timeout)}
    try:
        agent_options = AgentOptions(**_given(args, _AGENT_OPTIONS),
                                     **({"policy_headers_env": headers} if headers else {}))
        fields = _given(args, _CONFIG_OPTIONS) | {"agent_options": agent_options}
        if args.db is not None:
            fields["store_url" if isinstance(args.db, str) else "db_path"] = args.db
        if stage_timeouts:
            fields["stage_timeouts"] = stage_timeouts
        if args.waa_url:  # servers someone else runs: one lane per URL unless told otherwise
            fields |= {"provider": "existing", "waa_urls": args.waa_url,
                       "pool_size": args.pool_size or len(args.waa_url)}
        return SuiteRunConfig(**fields)
    except ValidationError as exc:
        raise ValueError(option_errors(exc, FIELD_OPTIONS)) from None


def rerun_command(args: argparse.Namespace, run_id: str) -> str:
    """This `arena run` again, with every option it was given and `--run-id RUN`: what resumes
    (or finishes) the run, to paste as printed."""
    parser: argparse.ArgumentParser = args.command_parser
    words: list[object] = ["run"]
    for action in parser._actions:  # noqa: SLF001 - the options, in the order --help lists them
        if not action.option_strings or action.dest == "help":
            continue
        value = run_id if action.dest == "run_id" else getattr(args, action.dest, None)
        if value is None or value is False or value == action.default:
            continue
        option = action.option_strings[-1]
        if value is True:
            words.append(option)
        else:
            for one in value if isinstance(value, list) else [value]:
                words += [option, one]
    return command_line(*words)


def report_command(args: argparse.Namespace, run_id: str) -> str:
    """`arena report RUN`, with the --db this run used."""
    return command_line("report", run_id, *(["--db", args.db] if args.db is not None else []))


def _run(args: argparse.Namespace) -> int:
    from adapters import import_gc

    if args.owns_process:
        # Resumed once the run's modules are imported (`_run_checked`): adapters/import_gc.py.
        import_gc.pause()
        # Ctrl-C stops the run from its first moment, also where it was started with SIGINT
        # ignored (a background job of a script): a person's Ctrl-C, or a SIGINT sent on purpose.
        CtrlC.handle()
    from adapters.agents import build_agent
    from flows.local_server import start_shared_api
    from flows.run_config import new_run_id

    config = _config(args)
    # Fail fast, before Prefect is imported or a server started: the suite and selection, the
    # paths, then the agent.
    config.preflight()
    if config.run_id is None:
        config = config.model_copy(update={"run_id": new_run_id()})  # named in the resume hint
    build_agent(config.agent, config.resolved_agent_options())
    rerun = rerun_command(args, config.run_id)
    # The shared local server is found, or started, while this process imports Prefect and the
    # flow (a stopped server's start takes about 5 s: docs/prefect-ui.md).
    server_start = start_shared_api()
    if config.provider == "local":
        from adapters.waa.localenv.forkserver import prestart

        prestart()  # the simulations' fork server imports them meanwhile too, on the other core
    try:
        return _run_checked(args, config, rerun, server_start)
    finally:
        if server_start is not None:
            server_start.abandon()


def _run_checked(args: argparse.Namespace, config: SuiteRunConfig, rerun: str, server_start: ServerStart | None) -> int:
    """`arena run` once its configuration passed its checks and its server is on the way."""
    from prefect.exceptions import TerminationSignal

    from adapters import import_gc
    from adapters.results.report_html import ReportError
    from adapters.store.errors import StoreError, StoreUnavailable, error_text
    from adapters.store.spool import spool_dir
    from flows.evaluate_suite import run_suite
    from flows.local_server import LocalServerError, use_api
    from flows.live_view import LiveView
    from flows.terminal import ProgressPrinter, quiet_expected_tracebacks

    if args.owns_process:
        import_gc.resume()
    quiet_expected_tracebacks(verbose=args.verbose)
    report = ReportAhead(config.store_location)
    if args.owns_process:
        from flows.cancellation import terminate_on_sigterm
        from flows.reaper import start_reaper

        terminate_on_sigterm()  # SIGTERM and a cancel from the Prefect UI stop the run cleanly
        args.reaper = start_reaper()  # ends the simulations if we are killed
    try:
        with use_api(server_start) as local_server, contextlib.ExitStack() as live:
            if local_server is not None:
                print(f"Prefect UI: {local_server.ui_url} (a local server shared by the runs on this machine; "
                      "set PREFECT_API_URL to use your own)", file=sys.stderr)
            if not args.no_live:
                view = live.enter_context(LiveView())
                print(f"Live view: {view.url} (each VM's screen as the run goes; ends with the run)", file=sys.stderr)
            with ProgressPrinter(config.artifacts_dir / config.run_id / "progress.json"):
                outcome = run_suite(config, announce=lambda url: print(f"Flow run: {url}", file=sys.stderr),
                                    on_outcome=report.start)
    except LocalServerError as exc:
        print(f"arena: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StoreUnavailable as exc:
        print(f"arena: run {config.run_id}: the results store failed ({error_text(exc)}); finished results wait in "
              f"{spool_dir(config.artifacts_dir, config.run_id)}. When the store is back, finish the run with: "
              f"{rerun}", file=sys.stderr)
        return EXIT_STORE_FAILED
    except (KeyboardInterrupt, TerminationSignal) as stop:
        if _stored_status(config.store_location, config.run_id) == "cancelled":
            print(f"arena: run {config.run_id} was cancelled from Prefect; attempts recorded so far are kept "
                  f"(resume with: {rerun})", file=sys.stderr)
            return RUN_EXIT_CODES["cancelled"]
        print(f"arena: interrupted; attempts recorded so far are kept (resume with: {rerun})", file=sys.stderr)
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_TERMINATED
    if outcome.stopped_by is not None:
        if outcome.stopped_by == "prefect":
            print(f"arena: run {outcome.run_id} was cancelled from Prefect; attempts recorded so far are kept "
                  f"(resume with: {rerun})", file=sys.stderr)
            return RUN_EXIT_CODES["cancelled"]
        print(f"arena: interrupted; attempts recorded so far are kept (resume with: {rerun})", file=sys.stderr)
        return EXIT_INTERRUPTED if outcome.stopped_by == "ctrl-c" else EXIT_TERMINATED
    if outcome.status == "store_failed":
        print(f"arena: run {outcome.run_id}: {outcome.table}. When the store is back, finish the run with: "
              f"{rerun} (waiting results are written first)", file=sys.stderr)
        return EXIT_STORE_FAILED
    print("\n" + outcome.table)
    if outcome.status == "completed" and not outcome.results and args.run_id is not None:
        # A resume with nothing left to run: say so, or the user waits for tasks that never come.
        print(f"\nRun {outcome.run_id} was already complete: every selected task has a final result, "
              "so nothing ran this time (the summary above is the run's own).")
    if outcome.status != "completed":
        print(f"\nRun status: {outcome.status} (finish it with: {rerun})")
    print(f"\nResults: {outcome.store} (run_id {outcome.run_id!r})")
    print(f"Screenshots: {(config.artifacts_dir / outcome.run_id).resolve()}")
    try:
        html = report.path(outcome.run_id)
        print(f"HTML report: {html.resolve()} (in the terminal: {report_command(args, outcome.run_id)})")
    except (ReportError, StoreError) as exc:
        # The results are stored: the exit status stays the run's; the report can be written later
        # (a store that failed while the report read it, too).
        print(f"arena: warning: {exc}; write it again with: {report_command(args, outcome.run_id)}", file=sys.stderr)
    code = RUN_EXIT_CODES.get(outcome.status, EXIT_FAILED)
    if code:
        missing = outcome.completeness.missing if outcome.completeness else "some"
        print(f"arena: run {outcome.run_id} ended {outcome.status}: {missing} task(s) without a final result",
              file=sys.stderr)
    return code


class ReportAhead:
    """The run's HTML report, written in a thread of its own from the moment the run has its
    outcome, while Prefect finishes the flow run (`run_suite`'s `on_outcome`): the report reads
    only the stored results, and the two together take about a second at the end of every run."""

    def __init__(self, db: Path | str) -> None:
        self._db = db
        self._report: Future[tuple[str, Path]] | None = None

    def start(self, outcome: RunOutcome) -> None:
        """Begin writing the report of `outcome`'s run, unless the run has no report to show
        (stopped, or its store failed)."""
        from flows.run_config import STORE_FAILED

        if outcome.stopped_by is not None or outcome.status == STORE_FAILED:
            return
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arena-report")
        self._report = writer.submit(write_run_report, self._db, outcome.run_id)
        writer.shutdown(wait=False)  # the report goes on; no more work for this thread

    def path(self, run_id: str) -> Path:
        """The report of `run_id`: the one begun early once it is written (its error raised
        here), else written now."""
        if self._report is None:
            return write_run_report(self._db, run_id)[1]
        return self._report.result()[1]


def _stored_status(db: Path | str, run_id: str) -> str | None:
    """The status the run stored when it stopped (None if it stored none)."""
    from adapters.store.duckdb_store import ResultStore, StoreError

    try:
        with ResultStore(db, read_only=True) as store:
            run = store.get_run(run_id)
    except (StoreError, OSError):
        return None
    return run.status if run else None


def add_run(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena run` and its options."""
    run = sub.add_parser("run", help="evaluate a task suite (default: the bundled suite on the local simulation)")
    run.add_argument("--suite", type=Path, help="a WAA task directory (default: the bundled suite)")
    run.add_argument("--difficulty", choices=["normal", "hard"])
    run.add_argument("--domain", action="append", help="only this domain (repeatable)")
    run.add_argument("--task", action="append", help="only this task id (repeatable)")
    run.add_argument("--agent", choices=AGENT_CHOICES, default="scripted", help="see adapters/agents/__init__.py")
    run.add_argument("--plans", type=Path, help="plans for the scripted agent (default: the suite's solutions.json)")
    run.add_argument("--seed", type=int, help="random agent seed")
    run.add_argument("--model", help="model name or checkpoint (claude, openai, anthropic, demo agents)")
    run.add_argument("--base-url", help="model API base URL, e.g. a vLLM server's http://host:8000/v1")
    run.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    run.add_argument("--observation", choices=["screenshot", "a11y_tree", "screenshot_a11y_tree", "som"])
    run.add_argument("--prices", type=Path, help="JSON file of prices per million tokens, by model")
    run.add_argument("--tool-version", help="computer-use tool version for the claude agent")
    run.add_argument("--demo-library", type=Path, help="demo library directory for the demo agent")
    run.add_argument("--demo-allow-same-task", action="store_true",
                     help="demo agent: may retrieve a demo recorded on the task itself (leaks the answer)")
    run.add_argument("--demo-retriever", choices=["lexical", "embedding"])
    run.add_argument("--demo-backend", choices=["openai", "anthropic"], help="model API of the demo agent")
    run.add_argument("--policy-url", help="the http agent's policy endpoint")
    run.add_argument(
        "--policy-header-env",
        action="append",
        help="HEADER=ENV_VAR: send the value of ENV_VAR as HEADER to the policy (repeatable)",
    )
    run.add_argument(
        "--pool-size", type=int, help="number of VMs, and of tasks run at once (default 4; with --waa-url: one per URL)"
    )
    run.add_argument(
        "--reset-level",
        choices=RESET_LEVEL_CHOICES,
        help="how each VM is reset before a task (default snapshot; what a provider offers is checked up front)",
    )
    run.add_argument(
        "--settle", type=settle, metavar="adaptive|SECONDS",
        help="wait after each action: until the screen is still (adaptive, the default on real VMs) "
        "or a fixed pause (WAA's runner: 3)",
    )
    run.add_argument("--max-steps", type=int)
    run.add_argument("--episode-timeout", type=float,
                     help="seconds per episode, the agent's time and the environment's each counted against it")
    run.add_argument("--max-attempts", type=int, help="attempts per task for infrastructure errors")
    run.add_argument(
        "--hedging", choices=("auto", "on", "off"),
        help="copy the run's last tasks onto idle VMs, a copy counting only for an attempt that fails with an "
        "infrastructure error (default auto: on for agents that call no model, on kvm/aws/azure VMs); the summary "
        "shows the extra VM-hours and tokens",
    )
    run.add_argument("--hedge-allowance", type=float, metavar="FRACTION",
                     help="hedge copies' VM time at most this fraction of the VM time billed (default 0.05)")
    run.add_argument(
        "--trials", type=int, metavar="K",
        help="run each task K times, each trial from a fresh reset (default 1); the summary adds the rate over "
        "trials with its intervals and pass@k / pass^k (docs/statistics.md); a resume runs only missing trials",
    )
    run.add_argument("--db", type=store_location, help=DB_HELP)
    run.add_argument("--artifacts", type=Path, help="screenshot directory (default results/artifacts)")
    run.add_argument("--run-id", help="resume or name a run")
    run.add_argument(
        "--change-selection", action="store_true",
        help="resuming with other tasks (--task, --domain, ...) than the run selected: make them the run's selection",
    )
    run.add_argument("--quirks", action="store_true", help="local VMs reproduce a real WAA server's quirks")
    run.add_argument(
        "--provider",
        choices=RUN_PROVIDER_CHOICES,  # existing servers: --waa-url
        help="where the VMs come from (default local)",
    )
    run.add_argument("--max-wall-seconds", type=float, help="budget: start no new task after this long")
    run.add_argument("--max-cost", type=float, help="budget in USD: model cost plus VM-hours x --vm-hour-price")
    run.add_argument("--max-tokens", type=int, help="budget: model tokens")
    run.add_argument("--vm-hour-price", type=float, help="USD per VM-hour, for cost and the budget")
    run.add_argument(
        "--stage-timeout", action="append", help="STAGE=SECONDS wall-clock limit for reset/setup/episode/evaluate"
    )
    run.add_argument(
        "--shards",
        type=int,
        help="split the tasks into N shards run by workers of the evaluate-shard deployment, each on its own "
        "pool (needs a Prefect server and workers: docs/deployments.md)",
    )
    run.add_argument("--cloud-config", type=Path, help="cloud settings TOML for aws/azure (default $ARENA_CONFIG)")
    run.add_argument("--suite-flavor", choices=["waa", "waa-v2"],
                     help="score with WAA's or WAA-V2's evaluator semantics (default: what the suite says; a "
                     "WAA-V2 checkout is recognised)")
    run.add_argument("--scoring", choices=["strict", "waa-compat"],
                     help="a server failure during evaluation: an infrastructure error, retried and never scored "
                     "(strict, the default), or scored as WAA scores it (waa-compat, to reproduce WAA's numbers)")
    run.add_argument("--warm-pool", metavar="NAME",
                     help="aws/azure: use warm pool NAME's VMs (started if stopped, stopped again at the end)")
    run.add_argument(
        "--waa-url",
        action="append",
        help="run on this already running WAA server instead of local VMs (repeatable; needs --reset-level setup; "
        "URLs beyond --pool-size are spares)",
    )
    run.add_argument(
        "--server-wait",
        type=float,
        help="with --waa-url: seconds to wait for a server to answer, at start and after it failed, before "
        f"retiring it (default {DEFAULT_SERVER_WAIT_SECONDS:g})",
    )
    run.add_argument("--verbose", action="store_true", help="show Prefect's task-state logs in the terminal")
    run.add_argument("--no-live", action="store_true",
                     help="serve no live view (by default a page on 127.0.0.1 shows each VM's screen while the run goes)")
    run.set_defaults(func=_run)


def _localenv(args: argparse.Namespace) -> int:
    """The local WAA environment in the foreground on 127.0.0.1:PORT until Ctrl-C."""
    from adapters.waa.localenv.__main__ import main as serve
    from adapters.waa.localenv.filesystem import ForeignRootError, claim_root

    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: give a port between 1 and 65535")
    with socket.socket() as probe:  # one line for a taken port, not the server's traceback
        try:
            probe.bind(("127.0.0.1", args.port))
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise ValueError(f"--port {args.port}: {'in use' if taken else exc.strerror}; give another port") from None
    if args.root is not None:
        try:  # before the banner: a folder holding other files is refused in one line
            claim_root(args.root)
        except ForeignRootError as exc:
            raise ValueError(f"--root {exc}") from None
    root = args.root or Path(tempfile.mkdtemp(prefix="arena-localenv-"))
    url = f"http://127.0.0.1:{args.port}"
    quirks = " with a real WAA server's quirks" if args.quirks else ""
    deleted = "" if args.root else " and deletes its simulated C: drive"
    print(f"The local WAA environment{quirks}: a SIMULATED Windows desktop (Notepad, File Explorer, Settings), "
          f"not a Windows VM, behind WAA's HTTP API at {url}\n"
          f"  check it:   {command_line('probe', url)}\n"
          f"  run on it:  {command_line('run', '--waa-url', url, '--reset-level', 'setup')}\n"
          f"  Ctrl-C stops it{deleted}.", flush=True)
    try:
        return serve(["--host", "127.0.0.1", "--port", str(args.port), "--root", str(root),
                      *(["--quirks"] if args.quirks else [])])
    finally:
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


def add_localenv(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena localenv`."""
    localenv = sub.add_parser("localenv", help="start the local WAA environment alone (a simulated Windows desktop "
                              "behind WAA's HTTP API) for arena probe, arena run --waa-url and agent development")
    localenv.add_argument("--port", type=int, default=5000, help="the port on 127.0.0.1 (default 5000, WAA's)")
    localenv.add_argument("--quirks", action="store_true", help="reproduce a real WAA server's quirks (slow start, "
                          "slow accessibility tree, late windows)")
    localenv.add_argument("--root", type=Path, metavar="DIR", help="the simulated C: drive, kept afterwards: a new "
                          "or empty folder, or one it used before (default: a temporary folder, deleted when it stops)")
    localenv.set_defaults(func=_localenv)
