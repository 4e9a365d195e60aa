"""The AWS provider: each VM is an EC2 instance (nested virtualization) running the WAA container.

One instance per pool slot, launched from a prepared AMI whose host runs WAA's Windows guest in
QEMU. Everything this provider creates carries the product's tags (base.ResourceTags) so the
janitor can find and delete leftovers:

- the instance and its volume(s) (TagSpecifications at launch),
- one security group per run, open only to `controller_cidr` on 22 / WAA / QMP / DevTools
  (with `access="tunnel"` on SSH only: the other three are forwarded through an OpenSSH tunnel),
- optionally one Elastic IP per VM.

Creation is idempotent by name: the instance carries a deterministic Name and VM-id tag, and a
retried create first looks an existing instance up by those tags (the real guard; a ClientToken
derived from run and VM id is passed as well, which AWS honours and moto ignores).

Reset levels: SETUP does nothing (the adapter cleans up itself); SNAPSHOT and REBOOT go to the
QEMU monitor through `adapters.vms.guest_reset`; DISK replaces the root volume from the AMI (or a
snapshot) with CreateReplaceRootVolumeTask, then waits for the WAA server again.

Credentials come from boto3's own chain only (environment, profile, instance role, SSO).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import ipaddress
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.vms.aws_sessions import new_session
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

log = logging.getLogger(__name__)

# Which pool slot an instance (and its volumes / Elastic IP) belongs to, inside its run.
TAG_VM_ID = "waa-arena-vm-id"

# The EC2 error codes that mean "no capacity or quota for this instance type here": try the next type.
CAPACITY_ERROR_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InstanceLimitExceeded",
        "Unsupported",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "InsufficientCapacity",
    }
)

# Families for which EC2 supports CpuOptions.NestedVirtualization (botocore 1.44 documentation).
NESTED_VIRTUALIZATION_FAMILIES = frozenset({"c8i", "m8i", "r8i", "c8i-flex", "m8i-flex", "r8i-flex"})

# Instance states in which an instance still exists (and blocks its security group).
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
REUSABLE_STATES = ["pending", "running", "stopping", "stopped"]

# Resource kinds of OwnedResource.kind, in an order in which deleting them one by one succeeds
# (instances first: their security group and attached volumes depend on them).
KIND_INSTANCE = "instance"
KIND_ELASTIC_IP = "elastic-ip"
KIND_VOLUME = "volume"
KIND_SECURITY_GROUP = "security-group"
KINDS = (KIND_INSTANCE, KIND_ELASTIC_IP, KIND_VOLUME, KIND_SECURITY_GROUP)

# Spot request status codes that announce an interruption while the instance still runs.
SPOT_INTERRUPTION_CODES = frozenset(
    {"marked-for-termination", "marked-for-stop", "marked-for-hibernation", "instance-terminated-by-price",
     "instance-terminated-no-capacity", "instance-terminated-capacity-oversubscribed",
     "instance-terminated-launch-group-constraint", "instance-stopped-by-price", "instance-stopped-no-capacity"}
)

# The ports the controller reaches on every VM: SSH, and the defaults of the settings below.
SSH_PORT = 22  # AWSSettings.ssh_port's default


class AWSSettings(BaseModel):
    """Where and how AWS VMs are created. Credentials are not settings: boto3's chain supplies them."""

    model_config = ConfigDict(extra="forbid")

    region: str
    ami_id: str = Field(description="AMI of the host (Ubuntu + Docker + WAA image with its prepared Windows disk)")
    # Ordered fallback: the next type is tried on a capacity / quota error for the previous one.
    instance_types: list[str] = Field(default_factory=lambda: ["m8i.2xlarge", "c8i.2xlarge"], min_length=1)
    # Pass CpuOptions.NestedVirtualization="enabled" for the families that support it (c8i/m8i/r8i).
    nested_virtualization: bool = True
    subnet_id: str | None = None
    vpc_id: str | None = None
    key_name: str | None = None
    # The only address allowed to reach SSH, the WAA server, the QMP monitor and DevTools.
    controller_cidr: str
    spot: bool = False
    spot_max_price: str | None = None  # USD per hour; None = up to the on-demand price
    elastic_ip: bool = False  # allocate (and on delete release) one tagged Elastic IP per VM
    use_private_ip: bool = False  # reach the VMs on their private address (controller inside the VPC)
    owner: str
    ttl_hours: float = Field(default=12.0, gt=0)
    waa_port: int = 5000
    qmp_port: int = 7200
    devtools_port: int = 9222
    # How the controller reaches WAA / QMP / DevTools. "cidr": the security group opens them to
    # controller_cidr. "tunnel": it opens only ssh_port, and they are forwarded to 127.0.0.1 on
    # the controller through an OpenSSH tunnel per VM (adapters/vms/tunnel.py).
    access: Literal["cidr", "tunnel"] = "cidr"
    ssh_user: str = "ubuntu"  # the default user of Ubuntu AMIs
    ssh_identity_file: Path | None = None  # key_name's private key; None = ssh-agent / ssh's default keys
    ssh_port: int = Field(default=22, gt=0, lt=65536)
    ssh_known_hosts_file: Path | None = None  # None = the product's own file (tunnel.default_known_hosts_file)
    ssh_config_file: Path | None = None  # an ssh_config for the tunnels (ProxyJump...); None = ~/.ssh/config
    tunnel_monitor_seconds: float = Field(default=10.0, gt=0)  # how often dead tunnels are re-established
    root_volume_gb: int | None = Field(default=None, ge=8)  # None keeps the AMI's size
    user_data: str | None = None
    retry_mode: Literal["standard", "adaptive"] = "standard"
    # Attempts per API call, the first included (throttling / 5xx retried by botocore's retry mode).
    max_attempts: int = Field(default=8, ge=1)
    # A first boot of Windows on AWS takes about 35 min; a prepared AMI a few minutes.
    ready_timeout: float = Field(default=2700.0, gt=0)
    ready_poll_seconds: float = Field(default=5.0, gt=0)
    waiter_delay: float = Field(default=15.0, gt=0)
    waiter_max_attempts: int = Field(default=80, ge=1)
    # Save a QEMU snapshot once WAA answers, for the SNAPSHOT reset level (needs guest_reset).
    baseline_snapshot: bool = True
    baseline_snapshot_name: str = "waa-baseline"
    # DISK reset source: this EBS snapshot of the root volume's lineage, else the AMI.
    disk_reset_snapshot_id: str | None = None
    disk_reset_timeout: float = Field(default=1800.0, gt=0)
    disk_reset_poll_seconds: float = Field(default=10.0, gt=0)
    # How long to keep retrying a security group deletion refused while ENIs detach.
    security_group_delete_timeout: float = Field(default=180.0, ge=0)
    # Terminate an instance whose create failed after launch (WAA never answered, interrupted).
    delete_on_failed_create: bool = True
    endpoint_url: str | None = None  # for moto / LocalStack; None = the real EC2 endpoint

    @field_validator("controller_cidr")
    @classmethod
    def _narrow_cidr(cls, value: str) -> str:
        return validate_controller_cidr(value)


