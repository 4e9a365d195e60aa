"""A cloud pool end to end: 3 VMs on AWS (moto) or Azure (fake ARM over TLS), each VM's WAA URL
a local simulation and its QEMU monitor a fake QMP server bridged to that simulation's snapshot
routes; the bundled suite runs with per-task snapshot resets, results and timings land in
DuckDB, and teardown leaves zero resources."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from fake_qmp import FakeQMPServer

from adapters.agents.scripted import ScriptedAgent, load_plans
from adapters.episode import EpisodeLimits
from adapters.store.recorder import ResultRecorder
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.vms.base import ResetLevel, VMHandle, VMProvider
from adapters.vms.pool import VMPool
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.live import LiveAdapterSettings
from adapters.waa.localenv.launcher import start_local_env
from adapters.waa.settle import SettlePolicy
from flows.attempt import AttemptContext

CATALOG = WAATaskCatalog(bundled_suite_dir())
PLANS = load_plans(bundled_suite_dir() / "solutions.json")
SIZE = 3


class Backends:
    """One simulation and one fake QMP monitor per VM slot, handed out as VMs are created."""

    def __init__(self, root: Path) -> None:
        self.sims = [start_local_env(root / f"sim{i}") for i in range(SIZE)]
        self.qmps = [self._bridge(sim.base_url) for sim in self.sims]
        self._slots: dict[str, int] = {}
        self._next = itertools.count()
        self._lock = threading.Lock()

    @staticmethod
    def _bridge(base_url: str) -> FakeQMPServer:
        def snapshot(route: str) -> Callable[[str], None]:
            def call(name: str) -> None:
                requests.post(f"{base_url}/sim/snapshot/{route}", json={"name": name}, timeout=10).raise_for_status()

            return call

        return FakeQMPServer(on_savevm=snapshot("save"), on_loadvm=snapshot("load")).start()

    def slot(self, vm: VMHandle) -> int:
        with self._lock:
            if vm.vm_id not in self._slots:
                self._slots[vm.vm_id] = next(self._next)
            return self._slots[vm.vm_id]

    def waa_url(self, vm: VMHandle) -> str:
        return self.sims[self.slot(vm)].base_url

    def qmp_address(self, vm: VMHandle) -> tuple[str, int]:
        return self.qmps[self.slot(vm)].address

    def close(self) -> None:
        for qmp in self.qmps:
            qmp.stop()
        for sim in self.sims:
            sim.stop()


@pytest.fixture()
def backends(tmp_path: Path) -> Iterator[Backends]:
    b = Backends(tmp_path)
    yield b
    b.close()


def _aws(backends: Backends, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[VMProvider, Callable[[], None]]:
    from moto_server import MotoServer

    from adapters.vms.aws import AWSProvider, AWSSettings

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    moto = MotoServer()
    settings = AWSSettings(
        region="us-east-1", ami_id="ami-1e749f67", controller_cidr="203.0.113.7/32", owner="ci@example.com",
        endpoint_url=moto.url, ready_timeout=20, ready_poll_seconds=0.05, waiter_delay=0.05,
        waiter_max_attempts=40, security_group_delete_timeout=0, baseline_snapshot=True,
    )
    provider = AWSProvider(settings, "cloudrun", waa_url_for=backends.waa_url, qmp_address_for=backends.qmp_address)
    return provider, moto.stop


def _azure(backends: Backends, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[VMProvider, Callable[[], None]]:
    from fake_arm import FakeARM
    from test_azure_provider import FakeCredential, settings_for

    from adapters.vms.azure import AzureProvider

    arm = FakeARM()
    provider = AzureProvider(
        settings_for(arm, guest_snapshot=True),
        "cloudrun",
        credential=FakeCredential(),
        waa_url_for=backends.waa_url,
        qmp_address_for=backends.qmp_address,
    )
    return provider, arm.close


@pytest.mark.parametrize("make", [_aws, _azure], ids=["aws", "azure"])
def test_bundled_suite_on_a_cloud_pool_leaves_nothing_behind(
    prefect_server: None, backends: Backends, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    from flows.pool_engine import Lanes, WorkQueue, attempt_task
    from flows.run_states import final_result

    provider, stop_cloud = make(backends, tmp_path, monkeypatch)
    try:
        pool = VMPool(provider, size=SIZE, run_id="cloudrun")
        pool.provision()
        assert len(provider.list_owned()) > SIZE  # VMs and their network, disks, groups, all tagged
        ctx = AttemptContext(
            provider=provider,
            catalog=CATALOG,
            agent_factory=lambda: ScriptedAgent(PLANS),
            reset_level=ResetLevel.SNAPSHOT,
            limits=EpisodeLimits(),
            cache_dir=tmp_path / "cache",
            artifacts_dir=tmp_path / "artifacts",
            adapter_settings=LiveAdapterSettings(settle=SettlePolicy.fixed(0)),
        )
        with ResultStore(tmp_path / "cloud.duckdb") as store:
            store.start_run(RunInfo(run_id="cloudrun", agent="scripted", suite="bundled", provider=provider.name))
            lanes = Lanes(work=WorkQueue(CATALOG.tasks()), pool=pool, attempt=ctx,
                          recorder=ResultRecorder(store, "cloudrun"), max_attempts=2)
            try:
                with ThreadPoolExecutor(max_workers=SIZE) as executor:
                    results = list(executor.map(lambda t: final_result(attempt_task(t, lanes)), CATALOG.tasks()))
            finally:
                assert lanes.recorder.close(60) and lanes.recorder.failed == []
                pool.teardown()
            rows = store.latest_attempts("cloudrun")
        assert [(r.task_id, r.outcome.value) for r in results if not r.success] == []
        assert len(rows) == len(CATALOG) and all(r["reset_seconds"] is not None and r["vm_seconds"] > 0 for r in rows)
        assert {r["vm_id"] for r in rows} <= {vm_id for vm_id in backends._slots}
        assert sum(len(q.command_lines()) for q in backends.qmps) >= len(CATALOG)  # a loadvm per task
        assert provider.list_owned() == []
    finally:
        stop_cloud()
