"""The Azure provider: one Linux VM per pool slot, running WAA's Windows-in-QEMU container.

Each VM (deterministic names from the run id and the pool's vm id, all tagged with
`ResourceTags` plus the resource's name and its VM)::

    waa-<run>-<vm>            the VM, from `image_id` (a gallery image version or managed image
                              that already holds Docker and the WAA container), sized from
                              `vm_sizes`, placed in the first of `locations` with capacity
    waa-<run>-<vm>-osdisk     its OS disk (tagged after creation: Azure does not copy VM tags)
    waa-<run>-<vm>-nic        its network interface, in the run's NSG
    waa-<run>-<vm>-pip        its Standard static public IP (only with `public_ip=True`)
    waa-<run>-<vm>-baseline   a snapshot of the freshly provisioned OS disk (`disk_baseline`)

and per run and location::

    waa-<run>-<location>-nsg  inbound TCP 22 / waa_port / qmp_port / devtools_port (only 22 with
                              `access="tunnel"`) allowed ONLY from `controller_cidr`; everything
                              else from Internet denied
    waa-<run>-<location>-vnet a /24 subnet for the NICs (unless `subnet_id` names an existing one)

How WAA is reached. WAA's HTTP API (5000), the QEMU monitor (QMP, 7200) and Chrome DevTools
(9222) have no authentication at all, so they must never face the Internet. With
`public_ip=True` (the default, for a controller outside Azure) the VM gets a Standard public IP,
which Azure keeps closed until an NSG opens it; the run's NSG opens those ports only to
`controller_cidr`, which must be a /24 or narrower (0.0.0.0/0, "*", "Internet" and wider
prefixes are refused), and denies everything else from Internet explicitly. Traffic is still
plain HTTP, so for anything beyond a trusted office range set `public_ip=False` and run the
controller inside the VNet (or peered / over VPN): the VM then has no public address at all
and `base_url` is the NIC's private IP. Or set `access="tunnel"`: the NSG then opens only SSH
and the three ports are forwarded to the controller's loopback through an OpenSSH tunnel
(`adapters.vms.tunnel`), whose host key is pinned on first use.

Creation is idempotent by name: every step GETs first, a VM that exists and is not Failed is
reused (started when deallocated), and the SDK's PUTs are themselves idempotent. Capacity and
quota errors (`CAPACITY_CODES`) move to the next size, then the next location (the per-VM
network pieces are recreated there); when everything is exhausted `CapacityError` is raised.
Any other failure is a `ProviderError` naming the resource and the Azure error code.

Reset levels: SETUP does nothing here (the task runner closes windows), SNAPSHOT and REBOOT go
through the QEMU monitor (`adapters.vms.guest_reset`), DISK swaps the OS disk for a fresh copy
of a golden snapshot (`golden_snapshot_id`) or of the VM's own baseline snapshot: deallocate ->
disk from the snapshot (Copy) -> PUT the VM with the new `osDisk.managedDisk.id` -> start ->
wait for WAA -> delete the old disk. Each reset is timed (`reset_timings`).

Credentials come from `DefaultAzureCredential` (environment, managed identity, az login ...) or
an injected credential object; never from the product's settings files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.vms.base import (
    TAG_EXPIRES_AT,
    TAG_MANAGED,
    TAG_RUN_ID,
    Billing,
    CapacityError,
    OwnedResource,
    ProviderError,
    ResetLevel,
    ResourceTags,
    VMHandle,
    VMProvider,
    VMState,
    validate_controller_cidr,
)
from adapters.vms.tunnel import SSHTarget, TunnelManager
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAError

log = logging.getLogger(__name__)

# Errors that mean "no room for this size here": try the next size, then the next location.
# OperationNotAllowed is what ARM answers when a VM would exceed a core quota.
CAPACITY_CODES = frozenset(
    {"AllocationFailed", "ZonalAllocationFailed", "SkuNotAvailable", "OperationNotAllowed", "QuotaExceeded"}
)

TAG_NAME = "waa-arena-name"  # the resource's own name
TAG_VM = "waa-arena-vm"  # the VM a per-VM resource belongs to (absent on run-shared ones)

GUEST_SNAPSHOT_NAME = "waa-baseline"
SUBNET_NAME = "waa"

# list_owned() order: compute first, then what depended on it (the janitor deletes in this order).
KIND_VM = "virtual_machine"
KIND_NIC = "network_interface"
KIND_PUBLIC_IP = "public_ip"
KIND_DISK = "disk"
KIND_SNAPSHOT = "snapshot"
KIND_NSG = "network_security_group"
KIND_VNET = "virtual_network"

_ARM_TYPES = {
    "microsoft.compute/virtualmachines": KIND_VM,
    "microsoft.compute/disks": KIND_DISK,
    "microsoft.compute/snapshots": KIND_SNAPSHOT,
    "microsoft.network/networkinterfaces": KIND_NIC,
    "microsoft.network/publicipaddresses": KIND_PUBLIC_IP,
    "microsoft.network/networksecuritygroups": KIND_NSG,
    "microsoft.network/virtualnetworks": KIND_VNET,
}

class AzureSettings(BaseModel):
    """Where and how the Azure provider creates VMs (no secrets: credentials come from Azure)."""

    model_config = ConfigDict(extra="forbid")

    subscription_id: str
    resource_group: str
    # Ordered fallbacks: the first location/size with capacity and quota wins.
    locations: list[str] = Field(min_length=1, validation_alias=AliasChoices("locations", "location"))
    vm_sizes: list[str] = Field(default_factory=lambda: ["Standard_D8ds_v5", "Standard_D8s_v5"], min_length=1)
    image_id: str  # /subscriptions/.../galleries/<g>/images/<i>/versions/<v> or .../images/<managed image>
    image_specialized: bool = False  # a specialized gallery image takes no osProfile
    admin_username: str = "waaadmin"
    ssh_public_key: str  # the public key text ("ssh-ed25519 AAAA... user"); no passwords are ever set
    controller_cidr: str  # who may reach ports 22 / WAA / QMP / DevTools (required, /24 or narrower)
    owner: str
    ttl_hours: float = Field(default=24.0, gt=0)
    waa_port: int = 5000
    qmp_port: int = 7200
    devtools_port: int = 9222
    ssh_port: int = 22
    # How the controller reaches WAA / QMP / DevTools. "cidr": the NSG opens them to
    # controller_cidr. "tunnel": the NSG opens only ssh_port, and they are forwarded to 127.0.0.1
    # on the controller through an OpenSSH tunnel per VM (adapters/vms/tunnel.py).
    access: Literal["cidr", "tunnel"] = "cidr"
    ssh_user: str | None = None  # None = admin_username (the user osProfile creates)
    ssh_identity_file: Path | None = None  # ssh_public_key's private key; None = ssh-agent / default keys
    ssh_known_hosts_file: Path | None = None  # None = the product's own file (tunnel.default_known_hosts_file)
    ssh_config_file: Path | None = None  # an ssh_config for the tunnels (ProxyJump...); None = ~/.ssh/config
    tunnel_monitor_seconds: float = Field(default=10.0, gt=0)  # how often dead tunnels are re-established
    ready_timeout: float = 1800.0  # seconds for the WAA server to answer after create/start
    ready_poll_seconds: float = 5.0
    polling_interval: float = 10.0  # LRO poll interval when ARM sends no Retry-After
    retry_total: int = 10  # azure-core retries (429 honours Retry-After, 5xx back off)
    base_url: str = "https://management.azure.com"
    connection_verify: str | None = None  # a CA bundle path (tests: the fake ARM server's CA)
    public_ip: bool = True  # False: no public address, WAA reached on the private IP
    subnet_id: str | None = None  # an existing subnet; None: a VNet per run and location
    vnet_prefix: str = "10.42.0.0/24"
    os_disk_sku: str = "Premium_LRS"
    os_disk_size_gb: int | None = None
    golden_snapshot_id: str | None = None  # DISK reset source; else the VM's own baseline snapshot
    disk_baseline: bool = True  # snapshot each VM's OS disk right after provisioning (DISK reset)
    guest_snapshot: bool = False  # savevm a QEMU baseline once WAA answers (SNAPSHOT reset)

    @field_validator("locations", "vm_sizes", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("controller_cidr")
    @classmethod
    def _controller_cidr(cls, value: str) -> str:
        return validate_controller_cidr(value)

    @field_validator("ssh_public_key")
    @classmethod
    def _public_key(cls, value: str) -> str:
        text = value.strip()
        if "PRIVATE KEY" in text:
            raise ValueError("ssh_public_key holds a private key; give the .pub file's text")
        if not re.match(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-\S+|sk-\S+) \S+", text):
            raise ValueError("ssh_public_key is not an OpenSSH public key line")
        return text

    @field_validator("image_id")
    @classmethod
    def _image_id(cls, value: str) -> str:
        if not value.lower().startswith("/subscriptions/") or "/providers/microsoft.compute/" not in value.lower():
            raise ValueError("image_id must be the ARM id of a gallery image version or a managed image")
        return value

    @field_validator("base_url")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError("base_url must be https (the SDK refuses bearer tokens over http)")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _default_ssh_user(self) -> AzureSettings:
        if not self.ssh_user:
            self.ssh_user = self.admin_username
        return self


@dataclass(frozen=True)
class AzureResetTiming:
    vm_id: str
    level: ResetLevel
    seconds: float
    steps: dict[str, float]


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def _short(raw: str, limit: int) -> str:
    """A lowercase Azure-safe name; a hash keeps it unique when it had to be changed or cut."""
    slug = _slug(raw)
    if slug == raw and len(slug) <= limit:
        return slug
    digest = hashlib.sha1(raw.encode()).hexdigest()[:8]
    return f"{slug[: limit - 9].rstrip('-')}-{digest}"


def _error_code(exc: Exception) -> str:
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    if code:
        return str(code)
    response = getattr(exc, "response", None)
    try:
        body = response.json() if response is not None else None
        if isinstance(body, dict):
            return str((body.get("error") or {}).get("code") or "")
    except Exception:  # noqa: BLE001 - a body that is not JSON has no code
        pass
    return ""


def _error_text(exc: Exception) -> str:
    error = getattr(exc, "error", None)
    message = getattr(error, "message", None) or getattr(exc, "message", None) or str(exc)
    code = _error_code(exc)
    first = str(message).strip().splitlines()[0] if str(message).strip() else type(exc).__name__
    return f"{code}: {first}" if code and code not in first else first


def _parse_id(resource_id: str) -> tuple[str, str, str, str]:
    """(resource group, provider/type in lowercase, name, kind) of an ARM resource id."""
    parts = resource_id.strip("/").split("/")
    lower = [p.lower() for p in parts]
    try:
        rg = parts[lower.index("resourcegroups") + 1]
        p = lower.index("providers")
        arm_type = f"{lower[p + 1]}/{lower[p + 2]}"
        name = parts[p + 3]
    except (ValueError, IndexError) as exc:
        raise ProviderError(f"not an Azure resource id: {resource_id}") from exc
    if arm_type not in _ARM_TYPES or len(parts) != p + 4:
        raise ProviderError(f"not a resource type the Azure provider creates: {resource_id}")
    return rg, arm_type, name, _ARM_TYPES[arm_type]


class AzureProvider(VMProvider):
    """Creates, resets and deletes WAA VMs in one Azure resource group."""

    name = "azure"
    owns_cloud_resources = True

    @property
    def image_id(self) -> str | None:
        return self.settings.image_id

    def __init__(
        self,
        settings: AzureSettings,
        run_id: str,
        *,
        credential: Any = None,
        waa_url_for: Callable[[VMHandle], str] | None = None,
        qmp_address_for: Callable[[VMHandle], tuple[str, int]] | None = None,
        ssh_address_for: Callable[[VMHandle], tuple[str, int]] | None = None,
    ) -> None:
        from azure.mgmt.compute import ComputeManagementClient
        from azure.mgmt.network import NetworkManagementClient

        if not run_id:
            raise ValueError("run_id is required")
        self.settings = settings
        self.run_id = run_id
        self.tags = ResourceTags(
            run_id=run_id,
            owner=settings.owner,
            expires_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=settings.ttl_hours),
        )
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        self.credential = credential  # `arena doctor` asks it for a token
        options: dict[str, Any] = {
            "base_url": settings.base_url,
            "polling_interval": settings.polling_interval,
            "retry_total": settings.retry_total,
        }
        if settings.connection_verify:
            options["connection_verify"] = settings.connection_verify
        self.compute = ComputeManagementClient(credential, settings.subscription_id, **options)
        self.network = NetworkManagementClient(credential, settings.subscription_id, **options)
        self._waa_url_for = waa_url_for
        self._qmp_address_for = qmp_address_for
        self._ssh_address_for = ssh_address_for  # test hook: where the tunnel's ssh connects
        # access="tunnel": one tunnel per VM (no process or thread until the first one opens).
        self._tunnels = TunnelManager(monitor_interval=settings.tunnel_monitor_seconds)
        self._network_lock = threading.Lock()  # run-shared NSG/VNet: create vs. last-one-out delete
        self.reset_timings: list[AzureResetTiming] = []
        self.run_prefix = _short(f"waa-{run_id}", 40)

    # -- names and tags --------------------------------------------------------------------

    def vm_name(self, vm_id: str) -> str:
        raw = vm_id if vm_id.startswith(f"waa-{self.run_id}") else f"waa-{self.run_id}-{vm_id}"
        return _short(raw, 50)

    def _nsg_name(self, location: str) -> str:
        return f"{self.run_prefix}-{_slug(location)}-nsg"

    def _vnet_name(self, location: str) -> str:
        return f"{self.run_prefix}-{_slug(location)}-vnet"

    def _tags(self, name: str, vm: str | None = None) -> dict[str, str]:
        tags = self.tags.as_dict()
        tags[TAG_NAME] = name
        if vm:
            tags[TAG_VM] = vm
        return tags

    # -- small SDK helpers -----------------------------------------------------------------

    def _get(self, getter: Callable[..., Any], name: str, what: str) -> Any | None:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        try:
            return getter(self.settings.resource_group, name)
        except ResourceNotFoundError:
            return None
        except HttpResponseError as exc:
            raise ProviderError(f"azure: reading {what} failed: {_error_text(exc)}") from exc

    def _wait(self, begin: Callable[..., Any], what: str, *args: Any) -> Any:
        """Run an LRO to its end; any failure is a ProviderError naming `what`."""
        from azure.core.exceptions import HttpResponseError

        try:
            return begin(self.settings.resource_group, *args).result()
        except HttpResponseError as exc:
            raise ProviderError(f"azure: {what} failed: {_error_text(exc)}") from exc

    def _delete(self, begin: Callable[..., Any], name: str, what: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._wait(begin, f"deleting {what}", name)
        except ProviderError as exc:
            if isinstance(exc.__cause__, ResourceNotFoundError):
                return
            raise

    # -- create ----------------------------------------------------------------------------

    def supported_reset_levels(self) -> set[ResetLevel]:
        levels = {ResetLevel.SETUP, ResetLevel.REBOOT}
        if self.settings.guest_snapshot:
            levels.add(ResetLevel.SNAPSHOT)
        if self.settings.golden_snapshot_id or self.settings.disk_baseline:
            levels.add(ResetLevel.DISK)
        return levels

    def create(self, vm_id: str) -> VMHandle:
        name = self.vm_name(vm_id)
        vm = self._get(self.compute.virtual_machines.get, name, f"VM {name}")
        if vm is not None and (vm.provisioning_state or "").lower() == "failed":
            log.info("azure: VM %s is in state Failed from an earlier attempt; deleting it", name)
            self._delete_vm_and_disk(name, vm)
            vm = None
        if vm is None:
            vm = self._create_with_fallback(name)
            self._tag_os_disk(name, vm)
            if self.settings.disk_baseline and not self.settings.golden_snapshot_id:
                self._ensure_baseline_snapshot(name, vm)
        else:
            log.info("azure: VM %s exists (%s); reusing it", name, vm.location)
            if self._power_state(name) in ("deallocated", "deallocating", "stopped", "stopping"):
                self._wait(self.compute.virtual_machines.begin_start, f"starting VM {name}", name)
        handle = self._handle(vm_id, name, vm)
        self._attach_tunnel(handle, getattr(vm, "vm_id", None))
        self._wait_for_waa(handle, "after create")
        if self.settings.guest_snapshot:
            from adapters.vms import guest_reset

            guest_reset.take_baseline_snapshot(
                self._qmp(handle), handle.base_url, GUEST_SNAPSHOT_NAME, ready_deadline=self.settings.ready_timeout
            )
            handle.details["guest_snapshot"] = GUEST_SNAPSHOT_NAME
        return handle

    def _create_with_fallback(self, name: str) -> Any:
        from azure.core.exceptions import HttpResponseError

        s = self.settings
        tried: list[str] = []
        for location in s.locations:
            nic_id = self._ensure_network(name, location)
            for size in s.vm_sizes:
                try:
                    return self._put_vm(name, location, size, nic_id)
                except HttpResponseError as exc:
                    code = _error_code(exc)
                    if code not in CAPACITY_CODES:
                        raise ProviderError(f"azure: creating VM {name} ({size} in {location}) failed: "
                                            f"{_error_text(exc)}") from exc
                    tried.append(f"{size}@{location}: {code}")
                    log.warning("azure: no capacity for VM %s as %s in %s (%s); trying the next", name, size,
                                location, code)
                    leftover = self._get(self.compute.virtual_machines.get, name, f"VM {name}")
                    if leftover is not None:  # an allocation failure leaves the VM in state Failed
                        self._delete_vm_and_disk(name, leftover)
            # Nothing fits here: the NIC and IP are bound to this location, so remove them.
            self._delete_vm_network(name)
            self._release_shared_network([location])
        raise CapacityError(f"azure: no capacity or quota for VM {name}: tried {'; '.join(tried)}")

    def _put_vm(self, name: str, location: str, size: str, nic_id: str) -> Any:
        s = self.settings
        os_disk: dict[str, Any] = {
            "name": f"{name}-osdisk",
            "createOption": "FromImage",
            "caching": "ReadWrite",
            "deleteOption": "Delete",
            "managedDisk": {"storageAccountType": s.os_disk_sku},
        }
        if s.os_disk_size_gb:
            os_disk["diskSizeGB"] = s.os_disk_size_gb
        properties: dict[str, Any] = {
            "hardwareProfile": {"vmSize": size},
            "storageProfile": {"imageReference": {"id": s.image_id}, "osDisk": os_disk},
            "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": True}}]},
        }
        if not s.image_specialized:
            properties["osProfile"] = {
                "computerName": name[:63],
                "adminUsername": s.admin_username,
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {"publicKeys": [{"path": f"/home/{s.admin_username}/.ssh/authorized_keys",
                                            "keyData": s.ssh_public_key}]},
                },
            }
        body = {"location": location, "tags": self._tags(name, name), "properties": properties}
        log.info("azure: creating VM %s (%s in %s)", name, size, location)
        return self.compute.virtual_machines.begin_create_or_update(s.resource_group, name, body).result()

    def _ensure_network(self, name: str, location: str) -> str:
        """The NIC id for VM `name` in `location`, creating the NSG, VNet, IP and NIC as needed."""
        with self._network_lock:
            nsg_id = self._ensure_nsg(location)
            subnet_id = self.settings.subnet_id or self._ensure_vnet(location)
            pip_id = self._ensure_public_ip(name, location) if self.settings.public_ip else None
            return self._ensure_nic(name, location, subnet_id, nsg_id, pip_id)

    def nsg_rules(self) -> list[dict[str, Any]]:
        """The run NSG's rules: the four ports from the controller only, then deny Internet."""
        s = self.settings
        ports = [("ssh", s.ssh_port), ("waa", s.waa_port), ("qmp", s.qmp_port), ("devtools", s.devtools_port)]
        if s.access == "tunnel":
            ports = ports[:1]  # WAA, QMP and DevTools (unauthenticated) travel inside SSH
        rules = [
            {
                "name": f"allow-controller-{label}",
                "properties": {
                    "priority": 100 + i * 10,
                    "direction": "Inbound",
                    "access": "Allow",
                    "protocol": "Tcp",
                    "sourceAddressPrefix": s.controller_cidr,
                    "sourcePortRange": "*",
                    "destinationAddressPrefix": "*",
                    "destinationPortRange": str(port),
                },
            }
            for i, (label, port) in enumerate(ports)
        ]
        rules.append(
            {
                "name": "deny-internet-inbound",
                "properties": {
                    "priority": 4000,
                    "direction": "Inbound",
                    "access": "Deny",
                    "protocol": "*",
                    "sourceAddressPrefix": "Internet",
                    "sourcePortRange": "*",
                    "destinationAddressPrefix": "*",
                    "destinationPortRange": "*",
                },
            }
        )
        return rules

    def _existing_in(self, resource: Any, location: str, what: str, deleter: Callable[..., Any], name: str) -> bool:
        """True when `resource` can be reused in `location`; a leftover elsewhere is deleted."""
        if resource is None:
            return False
        state = (getattr(resource, "provisioning_state", None) or "").lower()
        if _slug(resource.location or "") == _slug(location) and state != "failed":
            return True
        self._delete(deleter, name, what)
        return False

    def _ensure_nsg(self, location: str) -> str:
        name = self._nsg_name(location)
        ops = self.network.network_security_groups
        nsg = self._get(ops.get, name, f"NSG {name}")
        wanted = self.nsg_rules()
        if self._existing_in(nsg, location, f"NSG {name}", ops.begin_delete, name):
            have = {(r.name, r.source_address_prefix, r.destination_port_range, r.access)
                    for r in (nsg.security_rules or [])}
            want = {(r["name"], r["properties"]["sourceAddressPrefix"], r["properties"]["destinationPortRange"],
                     r["properties"]["access"]) for r in wanted}
            if have == want:
                return nsg.id
        body = {"location": location, "tags": self._tags(name), "properties": {"securityRules": wanted}}
        return self._wait(ops.begin_create_or_update, f"creating NSG {name}", name, body).id

    def _ensure_vnet(self, location: str) -> str:
        name = self._vnet_name(location)
        ops = self.network.virtual_networks
        vnet = self._get(ops.get, name, f"VNet {name}")
        if not self._existing_in(vnet, location, f"VNet {name}", ops.begin_delete, name):
            body = {
                "location": location,
                "tags": self._tags(name),
                "properties": {
                    "addressSpace": {"addressPrefixes": [self.settings.vnet_prefix]},
                    "subnets": [{"name": SUBNET_NAME, "properties": {"addressPrefix": self.settings.vnet_prefix}}],
                },
            }
            vnet = self._wait(ops.begin_create_or_update, f"creating VNet {name}", name, body)
        return f"{vnet.id}/subnets/{SUBNET_NAME}"

    def _ensure_public_ip(self, vm: str, location: str) -> str:
        name = f"{vm}-pip"
        ops = self.network.public_ip_addresses
        pip = self._get(ops.get, name, f"public IP {name}")
        if self._existing_in(pip, location, f"public IP {name}", ops.begin_delete, name):
            return pip.id
        body = {
            "location": location,
            "tags": self._tags(name, vm),
            "sku": {"name": "Standard"},
            "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"},
        }
        return self._wait(ops.begin_create_or_update, f"creating public IP {name}", name, body).id

    def _ensure_nic(self, vm: str, location: str, subnet_id: str, nsg_id: str, pip_id: str | None) -> str:
        name = f"{vm}-nic"
        ops = self.network.network_interfaces
        nic = self._get(ops.get, name, f"NIC {name}")
        if self._existing_in(nic, location, f"NIC {name}", ops.begin_delete, name):
            return nic.id
        ip_config: dict[str, Any] = {"subnet": {"id": subnet_id}, "privateIPAllocationMethod": "Dynamic"}
        if pip_id:
            ip_config["publicIPAddress"] = {"id": pip_id}
        body = {
            "location": location,
            "tags": self._tags(name, vm),
            "properties": {
                "networkSecurityGroup": {"id": nsg_id},
                "ipConfigurations": [{"name": "ipconfig1", "properties": ip_config}],
            },
        }
        return self._wait(ops.begin_create_or_update, f"creating NIC {name}", name, body).id

    def _tag_os_disk(self, name: str, vm: Any) -> None:
        disk_name = vm.storage_profile.os_disk.name
        self._wait(self.compute.disks.begin_update, f"tagging OS disk {disk_name}", disk_name,
                   {"tags": self._tags(disk_name, name)})

    def _ensure_baseline_snapshot(self, name: str, vm: Any) -> str:
        """A snapshot of the freshly provisioned OS disk: the DISK reset's source for this VM."""
        snap_name = f"{name}-baseline"
        existing = self._get(self.compute.snapshots.get, snap_name, f"snapshot {snap_name}")
        if existing is not None and (existing.provisioning_state or "").lower() != "failed":
            return existing.id
        body = {
            "location": vm.location,
            "tags": self._tags(snap_name, name),
            "properties": {
                "creationData": {"createOption": "Copy",
                                 "sourceResourceId": vm.storage_profile.os_disk.managed_disk.id},
                "incremental": True,
            },
        }
        return self._wait(self.compute.snapshots.begin_create_or_update, f"creating snapshot {snap_name}",
                          snap_name, body).id

    # -- handles and readiness -------------------------------------------------------------

    def _handle(self, vm_id: str, name: str, vm: Any) -> VMHandle:
        nic = self._get(self.network.network_interfaces.get, f"{name}-nic", f"NIC {name}-nic")
        private_ip = public_ip = None
        if nic is not None and nic.ip_configurations:
            private_ip = nic.ip_configurations[0].private_ip_address
        if self.settings.public_ip:
            pip = self._get(self.network.public_ip_addresses.get, f"{name}-pip", f"public IP {name}-pip")
            public_ip = pip.ip_address if pip is not None else None
        host = public_ip if self.settings.public_ip else private_ip
        if not host and self._waa_url_for is None:
            raise ProviderError(f"azure: VM {name} has no {'public' if self.settings.public_ip else 'private'} IP")
        handle = VMHandle(
            vm_id=vm_id,
            base_url=f"http://{host}:{self.settings.waa_port}",
            provider=self.name,
            devtools_url=f"http://{host}:{self.settings.devtools_port}" if host else None,
            details={
                "azure_name": name,
                "resource_id": vm.id,
                "location": vm.location,
                "vm_size": vm.hardware_profile.vm_size,
                "os_disk_id": vm.storage_profile.os_disk.managed_disk.id,
                "public_ip": public_ip,
                "private_ip": private_ip,
            },
        )
        if self._waa_url_for is not None:
            handle.base_url = self._waa_url_for(handle).rstrip("/")
        return handle

    def _qmp(self, vm: VMHandle) -> tuple[str, int]:
        if self._qmp_address_for is not None:
            return self._qmp_address_for(vm)
        tunnel = self._tunnels.get(vm.vm_id)
        if self.settings.access == "tunnel" and tunnel is not None:
            return tunnel.address("qmp")
        host = vm.details.get("public_ip") if self.settings.public_ip else vm.details.get("private_ip")
        if not host:
            raise ProviderError(f"azure: VM {vm.vm_id} has no address for the QEMU monitor")
        return str(host), self.settings.qmp_port

    def _attach_tunnel(self, vm: VMHandle, unique_id: str | None = None, *, rekey: bool = False) -> None:
        """With access="tunnel": open (or revive) the VM's tunnel, waiting up to ready_timeout for
        its sshd, and point base_url / devtools_url at the local forwards. The host key is pinned
        under the VM's unique vmId (names repeat across runs). `rekey` forgets the pinned key
        first: only after this provider swapped the OS disk itself."""
        s = self.settings
        if s.access != "tunnel":
            return
        if self._ssh_address_for is not None:
            host, port = self._ssh_address_for(vm)
        else:
            host, port = vm.details.get("public_ip") or vm.details.get("private_ip"), s.ssh_port
        if not host:
            raise ProviderError(f"azure: VM {vm.details.get('azure_name', vm.vm_id)} has no address for its SSH tunnel")
        alias = vm.details.setdefault("ssh_host_key_alias",
                                      f"waa-azure-{unique_id or vm.details.get('azure_name') or vm.vm_id}")
        extra: dict[str, Any] = {"config_file": s.ssh_config_file}
        if s.ssh_known_hosts_file:
            extra["known_hosts_file"] = s.ssh_known_hosts_file
        target = SSHTarget(host=str(host), port=int(port), user=str(s.ssh_user), identity_file=s.ssh_identity_file,
                           host_key_alias=alias, **extra)
        tunnel = self._tunnels.open_when_ready(
            vm.vm_id, target, {"waa": s.waa_port, "qmp": s.qmp_port, "devtools": s.devtools_port},
            timeout=s.ready_timeout, poll_seconds=s.ready_poll_seconds, forget_host_key_first=rekey,
        )
        vm.base_url, vm.devtools_url = tunnel.url("waa"), tunnel.url("devtools")
        vm.details["ssh"] = target.describe()

    def close(self) -> None:
        """Close every SSH tunnel (access="tunnel"); safe to repeat."""
        self._tunnels.close_all()

    def _wait_for_waa(self, vm: VMHandle, when: str) -> float:
        client = WAAClient(vm.base_url)
        try:
            return client.wait_until_ready(self.settings.ready_timeout, poll_seconds=self.settings.ready_poll_seconds)
        except WAAError as exc:
            raise ProviderError(f"azure: VM {vm.details.get('azure_name', vm.vm_id)}: WAA server not ready "
                                f"{when}: {exc}") from exc
        finally:
            client.close()

    def _power_state(self, name: str) -> str:
        view = self._get(self.compute.virtual_machines.instance_view, name, f"instance view of VM {name}")
        for status in (getattr(view, "statuses", None) or []):
            if (status.code or "").startswith("PowerState/"):
                return status.code.split("/", 1)[1]
        return "unknown"

    # -- reset -----------------------------------------------------------------------------

    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        start = time.monotonic()
        steps: dict[str, float] = {}
        if level is ResetLevel.SETUP:
            pass
        elif level is ResetLevel.SNAPSHOT:
            if not self.settings.guest_snapshot:
                raise ProviderError(f"azure: VM {vm.vm_id}: no QEMU baseline snapshot (set guest_snapshot=true)")
            from adapters.vms import guest_reset

            timing = guest_reset.snapshot_reset(self._qmp(vm), vm.base_url, GUEST_SNAPSHOT_NAME,
                                                self.settings.ready_timeout)
            steps = {"monitor": timing.monitor_seconds, "ready": timing.ready_seconds}
        elif level is ResetLevel.REBOOT:
            from adapters.vms import guest_reset

            timing = guest_reset.reboot_reset(self._qmp(vm), vm.base_url, self.settings.ready_timeout)
            steps = {"monitor": timing.monitor_seconds, "ready": timing.ready_seconds}
        elif level is ResetLevel.DISK:
            steps = self._swap_os_disk(vm)
        else:  # pragma: no cover - every level is handled above
            raise ProviderError(f"azure: unknown reset level {level}")
        seconds = time.monotonic() - start
        vm.details["last_reset_seconds"] = round(seconds, 3)
        self.reset_timings.append(AzureResetTiming(vm.vm_id, level, seconds, steps))
        log.info("azure: reset %s of %s took %.1f s %s", level.value, vm.vm_id, seconds, steps)

    def _swap_os_disk(self, handle: VMHandle) -> dict[str, float]:
        """deallocate -> disk from the snapshot -> PUT VM with it -> start -> wait WAA -> delete old disk."""
        name = handle.details.get("azure_name") or self.vm_name(handle.vm_id)
        vms = self.compute.virtual_machines
        steps: dict[str, float] = {}
        clock = time.monotonic()

        def lap(step: str) -> None:
            nonlocal clock
            now = time.monotonic()
            steps[step] = round(now - clock, 3)
            clock = now

        source = self.settings.golden_snapshot_id
        if not source:
            snap = self._get(self.compute.snapshots.get, f"{name}-baseline", f"snapshot {name}-baseline")
            if snap is None:
                raise ProviderError(f"azure: VM {name}: DISK reset needs golden_snapshot_id or a baseline snapshot "
                                    f"({name}-baseline is missing)")
            source = snap.id
        vm = self._get(vms.get, name, f"VM {name}")
        if vm is None:
            raise ProviderError(f"azure: VM {name} does not exist; cannot reset its disk")
        old_disk = vm.storage_profile.os_disk
        old_disk_name, old_disk_id = old_disk.name, old_disk.managed_disk.id
        self._wait(vms.begin_deallocate, f"deallocating VM {name}", name)
        lap("deallocate")
        new_disk_name = f"{name}-osdisk-{dt.datetime.now(dt.timezone.utc):%Y%m%d%H%M%S}-{uuid.uuid4().hex[:4]}"
        disk_body = {
            "location": vm.location,
            "tags": self._tags(new_disk_name, name),
            "sku": {"name": self.settings.os_disk_sku},
            "properties": {"creationData": {"createOption": "Copy", "sourceResourceId": source}},
        }
        new_disk = self._wait(self.compute.disks.begin_create_or_update, f"creating disk {new_disk_name} from "
                              f"snapshot", new_disk_name, disk_body)
        lap("disk_from_snapshot")
        body = vm.as_dict()
        for read_only in ("instanceView", "resources", "etag", "managedBy"):
            body.pop(read_only, None)
        for read_only in ("instanceView", "provisioningState", "timeCreated"):
            body["properties"].pop(read_only, None)
        os_disk = body["properties"]["storageProfile"]["osDisk"]
        os_disk["name"] = new_disk_name
        os_disk.setdefault("managedDisk", {})["id"] = new_disk.id
        os_disk.pop("diskSizeGB", None)
        try:
            self._wait(vms.begin_create_or_update, f"swapping the OS disk of VM {name} to {new_disk_name}", name, body)
        except ProviderError:
            self._delete(self.compute.disks.begin_delete, new_disk_name, f"disk {new_disk_name}")
            raise
        lap("vm_put")
        self._wait(vms.begin_start, f"starting VM {name}", name)
        lap("start")
        # A golden snapshot's disk may bring other SSH host keys: re-pin them.
        self._attach_tunnel(handle, rekey=True)
        self._wait_for_waa(handle, "after the OS disk swap")
        lap("wait_waa")
        handle.details["os_disk_id"] = new_disk.id
        if old_disk_id and old_disk_id.lower() != new_disk.id.lower():
            self._delete(self.compute.disks.begin_delete, old_disk_name, f"old OS disk {old_disk_name}")
        lap("delete_old_disk")
        return steps

    # -- stop and delete -------------------------------------------------------------------

    def stop(self, vm: VMHandle) -> None:
        name = vm.details.get("azure_name") or self.vm_name(vm.vm_id)
        self._tunnels.close(vm.vm_id)  # a deallocated VM's tunnel could only fail
        self._wait(self.compute.virtual_machines.begin_deallocate, f"deallocating VM {name}", name)

    def delete(self, vm: VMHandle) -> None:
        """The VM, its OS disk(s), baseline snapshot, NIC and public IP; the run's NSG/VNet when last."""
        name = vm.details.get("azure_name") or self.vm_name(vm.vm_id)
        self._tunnels.close(vm.vm_id, forget=True)  # its successor will have other host keys
        existing = self._get(self.compute.virtual_machines.get, name, f"VM {name}")
        if existing is not None:
            self._delete_vm_and_disk(name, existing)
        # Disks and snapshots of this VM (earlier swaps, baseline) carry its tag.
        for kind, items, deleter in (
            ("disk", self.compute.disks.list_by_resource_group, self.compute.disks.begin_delete),
            ("snapshot", self.compute.snapshots.list_by_resource_group, self.compute.snapshots.begin_delete),
        ):
            for item in self._list(items, kind):
                tags = item.tags or {}
                if tags.get(TAG_VM) == name and tags.get(TAG_RUN_ID) == self.run_id:
                    self._delete(deleter, item.name, f"{kind} {item.name}")
        self._delete_vm_network(name)
        locations = list(self.settings.locations)
        if vm.details.get("location") and vm.details["location"] not in locations:
            locations.append(vm.details["location"])
        self._release_shared_network(locations)

    def _delete_vm_and_disk(self, name: str, vm: Any) -> None:
        disk_name = None
        try:
            disk_name = vm.storage_profile.os_disk.name
        except AttributeError:
            pass
        self._delete(self.compute.virtual_machines.begin_delete, name, f"VM {name}")
        for disk in {disk_name, f"{name}-osdisk"} - {None}:
            self._delete(self.compute.disks.begin_delete, disk, f"OS disk {disk}")

    def _delete_vm_network(self, name: str) -> None:
        self._delete(self.network.network_interfaces.begin_delete, f"{name}-nic", f"NIC {name}-nic")
        self._delete(self.network.public_ip_addresses.begin_delete, f"{name}-pip", f"public IP {name}-pip")

    def _release_shared_network(self, locations: list[str]) -> None:
        """Delete the run's NSG and VNet in each location where no NIC of the run remains."""
        with self._network_lock:
            nics = [n for n in self._list(self.network.network_interfaces.list, "NIC")
                    if (n.tags or {}).get(TAG_RUN_ID) == self.run_id]
            for location in locations:
                if any(_slug(n.location or "") == _slug(location) for n in nics):
                    continue
                nsg, vnet = self._nsg_name(location), self._vnet_name(location)
                self._delete(self.network.network_security_groups.begin_delete, nsg, f"NSG {nsg}")
                if not self.settings.subnet_id:
                    self._delete(self.network.virtual_networks.begin_delete, vnet, f"VNet {vnet}")

    # -- janitor ---------------------------------------------------------------------------

    def _list(self, lister: Callable[..., Any], what: str) -> list[Any]:
        from azure.core.exceptions import HttpResponseError

        try:
            return list(lister(self.settings.resource_group))
        except HttpResponseError as exc:
            raise ProviderError(f"azure: listing {what}s failed: {_error_text(exc)}") from exc

    def _kinds(self) -> list[tuple[str, Callable[..., Any], Callable[..., Any], Callable[..., Any]]]:
        """(kind, list, get, begin_delete) per resource type, in deletion order."""
        c, n = self.compute, self.network
        return [
            (KIND_VM, c.virtual_machines.list, c.virtual_machines.get, c.virtual_machines.begin_delete),
            (KIND_NIC, n.network_interfaces.list, n.network_interfaces.get, n.network_interfaces.begin_delete),
            (KIND_PUBLIC_IP, n.public_ip_addresses.list, n.public_ip_addresses.get, n.public_ip_addresses.begin_delete),
            (KIND_DISK, c.disks.list_by_resource_group, c.disks.get, c.disks.begin_delete),
            (KIND_SNAPSHOT, c.snapshots.list_by_resource_group, c.snapshots.get, c.snapshots.begin_delete),
            (KIND_NSG, n.network_security_groups.list, n.network_security_groups.get,
             n.network_security_groups.begin_delete),
            (KIND_VNET, n.virtual_networks.list, n.virtual_networks.get, n.virtual_networks.begin_delete),
        ]

    def list_owned(self) -> list[OwnedResource]:
        """Every resource in the resource group with the managed tag (any run), VMs first."""
        owned = []
        for kind, lister, _get, _delete in self._kinds():
            for item in self._list(lister, kind.replace("_", " ")):
                tags = dict(item.tags or {})
                if tags.get(TAG_MANAGED) == "true":
                    owned.append(OwnedResource(provider=self.name, kind=kind, resource_id=item.id, tags=tags))
        return owned

    def delete_resource(self, resource: OwnedResource) -> None:
        """Delete one resource, after checking that it still carries the managed tag."""
        if resource.provider != self.name:
            raise ProviderError(f"azure: {resource.resource_id} belongs to provider {resource.provider}")
        rg, _arm_type, name, kind = _parse_id(resource.resource_id)
        if rg.lower() != self.settings.resource_group.lower():
            raise ProviderError(f"azure: {resource.resource_id} is outside resource group "
                                f"{self.settings.resource_group}")
        _kind, _lister, getter, deleter = next(k for k in self._kinds() if k[0] == kind)
        current = self._get(getter, name, f"{kind} {name}")
        if current is None:
            return
        if (current.tags or {}).get(TAG_MANAGED) != "true":
            raise ProviderError(f"azure: refusing to delete {resource.resource_id}: it lacks the {TAG_MANAGED} tag")
        self._delete(deleter, name, f"{kind.replace('_', ' ')} {name}")

    # -- warm pools ------------------------------------------------------------------------

    def list_vms(self) -> list[VMState]:
        """This run's (or warm pool's) VMs with their power state, size and OS disk size."""
        states = []
        for vm in self._list(self.compute.virtual_machines.list, "VM"):
            tags = dict(vm.tags or {})
            if tags.get(TAG_RUN_ID) != self.run_id or tags.get(TAG_MANAGED) != "true":
                continue
            power = self._power_state(vm.name)
            # Azure keeps billing a VM that is only stopped (powered off), not deallocated.
            billing = (Billing.DISKS if power in ("deallocated", "deallocating") else
                       Billing.NONE if (vm.provisioning_state or "").lower() == "deleting" else Billing.COMPUTE)
            disk = getattr(vm.storage_profile, "os_disk", None)
            states.append(VMState(
                vm_id=vm.name,
                cloud_id=vm.id,
                state=power,
                size=vm.hardware_profile.vm_size if vm.hardware_profile else None,
                billing=billing,
                disk_gb=getattr(disk, "disk_size_gb", None),
                expires_at=ResourceTags.expiry_of(tags),
            ))
        return sorted(states, key=lambda s: s.vm_id)

    def renew_expiry(self, vm_id: str) -> dt.datetime:
        """Re-tag the VM and every disk, snapshot, NIC and public IP of it with a fresh expiry."""
        now = dt.datetime.now(dt.timezone.utc)
        self.tags = ResourceTags(run_id=self.run_id, owner=self.tags.owner,
                                 expires_at=now + dt.timedelta(hours=self.settings.ttl_hours))
        name = self.vm_name(vm_id)
        expires = self.tags.as_dict()[TAG_EXPIRES_AT]
        vm = self._get(self.compute.virtual_machines.get, name, f"VM {name}")
        if vm is None:
            raise ProviderError(f"azure: VM {name} does not exist; nothing to renew")
        self._wait(self.compute.virtual_machines.begin_update, f"tagging VM {name}", name,
                   {"tags": {**(vm.tags or {}), TAG_EXPIRES_AT: expires}})
        for kind, items, updater in (
            ("disk", self.compute.disks.list_by_resource_group, self.compute.disks.begin_update),
            ("snapshot", self.compute.snapshots.list_by_resource_group, self.compute.snapshots.begin_update),
        ):
            for item in self._list(items, kind):
                tags = dict(item.tags or {})
                if tags.get(TAG_VM) == name and tags.get(TAG_RUN_ID) == self.run_id:
                    self._wait(updater, f"tagging {kind} {item.name}", item.name,
                               {"tags": {**tags, TAG_EXPIRES_AT: expires}})
        return self.tags.expires_at
