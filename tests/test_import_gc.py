"""The collector paused for a process's imports (adapters/import_gc.py), then frozen and resumed;
and the processes that import the most pause it: the local server's app and `arena run`."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters import import_gc

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def collector() -> Iterator[None]:
    """This test process's collector as it was, afterwards."""
    enabled = gc.isenabled()
    yield
    gc.enable() if enabled else gc.disable()


def test_the_block_runs_without_the_collector_and_what_it_built_is_frozen(collector: None) -> None:
    gc.enable()
    frozen = gc.get_freeze_count()
    with import_gc.paused_for_imports():
        assert not gc.isenabled()
        built = [[i] for i in range(1000)]  # as an import builds objects that stay
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(built)


def test_a_block_inside_a_pause_leaves_the_pause_to_its_owner(collector: None) -> None:
    import_gc.pause()
    with import_gc.paused_for_imports():
        assert not gc.isenabled()
    assert not gc.isenabled()  # still paused: whoever paused it resumes it
    import_gc.resume()
    assert gc.isenabled()


def test_the_local_servers_app_is_built_with_the_collector_paused_and_then_resumes_it() -> None:
    """In a fresh process, as uvicorn's factory call is: Prefect's server modules end frozen and
    the collector runs again."""
    code = textwrap.dedent("""
        import gc
        from flows.local_server_app import create_app
        create_app()
        print(gc.isenabled(), gc.get_freeze_count() > 100_000)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"], done.stdout
