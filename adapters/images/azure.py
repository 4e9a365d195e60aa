"""The Azure image builder: a builder VM prepares WAA, then becomes a compute gallery image version.

What it creates (deterministic names from the build name; all builder pieces carry the product's
ownership tags with the build's run id `image-<name>`, so the janitor and `cleanup` find them):

    waa-arena-img-<name>          the builder VM (Ubuntu + the cloud-init of cloud_init.py as
                                  customData), size spec.size, OS disk spec.disk_gb
    waa-arena-img-<name>-nsg      inbound 22 and the WAA port from controller_cidr only, then
                                  deny Internet
    waa-arena-img-<name>-vnet / -pip / -nic   its network
    galleries/<gallery>                           created when missing, kept
    galleries/<gallery>/images/<name>             the image definition (Linux, Specialized, V2)
    galleries/<gallery>/images/<name>/versions/1.0.0   captured from the deallocated builder VM,
                                  tagged with the provenance; `AzureSettings.image_id` takes its id
                                  (with `image_specialized = true`)

Deallocating the builder shuts its OS down, which stops the WAA container (and Windows in it)
through the systemd unit before the disk is captured. Verification boots one VM from the version
with the product's own AzureProvider (run id `image-<name>-verify`).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from adapters.images.cloud_init import render_user_data
from adapters.images.container_registry import resolve_digest
from adapters.images.plan import Resolver, builder_tags, plan_container, provenance_from_builder
from adapters.images.provenance import (
    TAG_READY,
    TAG_VERIFIED,
    TAG_VERIFIED_AT,
    provenance_tags,
)
from adapters.images.spec import DEFAULT_AZURE_BASE_IMAGE, BuildSpec
from adapters.images.stages import BuildError, BuildStatus, ImageBuilder
from adapters.images.verify import boot_and_probe
from adapters.vms.azure import TAG_NAME, TAG_VM, AzureProvider, AzureSettings, _error_text
from adapters.vms.base import TAG_MANAGED, TAG_OWNER, TAG_RUN_ID, ProviderError, VMHandle
from adapters.vms.janitor import sweep_run

log = logging.getLogger(__name__)

UrlFor = Callable[[VMHandle], str]
IMAGE_VERSION = "1.0.0"  # one version per build: the image definition is named after the build
SUBNET = "waa"


def _state(resource: Any) -> str:
    """An ARM resource's provisioningState, lower-cased ('' when absent)."""
    props = getattr(resource, "properties", None)
    value = getattr(props, "provisioning_state", None) or getattr(resource, "provisioning_state", None)
    value = getattr(value, "value", value)  # the SDK's enums (GalleryProvisioningState) or plain strings
    return str(value or "").lower()


