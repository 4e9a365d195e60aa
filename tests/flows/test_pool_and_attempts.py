"""VM pool replacement and the outcome of one attempt when something breaks, on real processes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from adapters.agents.scripted import ScriptedAgent, load_plans
from adapters.benchmark import BenchmarkResult, BenchmarkTask, OutcomeKind
from adapters.episode import EpisodeLimits
from adapters.vms.base import ProviderError, ResetLevel, VMHandle, VMProvider
from adapters.vms.local import LocalSimulationProvider
from adapters.vms.pool import VMPool
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir
from adapters.waa.client import WAAClient
from adapters.waa.live import LiveAdapterSettings
from adapters.waa.settle import SettlePolicy
from flows.attempt import AttemptContext, run_attempt

CATALOG = WAATaskCatalog(bundled_suite_dir())
PLANS = load_plans(bundled_suite_dir() / "solutions.json")


@pytest.fixture()
def provider(tmp_path: Path) -> Iterator[LocalSimulationProvider]:
    p = LocalSimulationProvider(tmp_path / "vms")
    yield p
    p.close()


def _ctx(provider: LocalSimulationProvider, tmp_path: Path, level: ResetLevel = ResetLevel.SNAPSHOT) -> AttemptContext:
    return AttemptContext(
        provider=provider,
        catalog=CATALOG,
        agent_factory=lambda: ScriptedAgent(PLANS),
        reset_level=level,
        limits=EpisodeLimits(max_steps=15),
        cache_dir=tmp_path / "cache",
        artifacts_dir=tmp_path / "artifacts",
        adapter_settings=LiveAdapterSettings(settle=SettlePolicy.fixed(0)),
    )


def test_pool_replaces_an_unhealthy_vm(provider: LocalSimulationProvider) -> None:
    pool = VMPool(provider, size=2, run_id="t")
    vms = pool.provision()
    assert len(vms) == 2 and all(WAAClient(vm.base_url).probe() for vm in vms)
    with pool.lease() as vm:
        provider.delete(vm)  # the VM dies while a task holds it
        vm.healthy = False
    assert pool.replacements == 1
    assert pool.wait_until_ready(2) == 2  # the replacement is made in the background
    live = pool.vms()
    assert len(live) == 2 and vm.vm_id not in {v.vm_id for v in live}
    assert all(WAAClient(v.base_url).probe() for v in live)
    assert pool.usage.seconds_by_vm[vm.vm_id] >= 0
    pool.teardown()
    assert pool.vms() == [] and not any(WAAClient(v.base_url).probe() for v in live)


class _SlowOrBrokenProvider(LocalSimulationProvider):
    """Real simulation VMs, except that chosen VM names fail to come up or come up only once
    their gate opens (at most a minute later)."""

    def __init__(self, work_dir: Path, broken: set[str], held: dict[str, threading.Event]) -> None:
        super().__init__(work_dir)
        self.broken, self.held = broken, held

    def create(self, vm_id: str) -> VMHandle:
        if any(vm_id.endswith(suffix) for suffix in self.broken):
            raise ProviderError(f"{vm_id}: no capacity")
        for suffix, gate in self.held.items():
            if vm_id.endswith(suffix):
                gate.wait(60)
        return super().create(vm_id)


def test_pool_leases_each_vm_as_soon_as_it_is_up_and_goes_on_without_broken_ones(tmp_path: Path) -> None:
    booted = threading.Event()
    provider = _SlowOrBrokenProvider(tmp_path / "vms", broken={"-2"}, held={"-1": booted})
    pool = VMPool(provider, size=3, run_id="prog")
    try:
        pool.start()
        assert pool.wait_until_ready(1) >= 1
        with pool.lease() as first:
            # The slow VM is still booting (held until the gate opens): the lease did not wait for it.
            assert first.vm_id == "waa-prog-0" and "waa-prog-1" not in {vm.vm_id for vm in pool.vms()}
        booted.set()
        assert pool.wait_until_ready(3) == 2  # every creation has ended; one failed
        assert {vm.vm_id for vm in pool.vms()} == {"waa-prog-0", "waa-prog-1"}
        assert pool.creation_errors == ["waa-prog-2: waa-prog-2: no capacity"]
        urls = {vm.vm_id: vm.base_url for vm in pool.vms()}
        # Retiring keeps what running tasks need: 2 VMs, 1 task still running -> one may go.
        assert pool.retire_spare(still_needed=1) and not pool.retire_spare(still_needed=1)
        assert len(pool.vms()) == 1 and pool.retired == 1
        (gone,) = set(pool.usage.gone_at)
        assert not WAAClient(urls[gone]).probe()
    finally:
        booted.set()  # a failed check above must not leave the creation waiting out its minute
        pool.teardown()
        provider.close()
    assert pool.vms() == []


def test_pool_with_no_vm_up_fails_leases_clearly(tmp_path: Path) -> None:
    provider = _SlowOrBrokenProvider(tmp_path / "vms", broken={"-0", "-1"}, held={})
    pool = VMPool(provider, size=2, run_id="none")
    pool.start()
    with pytest.raises(ProviderError, match="no VM of the pool came up: waa-none-.: .*no capacity \\(and 1 more\\)"):
        pool.wait_until_ready(1)
    with pytest.raises(ProviderError, match="no VM is left in the pool"):
        with pool.lease():
            pass
    pool.teardown()
    provider.close()


def test_dead_vm_is_an_infrastructure_error(prefect_server: None, provider: LocalSimulationProvider, tmp_path: Path) -> None:
    vm = provider.create("dead")
    provider.delete(vm)
    # Fresh from creation, its first task skips the reset: the dead server shows in setup.
    result = run_attempt(CATALOG.load(CATALOG.task_ids()[0]), vm, _ctx(provider, tmp_path), attempt=1)
    assert result.outcome is OutcomeKind.INFRASTRUCTURE_ERROR and not vm.healthy
    assert (result.error or "").startswith("setup: "), result.error
    # Once used, every task starts with a reset, where the dead server shows.
    vm.healthy = True
    result = run_attempt(CATALOG.load(CATALOG.task_ids()[0]), vm, _ctx(provider, tmp_path), attempt=2)
    assert result.outcome is OutcomeKind.INFRASTRUCTURE_ERROR and not vm.healthy
    assert "reset" in (result.error or "")


def test_broken_setup_is_a_setup_failure(prefect_server: None, provider: LocalSimulationProvider, tmp_path: Path) -> None:
    vm = provider.create("setup")
    base = CATALOG.load(CATALOG.task_ids()[0])
    broken = base.model_copy(
        update={"raw_config": {**base.raw_config, "config": [{"type": "activate_window", "parameters": {"window_name": "No Such App"}}]}}
    )
    result = run_attempt(broken, vm, _ctx(provider, tmp_path), attempt=1)
    assert result.outcome is OutcomeKind.SETUP_FAILURE and vm.healthy
    assert "activate_window" in (result.error or "") and "No Such App" in (result.error or "")


def test_reset_levels_restore_a_clean_vm(prefect_server: None, provider: LocalSimulationProvider, tmp_path: Path) -> None:
    vm = provider.create("levels")
    client = WAAClient(vm.base_url)
    client.setup_create_folder("C:\\Users\\Docker\\Desktop\\leftover")
    provider.reset(vm, ResetLevel.SNAPSHOT)
    assert client.list_directory("C:\\Users\\Docker\\Desktop")["children"] == []
    client.setup_create_folder("C:\\Users\\Docker\\Desktop\\leftover")
    provider.reset(vm, ResetLevel.REBOOT)
    assert WAAClient(vm.base_url).list_directory("C:\\Users\\Docker\\Desktop")["children"] == []
    with pytest.raises(Exception, match="not available for the local provider"):
        provider.reset(vm, ResetLevel.DISK)


def test_a_solved_attempt_records_timings_and_steps(prefect_server: None, provider: LocalSimulationProvider, tmp_path: Path) -> None:
    vm = provider.create("ok")
    task: BenchmarkTask = CATALOG.load(CATALOG.task_ids()[0])
    result = run_attempt(task, vm, _ctx(provider, tmp_path), attempt=2)
    assert result.outcome is OutcomeKind.SUCCESS and result.attempt == 2 and result.vm_id == "ok"
    assert set(result.timings) >= {"reset", "setup", "episode", "evaluate", "agent", "env"}
    assert result.num_steps == len(result.steps) > 0
    assert all(Path(s.screenshot_path).exists() for s in result.steps if s.screenshot_path)


def test_existing_servers_provider(tmp_path: Path) -> None:
    from adapters.vms.existing import ExistingServersProvider
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path / "existing")
    try:
        provider = ExistingServersProvider([handle.base_url + "/"])
        vm = provider.create("one")
        assert vm.base_url == handle.base_url and vm.devtools_url.endswith(":9222")
        provider.reset(vm, ResetLevel.SETUP)
        with pytest.raises(Exception, match="use --reset-level setup"):
            provider.reset(vm, ResetLevel.SNAPSHOT)
        with pytest.raises(Exception, match="no WAA server left for two: all 1 URL"):
            provider.create("two")
        provider.delete(vm)
        assert WAAClient(handle.base_url).probe()  # never deleted: not ours
    finally:
        handle.stop()
    with pytest.raises(ValueError, match="not an http"):
        ExistingServersProvider(["ftp://x"])


def test_existing_servers_wait_like_real_ones_unless_all_are_the_plain_simulation(tmp_path: Path) -> None:
    """Existing servers that are all the simulation with its quirks off act before they answer:
    no settle wait, no `sleep` setup steps. The simulation imitating a real server (quirks on), a
    server that is not the simulation, or one that does not answer keeps WAA's waits."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from adapters.vms.existing import ExistingServersProvider
    from adapters.waa.localenv.launcher import start_local_env

    class NotTheSimulation(BaseHTTPRequestHandler):  # WAA's real server answers 500 to unknown routes
        def do_GET(self) -> None:
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    real = ThreadingHTTPServer(("127.0.0.1", 0), NotTheSimulation)
    threading.Thread(target=real.serve_forever, daemon=True).start()
    real_url = f"http://127.0.0.1:{real.server_address[1]}"
    plain = start_local_env(tmp_path / "plain")
    quirky = start_local_env(tmp_path / "quirky", quirks=True, quirk_settings={"ready_delay": 0.0})
    try:
        synchronous = ExistingServersProvider([plain.base_url])
        assert synchronous.acts_synchronously and synchronous.settle.fixed_seconds == 0.0
        for urls in ([quirky.base_url], [plain.base_url, quirky.base_url], [plain.base_url, real_url],
                     [plain.base_url, "http://127.0.0.1:9"]):
            provider = ExistingServersProvider(urls)
            assert not provider.acts_synchronously, urls
            assert provider.settle.fixed_seconds is None, urls  # adaptive, as on a real desktop
    finally:
        plain.stop()
        quirky.stop()
        real.shutdown()


