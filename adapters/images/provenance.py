"""The tags a built image (and each of its snapshots) carries: what it holds and how it was made.

Runs record the image id they booted (flows/provenance.py); these tags let anyone go from that id
to the WAA container digest or commit, the Windows source kind, the builder's size and region and
the build date, without the build's logs. URLs are recorded redacted (spec.redact_url): no query
string, so no SAS token or pre-signed signature ever lands in a tag.

The image carries the product's managed tag, owner and the build's run id, but no expiry: the
janitor deletes expired VMs, disks and networks, never an image someone may still boot.
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel

from adapters.images.spec import BuildSpec, redact_url
from adapters.vms.base import TAG_MANAGED, TAG_OWNER, TAG_RUN_ID

TAG_BUILD = "waa-arena-image-build"  # the build name, on the image and on every builder resource
TAG_ROLE = "waa-arena-image-role"  # builder | image | verify
TAG_VERIFIED = "waa-arena-image-verified"  # "true" once a VM booted from the image answered the probe
TAG_VERIFIED_AT = "waa-arena-image-verified-at"
TAG_READY = "waa-arena-image-builder-ready"  # on the builder: its WAA server answered /probe
TAG_CONTAINER = "waa-arena-waa-container"  # the reference (by digest when resolved)
TAG_CONTAINER_DIGEST = "waa-arena-waa-container-digest"  # sha256:..., or "unresolved"
TAG_WAA_REPO = "waa-arena-waa-repo"
TAG_WAA_COMMIT = "waa-arena-waa-commit"
TAG_WINDOWS_SOURCE = "waa-arena-windows-source"  # iso | prepared-storage
TAG_WINDOWS_SOURCE_URL = "waa-arena-windows-source-url"  # redacted
TAG_BUILDER_SIZE = "waa-arena-builder-size"
TAG_BUILDER_REGION = "waa-arena-builder-region"
TAG_BUILDER_BASE_IMAGE = "waa-arena-builder-base-image"
TAG_BUILT_AT = "waa-arena-built-at"

ROLE_BUILDER = "builder"
ROLE_IMAGE = "image"

_MAX_TAG_VALUE = 256  # both EC2 and Azure


class ContainerProvenance(BaseModel):
    """What is known about the WAA container the image runs."""

    reference: str | None = None  # as pulled (name@digest), or the tag when unresolved
    digest: str | None = None  # None: the tag could not be resolved to a digest
    unresolved_reason: str | None = None
    repo: str | None = None
    commit: str | None = None


def _clip(value: str) -> str:
    return value if len(value) <= _MAX_TAG_VALUE else value[: _MAX_TAG_VALUE - 3] + "..."


def provenance_tags(
    spec: BuildSpec,
    container: ContainerProvenance,
    *,
    owner: str,
    region: str,
    base_image: str,
    built_at: dt.datetime,
) -> dict[str, str]:
    """The image's tags (also put on its snapshots / versions)."""
    tags = {
        TAG_MANAGED: "true",
        TAG_OWNER: owner,
        TAG_RUN_ID: spec.run_id,
        TAG_BUILD: spec.name,
        TAG_ROLE: ROLE_IMAGE,
        TAG_WINDOWS_SOURCE: spec.windows_source_kind,
        TAG_WINDOWS_SOURCE_URL: redact_url(spec.windows_source_url),
        TAG_BUILDER_SIZE: spec.size,
        TAG_BUILDER_REGION: region,
        TAG_BUILDER_BASE_IMAGE: base_image,
        TAG_BUILT_AT: built_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        TAG_VERIFIED: "false",
    }
    if container.repo:
        tags[TAG_WAA_REPO] = redact_url(container.repo)
        tags[TAG_WAA_COMMIT] = container.commit or ""
    else:
        tags[TAG_CONTAINER] = container.reference or ""
        tags[TAG_CONTAINER_DIGEST] = container.digest or "unresolved"
    return {key: _clip(value) for key, value in tags.items()}
