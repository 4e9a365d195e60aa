"""Fixtures for the local WAA environment tests: one simulation process per test session."""

from __future__ import annotations

import pytest

from adapters.waa.localenv.launcher import LocalEnvHandle, start_local_env
from localenv_helpers import Client


@pytest.fixture(scope="session")
def sim(tmp_path_factory) -> LocalEnvHandle:
    handle = start_local_env(tmp_path_factory.mktemp("waa-sim-root"))
    yield handle
    handle.stop()


@pytest.fixture()
def client(sim) -> Client:
    c = Client(sim.base_url)
    c.reset()
    return c