def test_run_config_refuses_snapshot_reset_on_existing_servers() -> None:
    from flows.run_config import SuiteRunConfig

    with pytest.raises(ValueError, match="use 'setup'"):
        SuiteRunConfig(provider="existing", waa_urls=["http://127.0.0.1:5000"])
    SuiteRunConfig(provider="existing", waa_urls=["http://127.0.0.1:5000"], reset_level="setup")


def test_longest_first_starts_untimed_tasks_then_the_longest() -> None:
    from flows.pool_engine import longest_first

    tasks = [CATALOG.load(task_id) for task_id in CATALOG.task_ids()[:4]]
    a, b, c, d = (t.task_id for t in tasks)
    ordered = longest_first(tasks, {a: 5.0, c: 20.0, d: 1.0})
    assert [t.task_id for t in ordered] == [b, c, a, d]


def test_concurrent_attempts_keep_their_vm_files_apart(prefect_server: None, provider: LocalSimulationProvider, tmp_path: Path) -> None:
    """Two copies of a task that both evaluate C:\\...\\draft.txt, run at the same time on two VMs:
    each attempt copies the VM's file into its own folder (they once shared one and a run of the
    scaling bench scored one copy with the other's file)."""
    from concurrent.futures import ThreadPoolExecutor

    from flows.attempt import attempt_cache_dir

    base = CATALOG.load("notepad-draft-documents")
    copies = [base.model_copy(update={"task_id": f"notepad-draft-documents-r{i}"}) for i in range(2)]
    plans = {c.task_id: PLANS["notepad-draft-documents"] for c in copies}
    ctx = _ctx(provider, tmp_path)
    ctx = AttemptContext(**{**ctx.__dict__, "agent_factory": lambda: ScriptedAgent(plans)})
    vms = [provider.create(f"c{i}") for i in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda pair: run_attempt(pair[0], pair[1], ctx, attempt=1), zip(copies, vms)))
    assert [r.outcome for r in results] == [OutcomeKind.SUCCESS, OutcomeKind.SUCCESS], [r.reason for r in results]
    folders = {attempt_cache_dir(ctx.cache_dir, c.task_id, 1) for c in copies}
    assert len(folders) == 2 and all((f / "draft.txt").read_text().startswith("This is a draft.") for f in folders)
    assert attempt_cache_dir(tmp_path, "../../etc/x", 2).parent == tmp_path / "attempts"


