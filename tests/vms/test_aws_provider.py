"""The AWS provider against a real moto server (HTTP on loopback), with botocore event hooks for
what moto cannot do: throttling, capacity errors, CreateReplaceRootVolumeTask.

Every VM's WAA URL points at one local WAA simulation process, so create() really waits for a
WAA server to answer /probe.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from installed import require

sys.path.insert(0, str(Path(__file__).resolve().parent))

boto3 = pytest.importorskip("boto3")
require("moto")

from moto_server import MotoServer, canned_response, ec2_error, request_params  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from adapters.vms.aws import (  # noqa: E402
    TAG_VM_ID,
    AWSProvider,
    AWSSettings,
    ResetTiming,
    client_token,
    validate_controller_cidr,
)
from adapters.vms.base import (  # noqa: E402
    TAG_EXPIRES_AT,
    TAG_MANAGED,
    TAG_OWNER,
    TAG_RUN_ID,
    CapacityError,
    OwnedResource,
    ProviderError,
    ResetLevel,
    VMHandle,
)
from adapters.vms.pool import VMPool  # noqa: E402
from adapters.waa.client import WAAClient  # noqa: E402

REGION = "us-east-1"
AMI = "ami-1e749f67"  # one of moto's built-in Ubuntu AMIs (root device /dev/sda1)
CONTROLLER = "203.0.113.7/32"
GUEST_RESET = importlib.util.find_spec("adapters.vms.guest_reset") is not None


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def aws_env() -> Iterator[None]:
    """Dummy credentials for boto3's own chain; nothing from the developer's ~/.aws."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        mp.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield


@pytest.fixture(scope="module")
def moto(aws_env) -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def waa_sim(tmp_path_factory) -> Iterator[str]:
    from adapters.waa.localenv.launcher import start_local_env

    handle = start_local_env(tmp_path_factory.mktemp("waa-sim"))
    yield handle.base_url
    handle.stop()


@pytest.fixture
def endpoint(moto: MotoServer) -> str:
    moto.reset()
    return moto.url


@pytest.fixture
def raw(endpoint: str):
    """A plain boto3 client on the moto server (the test's view of "AWS")."""
    return boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)


@pytest.fixture
def settings(endpoint: str) -> AWSSettings:
    return AWSSettings(
        region=REGION,
        ami_id=AMI,
        controller_cidr=CONTROLLER,
        owner="ci@example.com",
        ttl_hours=6,
        endpoint_url=endpoint,
        max_attempts=4,
        ready_timeout=20,
        ready_poll_seconds=0.05,
        waiter_delay=0.05,
        waiter_max_attempts=40,
        disk_reset_poll_seconds=0.01,
        disk_reset_timeout=10,
        security_group_delete_timeout=0,
        baseline_snapshot=False,  # no QEMU behind moto's instances; the guest_reset test turns it on
    )


@pytest.fixture
def make_provider(settings: AWSSettings, waa_sim: str):
    def make(run_id: str = "run1", **overrides) -> AWSProvider:
        clock = overrides.pop("clock", None)
        kwargs = {"clock": clock} if clock else {}
        return AWSProvider(settings.model_copy(update=overrides), run_id, waa_url_for=lambda vm: waa_sim, **kwargs)

    return make


@pytest.fixture(autouse=True)
def fast_retry_backoff(monkeypatch) -> list[float]:
    """botocore still decides to retry and computes its backoff; the tests only sleep 10 ms of it."""
    from botocore.retries import standard

    delays: list[float] = []
    original = standard.ExponentialBackoff.delay_amount

    def delay_amount(self, context):
        delay = original(self, context)
        delays.append(delay)
        return min(delay, 0.01)

    monkeypatch.setattr(standard.ExponentialBackoff, "delay_amount", delay_amount)
    return delays


