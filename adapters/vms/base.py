"""The VM provider interface every pool member comes from (local simulation, Azure, AWS).

A provider creates VMs that run a WAA server, tells where that server answers, resets a VM to a
known state at a chosen level, and deletes what it created. Providers know nothing of Prefect.
"""

from __future__ import annotations

import abc
import datetime as dt
import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from adapters.waa.settle import SettlePolicy

# Tags on every cloud resource this product creates; the janitor deletes only what carries them.
TAG_OWNER = "waa-arena-owner"
TAG_RUN_ID = "waa-arena-run-id"
TAG_EXPIRES_AT = "waa-arena-expires-at"  # ISO 8601 UTC, e.g. 2026-11-22T06:00:00Z
TAG_MANAGED = "waa-arena-managed"  # always "true"


class ResetLevel(str, enum.Enum):
    """How thoroughly a VM is brought back to a clean state before each task."""

    SETUP = "setup"  # close windows and clear task files only (WAA's own behaviour)
    SNAPSHOT = "snapshot"  # restore the state saved once the WAA server answered
    REBOOT = "reboot"  # restart the machine
    DISK = "disk"  # replace the disk from the golden image (recovering a broken host)


# The unauthenticated WAA (5000), QMP (7200) and DevTools (9222) ports may only be opened to
# the controller's own address or a small range.
_MIN_PREFIX = {4: 24, 6: 64}
_OPEN_TO_ALL = {"*", "any", "internet"}


def validate_controller_cidr(value: str) -> str:
    """The normalized CIDR, or ValueError when it is malformed, the whole internet or too wide."""
    text = value.strip()
    if text.lower() in _OPEN_TO_ALL:
        raise ValueError(f"controller_cidr {value!r} would open the VMs to everyone; give your controller's range")
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise ValueError(f"controller_cidr {value!r} is not an IP network such as 203.0.113.7/32: {exc}") from None
    if network.prefixlen == 0:
        raise ValueError(
            f"controller_cidr {value!r} would open the WAA server, QMP monitor and browser to the whole "
            "internet; give the controller's own address, e.g. 203.0.113.7/32"
        )
    minimum = _MIN_PREFIX[network.version]
    if network.prefixlen < minimum:
        raise ValueError(
            f"controller_cidr {value!r} is too wide (/{network.prefixlen}); the VMs' unauthenticated WAA, QMP "
            f"and DevTools ports may only be opened to /{minimum} or narrower, e.g. 203.0.113.7/32"
        )
    return str(network)


class ProviderError(RuntimeError):
    """A provider could not create, reset or delete a VM; the message names the VM and step."""


class CapacityError(ProviderError):
    """The cloud has no capacity or quota for this size/region; the pool tries the next one."""


