"""What every group of `arena` commands shares: exit statuses, option value types, option help.

Nothing heavy is imported here at module level (no Prefect, pydantic or DuckDB): building the
parser must stay fast, so `arena --help` and the commands that run no flow start at once. Names
that live in heavy modules (the agent and provider tables, the reset levels) reach the parser
through `LazyChoices`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, overload

from adapters.interrupts import raises_always, raising

if TYPE_CHECKING:
    from pydantic import ValidationError

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


class CtrlC:
    """Ctrl-C (SIGINT) for a command that owns its process: raises KeyboardInterrupt, as Python's
    own handler does, and remembers that it came, since a library can turn that exception into
    one of its own on the way up (pydantic reports it as a serialization error).

    A KeyboardInterrupt that lands inside a weakref callback or a `__del__` (the import system's
    module locks have one; a second of imports runs thousands) cannot propagate: Python prints
    "Exception ignored in ..." and goes on, and the Ctrl-C would be lost. Such a one is delivered
    again, once that callback has returned.
    """

    came = False

    # The pause before a swallowed Ctrl-C is delivered again: long enough for the callback that
    # swallowed it to return, short next to a person's patience.
    REDELIVER_AFTER_S = 0.05
    _next_hook: Callable[[sys.UnraisableHookArgs], Any] = staticmethod(sys.__unraisablehook__)

    @classmethod
    def handle(cls) -> None:
        """Install the handler, also where SIGINT was ignored (a background job of a script)."""
        signal.signal(signal.SIGINT, raises_always(cls._on_sigint))
        if sys.unraisablehook != cls._on_unraisable:  # once: the hook it replaces still gets the rest
            cls._next_hook = staticmethod(sys.unraisablehook)
            sys.unraisablehook = cls._on_unraisable

    @classmethod
    def _on_sigint(cls, signum: int, frame: object) -> None:
        cls.came = True
        raise raising(KeyboardInterrupt())

    @classmethod
    def _on_unraisable(cls, unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            # Sent from another thread after a pause: raised here, the interrupt would land in
            # this hook, and be swallowed once more.
            import threading

            timer = threading.Timer(cls.REDELIVER_AFTER_S, os.kill, (os.getpid(), signal.SIGINT))
            timer.daemon = True
            timer.start()
            return
        cls._next_hook(unraisable)


DB_HELP = (
    "DuckDB file, or the team store's URL postgresql://USER@HOST/DB (password from PGPASSWORD or ~/.pgpass); "
    "default $ARENA_STORE_URL, else results/arena.duckdb"
)


CLOUD_CONFIG_HELP = "cloud settings TOML (default $ARENA_CONFIG or ./arena.toml)"


class LazyChoices(Sequence[str]):
    """An option's choices, read from the table that owns them the first time argparse needs
    them (a value to check, a usage line to show).

    The agent and provider tables live in modules that import pydantic, the providers and more;
    loading them only when an option that needs them is used keeps `arena --help` and the
    commands without such an option fast, and the tables stay the only list of names.
    """

    # While the parser is built (`deferred()`), argparse's add_argument formats each option once
    # only to check its metavar against nargs, and throws the text away: iterating yields nothing
    # then instead of loading the table.
    _deferred = 0

    def __init__(self, load: Callable[[], Iterable[str]]) -> None:
        self._load = load
        self._names: tuple[str, ...] | None = None

    def _all(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(self._load())
        return self._names

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[str]:
        if LazyChoices._deferred and self._names is None:
            return iter(())
        return iter(self._all())

    @staticmethod
    @contextmanager
    def deferred() -> Iterator[None]:
        """Within: building a parser does not load any choices table."""
        LazyChoices._deferred += 1
        try:
            yield
        finally:
            LazyChoices._deferred -= 1

    def __contains__(self, value: object) -> bool:
        return value in self._all()


def _agent_names() -> Iterable[str]:
    from adapters.agents import AGENT_NAMES

    return AGENT_NAMES


def _reset_levels() -> Iterable[str]:
    from adapters.vms.base import ResetLevel

    return [level.value for level in ResetLevel]


def _run_providers() -> Iterable[str]:
    from adapters.vms.registry import PROVIDER_NAMES

    return [name for name in PROVIDER_NAMES if name != "existing"]  # existing servers: --waa-url


def _outcome_kinds() -> Iterable[str]:
    from adapters.outcome_kind import OutcomeKind

    return [o.value for o in OutcomeKind]


AGENT_CHOICES = LazyChoices(_agent_names)


RESET_LEVEL_CHOICES = LazyChoices(_reset_levels)


RUN_PROVIDER_CHOICES = LazyChoices(_run_providers)


OUTCOME_CHOICES = LazyChoices(_outcome_kinds)


def default_db() -> str:
    """The default --db: $ARENA_STORE_URL when set, else the DuckDB file under results/.

    A string default goes through `store_location` like a typed value (argparse does that)."""
    from adapters.store_location import default_store_url

    return default_store_url() or "results/arena.duckdb"


def store_location(value: str) -> Path | str:
    """A --db value: the team store's PostgreSQL URL (kept as text) or a DuckDB file's path."""
    from adapters.store_location import check_store_url, is_server_location

    if not is_server_location(value):
        return Path(value)
    try:
        return check_store_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def date(value: str) -> dt.date:
    """A YYYY-MM-DD option value."""
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a date like 2026-11-24") from None


def settle(value: str) -> float | str:
    """A --settle value: "adaptive" or a fixed pause in seconds (>= 0)."""
    from adapters.waa.settle import settle_choice

    try:
        return settle_choice(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pairs(option: str, form: str, values: list[str] | None) -> list[tuple[str, str]]:
    """KEY=VALUE option values split, or ValueError naming the option and the expected form."""
    found = []
    for value in values or []:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise ValueError(f"{option} {value!r}: expected {form}")
        found.append((key, rest))
    return found


def seconds(option: str, key: str, value: str) -> float:
    """A KEY=SECONDS value's seconds, or ValueError naming the option."""
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{option} {key}={value!r}: {value!r} is not a number of seconds") from None


