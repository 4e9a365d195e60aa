"""Stage: provision the VM pool."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.vms.base import VMHandle
from adapters.vms.pool import VMPool


@task(name="provision-pool", cache_policy=NO_CACHE, persist_result=False)
def provision_pool(pool: VMPool) -> list[VMHandle]:
    """Create every VM of the pool and wait until each WAA server answers."""
    return pool.provision()
