"""Warm pools: a named set of cloud VMs kept between runs, stopped while idle.

A cold pool takes 15-40 minutes to come up (Windows set-up, Docker); a pool stopped after its
run and started for the next one is back in minutes, its prepared disk (and the QEMU baseline
snapshot on it) intact. A warm pool is nothing but VMs with deterministic names that carry the
pool's id in place of a run id:

    pool "nightly" on aws  ->  resource id pool-nightly, VMs waa-pool-nightly-0 .. -N

so `arena pool up` and a run that names the pool find the same VMs (providers reuse a VM by
name and start it when stopped), `arena pool down` stops / deallocates them, and the janitor
still deletes a pool whose expiry tag (renewed at every up and down) has passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from adapters.vms.base import Billing, ProviderError, VMHandle, VMProvider, VMState

# Pool names become parts of cloud resource names (Azure allows 64 characters for a VM name, and
# the provider shortens longer ones with a hash): keep them short and plain.
POOL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,23}")
POOL_PREFIX = "pool-"

# Approximate on-demand list prices (USD, us-east / eastus, November 2026) of the default sizes,
# for the idle-cost line only; --vm-hour-price and --disk-gb-month-price override them.
LIST_PRICES_PER_HOUR = {
    "m8i.2xlarge": 0.46,
    "c8i.2xlarge": 0.41,
    "Standard_D8ds_v5": 0.38,
    "Standard_D8s_v5": 0.38,
}
DISK_GB_MONTH = {"aws": 0.08, "azure": 0.12}  # gp3; Premium SSD per provisioned GB (approx.)
HOURS_PER_MONTH = 730.0


def pool_resource_id(name: str) -> str:
    """The id a warm pool's resources are tagged with (in place of a run id); ValueError on a bad name."""
    if not POOL_NAME.fullmatch(name):
        raise ValueError(
            f"warm pool name {name!r} must be 1-24 lowercase letters, digits or '-', starting with a letter or "
            "digit (it becomes part of cloud resource names)"
        )
    return f"{POOL_PREFIX}{name}"


def pool_vm_id(name: str, index: int) -> str:
    """The deterministic name of VM `index` of pool `name` (the name VMPool gives it too)."""
    return f"waa-{pool_resource_id(name)}-{index}"


@dataclass(frozen=True)
class PoolPrices:
    """What idle VMs cost: per hour of compute (None = the list price of their size) and per
    GB-month of disk."""

    vm_hour_usd: float | None = None
    disk_gb_month_usd: float | None = None

    def vm_hour(self, size: str | None) -> float | None:
        if self.vm_hour_usd is not None:
            return self.vm_hour_usd
        return LIST_PRICES_PER_HOUR.get(size or "")

    def disk_hour(self, provider: str, disk_gb: int | None) -> float:
        per_month = self.disk_gb_month_usd if self.disk_gb_month_usd is not None else DISK_GB_MONTH.get(provider, 0.1)
        return (disk_gb or 0) * per_month / HOURS_PER_MONTH


@dataclass
class PoolStatus:
    """A warm pool as the cloud reports it, with what it costs per hour as it stands."""

    name: str
    provider: str
    vms: list[VMState]
    prices: PoolPrices = field(default_factory=PoolPrices)

    def hourly_cost(self) -> tuple[float, list[str]]:
        """USD per hour of the pool as it stands, and the sizes without a known price."""
        total, unpriced = 0.0, []
        for vm in self.vms:
            total += self.prices.disk_hour(self.provider, vm.disk_gb)
            if vm.billing is Billing.COMPUTE:
                price = self.prices.vm_hour(vm.size)
                if price is None:
                    unpriced.append(vm.size or "unknown size")
                else:
                    total += price
        return total, unpriced

    def lines(self) -> list[str]:
        """What `arena pool status` prints: one line per VM, then the pool's cost per hour."""
        if not self.vms:
            return [f"warm pool {self.name!r} ({self.provider}): no VMs (arena pool up creates them)"]
        out = [f"warm pool {self.name!r} ({self.provider}): {len(self.vms)} VM(s)"]
        for vm in self.vms:
            expires = vm.expires_at.strftime("%Y-%m-%d %H:%M UTC") if vm.expires_at else "no expiry tag"
            disk = f", {vm.disk_gb} GB disk" if vm.disk_gb else ""
            out.append(f"  {vm.vm_id}  {vm.state:<12} {vm.size or '?'}{disk}  bills {vm.billing.value}; "
                       f"janitor deletes after {expires}  [{vm.cloud_id}]")
        cost, unpriced = self.hourly_cost()
        running = sum(vm.billing is Billing.COMPUTE for vm in self.vms)
        note = f" (plus {', '.join(sorted(set(unpriced)))} at unknown prices: pass --vm-hour-price)" if unpriced else ""
        out.append(f"  cost now: ${cost:.2f}/hour (${cost * 24:.2f}/day): {running} VM(s) billing compute, "
                   f"disks of all{note}")
        return out


