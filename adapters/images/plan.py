"""What the builder will run, decided once when the builder is created, and how it is recorded.

The container is pinned by digest when the registry can be asked (container_registry); when it
cannot (no network to the registry from the controller, a private registry), the tag is used and
the provenance says `unresolved` with the reason. The plan is written onto the builder VM as tags
(`builder_tags`), and the capture copies it from there (`provenance_from_builder`), so a resumed
build records what the builder actually pulled even if the tag has moved since.
"""

from __future__ import annotations

from collections.abc import Callable

from adapters.images.cloud_init import ContainerPlan
from adapters.images.container_registry import ImageReference, RegistryError, parse_reference, resolve_digest
from adapters.images.provenance import (
    ROLE_BUILDER,
    TAG_BUILD,
    TAG_BUILDER_BASE_IMAGE,
    TAG_BUILDER_SIZE,
    TAG_CONTAINER,
    TAG_CONTAINER_DIGEST,
    TAG_ROLE,
    TAG_WAA_COMMIT,
    TAG_WAA_REPO,
    TAG_WINDOWS_SOURCE,
    TAG_WINDOWS_SOURCE_URL,
    ContainerProvenance,
)
from adapters.images.spec import BuildSpec, redact_url

Resolver = Callable[[str], ImageReference]


def plan_container(spec: BuildSpec, resolver: Resolver = resolve_digest,
                   warn: Callable[[str], None] | None = None) -> tuple[ContainerPlan, ContainerProvenance]:
    """The container the builder pulls (by digest when resolvable) or builds, and its record."""
    if spec.waa_repo:
        return (ContainerPlan(repo=spec.waa_repo, commit=spec.waa_commit),
                ContainerProvenance(repo=spec.waa_repo, commit=spec.waa_commit))
    reference = str(spec.container_image)
    try:
        resolved = resolver(reference)
    except RegistryError as exc:
        if warn is not None:
            warn(f"container {reference}: digest not resolved ({exc}); the builder pulls the tag and the image "
                 "records the tag only")
        return ContainerPlan(reference=reference), ContainerProvenance(reference=reference,
                                                                      unresolved_reason=str(exc))
    return (ContainerPlan(reference=resolved.pinned),
            ContainerProvenance(reference=resolved.pinned, digest=resolved.digest))


def builder_tags(spec: BuildSpec, container: ContainerProvenance, base_image: str) -> dict[str, str]:
    """The build's identity and the container plan, put on the builder VM (besides ownership tags)."""
    tags = {
        TAG_BUILD: spec.name,
        TAG_ROLE: ROLE_BUILDER,
        TAG_WINDOWS_SOURCE: spec.windows_source_kind,
        TAG_WINDOWS_SOURCE_URL: redact_url(spec.windows_source_url)[:256],
        TAG_BUILDER_SIZE: spec.size,
        TAG_BUILDER_BASE_IMAGE: base_image,
    }
    if container.repo:
        tags[TAG_WAA_REPO] = redact_url(container.repo)[:256]
        tags[TAG_WAA_COMMIT] = container.commit or ""
    else:
        tags[TAG_CONTAINER] = (container.reference or "")[:256]
        tags[TAG_CONTAINER_DIGEST] = container.digest or "unresolved"
    return tags


def provenance_from_builder(tags: dict[str, str]) -> ContainerProvenance:
    """The container record written on the builder by `builder_tags`."""
    if tags.get(TAG_WAA_REPO):
        return ContainerProvenance(repo=tags[TAG_WAA_REPO], commit=tags.get(TAG_WAA_COMMIT))
    digest = tags.get(TAG_CONTAINER_DIGEST)
    return ContainerProvenance(reference=tags.get(TAG_CONTAINER),
                               digest=digest if digest and digest != "unresolved" else None)


def conflicts(spec: BuildSpec, recorded: dict[str, str]) -> list[str]:
    """How `spec` differs from what an earlier run of the same build name recorded in the cloud
    (the image's or the builder's tags); empty when they agree or nothing is recorded yet.

    A build name is the build's identity: resuming it with another source, container or size
    would mix two builds, so the flow refuses instead.
    """
    if not recorded:
        return []
    found: list[str] = []

    def check(tag: str, wanted: str | None, field: str) -> None:
        have = recorded.get(tag)
        if (have or "") != (wanted or ""):
            found.append(f"{field}: recorded {have or 'none'!r}, given {wanted or 'none'!r}")

    check(TAG_WINDOWS_SOURCE, spec.windows_source_kind, "windows source")
    check(TAG_WINDOWS_SOURCE_URL, redact_url(spec.windows_source_url)[:256], "windows source URL (without query)")
    check(TAG_BUILDER_SIZE, spec.size, "builder_size")
    if spec.waa_repo:
        check(TAG_WAA_REPO, redact_url(spec.waa_repo)[:256], "waa_repo")
        check(TAG_WAA_COMMIT, spec.waa_commit, "waa_commit")
    elif not recorded.get(TAG_CONTAINER):
        found.append(f"container_image: the build was made from {recorded.get(TAG_WAA_REPO) or 'another source'}")
    else:
        given, have = parse_reference(str(spec.container_image)), parse_reference(recorded[TAG_CONTAINER])
        if (given.registry, given.repository) != (have.registry, have.repository) or (
                given.digest and given.digest != recorded.get(TAG_CONTAINER_DIGEST)):
            found.append(f"container_image: recorded {recorded[TAG_CONTAINER]!r}, given {spec.container_image!r}")
    return found
