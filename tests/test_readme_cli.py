"""The README and docs/ agree with the CLI: every `arena ...` command they show exists, with
every option it is shown with."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from flows.cli import build_parser

PROJECT = Path(__file__).resolve().parents[1]
DOCS = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return dict(action.choices)
    return {}


def _shown_commands() -> list[tuple[str, int, str]]:
    """(file, line number, text after `arena `) for every command line the docs show: inline
    code spans and indented or fenced code lines."""
    shown = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            spans = re.findall(r"`([^`]*)`", line) if "`" in line else [line]
            for span in spans:
                for match in re.finditer(r"(?:^|[\s/])arena ([a-z][^#|]*)", span):
                    shown.append((doc.name, number, match.group(1).strip().rstrip("\\").strip()))
    return shown


SHOWN = _shown_commands()


def test_the_docs_show_commands() -> None:
    assert len(SHOWN) > 20, SHOWN  # the extraction itself works


@pytest.mark.parametrize("where, command", [(f"{f}:{n}", c) for f, n, c in SHOWN])
def test_every_shown_command_and_option_exists(where: str, command: str) -> None:
    parser = build_parser()
    tokens = command.split()
    commands = _subcommands(parser)
    assert tokens[0] in commands, f"{where}: `arena {command}`: no command {tokens[0]!r}"
    sub = commands[tokens[0]]
    nested = _subcommands(sub)
    if nested:
        assert len(tokens) > 1 and tokens[1] in nested, f"{where}: `arena {command}`: no command {' '.join(tokens[:2])!r}"
        sub = nested[tokens[1]]
    actions = {option: action for action in sub._actions for option in action.option_strings}  # noqa: SLF001
    for token, value in zip(tokens, [*tokens[1:], ""]):
        option = token.strip("[],").split("=")[0]
        if option.startswith("--"):
            assert option in actions, f"{where}: `arena {command}`: {tokens[0]} has no option {option}"
            choices = actions[option].choices
            if choices is not None and value and not value.startswith(("<", "-")):
                assert value in choices, f"{where}: `arena {command}`: {option} accepts {sorted(choices)}, not {value!r}"


def _all_options() -> set[str]:
    from adapters.waa import evaluate_server
    from bench import run_all

    options: set[str] = set()
    # The README shows these commands too: the evaluation server and the benchmarks' runner.
    pending = [build_parser(), evaluate_server.build_parser(), run_all.build_parser()]
    while pending:
        parser = pending.pop()
        options |= {o for action in parser._actions for o in action.option_strings}  # noqa: SLF001
        pending.extend(_subcommands(parser).values())
    return options


# Files that name other tools' options on their own too (`prefect worker start --limit 1`).
OTHER_TOOLS = {"deployments.md"}


def test_every_option_named_in_the_docs_exists() -> None:
    """Options the README and docs/ name on their own (`--max-cost`, `--reset-level setup`) exist."""
    known = _all_options()
    named = [
        (doc.name, span.split()[0].split("=")[0])
        for doc in DOCS if doc.name not in OTHER_TOOLS
        for span in re.findall(r"`(--[a-z][a-z-]*[^`]*)`", doc.read_text())
    ]
    assert len(named) > 100
    missing = [(where, option) for where, option in named if option not in known]
    assert missing == []


def test_the_readme_links_every_doc_and_every_link_resolves() -> None:
    """The reference lives in docs/, one file per subject, each reachable from the README."""
    readme = DOCS[0].read_text()
    assert [doc.name for doc in DOCS[1:] if f"(docs/{doc.name})" not in readme] == []
    broken = [
        (doc.name, link)
        for doc in DOCS
        for link in re.findall(r"\]\(([^)#\s]+)", doc.read_text())
        if not link.startswith(("http://", "https://")) and not (doc.parent / link).exists()
    ]
    assert broken == []


def test_ci_runs_the_readme_test_command_and_the_main_job_installs_the_core() -> None:
    readme = DOCS[0].read_text()
    test_command = "python3.11 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest"
    assert test_command in readme and test_command in (PROJECT / ".ci" / "run").read_text()
    assert "python3.11 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/arena run" in readme