class AzureImageBuilder(ImageBuilder):
    """One build's stages in one Azure resource group (see the module docstring)."""

    provider_name = "azure"

    def __init__(
        self,
        spec: BuildSpec,
        settings: AzureSettings,
        *,
        credential: Any = None,
        waa_url_for: UrlFor | None = None,
        verify_waa_url_for: UrlFor | None = None,
        resolver: Resolver = resolve_digest,
        warn: Callable[[str], None] = log.warning,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self._init_common(spec, waa_url_for, verify_waa_url_for, resolver, warn, clock)
        self.settings = settings
        self._credential = credential
        self._provider = AzureProvider(settings, spec.run_id, credential=credential)
        self.compute = self._provider.compute
        self.network = self._provider.network
        self.location = settings.locations[0]
        self.prefix = f"waa-arena-img-{spec.name}"

    # -- helpers -----------------------------------------------------------------------------------

    @property
    def rg(self) -> str:
        return self.settings.resource_group

    @property
    def version_id(self) -> str:
        return (f"/subscriptions/{self.settings.subscription_id}/resourceGroups/{self.rg}/providers/"
                f"Microsoft.Compute/galleries/{self.spec.gallery}/images/{self.spec.name}/versions/{IMAGE_VERSION}")

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        """Run one SDK call (LROs included); failures become BuildError naming `what`."""
        from azure.core.exceptions import HttpResponseError

        try:
            return call()
        except (BuildError, ProviderError):
            raise
        except HttpResponseError as exc:
            raise BuildError(f"Azure image build {self.spec.name}: {what} failed: {_error_text(exc)}",
                             transient=True) from exc

    def _get(self, what: str, getter: Callable[..., Any], *names: str) -> Any | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._call(f"reading {what}", lambda: getter(self.rg, *names))
        except BuildError as exc:
            if isinstance(exc.__cause__, ResourceNotFoundError):
                return None
            raise

    def _builder_vm(self) -> Any | None:
        return self._get(f"VM {self.prefix}", self.compute.virtual_machines.get, self.prefix)

    def _version(self) -> Any | None:
        return self._get(f"image version {self.version_id}", self.compute.gallery_image_versions.get,
                         self.spec.gallery, self.spec.name, IMAGE_VERSION)

    def _tags(self, name: str) -> dict[str, str]:
        return {**self._provider.tags.as_dict(), TAG_NAME: name, TAG_VM: self.prefix}

    # -- status --------------------------------------------------------------------------------------

    def status(self) -> BuildStatus:
        vm = self._builder_vm()
        version = self._version()
        try:
            owned = self._provider.list_owned()
        except ProviderError as exc:
            raise BuildError(f"Azure image build {self.spec.name}: {exc}") from exc
        tags = dict(getattr(version, "tags", None) or {})
        state = _state(version) if version is not None else None
        return BuildStatus(
            name=self.spec.name, provider="azure",
            builder_id=vm.id if vm is not None else None,
            builder_ready=vm is not None and (vm.tags or {}).get(TAG_READY) == "true",
            builder_tags=dict(vm.tags or {}) if vm is not None else {},
            builder_resources=[f"{r.kind} {r.resource_id}" for r in owned if r.tags.get(TAG_RUN_ID) == self.spec.run_id],
            verify_resources=[f"{r.kind} {r.resource_id}" for r in owned
                              if r.tags.get(TAG_RUN_ID) == self.spec.verify_run_id],
            image_id=version.id if version is not None else None,
            image_state=state,
            image_available=state == "succeeded",
            verified=tags.get(TAG_VERIFIED) == "true",
            tags=tags,
        )

    # -- stage 1: builder -------------------------------------------------------------------------------

    def ensure_builder(self) -> str:
        vm = self._builder_vm()
        if vm is not None and _state(vm) != "failed":
            return str(vm.id)
        if vm is not None:
            log.info("image build %s: builder %s is Failed; deleting it", self.spec.name, self.prefix)
            self._call("deleting the failed builder", lambda: self.compute.virtual_machines.begin_delete(
                self.rg, self.prefix).result())
        base_image = self.spec.base_image or DEFAULT_AZURE_BASE_IMAGE
        plan, record = plan_container(self.spec, self._resolver, self._warn)
        nic_id = self._network()
        if base_image.lower().startswith("/subscriptions/"):
            reference: dict[str, str] = {"id": base_image}
        else:
            publisher, offer, sku, version = base_image.split(":")
            reference = {"publisher": publisher, "offer": offer, "sku": sku, "version": version}
        s = self.settings
        custom_data = base64.b64encode(render_user_data(self.spec, plan).encode()).decode()
        body = {
            "location": self.location,
            "tags": {**self._tags(self.prefix), **builder_tags(self.spec, record, base_image)},
            "properties": {
                "hardwareProfile": {"vmSize": self.spec.size},
                "storageProfile": {
                    "imageReference": reference,
                    "osDisk": {"name": f"{self.prefix}-osdisk", "createOption": "FromImage", "caching": "ReadWrite",
                               "deleteOption": "Delete", "diskSizeGB": self.spec.disk_gb,
                               "managedDisk": {"storageAccountType": s.os_disk_sku}},
                },
                "osProfile": {
                    "computerName": self.prefix[:63],
                    "adminUsername": s.admin_username,
                    "customData": custom_data,
                    "linuxConfiguration": {
                        "disablePasswordAuthentication": True,
                        "ssh": {"publicKeys": [{"path": f"/home/{s.admin_username}/.ssh/authorized_keys",
                                                "keyData": s.ssh_public_key}]},
                    },
                },
                "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": True}}]},
            },
        }
        vm = self._call(f"creating the builder VM {self.prefix} ({self.spec.size} in {self.location})",
                        lambda: self.compute.virtual_machines.begin_create_or_update(self.rg, self.prefix,
                                                                                     body).result())
        log.info("image build %s: builder %s created", self.spec.name, self.prefix)
        return str(vm.id)

    def _network(self) -> str:
        """The builder's NIC id, creating the NSG, VNet, public IP and NIC that are missing."""
        s, n = self.settings, self.network
        rules = [
            {"name": f"allow-controller-{label}",
             "properties": {"priority": 100 + i * 10, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
                            "sourceAddressPrefix": s.controller_cidr, "sourcePortRange": "*",
                            "destinationAddressPrefix": "*", "destinationPortRange": str(port)}}
            for i, (label, port) in enumerate([("ssh", s.ssh_port), ("waa", s.waa_port)])
        ]
        rules.append({"name": "deny-internet-inbound",
                      "properties": {"priority": 4000, "direction": "Inbound", "access": "Deny", "protocol": "*",
                                     "sourceAddressPrefix": "Internet", "sourcePortRange": "*",
                                     "destinationAddressPrefix": "*", "destinationPortRange": "*"}})

        def ensure(kind: str, name: str, ops: Any, body: dict[str, Any]) -> Any:
            existing = self._get(f"{kind} {name}", ops.get, name)
            if existing is not None and _state(existing) != "failed":
                return existing
            return self._call(f"creating {kind} {name}",
                              lambda: ops.begin_create_or_update(self.rg, name, body).result())

        loc = self.location
        nsg = ensure("NSG", f"{self.prefix}-nsg", n.network_security_groups,
                     {"location": loc, "tags": self._tags(f"{self.prefix}-nsg"),
                      "properties": {"securityRules": rules}})
        if s.subnet_id:
            subnet_id = s.subnet_id
        else:
            vnet = ensure("VNet", f"{self.prefix}-vnet", n.virtual_networks,
                          {"location": loc, "tags": self._tags(f"{self.prefix}-vnet"),
                           "properties": {"addressSpace": {"addressPrefixes": [s.vnet_prefix]},
                                          "subnets": [{"name": SUBNET,
                                                       "properties": {"addressPrefix": s.vnet_prefix}}]}})
            subnet_id = f"{vnet.id}/subnets/{SUBNET}"
        ip_config: dict[str, Any] = {"subnet": {"id": subnet_id}, "privateIPAllocationMethod": "Dynamic"}
        if s.public_ip:
            pip = ensure("public IP", f"{self.prefix}-pip", n.public_ip_addresses,
                         {"location": loc, "tags": self._tags(f"{self.prefix}-pip"), "sku": {"name": "Standard"},
                          "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"}})
            ip_config["publicIPAddress"] = {"id": pip.id}
        nic = ensure("NIC", f"{self.prefix}-nic", n.network_interfaces,
                     {"location": loc, "tags": self._tags(f"{self.prefix}-nic"),
                      "properties": {"networkSecurityGroup": {"id": nsg.id},
                                     "ipConfigurations": [{"name": "ipconfig1", "properties": ip_config}]}})
        return str(nic.id)

    # -- stage 2: ready ------------------------------------------------------------------------------------

    def _builder_handle(self, vm: Any) -> VMHandle:
        host = None
        if self.settings.public_ip:
            pip = self._get("public IP", self.network.public_ip_addresses.get, f"{self.prefix}-pip")
            host = getattr(pip, "ip_address", None)
        else:
            nic = self._get("NIC", self.network.network_interfaces.get, f"{self.prefix}-nic")
            if nic is not None and nic.ip_configurations:
                host = nic.ip_configurations[0].private_ip_address
        handle = VMHandle(vm_id=self.prefix, base_url=f"http://{host}:{self.settings.waa_port}", provider="azure",
                          details={"resource_id": vm.id, "host": host, "role": "builder"})
        if self._waa_url_for is not None:
            handle.base_url = self._waa_url_for(handle).rstrip("/")
        elif not host:
            raise BuildError(f"Azure image build {self.spec.name}: the builder has no address")
        return handle

    def wait_builder_ready(self) -> float:
        from adapters.waa.client import WAAClient

        vm = self._builder_vm()
        if vm is None:
            raise BuildError(f"Azure image build {self.spec.name}: no builder VM (stage 1 not done)")
        handle = self._builder_handle(vm)
        started = time.monotonic()
        client = WAAClient(handle.base_url)
        try:
            while not client.probe():
                waited = time.monotonic() - started
                if waited >= self.spec.ready_timeout:
                    raise BuildError(f"Azure image build {self.spec.name}: the builder's WAA server "
                                     f"({handle.base_url}) did not answer /probe within {self.spec.ready_timeout:g} s")
                current = self._builder_vm()
                if current is None or _state(current) == "failed":
                    raise BuildError(f"Azure image build {self.spec.name}: the builder VM is "
                                     f"{'gone' if current is None else 'Failed'}")
                time.sleep(min(self.spec.ready_poll_seconds, max(0.0, self.spec.ready_timeout - waited)))
        finally:
            client.close()
        tags = {**(vm.tags or {}), TAG_READY: "true"}
        self._call("tagging the builder ready", lambda: self.compute.virtual_machines.begin_update(
            self.rg, self.prefix, {"tags": tags}).result())
        return time.monotonic() - started

    # -- stage 3: capture -----------------------------------------------------------------------------------

    def capture(self) -> str:
        version = self._version()
        state = _state(version) if version is not None else ""
        if version is not None and state == "failed":
            log.warning("image build %s: image version %s is Failed; capturing again", self.spec.name, version.id)
            self._call("deleting the failed image version", lambda: self.compute.gallery_image_versions.begin_delete(
                self.rg, self.spec.gallery, self.spec.name, IMAGE_VERSION).result())
            version = None
        if version is None:
            vm = self._builder_vm()
            if vm is None:
                raise BuildError(f"Azure image build {self.spec.name}: no image and no builder to capture from; "
                                 "rerun the build (it starts a new builder)")
            vm_tags = dict(vm.tags or {})
            if vm_tags.get(TAG_READY) != "true":
                raise BuildError(f"Azure image build {self.spec.name}: the builder is not ready (stage 2 not done)")
            tags = provenance_tags(self.spec, provenance_from_builder(vm_tags), owner=self.settings.owner,
                                   region=self.location, base_image=vm_tags.get("waa-arena-builder-base-image", ""),
                                   built_at=self._clock())
            # A shut-down OS: the container (and Windows in it) stopped cleanly before the copy.
            self._call("deallocating the builder", lambda: self.compute.virtual_machines.begin_deallocate(
                self.rg, self.prefix).result())
            self._ensure_gallery()
            self._ensure_definition(tags)
            body = {
                "location": self.location,
                "tags": tags,
                "properties": {
                    "storageProfile": {"source": {"virtualMachineId": vm.id}},
                    "publishingProfile": {"targetRegions": [{"name": self.location, "regionalReplicaCount": 1}],
                                          "replicaCount": 1, "excludeFromLatest": False},
                },
            }
            version = self._call(f"creating image version {self.version_id}",
                                 lambda: self.compute.gallery_image_versions.begin_create_or_update(
                                     self.rg, self.spec.gallery, self.spec.name, IMAGE_VERSION, body).result())
        deadline = time.monotonic() + self.spec.capture_timeout
        while _state(version) != "succeeded":
            if _state(version) == "failed":
                raise BuildError(f"Azure image build {self.spec.name}: image version {self.version_id} failed")
            if time.monotonic() >= deadline:
                raise BuildError(f"Azure image build {self.spec.name}: image version {self.version_id} still "
                                 f"{_state(version)} after {self.spec.capture_timeout:g} s")
            time.sleep(self.spec.capture_poll_seconds)
            version = self._version()
            if version is None:
                raise BuildError(f"Azure image build {self.spec.name}: image version {self.version_id} vanished")
        return str(version.id)

    def _ensure_gallery(self) -> None:
        gallery = self._get(f"gallery {self.spec.gallery}", self.compute.galleries.get, self.spec.gallery)
        if gallery is not None:
            return
        body = {"location": self.location,
                "tags": {TAG_MANAGED: "true", TAG_OWNER: self.settings.owner},
                "properties": {"description": "WAA arena host images"}}
        self._call(f"creating gallery {self.spec.gallery}", lambda: self.compute.galleries.begin_create_or_update(
            self.rg, self.spec.gallery, body).result())

    def _ensure_definition(self, tags: dict[str, str]) -> None:
        if self._get(f"image definition {self.spec.name}", self.compute.gallery_images.get, self.spec.gallery,
                     self.spec.name) is not None:
            return
        body = {
            "location": self.location,
            "tags": {k: v for k, v in tags.items() if k != TAG_VERIFIED},  # verification marks the version
            "properties": {
                "osType": "Linux", "osState": "Specialized", "hyperVGeneration": "V2",
                "identifier": {"publisher": "waa-arena", "offer": "waa-host", "sku": self.spec.name},
                "description": f"WAA arena host (Windows Agent Arena in QEMU), build {self.spec.name}",
            },
        }
        self._call(f"creating image definition {self.spec.name}",
                   lambda: self.compute.gallery_images.begin_create_or_update(
                       self.rg, self.spec.gallery, self.spec.name, body).result())

    # -- stage 4: verify ---------------------------------------------------------------------------------------

    def verify_provider(self, image_id: str) -> AzureProvider:
        """The product's Azure provider as a run would use it, booting from the new version."""
        settings = self.settings.model_copy(update={
            "image_id": image_id, "image_specialized": True, "disk_baseline": False, "guest_snapshot": False,
            "vm_sizes": [self.spec.size], "locations": [self.location], "ready_timeout": self.spec.verify_timeout,
        })
        return AzureProvider(settings, self.spec.verify_run_id, credential=self._credential,
                             waa_url_for=self._verify_waa_url_for)

    def verify(self) -> str:
        version = self._version()
        if version is None or _state(version) != "succeeded":
            raise BuildError(f"Azure image build {self.spec.name}: no finished image version to verify "
                             "(stage 3 not done)")
        provider = self.verify_provider(str(version.id))
        summary = boot_and_probe(provider, self.spec.verify_run_id, self.spec.name, str(version.id))
        stamp = self._clock().astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        tags = {**(version.tags or {}), TAG_VERIFIED: "true", TAG_VERIFIED_AT: stamp}
        self._call("tagging the image version verified", lambda: self.compute.gallery_image_versions.begin_update(
            self.rg, self.spec.gallery, self.spec.name, IMAGE_VERSION, {"tags": tags}).result())
        return summary

    # -- stage 5: cleanup ----------------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        deleted: list[str] = []
        for run_id in (self.spec.run_id, self.spec.verify_run_id):
            try:
                report = sweep_run(self._provider, run_id)
            except ProviderError as exc:
                raise BuildError(f"Azure image build {self.spec.name}: cleanup failed: {exc}") from exc
            if report.failed:
                problems = "; ".join(f"{r.kind} {r.resource_id}: {e}" for r, e in report.failed)
                raise BuildError(f"Azure image build {self.spec.name}: cleanup left resources: {problems}")
            deleted += [f"{r.kind} {r.resource_id.rsplit('/', 1)[-1]}" for r in report.deleted]
        return deleted

    def close(self) -> None:
        self._provider.close()
