"""The janitor flow: delete expired cloud resources this product created, and nothing untagged.

Run it on a schedule (or `arena janitor`) as the safety net behind each run's own teardown: a
killed controller leaves VMs whose `waa-arena-expires-at` tag says when they may go.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from adapters.vms.janitor import JanitorReport
from adapters.vms.registry import ProviderSettings, build_provider
from adapters.vms.settings import load_cloud_settings
from tasks.janitor import sweep_provider


@flow(name="janitor")
def janitor(providers: list[str] | None = None, cloud_config: Path | None = None, dry_run: bool = False) -> list[str]:
    """Sweep each configured provider (default: every provider with a settings section)."""
    logger = get_run_logger()
    settings = load_cloud_settings(cloud_config)
    names = providers or [name for name in ("aws", "azure", "kvm") if getattr(settings, name) is not None]
    if not names:
        logger.warning("no cloud provider is configured: nothing to sweep")
    summaries = []
    for name in names:
        provider = build_provider(name, ProviderSettings(run_id="janitor", cloud_config=cloud_config))
        report: JanitorReport = sweep_provider(provider, dry_run)
        for resource, error in report.failed:
            logger.error("could not delete %s %s: %s", resource.kind, resource.resource_id, error)
        verb = "would delete" if dry_run else "deleted"
        for resource in report.deleted:
            logger.info("%s %s %s (run %s)", verb, resource.kind, resource.resource_id, resource.tags.get("waa-arena-run-id"))
        summaries.append(report.summary() + (" (dry run)" if dry_run else ""))
    return summaries
