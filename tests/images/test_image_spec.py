"""The build spec (bad input named by field), URL redaction, and tag -> digest resolution against
a tiny registry on 127.0.0.1 (anonymous Bearer challenge, as Docker Hub)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from adapters.images.container_registry import RegistryError, parse_reference, resolve_digest
from adapters.images.plan import plan_container
from adapters.images.provenance import TAG_CONTAINER_DIGEST
from adapters.images.spec import BuildSpec, redact_url, spec_error_text

ISO = "https://s.example.com/win11.iso"


def _spec(**overrides: object) -> BuildSpec:
    values: dict[str, object] = dict(provider="aws", name="b1", container_image="windowsarena/winarena:latest",
                                     windows_iso_url=ISO)
    values.update(overrides)
    return BuildSpec(**values)


@pytest.mark.parametrize("overrides,field", [
    ({"name": "Bad_Name"}, "name"),
    ({"container_image": None}, "container_image"),
    ({"waa_repo": "https://github.com/x/y.git", "waa_commit": "a" * 40}, "container_image"),
    ({"container_image": None, "waa_repo": "https://github.com/x/y.git"}, "waa_commit"),
    ({"container_image": None, "waa_repo": "https://github.com/x/y.git", "waa_commit": "abc123"}, "waa_commit"),
    ({"windows_iso_url": None}, "windows_iso_url"),
    ({"prepared_storage_url": "https://s.example.com/storage.tar"}, "prepared_storage_url"),
    ({"windows_iso_url": "http://s.example.com/win11.iso"}, "windows_iso_url"),
    ({"windows_iso_url": None, "prepared_storage_url": "https://s.example.com/storage.rar"}, "prepared_storage_url"),
    ({"builder_size": "m5.2xlarge"}, "builder_size"),
    ({"provider": "azure", "builder_size": "Standard_B2s"}, "builder_size"),
    ({"base_image": "ubuntu"}, "base_image"),
    ({"disk_gb": 10}, "disk_gb"),
    ({"vm_ram": "8GB;reboot"}, "vm_ram"),
    ({"provider": "gcp"}, "provider"),
])
def test_bad_input_is_one_error_naming_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        _spec(**overrides)
    text = spec_error_text(info.value)
    assert field in text and "\n" not in text


def test_good_specs_and_defaults() -> None:
    aws = _spec()
    assert aws.size == "m8i.2xlarge" and aws.run_id == "image-b1" and aws.windows_source_kind == "iso"
    assert _spec(provider="azure").size == "Standard_D8ds_v5"
    assert _spec(builder_size="c8i.4xlarge").size == "c8i.4xlarge"
    assert _spec(builder_size="m7i.metal-24xl".replace("-24xl", "")).size == "m7i.metal"
    storage = _spec(windows_iso_url=None, prepared_storage_url="https://s.example.com/snap.tar.zst?sig=1")
    assert storage.windows_source_kind == "prepared-storage"


def test_redaction_drops_query_fragment_and_credentials() -> None:
    url = "https://user:pass@acct.blob.core.windows.net:443/c/win11.iso?sv=2024&sig=SECRET#frag"
    assert redact_url(url) == "https://acct.blob.core.windows.net:443/c/win11.iso"


def test_a_tag_resolves_to_its_digest_through_a_bearer_challenge(registry) -> None:
    digest = registry.push("windowsarena/winarena", "latest")
    ref = resolve_digest(f"{registry.host}/windowsarena/winarena:latest")
    assert ref.digest == digest and ref.pinned == f"{registry.host}/windowsarena/winarena@{digest}"
    methods = [(m, p, a.startswith("Bearer")) for m, p, a in registry.requests]
    assert methods == [("HEAD", "/v2/windowsarena/winarena/manifests/latest", False), ("GET", "/token", False),
                       ("HEAD", "/v2/windowsarena/winarena/manifests/latest", True)]


def test_a_digest_reference_is_not_looked_up_and_docker_hub_defaults_apply(registry) -> None:
    pinned = "windowsarena/winarena@sha256:" + "0" * 64
    assert resolve_digest(pinned).pinned == pinned and registry.requests == []
    hub = parse_reference("ubuntu")
    assert (hub.registry, hub.repository, hub.tag) == ("registry-1.docker.io", "library/ubuntu", "latest")


def test_an_unresolvable_tag_is_recorded_as_a_tag_with_a_warning(registry) -> None:
    spec = _spec(container_image=f"{registry.host}/windowsarena/winarena:missing")
    with pytest.raises(RegistryError, match="no such tag"):
        resolve_digest(str(spec.container_image))
    warnings: list[str] = []
    plan, record = plan_container(spec, warn=warnings.append)
    assert plan.reference == spec.container_image and record.digest is None
    assert warnings and "digest not resolved" in warnings[0]
    from adapters.images.plan import builder_tags

    assert builder_tags(spec, record, "ami-1")[TAG_CONTAINER_DIGEST] == "unresolved"
