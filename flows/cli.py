"""The `arena` command line.

    arena run                      evaluate the bundled suite on the local simulation
    arena tasks list --waa-dir D   list a WAA task directory by domain
    arena tasks coverage --waa-dir D   which tasks this product can run and score
    arena probe URL                check a WAA server layer by layer
    arena janitor [--dry-run]      delete expired cloud resources this product created
    arena notify model-updated M   announce a new model or checkpoint (starts its evaluation)
    arena report RUN [--html F]    a run's metrics in the terminal, and a self-contained HTML report
    arena compare RUN_A RUN_B      per-domain deltas, flipped tasks and a paired-test verdict
    arena export RUN --parquet D   one run's tables as Parquet files
    arena sql "QUERY"              one SQL query on the results (safe while runs write)
    arena store migrate FILE       copy a DuckDB results file's runs into the team store

RUN may be `latest` (the most recently started run in the database). Every --db takes a DuckDB
file or the team store's PostgreSQL URL; $ARENA_STORE_URL, when set, is the default.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError

from adapters.results.export import ExportError
from adapters.store.duckdb_store import ResultStore, StoreError
from adapters.store.errors import StoreUnavailable, error_text
from adapters.store.spool import spool_dir


# Exit status of `arena run` by run status: cron and CI see anything but a complete run as a failure.
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_OVER_BUDGET = 4  # as a run stopped by its budget; `arena plan --max-cost` refusing too
EXIT_INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # and by SIGTERM (128 + SIGTERM): `kill`, `docker stop`, systemd
EXIT_STORE_FAILED = 6  # the results store failed mid-run: finished results wait in the run's spool
RUN_EXIT_CODES: dict[str, int] = {
    "completed": 0, "failed": EXIT_FAILED, "incomplete": 3, "budget_exhausted": EXIT_OVER_BUDGET, "cancelled": 5,
    "interrupted": EXIT_INTERRUPTED, "store_failed": EXIT_STORE_FAILED,
}


_DB_HELP = (
    "DuckDB file, or the team store's URL postgresql://USER@HOST/DB (password from PGPASSWORD or ~/.pgpass); "
    "default $ARENA_STORE_URL, else results/arena.duckdb"
)


def _run(args: argparse.Namespace) -> int:
    from adapters.agents import AgentOptions, build_agent
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig, new_run_id

    agent_options = AgentOptions(
        **{k: v for k, v in {
            "plans_path": args.plans,
            "seed": args.seed,
            "model": args.model,
            "base_url": args.base_url,
            "api_key_env": args.api_key_env,
            "observation": args.observation,
            "prices_path": args.prices,
            "tool_version": args.tool_version,
            "demo_library": args.demo_library,
            "demo_retriever": args.demo_retriever,
            "demo_backend": args.demo_backend,
            "demo_allow_same_task": args.demo_allow_same_task or None,
            "policy_url": args.policy_url,
            "policy_headers_env": dict(_pairs("--policy-header-env", "HEADER=ENV_VAR", args.policy_header_env)) or None,
        }.items() if v is not None}
    )
    config = SuiteRunConfig(
        **{k: v for k, v in {
            "suite_dir": args.suite,
            "difficulty": args.difficulty,
            "domains": args.domain or None,
            "task_ids": args.task or None,
            "agent": args.agent,
            "agent_options": agent_options,
            "pool_size": args.pool_size,
            "reset_level": args.reset_level,
            "max_steps": args.max_steps,
            "settle": args.settle,
            "episode_timeout_seconds": args.episode_timeout,
            "max_attempts": args.max_attempts,
            **({"store_url": args.db} if isinstance(args.db, str) else {"db_path": args.db}),
            "artifacts_dir": args.artifacts,
            "run_id": args.run_id,
            "change_selection": args.change_selection or None,
            "quirks": args.quirks or None,
            "provider": args.provider,
            "cloud_config": args.cloud_config,
            "warm_pool": args.warm_pool,
            "suite_flavor": args.suite_flavor,
            "scoring": args.scoring,
            "max_wall_seconds": args.max_wall_seconds,
            "max_cost_usd": args.max_cost,
            "max_tokens": args.max_tokens,
            "vm_hour_price_usd": args.vm_hour_price,
            "shards": args.shards,
            "stage_timeouts": {
                stage: _seconds("--stage-timeout", stage, value)
                for stage, value in _pairs("--stage-timeout", "STAGE=SECONDS", args.stage_timeout)
            } if args.stage_timeout else None,
            "server_wait_seconds": args.server_wait,
            **({"provider": "existing", "waa_urls": args.waa_url,
                "pool_size": args.pool_size or len(args.waa_url)} if args.waa_url else {}),
        }.items() if v is not None}
    )
    # Fail fast, before Prefect starts: the suite and selection, the paths, then the agent.
    config.preflight()
    if config.run_id is None:
        config = config.model_copy(update={"run_id": new_run_id()})  # named in the resume hint
    build_agent(config.agent, config.resolved_agent_options())
    from prefect.exceptions import TerminationSignal

    from flows.local_server import LocalServerError, configured_or_shared_api
    from flows.terminal import ProgressPrinter, quiet_expected_tracebacks

    quiet_expected_tracebacks(verbose=args.verbose)
    if args.owns_process and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with Ctrl-C ignored (a background job of a script, nohup): a person's Ctrl-C, or
        # a SIGINT sent on purpose, still stops the run cleanly.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.owns_process:
        from flows.cancellation import terminate_on_sigterm
        from flows.reaper import start_reaper

        terminate_on_sigterm()  # SIGTERM and a cancel from the Prefect UI stop the run cleanly
        args.reaper = start_reaper()  # ends the simulations if we are killed
    try:
        with configured_or_shared_api() as local_server:
            if local_server is not None:
                print(f"Prefect UI: {local_server.ui_url} (a local server shared by the runs on this machine; "
                      "set PREFECT_API_URL to use your own)", file=sys.stderr)
            with ProgressPrinter(config.artifacts_dir / config.run_id / "progress.json"):
                outcome = run_suite(config, announce=lambda url: print(f"Flow run: {url}", file=sys.stderr))
    except LocalServerError as exc:
        print(f"arena: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StoreUnavailable as exc:
        print(f"arena: run {config.run_id}: the results store failed ({error_text(exc)}); finished results wait in "
              f"{spool_dir(config.artifacts_dir, config.run_id)}. When the store is back, finish the run with "
              f"--run-id {config.run_id} (and the same options)", file=sys.stderr)
        return EXIT_STORE_FAILED
    except (KeyboardInterrupt, TerminationSignal) as stop:
        if _stored_status(config.store_location, config.run_id) == "cancelled":
            print(f"arena: run {config.run_id} was cancelled from Prefect; attempts recorded so far are kept "
                  f"(resume with --run-id {config.run_id})", file=sys.stderr)
            return RUN_EXIT_CODES["cancelled"]
        print(
            f"arena: interrupted; attempts recorded so far are kept (resume with --run-id {config.run_id})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_TERMINATED
    if outcome.stopped_by is not None:
        if outcome.stopped_by == "prefect":
            print(f"arena: run {outcome.run_id} was cancelled from Prefect; attempts recorded so far are kept "
                  f"(resume with --run-id {outcome.run_id})", file=sys.stderr)
            return RUN_EXIT_CODES["cancelled"]
        print(f"arena: interrupted; attempts recorded so far are kept (resume with --run-id {outcome.run_id})",
              file=sys.stderr)
        return EXIT_INTERRUPTED if outcome.stopped_by == "ctrl-c" else EXIT_TERMINATED
    if outcome.status == "store_failed":
        print(f"arena: run {outcome.run_id}: {outcome.table}. When the store is back, finish the run with "
              f"--run-id {outcome.run_id} (and the same options): waiting results are written first", file=sys.stderr)
        return EXIT_STORE_FAILED
    print("\n" + outcome.table)
    if outcome.status != "completed":
        print(f"\nRun status: {outcome.status} (rerun with --run-id {outcome.run_id} to finish it)")
    print(f"\nResults: {outcome.store} (run_id {outcome.run_id!r})")
    print(f"Screenshots: {(config.artifacts_dir / outcome.run_id).resolve()}")
    _, report = write_run_report(config.store_location, outcome.run_id)
    print(f"HTML report: {report.resolve()} (terminal: arena report {outcome.run_id})")
    code = RUN_EXIT_CODES.get(outcome.status, EXIT_FAILED)
    if code:
        missing = outcome.completeness.missing if outcome.completeness else "some"
        print(f"arena: run {outcome.run_id} ended {outcome.status}: {missing} task(s) without a final result",
              file=sys.stderr)
    return code


def _stored_status(db: Path | str, run_id: str) -> str | None:
    """The status the run stored when it stopped (None if it stored none)."""
    try:
        with ResultStore(db, read_only=True) as store:
            run = store.get_run(run_id)
    except (StoreError, OSError):
        return None
    return run.status if run else None


def _pairs(option: str, form: str, values: list[str] | None) -> list[tuple[str, str]]:
    """KEY=VALUE option values split, or ValueError naming the option and the expected form."""
    pairs = []
    for value in values or []:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise ValueError(f"{option} {value!r}: expected {form}")
        pairs.append((key, rest))
    return pairs


def _seconds(option: str, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{option} {key}={value!r}: {value!r} is not a number of seconds") from None


def _tasks_list(args: argparse.Namespace) -> int:
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

    catalog = WAATaskCatalog(args.waa_dir or bundled_suite_dir(), difficulty=args.difficulty)
    tasks = catalog.tasks(domains=args.domain or None)
    if args.ids:
        for t in tasks:
            print(f"{t.domain}\t{t.task_id}\t{'infeasible' if t.infeasible else ''}")
        return 0
    counts: dict[str, list[int]] = {}
    for t in tasks:
        entry = counts.setdefault(t.domain, [0, 0])
        entry[0] += 1
        entry[1] += int(t.infeasible)
    print(f"{'domain':<22} {'tasks':>5} {'infeasible':>10}")
    for domain, (n, inf) in counts.items():
        print(f"{domain:<22} {n:>5} {inf:>10}")
    print(f"{'total':<22} {sum(v[0] for v in counts.values()):>5} {sum(v[1] for v in counts.values()):>10}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from adapters.results.plan import make_plan
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

    suite = args.suite or bundled_suite_dir()
    if not suite.is_dir():
        raise ValueError(f"--suite {suite}: not a directory")
    catalog = WAATaskCatalog(suite, difficulty=args.difficulty)
    tasks = catalog.tasks(domains=args.domain or None, ids=args.task or None)
    if not tasks:
        raise ValueError(f"no task of {suite} matches the selection")
    ids = [t.task_id for t in tasks]
    expected: dict[str, float] = {}
    costs: dict[str, float] = {}
    if isinstance(args.db, str) or args.db.exists():  # no results file yet: nothing is known
        with ResultStore(args.db, read_only=True) as store:
            expected, costs = store.expected_seconds(ids, args.agent), store.expected_cost(ids, args.agent)
    plan = make_plan(ids, expected, costs, args.pool_size, args.vm_hour_price)
    print(plan.render())
    if args.max_cost is not None and plan.cost_usd > args.max_cost:
        print(f"refused: the estimated cost ${plan.cost_usd:.2f} is above --max-cost ${args.max_cost:.2f}",
              file=sys.stderr)
        return EXIT_OVER_BUDGET
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Preflight checks, one line each; exit 1 when any fails."""
    from prefect.settings import PREFECT_API_URL

    from adapters.agents import AgentOptions
    from flows.doctor import (check_cloud, check_model, check_prefect, check_store, check_waa_server,
                              find_running_servers, local_server_lines, stop_local_servers)

    if args.stop_local_servers is not None:
        lines, stopped = stop_local_servers(args.stop_local_servers)
        print("\n".join(lines))
        return 0 if stopped else EXIT_FAILED
    options = AgentOptions(**{k: v for k, v in {
        "model": args.model, "base_url": args.base_url, "api_key_env": args.api_key_env,
    }.items() if v is not None})
    checks = [check_store(args.db), *check_prefect(PREFECT_API_URL.value(), SERVED_DEPLOYMENTS)]
    checks += [check_waa_server(url) for url in args.waa_url or []]
    checks += check_model(args.agent, options) if args.agent else []
    if args.provider:
        checks += check_cloud(args.provider, args.config, args.pool_size, args.warm_pool, args.egress_url)
    for check in checks:
        print(check.line(), flush=True)
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    print("\n".join(local_server_lines(find_running_servers())))
    return EXIT_FAILED if failed else 0