def live_instances(raw, run_id: str | None = None) -> list[dict]:
    filters = [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]
    if run_id:
        filters.append({"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]})
    return [i for r in raw.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def tags_of(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


# -- pool lifecycle -----------------------------------------------------------------------------


@pytest.mark.parametrize("elastic_ip", [False, True])
def test_pool_of_three_created_then_deleted_leaves_nothing(make_provider, raw, waa_sim, elastic_ip):
    provider = make_provider("poolrun", elastic_ip=elastic_ip)
    pool = VMPool(provider, 3, "poolrun")
    vms = pool.provision()

    assert sorted(vm.vm_id for vm in vms) == ["waa-poolrun-0", "waa-poolrun-1", "waa-poolrun-2"]
    instances = live_instances(raw, "poolrun")
    assert len(instances) == 3
    assert len({vm.details["instance_id"] for vm in vms}) == 3
    for vm in vms:
        assert vm.base_url == waa_sim and WAAClient(vm.base_url).probe()
        assert vm.details["instance_type"] == "m8i.2xlarge"
        assert vm.devtools_url.endswith(":9222")
    for instance in instances:
        tags = tags_of(instance)
        assert tags[TAG_MANAGED] == "true" and tags[TAG_RUN_ID] == "poolrun" and tags[TAG_OWNER] == "ci@example.com"
        assert tags["Name"] == tags[TAG_VM_ID] and tags["Name"].startswith("waa-poolrun-")
        assert TAG_EXPIRES_AT in tags
        volume_id = instance["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
        volume = raw.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
        assert tags_of(volume) == tags  # TagSpecifications reached the root volume too
    kinds = sorted(r.kind for r in provider.list_owned())
    expected = ["instance"] * 3 + ["security-group"] + ["volume"] * 3 + (["elastic-ip"] * 3 if elastic_ip else [])
    assert kinds == sorted(expected)
    if elastic_ip:
        addresses = raw.describe_addresses()["Addresses"]
        assert {a["InstanceId"] for a in addresses} == {vm.details["instance_id"] for vm in vms}

    pool.teardown()

    assert provider.list_owned() == []
    assert live_instances(raw) == []
    assert raw.describe_volumes()["Volumes"] == []
    assert raw.describe_addresses()["Addresses"] == []
    assert [g["GroupName"] for g in raw.describe_security_groups()["SecurityGroups"]] == ["default"]
    provider.delete(vms[0])  # deleting a gone VM is not an error


def test_security_group_kept_while_another_vm_of_the_run_lives(make_provider, raw):
    provider = make_provider("sgrun")
    first, second = provider.create("a"), provider.create("b")
    provider.delete(first)
    assert len(provider.list_owned()) == 3  # b's instance, b's volume, the run's group
    assert any(g["GroupName"] == "waa-arena-sgrun" for g in raw.describe_security_groups()["SecurityGroups"])
    provider.delete(second)
    assert provider.list_owned() == []


# -- idempotent create ---------------------------------------------------------------------------


def test_retried_create_returns_the_same_instance(make_provider, raw):
    provider = make_provider("idem")
    tokens: list[str] = []
    provider.ec2.meta.events.register(
        "before-send.ec2.RunInstances", lambda request, **_: tokens.append(request_params(request)["ClientToken"])
    )
    first = provider.create("waa-idem-0")
    again = provider.create("waa-idem-0")
    # A new provider object (the controller restarted) finds it by its tags as well.
    restarted = make_provider("idem").create("waa-idem-0")

    assert first.details["instance_id"] == again.details["instance_id"] == restarted.details["instance_id"]
    assert len(live_instances(raw, "idem")) == 1
    assert tokens == [client_token("idem", "waa-idem-0", "m8i.2xlarge")]  # only one launch, deterministic token
    assert len(tokens[0]) <= 64
    assert client_token("idem", "waa-idem-1", "m8i.2xlarge") != tokens[0]
    assert client_token("other", "waa-idem-0", "m8i.2xlarge") != tokens[0]


def test_stale_client_token_giving_a_terminated_instance_relaunches(make_provider, raw):
    """AWS answers a reused token (same VM name after a delete) with the old, terminated instance."""
    provider = make_provider("stale")
    tokens: list[str] = []

    def stale_first(request, **_):
        tokens.append(request_params(request)["ClientToken"])
        if len(tokens) == 1:
            return canned_response(request.url, 200, (
                '<RunInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId>'
                "<reservationId>r-1</reservationId><instancesSet><item><instanceId>i-0deadbeef0000000</instanceId>"
                "<instanceState><code>48</code><name>terminated</name></instanceState></item></instancesSet>"
                "</RunInstancesResponse>"))
        return None

    provider.ec2.meta.events.register("before-send.ec2.RunInstances", stale_first)
    vm = provider.create("v")
    assert vm.details["instance_id"] != "i-0deadbeef0000000"
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    assert [i["InstanceId"] for i in live_instances(raw, "stale")] == [vm.details["instance_id"]]


def test_create_restarts_a_stopped_instance_instead_of_launching(make_provider, raw):
    provider = make_provider("stoprun")
    vm = provider.create("v")
    provider.stop(vm)
    state = raw.describe_instances(InstanceIds=[vm.details["instance_id"]])["Reservations"][0]["Instances"][0]
    assert state["State"]["Name"] == "stopped"
    again = provider.create("v")
    assert again.details["instance_id"] == vm.details["instance_id"]
    assert [i["State"]["Name"] for i in live_instances(raw, "stoprun")] == ["running"]


def test_failed_readiness_terminates_the_instance(settings, raw, endpoint):
    provider = AWSProvider(settings.model_copy(update={"ready_timeout": 0.3}), "deadrun",
                           waa_url_for=lambda vm: "http://127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(ProviderError, match="WAA server not ready"):
        provider.create("v")
    assert live_instances(raw, "deadrun") == []
    assert provider.list_owned() == []


# -- throttling --------------------------------------------------------------------------------


def throttle_first(count: int, calls: list[int]):
    def hook(request, **_):
        calls.append(1)
        if len(calls) <= count:
            return ec2_error(request.url, 503, "RequestLimitExceeded", "Request limit exceeded.")
        return None  # later attempts go to moto

    return hook


def test_throttling_is_retried_by_botocore_during_create(make_provider, fast_retry_backoff):
    provider = make_provider("throttle", retry_mode="standard")
    calls: list[int] = []
    provider.ec2.meta.events.register("before-send.ec2.DescribeInstances", throttle_first(2, calls))
    vm = provider.create("v")
    assert vm.details["instance_id"].startswith("i-")
    assert len(calls) >= 3  # 2 throttled + the one that got through (+ later describes)
    assert len(fast_retry_backoff) == 2  # botocore computed two backoffs: it retried, not our code


@pytest.mark.parametrize("mode", ["standard", "adaptive"])
def test_throttling_is_retried_in_both_retry_modes(make_provider, fast_retry_backoff, raw, mode):
    provider = make_provider("throttle", retry_mode=mode)
    raw.create_security_group(GroupName="g", Description="x", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": [{"Key": TAG_MANAGED, "Value": "true"}]}])
    calls: list[int] = []
    provider.ec2.meta.events.register("before-send.ec2.DescribeSecurityGroups", throttle_first(2, calls))
    assert [r.kind for r in provider.list_owned()] == ["security-group"]
    assert len(calls) == 3
    assert len(fast_retry_backoff) == 2


def test_throttling_beyond_max_attempts_is_a_provider_error(make_provider):
    provider = make_provider("throttle2", max_attempts=3)
    calls: list[int] = []

    def always(request, **_):
        calls.append(1)
        return ec2_error(request.url, 503, "RequestLimitExceeded")

    provider.ec2.meta.events.register("before-send.ec2.DescribeSecurityGroups", always)
    with pytest.raises(ProviderError, match="RequestLimitExceeded"):
        provider.list_owned()
    assert len(calls) == 3


# -- capacity fallback ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [("InsufficientInstanceCapacity", 500), ("InstanceLimitExceeded", 400), ("Unsupported", 400)],
)
def test_capacity_error_moves_to_the_next_instance_type(make_provider, raw, code, status):
    provider = make_provider("cap")
    seen: list[dict] = []

    def no_m8i(request, **_):
        params = request_params(request)
        seen.append(params)
        if params["InstanceType"] == "m8i.2xlarge":
            return ec2_error(request.url, status, code)
        return None

    provider.ec2.meta.events.register("before-send.ec2.RunInstances", no_m8i)
    vm = provider.create("v")
    assert vm.details["instance_type"] == "c8i.2xlarge"
    assert live_instances(raw, "cap")[0]["InstanceType"] == "c8i.2xlarge"
    assert seen[0]["InstanceType"] == "m8i.2xlarge" and seen[-1]["InstanceType"] == "c8i.2xlarge"
    # Nested virtualization is asked for on both (c8i/m8i support it).
    assert all(p.get("CpuOptions.NestedVirtualization") == "enabled" for p in seen)


def test_all_instance_types_exhausted_raises_capacity_error(make_provider, raw):
    provider = make_provider("cap2")

    def none_left(request, **_):
        return ec2_error(request.url, 500, "InsufficientInstanceCapacity")

    provider.ec2.meta.events.register("before-send.ec2.RunInstances", none_left)
    with pytest.raises(CapacityError, match="m8i.2xlarge: InsufficientInstanceCapacity.*c8i.2xlarge"):
        provider.create("v")
    assert live_instances(raw, "cap2") == []


def test_other_launch_errors_do_not_fall_through(make_provider):
    provider = make_provider("cap3")
    types: list[str] = []

    def denied(request, **_):
        types.append(request_params(request)["InstanceType"])
        return ec2_error(request.url, 403, "UnauthorizedOperation")

    provider.ec2.meta.events.register("before-send.ec2.RunInstances", denied)
    with pytest.raises(ProviderError, match="UnauthorizedOperation") as info:
        provider.create("v")
    assert not isinstance(info.value, CapacityError)
    assert set(types) == {"m8i.2xlarge"}


def test_nested_virtualization_only_for_supporting_families(make_provider):
    provider = make_provider("nv", instance_types=["m5.metal"])
    seen: list[dict] = []
    provider.ec2.meta.events.register("before-send.ec2.RunInstances", lambda request, **_: seen.append(
        request_params(request)))
    provider.create("v")
    assert "CpuOptions.NestedVirtualization" not in seen[0]


# -- security group ------------------------------------------------------------------------------


def test_security_group_opens_only_the_four_ports_to_the_controller(make_provider, raw):
    provider = make_provider("sg")
    vm = provider.create("v")
    groups = raw.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["waa-arena-sg"]}])
    (group,) = groups["SecurityGroups"]
    assert tags_of(group)[TAG_RUN_ID] == "sg" and tags_of(group)[TAG_MANAGED] == "true"
    rules = group["IpPermissions"]
    assert sorted((r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in rules) == [
        ("tcp", 22, 22), ("tcp", 5000, 5000), ("tcp", 7200, 7200), ("tcp", 9222, 9222)]
    for rule in rules:
        assert [r["CidrIp"] for r in rule["IpRanges"]] == [CONTROLLER]
        assert rule.get("Ipv6Ranges", []) == []
        assert rule.get("UserIdGroupPairs", []) == [] and rule.get("PrefixListIds", []) == []
    cidrs = {r["CidrIp"] for rule in rules for r in rule["IpRanges"]}
    assert "0.0.0.0/0" not in cidrs and "::/0" not in {r.get("CidrIpv6") for rule in rules
                                                        for r in rule.get("Ipv6Ranges", [])}
    instance = raw.describe_instances(InstanceIds=[vm.details["instance_id"]])["Reservations"][0]["Instances"][0]
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [group["GroupId"]]


@pytest.mark.parametrize(
    "cidr", ["0.0.0.0/0", "10.0.0.0/8", "203.0.113.0/23", "::/0", "2001:db8::/32", "not-a-network", ""]
)
def test_bad_controller_cidr_is_refused(endpoint, cidr):
    with pytest.raises(ValidationError, match="controller_cidr"):
        AWSSettings(region=REGION, ami_id=AMI, owner="x", controller_cidr=cidr)


def test_controller_cidr_is_required_and_normalized():
    with pytest.raises(ValidationError, match="controller_cidr"):
        AWSSettings(region=REGION, ami_id=AMI, owner="x")
    assert validate_controller_cidr("203.0.113.7") == "203.0.113.7/32"
    assert validate_controller_cidr("203.0.113.9/24") == "203.0.113.0/24"
    assert validate_controller_cidr("2001:db8::1/128") == "2001:db8::1/128"


def test_settings_never_hold_credentials():
    with pytest.raises(ValidationError):
        AWSSettings(region=REGION, ami_id=AMI, owner="x", controller_cidr=CONTROLLER,
                    aws_access_key_id="AKIA...")  # type: ignore[call-arg]


# -- janitor -------------------------------------------------------------------------------------


def test_janitor_deletes_only_expired_tagged_resources(make_provider, raw):
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=24)
    old = make_provider("oldrun", clock=lambda: past, elastic_ip=True)  # its tags expired 18 h ago
    fresh = make_provider("newrun")
    old_vms = [old.create("a"), old.create("b")]
    new_vm = fresh.create("a")
    # Somebody else's instance, volume and group in the same account: no tags of ours.
    stranger = raw.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="t3.micro")["Instances"][0]
    stranger_volume = raw.create_volume(AvailabilityZone=f"{REGION}a", Size=10)["VolumeId"]
    stranger_group = raw.create_security_group(GroupName="not-ours", Description="x")["GroupId"]
    # A lookalike: tags that only claim the product's expiry, without the managed tag.
    raw.create_tags(Resources=[stranger["InstanceId"]], Tags=[{"Key": TAG_EXPIRES_AT, "Value": "2000-01-01T00:00:00Z"}])

    owned = fresh.list_owned()
    assert stranger["InstanceId"] not in {r.resource_id for r in owned}
    expired = [r for r in owned if r.expired()]
    assert sorted(r.kind for r in expired) == sorted(["instance"] * 2 + ["elastic-ip"] * 2 + ["volume"] * 2
                                                     + ["security-group"])
    assert all(r.tags[TAG_RUN_ID] == "oldrun" for r in expired)
    for resource in expired:  # list_owned's order (instances first) lets them go one by one
        fresh.delete_resource(resource)

    left = fresh.list_owned()
    assert {r.tags[TAG_RUN_ID] for r in left} == {"newrun"}
    assert sorted(r.kind for r in left) == ["instance", "security-group", "volume"]
    assert [i["InstanceId"] for i in live_instances(raw, "newrun")] == [new_vm.details["instance_id"]]
    assert live_instances(raw, "oldrun") == []
    assert raw.describe_addresses()["Addresses"] == []
    # The untagged resources survived.
    instance = raw.describe_instances(InstanceIds=[stranger["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert instance["State"]["Name"] == "running"
    assert raw.describe_volumes(VolumeIds=[stranger_volume])["Volumes"]
    assert raw.describe_security_groups(GroupIds=[stranger_group])["SecurityGroups"]
    assert old_vms[0].details["instance_id"] not in {r.resource_id for r in left}


@pytest.mark.skipif(importlib.util.find_spec("adapters.vms.janitor") is None, reason="no janitor module yet")
def test_project_janitor_sweep_on_aws(make_provider, raw):
    from adapters.vms.janitor import sweep

    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=24)
    old = make_provider("sweepold", clock=lambda: past, elastic_ip=True)
    old.create("a")
    keep = make_provider("sweepnew")
    keep.create("a")
    stranger = raw.run_instances(ImageId=AMI, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    report = sweep(keep)
    assert report.failed == []
    assert sorted(r.kind for r in report.deleted) == ["elastic-ip", "instance", "security-group", "volume"]
    assert {r.tags[TAG_RUN_ID] for r in keep.list_owned()} == {"sweepnew"}
    assert raw.describe_instances(InstanceIds=[stranger])["Reservations"][0]["Instances"][0]["State"]["Name"] == (
        "running")


def test_delete_resource_refuses_untagged_even_when_told_otherwise(make_provider, raw):
    provider = make_provider("j2")
    stranger = raw.run_instances(ImageId=AMI, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    group = raw.create_security_group(GroupName="not-ours", Description="x")["GroupId"]
    lying_tags = {TAG_MANAGED: "true", TAG_EXPIRES_AT: "2000-01-01T00:00:00Z"}
    with pytest.raises(ProviderError, match="refusing"):
        provider.delete_resource(OwnedResource("aws", "instance", stranger, lying_tags))
    with pytest.raises(ProviderError, match="refusing"):
        provider.delete_resource(OwnedResource("aws", "security-group", group, lying_tags))
    with pytest.raises(ProviderError, match="unknown resource kind"):
        provider.delete_resource(OwnedResource("aws", "bucket", "b", lying_tags))
    assert live_instances(raw)[0]["InstanceId"] == stranger
    # A resource that is already gone is no error.
    provider.delete_resource(OwnedResource("aws", "volume", "vol-0123456789abcdef0", lying_tags))


# -- DISK reset (replace root volume through event hooks) --------------------------------------------


class FakeReplaceRootVolume:
    """Stands in for CreateReplaceRootVolumeTask / DescribeReplaceRootVolumeTasks, which moto lacks.

    It answers with EC2's XML and, when the task succeeds, really swaps the root volume in moto
    (detach, delete the old one, attach a new untagged one), as AWS does.
    """

    NS = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'

    def __init__(self, raw, polls_in_progress: int = 2, final_state: str = "succeeded") -> None:
        self.raw = raw
        self.polls_left = polls_in_progress
        self.final_state = final_state
        self.create_params: dict[str, str] = {}
        self.describes = 0
        self.old_volume: str | None = None
        self.new_volume: str | None = None

    def install(self, client) -> None:
        client.meta.events.register("before-send.ec2.CreateReplaceRootVolumeTask", self.create)
        client.meta.events.register("before-send.ec2.DescribeReplaceRootVolumeTasks", self.describe)

    def _task(self, state: str) -> str:
        return (f"<replaceRootVolumeTaskId>replacevol-0123456789abcdef0</replaceRootVolumeTaskId>"
                f"<instanceId>{self.create_params['InstanceId']}</instanceId><taskState>{state}</taskState>"
                f"<startTime>2026-01-01T00:00:00Z</startTime><deleteReplacedRootVolume>true</deleteReplacedRootVolume>")

    def create(self, request, **_):
        self.create_params = request_params(request)
        body = (f"<CreateReplaceRootVolumeTaskResponse {self.NS}><requestId>r1</requestId>"
                f"<replaceRootVolumeTask>{self._task('pending')}</replaceRootVolumeTask>"
                f"</CreateReplaceRootVolumeTaskResponse>")
        return canned_response(request.url, 200, body)

    def describe(self, request, **_):
        self.describes += 1
        if self.polls_left > 0:
            self.polls_left -= 1
            state = "in-progress"
        else:
            state = self.final_state
            if state == "succeeded" and self.new_volume is None:
                self._swap()
        body = (f"<DescribeReplaceRootVolumeTasksResponse {self.NS}><requestId>r2</requestId>"
                f"<replaceRootVolumeTaskSet><item>{self._task(state)}</item></replaceRootVolumeTaskSet>"
                f"</DescribeReplaceRootVolumeTasksResponse>")
        return canned_response(request.url, 200, body)

    def _swap(self) -> None:
        instance_id = self.create_params["InstanceId"]
        instance = self.raw.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        self.old_volume = instance["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
        self.raw.detach_volume(VolumeId=self.old_volume, InstanceId=instance_id)
        self.raw.delete_volume(VolumeId=self.old_volume)
        zone = instance["Placement"]["AvailabilityZone"]
        self.new_volume = self.raw.create_volume(AvailabilityZone=zone, Size=8)["VolumeId"]
        self.raw.attach_volume(VolumeId=self.new_volume, InstanceId=instance_id, Device="/dev/sda1")


def test_disk_reset_replaces_the_root_volume_and_tags_it(make_provider, raw):
    provider = make_provider("disk")
    vm = provider.create("v")
    fake = FakeReplaceRootVolume(raw)
    fake.install(provider.ec2)

    timing = provider.reset(vm, ResetLevel.DISK)

    assert isinstance(timing, ResetTiming) and timing.level is ResetLevel.DISK and timing.seconds > 0
    assert vm.details["last_reset_seconds"] == timing.seconds and provider.reset_timings == [timing]
    assert fake.create_params["InstanceId"] == vm.details["instance_id"]
    assert fake.create_params["ImageId"] == AMI and fake.create_params["DeleteReplacedRootVolume"] == "true"
    assert fake.describes == 3  # polled through two in-progress answers
    assert vm.details["root_volume_id"] == fake.new_volume != fake.old_volume
    volume = raw.describe_volumes(VolumeIds=[fake.new_volume])["Volumes"][0]
    assert tags_of(volume)[TAG_RUN_ID] == "disk" and tags_of(volume)[TAG_VM_ID] == "v"
    assert vm.healthy
    provider.delete(vm)
    assert provider.list_owned() == []


def test_disk_reset_from_a_snapshot(make_provider, raw):
    provider = make_provider("disk2", disk_reset_snapshot_id="snap-0123456789abcdef0")
    vm = provider.create("v")
    fake = FakeReplaceRootVolume(raw, polls_in_progress=0)
    fake.install(provider.ec2)
    provider.reset(vm, ResetLevel.DISK)
    assert fake.create_params["SnapshotId"] == "snap-0123456789abcdef0" and "ImageId" not in fake.create_params


def test_failed_disk_reset_is_a_provider_error(make_provider, raw):
    provider = make_provider("disk3")
    vm = provider.create("v")
    FakeReplaceRootVolume(raw, polls_in_progress=1, final_state="failed").install(provider.ec2)
    with pytest.raises(ProviderError, match="ended failed"):
        provider.reset(vm, ResetLevel.DISK)
    assert not vm.healthy


def test_disk_reset_without_hooks_fails_cleanly_on_moto(make_provider):
    """moto answers the unimplemented call with an HTML 500: a ProviderError, not a crash."""
    provider = make_provider("disk4", max_attempts=1)
    vm = provider.create("v")
    with pytest.raises(ProviderError, match="root volume replacement failed"):
        provider.reset(vm, ResetLevel.DISK)


# -- spot ---------------------------------------------------------------------------------------


def test_spot_instance_is_created_with_market_options(make_provider, raw):
    provider = make_provider("spot", spot=True, spot_max_price="0.30")
    seen: list[dict] = []
    provider.ec2.meta.events.register("before-send.ec2.RunInstances", lambda request, **_: seen.append(
        request_params(request)))
    vm = provider.create("v")
    assert seen[0]["InstanceMarketOptions.MarketType"] == "spot"
    assert seen[0]["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert seen[0]["InstanceMarketOptions.SpotOptions.MaxPrice"] == "0.30"
    instance = raw.describe_instances(InstanceIds=[vm.details["instance_id"]])["Reservations"][0]["Instances"][0]
    assert instance["InstanceLifecycle"] == "spot" and vm.details["spot"] is True
    with pytest.raises(ProviderError, match="cannot be stopped"):
        provider.stop(vm)


def test_spot_interruption_surfaces_as_provider_error(make_provider, raw):
    provider = make_provider("spot2", spot=True)
    vm = provider.create("v")
    provider.reset(vm, ResetLevel.SETUP)  # fine while it runs
    raw.terminate_instances(InstanceIds=[vm.details["instance_id"]])  # AWS takes it back
    with pytest.raises(ProviderError, match=r"terminated \(spot instance interrupted\)"):
        provider.reset(vm, ResetLevel.SETUP)
    assert not vm.healthy
    provider.delete(vm)
    assert provider.list_owned() == []


def test_spot_interruption_notice_surfaces_before_termination(make_provider):
    """A spot request marked-for-termination (2-minute notice) while the instance still runs."""
    provider = make_provider("spot3", spot=True)
    vm = provider.create("v")

    def add_request_id(parsed, **_):  # moto sets no SpotInstanceRequestId on the instance
        for reservation in parsed.get("Reservations", []):
            for instance in reservation["Instances"]:
                instance["SpotInstanceRequestId"] = "sir-0123456789"

    def notice(request, **_):
        return canned_response(request.url, 200, (
            '<DescribeSpotInstanceRequestsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            "<requestId>r</requestId><spotInstanceRequestSet><item><spotInstanceRequestId>sir-0123456789"
            "</spotInstanceRequestId><state>active</state><status><code>marked-for-termination</code>"
            "</status></item></spotInstanceRequestSet></DescribeSpotInstanceRequestsResponse>"))

    provider.ec2.meta.events.register("after-call.ec2.DescribeInstances", add_request_id)
    provider.ec2.meta.events.register("before-send.ec2.DescribeSpotInstanceRequests", notice)
    with pytest.raises(ProviderError, match="marked-for-termination"):
        provider.reset(vm, ResetLevel.SETUP)
    assert not vm.healthy


# -- guest-level resets (QMP through adapters.vms.guest_reset) -----------------------------------------


def test_supported_levels(make_provider):
    levels = make_provider("lv").supported_reset_levels()
    assert {ResetLevel.SETUP, ResetLevel.DISK} <= levels
    assert (ResetLevel.REBOOT in levels) == GUEST_RESET
    assert (ResetLevel.SNAPSHOT in make_provider("lv", baseline_snapshot=True).supported_reset_levels()) == GUEST_RESET
    assert ResetLevel.SNAPSHOT not in make_provider("lv", baseline_snapshot=False).supported_reset_levels()


@pytest.mark.skipif(not GUEST_RESET, reason="adapters/vms/guest_reset.py is not there yet")
def test_snapshot_and_reboot_go_through_guest_reset(settings, waa_sim, monkeypatch):
    from adapters.vms import guest_reset

    calls: list[tuple] = []
    monkeypatch.setattr(guest_reset, "take_baseline_snapshot",
                        lambda qmp, url, name="waa-baseline", ready_deadline=0: calls.append(("baseline", qmp, url,
                                                                                              name)))
    monkeypatch.setattr(guest_reset, "snapshot_reset",
                        lambda qmp, url, name, deadline: calls.append(("snapshot", qmp, url, name)))
    monkeypatch.setattr(guest_reset, "reboot_reset", lambda qmp, url, deadline: calls.append(("reboot", qmp, url)))
    provider = AWSProvider(settings.model_copy(update={"baseline_snapshot": True}), "guest",
                           waa_url_for=lambda vm: waa_sim,
                           qmp_address_for=lambda vm: ("127.0.0.1", 7299))
    vm = provider.create("v")
    assert calls == [("baseline", ("127.0.0.1", 7299), waa_sim, "waa-baseline")]
    assert provider.reset(vm, ResetLevel.SNAPSHOT).level is ResetLevel.SNAPSHOT
    assert provider.reset(vm, ResetLevel.REBOOT).level is ResetLevel.REBOOT
    assert calls[1:] == [("snapshot", ("127.0.0.1", 7299), waa_sim, "waa-baseline"),
                         ("reboot", ("127.0.0.1", 7299), waa_sim)]
    assert [t.level for t in provider.reset_timings] == [ResetLevel.SNAPSHOT, ResetLevel.REBOOT]

    # The monitor stops answering because AWS took the instance: the error says so.
    def unreachable(*args):
        provider.ec2.terminate_instances(InstanceIds=[vm.details["instance_id"]])
        raise ConnectionRefusedError("QMP monitor unreachable")

    monkeypatch.setattr(guest_reset, "snapshot_reset", unreachable)
    with pytest.raises(ProviderError, match="is terminated"):
        provider.reset(vm, ResetLevel.SNAPSHOT)
    assert not vm.healthy


def test_default_urls_use_the_instance_address(settings, raw):
    provider = AWSProvider(settings, "urls")
    instance = {"InstanceId": "i-1", "PublicIpAddress": "54.1.2.3", "PrivateIpAddress": "10.0.0.5"}
    vm = provider._handle("v", instance)
    assert vm.base_url == "http://54.1.2.3:5000" and vm.devtools_url == "http://54.1.2.3:9222"
    assert provider._qmp_address(vm) == ("54.1.2.3", 7200)
    private = AWSProvider(settings.model_copy(update={"use_private_ip": True}), "urls")._handle("v", instance)
    assert private.base_url == "http://10.0.0.5:5000"
    assert isinstance(vm, VMHandle)

