"""Reading results back: `arena report`, `compare`, `history`, `export`, `sql`, `demos build` and
`store migrate`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from flows.cli.common import DB_HELP, OUTCOME_CHOICES, command_line, date, default_db, resolve_run_id, store_location


def _default_report_path(db: Path | str, run_id: str) -> Path:
    """Where reports go unless told: a `reports` folder beside the database (for the team
    store, results/reports in the working directory)."""
    folder = Path("results") if isinstance(db, str) else db.parent
    return folder / "reports" / f"{run_id}.html"


def write_run_report(
    db: Path | str, run_id: str, html: Path | None = None, demo_library: Path | None = None,
    show: Callable[[str], None] | None = None, *, videos: bool = False,
) -> tuple[str, Path]:
    """The terminal report of a run, and its HTML report written to `html` (default: beside the DB).

    `show` gets the terminal report as soon as it is ready, before the slower HTML is written.
    `videos`: the HTML plays the flipped and failed tasks' episodes (`arena report` does; the
    report `arena run` writes at its end does not, to end the run without encoding them)."""
    from adapters.results.metrics import compute_run_metrics, references_for_run
    from adapters.results.report_html import write_html_report
    from adapters.results.report_text import format_text_report
    from adapters.store.duckdb_store import ResultStore, StoreError

    if isinstance(db, Path) and not db.is_file():
        raise StoreError(f"{db.resolve()}: results database not found")
    with ResultStore(db, read_only=True) as store, store.held_open():
        references = references_for_run(store, run_id, demo_library)
        metrics = compute_run_metrics(store, run_id, references)  # once, for both reports
        text = format_text_report(metrics)
        if show is not None:
            show(text)
        path = write_html_report(store, run_id, html or _default_report_path(db, run_id), references, metrics,
                                 videos=videos)
    return text, path


def _report(args: argparse.Namespace) -> int:
    run_id = resolve_run_id(args.db, args.run)

    def show(text: str) -> None:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)

    _, path = write_run_report(args.db, run_id, args.html, args.demo_library, show=show, videos=not args.no_videos)
    print(f"\nHTML report: {path.resolve()}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from adapters.results.compare import compare_stored_runs, render_comparison_text

    comparison = compare_stored_runs(args.db, resolve_run_id(args.db, args.baseline), resolve_run_id(args.db, args.new))
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
        with results_connection(args.db, private=True) as conn:
            # The connection is read-only; this also forbids files: no COPY ... TO, read_csv,
            # ATTACH or extensions, and the setting cannot be turned back on (in a database of
            # its own: the process's shared one attaches files).
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
        writer = csv.writer(sys.stdout, lineterminator="\n")  # the csv module's default is CRLF
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

    runs = [resolve_run_id(args.db, run) for run in args.run]
    out = args.out or args.parquet
    if out is None:
        raise ValueError("give the output directory: --out DIR (or --parquet DIR for the Parquet tables)")
    if args.format == "video":
        if len(runs) != 1:
            raise ValueError("the video format exports one run at a time; give one run id")
        from adapters.results.episode_video import write_episode_videos
        from adapters.store.duckdb_store import ResultStore

        with ResultStore(args.db, read_only=True) as store:
            if store.get_run(runs[0]) is None:
                raise ValueError(f"{store.location}: unknown run {runs[0]!r}")
            for path in write_episode_videos(store, runs[0], Path(out), task_ids=args.task or [],
                                             outcomes=args.outcome or [], domains=args.domain or []):
                print(path)
        return 0
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

    summary = build_demo_library(args.db, [resolve_run_id(args.db, run) for run in args.from_run], args.out,
                                 held_out=held_out_dirs(args.held_out or []), allow_held_out=args.allow_held_out,
                                 include_infeasible=args.include_infeasible, overwrite=args.overwrite)
    print("\n".join(summary.lines()))
    print(f"use it: {command_line('run', '--agent', 'demo', '--demo-library', summary.out_dir)}")
    return 0


def _store_migrate(args: argparse.Namespace) -> int:
    from adapters.store.migrate import migrate

    if not isinstance(args.to, str):
        raise ValueError("--to: give the team store's URL postgresql://USER@HOST/DB (or set ARENA_STORE_URL)")
    if not args.file.is_file():
        raise ValueError(f"{args.file}: no such DuckDB file")
    from adapters.store.duckdb_store import ResultStore

    with ResultStore(args.to) as target:
        report = migrate(args.file, target)
        print(f"{args.file} -> {target.location}: {len(report.copied)} run(s) copied "
              f"({report.results} results, {report.steps} steps), {len(report.skipped)} already there")
    for run_id in report.skipped:
        print(f"  skipped {run_id} (already in the team store)")
    return 0


def add_report(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena report RUN`."""
    report = sub.add_parser("report", help="a run's metrics in the terminal, and a self-contained HTML report")
    report.add_argument("run", help="the run id (or 'latest')")
    report.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    report.add_argument("--html", type=Path, help="HTML file to write (default: reports/<run>.html beside the DB)")
    report.add_argument(
        "--demo-library", type=Path, help="demonstrations to score trajectories against (besides the suite's plans)"
    )
    report.add_argument("--no-videos", action="store_true",
                        help="leave out the videos of flipped and failed tasks (about a second each to make)")
    report.set_defaults(func=_report)


