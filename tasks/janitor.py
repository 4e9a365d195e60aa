"""Stage of the janitor flow: sweep one provider's expired resources."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.vms.base import VMProvider
from adapters.vms.janitor import JanitorReport, sweep


@task(name="sweep", task_run_name="sweep [{provider.name}]", cache_policy=NO_CACHE, persist_result=False, retries=1)
def sweep_provider(provider: VMProvider, dry_run: bool) -> JanitorReport:
    """Delete every expired resource carrying this product's tags (only report with dry_run)."""
    return sweep(provider, dry_run=dry_run)
