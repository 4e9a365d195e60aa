"""The AWS image builder: an EC2 builder instance prepares WAA, then becomes an AMI.

What it creates, all found again by tags (moto and AWS alike; the ClientToken is passed too):

    instance  waa-arena-image-<name>   the builder (Ubuntu + the cloud-init of cloud_init.py),
                                       nested virtualization on, root volume spec.disk_gb gp3;
                                       ownership tags with the build's run id `image-<name>`
    group     waa-arena-image-<name>   ingress 22 and the WAA port from controller_cidr only
    AMI       waa-arena-<name>         from the builder (a clean reboot, so the container stops
                                       and Windows shuts down first); the AMI and its snapshots
                                       carry the provenance tags

Verification boots one instance from the AMI with the product's own AWSProvider (run id
`image-<name>-verify`), probes its WAA server, and deletes it. Cleanup deletes everything tagged
with the build's run ids through the janitor's `sweep_run`, which checks each resource's tags.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any

from adapters.images.cloud_init import render_user_data
from adapters.images.plan import Resolver, builder_tags, plan_container, provenance_from_builder
from adapters.images.provenance import (
    ROLE_BUILDER,
    ROLE_IMAGE,
    TAG_BUILD,
    TAG_READY,
    TAG_ROLE,
    TAG_VERIFIED,
    TAG_VERIFIED_AT,
    provenance_tags,
)
from adapters.images.container_registry import resolve_digest
from adapters.images.spec import UBUNTU_SSM_PARAMETER, BuildSpec
from adapters.images.stages import BuildError, BuildStatus, ImageBuilder
from adapters.images.verify import boot_and_probe
from adapters.vms.aws import (
    LIVE_STATES,
    NESTED_VIRTUALIZATION_FAMILIES,
    AWSProvider,
    AWSSettings,
    _aws_errors,
    _error_code,
    _tag_dict,
    _tag_list,
)
from adapters.vms.base import TAG_MANAGED, TAG_RUN_ID, ProviderError, VMHandle
from adapters.vms.janitor import sweep_run

log = logging.getLogger(__name__)

UrlFor = Callable[[VMHandle], str]


class AWSImageBuilder(ImageBuilder):
    """One build's stages on EC2 (see the module docstring)."""

    provider_name = "aws"

    def __init__(
        self,
        spec: BuildSpec,
        settings: AWSSettings,
        *,
        session: Any | None = None,
        waa_url_for: UrlFor | None = None,
        verify_waa_url_for: UrlFor | None = None,
        resolver: Resolver = resolve_digest,
        warn: Callable[[str], None] = log.warning,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    ) -> None:
        self._init_common(spec, waa_url_for, verify_waa_url_for, resolver, warn, clock)
        self.settings = settings
        # The product's provider for this build's run id: its client, tags, janitor listing and deletes.
        self._provider = AWSProvider(settings, spec.run_id, session=session, clock=clock)
        self.ec2 = self._provider.ec2

    # -- names and lookups ----------------------------------------------------------------------

    @property
    def image_name(self) -> str:
        return f"waa-arena-{self.spec.name}"

    @property
    def builder_name(self) -> str:
        return f"waa-arena-image-{self.spec.name}"

    def _build_filters(self, role: str) -> list[dict[str, Any]]:
        return [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                {"Name": f"tag:{TAG_BUILD}", "Values": [self.spec.name]},
                {"Name": f"tag:{TAG_ROLE}", "Values": [role]}]

    def _builders(self) -> list[dict[str, Any]]:
        found = []
        filters = self._build_filters(ROLE_BUILDER) + [{"Name": "instance-state-name", "Values": LIVE_STATES}]
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                found.extend(reservation["Instances"])
        return sorted(found, key=lambda i: str(i.get("LaunchTime") or ""))

    def _image(self) -> dict[str, Any] | None:
        images = self.ec2.describe_images(Owners=["self"], Filters=self._build_filters(ROLE_IMAGE))["Images"]
        images = [i for i in images if i.get("State") != "deregistered"]
        return sorted(images, key=lambda i: str(i.get("CreationDate") or ""))[0] if images else None

    def _cloud(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (ProviderError, BuildError):
            raise
        except _aws_errors() as exc:
            raise BuildError(f"AWS image build {self.spec.name}: {what} failed: {exc}", transient=True) from exc

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> BuildStatus:
        def read() -> BuildStatus:
            builders = self._builders()
            image = self._image()
            owned = self._provider.list_owned()
            tags = _tag_dict(image.get("Tags")) if image else {}
            return BuildStatus(
                name=self.spec.name, provider="aws",
                builder_id=builders[0]["InstanceId"] if builders else None,
                builder_ready=any(_tag_dict(b.get("Tags")).get(TAG_READY) == "true" for b in builders),
                builder_tags=_tag_dict(builders[0].get("Tags")) if builders else {},
                builder_resources=[f"{r.kind} {r.resource_id}" for r in owned
                                   if r.tags.get(TAG_RUN_ID) == self.spec.run_id],
                verify_resources=[f"{r.kind} {r.resource_id}" for r in owned
                                  if r.tags.get(TAG_RUN_ID) == self.spec.verify_run_id],
                image_id=image["ImageId"] if image else None,
                image_state=image.get("State") if image else None,
                image_available=bool(image and image.get("State") == "available"),
                verified=tags.get(TAG_VERIFIED) == "true",
                tags=tags,
            )

        return self._cloud("reading its state", read)

    # -- stage 1: builder --------------------------------------------------------------------------

    def _base_image(self) -> str:
        if self.spec.base_image:
            return self.spec.base_image
        ssm = self._provider.session.client("ssm", region_name=self.settings.region,
                                            endpoint_url=self.settings.endpoint_url)
        try:
            return str(ssm.get_parameter(Name=UBUNTU_SSM_PARAMETER)["Parameter"]["Value"])
        except _aws_errors() as exc:
            raise BuildError(f"AWS image build {self.spec.name}: looking up Ubuntu 24.04's AMI "
                             f"({UBUNTU_SSM_PARAMETER}) failed: {exc}; pass --base-image ami-...") from exc

    def _security_group(self) -> str:
        from botocore.exceptions import ClientError

        filters = [{"Name": "group-name", "Values": [self.builder_name]},
                   {"Name": f"tag:{TAG_RUN_ID}", "Values": [self.spec.run_id]}]
        groups = self.ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
        if groups:
            # A run killed between creating the group and opening it left it closed: open it.
            self._authorize(str(groups[0]["GroupId"]))
            return str(groups[0]["GroupId"])
        tags = {**self._provider.tags().as_dict(), TAG_BUILD: self.spec.name, "Name": self.builder_name}
        kwargs: dict[str, Any] = {
            "GroupName": self.builder_name,
            "Description": f"WAA arena image build {self.spec.name}: controller access only",
            "TagSpecifications": [{"ResourceType": "security-group", "Tags": _tag_list(tags)}],
        }
        if self.settings.vpc_id:
            kwargs["VpcId"] = self.settings.vpc_id
        try:
            group_id = self.ec2.create_security_group(**kwargs)["GroupId"]
        except ClientError as exc:
            if _error_code(exc) == "InvalidGroup.Duplicate":
                raise BuildError(f"a security group named {self.builder_name} exists without this build's tags; "
                                 "delete it or choose another build name") from exc
            raise
        self._authorize(str(group_id))
        return str(group_id)

    def _authorize(self, group_id: str) -> None:
        """Open SSH and the WAA port to controller_cidr only (rules already there are kept)."""
        from botocore.exceptions import ClientError

        network = ipaddress.ip_network(self.settings.controller_cidr)
        key, cidr_key = ("IpRanges", "CidrIp") if network.version == 4 else ("Ipv6Ranges", "CidrIpv6")
        for port in sorted({self.settings.ssh_port, self.settings.waa_port}):
            rule: dict[str, Any] = {"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                                    key: [{cidr_key: str(network), "Description": "WAA arena controller"}]}
            try:
                self.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
            except ClientError as exc:
                if _error_code(exc) != "InvalidPermission.Duplicate":
                    raise

    def ensure_builder(self) -> str:
        def ensure() -> str:
            existing = self._builders()
            if existing:
                instance = existing[0]
                if instance["State"]["Name"] in ("stopping", "stopped"):
                    self._provider._waiter("instance_stopped", InstanceIds=[instance["InstanceId"]])
                    self.ec2.start_instances(InstanceIds=[instance["InstanceId"]])
                return str(instance["InstanceId"])
            return self._launch()

        return self._cloud("creating the builder", ensure)

    def _launch(self) -> str:
        from botocore.exceptions import ClientError

        base_image = self._base_image()
        try:
            images = self.ec2.describe_images(ImageIds=[base_image])["Images"]
        except ClientError as exc:
            if not _error_code(exc).startswith("InvalidAMIID"):
                raise
            images = []
        if not images:
            raise BuildError(f"AWS image build {self.spec.name}: base AMI {base_image} not found in "
                             f"{self.settings.region}")
        plan, record = plan_container(self.spec, self._resolver, self._warn)
        group_id = self._security_group()
        tags = {**self._provider.tags().as_dict(), **builder_tags(self.spec, record, base_image),
                "Name": self.builder_name}
        root = images[0].get("RootDeviceName") or "/dev/sda1"
        kwargs: dict[str, Any] = {
            "ImageId": base_image,
            "InstanceType": self.spec.size,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": render_user_data(self.spec, plan),
            "BlockDeviceMappings": [{"DeviceName": root, "Ebs": {"VolumeSize": self.spec.disk_gb,
                                                                  "VolumeType": "gp3", "DeleteOnTermination": True}}],
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tag_list(tags)},
                                  {"ResourceType": "volume", "Tags": _tag_list(tags)}],
            "MetadataOptions": {"HttpTokens": "required"},
            "ClientToken": "waa-img-" + hashlib.sha256(self.spec.name.encode()).hexdigest()[:48],
        }
        if self.spec.size.split(".")[0] in NESTED_VIRTUALIZATION_FAMILIES:
            kwargs["CpuOptions"] = {"NestedVirtualization": "enabled"}
        if self.settings.subnet_id:
            kwargs["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": self.settings.subnet_id,
                                            "Groups": [group_id],
                                            "AssociatePublicIpAddress": not self.settings.use_private_ip}]
        else:
            kwargs["SecurityGroupIds"] = [group_id]
        if self.settings.key_name:
            kwargs["KeyName"] = self.settings.key_name
        instance = self.ec2.run_instances(**kwargs)["Instances"][0]
        log.info("image build %s: launched builder %s (%s)", self.spec.name, instance["InstanceId"], self.spec.size)
        return str(instance["InstanceId"])

    # -- stage 2: ready ------------------------------------------------------------------------------

    def _builder_handle(self, instance: dict[str, Any]) -> VMHandle:
        public_ip, private_ip = instance.get("PublicIpAddress"), instance.get("PrivateIpAddress")
        host = private_ip if self.settings.use_private_ip or not public_ip else public_ip
        handle = VMHandle(vm_id=self.builder_name, base_url=f"http://{host}:{self.settings.waa_port}",
                          provider="aws", details={"instance_id": instance["InstanceId"], "host": host,
                                                   "role": ROLE_BUILDER})
        if self._waa_url_for is not None:
            handle.base_url = self._waa_url_for(handle).rstrip("/")
        return handle

    def wait_builder_ready(self) -> float:
        from adapters.waa.client import WAAClient

        builders = self._cloud("finding the builder", self._builders)
        if not builders:
            raise BuildError(f"AWS image build {self.spec.name}: no builder instance (stage 1 not done)")
        instance_id = builders[0]["InstanceId"]
        self._cloud("waiting for the builder to run",
                    lambda: self._provider._waiter("instance_running", InstanceIds=[instance_id]))
        instance = self._cloud("reading the builder", lambda: self._provider._describe_instance(instance_id))
        handle = self._builder_handle(instance or builders[0])
        started = time.monotonic()
        client = WAAClient(handle.base_url)
        try:
            while not client.probe():
                waited = time.monotonic() - started
                if waited >= self.spec.ready_timeout:
                    raise BuildError(f"AWS image build {self.spec.name}: the builder's WAA server ({handle.base_url}) "
                                     f"did not answer /probe within {self.spec.ready_timeout:g} s")
                current = self._cloud("reading the builder", lambda: self._provider._describe_instance(instance_id))
                if current is None or current["State"]["Name"] not in ("pending", "running"):
                    state = current["State"]["Name"] if current else "gone"
                    raise BuildError(f"AWS image build {self.spec.name}: the builder {instance_id} is {state}")
                time.sleep(min(self.spec.ready_poll_seconds, max(0.0, self.spec.ready_timeout - waited)))
        finally:
            client.close()
        self._cloud("tagging the builder ready", lambda: self.ec2.create_tags(
            Resources=[instance_id], Tags=[{"Key": TAG_READY, "Value": "true"}]))
        return time.monotonic() - started

    # -- stage 3: capture ------------------------------------------------------------------------------

    def capture(self) -> str:
        return self._cloud("capturing the image", self._capture)

    def _capture(self) -> str:
        from botocore.exceptions import ClientError, WaiterError

        image = self._image()
        if image is not None and image.get("State") in ("failed", "error", "invalid"):
            log.warning("image build %s: image %s is %s; capturing again", self.spec.name, image["ImageId"],
                        image["State"])
            self._deregister(image)
            image = None
        if image is None:
            builders = self._builders()
            if not builders:
                raise BuildError(f"AWS image build {self.spec.name}: no image and no builder to capture from; "
                                 "rerun the build (it starts a new builder)")
            builder = builders[0]
            builder_tags_now = _tag_dict(builder.get("Tags"))
            if builder_tags_now.get(TAG_READY) != "true":
                raise BuildError(f"AWS image build {self.spec.name}: the builder is not ready (stage 2 not done)")
            tags = provenance_tags(
                self.spec, provenance_from_builder(builder_tags_now), owner=self.settings.owner,
                region=self.settings.region, base_image=builder.get("ImageId", ""), built_at=self._clock())
            try:
                image_id = self.ec2.create_image(
                    InstanceId=builder["InstanceId"], Name=self.image_name, NoReboot=False,
                    Description=f"WAA arena host image, build {self.spec.name}",
                    # The snapshots are tagged from the image once it is available (_tag_snapshots,
                    # repeated by every rerun): moto cannot take snapshot TagSpecifications here.
                    TagSpecifications=[{"ResourceType": "image", "Tags": _tag_list(tags)}],
                )["ImageId"]
            except ClientError as exc:
                if _error_code(exc) != "InvalidAMIName.Duplicate":
                    raise
                # Created by a run killed before it could record anything else: adopt it by name.
                same = self.ec2.describe_images(Owners=["self"], Filters=[
                    {"Name": "name", "Values": [self.image_name]}])["Images"]
                if not same:
                    raise
                image_id = same[0]["ImageId"]
                self.ec2.create_tags(Resources=[image_id], Tags=_tag_list(tags))
            log.info("image build %s: capturing %s", self.spec.name, image_id)
        else:
            image_id = image["ImageId"]
        delay = min(self.spec.capture_poll_seconds, self.settings.waiter_delay)
        try:
            self.ec2.get_waiter("image_available").wait(
                ImageIds=[image_id], WaiterConfig={"Delay": delay,
                                                   "MaxAttempts": max(1, int(self.spec.capture_timeout / delay))})
        except WaiterError as exc:
            raise BuildError(f"AWS image build {self.spec.name}: image {image_id} not available within "
                             f"{self.spec.capture_timeout:g} s: {exc}") from exc
        self._tag_snapshots(image_id, {})
        return str(image_id)

    def _snapshot_ids(self, image_id: str) -> list[str]:
        images = self.ec2.describe_images(ImageIds=[image_id])["Images"]
        ids = []
        for mapping in (images[0].get("BlockDeviceMappings", []) if images else []):
            if "Ebs" in mapping and mapping["Ebs"].get("SnapshotId"):
                ids.append(mapping["Ebs"]["SnapshotId"])
        return ids

    def _tag_snapshots(self, image_id: str, extra: dict[str, str]) -> None:
        """Make sure the AMI's snapshots carry the image's tags (plus `extra`)."""
        image = self.ec2.describe_images(ImageIds=[image_id])["Images"][0]
        tags = {**_tag_dict(image.get("Tags")), **extra}
        snapshots = self._snapshot_ids(image_id)
        if snapshots:
            self.ec2.create_tags(Resources=snapshots, Tags=_tag_list(tags))

    def _deregister(self, image: dict[str, Any]) -> None:
        snapshots = self._snapshot_ids(image["ImageId"])
        self.ec2.deregister_image(ImageId=image["ImageId"])
        for snapshot in snapshots:
            self.ec2.delete_snapshot(SnapshotId=snapshot)

    # -- stage 4: verify --------------------------------------------------------------------------------

    def verify_provider(self, image_id: str) -> AWSProvider:
        """The product's AWS provider as a run would use it, booting from the new image."""
        settings = self.settings.model_copy(update={
            "ami_id": image_id, "baseline_snapshot": False, "user_data": None, "elastic_ip": False,
            "instance_types": [self.spec.size], "ready_timeout": self.spec.verify_timeout,
            "root_volume_gb": None, "delete_on_failed_create": True,
        })
        return AWSProvider(settings, self.spec.verify_run_id, session=self._provider.session, clock=self._clock,
                           waa_url_for=self._verify_waa_url_for)

    def verify(self) -> str:
        image = self._cloud("finding the image", self._image)
        if not image or image.get("State") != "available":
            raise BuildError(f"AWS image build {self.spec.name}: no available image to verify (stage 3 not done)")
        image_id = str(image["ImageId"])
        provider = self.verify_provider(image_id)
        summary = boot_and_probe(provider, self.spec.verify_run_id, self.spec.name, image_id)
        stamp = self._clock().astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        marks = {TAG_VERIFIED: "true", TAG_VERIFIED_AT: stamp}
        self._cloud("tagging the image verified", lambda: (
            self.ec2.create_tags(Resources=[image_id], Tags=_tag_list(marks)),
            self._tag_snapshots(image_id, marks)))
        return summary

    # -- stage 5: cleanup ----------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        deleted: list[str] = []
        for run_id in (self.spec.run_id, self.spec.verify_run_id):
            report = sweep_run(self._provider, run_id)
            if report.failed:
                problems = "; ".join(f"{r.kind} {r.resource_id}: {e}" for r, e in report.failed)
                raise BuildError(f"AWS image build {self.spec.name}: cleanup left resources: {problems}")
            deleted += [f"{r.kind} {r.resource_id}" for r in report.deleted]
        return deleted

    def close(self) -> None:
        self._provider.close()