def _probe(args: argparse.Namespace) -> int:
    from adapters.waa.client import WAAClient
    from adapters.waa.probe import format_probe, probe_server

    client = WAAClient(args.url, read_retries=1)
    results = probe_server(client, ready_deadline=args.wait)
    print(format_probe(args.url, results))
    return 0 if all(r.ok for r in results) else 1


def _tasks_coverage(args: argparse.Namespace) -> int:
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
    from adapters.waa.coverage import format_coverage, task_coverage

    catalog = WAATaskCatalog(args.waa_dir or bundled_suite_dir(), difficulty=args.difficulty)
    coverages = [task_coverage(t) for t in catalog.tasks(domains=args.domain or None)]
    print(format_coverage(coverages, per_task=args.ids))
    return 0 if all(c.supported for c in coverages) else 1


def _tasks_lint(args: argparse.Namespace) -> int:
    from adapters.waa.lint import lint_suite

    if args.offline and args.cache_dir is None:
        raise ValueError("--offline checks the download cache: give it with --cache-dir DIR")
    reports = [lint_suite(directory, check_urls=args.check_urls,
                          offline_cache=args.cache_dir if args.offline else None, difficulty=args.difficulty)
               for directory in args.dir]
    for report in reports:
        print("\n".join(report.lines()))
    return 1 if any(r.problems for r in reports) else 0


