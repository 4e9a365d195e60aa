"""The janitor: delete expired resources this product created, and nothing else.

A resource is ours when it carries the `waa-arena-managed` tag, and expired when its
`waa-arena-expires-at` tag lies in the past. VMs go first, then what depended on them (disks,
network interfaces, addresses, security groups), so no deletion fails on a dependency that a
later one would have removed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from adapters.vms.base import TAG_RUN_ID, OwnedResource, VMProvider

# Lower sorts first: compute before the resources attached to it.
_KIND_ORDER = {"instance": 0, "vm": 0, "virtual_machine": 0, "spot_request": 0}


@dataclass
class JanitorReport:
    provider: str
    deleted: list[OwnedResource] = field(default_factory=list)
    kept: list[OwnedResource] = field(default_factory=list)
    failed: list[tuple[OwnedResource, str]] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.provider}: deleted {len(self.deleted)}, kept {len(self.kept)}, "
            f"failed {len(self.failed)}"
        )


def sweep(provider: VMProvider, *, now: dt.datetime | None = None, dry_run: bool = False) -> JanitorReport:
    """Delete every expired resource `provider` owns; with dry_run, only report what would go."""
    now = now or dt.datetime.now(dt.timezone.utc)
    owned = provider.list_owned()
    return _delete([r for r in owned if r.expired(now)], [r for r in owned if not r.expired(now)], provider, dry_run)


def sweep_run(provider: VMProvider, run_id: str, *, dry_run: bool = False) -> JanitorReport:
    """Delete everything one run created, expired or not (a cancelled or crashed run's leftovers)."""
    owned = provider.list_owned()
    mine = [r for r in owned if r.tags.get(TAG_RUN_ID) == run_id]
    return _delete(mine, [r for r in owned if r.tags.get(TAG_RUN_ID) != run_id], provider, dry_run)


def _delete(doomed: list[OwnedResource], kept: list[OwnedResource], provider: VMProvider, dry_run: bool) -> JanitorReport:
    report = JanitorReport(provider=provider.name, kept=kept)
    # Stable sort: compute first, then the provider's own order (it lists dependents before
    # what they depend on, e.g. NICs before security groups).
    for resource in sorted(doomed, key=lambda r: _KIND_ORDER.get(r.kind, 1)):
        if dry_run:
            report.deleted.append(resource)
            continue
        try:
            provider.delete_resource(resource)
        except Exception as exc:  # noqa: BLE001 - one stuck resource must not stop the sweep
            report.failed.append((resource, f"{type(exc).__name__}: {exc}"))
        else:
            report.deleted.append(resource)
    return report
