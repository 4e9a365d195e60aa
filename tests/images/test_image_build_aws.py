"""The image build on AWS against moto in server mode: a full build, a kill after every stage,
a rerun of a finished build, and what the cloud holds afterwards."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from adapters.images.aws import AWSImageBuilder
from adapters.images.provenance import (
    TAG_BUILD,
    TAG_BUILDER_REGION,
    TAG_BUILDER_SIZE,
    TAG_BUILT_AT,
    TAG_CONTAINER,
    TAG_CONTAINER_DIGEST,
    TAG_VERIFIED,
    TAG_WINDOWS_SOURCE,
    TAG_WINDOWS_SOURCE_URL,
)
from adapters.images.spec import BuildSpec
from adapters.images.stages import STAGES, Stage, run_build
from adapters.vms.aws import AWSSettings
from adapters.vms.base import TAG_EXPIRES_AT, TAG_MANAGED

BASE_AMI = "ami-1e749f67"  # one of moto's built-in images
ISO = "https://storage.example.com/isos/win11.iso?sv=2024&sig=SECRET%3D"


class Killed(Exception):
    """Raised from a stage hook: the build process 'dies' right after that stage."""


def spec_for(registry, **overrides: object) -> BuildSpec:
    values: dict[str, object] = dict(
        provider="aws", name="waa-host-1", container_image=f"{registry.host}/windowsarena/winarena:latest",
        windows_iso_url=ISO, base_image=BASE_AMI, ready_timeout=10, ready_poll_seconds=0.05,
        capture_timeout=10, capture_poll_seconds=0.05, verify_timeout=10,
    )
    values.update(overrides)
    return BuildSpec(**values)


def settings_for(moto) -> AWSSettings:
    return AWSSettings(
        region="us-east-1", ami_id="ami-00000000", controller_cidr="203.0.113.7/32", owner="ci@example.com",
        endpoint_url=moto.url, ready_timeout=10, ready_poll_seconds=0.05, waiter_delay=0.05,
        waiter_max_attempts=40, security_group_delete_timeout=0, baseline_snapshot=False,
    )


@pytest.fixture()
def make_builder(aws_env, waa_sim, registry) -> Callable[..., AWSImageBuilder]:
    registry.push("windowsarena/winarena", "latest")
    made: list[AWSImageBuilder] = []

    def make(**overrides: object) -> AWSImageBuilder:
        builder = AWSImageBuilder(spec_for(registry, **overrides), settings_for(aws_env),
                                  waa_url_for=lambda vm: waa_sim.base_url)
        made.append(builder)
        return builder

    yield make
    for builder in made:
        builder.close()


def _all_instances(ec2) -> list[dict]:
    return [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]


def _images(ec2) -> list[dict]:
    return ec2.describe_images(Owners=["self"])["Images"]


def test_full_build_leaves_one_verified_image_with_provenance_and_no_builder(make_builder, registry) -> None:
    builder = make_builder()
    launched: list[dict] = []
    ingress: list[dict] = []
    builder.ec2.meta.events.register("provide-client-params.ec2.RunInstances",
                                     lambda params, **_: launched.append(dict(params)))
    builder.ec2.meta.events.register("provide-client-params.ec2.AuthorizeSecurityGroupIngress",
                                     lambda params, **_: ingress.append(dict(params)))
    lines: list[str] = []
    image_id = run_build(builder, log=lines.append)
    ec2 = builder.ec2
    # The builder: nested virtualization, the cloud-config, a big gp3 root, reachable from the controller only.
    assert len(launched) == 1
    assert launched[0]["CpuOptions"] == {"NestedVirtualization": "enabled"}
    assert launched[0]["UserData"].startswith("#cloud-config\n") and "SECRET" in launched[0]["UserData"]
    assert launched[0]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 256
    rules = [(r["FromPort"], [x["CidrIp"] for x in r["IpRanges"]]) for call in ingress for r in call["IpPermissions"]]
    assert rules == [(22, ["203.0.113.7/32"]), (5000, ["203.0.113.7/32"])]
    images = _images(ec2)
    assert [i["ImageId"] for i in images] == [image_id] and images[0]["State"] == "available"
    tags = {t["Key"]: t["Value"] for t in images[0]["Tags"]}
    digest = registry.manifests[("windowsarena/winarena", "latest")]
    assert tags[TAG_CONTAINER] == f"{registry.host}/windowsarena/winarena@{digest}"
    assert tags[TAG_CONTAINER_DIGEST] == digest
    assert tags[TAG_VERIFIED] == "true" and tags[TAG_BUILD] == "waa-host-1" and tags[TAG_MANAGED] == "true"
    assert tags[TAG_WINDOWS_SOURCE] == "iso"
    assert tags[TAG_WINDOWS_SOURCE_URL] == "https://storage.example.com/isos/win11.iso"  # no SAS token
    assert "SECRET" not in repr(images[0]) and TAG_EXPIRES_AT not in tags
    assert tags[TAG_BUILDER_SIZE] == "m8i.2xlarge" and tags[TAG_BUILDER_REGION] == "us-east-1" and tags[TAG_BUILT_AT]
    snapshots = [m["Ebs"]["SnapshotId"] for m in images[0]["BlockDeviceMappings"] if "Ebs" in m]
    snap_tags = ec2.describe_snapshots(SnapshotIds=snapshots)["Snapshots"][0]["Tags"]
    assert {"Key": TAG_VERIFIED, "Value": "true"} in snap_tags
    # One builder and one verification VM were made, both terminated; nothing of ours is left.
    instances = _all_instances(ec2)
    assert len(instances) == 2 and {i["State"]["Name"] for i in instances} == {"terminated"}
    assert builder.status().complete and builder._provider.list_owned() == []
    assert ec2.describe_security_groups(Filters=[{"Name": "tag-key", "Values": [TAG_MANAGED]}])["SecurityGroups"] == []
    builder_instance = next(i for i in instances if i["ImageId"] == BASE_AMI)
    assert builder_instance["InstanceType"] == "m8i.2xlarge"
    assert len(lines) == 5


def test_a_build_killed_after_each_stage_in_turn_resumes_without_duplicates(make_builder) -> None:
    """Run 1 dies after stage 1, run 2 resumes and dies after stage 2, ... run 6 finishes."""
    for killed_after in STAGES:
        def kill(stage: Stage, stop: Stage = killed_after) -> None:
            if stage is stop:
                raise Killed(stage.value)

        with pytest.raises(Killed):
            run_build(make_builder(), log=lambda _: None, after_stage=kill)
    builder = make_builder()
    image_id = run_build(builder, log=lambda _: None)
    ec2 = builder.ec2
    assert [i["ImageId"] for i in _images(ec2)] == [image_id]
    builders = [i for i in _all_instances(ec2) if i["ImageId"] == BASE_AMI]
    assert len(builders) == 1 and builders[0]["State"]["Name"] == "terminated"
    assert builder.status().complete and builder._provider.list_owned() == []


def test_a_finished_build_is_a_no_op(make_builder) -> None:
    image_id = run_build(make_builder(), log=lambda _: None)
    builder = make_builder()
    calls: list[str] = []
    builder.ec2.meta.events.register("before-call.ec2.*", lambda model, **_: calls.append(model.name))
    lines: list[str] = []
    assert run_build(builder, log=lines.append) == image_id
    assert lines == [f"image {image_id} of build waa-host-1 exists and is verified; nothing to do"]
    assert not {"RunInstances", "CreateImage", "CreateTags", "TerminateInstances"} & set(calls)


def test_a_build_name_reused_with_other_settings_is_refused(make_builder, registry) -> None:
    from adapters.images.stages import BuildError

    make_builder().ensure_builder()
    other = make_builder(windows_iso_url="https://storage.example.com/isos/other.iso")
    with pytest.raises(BuildError, match="windows source URL"):
        run_build(other, log=lambda _: None)
    same_but_new_sas = make_builder(windows_iso_url=ISO.replace("SECRET", "ROTATED"))
    assert run_build(same_but_new_sas, log=lambda _: None).startswith("ami-")


def test_a_security_group_left_closed_by_a_kill_is_opened_on_resume(make_builder) -> None:
    builder = make_builder()
    group_id = builder.ec2.create_security_group(
        GroupName=builder.builder_name, Description="left by a killed run",
        TagSpecifications=[{"ResourceType": "security-group",
                            "Tags": [{"Key": "waa-arena-run-id", "Value": builder.spec.run_id}]}])["GroupId"]
    assert builder._security_group() == group_id
    assert builder._security_group() == group_id  # rules already there: no error
    rules = builder.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]["IpPermissions"]
    assert sorted((r["FromPort"], r["IpRanges"][0]["CidrIp"]) for r in rules) == [(22, "203.0.113.7/32"),
                                                                                (5000, "203.0.113.7/32")]
    builder.ec2.delete_security_group(GroupId=group_id)