@dataclass(frozen=True)
class ResourceTags:
    """Ownership of a created resource: which run made it, who runs it, when it may be deleted."""

    run_id: str
    owner: str
    expires_at: dt.datetime

    def as_dict(self) -> dict[str, str]:
        return {
            TAG_MANAGED: "true",
            TAG_OWNER: self.owner,
            TAG_RUN_ID: self.run_id,
            TAG_EXPIRES_AT: self.expires_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    @staticmethod
    def expiry_of(tags: dict[str, str]) -> dt.datetime | None:
        """The expiry in a resource's tags, or None when it is not one of ours or unreadable."""
        if tags.get(TAG_MANAGED) != "true" or TAG_EXPIRES_AT not in tags:
            return None
        try:
            return dt.datetime.strptime(tags[TAG_EXPIRES_AT], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
        except ValueError:
            return None


@dataclass(frozen=True)
class OwnedResource:
    """A cloud resource carrying this product's tags (a VM, disk, NIC, IP, security group...)."""

    provider: str
    kind: str
    resource_id: str
    tags: dict[str, str]

    def expired(self, now: dt.datetime | None = None) -> bool:
        expiry = ResourceTags.expiry_of(self.tags)
        return expiry is not None and expiry <= (now or dt.datetime.now(dt.timezone.utc))


class Billing(str, enum.Enum):
    """What a VM costs while it sits in its current state."""

    COMPUTE = "compute"  # running (or an Azure VM stopped without deallocation): billed per hour
    DISKS = "disks"  # stopped / deallocated: only its disks bill
    NONE = "none"  # being deleted


@dataclass(frozen=True)
class VMState:
    """One VM a provider keeps between runs (a warm pool member), as the cloud reports it."""

    vm_id: str  # the pool's name for it (waa-<pool>-<i>)
    cloud_id: str  # instance id / ARM id
    state: str  # the cloud's own word: running, stopped, deallocated, pending...
    size: str | None  # instance type / VM size
    billing: Billing
    disk_gb: int | None = None  # size of its disks, when the cloud says
    expires_at: dt.datetime | None = None  # when the janitor may delete it
    address: str | None = None  # where the controller reaches it (public or private IP), when known


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
    # Set by a provider that vouches for it: the VM has just come up in the very state a reset
    # restores (a clone of the ready state, a new simulation) and nothing has used it yet.
    fresh: bool = False

    def take_fresh(self) -> bool:
        """Whether the VM is still fresh (see `fresh`), marking it used: its first task may skip
        the reset, since the reset would restore the state it is already in."""
        fresh, self.fresh = self.fresh, False
        return fresh


def how_it_ended(returncode: int | None) -> str:
    """A VM's process as an infrastructure error's reason says it: "was killed by signal 9",
    "exited with code 1" (Popen's returncode), or "has ended" when the code is not known."""
    if returncode is None:
        return "has ended"
    return f"was killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"


class VMProvider(abc.ABC):
    """Creates, resets and deletes VMs that run a WAA server."""

    name: str = "provider"
    # How to wait after an action before observing: a real Windows desktop needs time to draw
    # (adapters/waa/settle.py); a simulation that acts synchronously needs none.
    settle: SettlePolicy = SettlePolicy()
    # Whether the VMs finish each setup action before answering (a simulation without its slow
    # start-up quirks): then a task's fixed `sleep` setup steps wait for nothing and are skipped.
    # Real VMs keep WAA's waits.
    acts_synchronously: bool = False
    # Whether the provider creates tagged cloud resources a crashed run may leave behind.
    owns_cloud_resources: bool = False

    @property
    def environment(self) -> str:
        """What this provider's VMs are, as stored in runs.environment and shown to users."""
        return self.name

    def close(self) -> None:
        """Release what the provider holds beyond its VMs (processes, clients); safe to repeat."""

    @abc.abstractmethod
    def create(self, vm_id: str) -> VMHandle:
        """Create (or reuse) the VM named `vm_id` and return once its WAA server answers."""

    @abc.abstractmethod
    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        """Bring the VM back to its clean state at `level`; the WAA server answers afterwards."""

    @abc.abstractmethod
    def delete(self, vm: VMHandle) -> None:
        """Delete the VM and everything created for it. Deleting a gone VM is not an error."""

    def replace(self, vm: VMHandle, new_vm_id: str) -> VMHandle:
        """A healthy VM in place of `vm`, which failed: by default delete it and create `new_vm_id`.

        Providers that cannot create VMs (existing servers) override this to wait for the same
        server to answer again.
        """
        self.delete(vm)
        return self.create(new_vm_id)

    def supported_reset_levels(self) -> set[ResetLevel]:
        return {ResetLevel.SETUP}

    def vm_down(self, vm: VMHandle) -> str | None:
        """Why `vm` is known to be down (its process ended, and how), for an infrastructure
        error's reason; None when it is not known to be down or this provider cannot tell.
        Never raises: it only adds to a failure already being reported."""
        return None

    @property
    def image_id(self) -> str | None:
        """The image or snapshot this provider's VMs start from (run provenance); None if unknown."""
        return None

    def stop(self, vm: VMHandle) -> None:
        """Stop paying for the VM's compute (deallocate / stop) without deleting it."""
        raise NotImplementedError(f"the {self.name} provider cannot stop a VM without deleting it")

    def list_vms(self) -> list[VMState]:
        """The VMs this provider's run (or warm pool) id owns, with their power state."""
        raise NotImplementedError(f"the {self.name} provider keeps no VMs between runs (warm pools need aws or azure)")

    def renew_expiry(self, vm_id: str) -> dt.datetime:
        """Move the expiry tag of the VM and its disks to now + the provider's TTL; return it.

        A warm pool's VMs outlive any one run: each `pool up` / `pool down` renews them, and the
        janitor deletes a pool left unused for longer than its TTL.
        """
        raise NotImplementedError(f"the {self.name} provider keeps no VMs between runs (warm pools need aws or azure)")

    def list_owned(self) -> list[OwnedResource]:
        """Every resource carrying this product's tags; providers without cloud resources own none."""
        return []

    def delete_resource(self, resource: OwnedResource) -> None:
        """Delete one owned resource (the janitor's tool); only resources with our tags."""
        raise NotImplementedError(f"the {self.name} provider has no cloud resources to delete")
