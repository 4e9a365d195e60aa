"""The image build on Azure against the fake ARM server over loopback TLS (with compute
galleries): a full build, kills after every stage, a rerun of a finished build."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

import pytest
import yaml
from fake_gallery import VERSION, FakeGalleryARM
from test_azure_provider import SSH_KEY, FakeCredential

from adapters.images.azure import AzureImageBuilder
from adapters.images.provenance import (
    TAG_BUILD,
    TAG_BUILDER_REGION,
    TAG_BUILDER_SIZE,
    TAG_VERIFIED,
    TAG_WAA_COMMIT,
    TAG_WAA_REPO,
    TAG_WINDOWS_SOURCE,
    TAG_WINDOWS_SOURCE_URL,
)
from adapters.images.spec import BuildSpec
from adapters.images.stages import Stage, run_build
from adapters.vms.azure import AzureSettings
from adapters.vms.base import TAG_EXPIRES_AT, TAG_MANAGED

COMMIT = "6d39ed8" + "0" * 33
STORAGE = "https://acct.blob.core.windows.net/waa/storage.tar.zst?sv=2024-01-01&sig=TOPSECRET"


@pytest.fixture()
def arm() -> Iterator[FakeGalleryARM]:
    fake = FakeGalleryARM(polls_before_done=0)
    yield fake
    fake.close()


def azure_settings(arm: FakeGalleryARM) -> AzureSettings:
    return AzureSettings(
        subscription_id=arm.subscription_id, resource_group=arm.resource_group, locations=["westeurope"],
        image_id=f"/subscriptions/{arm.subscription_id}/resourceGroups/{arm.resource_group}/providers/"
                 "Microsoft.Compute/images/none-yet",
        ssh_public_key=SSH_KEY, controller_cidr="203.0.113.7/32", owner="ci@example.com", ttl_hours=6,
        ready_timeout=10, ready_poll_seconds=0.05, polling_interval=0, retry_total=2, base_url=arm.base_url,
        connection_verify=arm.ca_path,
    )


def spec_for(**overrides: object) -> BuildSpec:
    values: dict[str, object] = dict(
        provider="azure", name="waa-host-1", waa_repo="https://github.com/microsoft/WindowsAgentArena.git",
        waa_commit=COMMIT, prepared_storage_url=STORAGE, ready_timeout=10, ready_poll_seconds=0.05,
        capture_timeout=10, capture_poll_seconds=0.02, verify_timeout=10,
    )
    values.update(overrides)
    return BuildSpec(**values)


@pytest.fixture()
def make_builder(arm, waa_sim) -> Callable[..., AzureImageBuilder]:
    made: list[AzureImageBuilder] = []

    def make(**overrides: object) -> AzureImageBuilder:
        builder = AzureImageBuilder(spec_for(**overrides), azure_settings(arm), credential=FakeCredential(),
                                    waa_url_for=lambda vm: waa_sim.base_url)
        made.append(builder)
        return builder

    yield make
    for builder in made:
        builder.close()


def _managed(arm: FakeGalleryARM) -> list[str]:
    return [r["id"] for r in arm.resources.values() if (r.get("tags") or {}).get(TAG_MANAGED) == "true"
            and "/galleries/" not in r["id"].lower()]


def test_full_build_leaves_one_verified_version_with_provenance_and_no_builder(make_builder, arm) -> None:
    builder = make_builder()
    image_id = run_build(builder, log=lambda _: None)
    versions = arm.of_type(VERSION)
    assert [v["id"] for v in versions] == [image_id] and image_id.endswith("/images/waa-host-1/versions/1.0.0")
    version = versions[0]
    tags = version["tags"]
    assert tags[TAG_VERIFIED] == "true" and tags[TAG_BUILD] == "waa-host-1" and tags[TAG_MANAGED] == "true"
    assert tags[TAG_WAA_REPO] == "https://github.com/microsoft/WindowsAgentArena.git" and tags[TAG_WAA_COMMIT] == COMMIT
    assert tags[TAG_WINDOWS_SOURCE] == "prepared-storage"
    assert tags[TAG_WINDOWS_SOURCE_URL] == "https://acct.blob.core.windows.net/waa/storage.tar.zst"
    assert "TOPSECRET" not in repr(arm.resources) and TAG_EXPIRES_AT not in tags
    assert tags[TAG_BUILDER_SIZE] == "Standard_D8ds_v5" and tags[TAG_BUILDER_REGION] == "westeurope"
    # Captured from the builder VM after it was shut down (deallocated).
    assert version["_source_type"] == "Microsoft.Compute/virtualMachines"
    assert version["_captured_power"] == "deallocated"
    definition = arm.get("Microsoft.Compute/galleries/waa_arena/images", "waa-host-1")
    assert definition["properties"]["osState"] == "Specialized"
    # The builder ran cloud-init from customData, from Ubuntu's marketplace image.
    builder_put = next(r for r in arm.calls("PUT", "/virtualmachines/waa-arena-img-waa-host-1") if r.body)
    profile = builder_put.body["properties"]
    assert profile["storageProfile"]["imageReference"]["publisher"] == "Canonical"
    user_data = base64.b64decode(profile["osProfile"]["customData"]).decode()
    assert user_data.startswith("#cloud-config\n") and "runcmd" in yaml.safe_load(user_data)
    # The verification VM booted from the new version (specialized: no osProfile).
    verify_put = next(r for r in arm.calls("PUT", "/virtualmachines/") if "verify" in r.path and r.body)
    assert verify_put.body["properties"]["storageProfile"]["imageReference"]["id"] == image_id
    assert "osProfile" not in verify_put.body["properties"]
    assert _managed(arm) == [] and builder.status().complete


def test_builder_nsg_opens_only_ssh_and_waa_to_the_controller(make_builder, arm) -> None:
    builder = make_builder()
    builder.ensure_builder()
    nsg = arm.get("Microsoft.Network/networkSecurityGroups", "waa-arena-img-waa-host-1-nsg")
    allowed = [(r["properties"]["sourceAddressPrefix"], r["properties"]["destinationPortRange"])
               for r in nsg["properties"]["securityRules"] if r["properties"]["access"] == "Allow"]
    assert allowed == [("203.0.113.7/32", "22"), ("203.0.113.7/32", "5000")]
    assert builder.status().done()[Stage.BUILDER] and not builder.status().done()[Stage.READY]
    builder.ensure_builder()  # again: nothing new
    assert len([r for r in arm.calls("PUT") if "/virtualmachines/" in r.lpath]) == 1
    builder.cleanup()
    assert _managed(arm) == []


def test_a_build_killed_after_each_stage_in_turn_resumes_without_duplicates(make_builder, arm) -> None:
    class Killed(Exception):
        pass

    for stage in Stage:
        def kill(done: Stage, stop: Stage = stage) -> None:
            if done is stop:
                raise Killed(stop.value)

        with pytest.raises(Killed):
            run_build(make_builder(), log=lambda _: None, after_stage=kill)
    builder = make_builder()
    image_id = run_build(builder, log=lambda _: None)
    vm_puts = [r for r in arm.calls("PUT") if "/virtualmachines/waa-arena-img-" in r.lpath]
    assert len(vm_puts) == 1
    assert [v["id"] for v in arm.of_type(VERSION)] == [image_id]
    assert len([r for r in arm.calls("PUT") if r.lpath.endswith("/versions/1.0.0")]) == 1
    assert _managed(arm) == [] and builder.status().complete


def test_a_finished_build_is_a_no_op(make_builder, arm) -> None:
    image_id = run_build(make_builder(), log=lambda _: None)
    arm.clear_log()
    lines: list[str] = []
    assert run_build(make_builder(), log=lines.append) == image_id
    assert lines == [f"image {image_id} of build waa-host-1 exists and is verified; nothing to do"]
    assert [r.method for r in arm.calls()] == ["GET"] * len(arm.calls())
