"""The cloud providers with access="tunnel": WAA, QMP and DevTools through a real OpenSSH tunnel.

The VM is a moto EC2 instance (AWS) or a fake-ARM VM (Azure); the `ssh_address_for` hook points
the tunnel's ssh at a throwaway sshd on 127.0.0.1 (tests/vms/sshd_server.py), and the remote
ports (settings.waa_port ...) are the local WAA simulation's, so /probe really travels through
ssh. Skips cleanly without OpenSSH's server and client, boto3/moto or the Azure SDK.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sshd_server import SSHServer, sshd_missing_reason  # noqa: E402

pytestmark = pytest.mark.timeout(90)

CONTROLLER = "203.0.113.7/32"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Iterator[SSHServer]:
    reason = sshd_missing_reason()
    if reason:
        pytest.skip(reason)
    server = SSHServer(tmp_path_factory.mktemp("provider-sshd"))
    server.start()
    yield server
    server.stop()


def sim_port(sim) -> int:
    return int(sim.base_url.rsplit(":", 1)[1])


def ssh_pids(marker: Path) -> set[int]:
    """Running ssh client processes whose command line mentions `marker` (this test's tmp path)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"ssh") and str(marker).encode() in b" ".join(argv):
                pids.add(int(entry.name))
    return pids


def tunnel_settings(sshd: SSHServer, sim, tmp_path: Path) -> dict:
    port = sim_port(sim)
    return dict(access="tunnel", waa_port=port, qmp_port=port, devtools_port=port, ssh_user=sshd.user,
                ssh_identity_file=sshd.client_key, ssh_known_hosts_file=tmp_path / "known_hosts",
                ssh_config_file=Path("/dev/null"), tunnel_monitor_seconds=0.2)


def assert_tunnel_url(url: str, sim) -> None:
    assert url.startswith("http://127.0.0.1:") and url != sim.base_url


# -- AWS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    pytest.importorskip("boto3")
    pytest.importorskip("moto")
    from moto_server import moto_with_dummy_credentials

    with moto_with_dummy_credentials() as server:
        yield server.url


def test_aws_tunnel_mode_reaches_waa_through_ssh_and_opens_only_ssh(moto_url, sshd, sim, tmp_path):
    import boto3

    from adapters.vms.aws import AWSProvider, AWSSettings
    from adapters.waa.client import WAAClient

    settings = AWSSettings(
        region="us-east-1", ami_id="ami-1e749f67", controller_cidr=CONTROLLER, owner="ci@example.com",
        endpoint_url=moto_url, max_attempts=2, ready_timeout=20, ready_poll_seconds=0.05, waiter_delay=0.05,
        security_group_delete_timeout=0, baseline_snapshot=False, **tunnel_settings(sshd, sim, tmp_path),
    )
    assert AWSSettings(region="r", ami_id="a", controller_cidr=CONTROLLER, owner="o").ssh_user == "ubuntu"
    provider = AWSProvider(settings, "tun", ssh_address_for=lambda vm: ("127.0.0.1", sshd.port))
    raw = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)
    vm = provider.create("v")
    try:
        assert_tunnel_url(vm.base_url, sim)
        assert vm.devtools_url.startswith("http://127.0.0.1:") and vm.devtools_url != vm.base_url
        assert WAAClient(vm.base_url).probe()
        assert requests.get(vm.base_url + "/probe", timeout=5).json()["status"] == "Probe successful"
        host, port = provider._qmp_address(vm)
        assert host == "127.0.0.1" and f":{port}" not in (vm.base_url, vm.devtools_url)
        assert vm.details["ssh"] == f"{sshd.user}@127.0.0.1:{sshd.port}"
        # The host key is pinned under the instance id, not the (recyclable) address.
        assert (tmp_path / "known_hosts").read_text().startswith(f"waa-aws-{vm.details['instance_id']} ")

        (group,) = raw.describe_security_groups(
            Filters=[{"Name": "group-name", "Values": ["waa-arena-tun"]}])["SecurityGroups"]
        assert [(r["IpProtocol"], r["FromPort"], r["ToPort"], [x["CidrIp"] for x in r["IpRanges"]])
                for r in group["IpPermissions"]] == [("tcp", 22, 22, [CONTROLLER])]
        assert len(ssh_pids(tmp_path)) == 1
    finally:
        provider.delete(vm)
    assert ssh_pids(tmp_path) == set()
    assert "waa-aws-" not in (tmp_path / "known_hosts").read_text()  # forgotten with the VM
    with pytest.raises(requests.ConnectionError):
        requests.get(vm.base_url + "/probe", timeout=2)
    provider.close()
    provider.close()


