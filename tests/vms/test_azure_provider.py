"""The Azure provider against a fake ARM server over loopback TLS, with the WAA simulation as every VM.

The real azure-mgmt-compute / azure-mgmt-network clients talk to ``fake_arm.FakeARM`` (trustme CA,
``connection_verify``), so serialization, LRO polling, retries and the bearer-token policy are the
SDK's own. Every VM's WAA URL is mapped to one local WAA simulation process.
"""

from __future__ import annotations

import datetime as dt
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from installed import require

require("azure.mgmt.compute", "azure.mgmt.network", "trustme")

from azure.core.credentials import AccessToken  # noqa: E402
from fake_arm import FakeARM  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from adapters.vms.azure import AzureProvider, AzureSettings  # noqa: E402
from adapters.vms.base import (  # noqa: E402
    TAG_EXPIRES_AT,
    TAG_MANAGED,
    TAG_OWNER,
    TAG_RUN_ID,
    CapacityError,
    OwnedResource,
    ProviderError,
    ResetLevel,
)
from adapters.waa.localenv.launcher import start_local_env  # noqa: E402

pytestmark = pytest.mark.timeout(60)

VM_TYPE = "Microsoft.Compute/virtualMachines"
DISK_TYPE = "Microsoft.Compute/disks"
SNAP_TYPE = "Microsoft.Compute/snapshots"
NIC_TYPE = "Microsoft.Network/networkInterfaces"
PIP_TYPE = "Microsoft.Network/publicIPAddresses"
NSG_TYPE = "Microsoft.Network/networkSecurityGroups"
VNET_TYPE = "Microsoft.Network/virtualNetworks"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly0000000000000000000 test@controller"