def _tasks_new(args: argparse.Namespace) -> int:
    from adapters.waa.scaffold import NewTask, json_or_text, parse_download, parse_params, registry_listing, write_task

    if args.list:
        print(registry_listing())
        return 0
    missing = [f"--{name.replace('_', '-')}" for name in ("suite", "app", "id", "instruction")
               if getattr(args, name) is None]
    if missing:
        raise ValueError(f"arena tasks new needs {', '.join(missing)} (or --list to see what a task may use)")
    spec = NewTask(
        task_id=args.id, app=args.app, instruction=args.instruction, metric=args.metric, result_getter=args.result,
        result_params=parse_params(args.result_param, "--result-param"),
        expected=None if args.expected is None else json_or_text(args.expected),
        expected_getter=args.expected_getter, expected_params=parse_params(args.expected_param, "--expected-param"),
        open_paths=args.open or [], downloads=[parse_download(v) for v in args.download or []],
        postconfig_save=args.save_before_eval,
    )
    result = write_task(args.suite, spec, overwrite=args.overwrite)
    print(f"wrote {result.path}")
    for finding in result.problems:
        print(finding.line())
    if result.problems:
        print(f"{len(result.problems)} problem(s): fix the file, then check it again with arena tasks lint {args.suite}")
        return 1
    print(f"checked: lint clean and it loads; run it with arena run --suite {args.suite} --task {args.id}")
    return 0


def _notify_model_updated(args: argparse.Namespace) -> int:
    from flows.notify import deployments_started_by, notify_model_updated

    try:
        event_id = notify_model_updated(args.model, endpoint=args.endpoint, checkpoint=args.checkpoint)
    except RuntimeError as exc:  # no server configured: a usage problem, not a crash
        print(f"arena: error: {exc}", file=sys.stderr)
        return 2
    started = deployments_started_by()
    print(f"model.updated sent for {args.model} (event {event_id})")
    if not started:
        print("arena: no deployment on this server starts on model.updated: nothing will evaluate it "
              "(serve them: python -m deployments.serve)", file=sys.stderr)
        return EXIT_FAILED
    print("it starts: " + "; ".join(started))
    return 0


SERVED_DEPLOYMENTS = ["evaluate-baseline/on-demand", "nightly-baselines/nightly-baselines",
                      "evaluate-model-update/on-model-update"]
NIGHTLY = "nightly-baselines/nightly-baselines"


