"""Task suites: `arena tasks list`, `coverage`, `lint` and `new`; `arena tasks stability`: per-task
stability across stored runs and trials."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli.common import DB_HELP, command_line, default_db, store_location


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
        print(f"{len(result.problems)} problem(s): fix the file, then check it again with "
              f"{command_line('tasks', 'lint', args.suite)}")
        return 1
    run = command_line("run", "--suite", args.suite, "--task", args.id)
    print(f"checked: lint clean and it loads; run it with {run}")
    return 0


def _tasks_stability(args: argparse.Namespace) -> int:
    from adapters.results.trials.stability import stability_report
    from adapters.store.duckdb_store import ResultStore

    if args.runs is not None and args.runs < 1:
        raise ValueError(f"--runs {args.runs}: must be at least 1")
    if not isinstance(args.db, str) and not args.db.exists():
        raise ValueError(f"--db {args.db}: no results database there")
    with ResultStore(args.db, read_only=True) as store:
        text, groups = stability_report(store, agent=args.agent, model=args.model, runs=args.runs)
    print(text if groups else "no stored results match (--agent, --model)")
    return 0


def add_tasks(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena tasks list|coverage|lint|new|stability`."""
    tasks = sub.add_parser("tasks", help="inspect task suites")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    listing = tasks_sub.add_parser("list", help="tasks per domain")
    _add_suite_selection(listing, ids_help="print every task id")
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
    _add_suite_selection(coverage, ids_help="a line for every task, supported or not")
    coverage.set_defaults(func=_tasks_coverage)
    stability = tasks_sub.add_parser(
        "stability", help="per-task stability across stored runs and trials: flaky tasks with their trial outcomes, "
        "those of a deterministic agent (scripted, random) flagged as environment problems")
    stability.add_argument("--db", type=store_location, default=default_db(), help=DB_HELP)
    stability.add_argument("--agent", help="only runs of this agent")
    stability.add_argument("--model", help="only runs of this model id")
    stability.add_argument("--runs", type=int, metavar="N", help="only the N most recent matching runs")
    stability.set_defaults(func=_tasks_stability)


def _add_suite_selection(parser: argparse.ArgumentParser, ids_help: str) -> None:
    """The options that pick a suite's tasks (`tasks list`, `tasks coverage`)."""
    parser.add_argument("--waa-dir", type=Path, help="a WAA task directory (default: the bundled suite)")
    parser.add_argument("--difficulty", choices=["normal", "hard"], default="normal")
    parser.add_argument("--domain", action="append")
    parser.add_argument("--ids", action="store_true", help=ids_help)