@dataclass(frozen=True)
class ResetTiming:
    """How long one reset took (also kept in vm.details and AWSProvider.reset_timings)."""

    vm_id: str
    level: ResetLevel
    seconds: float


def _guest_reset_available() -> bool:
    try:
        return importlib.util.find_spec("adapters.vms.guest_reset") is not None
    except (ImportError, ValueError):
        return False


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags or []}


def _aws_errors() -> tuple[type[Exception], ...]:
    """What a failed EC2 call raises: API errors, transport/waiter errors, unparsable answers."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError

    return (ClientError, BotoCoreError, ResponseParserError)


def _error_code(exc: Exception) -> str:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def instance_name(run_id: str, vm_id: str) -> str:
    """The deterministic Name tag of a VM: the pool's names already contain the run id."""
    return vm_id if run_id in vm_id else f"waa-{run_id}-{vm_id}"


def client_token(run_id: str, vm_id: str, instance_type: str, attempt: int | str = 0) -> str:
    """A RunInstances idempotency token (≤ 64 ASCII chars) derived from run, VM and type."""
    digest = hashlib.sha256(f"{run_id}\0{vm_id}\0{instance_type}\0{attempt}".encode()).hexdigest()
    return f"waa-{digest[:48]}"


class AWSProvider(VMProvider):
    """Creates, resets and deletes EC2 instances that run the WAA server."""

    name = "aws"
    owns_cloud_resources = True

    @property
    def image_id(self) -> str | None:
        return self.settings.ami_id

    def __init__(
        self,
        settings: AWSSettings,
        run_id: str,
        *,
        session: Any | None = None,
        waa_url_for: Callable[[VMHandle], str] | None = None,
        qmp_address_for: Callable[[VMHandle], tuple[str, int]] | None = None,
        ssh_address_for: Callable[[VMHandle], tuple[str, int]] | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        from botocore.config import Config

        if not run_id:
            raise ValueError("run_id must not be empty")
        self.settings = settings
        self.run_id = run_id
        self._clock = clock
        self._waa_url_for = waa_url_for
        self._qmp_address_for = qmp_address_for
        self._ssh_address_for = ssh_address_for  # test hook: where the tunnel's ssh connects
        self._tunnels: TunnelManager | None = None  # access="tunnel": created with the first tunnel
        self._session = session or new_session()
        config = Config(
            region_name=settings.region,
            # total_max_attempts counts the first call too (botocore's "max_attempts" would not).
            retries={"mode": settings.retry_mode, "total_max_attempts": settings.max_attempts},
        )
        # One client, shared by the pool's threads (botocore clients are thread-safe; sessions are not).
        self.ec2 = self._session.client("ec2", region_name=settings.region, endpoint_url=settings.endpoint_url,
                                        config=config)
        self._lock = threading.Lock()
        self._sg_lock = threading.Lock()  # the run's security group: created once, deleted after the last VM
        self._vm_locks: dict[str, threading.Lock] = {}
        self._root_device: str | None = None
        self.reset_timings: list[ResetTiming] = []

    # -- helpers -----------------------------------------------------------------------------

    @property
    def session(self) -> Any:
        """The boto3 session this provider's clients come from (the one passed in, or its own)."""
        return self._session

    def tags(self) -> ResourceTags:
        """The ownership tags of anything created now (expiry = now + ttl_hours)."""
        expires = self._clock() + dt.timedelta(hours=self.settings.ttl_hours)
        return ResourceTags(run_id=self.run_id, owner=self.settings.owner, expires_at=expires)

    def _vm_tags(self, vm_id: str) -> dict[str, str]:
        return {**self.tags().as_dict(), TAG_VM_ID: vm_id, "Name": instance_name(self.run_id, vm_id)}

    def _vm_lock(self, vm_id: str) -> threading.Lock:
        with self._lock:
            return self._vm_locks.setdefault(vm_id, threading.Lock())

    def _waiter(self, name: str, **kwargs: Any) -> None:
        self.ec2.get_waiter(name).wait(
            WaiterConfig={"Delay": self.settings.waiter_delay, "MaxAttempts": self.settings.waiter_max_attempts},
            **kwargs,
        )

    def _describe_instance(self, instance_id: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        except ClientError as exc:
            if _error_code(exc) == "InvalidInstanceID.NotFound":
                return None
            raise
        for reservation in reservations:
            for instance in reservation["Instances"]:
                return instance
        return None

    def _find_instances(self, vm_id: str | None, states: list[str]) -> list[dict[str, Any]]:
        filters = [
            {"Name": f"tag:{TAG_RUN_ID}", "Values": [self.run_id]},
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": states},
        ]
        if vm_id is not None:
            filters.append({"Name": f"tag:{TAG_VM_ID}", "Values": [vm_id]})
        found = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                found.extend(reservation["Instances"])
        return found

    def _root_device_name(self) -> str:
        if self._root_device is None:
            images = self.ec2.describe_images(ImageIds=[self.settings.ami_id])["Images"]
            if not images:
                raise ProviderError(f"AMI {self.settings.ami_id} not found in {self.settings.region}")
            self._root_device = images[0].get("RootDeviceName") or "/dev/sda1"
        return self._root_device

    def _vpc_id(self) -> str | None:
        if self.settings.vpc_id:
            return self.settings.vpc_id
        if self.settings.subnet_id:
            subnets = self.ec2.describe_subnets(SubnetIds=[self.settings.subnet_id])["Subnets"]
            return subnets[0]["VpcId"] if subnets else None
        return None  # the region's default VPC

    @property
    def security_group_name(self) -> str:
        return f"waa-arena-{self.run_id}"

    # -- security group ------------------------------------------------------------------------

    def _security_group_filters(self) -> list[dict[str, Any]]:
        return [
            {"Name": f"tag:{TAG_RUN_ID}", "Values": [self.run_id]},
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "group-name", "Values": [self.security_group_name]},
        ]

    def ensure_security_group(self) -> str:
        """The run's security group (created once): ingress only from controller_cidr."""
        from botocore.exceptions import ClientError

        with self._sg_lock:
            groups = self.ec2.describe_security_groups(Filters=self._security_group_filters())["SecurityGroups"]
            if groups:
                return groups[0]["GroupId"]
            kwargs: dict[str, Any] = {
                "GroupName": self.security_group_name,
                "Description": f"WAA arena run {self.run_id}: controller access only",
                "TagSpecifications": [
                    {"ResourceType": "security-group",
                     "Tags": _tag_list({**self.tags().as_dict(), "Name": self.security_group_name})}
                ],
            }
            vpc_id = self._vpc_id()
            if vpc_id:
                kwargs["VpcId"] = vpc_id
            try:
                group_id = self.ec2.create_security_group(**kwargs)["GroupId"]
            except ClientError as exc:
                if _error_code(exc) != "InvalidGroup.Duplicate":
                    raise
                groups = self.ec2.describe_security_groups(Filters=self._security_group_filters())["SecurityGroups"]
                if not groups:
                    raise ProviderError(
                        f"a security group named {self.security_group_name} exists without this product's tags; "
                        "delete it or use another run id"
                    ) from exc
                return groups[0]["GroupId"]
            self.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=self._ingress_rules())
            return group_id

    def _ingress_rules(self) -> list[dict[str, Any]]:
        network = ipaddress.ip_network(self.settings.controller_cidr)
        if self.settings.access == "tunnel":
            # WAA, QMP and DevTools (unauthenticated) travel inside SSH: only SSH is opened.
            ports = [self.settings.ssh_port]
        else:
            ports = sorted({self.settings.ssh_port, self.settings.waa_port, self.settings.qmp_port,
                            self.settings.devtools_port})
        rules = []
        for port in ports:
            rule: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": port, "ToPort": port}
            if network.version == 4:
                rule["IpRanges"] = [{"CidrIp": str(network), "Description": "WAA arena controller"}]
            else:
                rule["Ipv6Ranges"] = [{"CidrIpv6": str(network), "Description": "WAA arena controller"}]
            rules.append(rule)
        return rules

    def _delete_security_group_if_unused(self) -> None:
        """Delete the run's security group once no instance of the run exists any more."""
        with self._sg_lock:
            if self._find_instances(None, LIVE_STATES):
                return
            groups = self.ec2.describe_security_groups(Filters=self._security_group_filters())["SecurityGroups"]
            for group in groups:
                self._delete_security_group(group["GroupId"])

    def _delete_security_group(self, group_id: str) -> None:
        from botocore.exceptions import ClientError

        deadline = time.monotonic() + self.settings.security_group_delete_timeout
        while True:
            try:
                self.ec2.delete_security_group(GroupId=group_id)
                return
            except ClientError as exc:
                code = _error_code(exc)
                if code == "InvalidGroup.NotFound":
                    return
                # Right after termination the instance's network interface may still hold the group.
                if code == "DependencyViolation" and time.monotonic() < deadline:
                    time.sleep(min(5.0, self.settings.waiter_delay))
                    continue
                raise

    # -- create --------------------------------------------------------------------------------

    def supported_reset_levels(self) -> set[ResetLevel]:
        levels = {ResetLevel.SETUP, ResetLevel.DISK}
        if _guest_reset_available():
            levels.add(ResetLevel.REBOOT)
            if self.settings.baseline_snapshot:
                levels.add(ResetLevel.SNAPSHOT)
        return levels

    def create(self, vm_id: str) -> VMHandle:
        from botocore.exceptions import WaiterError

        with self._vm_lock(vm_id):
            try:
                instance = self._find_or_launch(vm_id)
                instance_id = instance["InstanceId"]
                try:
                    self._waiter("instance_running", InstanceIds=[instance_id])
                except WaiterError as exc:
                    raise self._not_running_error(vm_id, instance_id, "waiting for it to run") from exc
                instance = self._describe_instance(instance_id) or instance
                if self.settings.elastic_ip:
                    self._ensure_elastic_ip(vm_id, instance_id)
                    instance = self._describe_instance(instance_id) or instance
                handle = self._handle(vm_id, instance)
            except ProviderError:
                raise
            except _aws_errors() as exc:
                raise ProviderError(f"AWS VM {vm_id}: create failed: {exc}") from exc
            try:
                self._attach_tunnel(handle)
                self._wait_ready(handle, "create")
                self._take_baseline(handle)
            except ProviderError:
                if self.settings.delete_on_failed_create:
                    self._cleanup_failed(handle)
                raise
            return handle

    def _find_or_launch(self, vm_id: str) -> dict[str, Any]:
        """The VM's existing instance (started if stopped), or a newly launched one."""
        existing = self._find_instances(vm_id, REUSABLE_STATES)
        if existing:
            instance = sorted(existing, key=lambda i: i.get("LaunchTime") or 0)[0]
            if len(existing) > 1:
                log.warning("AWS VM %s has %d instances; using %s", vm_id, len(existing), instance["InstanceId"])
            state = instance["State"]["Name"]
            if state in ("stopping", "stopped"):
                if state == "stopping":
                    self._waiter("instance_stopped", InstanceIds=[instance["InstanceId"]])
                self.ec2.start_instances(InstanceIds=[instance["InstanceId"]])
            log.info("AWS VM %s: reusing instance %s (%s)", vm_id, instance["InstanceId"], state)
            return instance
        return self._launch(vm_id)

    def _launch(self, vm_id: str) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        group_id = self.ensure_security_group()
        tags = _tag_list(self._vm_tags(vm_id))
        base: dict[str, Any] = {
            "ImageId": self.settings.ami_id,
            "MinCount": 1,
            "MaxCount": 1,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required"},
        }
        if self.settings.subnet_id:
            base["NetworkInterfaces"] = [
                {"DeviceIndex": 0, "SubnetId": self.settings.subnet_id, "Groups": [group_id],
                 "AssociatePublicIpAddress": not self.settings.use_private_ip}
            ]
        else:
            base["SecurityGroupIds"] = [group_id]
        if self.settings.key_name:
            base["KeyName"] = self.settings.key_name
        if self.settings.user_data:
            base["UserData"] = self.settings.user_data
        if self.settings.root_volume_gb:
            base["BlockDeviceMappings"] = [
                {"DeviceName": self._root_device_name(),
                 "Ebs": {"VolumeSize": self.settings.root_volume_gb, "VolumeType": "gp3", "DeleteOnTermination": True}}
            ]
        if self.settings.spot:
            spot_options: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if self.settings.spot_max_price:
                spot_options["MaxPrice"] = self.settings.spot_max_price
            base["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot_options}

        failures: list[str] = []
        for instance_type in self.settings.instance_types:
            kwargs = dict(base, InstanceType=instance_type)
            if self.settings.nested_virtualization and instance_type.split(".")[0] in NESTED_VIRTUALIZATION_FAMILIES:
                kwargs["CpuOptions"] = {"NestedVirtualization": "enabled"}
            for attempt in range(2):
                # The second attempt (after a stale token or a vanished group) gets a fresh token; the
                # tag lookup in _find_or_launch stays the guard against duplicates.
                salt = 0 if attempt == 0 else uuid.uuid4().hex
                kwargs["ClientToken"] = client_token(self.run_id, vm_id, instance_type, salt)
                try:
                    instance = self.ec2.run_instances(**kwargs)["Instances"][0]
                except ClientError as exc:
                    code = _error_code(exc)
                    if code == "InvalidGroup.NotFound" and attempt == 0:
                        # Another thread deleted the run's group after its last VM went: make it again.
                        group_id = self.ensure_security_group()
                        for launch in (base, kwargs):
                            if "NetworkInterfaces" in launch:
                                launch["NetworkInterfaces"] = [dict(launch["NetworkInterfaces"][0], Groups=[group_id])]
                            else:
                                launch["SecurityGroupIds"] = [group_id]
                        continue
                    if code in CAPACITY_ERROR_CODES:
                        failures.append(f"{instance_type}: {code}")
                        log.warning("AWS VM %s: no %s capacity (%s); trying the next type", vm_id, instance_type, code)
                        break
                    raise ProviderError(f"AWS VM {vm_id}: run_instances ({instance_type}) failed: {exc}") from exc
                # The same token after this VM was deleted gives back the terminated instance: relaunch.
                if instance["State"]["Name"] in ("shutting-down", "terminated") and attempt == 0:
                    continue
                log.info("AWS VM %s: launched %s (%s)", vm_id, instance["InstanceId"], instance_type)
                return instance
        raise CapacityError(
            f"AWS VM {vm_id}: no capacity in {self.settings.region} for any instance type ({'; '.join(failures)})"
        )

    def _ensure_elastic_ip(self, vm_id: str, instance_id: str) -> None:
        addresses = self.ec2.describe_addresses(Filters=self._vm_resource_filters(vm_id))["Addresses"]
        if addresses:
            address = addresses[0]
        else:
            address = self.ec2.allocate_address(
                Domain="vpc",
                TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": _tag_list(self._vm_tags(vm_id))}],
            )
        if address.get("InstanceId") != instance_id:
            self.ec2.associate_address(AllocationId=address["AllocationId"], InstanceId=instance_id)

    def _vm_resource_filters(self, vm_id: str) -> list[dict[str, Any]]:
        return [
            {"Name": f"tag:{TAG_RUN_ID}", "Values": [self.run_id]},
            {"Name": f"tag:{TAG_VM_ID}", "Values": [vm_id]},
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
        ]

    def _handle(self, vm_id: str, instance: dict[str, Any]) -> VMHandle:
        public_ip = instance.get("PublicIpAddress")
        private_ip = instance.get("PrivateIpAddress")
        host = private_ip if self.settings.use_private_ip or not public_ip else public_ip
        handle = VMHandle(
            vm_id=vm_id,
            base_url="",
            provider=self.name,
            devtools_url=f"http://{host}:{self.settings.devtools_port}" if host else None,
            details={
                "instance_id": instance["InstanceId"],
                "instance_type": instance.get("InstanceType"),
                "public_ip": public_ip,
                "private_ip": private_ip,
                "host": host,
                "spot": instance.get("InstanceLifecycle") == "spot",
                "spot_request_id": instance.get("SpotInstanceRequestId"),
                "region": self.settings.region,
            },
        )
        handle.base_url = self._waa_url_for(handle) if self._waa_url_for else f"http://{host}:{self.settings.waa_port}"
        return handle

    def _qmp_address(self, vm: VMHandle) -> tuple[str, int]:
        if self._qmp_address_for is not None:
            return self._qmp_address_for(vm)
        tunnel = self._tunnels.get(vm.vm_id) if self._tunnels is not None else None
        if self.settings.access == "tunnel" and tunnel is not None:
            return tunnel.address("qmp")
        return str(vm.details.get("host")), self.settings.qmp_port

    # -- SSH tunnel (access="tunnel") ----------------------------------------------------------

    def _attach_tunnel(self, vm: VMHandle, *, rekey: bool = False) -> None:
        """With access="tunnel": open (or revive) the VM's tunnel, waiting up to ready_timeout for
        its sshd, and point base_url / devtools_url at the local forwards. `rekey` forgets the
        pinned host key first: only after this provider replaced the root volume itself."""
        if self.settings.access != "tunnel":
            return
        s = self.settings
        if self._ssh_address_for is not None:
            host, port = self._ssh_address_for(vm)
        else:
            # The public IP when there is one, else the private one (use_private_ip forces it).
            host, port = vm.details.get("host"), s.ssh_port
        if not host:
            raise ProviderError(f"AWS VM {vm.vm_id}: no address to open its SSH tunnel to")
        extra: dict[str, Any] = {"config_file": s.ssh_config_file}
        if s.ssh_known_hosts_file:
            extra["known_hosts_file"] = s.ssh_known_hosts_file
        target = SSHTarget(host=str(host), port=int(port), user=s.ssh_user, identity_file=s.ssh_identity_file,
                           host_key_alias=f"waa-aws-{vm.details.get('instance_id') or vm.vm_id}", **extra)
        with self._lock:
            if self._tunnels is None:
                self._tunnels = TunnelManager(monitor_interval=s.tunnel_monitor_seconds)
            manager = self._tunnels
        tunnel = manager.open_when_ready(
            vm.vm_id, target, {"waa": s.waa_port, "qmp": s.qmp_port, "devtools": s.devtools_port},
            timeout=s.ready_timeout, poll_seconds=s.ready_poll_seconds, forget_host_key_first=rekey,
        )
        vm.base_url, vm.devtools_url = tunnel.url("waa"), tunnel.url("devtools")
        vm.details["ssh"] = target.describe()

    def _close_tunnel(self, vm: VMHandle, *, forget: bool) -> None:
        if self._tunnels is not None:
            self._tunnels.close(vm.vm_id, forget=forget)

    def close(self) -> None:
        """Close every SSH tunnel (access="tunnel"); safe to repeat."""
        if self._tunnels is not None:
            self._tunnels.close_all()

    def _wait_ready(self, vm: VMHandle, step: str) -> None:
        from adapters.waa.client import WAAClient
        from adapters.waa.errors import WAAError

        client = WAAClient(vm.base_url)
        try:
            waited = client.wait_until_ready(self.settings.ready_timeout, poll_seconds=self.settings.ready_poll_seconds)
        except WAAError as exc:
            raise ProviderError(f"AWS VM {vm.vm_id} ({vm.details.get('instance_id')}): WAA server not ready "
                                f"after {step}: {exc}") from exc
        finally:
            client.close()
        vm.details["ready_seconds"] = waited

    def _take_baseline(self, vm: VMHandle) -> None:
        if not (self.settings.baseline_snapshot and _guest_reset_available()):
            return
        from adapters.vms import guest_reset

        try:
            guest_reset.take_baseline_snapshot(
                self._qmp_address(vm), vm.base_url, name=self.settings.baseline_snapshot_name,
                ready_deadline=self.settings.ready_timeout,
            )
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - any QMP / WAA failure is an infrastructure error
            raise ProviderError(f"AWS VM {vm.vm_id}: baseline snapshot failed: {exc}") from exc
        vm.details["baseline_snapshot"] = self.settings.baseline_snapshot_name

    def _cleanup_failed(self, vm: VMHandle) -> None:
        try:
            self.delete(vm)
        except ProviderError as exc:
            log.error("AWS VM %s: could not delete after a failed create: %s", vm.vm_id, exc)

    def _not_running_error(self, vm_id: str, instance_id: str, step: str) -> ProviderError:
        """A ProviderError describing why an instance is not running (interruption, AWS termination)."""
        instance = self._describe_instance(instance_id)
        if instance is None:
            return ProviderError(f"AWS VM {vm_id} ({instance_id}) is gone ({step})")
        state = instance["State"]["Name"]
        reason = instance.get("StateReason", {}) or {}
        reason_text = f"{reason.get('Code', '')} {reason.get('Message', '')}".strip() or instance.get(
            "StateTransitionReason", "")
        spot = " (spot instance interrupted)" if instance.get("InstanceLifecycle") == "spot" else ""
        message = f"AWS VM {vm_id} ({instance_id}) is {state}{spot} ({step}): {reason_text or 'no reason given'}"
        if "InsufficientInstanceCapacity" in reason_text:
            return CapacityError(message)
        return ProviderError(message)

    # -- health -------------------------------------------------------------------------------

    def check_running(self, vm: VMHandle, step: str = "check") -> None:
        """Raise ProviderError (and mark the VM unhealthy) when AWS stopped, terminated or is
        about to interrupt the instance; the pipeline counts that as an infrastructure error."""
        instance_id = vm.details.get("instance_id")
        try:
            instance = self._describe_instance(instance_id) if instance_id else None
            if instance is None or instance["State"]["Name"] != "running":
                vm.healthy = False
                raise self._not_running_error(vm.vm_id, str(instance_id), step)
            request_id = instance.get("SpotInstanceRequestId")
            if request_id:
                requests = self.ec2.describe_spot_instance_requests(SpotInstanceRequestIds=[request_id])
                for request in requests.get("SpotInstanceRequests", []):
                    code = (request.get("Status") or {}).get("Code", "")
                    if code in SPOT_INTERRUPTION_CODES:
                        vm.healthy = False
                        raise ProviderError(
                            f"AWS VM {vm.vm_id} ({instance_id}): spot instance interrupted ({code}) ({step})"
                        )
        except ProviderError:
            raise
        except _aws_errors() as exc:
            raise ProviderError(f"AWS VM {vm.vm_id}: cannot read the instance state ({step}): {exc}") from exc

    # -- reset --------------------------------------------------------------------------------

    def reset(self, vm: VMHandle, level: ResetLevel) -> ResetTiming:  # type: ignore[override]
        level = ResetLevel(level)
        if level not in self.supported_reset_levels():
            raise ProviderError(f"reset level {level.value!r} is not available for the AWS provider here "
                                f"(supported: {', '.join(sorted(x.value for x in self.supported_reset_levels()))})")
        started = time.monotonic()
        self.check_running(vm, f"before {level.value} reset")
        if level is ResetLevel.SNAPSHOT:
            self._guest_reset(vm, "snapshot")
        elif level is ResetLevel.REBOOT:
            self._guest_reset(vm, "reboot")
        elif level is ResetLevel.DISK:
            self._disk_reset(vm)
        timing = ResetTiming(vm_id=vm.vm_id, level=level, seconds=time.monotonic() - started)
        vm.details["last_reset_level"] = level.value
        vm.details["last_reset_seconds"] = timing.seconds
        with self._lock:
            self.reset_timings.append(timing)
        return timing

    def _guest_reset(self, vm: VMHandle, kind: str) -> None:
        from adapters.vms import guest_reset

        qmp = self._qmp_address(vm)
        try:
            if kind == "snapshot":
                guest_reset.snapshot_reset(qmp, vm.base_url, self.settings.baseline_snapshot_name,
                                           self.settings.ready_timeout)
            else:
                guest_reset.reboot_reset(qmp, vm.base_url, self.settings.ready_timeout)
        except Exception as exc:  # noqa: BLE001 - any QMP / WAA failure is an infrastructure error
            # The QMP monitor may be unreachable because AWS took the instance away: say so.
            self.check_running(vm, f"after a failed {kind} reset")
            if isinstance(exc, ProviderError):
                raise
            raise ProviderError(f"AWS VM {vm.vm_id}: {kind} reset failed: {exc}") from exc

    def _disk_reset(self, vm: VMHandle) -> None:
        """Replace the root volume from the AMI (or a snapshot), then wait for WAA again."""
        from botocore.exceptions import WaiterError

        instance_id = str(vm.details["instance_id"])
        tags = self._vm_tags(vm.vm_id)
        kwargs: dict[str, Any] = {
            "InstanceId": instance_id,
            "DeleteReplacedRootVolume": True,
            "ClientToken": str(uuid.uuid4()),
            "TagSpecifications": [{"ResourceType": "replace-root-volume-task", "Tags": _tag_list(tags)}],
        }
        if self.settings.disk_reset_snapshot_id:
            kwargs["SnapshotId"] = self.settings.disk_reset_snapshot_id
        else:
            kwargs["ImageId"] = self.settings.ami_id
        try:
            task = self.ec2.create_replace_root_volume_task(**kwargs)["ReplaceRootVolumeTask"]
            task_id = task["ReplaceRootVolumeTaskId"]
            deadline = time.monotonic() + self.settings.disk_reset_timeout
            state = task.get("TaskState", "pending")
            while state != "succeeded":
                if state in ("failing", "failed", "failed-detached"):
                    raise ProviderError(f"AWS VM {vm.vm_id} ({instance_id}): root volume replacement {task_id} "
                                        f"ended {state}")
                if time.monotonic() >= deadline:
                    raise ProviderError(f"AWS VM {vm.vm_id} ({instance_id}): root volume replacement {task_id} "
                                        f"still {state} after {self.settings.disk_reset_timeout:g} s")
                time.sleep(self.settings.disk_reset_poll_seconds)
                tasks = self.ec2.describe_replace_root_volume_tasks(ReplaceRootVolumeTaskIds=[task_id])
                found = tasks.get("ReplaceRootVolumeTasks", [])
                state = found[0].get("TaskState", "pending") if found else "pending"
            vm.details["replace_root_volume_task_id"] = task_id
            try:
                self._waiter("instance_running", InstanceIds=[instance_id])
            except WaiterError as exc:
                raise self._not_running_error(vm.vm_id, instance_id, "after the root volume replacement") from exc
            # The new root volume carries no tags of ours: tag it so the janitor sees it.
            instance = self._describe_instance(instance_id) or {}
            root = instance.get("RootDeviceName")
            for mapping in instance.get("BlockDeviceMappings", []):
                if mapping.get("DeviceName") == root and "Ebs" in mapping:
                    volume_id = mapping["Ebs"]["VolumeId"]
                    self.ec2.create_tags(Resources=[volume_id], Tags=_tag_list(tags))
                    vm.details["root_volume_id"] = volume_id
        except ProviderError:
            vm.healthy = False
            raise
        except _aws_errors() as exc:
            vm.healthy = False
            raise ProviderError(f"AWS VM {vm.vm_id} ({instance_id}): root volume replacement failed: {exc}") from exc
        # The new root volume may bring new SSH host keys (cloud-init): re-pin them.
        self._attach_tunnel(vm, rekey=True)
        self._wait_ready(vm, "the root volume replacement")
        # The QEMU snapshot lived on the replaced disk: save a new baseline.
        self._take_baseline(vm)

    # -- stop / delete ----------------------------------------------------------------------------

    def stop(self, vm: VMHandle) -> None:
        instance_id = vm.details.get("instance_id")
        if vm.details.get("spot"):
            raise ProviderError(f"AWS VM {vm.vm_id} ({instance_id}) is a one-time spot instance and cannot be "
                                "stopped; delete it instead")
        self._close_tunnel(vm, forget=False)  # a stopped VM's tunnel could only fail
        try:
            self.ec2.stop_instances(InstanceIds=[instance_id])
            self._waiter("instance_stopped", InstanceIds=[instance_id])
        except _aws_errors() as exc:
            raise ProviderError(f"AWS VM {vm.vm_id} ({instance_id}): stop failed: {exc}") from exc

    def delete(self, vm: VMHandle) -> None:
        """Terminate the VM's instance(s), release its Elastic IP, delete leftover volumes, and
        the run's security group once no instance of the run remains. A gone VM is no error."""
        # Its successor will have other host keys: forget this one's pin too.
        self._close_tunnel(vm, forget=True)
        try:
            ids = {i["InstanceId"] for i in self._find_instances(vm.vm_id, LIVE_STATES)}
            if vm.details.get("instance_id"):
                instance = self._describe_instance(str(vm.details["instance_id"]))
                if instance is not None and instance["State"]["Name"] != "terminated":
                    ids.add(instance["InstanceId"])
            for address in self.ec2.describe_addresses(Filters=self._vm_resource_filters(vm.vm_id))["Addresses"]:
                self._release_address(address)
            if ids:
                self.ec2.terminate_instances(InstanceIds=sorted(ids))
                self._waiter("instance_terminated", InstanceIds=sorted(ids))
            for volume in self._paginate_volumes(self._vm_resource_filters(vm.vm_id)):
                if volume["State"] == "available":
                    self._delete_volume(volume["VolumeId"])
            self._delete_security_group_if_unused()
        except _aws_errors() as exc:
            raise ProviderError(f"AWS VM {vm.vm_id}: delete failed: {exc}") from exc

    def _release_address(self, address: dict[str, Any]) -> None:
        from botocore.exceptions import ClientError

        if address.get("AssociationId"):
            try:
                self.ec2.disassociate_address(AssociationId=address["AssociationId"])
            except ClientError as exc:
                if _error_code(exc) != "InvalidAssociationID.NotFound":
                    raise
        try:
            self.ec2.release_address(AllocationId=address["AllocationId"])
        except ClientError as exc:
            if _error_code(exc) not in ("InvalidAllocationID.NotFound",):
                raise

    def _delete_volume(self, volume_id: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.ec2.delete_volume(VolumeId=volume_id)
        except ClientError as exc:
            if _error_code(exc) != "InvalidVolume.NotFound":
                raise

    def _paginate_volumes(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        volumes = []
        for page in self.ec2.get_paginator("describe_volumes").paginate(Filters=filters):
            volumes.extend(page["Volumes"])
        return volumes

    # -- janitor ------------------------------------------------------------------------------

    def list_owned(self) -> list[OwnedResource]:
        """Every live instance, volume, Elastic IP and security group with the managed tag (any run),
        instances first, then Elastic IPs, volumes and security groups: deleting in this order works."""
        managed = [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]
        owned: list[OwnedResource] = []
        try:
            for page in self.ec2.get_paginator("describe_instances").paginate(
                Filters=managed + [{"Name": "instance-state-name", "Values": LIVE_STATES}]
            ):
                for reservation in page["Reservations"]:
                    for instance in reservation["Instances"]:
                        owned.append(self._owned(KIND_INSTANCE, instance["InstanceId"], instance.get("Tags")))
            for address in self.ec2.describe_addresses(Filters=managed)["Addresses"]:
                owned.append(self._owned(KIND_ELASTIC_IP, address["AllocationId"], address.get("Tags")))
            for volume in self._paginate_volumes(managed):
                if volume["State"] not in ("deleting", "deleted"):
                    owned.append(self._owned(KIND_VOLUME, volume["VolumeId"], volume.get("Tags")))
            for page in self.ec2.get_paginator("describe_security_groups").paginate(Filters=managed):
                for group in page["SecurityGroups"]:
                    owned.append(self._owned(KIND_SECURITY_GROUP, group["GroupId"], group.get("Tags")))
        except _aws_errors() as exc:
            raise ProviderError(f"AWS: listing owned resources in {self.settings.region} failed: {exc}") from exc
        return owned

    def _owned(self, kind: str, resource_id: str, tags: list[dict[str, str]] | None) -> OwnedResource:
        return OwnedResource(provider=self.name, kind=kind, resource_id=resource_id, tags=_tag_dict(tags))

    def _current_tags(self, resource: OwnedResource) -> dict[str, str] | None:
        """The resource's tags as AWS has them now, or None when it no longer exists."""
        from botocore.exceptions import ClientError

        rid = resource.resource_id
        try:
            if resource.kind == KIND_INSTANCE:
                instance = self._describe_instance(rid)
                if instance is None or instance["State"]["Name"] == "terminated":
                    return None
                return _tag_dict(instance.get("Tags"))
            if resource.kind == KIND_VOLUME:
                volumes = self.ec2.describe_volumes(VolumeIds=[rid])["Volumes"]
                return _tag_dict(volumes[0].get("Tags")) if volumes else None
            if resource.kind == KIND_SECURITY_GROUP:
                groups = self.ec2.describe_security_groups(GroupIds=[rid])["SecurityGroups"]
                return _tag_dict(groups[0].get("Tags")) if groups else None
            if resource.kind == KIND_ELASTIC_IP:
                addresses = self.ec2.describe_addresses(AllocationIds=[rid])["Addresses"]
                return _tag_dict(addresses[0].get("Tags")) if addresses else None
        except ClientError as exc:
            if _error_code(exc).endswith(".NotFound") or _error_code(exc).endswith(".Malformed"):
                return None
            raise
        raise ProviderError(f"AWS: unknown resource kind {resource.kind!r} (known: {', '.join(KINDS)})")

    def delete_resource(self, resource: OwnedResource) -> None:
        """Delete exactly one resource carrying the managed tag (checked against AWS, not only
        against `resource.tags`); an instance is terminated and waited for. Gone is no error."""
        if resource.provider != self.name:
            raise ProviderError(
                f"AWS: {resource.kind} {resource.resource_id} belongs to provider {resource.provider!r}"
            )
        if resource.kind not in KINDS:
            raise ProviderError(f"AWS: unknown resource kind {resource.kind!r} (known: {', '.join(KINDS)})")
        rid = resource.resource_id
        try:
            tags = self._current_tags(resource)
            if tags is None:
                return
            if tags.get(TAG_MANAGED) != "true":
                raise ProviderError(f"AWS: refusing to delete {resource.kind} {rid}: it does not carry the "
                                    f"{TAG_MANAGED}=true tag, so this product did not create it")
            if resource.kind == KIND_INSTANCE:
                self.ec2.terminate_instances(InstanceIds=[rid])
                self._waiter("instance_terminated", InstanceIds=[rid])
            elif resource.kind == KIND_ELASTIC_IP:
                addresses = self.ec2.describe_addresses(AllocationIds=[rid])["Addresses"]
                for address in addresses:
                    self._release_address(address)
            elif resource.kind == KIND_VOLUME:
                self._delete_volume(rid)
            elif resource.kind == KIND_SECURITY_GROUP:
                self._delete_security_group(rid)
        except ProviderError:
            raise
        except _aws_errors() as exc:
            raise ProviderError(f"AWS: deleting {resource.kind} {rid} failed: {exc}") from exc

    # -- warm pools -------------------------------------------------------------------------

    def list_vms(self) -> list[VMState]:
        """This run's (or warm pool's) instances with their state, size and attached disk size."""
        try:
            instances = self._find_instances(None, LIVE_STATES)
            disk_gb: dict[str, int] = {}
            run_volumes = [{"Name": f"tag:{TAG_RUN_ID}", "Values": [self.run_id]}]
            for volume in self._paginate_volumes(run_volumes):
                for attachment in volume.get("Attachments", []):
                    key = attachment.get("InstanceId", "")
                    disk_gb[key] = disk_gb.get(key, 0) + int(volume.get("Size") or 0)
        except _aws_errors() as exc:
            raise ProviderError(f"AWS: listing the VMs of {self.run_id} failed: {exc}") from exc
        states = []
        for instance in instances:
            tags = _tag_dict(instance.get("Tags"))
            state = instance["State"]["Name"]
            states.append(VMState(
                vm_id=tags.get(TAG_VM_ID, instance["InstanceId"]),
                cloud_id=instance["InstanceId"],
                state=state,
                size=instance.get("InstanceType"),
                billing=Billing.DISKS if state == "stopped" else
                Billing.NONE if state == "shutting-down" else Billing.COMPUTE,
                disk_gb=disk_gb.get(instance["InstanceId"]),
                expires_at=ResourceTags.expiry_of(tags),
                address=instance.get("PrivateIpAddress") if self.settings.use_private_ip
                else instance.get("PublicIpAddress") or instance.get("PrivateIpAddress"),
            ))
        return sorted(states, key=lambda s: s.vm_id)

    def renew_expiry(self, vm_id: str) -> dt.datetime:
        """Re-tag the VM's instance(s), volumes and Elastic IP, and the run's security group."""
        tags = self.tags()
        expiry = [{"Key": TAG_EXPIRES_AT, "Value": tags.as_dict()[TAG_EXPIRES_AT]}]
        try:
            resources = [i["InstanceId"] for i in self._find_instances(vm_id, LIVE_STATES)]
            resources += [v["VolumeId"] for v in self._paginate_volumes(self._vm_resource_filters(vm_id))]
            addresses = self.ec2.describe_addresses(Filters=self._vm_resource_filters(vm_id))["Addresses"]
            resources += [a["AllocationId"] for a in addresses]
            groups = self.ec2.describe_security_groups(Filters=self._security_group_filters())["SecurityGroups"]
            resources += [g["GroupId"] for g in groups]
            if resources:
                self.ec2.create_tags(Resources=resources, Tags=expiry)
        except _aws_errors() as exc:
            raise ProviderError(f"AWS VM {vm_id}: renewing its expiry tag failed: {exc}") from exc
        return tags.expires_at