# --- the scheduling core (flows/scheduling.py), without Prefect or VMs -------------------------


class _InstantProvider(VMProvider):
    """VMs that exist at once; a replacement takes `replace_seconds` to come up."""

    name = "instant"

    def __init__(self, replace_seconds: float = 0.0) -> None:
        self.replace_seconds = replace_seconds

    def create(self, vm_id: str) -> VMHandle:
        return VMHandle(vm_id=vm_id, base_url=f"instant://{vm_id}", provider=self.name)

    def replace(self, vm: VMHandle, new_vm_id: str) -> VMHandle:
        time.sleep(self.replace_seconds)
        return self.create(new_vm_id)

    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        pass

    def delete(self, vm: VMHandle) -> None:
        pass


def _task(task_id: str) -> BenchmarkTask:
    return BenchmarkTask(task_id=task_id, instruction="", domain="notepad")


def _scripted_attempt(fail: set[tuple[str, int]], seconds: dict[str, float] | None = None) -> Any:
    """An attempt that takes `seconds[task id]` (default none) and is an infrastructure error for
    the (task, attempt) pairs in `fail` (marking the VM unhealthy, as a real attempt on a broken
    VM does)."""

    def attempt(task: BenchmarkTask, vm: VMHandle, number: int) -> BenchmarkResult:
        time.sleep((seconds or {}).get(task.task_id, 0.0))
        if (task.task_id, number) in fail:
            vm.healthy = False
            return BenchmarkResult(task_id=task.task_id, outcome=OutcomeKind.INFRASTRUCTURE_ERROR, attempt=number,
                                   vm_id=vm.vm_id)
        return BenchmarkResult(task_id=task.task_id, outcome=OutcomeKind.SUCCESS, success=True, attempt=number,
                               vm_id=vm.vm_id)

    return attempt