def test_aws_cidr_mode_still_opens_the_four_ports(moto_url):
    from adapters.vms.aws import AWSProvider, AWSSettings

    settings = AWSSettings(region="us-east-1", ami_id="ami-1e749f67", controller_cidr=CONTROLLER, owner="o",
                           endpoint_url=moto_url)
    ports = [r["FromPort"] for r in AWSProvider(settings, "cidr")._ingress_rules()]
    assert ports == [22, 5000, 7200, 9222]
    tunnel = AWSProvider(settings.model_copy(update={"access": "tunnel", "ssh_port": 2222}), "t")._ingress_rules()
    assert [r["FromPort"] for r in tunnel] == [2222]


# -- Azure --------------------------------------------------------------------------------------


def test_azure_tunnel_mode_nsg_opens_only_ssh_and_waa_answers_through_ssh(sshd, sim, tmp_path):
    pytest.importorskip("azure.mgmt.compute")
    pytest.importorskip("azure.mgmt.network")
    pytest.importorskip("trustme")
    from fake_arm import FakeARM

    from adapters.vms.azure import AzureProvider, AzureSettings

    class FakeCredential:
        def get_token(self, *scopes: str, **kwargs: object):
            from azure.core.credentials import AccessToken

            return AccessToken("fake-arm-token", int(time.time()) + 3600)

    def settings_for(arm: FakeARM, **overrides: object) -> AzureSettings:
        return AzureSettings(**{
            "subscription_id": arm.subscription_id, "resource_group": arm.resource_group, "locations": ["westeurope"],
            "image_id": (f"/subscriptions/{arm.subscription_id}/resourceGroups/rg-images/providers/"
                         "Microsoft.Compute/galleries/waa/images/waa-host/versions/1.0.0"),
            "ssh_public_key": sshd.client_key.with_suffix(".pub").read_text(), "controller_cidr": CONTROLLER,
            "owner": "ci@example.com", "ready_timeout": 10, "ready_poll_seconds": 0.1, "polling_interval": 0,
            "retry_total": 3, "base_url": arm.base_url, "connection_verify": arm.ca_path, **overrides,
        })

    arm = FakeARM()
    try:
        settings = settings_for(arm, **tunnel_settings(sshd, sim, tmp_path))
        assert settings.ssh_user == sshd.user
        assert settings_for(arm).ssh_user == settings_for(arm).admin_username  # the user osProfile creates
        provider = AzureProvider(settings, "run1", credential=FakeCredential(),
                                 ssh_address_for=lambda vm: ("127.0.0.1", sshd.port))
        vm = provider.create("vm-t")
        assert_tunnel_url(vm.base_url, sim)
        assert requests.get(vm.base_url + "/probe", timeout=5).json()["status"] == "Probe successful"
        assert provider._qmp(vm)[0] == "127.0.0.1"
        (nsg_put,) = arm.calls("PUT", "/networkSecurityGroups/")
        rules = nsg_put.body["properties"]["securityRules"]
        allows = [r["properties"] for r in rules if r["properties"]["access"] == "Allow"]
        assert [(r["destinationPortRange"], r["sourceAddressPrefix"]) for r in allows] == [("22", CONTROLLER)]
        assert any(r["properties"]["access"] == "Deny" for r in rules)
        assert arm.get("Microsoft.Network/networkInterfaces", "waa-run1-vm-t-nic") is not None
        alias = vm.details["ssh_host_key_alias"]
        assert alias.startswith("waa-azure-") and alias in (tmp_path / "known_hosts").read_text()
        assert len(ssh_pids(tmp_path)) == 1
        provider.delete(vm)
        assert ssh_pids(tmp_path) == set()
        provider.close()
    finally:
        arm.close()
