"""The `arena` command line: one module per group of commands, each thin over the adapters and flows.

    run.py          arena run | localenv           evaluate a suite (default: the bundled suite on the local
                                                   simulation); that simulation alone
    preflight.py    arena plan | doctor | probe    before a run: time and cost, checks with fixes, a WAA server
    results.py      arena report | compare | history | export | sql | demos build | store migrate
    tasks.py        arena tasks list | coverage | lint | new
    cloud.py        arena pool | image | janitor   warm pools, VM images, expired resources
    deployments.py  arena status | notify          the served deployments and the events that start them
    common.py       exit statuses, option types and help shared by the groups

RUN may be `latest` (the most recently started run in the database). Every --db takes a DuckDB
file or the team store's PostgreSQL URL; $ARENA_STORE_URL, when set, is the default.

Building the parser imports no Prefect, pydantic or DuckDB (`tests/flows/test_cli_startup.py`):
each command imports what it needs when it runs, so `arena --help` and the commands that run no
flow start at once.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
from collections.abc import Sequence

from flows.cli import cloud, deployments, preflight, results, run, tasks
from flows.cli.common import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OVER_BUDGET, EXIT_STORE_FAILED,
                              EXIT_TERMINATED, RUN_EXIT_CODES, ArenaParser, CtrlC, LazyChoices, option_errors)
from flows.cli.deployments import SERVED_DEPLOYMENTS
from flows.cli.results import write_run_report

__all__ = [
    "EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OVER_BUDGET", "EXIT_STORE_FAILED", "EXIT_TERMINATED",
    "RUN_EXIT_CODES", "SERVED_DEPLOYMENTS", "build_parser", "main", "write_run_report",
]

# The sub-commands in the order `arena --help` lists them.


_COMMANDS = (
    run.add_run, run.add_localenv, preflight.add_probe, deployments.add_notify, deployments.add_status,
    cloud.add_janitor, cloud.add_pool, preflight.add_doctor, preflight.add_plan, results.add_report, results.add_compare,
    results.add_history, results.add_export, results.add_demos, results.add_sql, results.add_store, tasks.add_tasks, cloud.add_image,
)


def build_parser() -> argparse.ArgumentParser:
    """The `arena` parser with every sub-command and option."""
    parser = ArenaParser(prog="arena", description="Windows Agent Arena evaluations with Prefect and DuckDB")
    sub = parser.add_subparsers(dest="command", required=True)
    with LazyChoices.deferred():
        for add in _COMMANDS:
            add(sub)
    return parser


def _bad_input(exc: Exception, command: argparse.ArgumentParser) -> str | None:
    """The one line for an error in what the user gave, or None for anything else.

    The exception classes are imported here, not at the top, so that starting a command does
    not load pydantic or DuckDB; a command that raised one of them has loaded its module already."""
    from pydantic import ValidationError

    from adapters.training.output import OutputExists

    if isinstance(exc, OutputExists):  # the adapters say overwrite=True; here it is an option
        return exc.with_option("--overwrite")
    if isinstance(exc, ValidationError):  # a field named like its option: name the option
        options = {action.dest: action.option_strings[-1] for action in command._actions  # noqa: SLF001
                   if action.option_strings}
        return option_errors(exc, options)
    if isinstance(exc, (ValueError, FileNotFoundError)):
        return str(exc)
    from adapters.extras import ExtraMissing
    from adapters.results.export import ExportError
    from adapters.store.errors import StoreError

    return str(exc) if isinstance(exc, (StoreError, ExportError, ExtraMissing)) else None


def _interrupted() -> int:
    """Ctrl-C where the command does not handle it itself (`arena run` does once its run is under
    way; before that it is importing what it runs): one line, not a traceback."""
    print("arena: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `arena` console command."""
    # The Prefect server's analytics cannot reach the internet here and only log failures.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    # Called as the process's own command (not from Python with an argument list): the process
    # is ours to watch over (see flows/reaper.py).
    args.owns_process = argv is None
    if args.owns_process:
        # Python's last garbage collection at exit walks every object of the run and of the
        # ~1,400 modules it imported (0.4 s measured after `arena run`), to free memory the
        # process is about to give back anyway. Registered before anything else, so it runs
        # after every other exit handler (Prefect's flushes, closing files).
        atexit.register(gc.freeze)
    args.command_parser = parser.command_parser(args)  # for hints that repeat the command's options
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`arena report latest | head`): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as exc:
        if CtrlC.came:  # a Ctrl-C that a library reported as an error of its own
            return _interrupted()
        problem = _bad_input(exc, args.command_parser)
        if problem is None:
            raise
        print(f"arena: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
