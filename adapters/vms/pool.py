"""A pool of VMs: hands a healthy VM to each task and replaces VMs that fail.

The pool decides *which* VM a task gets; a Prefect global concurrency limit sized to the pool
decides *how many* tasks run at once (DESIGN.md).

VMs can come up progressively: `start()` creates them all in the background and each one is
leasable as soon as its WAA server answers, so work begins with the first VM instead of waiting
for the slowest (cloud VMs take minutes, and their boot times vary). At the end of a run,
`retire_spare()` deletes VMs that no remaining task needs, so idle VMs stop costing money while
the last tasks finish.

A VM that failed is replaced in the background: the task that hit the failure retries on the
first VM that is free (perhaps one another task just gave back) instead of waiting for a new VM
to boot, and a VM a waiting task needs is never retired as spare.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from adapters.vms.base import ProviderError, VMHandle, VMProvider


@dataclass
class VMUsage:
    """Seconds each VM was held by a task, for cost accounting."""

    seconds_by_vm: dict[str, float] = field(default_factory=dict)
    # Monotonic time each VM of the pool came up and (once deleted) went away: the pool's
    # VMs are billed while they exist, leased or idle.
    alive_since: dict[str, float] = field(default_factory=dict)
    gone_at: dict[str, float] = field(default_factory=dict)

    def billed_seconds(self, now: float | None = None) -> float:
        """VM-seconds of every VM this pool has created, up to now (or its deletion)."""
        now = time.monotonic() if now is None else now
        return sum(self.gone_at.get(vm_id, now) - since for vm_id, since in list(self.alive_since.items()))


@dataclass(frozen=True, eq=False)
class _Waiter:
    """A lessee waiting for a VM (compared by identity: each is its own place in the queue)."""

    retry: bool
    arrival: int


class VMPool:
    """A pool of up to `size` VMs from one provider.

    Thread-safe: lanes lease and return VMs concurrently. Every counter below is guarded by
    one condition variable, which also wakes lessees when a VM is returned, comes up, or the
    last pending creation fails.
    """

    def __init__(self, provider: VMProvider, size: int, run_id: str, *, keep_vms: bool = False) -> None:
        """`keep_vms` (a warm pool): VMs the pool is done with are stopped, not deleted, and a
        failed VM is replaced under its own name, so the next run finds the same set."""
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.provider = provider
        self.size = size
        self.run_id = run_id
        self.keep_vms = keep_vms
        self._cond = threading.Condition()
        self._free: deque[VMHandle] = deque()
        self._all: dict[str, VMHandle] = {}
        self._pending = 0  # creations (initial or replacements) not finished yet
        self._creation_errors: list[str] = []
        self._creators: list[threading.Thread] = []
        self._replacers: list[threading.Thread] = []  # replacements under way or done
        # Lessees waiting for a free VM, served retries first, then in arrival order (`_next_in_line`).
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._replacements = 0
        self._retired = 0
        self._closing = False  # teardown began: no new VM, and any that still arrives is deleted
        self.usage = VMUsage()

    def _vm_name(self, index: int) -> str:
        return f"waa-{self.run_id}-{index}"

    # --- bringing VMs up -------------------------------------------------------------------

    def provision(self) -> list[VMHandle]:
        """Create every VM in parallel and wait for all; if any fails, delete the ones made and raise."""
        with ThreadPoolExecutor(max_workers=self.size) as executor:
            futures = [executor.submit(self.provider.create, self._vm_name(i)) for i in range(self.size)]
            created, errors = [], []
            for future in futures:
                try:
                    created.append(future.result())
                except Exception as exc:  # noqa: BLE001 - collected and re-raised below
                    errors.append(exc)
        if errors:
            for vm in created:
                self._dispose(vm)
            raise ProviderError(f"provisioning {self.size} VMs failed: {errors[0]}")
        for vm in created:
            self._add(vm)
        return created

    def start(self) -> None:
        """Begin creating every VM in the background; each is leasable as soon as it is up.

        A VM that fails to come up is logged in `creation_errors` and the pool goes on with
        the others; leases fail only when no VM is up and none is still coming.
        """
        with self._cond:
            if self._creators:
                raise RuntimeError("pool already started")
            self._pending += self.size
            self._creators = [
                threading.Thread(target=self._create_in_background, args=(self._vm_name(i),), daemon=True,
                                 name=f"create-{self._vm_name(i)}")
                for i in range(self.size)
            ]
        for thread in self._creators:
            thread.start()

    def wait_until_ready(self, count: int = 1, timeout: float | None = None) -> int:
        """Block until `count` VMs are up (or every creation has ended); return how many are up.

        Raises `ProviderError` when no VM came up at all, naming the first creation error, or
        when `timeout` passes first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._all) < count and self._pending > 0:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ProviderError(f"only {len(self._all)} of {count} VMs came up within {timeout} s")
                self._cond.wait(remaining)
            if not self._all:
                raise ProviderError(f"no VM of the pool came up: {self._describe_errors()}")
            return len(self._all)

    def _create_in_background(self, name: str) -> None:
        try:
            vm = self.provider.create(name)
        except Exception as exc:  # noqa: BLE001 - recorded; the pool goes on without this VM
            with self._cond:
                self._creation_errors.append(f"{name}: {exc}")
                self._pending -= 1
                self._cond.notify_all()
            return
        self._add(vm, pending_done=True)

    def _add(self, vm: VMHandle, pending_done: bool = False) -> None:
        """Make a VM that came up leasable (and count its creation as ended if `pending_done`);
        one that came up after teardown began is deleted instead, never handed out."""
        with self._cond:
            if pending_done:
                self._pending -= 1
            late = self._closing
            if not late:
                self._all[vm.vm_id] = vm
                self.usage.alive_since[vm.vm_id] = time.monotonic()
                self.usage.gone_at.pop(vm.vm_id, None)
                self._free.append(vm)
            self._cond.notify_all()
        if late:
            self._dispose(vm)

    def _dispose(self, vm: VMHandle) -> None:
        """The pool is done with `vm`: stop it (warm pool) or delete it."""
        if self.keep_vms:
            self.provider.stop(vm)
        else:
            self.provider.delete(vm)

    def _describe_errors(self) -> str:
        if not self._creation_errors:
            return "no VM was created"
        more = f" (and {len(self._creation_errors) - 1} more)" if len(self._creation_errors) > 1 else ""
        return self._creation_errors[0] + more

    @property
    def creation_errors(self) -> list[str]:
        """Why VMs failed to come up (one entry per VM), e.g. for a warning in the run's log."""
        with self._cond:
            return list(self._creation_errors)

    # --- leasing ---------------------------------------------------------------------------

    @contextmanager
    def lease(self, timeout: float | None = None, *, retry: bool = False) -> Iterator[VMHandle]:
        """A healthy VM for the duration of the block; unhealthy VMs are replaced on return.

        Waiting lessees are served in order: `retry` ones (a task trying again after an
        infrastructure error) first, then by arrival. A lane that returns a VM and asks for
        one for its next task queues behind them, so a retry gets the first VM that frees up
        instead of waiting out its failed VM's replacement."""
        vm = self._take(timeout, retry)
        started = time.monotonic()
        try:
            yield vm
        finally:
            held = time.monotonic() - started
            with self._cond:
                self.usage.seconds_by_vm[vm.vm_id] = self.usage.seconds_by_vm.get(vm.vm_id, 0.0) + held
            if vm.healthy:
                with self._cond:
                    self._free.append(vm)
                    self._cond.notify_all()
            else:
                self._replace(vm)

    def _take(self, timeout: float | None, retry: bool) -> VMHandle:
        deadline = None if timeout is None else time.monotonic() + timeout
        me = _Waiter(retry, next(self._arrivals))
        with self._cond:
            # Queued while waiting, so `retire_spare` leaves the VM a waiter is about to get.
            self._queue.append(me)
            try:
                while not (self._free and self._next_in_line() is me):
                    if not self._all and self._pending == 0:
                        raise ProviderError(f"no VM is left in the pool: {self._describe_errors()}")
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise ProviderError(f"no VM became free within {timeout} s")
                    self._cond.wait(remaining)
                return self._free.popleft()
            finally:
                self._queue.remove(me)
                self._cond.notify_all()  # the next in line may take a free VM now

    def _next_in_line(self) -> _Waiter:
        """The waiting lessee served next (call under the lock, with a non-empty queue)."""
        return min(self._queue, key=lambda w: (not w.retry, w.arrival))

    def _replace(self, vm: VMHandle) -> None:
        """Hand a VM that failed health checks to the provider for a healthy one.

        The provider decides how (`VMProvider.replace`: a new VM under a new name, or the same
        server once it answers again), in a background thread: making a VM can take minutes,
        and the task that returned this one should retry on whichever VM is free first rather
        than wait for it. The replacement counts as pending while it is made, so lessees wait
        for it rather than conclude the pool is empty, and teardown waits for it. A failed
        replacement is recorded in `creation_errors` and the pool goes on smaller; it never
        raises into the task that returned the VM, whose result must still be recorded.
        """
        with self._cond:
            self._all.pop(vm.vm_id, None)
            self.usage.gone_at.setdefault(vm.vm_id, time.monotonic())
            closing = self._closing
            if not closing:
                self._replacements += 1
                self._pending += 1
                name = vm.vm_id if self.keep_vms else f"{self._vm_name(0).rsplit('-', 1)[0]}-r{self._replacements}"
                thread = threading.Thread(target=self._replace_in_background, args=(vm, name), daemon=True,
                                          name=f"replace-{name}")
                self._replacers.append(thread)
                # Started under the lock, so a teardown that follows always finds it joinable.
                thread.start()
        if closing:
            # Teardown began: the failed VM goes, and nothing replaces it.
            try:
                self.provider.delete(vm)
            except Exception as exc:  # noqa: BLE001 - the run's sweep deletes what is left
                with self._cond:
                    self._creation_errors.append(f"{vm.vm_id}: not deleted during teardown: {exc}")

    def _replace_in_background(self, vm: VMHandle, name: str) -> None:
        try:
            fresh = self.provider.replace(vm, name)
        except Exception as exc:  # noqa: BLE001 - recorded; the pool goes on without this VM
            with self._cond:
                self._creation_errors.append(f"{name} (replacing {vm.vm_id}): {exc}")
                self._pending -= 1
                self._cond.notify_all()
            return
        self._add(fresh, pending_done=True)

    def retire_spare(self, still_needed: int) -> bool:
        """Delete (warm pool: stop) one idle VM if the pool has more VMs (up or coming) than
        `still_needed`.

        Lanes call this when the work queue is empty, with the number of tasks still running:
        those tasks keep enough VMs for their retries. A free VM that a waiting lessee (a
        retry) is about to get is not idle and stays. Returns whether a VM was deleted.
        """
        with self._cond:
            if len(self._free) <= len(self._queue) or len(self._all) + self._pending <= still_needed:
                return False
            vm = self._free.pop()
            self._all.pop(vm.vm_id, None)
            self._retired += 1
        try:
            self._dispose(vm)
        finally:
            with self._cond:
                self.usage.gone_at.setdefault(vm.vm_id, time.monotonic())
        return True

    # --- state -----------------------------------------------------------------------------

    @property
    def replacements(self) -> int:
        return self._replacements

    @property
    def retired(self) -> int:
        """VMs deleted early by `retire_spare`."""
        return self._retired

    @property
    def exhausted(self) -> bool:
        """True once the pool started and has no VM left and none coming: no lease can succeed."""
        with self._cond:
            return bool(self._creators) and not self._all and self._pending == 0

    def vms(self) -> list[VMHandle]:
        with self._cond:
            return list(self._all.values())

    def teardown(self) -> None:
        """Delete (warm pool: stop) every VM of the pool, in parallel; safe to call more than once.

        From its start no VM is created or replaced, and one whose creation was under way is
        deleted as it comes up, so none is left behind (the creations are waited for). Every
        deletion is attempted even when some fail; the failures are raised together at the end.
        """
        with self._cond:
            self._closing = True
        # No thread is added once closing is set, so these lists are complete.
        for thread in self._creators + self._replacers:
            thread.join()
        vms = self.vms()
        if not vms:
            return
        with ThreadPoolExecutor(max_workers=len(vms)) as executor:
            futures = {executor.submit(self._dispose, vm): vm for vm in vms}
        errors = []
        for future, vm in futures.items():
            with self._cond:
                self._all.pop(vm.vm_id, None)
                self._free = deque(v for v in self._free if v.vm_id != vm.vm_id)
                self.usage.gone_at.setdefault(vm.vm_id, time.monotonic())
            if future.exception() is not None:
                errors.append(f"{vm.vm_id}: {future.exception()}")
        if errors:
            raise ProviderError(f"teardown failed for {len(errors)} VM(s): {'; '.join(errors)}")
