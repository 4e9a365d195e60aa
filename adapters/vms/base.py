"""The VM provider interface every pool member comes from (local simulation, Azure, AWS).

A provider creates VMs that run a WAA server, tells where that server answers, resets a VM to a
known state at a chosen level, and deletes what it created. Providers know nothing of Prefect.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any


class ResetLevel(str, enum.Enum):
    """How thoroughly a VM is brought back to a clean state before each task."""

    SETUP = "setup"  # close windows and clear task files only (WAA's own behaviour)
    SNAPSHOT = "snapshot"  # restore the state saved once the WAA server answered
    REBOOT = "reboot"  # restart the machine
    DISK = "disk"  # replace the disk from the golden image (recovering a broken host)


class ProviderError(RuntimeError):
    """A provider could not create, reset or delete a VM; the message names the VM and step."""


@dataclass
class VMHandle:
    """One VM of a pool: its id, where its WAA server answers, and provider-specific details."""

    vm_id: str
    base_url: str
    provider: str
    # The browser's DevTools HTTP endpoint (WAA's VM port 9222), for chrome_* setup steps.
    devtools_url: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    healthy: bool = True


class VMProvider(abc.ABC):
    """Creates, resets and deletes VMs that run a WAA server."""

    name: str = "provider"
    # Extra seconds the environment needs after an action before observing (WAA waits 3 s).
    settle_seconds: float = 3.0

    @abc.abstractmethod
    def create(self, vm_id: str) -> VMHandle:
        """Create (or reuse) the VM named `vm_id` and return once its WAA server answers."""

    @abc.abstractmethod
    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        """Bring the VM back to its clean state at `level`; the WAA server answers afterwards."""

    @abc.abstractmethod
    def delete(self, vm: VMHandle) -> None:
        """Delete the VM and everything created for it. Deleting a gone VM is not an error."""

    def supported_reset_levels(self) -> set[ResetLevel]:
        return {ResetLevel.SETUP}