def _status(args: argparse.Namespace) -> int:
    """Whether the served deployments will run, and when the nightly runs next; exit 1 when the
    nightly will not run on its own."""
    from datetime import datetime, timezone

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        print("arena: error: PREFECT_API_URL is not set; arena status asks the Prefect server that serves "
              "the deployments (e.g. PREFECT_API_URL=http://127.0.0.1:4200/api)", file=sys.stderr)
        return EXIT_BAD_INPUT
    from deployments.health import read_status

    try:
        with get_client(sync_client=True) as client:
            statuses = read_status(client, SERVED_DEPLOYMENTS)
    except Exception as exc:  # noqa: BLE001 - an unreachable server is the answer here
        print(f"arena: error: cannot read the deployments from {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"Prefect server: {url}")
    for name, status in statuses.items():
        if status is None:
            print(f"  {name}: not registered (start `python -m deployments.serve` or `prefect deploy --all`)")
            continue
        schedules = "; ".join(s.describe() for s in status.schedules) or "no schedule (runs on demand or on events)"
        print(f"  {name}: {'PAUSED' if status.paused else 'active'}; {schedules}")
    nightly = statuses.get(NIGHTLY)
    if nightly is not None and nightly.will_run_on_schedule and nightly.next_run is not None:
        wait = nightly.next_run - datetime.now(timezone.utc)
        hours, rest = divmod(max(0, int(wait.total_seconds())), 3600)
        print(f"Next nightly run: {nightly.next_run:%Y-%m-%d %H:%M %Z} (in {hours}h{rest // 60:02d}m)")
        return 0
    why = ("it is not registered" if nightly is None else "it is PAUSED (`prefect deployment resume "
           f"{NIGHTLY}` or the UI)" if nightly.paused else "its schedule is inactive"
           if not any(s.active for s in nightly.schedules) else "no run is scheduled (is a serve process or worker up?)")
    print(f"arena: the nightly will NOT run: {why}", file=sys.stderr)
    return EXIT_FAILED


def _run_id(db: Path | str, run: str) -> str:
    """`run`, or the most recently started run's id when `run` is "latest"."""
    if run != "latest":
        return run
    from adapters.results.source import latest_run

    found = latest_run(db)
    if found is None:
        raise ValueError(f"{db}: no runs recorded yet")
    return found


def _default_report_path(db: Path | str, run_id: str) -> Path:
    """Where reports go unless told: a `reports` folder beside the database (for the team
    store, results/reports in the working directory)."""
    folder = Path("results") if isinstance(db, str) else db.parent
    return folder / "reports" / f"{run_id}.html"


def _store(value: str) -> Path | str:
    """A --db value: the team store's PostgreSQL URL (kept as text) or a DuckDB file's path."""
    from adapters.store.postgres import is_server_location
    from flows.run_config import check_store_url

    if not is_server_location(value):
        return Path(value)
    try:
        return check_store_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _date(value: str) -> dt.date:
    """A YYYY-MM-DD option value."""
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a date like 2026-11-24") from None


def _settle(value: str) -> float | str:
    """A --settle value: "adaptive" or a fixed pause in seconds (>= 0)."""
    from adapters.waa.settle import settle_choice

    try:
        return settle_choice(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def write_run_report(
    db: Path | str, run_id: str, html: Path | None = None, demo_library: Path | None = None,
    show: Callable[[str], None] | None = None,
) -> tuple[str, Path]:
    """The terminal report of a run, and its HTML report written to `html` (default: beside the DB).

    `show` gets the terminal report as soon as it is ready, before the slower HTML is written."""
    from adapters.results.metrics import references_for_run
    from adapters.results.report_html import write_html_report
    from adapters.results.report_text import render_text_report

    if isinstance(db, Path) and not db.is_file():
        raise StoreError(f"{db.resolve()}: results database not found")
    with ResultStore(db, read_only=True) as store:
        references = references_for_run(store, run_id, demo_library)
        text = render_text_report(store, run_id, references)
        if show is not None:
            show(text)
        path = write_html_report(store, run_id, html or _default_report_path(db, run_id), references)
    return text, path


def _report(args: argparse.Namespace) -> int:
    run_id = _run_id(args.db, args.run)

    def show(text: str) -> None:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)

    _, path = write_run_report(args.db, run_id, args.html, args.demo_library, show=show)
    print(f"\nHTML report: {path.resolve()}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from adapters.results.compare import compare_stored_runs, render_comparison_text

    comparison = compare_stored_runs(args.db, _run_id(args.db, args.baseline), _run_id(args.db, args.new))
    print(render_comparison_text(comparison), end="")
    return 0


def _sql(args: argparse.Namespace) -> int:
    import csv

    import duckdb

    from adapters.results.source import results_connection
    from adapters.store.postgres import read_only_query

    if isinstance(args.db, str):  # the team store: the query runs on PostgreSQL, in its dialect
        answer = read_only_query(args.db, args.query)
    else:
        with results_connection(args.db) as conn:
            # The connection is read-only; this also forbids files: no COPY ... TO, read_csv,
            # ATTACH or extensions, and the setting cannot be turned back on.
            conn.execute("SET enable_external_access = false")
            conn.execute("SET lock_configuration = true")
            try:
                cursor = conn.execute(args.query)
            except duckdb.Error as exc:
                raise ValueError(f"query failed: {str(exc).splitlines()[0]}") from exc
            answer = None if cursor.description is None else ([d[0] for d in cursor.description], cursor.fetchall())
    if answer is None:
        return 0
    names, rows = answer
    if args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows(rows)
        return 0
    texts = [names, *[["NULL" if v is None else str(v) for v in row] for row in rows]]
    widths = [min(60, max(len(t[i]) for t in texts)) for i in range(len(names))]
    for k, row in enumerate(texts):
        print("  ".join(cell[:60].ljust(width) for cell, width in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * width for width in widths))
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from adapters.results.export import export_run_parquet

    runs = [_run_id(args.db, run) for run in args.run]
    out = args.out or args.parquet
    if out is None:
        raise ValueError("give the output directory: --out DIR (or --parquet DIR for the Parquet tables)")
    if args.format == "parquet":
        if len(runs) != 1:
            raise ValueError("the parquet format exports one run at a time; give one run id")
        for path in export_run_parquet(args.db, runs[0], out, overwrite=args.overwrite):
            print(path)
        return 0
    if args.parquet is not None:
        raise ValueError(f"--parquet is for --format parquet; use --out DIR for {args.format}")
    from adapters.training.export import export_training
    from adapters.training.selection import EpisodeFilter
    from adapters.training.suites import held_out_dirs

    selection = EpisodeFilter(run_ids=runs, outcomes=args.outcome or [], success_only=args.success_only,
                              domains=args.domain or [], task_ids=args.task or [], models=args.model or [],
                              since=args.since, until=args.until,
                              final_attempts_only=not args.all_attempts)
    summary = export_training(args.db, selection, args.format, out, images=args.images,
                              held_out=held_out_dirs(args.held_out or []), allow_held_out=args.allow_held_out,
                              overwrite=args.overwrite)
    print("\n".join(summary.lines()))
    return 0


def _demos_build(args: argparse.Namespace) -> int:
    from adapters.training.demo_builder import build_demo_library
    from adapters.training.suites import held_out_dirs

    summary = build_demo_library(args.db, [_run_id(args.db, run) for run in args.from_run], args.out,
                                 held_out=held_out_dirs(args.held_out or []), allow_held_out=args.allow_held_out,
                                 include_infeasible=args.include_infeasible, overwrite=args.overwrite)
    print("\n".join(summary.lines()))
    print(f"use it: arena run --agent demo --demo-library {summary.out_dir}")
    return 0


def _store_migrate(args: argparse.Namespace) -> int:
    from adapters.store.migrate import migrate

    if not isinstance(args.to, str):
        raise ValueError("--to: give the team store's URL postgresql://USER@HOST/DB (or set ARENA_STORE_URL)")
    if not args.file.is_file():
        raise ValueError(f"{args.file}: no such DuckDB file")
    with ResultStore(args.to) as target:
        report = migrate(args.file, target)
        print(f"{args.file} -> {target.location}: {len(report.copied)} run(s) copied "
              f"({report.results} results, {report.steps} steps), {len(report.skipped)} already there")
    for run_id in report.skipped:
        print(f"  skipped {run_id} (already in the team store)")
    return 0


def _pool(args: argparse.Namespace) -> int:
    from adapters.vms.base import ProviderError
    from adapters.vms.janitor import sweep_run
    from adapters.vms.registry import ProviderSettings, build_provider
    from adapters.vms.warm_pool import PoolPrices, WarmPool, pool_resource_id

    if args.pool_command == "up" and args.size < 1:
        raise ValueError(f"--size must be at least 1, got {args.size}")
    for option in ("vm_hour_price", "disk_gb_month_price", "ttl_hours"):
        value = getattr(args, option, None)
        if value is not None and (value < 0 or (option == "ttl_hours" and value == 0)):
            raise ValueError(f"--{option.replace('_', '-')} must be {'> 0' if option == 'ttl_hours' else '>= 0'}, "
                             f"got {value:g}")
    resource_id = pool_resource_id(args.name)
    provider = build_provider(args.provider, ProviderSettings(run_id=resource_id, cloud_config=args.config,
                                                              ttl_hours=args.ttl_hours))
    pool = WarmPool(provider, args.name, log=print)
    prices = PoolPrices(args.vm_hour_price, args.disk_gb_month_price)
    try:
        if args.pool_command == "up":
            pool.up(args.size)
        elif args.pool_command == "down" and args.delete:
            print(sweep_run(provider, resource_id).summary())
        elif args.pool_command == "down":
            pool.down()
        print("\n".join(pool.status(prices).lines()))
    except ProviderError as exc:
        print(f"arena: pool {args.pool_command} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        provider.close()
    return 0


def _janitor(args: argparse.Namespace) -> int:
    from flows.janitor import janitor

    for line in janitor(providers=args.provider or None, cloud_config=args.config, dry_run=args.dry_run):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from adapters.agents import AGENT_NAMES
    from adapters.vms.base import ResetLevel
    from adapters.vms.registry import PROVIDER_NAMES
    from adapters.vms.warm_pool import DEFAULT_POOL_TTL_HOURS

    parser = argparse.ArgumentParser(prog="arena", description="Windows Agent Arena evaluations with Prefect and DuckDB")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="evaluate a task suite (default: the bundled suite on the local simulation)")
    run.add_argument("--suite", type=Path, help="a WAA task directory (default: the bundled suite)")
    run.add_argument("--difficulty", choices=["normal", "hard"])
    run.add_argument("--domain", action="append", help="only this domain (repeatable)")
    run.add_argument("--task", action="append", help="only this task id (repeatable)")
    run.add_argument("--agent", choices=AGENT_NAMES, default="scripted", help="see adapters/agents/__init__.py")
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
        choices=[level.value for level in ResetLevel],
        help="how each VM is reset before a task (default snapshot; what a provider offers is checked up front)",
    )
    run.add_argument(
        "--settle", type=_settle, metavar="adaptive|SECONDS",
        help="wait after each action: until the screen is still (adaptive, the default on real VMs) "
        "or a fixed pause (WAA's runner: 3)",
    )
    run.add_argument("--max-steps", type=int)
    run.add_argument("--episode-timeout", type=float, help="wall-clock seconds per episode")
    run.add_argument("--max-attempts", type=int, help="attempts per task for infrastructure errors")
    run.add_argument("--db", type=_store, help=_DB_HELP)
    run.add_argument("--artifacts", type=Path, help="screenshot directory (default results/artifacts)")
    run.add_argument("--run-id", help="resume or name a run")
    run.add_argument(
        "--change-selection", action="store_true",
        help="resuming with other tasks (--task, --domain, ...) than the run selected: make them the run's selection",
    )
    run.add_argument("--quirks", action="store_true", help="local VMs reproduce a real WAA server's quirks")
    run.add_argument(
        "--provider",
        choices=[name for name in PROVIDER_NAMES if name != "existing"],  # existing servers: --waa-url
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
        "retiring it (default 60)",
    )
    run.add_argument("--verbose", action="store_true", help="show Prefect's task-state logs in the terminal")
    run.set_defaults(func=_run)

    probe = sub.add_parser("probe", help="check a WAA server layer by layer")
    probe.add_argument("url", help="the WAA server, e.g. http://127.0.0.1:5000")
    probe.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the server to become ready")
    probe.set_defaults(func=_probe)

    notify = sub.add_parser("notify", help="send events to the Prefect server (needs PREFECT_API_URL)")
    notify_sub = notify.add_subparsers(dest="notify_command", required=True)
    updated = notify_sub.add_parser("model-updated", help="emit model.updated: starts the on-model-update deployment")
    updated.add_argument("model", help="model name or checkpoint id (becomes resource model.<model>)")
    updated.add_argument("--endpoint", help="OpenAI-compatible base URL serving the model")
    updated.add_argument("--checkpoint", help="checkpoint path or URI (recorded with the run)")
    updated.set_defaults(func=_notify_model_updated)

    status = sub.add_parser("status", help="whether the served deployments will run and when the nightly runs next "
                                           "(needs PREFECT_API_URL)")
    status.set_defaults(func=_status)

    janitor = sub.add_parser("janitor", help="delete expired cloud resources this product created")
    janitor.add_argument("--provider", action="append", choices=["aws", "azure", "kvm"])
    janitor.add_argument("--config", type=Path, help="cloud settings TOML (default $ARENA_CONFIG or ./arena.toml)")
    janitor.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    janitor.set_defaults(func=_janitor)

    pool = sub.add_parser("pool", help="warm pools: VMs kept between runs, stopped while idle (aws, azure)")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True)
    for command, text in (
        ("up", "create the pool's VMs, or start them when stopped, and wait until each WAA server answers"),
        ("down", "stop (aws) / deallocate (azure) the pool's VMs: only their disks bill until the next up"),
        ("status", "each VM's state, size, expiry, and what the pool costs per hour as it stands"),
    ):
        command_parser = pool_sub.add_parser(command, help=text)
        command_parser.add_argument("--provider", choices=["aws", "azure"], required=True)
        command_parser.add_argument("--name", required=True, help="the pool's name, e.g. nightly (a-z, 0-9, -)")
        command_parser.add_argument("--config", type=Path,
                                    help="cloud settings TOML (default $ARENA_CONFIG or ./arena.toml)")
        command_parser.add_argument("--ttl-hours", type=float, default=DEFAULT_POOL_TTL_HOURS,
                                    help="the janitor deletes a pool not brought up or down for this long "
                                    f"(default {DEFAULT_POOL_TTL_HOURS:g})")
        command_parser.add_argument("--vm-hour-price", type=float,
                                    help="USD per VM-hour for the cost line (default: list price of known sizes)")
        command_parser.add_argument("--disk-gb-month-price", type=float,
                                    help="USD per disk GB-month for the cost line (default: gp3 / Premium SSD)")
        if command == "up":
            command_parser.add_argument("--size", type=int, required=True, help="number of VMs")
        if command == "down":
            command_parser.add_argument("--delete", action="store_true",
                                        help="delete the pool's VMs, disks and network instead of stopping them")
        command_parser.set_defaults(func=_pool)

    from flows.run_config import default_store_url

    # A string default goes through `_store` like a typed value (argparse does that).
    default_db = default_store_url() or "results/arena.duckdb"
    from adapters.vms.cloud_checks import DEFAULT_EGRESS_URL

    doctor = sub.add_parser("doctor", help="preflight checks with fixes: store, Prefect server and deployments, "
                            "WAA servers, model endpoint, cloud (credentials, quota, image, address)")
    doctor.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    doctor.add_argument("--waa-url", action="append", help="a WAA server to check (repeatable)")
    doctor.add_argument("--agent", choices=AGENT_NAMES, help="check this agent's model endpoint and API key")
    doctor.add_argument("--model", help="the model the endpoint must serve")
    doctor.add_argument("--base-url", help="model API base URL (default: the vendor's)")
    doctor.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    doctor.add_argument("--provider", choices=["aws", "azure"],
                        help="check this cloud: credentials, sizes and quota, image, controller address")
    doctor.add_argument("--config", type=Path, help="cloud settings TOML (default $ARENA_CONFIG or ./arena.toml)")
    doctor.add_argument("--pool-size", type=int, default=4, help="the pool the quota must hold (default 4)")
    doctor.add_argument("--warm-pool", metavar="NAME", help="also check that this warm pool's running VMs answer")
    doctor.add_argument("--egress-url", default=DEFAULT_EGRESS_URL,
                        help=f"a service answering with this host's public IP (default {DEFAULT_EGRESS_URL})")
    doctor.add_argument("--stop-local-servers", nargs="*", type=int, metavar="PORT",
                        help="stop the local Prefect servers arena run started (all, or those on these ports), "
                        "then exit; runs using them lose their server")
    doctor.set_defaults(func=_doctor)

    plan = sub.add_parser("plan", help="estimated wall time and cost of a run, from recorded durations, before it starts")
    plan.add_argument("--suite", type=Path, help="a WAA task directory (default: the bundled suite)")
    plan.add_argument("--difficulty", choices=["normal", "hard"], default="normal")
    plan.add_argument("--domain", action="append", help="only this domain (repeatable)")
    plan.add_argument("--task", action="append", help="only this task id (repeatable)")
    plan.add_argument("--agent", choices=AGENT_NAMES, default="scripted", help="whose recorded durations to prefer")
    plan.add_argument("--pool-size", type=int, default=4, help="number of VMs (default 4)")
    plan.add_argument("--vm-hour-price", type=float, default=0.0, help="USD per VM-hour (default 0)")
    plan.add_argument("--max-cost", type=float, help="USD: exit 4 when the estimate is above it")
    plan.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    plan.set_defaults(func=_plan)

    report = sub.add_parser("report", help="a run's metrics in the terminal, and a self-contained HTML report")
    report.add_argument("run", help="the run id (or 'latest')")
    report.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    report.add_argument("--html", type=Path, help="HTML file to write (default: reports/<run>.html beside the DB)")
    report.add_argument(
        "--demo-library", type=Path, help="demonstrations to score trajectories against (besides the suite's plans)"
    )
    report.set_defaults(func=_report)

    compare = sub.add_parser("compare", help="compare two runs: per-domain deltas, flips, a paired-test verdict")
    compare.add_argument("baseline", help="the baseline run id (or 'latest')")
    compare.add_argument("new", help="the run compared with it (or 'latest')")
    compare.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    compare.set_defaults(func=_compare)

    from adapters.benchmark import OutcomeKind

    export = sub.add_parser("export", help="a run's tables as Parquet, or episodes as training data "
                            "(sft, trajectories, inspect): docs/training.md")
    export.add_argument("run", nargs="+", help="run id(s) (or 'latest')")
    export.add_argument("--format", choices=["parquet", "sft", "trajectories", "inspect"], default="parquet",
                        help="parquet: the run's tables; sft: chat samples per step; trajectories: one record per "
                        "episode; inspect: an inspect_ai eval log")
    export.add_argument("--out", type=Path, metavar="DIR", help="the output directory (created)")
    export.add_argument("--parquet", type=Path, metavar="DIR", help="directory for the .parquet files (parquet)")
    export.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    export.add_argument("--overwrite", action="store_true", help="replace existing files in DIR")
    export.add_argument("--outcome", action="append", choices=[o.value for o in OutcomeKind],
                        help="only episodes with this outcome (repeatable)")
    export.add_argument("--success-only", action="store_true", help="only solved episodes")
    export.add_argument("--domain", action="append", help="only this domain (repeatable)")
    export.add_argument("--task", action="append", help="only this task id (repeatable)")
    export.add_argument("--model", action="append", help="only runs of this model or checkpoint (repeatable)")
    export.add_argument("--since", type=_date, metavar="YYYY-MM-DD", help="only runs started on or after this day")
    export.add_argument("--until", type=_date, metavar="YYYY-MM-DD", help="only runs started on or before this day")
    export.add_argument("--all-attempts", action="store_true", help="every attempt, not only each task's final one")
    export.add_argument("--images", choices=["files", "embed", "none"], default="files",
                        help="screenshots as files beside the JSONL (default), embedded as data URLs, or left out")
    export.add_argument("--held-out", action="append", type=Path, metavar="SUITE_DIR",
                        help="a suite whose tasks must not become training data (repeatable; also "
                        "$ARENA_HELD_OUT_SUITES and arena-suite.toml held_out = true)")
    export.add_argument("--allow-held-out", action="store_true", help="export held-out tasks anyway (recorded)")
    export.set_defaults(func=_export)

    demos = sub.add_parser("demos", help="demonstration libraries for the demo agent")
    demos_sub = demos.add_subparsers(dest="demos_command", required=True)
    demos_build = demos_sub.add_parser("build", help="one demo per task solved in the run(s), with provenance")
    demos_build.add_argument("--from-run", action="append", required=True, metavar="RUN",
                             help="a run id or 'latest' (repeatable: the shortest solution per task wins)")
    demos_build.add_argument("--out", type=Path, required=True, metavar="DIR", help="the library directory (created)")
    demos_build.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    demos_build.add_argument("--held-out", action="append", type=Path, metavar="SUITE_DIR",
                             help="leave out the tasks of this suite (repeatable; also $ARENA_HELD_OUT_SUITES)")
    demos_build.add_argument("--allow-held-out", action="store_true", help="keep held-out tasks")
    demos_build.add_argument("--include-infeasible", action="store_true",
                             help="keep infeasible tasks (their demos end in FAIL)")
    demos_build.add_argument("--overwrite", action="store_true", help="replace an existing library in DIR")
    demos_build.set_defaults(func=_demos_build)

    sql = sub.add_parser("sql", help="run one SQL query on the results and print the rows (safe while runs write)")
    sql.add_argument("query", help="the SQL query, e.g. \"SELECT run_id, status FROM runs\"")
    sql.add_argument("--db", type=_store, default=default_db, help=_DB_HELP)
    sql.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    sql.set_defaults(func=_sql)

    store = sub.add_parser("store", help="the results store")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    store_migrate = store_sub.add_parser("migrate", help="copy a DuckDB results file's runs into the team store")
    store_migrate.add_argument("file", type=Path, help="the DuckDB file, e.g. results/arena.duckdb")
    store_migrate.add_argument(
        "--to", type=_store, default=default_store_url(),
        help="the team store postgresql://USER@HOST/DB (password from PGPASSWORD or ~/.pgpass); default $ARENA_STORE_URL",
    )
    store_migrate.set_defaults(func=_store_migrate)

    tasks = sub.add_parser("tasks", help="inspect task suites")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    listing = tasks_sub.add_parser("list", help="tasks per domain")
    listing.add_argument("--waa-dir", type=Path, help="a WAA task directory (default: the bundled suite)")
    listing.add_argument("--difficulty", choices=["normal", "hard"], default="normal")
    listing.add_argument("--domain", action="append")
    listing.add_argument("--ids", action="store_true", help="print every task id")
    listing.set_defaults(func=_tasks_list)
    new = tasks_sub.add_parser("new", help="scaffold a task in WAA's format (launch, optional files, an evaluator "
                               "from the registries) and check it at once (lint + load)")
    new.add_argument("--suite", type=Path, help="the suite directory to add it to (created when new)")
    new.add_argument("--app", help="the app (domain): notepad, vs_code, chrome, ... (--list shows all)")
    new.add_argument("--id", help="the task id (names its file)")
    new.add_argument("--instruction", help="what the agent is asked to do")
    new.add_argument("--metric", default="exact_match", help="the evaluator's metric (default exact_match)")
    new.add_argument("--result", default="vm_command_line", help="the result getter (default vm_command_line)")
    new.add_argument("--result-param", action="append", metavar="KEY=VALUE",
                     help="a parameter of the result getter, e.g. command=... or path=C:\\Users\\Docker\\x.txt")
    new.add_argument("--expected", help="the expected value (JSON when it parses as JSON, else text)")
    new.add_argument("--expected-getter", default="rule",
                     help="where the expected value comes from (default rule: --expected); e.g. cloud_file")
    new.add_argument("--expected-param", action="append", metavar="KEY=VALUE",
                     help="a parameter of the expected getter, e.g. path=https://... dest=gold.txt")
    new.add_argument("--open", action="append", metavar="PATH", help="a file to open after the app starts")
    new.add_argument("--download", action="append", metavar="URL=PATH", help="a file to put on the VM first")
    new.add_argument("--save-before-eval", action="store_true", help="press ctrl+s in the app before evaluating")
    new.add_argument("--overwrite", action="store_true", help="replace a task of the same id")
    new.add_argument("--list", action="store_true", help="list the apps, setup types, getters and metrics, and exit")
    new.set_defaults(func=_tasks_new)
    lint = tasks_sub.add_parser("lint", help="task-data problems before any VM starts: Linux paths, uploads into "
                                "missing folders, programs Windows lacks, unknown names, unfetchable files, "
                                "infeasible tasks a bare FAIL scores, duplicated ids (exit 1 on a problem)")
    lint.add_argument("dir", nargs="+", type=Path, help="a WAA task directory (holding test_all.json)")
    lint.add_argument("--difficulty", choices=["normal", "hard"], default="normal")
    lint.add_argument("--check-urls", action="store_true", help="ask each download / cloud_file URL (network)")
    lint.add_argument("--offline", action="store_true", help="check the URLs against the download cache instead")
    lint.add_argument("--cache-dir", type=Path, help="the download cache for --offline")
    lint.set_defaults(func=_tasks_lint)
    coverage = tasks_sub.add_parser("coverage", help="which tasks have every setup step, getter and metric supported")
    coverage.add_argument("--waa-dir", type=Path, help="a WAA task directory (default: the bundled suite)")
    coverage.add_argument("--difficulty", choices=["normal", "hard"], default="normal")
    coverage.add_argument("--domain", action="append")
    coverage.add_argument("--ids", action="store_true", help="a line for every task, supported or not")
    coverage.set_defaults(func=_tasks_coverage)

    # -- arena image: build the VM image the cloud providers boot from (flows/image_build.py) --
    image = sub.add_parser("image", help="build the cloud VM image WAA runs from (resumable), and show a build's stages")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    image_build = image_sub.add_parser("build", help="build (or resume building) an image: builder VM -> WAA ready "
                                       "-> capture -> verify -> delete the builder")
    image_build.add_argument("--provider", choices=["aws", "azure"], required=True)
    image_build.add_argument("--name", required=True, help="the build's name (a-z, 0-9, -): rerunning it resumes")
    image_build.add_argument("--container-image", help="the WAA container to pull, e.g. windowsarena/winarena:latest "
                             "(pinned by digest when the registry answers)")
    image_build.add_argument("--waa-repo", help="or build the container from this WAA git repository (https)")
    image_build.add_argument("--waa-commit", help="at this full commit id")
    image_build.add_argument("--windows-iso-url", help="a Windows 11 ISO in your own storage (https; a SAS or "
                             "pre-signed URL is never recorded with its query)")
    image_build.add_argument("--prepared-storage-url", help="or a prepared WAA storage archive (.tar, .tar.gz, "
                             ".tar.zst, .zip), e.g. WAA-V2's VM snapshot copied to your storage")
    image_build.add_argument("--builder-size", help="instance type / VM size with nested virtualization "
                             "(default m8i.2xlarge / Standard_D8ds_v5)")
    image_build.add_argument("--base-image", help="the builder's base image (default Ubuntu 24.04): ami-... or "
                             "publisher:offer:sku:version")
    image_build.add_argument("--disk-gb", type=int, help="the builder's OS disk size (default 256)")
    image_build.add_argument("--ready-timeout", type=float, help="seconds to wait for Windows and the WAA server "
                             "(default 10800)")
    image_build.add_argument("--gallery", help="azure: the compute gallery (default waa_arena)")
    image_build.add_argument("--config", type=Path, help="cloud settings TOML (default $ARENA_CONFIG or ./arena.toml)")
    image_build.set_defaults(func=_image_build)
    image_status = image_sub.add_parser("status", help="which stages of a build are done, read from the cloud")
    image_status.add_argument("name", help="the build's name")
    image_status.add_argument("--provider", choices=["aws", "azure"], required=True)
    image_status.add_argument("--gallery", help="azure: the compute gallery (default waa_arena)")
    image_status.add_argument("--config", type=Path, help="cloud settings TOML (default $ARENA_CONFIG or ./arena.toml)")
    image_status.set_defaults(func=_image_status)
    return parser


