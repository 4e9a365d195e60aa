"""`arena doctor`'s cloud checks against moto (AWS) and the fake ARM server (Azure): all pass on a
sound setup, and each broken on its own names itself and its fix.

What moto lacks (Service Quotas for EC2, an expired token) comes from botocore `before-send`
hooks on the provider's own session, as in the provider tests; the egress address comes from a
real HTTP server on 127.0.0.1 that answers the way checkip.amazonaws.com does.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from installed import require

sys.path.insert(0, str(Path(__file__).resolve().parent))
boto3 = pytest.importorskip("boto3")
require("moto")

from botocore.awsrequest import AWSResponse  # noqa: E402
from moto_server import MotoServer, moto_with_dummy_credentials, _Raw, canned_response  # noqa: E402

from adapters.checks import Check  # noqa: E402
from adapters.vms.aws import AWSProvider, AWSSettings  # noqa: E402
from adapters.vms.base import TAG_MANAGED, Billing, VMState  # noqa: E402
from adapters.vms.cloud_checks import check_egress, check_ports  # noqa: E402
from flows.doctor import check_cloud  # noqa: E402

REGION = "us-east-1"
CONTROLLER = "203.0.113.7/32"


class Egress:
    """A what-is-my-IP service on 127.0.0.1 that answers `answer` as plain text."""

    def __init__(self) -> None:
        self.answer = "203.0.113.7\n"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = outer.answer.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def egress() -> Iterator[Egress]:
    service = Egress()
    yield service
    service.server.shutdown()


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    with moto_with_dummy_credentials() as server:
        yield server


def quota_hook(value: float):
    """Service Quotas' answer for the EC2 vCPU quota (moto serves none for EC2)."""

    def send(request, **_: object) -> AWSResponse:
        body = json.dumps({"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-1216C47A", "Value": value}})
        return AWSResponse(request.url, 200, {"Content-Type": "application/x-amz-json-1.1"}, _Raw(body.encode()))

    return send


def expired_token(request, **_: object) -> AWSResponse:
    return canned_response(request.url, 403, "<ErrorResponse><Error><Type>Sender</Type><Code>ExpiredToken</Code>"
                           "<Message>The security token included in the request is expired</Message></Error>"
                           "</ErrorResponse>")


