"""boto3 sessions sharing one botocore data loader: what is shared, and what stays each session's."""

from __future__ import annotations

import pytest

pytest.importorskip("boto3")

from adapters.vms.aws_sessions import new_session  # noqa: E402


def _loader(session):
    return session._session.get_component("data_loader")


def test_sessions_share_the_loader_and_its_search_path_stays_the_same(monkeypatch):
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    first = new_session()
    paths = list(_loader(first).search_paths)
    for _ in range(5):
        assert _loader(new_session()) is _loader(first)
    assert _loader(first).search_paths == paths  # boto3 appends its folder at every session
    assert len(set(paths)) == len(paths)


def test_credentials_stay_each_sessions_own(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret")
    first = new_session()
    assert first.get_credentials().access_key == "first-key"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second-key")
    second = new_session()
    assert second.get_credentials().access_key == "second-key"
    assert first.get_credentials().access_key == "first-key"
    assert second._session is not first._session


def test_another_data_path_gets_a_loader_of_its_own(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_DATA_PATH", raising=False)
    default = _loader(new_session())
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    other = _loader(new_session())
    assert other is not default
    assert str(tmp_path) in other.search_paths
    assert str(tmp_path) not in default.search_paths


def test_a_shared_loader_serves_clients_of_several_services(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    ec2 = new_session().client("ec2", region_name="us-east-1")
    ssm = new_session().client("ssm", region_name="us-east-1")
    assert ec2.meta.service_model.service_name == "ec2"
    assert ssm.meta.service_model.service_name == "ssm"
    assert ec2.meta.region_name == ssm.meta.region_name == "us-east-1"
