"""A pool of VMs: hands a healthy VM to each task and replaces VMs that fail.

The pool decides *which* VM a task gets; a Prefect global concurrency limit sized to the pool
decides *how many* tasks run at once (DESIGN.md).
"""

from __future__ import annotations

import queue
import threading
import time
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


class VMPool:
    """A fixed-size pool of VMs from one provider."""

    def __init__(self, provider: VMProvider, size: int, run_id: str) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.provider = provider
        self.size = size
        self.run_id = run_id
        self._free: queue.Queue[VMHandle] = queue.Queue()
        self._all: dict[str, VMHandle] = {}
        self._lock = threading.Lock()
        self._replacements = 0
        self.usage = VMUsage()

    def _vm_name(self, index: int) -> str:
        return f"waa-{self.run_id}-{index}"

    def provision(self) -> list[VMHandle]:
        """Create every VM in parallel; if any fails, delete the ones made and raise."""
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
                self.provider.delete(vm)
            raise ProviderError(f"provisioning {self.size} VMs failed: {errors[0]}")
        now = time.monotonic()
        for vm in created:
            self._all[vm.vm_id] = vm
            self.usage.alive_since[vm.vm_id] = now
            self._free.put(vm)
        return created

    @contextmanager
    def lease(self, timeout: float | None = None) -> Iterator[VMHandle]:
        """A healthy VM for the duration of the block; unhealthy VMs are replaced on return."""
        try:
            vm = self._free.get(timeout=timeout)
        except queue.Empty:
            raise ProviderError(f"no VM became free within {timeout} s") from None
        started = time.monotonic()
        try:
            yield vm
        finally:
            held = time.monotonic() - started
            with self._lock:
                self.usage.seconds_by_vm[vm.vm_id] = self.usage.seconds_by_vm.get(vm.vm_id, 0.0) + held
            if vm.healthy:
                self._free.put(vm)
            else:
                self._free.put(self._replace(vm))

    def _replace(self, vm: VMHandle) -> VMHandle:
        """Delete a VM that failed health checks and create a fresh one under a new name."""
        self.provider.delete(vm)
        with self._lock:
            self._all.pop(vm.vm_id, None)
            self.usage.gone_at.setdefault(vm.vm_id, time.monotonic())
            self._replacements += 1
            name = f"{self._vm_name(0).rsplit('-', 1)[0]}-r{self._replacements}"
        fresh = self.provider.create(name)
        with self._lock:
            self._all[fresh.vm_id] = fresh
            self.usage.alive_since[fresh.vm_id] = time.monotonic()
            self.usage.gone_at.pop(fresh.vm_id, None)
        return fresh

    @property
    def replacements(self) -> int:
        return self._replacements

    def vms(self) -> list[VMHandle]:
        with self._lock:
            return list(self._all.values())

    def teardown(self) -> None:
        """Delete every VM of the pool, in parallel; safe to call more than once.

        Every deletion is attempted even when some fail; the first failure is raised at the end.
        """
        vms = self.vms()
        if not vms:
            return
        with ThreadPoolExecutor(max_workers=len(vms)) as executor:
            futures = {executor.submit(self.provider.delete, vm): vm for vm in vms}
        errors = []
        for future, vm in futures.items():
            with self._lock:
                self._all.pop(vm.vm_id, None)
                self.usage.gone_at.setdefault(vm.vm_id, time.monotonic())
            if future.exception() is not None:
                errors.append(f"{vm.vm_id}: {future.exception()}")
        if errors:
            raise ProviderError(f"teardown failed for {len(errors)} VM(s): {'; '.join(errors)}")