def test_attempt_loop_retries_infrastructure_errors_on_another_vm_recording_each_first() -> None:
    from flows.scheduling import AttemptHooks, Schedule, WorkQueue, attempt_loop

    pool = VMPool(_InstantProvider(), size=2, run_id="core")
    pool.provision()
    # A resumed run: attempts 1-3 are stored.
    schedule = Schedule(work=WorkQueue([], first_attempts={"t": 4}), pool=pool, max_attempts=3)
    recorded: list[tuple[int, str | None, bool]] = []  # attempt, VM, whether the VM was still leased

    def record(result: BenchmarkResult) -> None:
        leased = result.vm_id in {vm.vm_id for vm in pool.vms()} - {vm.vm_id for vm in pool._free}
        recorded.append((result.attempt, result.vm_id, leased))

    hooks = AttemptHooks(attempt=_scripted_attempt({("t", 4)}), record=record, logger=logging.getLogger("test"))
    result = attempt_loop(_task("t"), schedule, hooks)
    pool.teardown()
    assert result is not None and result.outcome is OutcomeKind.SUCCESS and result.attempt == 5
    (a1, vm1, leased1), (a2, vm2, leased2) = recorded
    assert (a1, a2) == (4, 5) and vm1 != vm2 and pool.replacements == 1
    assert leased1 and leased2  # recorded before the VM went back (and, for the failed one, was replaced)
    assert "vm" in result.timings