class WarmPool:
    """Bring a named pool of VMs up (create or start), down (stop / deallocate), or report it.

    `provider` must have been built with the pool's resource id as its run id
    (`pool_resource_id(name)`), so its tags and names are the pool's.
    """

    def __init__(self, provider: VMProvider, name: str, *, log: Callable[[str], None] = lambda _m: None) -> None:
        self.resource_id = pool_resource_id(name)
        if getattr(provider, "run_id", self.resource_id) != self.resource_id:
            raise ValueError(f"the provider for warm pool {name!r} must be built with run id {self.resource_id!r}")
        self.provider = provider
        self.name = name
        self._log = log

    def up(self, size: int) -> list[VMHandle]:
        """Create or start VMs 0..size-1 in parallel and wait until each WAA server answers.

        A VM that fails does not stop the others; the failures are raised together afterwards,
        and a rerun continues (VMs that came up are reused). VMs beyond `size` left from a larger
        pool stay as they are.
        """
        if size < 1:
            raise ValueError(f"warm pool size must be at least 1, got {size}")
        names = [pool_vm_id(self.name, i) for i in range(size)]
        handles, errors = [], []
        with ThreadPoolExecutor(max_workers=size) as executor:
            futures = {name: executor.submit(self._up_one, name) for name in names}
        for name, future in futures.items():
            error = future.exception()
            if error is None:
                handles.append(future.result())
            else:
                errors.append(f"{name}: {error}")
        if errors:
            raise ProviderError(f"warm pool {self.name!r}: {len(errors)} of {size} VM(s) did not come up: "
                                f"{'; '.join(errors)}")
        return handles

    def _up_one(self, vm_id: str) -> VMHandle:
        handle = self.provider.create(vm_id)
        expires = self.provider.renew_expiry(vm_id)
        self._log(f"{vm_id}: up at {handle.base_url} (expires {expires:%Y-%m-%d %H:%M} UTC)")
        return handle

    def down(self) -> list[VMState]:
        """Stop (AWS) / deallocate (Azure) every VM of the pool that bills compute, renew their
        expiry, and return the pool's VMs as they are afterwards."""
        states = self.provider.list_vms()
        running = [vm for vm in states if vm.billing is Billing.COMPUTE]
        errors = []
        with ThreadPoolExecutor(max_workers=max(1, len(running))) as executor:
            futures = {vm.vm_id: executor.submit(self._down_one, vm) for vm in running}
        for vm_id, future in futures.items():
            if future.exception() is not None:
                errors.append(f"{vm_id}: {future.exception()}")
        for vm in states:
            if vm.billing is not Billing.COMPUTE:
                self.provider.renew_expiry(vm.vm_id)
        if errors:
            raise ProviderError(f"warm pool {self.name!r}: {len(errors)} VM(s) could not be stopped "
                                f"(they still bill): {'; '.join(errors)}")
        return self.provider.list_vms()

    def _down_one(self, vm: VMState) -> None:
        handle = VMHandle(vm_id=vm.vm_id, base_url="", provider=self.provider.name,
                          details={"instance_id": vm.cloud_id, "azure_name": vm.vm_id})
        self.provider.stop(handle)
        self.provider.renew_expiry(vm.vm_id)
        self._log(f"{vm.vm_id}: stopped ({vm.cloud_id})")

    def status(self, prices: PoolPrices | None = None) -> PoolStatus:
        """The pool's VMs with state, size, disk, expiry, and the cost per hour as they stand."""
        return PoolStatus(self.name, self.provider.name, self.provider.list_vms(), prices or PoolPrices())

