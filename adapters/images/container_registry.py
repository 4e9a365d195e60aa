"""Resolve a container image tag to its content digest with the registry's v2 HTTP API.

A build pins the WAA container by digest, so the image records exactly which container it runs
and a tag moved later (`latest`) cannot change what a rebuild pulls. Docker Hub and other
registries answer an anonymous `HEAD /v2/<repo>/manifests/<tag>` after a Bearer token challenge
(`WWW-Authenticate: Bearer realm=...,service=...,scope=...`); the digest is the
`Docker-Content-Digest` header (of the manifest list / index for multi-platform images, which is
what `docker pull name@digest` wants).

Registries on a loopback address are spoken to over plain http (as Docker itself allows for
localhost); every other registry over https.
"""

from __future__ import annotations

import ipaddress
import re

import requests
from pydantic import BaseModel

from adapters.images.spec import REFERENCE_PATTERN

DOCKER_HUB = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
])
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


class RegistryError(RuntimeError):
    """The registry could not be asked, or did not give a digest; the message names the reference."""


class ImageReference(BaseModel):
    """A parsed container reference: where it lives and which tag / digest it names."""

    registry: str  # host[:port]; Docker Hub is registry-1.docker.io
    repository: str  # library/ubuntu, windowsarena/winarena
    tag: str | None = None
    digest: str | None = None

    @property
    def pinned(self) -> str:
        """The reference by digest (`repo@sha256:...`), as docker pull takes it; needs a digest."""
        if not self.digest:
            raise RegistryError(f"{self.display} has no digest")
        return f"{self._name()}@{self.digest}"

    @property
    def display(self) -> str:
        """The reference as the user would write it (tag and/or digest)."""
        text = self._name()
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def _name(self) -> str:
        if self.registry == DOCKER_HUB:
            return self.repository.removeprefix("library/")
        return f"{self.registry}/{self.repository}"


def parse_reference(reference: str) -> ImageReference:
    """Split `[registry/]repo[:tag][@digest]`; Docker Hub's defaults apply as `docker pull` does."""
    match = REFERENCE_PATTERN.match(reference)
    if not match:
        raise RegistryError(f"{reference!r} is not a container image reference")
    name, tag, digest = match.group("name"), match.group("tag"), match.group("digest")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name if "/" in name else f"library/{name}"
    if tag is None and digest is None:
        tag = "latest"
    return ImageReference(registry=registry, repository=repository, tag=tag, digest=digest)


def _is_loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bearer_token(session: requests.Session, challenge: str, timeout: float) -> str | None:
    """An anonymous token for a `WWW-Authenticate: Bearer ...` challenge, or None if not Bearer."""
    scheme, _, params = challenge.partition(" ")
    if scheme.lower() != "bearer":
        return None
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    realm = fields.pop("realm", None)
    if not realm:
        return None
    response = session.get(realm, params=fields, timeout=timeout)
    if response.status_code != 200:
        raise RegistryError(f"token endpoint {realm} answered {response.status_code}")
    body = response.json()
    token = body.get("token") or body.get("access_token")
    if not token:
        raise RegistryError(f"token endpoint {realm} gave no token")
    return str(token)


def resolve_digest(reference: str, *, timeout: float = 20.0, session: requests.Session | None = None) -> ImageReference:
    """The reference with its registry digest filled in (anonymous pull access).

    A reference that already names a digest is returned as is (nothing is asked). Raises
    RegistryError naming the reference when the registry cannot be reached, refuses, or answers
    without a valid digest.
    """
    ref = parse_reference(reference)
    if ref.digest:
        return ref
    scheme = "http" if _is_loopback(ref.registry) else "https"
    url = f"{scheme}://{ref.registry}/v2/{ref.repository}/manifests/{ref.tag}"
    own = session is None
    http = session or requests.Session()
    headers = {"Accept": MANIFEST_TYPES}
    try:
        response = http.head(url, headers=headers, timeout=timeout, allow_redirects=True)
        if response.status_code == 401:
            token = _bearer_token(http, response.headers.get("WWW-Authenticate", ""), timeout)
            if token is None:
                raise RegistryError(f"{reference}: the registry asks for credentials this product does not use")
            headers["Authorization"] = f"Bearer {token}"
            response = http.head(url, headers=headers, timeout=timeout, allow_redirects=True)
        if response.status_code == 404:
            raise RegistryError(f"{reference}: no such tag at {ref.registry}")
        if response.status_code != 200:
            raise RegistryError(f"{reference}: {url} answered {response.status_code}")
    except requests.RequestException as exc:
        raise RegistryError(f"{reference}: registry {ref.registry} unreachable: {exc}") from exc
    finally:
        if own:
            http.close()
    digest = response.headers.get("Docker-Content-Digest", "")
    if not _DIGEST.match(digest):
        raise RegistryError(f"{reference}: the registry gave no sha256 digest (got {digest!r})")
    return ref.model_copy(update={"digest": digest})
