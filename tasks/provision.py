"""Stage: provision the VM pool."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.vms.pool import VMPool


@task(name="provision-pool", cache_policy=NO_CACHE, persist_result=False)
def provision_pool(pool: VMPool) -> int:
    """Start creating every VM of the pool and return once the first one's WAA server answers.

    The other VMs join the pool as they come up, so work starts with the first VM. Returns the
    number of VMs up at that moment; raises ProviderError if none comes up.
    """
    pool.start()
    return pool.wait_until_ready(1)