def test_a_retry_takes_a_vm_given_back_instead_of_waiting_for_the_replacement() -> None:
    """Near the end of a run, a task whose VM failed retries on the VM another lane just gave
    back (which that lane does not retire), not on a replacement that takes long to boot."""
    from flows.scheduling import AttemptHooks, Schedule, WorkQueue, attempt_loop, lane_loop

    # The replacement takes far longer than the tasks, so no stall of a loaded machine lets it win.
    pool = VMPool(_InstantProvider(replace_seconds=6.0), size=2, run_id="tail")
    pool.start()
    pool.wait_until_ready(2)
    schedule = Schedule(work=WorkQueue([_task("fails-once"), _task("short")]), pool=pool, max_attempts=2)
    # The other lane's task ends after the failure, so its VM is free while the retry waits.
    attempt = _scripted_attempt({("fails-once", 1)}, seconds={"fails-once": 0.2, "short": 0.6})
    hooks = AttemptHooks(attempt=attempt, record=lambda r: None, logger=logging.getLogger("test"))
    with ThreadPoolExecutor(max_workers=2) as lanes:
        results = [f.result() for f in [lanes.submit(lane_loop, schedule, lambda t: attempt_loop(t, schedule, hooks),
                                                     logging.getLogger("test")) for _ in range(2)]]
    finals = {r.task_id: r for lane in results for r in lane}
    assert {t: r.outcome for t, r in finals.items()} == {"fails-once": OutcomeKind.SUCCESS, "short": OutcomeKind.SUCCESS}
    # The retry ran on the VM "short" gave back, not on the replacement (still booting then).
    assert finals["fails-once"].attempt == 2 and finals["fails-once"].vm_id == finals["short"].vm_id
    pool.teardown()  # waits for the replacement, which is deleted as it comes up
    assert pool.vms() == [] and pool.replacements == 1


def test_retire_spare_keeps_the_vm_a_waiting_lessee_needs() -> None:
    pool = VMPool(_InstantProvider(), size=1, run_id="wait")
    pool.provision()
    holder = pool.lease()
    vm = holder.__enter__()
    got: list[VMHandle] = []
    waiter = threading.Thread(target=lambda: got.append(pool._take(5.0, False)))
    waiter.start()
    while not pool._queue:
        time.sleep(0.01)
    with pool._cond:  # the VM comes back and a lane out of work retires, before the waiter wakes
        holder.__exit__(None, None, None)
        assert not pool.retire_spare(still_needed=0)
    waiter.join()
    assert got == [vm] and pool.retired == 0
    pool.teardown()


def test_waiting_lessees_are_served_retries_first_then_in_arrival_order() -> None:
    """A lane that gives a VM back and asks for one for its next task queues behind the tasks
    already waiting; a retry after an infrastructure error goes before all of them."""
    pool = VMPool(_InstantProvider(), size=1, run_id="order")
    pool.provision()
    holder = pool.lease()
    holder.__enter__()
    served: list[str] = []

    def wait(name: str, retry: bool) -> None:
        with pool.lease(5.0, retry=retry):
            served.append(name)

    waiters = []
    for name, retry in [("new-1", False), ("new-2", False), ("retry", True)]:
        waiters.append(threading.Thread(target=wait, args=(name, retry)))
        waiters[-1].start()
        while len(pool._queue) < len(waiters):  # each is queued before the next arrives
            time.sleep(0.005)
    holder.__exit__(None, None, None)
    for waiter in waiters:
        waiter.join()
    assert served == ["retry", "new-1", "new-2"]
    pool.teardown()


def test_a_new_vm_is_fresh_once_and_a_replacement_is_fresh_again(tmp_path: Path) -> None:
    """The local simulation vouches for a new VM (VMHandle.fresh), once: the first lease takes it
    (its task skips the reset, test_dead_vm_is_an_infrastructure_error), later ones do not; a
    replacement is fresh again."""
    provider = LocalSimulationProvider(tmp_path / "vms")
    try:
        vm = provider.create("waa-fresh-0")
        assert vm.take_fresh() and not vm.take_fresh()
        replacement = provider.replace(vm, "waa-fresh-r1")
        assert replacement.take_fresh()
    finally:
        provider.close()