_IMAGE_SPEC_OPTIONS = ("container_image", "waa_repo", "waa_commit", "windows_iso_url", "prepared_storage_url",
                       "builder_size", "base_image", "disk_gb", "ready_timeout", "gallery")


def _image_spec(args: argparse.Namespace, **fixed: object) -> object:
    """The BuildSpec from `arena image` options; bad input is one line naming the option."""
    from adapters.images.spec import BuildSpec, spec_error_text

    values = {key: getattr(args, key) for key in _IMAGE_SPEC_OPTIONS if getattr(args, key, None) is not None}
    try:
        return BuildSpec(provider=args.provider, name=args.name, **values, **fixed)
    except ValidationError as exc:
        raise ValueError(f"image build: {spec_error_text(exc)}") from None


def _image_build(args: argparse.Namespace) -> int:
    from adapters.images.stages import BuildError
    from adapters.vms.base import ProviderError
    from flows.image_build import image_build

    spec = _image_spec(args)
    try:
        image_id = image_build(spec=spec, cloud_config=args.config)
    except (BuildError, ProviderError) as exc:
        print(f"arena: image build {args.name} failed: {exc}", file=sys.stderr)
        print(f"arena: rerun the same command to resume; `arena image status {args.name} --provider "
              f"{args.provider}` shows the stages", file=sys.stderr)
        return EXIT_FAILED
    print(image_id)
    return 0


def _image_status(args: argparse.Namespace) -> int:
    from adapters.images.builders import make_builder
    from adapters.images.stages import BuildError

    # Status needs only the name; a placeholder source satisfies the spec's checks.
    spec = _image_spec(args, container_image="status/only", windows_iso_url="https://status.invalid/only.iso")
    builder = make_builder(spec, args.config)
    try:
        print("\n".join(builder.status().lines()))
    except BuildError as exc:
        print(f"arena: image status {args.name}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        builder.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `arena` console command."""
    # The Prefect server's analytics cannot reach the internet here and only log failures.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = build_parser().parse_args(argv)
    # Called as the process's own command (not from Python with an argument list): the process
    # is ours to watch over (see flows/reaper.py).
    args.owns_process = argv is None
    try:
        return int(args.func(args))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        print(f"arena: error: {problems}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, StoreError, ExportError) as exc:
        print(f"arena: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