def add_compare(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena compare BASELINE NEW`."""
    compare = sub.add_parser("compare", help="compare two runs: per-domain deltas, flips, a paired-test verdict")
    compare.add_argument("baseline", help="the baseline run id (or 'latest')")
    compare.add_argument("new", help="the run compared with it (or 'latest')")
    compare.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    compare.set_defaults(func=_compare)


def _history(args: argparse.Namespace) -> int:
    from adapters.results.history import baseline_history, stored_baselines
    from adapters.results.history_report import history_page, history_text

    if args.baseline is None:
        known = stored_baselines(args.db)
        if not known:
            print(f"no run of any baseline in {args.db} (runs of a baseline come from the nightly, "
                  "`evaluate-baseline/on-demand`, or SuiteRunConfig(baseline=...))")
            return 0
        for name, count in known.items():
            print(f"{name}: {count} run(s)")
        print(f"\n{command_line('history', next(iter(known)))} shows one")
        return 0
    history = baseline_history(args.db, args.baseline, nights=args.nights, window=args.window, alpha=args.alpha)
    print(history_text(history), end="")
    if args.html is not None:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(history_page(history), encoding="utf-8")
        print(f"\nHTML: {args.html.resolve()}")
    # A regression on the latest night is the answer a script asks for (like `arena compare`).
    latest = history.nights[-1].change
    return 1 if latest is not None and latest.kind == "regression" else 0


def add_history(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena history [BASELINE]`."""
    history = sub.add_parser("history", help="a baseline's nights: rates with intervals, per domain, cost, time, "
                             "flipped tasks, and the nights that differ from their recent past by more than noise")
    history.add_argument("baseline", nargs="?", help="the baseline's name (without: the baselines with runs)")
    history.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    history.add_argument("--nights", type=int, default=30, help="how many of the latest nights (default 30)")
    history.add_argument("--window", type=int, default=7,
                         help="how many earlier nights each night is tested against (default 7)")
    history.add_argument("--alpha", type=float, default=0.05, help="the test's two-sided level (default 0.05)")
    history.add_argument("--html", type=Path, help="also write the history with its charts to this HTML file")
    history.set_defaults(func=_history)


def add_export(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena export RUN`."""
    export = sub.add_parser("export", help="a run's tables as Parquet, or episodes as training data "
                            "(sft, trajectories, inspect): docs/training.md")
    export.add_argument("run", nargs="+", help="run id(s) (or 'latest')")
    export.add_argument("--format", choices=["parquet", "sft", "trajectories", "inspect", "video"], default="parquet",
                        help="parquet: the run's tables; sft: chat samples per step; trajectories: one record per "
                        "episode; inspect: an inspect_ai eval log; video: an MP4 per task's final attempt "
                        "(the video extra)")
    export.add_argument("--out", type=Path, metavar="DIR", help="the output directory (created)")
    export.add_argument("--parquet", type=Path, metavar="DIR", help="directory for the .parquet files (parquet)")
    export.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    export.add_argument("--overwrite", action="store_true", help="replace an earlier export in DIR")
    export.add_argument("--outcome", action="append", choices=OUTCOME_CHOICES,
                        help="only episodes with this outcome (repeatable)")
    export.add_argument("--success-only", action="store_true", help="only solved episodes")
    export.add_argument("--domain", action="append", help="only this domain (repeatable)")
    export.add_argument("--task", action="append", help="only this task id (repeatable)")
    export.add_argument("--model", action="append", help="only runs of this model or checkpoint (repeatable)")
    export.add_argument("--since", type=date, metavar="YYYY-MM-DD", help="only runs started on or after this day")
    export.add_argument("--until", type=date, metavar="YYYY-MM-DD", help="only runs started on or before this day")
    export.add_argument("--all-attempts", action="store_true", help="every attempt, not only each task's final one")
    export.add_argument("--images", choices=["files", "embed", "none"], default="files",
                        help="screenshots as files beside the JSONL (default), embedded as data URLs, or left out")
    export.add_argument("--held-out", action="append", type=Path, metavar="SUITE_DIR",
                        help="a suite whose tasks must not become training data (repeatable; also "
                        "$ARENA_HELD_OUT_SUITES and arena-suite.toml held_out = true)")
    export.add_argument("--allow-held-out", action="store_true", help="export held-out tasks anyway (recorded)")
    export.set_defaults(func=_export)


def add_demos(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena demos build`."""
    demos = sub.add_parser("demos", help="demonstration libraries for the demo agent")
    demos_sub = demos.add_subparsers(dest="demos_command", required=True)
    demos_build = demos_sub.add_parser("build", help="one demo per task solved in the run(s), with provenance")
    demos_build.add_argument("--from-run", action="append", required=True, metavar="RUN",
                             help="a run id or 'latest' (repeatable: the shortest solution per task wins)")
    demos_build.add_argument("--out", type=Path, required=True, metavar="DIR", help="the library directory (created)")
    demos_build.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    demos_build.add_argument("--held-out", action="append", type=Path, metavar="SUITE_DIR",
                             help="leave out the tasks of this suite (repeatable; also $ARENA_HELD_OUT_SUITES)")
    demos_build.add_argument("--allow-held-out", action="store_true", help="keep held-out tasks")
    demos_build.add_argument("--include-infeasible", action="store_true",
                             help="keep infeasible tasks (their demos end in FAIL)")
    demos_build.add_argument("--overwrite", action="store_true", help="replace an earlier library in DIR")
    demos_build.set_defaults(func=_demos_build)


def add_sql(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena sql QUERY`."""
    sql = sub.add_parser("sql", help="run one SQL query on the results and print the rows (safe while runs write)")
    sql.add_argument("query", help="the SQL query, e.g. \"SELECT run_id, status FROM runs\"")
    sql.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    sql.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    sql.set_defaults(func=_sql)


def add_store(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena store migrate FILE`."""
    from adapters.store_location import default_store_url

    store = sub.add_parser("store", help="the results store")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    store_migrate = store_sub.add_parser("migrate", help="copy a DuckDB results file's runs into the team store")
    store_migrate.add_argument("file", type=Path, help="the DuckDB file, e.g. results/arena.duckdb")
    store_migrate.add_argument(
        "--to", type=store_location, default=default_store_url(),
        help="the team store postgresql://USER@HOST/DB (password from PGPASSWORD or ~/.pgpass); default $ARENA_STORE_URL",
    )
    store_migrate.set_defaults(func=_store_migrate)
