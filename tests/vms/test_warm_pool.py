"""Warm pools on AWS (moto server) and Azure (fake ARM over TLS): `up` creates the pool's VMs,
`down` stops / deallocates them, the next `up` starts the very same VMs; status shows state, cost
and expiry; a run's pool can be a warm pool, stopped rather than deleted at its end."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from installed import require

sys.path.insert(0, str(Path(__file__).resolve().parent))
boto3 = pytest.importorskip("boto3")
require("moto", "azure.mgmt.compute")

from fake_arm import FakeARM  # noqa: E402
from moto_server import MotoServer, moto_with_dummy_credentials  # noqa: E402
from test_azure_provider import FakeCredential, settings_for  # noqa: E402

from adapters.vms.aws import AWSProvider, AWSSettings  # noqa: E402
from adapters.vms.azure import AzureProvider  # noqa: E402
from adapters.vms.base import TAG_EXPIRES_AT, Billing, ResourceTags  # noqa: E402
from adapters.vms.pool import VMPool  # noqa: E402
from adapters.vms.warm_pool import PoolPrices, WarmPool, pool_resource_id, pool_vm_id  # noqa: E402

REGION = "us-east-1"


@pytest.fixture(scope="module")
def waa_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path_factory.mktemp("warm-pool-sim"))
    yield handle.base_url
    handle.stop()


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_with_dummy_credentials() as server:
        yield server


def aws_provider(moto: MotoServer, waa_sim: str, name: str, ttl_hours: float = 48.0) -> AWSProvider:
    settings = AWSSettings(
        region=REGION, ami_id="ami-1e749f67", controller_cidr="203.0.113.7/32", owner="ci@example.com",
        ttl_hours=ttl_hours, endpoint_url=moto.url, max_attempts=4, ready_timeout=20, ready_poll_seconds=0.05,
        waiter_delay=0.05, waiter_max_attempts=40, security_group_delete_timeout=0, baseline_snapshot=False,
    )
    return AWSProvider(settings, pool_resource_id(name), waa_url_for=lambda vm: waa_sim)


@pytest.fixture
def arm() -> Iterator[FakeARM]:
    fake = FakeARM()
    yield fake
    fake.close()


def azure_provider(arm: FakeARM, waa_sim: str, name: str) -> AzureProvider:
    return AzureProvider(settings_for(arm, ttl_hours=48), pool_resource_id(name), credential=FakeCredential(),
                         waa_url_for=lambda vm: waa_sim)


def test_pool_names_are_checked_and_deterministic() -> None:
    assert pool_resource_id("nightly") == "pool-nightly"
    assert pool_vm_id("nightly", 2) == "waa-pool-nightly-2"
    # The names a run's VMPool gives with the pool's id are the warm pool's names.
    assert VMPool(object(), 2, run_id=pool_resource_id("nightly"))._vm_name(1) == pool_vm_id("nightly", 1)  # type: ignore[arg-type]
    for bad in ("Nightly", "a b", "../x", "", "-x", "x" * 25, "a;rm"):
        with pytest.raises(ValueError, match="warm pool name"):
            pool_resource_id(bad)


def test_aws_down_then_up_reuses_the_same_instances(moto: MotoServer, waa_sim: str) -> None:
    moto.reset()
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto.url)
    pool = WarmPool(aws_provider(moto, waa_sim, "nightly"), "nightly")

    first = pool.up(2)
    ids = sorted(h.details["instance_id"] for h in first)
    assert [h.vm_id for h in first] == ["waa-pool-nightly-0", "waa-pool-nightly-1"]
    assert all(h.base_url == waa_sim for h in first)

    after_down = pool.down()
    assert [(s.vm_id, s.state, s.billing) for s in after_down] == [
        ("waa-pool-nightly-0", "stopped", Billing.DISKS), ("waa-pool-nightly-1", "stopped", Billing.DISKS)]

    # A later `up` (a new process: a new provider object) starts the same two instances.
    second = WarmPool(aws_provider(moto, waa_sim, "nightly"), "nightly").up(2)
    assert sorted(h.details["instance_id"] for h in second) == ids
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    assert sorted(i["InstanceId"] for i in live) == ids  # nothing created twice
    assert {i["State"]["Name"] for i in live} == {"running"}

    # Growing the pool adds VM 2 only.
    third = WarmPool(aws_provider(moto, waa_sim, "nightly"), "nightly").up(3)
    assert len({h.details["instance_id"] for h in third} - set(ids)) == 1


def test_aws_status_shows_state_cost_and_renewed_expiry(moto: MotoServer, waa_sim: str) -> None:
    moto.reset()
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto.url)
    short = WarmPool(aws_provider(moto, waa_sim, "lab", ttl_hours=1), "lab")
    short.up(1)
    long = WarmPool(aws_provider(moto, waa_sim, "lab", ttl_hours=48), "lab")

    running = long.status(PoolPrices(vm_hour_usd=0.5, disk_gb_month_usd=0.073))
    assert [(s.state, s.billing) for s in running.vms] == [("running", Billing.COMPUTE)]
    cost, unpriced = running.hourly_cost()
    disk_hourly = (running.vms[0].disk_gb or 0) * 0.073 / 730
    assert cost == pytest.approx(0.5 + disk_hourly) and not unpriced
    assert "bills compute" in "\n".join(running.lines())

    long.down()
    stopped = long.status(PoolPrices(vm_hour_usd=0.5, disk_gb_month_usd=0.073))
    assert stopped.vms[0].billing is Billing.DISKS
    assert stopped.hourly_cost()[0] == pytest.approx(disk_hourly)
    # `down` renewed the expiry to the pool's own TTL (48 h), on the instance and its volumes.
    in_two_days = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=47)
    assert stopped.vms[0].expires_at is not None and stopped.vms[0].expires_at > in_two_days
    for volume in ec2.describe_volumes()["Volumes"]:
        tags = {t["Key"]: t["Value"] for t in volume.get("Tags", [])}
        expiry = ResourceTags.expiry_of(tags)
        assert tags[TAG_EXPIRES_AT] and expiry is not None and expiry > in_two_days


def test_unknown_size_price_is_named_not_guessed(moto: MotoServer, waa_sim: str) -> None:
    moto.reset()
    provider = aws_provider(moto, waa_sim, "odd")
    provider.settings = provider.settings.model_copy(update={"instance_types": ["t3.large"]})
    pool = WarmPool(provider, "odd")
    pool.up(1)
    status = pool.status()
    cost, unpriced = status.hourly_cost()
    assert unpriced == ["t3.large"]
    assert "unknown prices: pass --vm-hour-price" in status.lines()[-1]


def test_a_runs_pool_on_a_warm_pool_stops_its_vms_instead_of_deleting(moto: MotoServer, waa_sim: str) -> None:
    moto.reset()
    provider = aws_provider(moto, waa_sim, "nightly")
    pool = VMPool(provider, 2, run_id=pool_resource_id("nightly"), keep_vms=True)
    pool.provision()
    ids = sorted(vm.details["instance_id"] for vm in pool.vms())
    pool.teardown()
    states = provider.list_vms()
    assert [(s.vm_id, s.state) for s in states] == [("waa-pool-nightly-0", "stopped"), ("waa-pool-nightly-1", "stopped")]
    assert sorted(s.cloud_id for s in states) == ids


def test_azure_down_deallocates_and_up_starts_the_same_vms(arm: FakeARM, waa_sim: str) -> None:
    pool = WarmPool(azure_provider(arm, waa_sim, "nightly"), "nightly")
    first = pool.up(2)
    ids = sorted(h.details["azure_name"] for h in first)
    puts_after_first = len(arm.calls("PUT", "/virtualMachines/"))

    states = pool.down()
    assert [(s.vm_id, s.state, s.billing) for s in states] == [
        ("waa-pool-nightly-0", "deallocated", Billing.DISKS), ("waa-pool-nightly-1", "deallocated", Billing.DISKS)]
    assert all(s.expires_at and s.expires_at > dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=47)
               for s in states)

    started = time.monotonic()
    second = WarmPool(azure_provider(arm, waa_sim, "nightly"), "nightly").up(2)
    assert time.monotonic() - started < 30
    assert sorted(h.details["azure_name"] for h in second) == ids
    assert len(arm.calls("PUT", "/virtualMachines/")) == puts_after_first  # started, not created again
    assert len(arm.calls("POST", "/start")) == 2
    assert {s.state for s in WarmPool(azure_provider(arm, waa_sim, "nightly"), "nightly").status().vms} == {"running"}


def test_local_provider_has_no_warm_pools() -> None:
    from adapters.vms.local import LocalSimulationProvider

    provider = LocalSimulationProvider()
    try:
        with pytest.raises(NotImplementedError, match="warm pools need aws or azure"):
            provider.list_vms()
    finally:
        provider.close()


def _cloud_config(tmp_path: Path, moto: MotoServer) -> Path:
    config = tmp_path / "arena.toml"
    config.write_text(
        "[aws]\n"
        f'region = "{REGION}"\nami_id = "ami-1e749f67"\ncontroller_cidr = "203.0.113.7/32"\nowner = "ci@example.com"\n'
        f'endpoint_url = "{moto.url}"\nwaiter_delay = 0.05\nsecurity_group_delete_timeout = 0\n'
    )
    return config


def test_cli_status_down_and_delete(moto: MotoServer, waa_sim: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    moto.reset()
    WarmPool(aws_provider(moto, waa_sim, "cli"), "cli").up(1)
    common = ["--provider", "aws", "--name", "cli", "--config", str(_cloud_config(tmp_path, moto))]

    assert main(["pool", "status", *common, "--vm-hour-price", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "waa-pool-cli-0  running" in out and "1 VM(s) billing compute" in out and "$0.5" in out

    assert main(["pool", "down", *common]) == 0
    out = capsys.readouterr().out
    assert "waa-pool-cli-0  stopped" in out and "0 VM(s) billing compute" in out

    assert main(["pool", "down", "--delete", *common]) == 0
    out = capsys.readouterr().out
    assert "no VMs" in out
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto.url)
    live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
            if i["State"]["Name"] != "terminated"]
    assert live == []
    groups = [g for g in ec2.describe_security_groups()["SecurityGroups"] if g["GroupName"].startswith("waa-arena")]
    assert groups == []


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    assert main(["pool", "up", "--provider", "aws", "--name", "Nightly", "--size", "2"]) == 2
    assert "warm pool name 'Nightly'" in capsys.readouterr().err
    assert main(["pool", "status", "--provider", "aws", "--name", "ok", "--vm-hour-price", "-1"]) == 2
    assert "--vm-hour-price must be >= 0" in capsys.readouterr().err
    missing = tmp_path / "none.toml"
    assert main(["pool", "status", "--provider", "aws", "--name", "ok", "--config", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_run_config_checks_the_warm_pool() -> None:
    from flows.run_config import SuiteRunConfig

    config = SuiteRunConfig(provider="aws", warm_pool="nightly")
    settings = config.provider_settings("run-123")
    assert settings.run_id == "pool-nightly" and settings.ttl_hours == 48
    assert SuiteRunConfig(provider="aws").provider_settings("run-123").run_id == "run-123"
    with pytest.raises(ValueError, match="needs provider 'aws' or 'azure'"):
        SuiteRunConfig(provider="local", warm_pool="nightly")
    with pytest.raises(ValueError, match="warm pool name"):
        SuiteRunConfig(provider="aws", warm_pool="Night ly")
    with pytest.raises(ValueError, match="one controller"):
        SuiteRunConfig(provider="aws", warm_pool="nightly", shards=2)


def test_one_run_at_a_time_holds_a_warm_pool(prefect_server: None) -> None:
    from flows.pool_engine import WarmPoolBusy, warm_pool_lease

    with warm_pool_lease("leased", 0):
        started = time.monotonic()
        with pytest.raises(WarmPoolBusy, match="warm pool 'leased' is in use by another run"):
            with warm_pool_lease("leased", 0):
                pass
        assert time.monotonic() - started < 10
    with warm_pool_lease("leased", 0):  # released: the next run takes it
        pass