def tagged_ami(endpoint: str) -> str:
    """An AMI as `arena image build` leaves it: managed tag plus provenance tags."""
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
    instance = ec2.run_instances(ImageId="ami-1e749f67", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    image = ec2.create_image(InstanceId=instance, Name="waa-host-test")["ImageId"]
    ec2.create_tags(Resources=[image], Tags=[{"Key": TAG_MANAGED, "Value": "true"},
                                            {"Key": "waa-arena-waa-commit", "Value": "abc123"}])
    ec2.terminate_instances(InstanceIds=[instance])
    return image


def aws_provider(moto: MotoServer, quota: float = 256, sts_hook=None, **overrides: object) -> AWSProvider:
    session = boto3.Session()
    session.events.register("before-send.service-quotas.GetServiceQuota", quota_hook(quota))
    if sts_hook:
        session.events.register("before-send.sts.GetCallerIdentity", sts_hook)
    values: dict[str, object] = dict(region=REGION, ami_id="ami-1e749f67", controller_cidr=CONTROLLER,
                                     owner="ci@example.com", endpoint_url=moto.url, max_attempts=2)
    values.update(overrides)
    return AWSProvider(AWSSettings(**values), "doctor", session=session)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_aws_sound_setup_passes_every_check(moto: MotoServer, egress: Egress) -> None:
    moto.reset()
    image = tagged_ami(moto.url)
    checks = check_cloud("aws", None, 4, egress_url=egress.url, provider=aws_provider(moto, ami_id=image))
    assert all(c.ok for c in checks), "\n".join(c.line() for c in checks)
    named = by_name(checks)
    assert "arn:aws:sts::123456789012" in named["AWS credentials"].detail
    assert "holds 4 x m8i.2xlarge (32 vCPUs" in named["vCPU quota"].detail
    assert "waa-commit" in named[f"image {image}"].detail
    assert "inside controller_cidr" in named["controller address"].detail


@pytest.mark.parametrize("broken, name, says, fix", [
    ("credentials", "AWS credentials", "ExpiredToken", "AWS_PROFILE"),
    ("types", f"instance types in {REGION}", "none of x9.mega is offered", "choose a region"),
    ("quota", "vCPU quota", "needs 32 On-Demand vCPUs; the quota (L-1216C47A) in us-east-1 is 16",
     "--pool-size 2"),
    ("image missing", "image ami-0000000000000dead", "InvalidAMIID", "arena image build --provider aws"),
    ("image untagged", "image ami-1e749f67", "not built by arena image build", "arena image build --provider aws"),
    ("egress", "controller address", "OUTSIDE controller_cidr 203.0.113.7/32", 'controller_cidr = "198.51.100.9/32"'),
])
def test_aws_each_broken_check_names_itself_and_its_fix(moto: MotoServer, egress: Egress, broken: str, name: str,
                                                       says: str, fix: str) -> None:
    moto.reset()
    image = tagged_ami(moto.url)
    overrides: dict[str, object] = {"ami_id": image}
    quota, sts_hook = 256.0, None
    egress.answer = "203.0.113.7\n"
    if broken == "credentials":
        sts_hook = expired_token
    elif broken == "types":
        overrides["instance_types"] = ["x9.mega"]
    elif broken == "quota":
        quota = 16
    elif broken == "image missing":
        overrides["ami_id"] = "ami-0000000000000dead"
    elif broken == "image untagged":
        overrides["ami_id"] = "ami-1e749f67"
    elif broken == "egress":
        egress.answer = "198.51.100.9\n"
    try:
        checks = check_cloud("aws", None, 4, egress_url=egress.url,
                             provider=aws_provider(moto, quota=quota, sts_hook=sts_hook, **overrides))
    finally:
        egress.answer = "203.0.113.7\n"
    failed = [c for c in checks if not c.ok]
    assert [c.name for c in failed] == [name], "\n".join(c.line() for c in checks)
    assert says in failed[0].detail and fix in failed[0].fix
    assert "fix: " in failed[0].line()


def test_egress_service_that_answers_nonsense_or_nothing() -> None:
    service = Egress()
    try:
        service.answer = "<html>rate limited</html>"
        check = check_egress(CONTROLLER, service.url)
        assert not check.ok and "not an IP address" in check.detail and "--egress-url" in check.fix
    finally:
        service.server.shutdown()
    check = check_egress(CONTROLLER, "http://127.0.0.1:9/", timeout=2)  # nothing listens on port 9
    assert not check.ok and "could not ask" in check.detail


def test_ports_check_connects_for_real() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    open_port = listener.getsockname()[1]
    try:
        vm = VMState("waa-pool-x-0", "i-1", "running", "m8i.2xlarge", Billing.COMPUTE, address="127.0.0.1")
        ok = check_ports([vm], {"WAA": open_port})
        assert ok[0].ok and f"accepts WAA {open_port}" in ok[0].detail
        closed = check_ports([vm], {"WAA": open_port, "QMP": 9})
        assert not closed[0].ok and "does not accept QMP 9" in closed[0].detail and "security group" in closed[0].fix
        stopped = check_ports([VMState("v", "i-2", "stopped", None, Billing.DISKS, address="127.0.0.1")], {"WAA": 9})
        assert stopped[0].ok and "stopped" in stopped[0].detail
    finally:
        listener.close()


def test_doctor_cli_with_a_broken_cloud_config_is_a_failed_check(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    config = tmp_path / "arena.toml"
    config.write_text('[aws]\nregion = "us-east-1"\n')  # no ami_id, controller_cidr, owner
    rc = main(["doctor", "--db", str(tmp_path / "r.duckdb"), "--provider", "aws", "--config", str(config)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL  cloud config:" in out and "ami_id" in out and "fix: see docs/first-real-run.md" in out


# -- Azure ------------------------------------------------------------------------------------

require("azure.mgmt.compute")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "images"))
from fake_arm import vm_sku  # noqa: E402
from fake_gallery import VERSION, FakeGalleryARM  # noqa: E402
from test_azure_provider import FakeCredential, settings_for  # noqa: E402

from adapters.vms.azure import AzureProvider  # noqa: E402


class RefusingCredential:
    def get_token(self, *scopes: str, **kwargs: object):
        from azure.core.exceptions import ClientAuthenticationError

        raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token from the included credentials")


@pytest.fixture
def gallery_arm() -> Iterator[FakeGalleryARM]:
    fake = FakeGalleryARM()
    yield fake
    fake.close()


def _seed_version(arm: FakeGalleryARM, tags: dict[str, str]) -> str:
    rid = (f"/subscriptions/{arm.subscription_id}/resourceGroups/{arm.resource_group}/providers/Microsoft.Compute/"
           "galleries/waa/images/waa-host/versions/1.0.0")
    arm.resources[rid.lower()] = {"id": rid, "name": "1.0.0", "type": VERSION, "location": "westeurope",
                                  "tags": tags, "properties": {"provisioningState": "Succeeded"}}
    return rid


def azure_provider(arm: FakeGalleryARM, image_id: str, credential: object | None = None, **overrides: object) -> AzureProvider:
    return AzureProvider(settings_for(arm, image_id=image_id, **overrides), "doctor",
                         credential=credential or FakeCredential())


def test_azure_sound_setup_passes_every_check(gallery_arm: FakeGalleryARM, egress: Egress) -> None:
    image = _seed_version(gallery_arm, {TAG_MANAGED: "true", "waa-arena-container-digest": "sha256:abc"})
    checks = check_cloud("azure", None, 4, egress_url=egress.url, provider=azure_provider(gallery_arm, image))
    assert all(c.ok for c in checks), "\n".join(c.line() for c in checks)
    named = by_name(checks)
    assert "FakeCredential gives a management token" in named["Azure credentials"].detail
    assert "Standard_D8ds_v5 offered; standardDDSv5Family: 100 of 100 cores free (the pool needs 32)" in \
        named["VM sizes in westeurope"].detail
    assert "container-digest" in named["image"].detail


@pytest.mark.parametrize("broken, name, says, fix", [
    ("credentials", "Azure credentials", "ClientAuthenticationError", "az login"),
    ("quota", "VM sizes in westeurope", "needs 32 cores of standardDDSv5Family; 12 of 20 are free", "--pool-size 1"),
    ("restricted", "VM sizes in northeurope", "restricted for this subscription: Standard_D8ds_v5", "other vm_sizes"),
    ("image untagged", "image", "not built by arena image build", "arena image build --provider azure"),
    ("image missing", "image", "ResourceNotFound", "arena image build --provider azure"),
])
def test_azure_each_broken_check_names_itself_and_its_fix(gallery_arm: FakeGalleryARM, egress: Egress, broken: str,
                                                         name: str, says: str, fix: str) -> None:
    image = _seed_version(gallery_arm, {TAG_MANAGED: "true"})
    credential = None
    overrides: dict[str, object] = {}
    if broken == "credentials":
        credential = RefusingCredential()
    elif broken == "quota":
        gallery_arm.usages["westeurope"]["standardDDSv5Family"] = (8, 20)
    elif broken == "restricted":
        gallery_arm.skus = [s for s in gallery_arm.skus if "northeurope" not in s["locations"]] + [
            vm_sku("Standard_D8ds_v5", "standardDDSv5Family", 8, "northeurope", restricted=True)]
        overrides["vm_sizes"] = ["Standard_D8ds_v5"]
    elif broken == "image untagged":
        image = _seed_version(gallery_arm, {})
    elif broken == "image missing":
        gallery_arm.resources.clear()
    checks = check_cloud("azure", None, 4, egress_url=egress.url,
                         provider=azure_provider(gallery_arm, image, credential, **overrides))
    failed = [c for c in checks if not c.ok]
    assert [c.name for c in failed] == [name], "\n".join(c.line() for c in checks)
    assert says in failed[0].detail and fix in failed[0].fix