def resolve_run_id(db: Path | str, run: str) -> str:
    """`run`, or the most recently started run's id when `run` is "latest"."""
    if run != "latest":
        return run
    from adapters.results.source import latest_run

    found = latest_run(db)
    if found is None:
        raise ValueError(f"{db}: no runs recorded yet")
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-command parsers of `parser` by name (none for a leaf command)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}



def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """"; did you mean X?" for the candidate closest to a misspelt `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class ArenaParser(argparse.ArgumentParser):
    """argparse, with errors a user can act on at once: one short usage line instead of every
    option, and a "did you mean" for a misspelt option, command or choice."""

    def short_usage(self) -> str:
        """`usage: arena run [options]`-style: the command, and its positionals."""
        parts = [self.prog]
        if any(a.option_strings and a.dest != "help" for a in self._actions):
            parts.append("[options]")
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                parts.append("COMMAND ...")
            elif not action.option_strings:
                parts.append(action.metavar or action.dest)
        help_command = " ".join([invoked_as(), *self.prog.split()[1:], "--help"])
        return f"usage: {' '.join(parts)}   ({help_command} shows all)"

    def error(self, message: str) -> NoReturn:
        """One usage line and the error (argparse prints the whole usage, 27 lines for run)."""
        self.exit(2, f"{self.short_usage()}\n{self.prog}: error: {message}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check (same words), plus the closest choice.
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            hint = did_you_mean(str(value), action.choices)
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - its dest is an internal name
                raise argparse.ArgumentError(None, f"unknown command {value!r} (choose from {choices}){hint}")
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {choices}){hint}")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but an unknown option is reported by the sub-command it was given to,
        with the closest option that command has."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.command_parser(parsed)
            options = [o for a in command._actions for o in a.option_strings]  # noqa: SLF001
            unknown = next((e.split("=")[0] for e in extras if e.startswith("-")), "")
            hint = did_you_mean(unknown, options) if unknown else ""
            command.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The (sub-)command parser that parsed `parsed`'s command."""
        parser: argparse.ArgumentParser = self
        while True:
            action = next((a for a in parser._actions  # noqa: SLF001
                           if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
            name = getattr(parsed, action.dest, None) if action is not None else None
            if action is None or name not in action.choices:
                return parser
            parser = action.choices[name]


def option_errors(exc: ValidationError, options: Mapping[str, str]) -> str:
    """A pydantic error in the words of the command line: each problem names the option
    (`options` maps a model's field to it) instead of the field, and the value given."""
    problems = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        # A validator's own ValueError already names the value; pydantic's own checks do not.
        own = error["msg"].startswith("Value error, ")
        text = error["msg"].removeprefix("Value error, ")
        option = next((options[part] for part in loc if part in options), None)
        given = error.get("input")
        if option is None:
            problems.append(f"{'.'.join(loc)}: {text}" if loc else text)
        elif own or not isinstance(given, (str, int, float)):
            problems.append(f"{option}: {text}")
        else:
            problems.append(f"{option} {given}: {text}")
    return "; ".join(problems)


def invoked_as() -> str:
    """The `arena` command as the user typed it, for hints to paste: `arena` when that is what
    the shell finds on PATH, else the path it was started by (e.g. `.venv/bin/arena`).

    Called from Python (tests, `python -m flows.cli`) the documented name, `arena`."""
    started_by = sys.argv[0] if sys.argv else ""
    if Path(started_by).name != "arena":
        return "arena"
    on_path = shutil.which("arena")
    if on_path and os.path.realpath(on_path) == os.path.realpath(started_by):
        return "arena"
    return shlex.quote(started_by)


def command_line(*words: object) -> str:
    """A command to paste: `invoked_as()` followed by `words`, each quoted for a POSIX shell."""
    return " ".join([invoked_as(), *(shlex.quote(str(w)) for w in words)])
