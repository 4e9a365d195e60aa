"""Fixtures for the image build tests: moto in server mode (AWS), the fake ARM server over TLS
(Azure, with compute galleries), a local WAA simulation standing in for the WAA server inside the
builder and inside the verification VM, and a tiny container registry on 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The cloud fakes live beside the VM provider tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vms"))

from fake_registry import FakeRegistry  # noqa: E402

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def moto() -> Iterator[object]:
    from moto_server import MotoServer

    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture()
def aws_env(moto, monkeypatch: pytest.MonkeyPatch):
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    moto.reset()
    return moto


@pytest.fixture(scope="module")
def waa_sim(tmp_path_factory: pytest.TempPathFactory):
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path_factory.mktemp("image-waa-sim"))
    yield handle
    handle.stop()


@pytest.fixture()
def registry() -> Iterator[FakeRegistry]:
    fake = FakeRegistry()
    yield fake
    fake.close()