class FakeCredential:
    """Only get_token, as the SDK's bearer policy needs; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        self.calls += 1
        return AccessToken("fake-arm-token", int(time.time()) + 3600)


@pytest.fixture(scope="module")
def waa_sim(tmp_path_factory: pytest.TempPathFactory):
    handle = start_local_env(tmp_path_factory.mktemp("azure-waa-sim"))
    yield handle
    handle.stop()


@pytest.fixture
def arm():
    fake = FakeARM()
    yield fake
    fake.close()


def settings_for(arm: FakeARM, **overrides: object) -> AzureSettings:
    values: dict[str, object] = dict(
        subscription_id=arm.subscription_id,
        resource_group=arm.resource_group,
        locations=["westeurope", "northeurope"],
        image_id=(f"/subscriptions/{arm.subscription_id}/resourceGroups/rg-images/providers/Microsoft.Compute/"
                  "galleries/waa/images/waa-host/versions/1.0.0"),
        ssh_public_key=SSH_KEY,
        controller_cidr="203.0.113.7/32",
        owner="ci@example.com",
        ttl_hours=6,
        ready_timeout=10,
        ready_poll_seconds=0.1,
        polling_interval=0,
        retry_total=3,
        base_url=arm.base_url,
        connection_verify=arm.ca_path,
    )
    values.update(overrides)
    return AzureSettings(**values)


@pytest.fixture
def make_provider(arm: FakeARM, waa_sim):
    def make(run_id: str = "run1", credential: FakeCredential | None = None, qmp_address_for=None,
             **overrides: object) -> AzureProvider:
        return AzureProvider(settings_for(arm, **overrides), run_id, credential=credential or FakeCredential(),
                             waa_url_for=lambda vm: waa_sim.base_url, qmp_address_for=qmp_address_for)

    return make


def counts(arm: FakeARM) -> dict[str, int]:
    out: dict[str, int] = {}
    for res in arm.resources.values():
        out[res["type"]] = out.get(res["type"], 0) + 1
    return out


def vm_puts(arm: FakeARM) -> list[tuple[str, str, str]]:
    return [(r.path.rsplit("/", 1)[1], r.body["properties"]["hardwareProfile"]["vmSize"], r.body["location"])
            for r in arm.calls("PUT", "/virtualMachines/")]


# -- lifecycle ---------------------------------------------------------------------------------


def test_pool_of_three_created_then_deleted_leaves_nothing(arm: FakeARM, make_provider, waa_sim) -> None:
    credential = FakeCredential()
    provider = make_provider(credential=credential)
    with ThreadPoolExecutor(max_workers=3) as pool:
        handles = list(pool.map(provider.create, [f"waa-run1-{i}" for i in range(3)]))

    assert [h.vm_id for h in handles] == ["waa-run1-0", "waa-run1-1", "waa-run1-2"]
    assert all(h.base_url == waa_sim.base_url and h.provider == "azure" for h in handles)
    assert {h.details["azure_name"] for h in handles} == {"waa-run1-0", "waa-run1-1", "waa-run1-2"}
    assert all(h.details["public_ip"].startswith("203.0.113.") for h in handles)
    assert all(h.devtools_url == f"http://{h.details['public_ip']}:9222" for h in handles)
    assert credential.calls >= 1
    assert counts(arm) == {VM_TYPE: 3, DISK_TYPE: 3, SNAP_TYPE: 3, NIC_TYPE: 3, PIP_TYPE: 3, NSG_TYPE: 1, VNET_TYPE: 1}
    # Every request carried an api-version; every resource (OS disks included) carries our tags + its name.
    assert all(r.api_version for r in arm.requests if not r.path.startswith("/fake-operations"))
    owned = provider.list_owned()
    assert len(owned) == 17
    assert [o.kind for o in owned][:3] == ["virtual_machine"] * 3
    for res in owned:
        assert res.tags[TAG_MANAGED] == "true"
        assert res.tags[TAG_RUN_ID] == "run1" and res.tags[TAG_OWNER] == "ci@example.com"
        assert res.tags[TAG_EXPIRES_AT].endswith("Z")
        assert res.tags["waa-arena-name"] == res.resource_id.rsplit("/", 1)[1]
        assert not res.expired()
    disk = arm.get(DISK_TYPE, "waa-run1-0-osdisk")
    assert disk["tags"]["waa-arena-vm"] == "waa-run1-0" and disk["managedBy"].endswith("/waa-run1-0")
    vm_body = arm.calls("PUT", "/virtualMachines/waa-run1-0")[0].body
    linux = vm_body["properties"]["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert linux["ssh"]["publicKeys"][0]["keyData"] == SSH_KEY
    assert vm_body["properties"]["storageProfile"]["imageReference"]["id"].endswith("/versions/1.0.0")
    assert vm_body["properties"]["hardwareProfile"]["vmSize"] == "Standard_D8ds_v5"

    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(provider.delete, handles))
    assert provider.list_owned() == []
    assert arm.resources == {}
    provider.delete(handles[0])  # deleting a gone VM is not an error


def test_retried_create_does_not_duplicate(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    first = provider.create("vm-a")
    before = counts(arm)
    second = provider.create("vm-a")
    assert second.details["resource_id"] == first.details["resource_id"]
    assert first.details["azure_name"] == "waa-run1-vm-a"
    assert counts(arm) == before
    assert len(arm.calls("PUT", "/virtualMachines/")) == 1
    assert len(arm.calls("PUT", "/networkInterfaces/")) == 1
    assert len(arm.calls("PUT", "/publicIPAddresses/")) == 1

    # A create that failed half-way (VM LRO ended Failed) is retried without duplicating its network.
    arm.fail_lro("PUT", "/virtualMachines/waa-run1-vm-b", code="OSProvisioningInternalError",
                 message="OS provisioning failed")
    with pytest.raises(ProviderError) as info:
        provider.create("vm-b")
    assert not isinstance(info.value, CapacityError)
    assert "waa-run1-vm-b" in str(info.value) and "OSProvisioningInternalError" in str(info.value)
    assert arm.get(VM_TYPE, "waa-run1-vm-b")["properties"]["provisioningState"] == "Failed"
    provider.create("vm-b")
    assert arm.get(VM_TYPE, "waa-run1-vm-b")["properties"]["provisioningState"] == "Succeeded"
    assert len(arm.calls("PUT", "/networkInterfaces/waa-run1-vm-b-nic")) == 1
    assert counts(arm)[VM_TYPE] == 2 and counts(arm)[NIC_TYPE] == 2 and counts(arm)[PIP_TYPE] == 2
    assert len(arm.calls("PUT", "/networkSecurityGroups/")) == 1  # the run's NSG was reused, not rewritten
    assert len(arm.calls("PUT", "/virtualNetworks/")) == 1


def test_throttling_is_retried_honouring_retry_after(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    arm.throttle("GET", "/virtualMachines/waa-run1-vm-t", retry_after=1)
    start = time.monotonic()
    handle = provider.create("vm-t")
    elapsed = time.monotonic() - start
    gets = arm.calls("GET", "/virtualMachines/waa-run1-vm-t")
    assert [g.status for g in gets[:2]] == [429, 404]
    assert elapsed >= 1.0
    assert handle.details["azure_name"] == "waa-run1-vm-t"


def test_capacity_falls_back_to_the_next_size_then_location(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    arm.capacity(size="Standard_D8ds_v5", location="westeurope", code="AllocationFailed")  # an LRO ending Failed
    vm_a = provider.create("vm-a")
    assert (vm_a.details["vm_size"], vm_a.details["location"]) == ("Standard_D8s_v5", "westeurope")
    assert vm_puts(arm) == [("waa-run1-vm-a", "Standard_D8ds_v5", "westeurope"),
                            ("waa-run1-vm-a", "Standard_D8s_v5", "westeurope")]

    arm.clear_log()
    arm.capacity(size="Standard_D8s_v5", location="westeurope", code="SkuNotAvailable")  # a sync 409
    vm_b = provider.create("vm-b")
    assert (vm_b.details["vm_size"], vm_b.details["location"]) == ("Standard_D8ds_v5", "northeurope")
    assert vm_puts(arm) == [("waa-run1-vm-b", "Standard_D8ds_v5", "westeurope"),
                            ("waa-run1-vm-b", "Standard_D8s_v5", "westeurope"),
                            ("waa-run1-vm-b", "Standard_D8ds_v5", "northeurope")]
    # vm-b's network moved with it; each location has its own NSG and VNet.
    assert arm.get(NIC_TYPE, "waa-run1-vm-b-nic")["location"] == "northeurope"
    assert {r["location"] for r in arm.of_type(NSG_TYPE)} == {"westeurope", "northeurope"}

    provider.delete(vm_a)
    provider.delete(vm_b)
    assert arm.resources == {}


def test_capacity_exhausted_everywhere_raises_capacity_error(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    arm.capacity(code="OperationNotAllowed")  # core quota, every size, every location
    with pytest.raises(CapacityError) as info:
        provider.create("vm-x")
    message = str(info.value)
    assert "waa-run1-vm-x" in message
    for attempt in ("Standard_D8ds_v5@westeurope", "Standard_D8s_v5@westeurope", "Standard_D8ds_v5@northeurope",
                    "Standard_D8s_v5@northeurope"):
        assert attempt in message
    assert len(arm.calls("PUT", "/virtualMachines/")) == 4
    assert arm.resources == {}  # no NIC, IP, NSG or VNet left behind


def test_lro_failed_raises_provider_error_naming_the_resource(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    arm.fail_lro("PUT", "/networkInterfaces/", code="InternalServerError", message="NRP hiccup")
    with pytest.raises(ProviderError) as info:
        provider.create("vm-n")
    assert not isinstance(info.value, CapacityError)
    assert "NIC waa-run1-vm-n-nic" in str(info.value) and "InternalServerError" in str(info.value)
    assert arm.calls("PUT", "/virtualMachines/") == []
    provider.create("vm-n")  # the failed NIC is replaced on retry
    assert arm.get(NIC_TYPE, "waa-run1-vm-n-nic")["properties"]["provisioningState"] == "Succeeded"


# -- network security ------------------------------------------------------------------------


def test_nsg_opens_the_four_ports_only_to_the_controller(arm: FakeARM, make_provider) -> None:
    provider = make_provider(controller_cidr="198.51.100.0/24")
    provider.create("vm-s")
    (nsg_put,) = arm.calls("PUT", "/networkSecurityGroups/")
    rules = [r["properties"] | {"name": r["name"]} for r in nsg_put.body["properties"]["securityRules"]]
    allows = [r for r in rules if r["access"] == "Allow"]
    denies = [r for r in rules if r["access"] == "Deny"]
    assert sorted(r["destinationPortRange"] for r in allows) == ["22", "5000", "7200", "9222"]
    assert all(r["sourceAddressPrefix"] == "198.51.100.0/24" and r["direction"] == "Inbound"
               and r["protocol"] == "Tcp" for r in allows)
    assert all("sourceAddressPrefixes" not in r and "destinationPortRanges" not in r for r in rules)
    assert len(denies) == 1
    deny = denies[0]
    assert (deny["sourceAddressPrefix"], deny["destinationPortRange"], deny["protocol"]) == ("Internet", "*", "*")
    assert deny["priority"] > max(r["priority"] for r in allows)
    nic = arm.get(NIC_TYPE, "waa-run1-vm-s-nic")
    assert nic["properties"]["networkSecurityGroup"]["id"] == nsg_put.path


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "*", "Internet", "any", "10.0.0.0/16", "203.0.112.0/23", "::/0",
                                  "2001:db8::/48", "not-an-address"])
def test_bad_controller_cidr_is_refused(cidr: str) -> None:
    with pytest.raises(ValidationError, match="controller_cidr"):
        AzureSettings(subscription_id="s", resource_group="rg", location="westeurope", owner="me",
                      image_id="/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/images/waa",
                      ssh_public_key=SSH_KEY, controller_cidr=cidr)


def test_settings_normalise_and_require_a_cidr(arm: FakeARM) -> None:
    assert settings_for(arm, controller_cidr="203.0.113.7").controller_cidr == "203.0.113.7/32"
    assert settings_for(arm, controller_cidr="203.0.113.77/24").controller_cidr == "203.0.113.0/24"
    values = settings_for(arm).model_dump()
    values.pop("controller_cidr")
    with pytest.raises(ValidationError, match="controller_cidr"):
        AzureSettings(**values)
    with pytest.raises(ValidationError, match="ssh_public_key"):
        settings_for(arm, ssh_public_key="-----BEGIN OPENSSH PRIVATE KEY-----\nabc")
    assert AzureSettings(**(values | {"controller_cidr": "203.0.113.7/32", "base_url": "https://management.azure.com",
                                      "connection_verify": None})).vm_sizes == ["Standard_D8ds_v5", "Standard_D8s_v5"]


def test_private_only_mode_creates_no_public_ip(arm: FakeARM, waa_sim) -> None:
    provider = AzureProvider(settings_for(arm, public_ip=False), "run1", credential=FakeCredential())
    # Without waa_url_for the handle points at the NIC's private address.
    provider._wait_for_waa = lambda vm, when: 0.0  # the fake's 10.42.0.x addresses do not exist here
    handle = provider.create("vm-p")
    assert arm.of_type(PIP_TYPE) == []
    assert handle.base_url.startswith("http://10.42.0.") and handle.base_url.endswith(":5000")
    assert "publicIPAddress" not in arm.get(NIC_TYPE, "waa-run1-vm-p-nic")["properties"]["ipConfigurations"][0][
        "properties"]


# -- reset, stop ---------------------------------------------------------------------------


def test_disk_reset_swaps_the_os_disk_in_order(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    vm = provider.create("vm-d")
    old_disk_id = arm.get(VM_TYPE, "waa-run1-vm-d")["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"]
    arm.clear_log()
    provider.reset(vm, ResetLevel.DISK)

    steps = [(r.method, r.path.split("/providers/", 1)[-1]) for r in arm.requests
             if r.method != "GET" and not r.path.startswith("/fake-operations")]
    kinds = [f"{m} {p.split('/')[1]}{'/' + p.split('/')[3] if len(p.split('/')) > 3 else ''}" for m, p in steps]
    assert kinds == ["POST virtualMachines/deallocate", "PUT disks", "PUT virtualMachines",
                     "POST virtualMachines/start", "DELETE disks"]
    disk_put = arm.calls("PUT", "/disks/")[0]
    assert disk_put.body["properties"]["creationData"] == {
        "createOption": "Copy", "sourceResourceId": arm.rid(SNAP_TYPE, "waa-run1-vm-d-baseline")}
    new_disk_id = disk_put.path
    vm_put = arm.calls("PUT", "/virtualMachines/")[0]
    assert vm_put.body["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"].lower() == new_disk_id.lower()
    assert arm.calls("DELETE", "/disks/")[0].path.lower() == old_disk_id.lower()

    current = arm.get(VM_TYPE, "waa-run1-vm-d")
    assert current["properties"]["storageProfile"]["osDisk"]["managedDisk"]["id"].lower() == new_disk_id.lower()
    assert arm.resources[new_disk_id.lower()]["tags"]["waa-arena-vm"] == "waa-run1-vm-d"
    assert old_disk_id.lower() not in arm.resources
    assert vm.details["os_disk_id"].lower() == new_disk_id.lower()
    (timing,) = provider.reset_timings
    assert timing.level is ResetLevel.DISK and timing.seconds > 0
    assert list(timing.steps) == ["deallocate", "disk_from_snapshot", "vm_put", "start", "wait_waa",
                                  "delete_old_disk"]

    provider.reset(vm, ResetLevel.DISK)  # again, from the same baseline
    provider.delete(vm)
    assert arm.resources == {}


def test_setup_reset_does_nothing_and_stop_deallocates(arm: FakeARM, make_provider) -> None:
    provider = make_provider()
    vm = provider.create("vm-s")
    arm.clear_log()
    provider.reset(vm, ResetLevel.SETUP)
    assert arm.requests == []
    provider.stop(vm)
    assert [r.path.rsplit("/", 1)[1] for r in arm.calls("POST")] == ["deallocate"]
    assert arm.resources[arm.rid(VM_TYPE, "waa-run1-vm-s").lower()]["_power"] == "deallocated"
    # create() of a deallocated VM starts it rather than making a new one.
    provider.create("vm-s")
    assert [r.path.rsplit("/", 1)[1] for r in arm.calls("POST")] == ["deallocate", "start"]
    assert len(arm.calls("PUT", "/virtualMachines/")) == 0
    assert provider.supported_reset_levels() == {ResetLevel.SETUP, ResetLevel.REBOOT, ResetLevel.DISK}


def test_snapshot_and_reboot_go_through_the_qemu_monitor(arm: FakeARM, make_provider) -> None:
    pytest.importorskip("adapters.vms.guest_reset")
    fake_qmp = pytest.importorskip("fake_qmp")
    with fake_qmp.FakeQMPServer() as qmp:
        provider = make_provider(guest_snapshot=True, qmp_address_for=lambda vm: qmp.address)
        vm = provider.create("vm-q")
        assert vm.details["guest_snapshot"] == "waa-baseline"
        provider.reset(vm, ResetLevel.SNAPSHOT)
        provider.reset(vm, ResetLevel.REBOOT)
        lines = qmp.command_lines()
    assert any(line.startswith("savevm waa-baseline") for line in lines)
    assert any(line.startswith("loadvm waa-baseline") for line in lines)
    assert "system_reset" in qmp.executed()
    assert [t.level for t in provider.reset_timings] == [ResetLevel.SNAPSHOT, ResetLevel.REBOOT]
    assert ResetLevel.SNAPSHOT in provider.supported_reset_levels()


# -- janitor -------------------------------------------------------------------------------


def test_janitor_removes_only_expired_tagged_resources(arm: FakeARM, make_provider) -> None:
    old = make_provider(run_id="old", ttl_hours=1)
    new = make_provider(run_id="new", ttl_hours=72)
    old.create("vm-0")
    new.create("vm-0")
    untagged_disk = arm.add_resource(DISK_TYPE, "someone-elses-disk", properties={"diskSizeGB": 64})
    foreign_nic = arm.add_resource(NIC_TYPE, "team-b-nic", tags={"team": "b", TAG_EXPIRES_AT: "2000-01-01T00:00:00Z"})
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)

    owned = new.list_owned()  # any provider of the resource group sees every managed resource
    assert {o.tags[TAG_RUN_ID] for o in owned} == {"old", "new"}
    assert untagged_disk not in {o.resource_id for o in owned} and foreign_nic not in {o.resource_id for o in owned}
    expired = [o for o in owned if o.expired(later)]
    assert {o.tags[TAG_RUN_ID] for o in expired} == {"old"} and len(expired) == 7
    for resource in expired:  # list_owned's order: VMs first, then what depended on them
        new.delete_resource(resource)

    left = new.list_owned()
    assert {o.tags[TAG_RUN_ID] for o in left} == {"new"} and len(left) == 7
    assert untagged_disk.lower() in arm.resources and foreign_nic.lower() in arm.resources
    assert not any("/waa-old-" in key for key in arm.resources)

    # The janitor's tool refuses a resource without our tag, whatever the caller claims.
    forged = OwnedResource("azure", "disk", untagged_disk, {TAG_MANAGED: "true"})
    with pytest.raises(ProviderError, match="lacks"):
        new.delete_resource(forged)
    assert untagged_disk.lower() in arm.resources


def test_janitor_sweep_deletes_expired_azure_resources_in_a_working_order(arm: FakeARM, make_provider) -> None:
    janitor = pytest.importorskip("adapters.vms.janitor")
    old = make_provider(run_id="old", ttl_hours=1)
    new = make_provider(run_id="new", ttl_hours=72)
    old.create("vm-0")
    old.create("vm-1")
    new.create("vm-0")
    untagged = arm.add_resource(PIP_TYPE, "hand-made-ip")
    report = janitor.sweep(new, now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1))
    assert report.failed == []
    assert len(report.deleted) == 12 and {r.tags[TAG_RUN_ID] for r in report.deleted} == {"old"}
    assert {r.tags[TAG_RUN_ID] for r in new.list_owned()} == {"new"}
    assert untagged.lower() in arm.resources
