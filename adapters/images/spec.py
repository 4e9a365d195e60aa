"""What an image build makes: the build spec, validated so bad input fails before any cloud call.

A build is named (`name`): the name is the build's identity in the cloud. Every resource a build
creates carries it (tag `waa-arena-image-build`) or is named from it, so a rerun of the same spec
finds what an earlier, interrupted run left and continues from there.

The product never downloads Windows itself: the user names a Windows ISO (or an already prepared
WAA storage archive, e.g. WAA-V2's published VM snapshot) in their own storage, and the builder VM
fetches that URL. Such URLs often carry a credential in their query string (an Azure SAS token,
an S3 pre-signed signature), so anything recorded about them goes through `redact_url` first.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adapters.vms.aws import NESTED_VIRTUALIZATION_FAMILIES

Provider = Literal["aws", "azure"]

# A build name: lowercase letters, digits and dashes, usable in EC2 AMI names, Azure resource
# names (gallery image definitions) and tag values alike.
NAME_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")

# A container image reference as the Docker distribution grammar allows it (a subset: no IPv6
# registry hosts). Only these characters can appear, so no reference can carry shell syntax.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
REFERENCE_PATTERN = re.compile(
    rf"^(?P<name>{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")

# Archive kinds a prepared storage URL may point at, by the end of its path.
STORAGE_ARCHIVE_SUFFIXES = {".tar": "tar", ".tar.gz": "tar.gz", ".tgz": "tar.gz", ".tar.zst": "tar.zst",
                            ".zip": "zip"}

# Azure sizes with nested virtualization that fit WAA's 8 GB / 8 core guest: the D v3/v4/v5
# families (with their d / s variants), e.g. Standard_D8ds_v5.
AZURE_SIZE_PATTERN = re.compile(r"^Standard_D(\d+)[a-z]*_v[345]$")
AWS_SIZE_PATTERN = re.compile(r"^(?P<family>[a-z0-9-]+)\.(?P<size>[a-z0-9]+)$")

DEFAULT_BUILDER_SIZE = {"aws": "m8i.2xlarge", "azure": "Standard_D8ds_v5"}
# Ubuntu 24.04 LTS: on AWS the AMI id comes from Canonical's public SSM parameter at build time.
DEFAULT_AZURE_BASE_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"
UBUNTU_SSM_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"


def redact_url(url: str) -> str:
    """The URL without query, fragment or user info: what may be written into tags and logs.

    SAS tokens and pre-signed signatures live in the query string; user:password in the
    authority. Scheme, host and path stay, so the record still says which object was used.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _check_url(value: str, field: str) -> str:
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in value):
        raise ValueError(f"{field} must not contain spaces, newlines or control characters")
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"{field} must be an https:// URL (got scheme {parts.scheme or 'none'!r})")
    if not parts.path or parts.path == "/":
        raise ValueError(f"{field} must name an object (a path after the host)")
    return value


class BuildSpec(BaseModel):
    """One image build. Cloud placement (region, network, controller address, owner) comes from
    the provider's [aws] / [azure] cloud settings; this holds what is specific to the image."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider
    name: str = Field(description="the build's identity: resources are named and tagged from it")
    # The WAA container: a reference (tag or digest) to pull, or a repository + commit to build.
    container_image: str | None = None
    waa_repo: str | None = None
    waa_commit: str | None = None
    # Windows: exactly one of an ISO or a prepared WAA storage archive, in the user's own storage.
    windows_iso_url: str | None = None
    prepared_storage_url: str | None = None
    builder_size: str | None = None  # None: m8i.2xlarge (aws) / Standard_D8ds_v5 (azure)
    base_image: str | None = None  # aws: an AMI id; azure: publisher:offer:sku:version; None: Ubuntu 24.04
    disk_gb: int = Field(default=256, ge=64, le=4096)  # Docker image + ISO + the ~30 GB Windows disk
    vm_ram: str = Field(default="8G", pattern=r"^[1-9][0-9]{0,3}G$")  # QEMU guest RAM (WAA's default)
    vm_cpu_cores: int = Field(default=8, ge=1, le=64)
    # Windows install + WAA's software setup takes 20-40 min on real hardware; allow far more.
    ready_timeout: float = Field(default=3 * 3600.0, gt=0)
    ready_poll_seconds: float = Field(default=30.0, gt=0)
    capture_timeout: float = Field(default=2 * 3600.0, gt=0)
    capture_poll_seconds: float = Field(default=15.0, gt=0)
    verify_timeout: float = Field(default=3600.0, gt=0)
    gallery: str = Field(default="waa_arena", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.]{0,78}[A-Za-z0-9]$")  # azure

    # -- field checks ------------------------------------------------------------------------

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_PATTERN.match(value):
            raise ValueError("must be 1-40 lowercase letters, digits or dashes, starting and ending with a "
                             f"letter or digit (got {value!r})")
        return value

    @field_validator("container_image")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        if value is not None and not REFERENCE_PATTERN.match(value):
            raise ValueError(f"{value!r} is not a container image reference such as windowsarena/winarena:latest")
        return value

    @field_validator("waa_repo")
    @classmethod
    def _repo(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _check_url(value, "waa_repo")
        if urlsplit(value).query or urlsplit(value).username:
            raise ValueError("waa_repo must be a public https clone URL without credentials or query")
        return value

    @field_validator("waa_commit")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        if value is not None and not COMMIT_PATTERN.match(value):
            raise ValueError(f"must be a full 40-character lowercase hex commit id (got {value!r})")
        return value

    @field_validator("windows_iso_url")
    @classmethod
    def _iso(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value, "windows_iso_url")

    @field_validator("prepared_storage_url")
    @classmethod
    def _storage(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _check_url(value, "prepared_storage_url")
        if storage_archive_kind(value) is None:
            raise ValueError("prepared_storage_url must end in one of "
                             f"{', '.join(STORAGE_ARCHIVE_SUFFIXES)} (a WAA storage folder archive)")
        return value

    @field_validator("base_image")
    @classmethod
    def _base(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$", value):
            raise ValueError(f"{value!r} is not an image id (ami-... or publisher:offer:sku:version)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BuildSpec:
        if (self.container_image is None) == (self.waa_repo is None):
            raise ValueError("container_image / waa_repo: give exactly one: a container image to pull "
                             "(--container-image) or a WAA repository to build it from (--waa-repo + --waa-commit)")
        if (self.waa_repo is None) != (self.waa_commit is None):
            raise ValueError("waa_commit: a WAA repository build needs both --waa-repo and --waa-commit")
        if (self.windows_iso_url is None) == (self.prepared_storage_url is None):
            raise ValueError("windows_iso_url / prepared_storage_url: give exactly one Windows source: a Windows "
                             "ISO URL in your storage (--windows-iso-url) or a prepared WAA storage archive "
                             "(--prepared-storage-url)")
        size = self.size
        if self.provider == "aws":
            match = AWS_SIZE_PATTERN.match(size)
            family = match.group("family") if match else ""
            if not match or (family not in NESTED_VIRTUALIZATION_FAMILIES and match.group("size") != "metal"):
                raise ValueError(f"builder_size: {size!r} cannot run WAA's QEMU guest; use an instance type with "
                                 f"nested virtualization ({', '.join(sorted(NESTED_VIRTUALIZATION_FAMILIES))}, e.g. "
                                 "m8i.2xlarge) or a .metal type")
            if self.base_image is not None and not re.match(r"^ami-[0-9a-f]{8,17}$", self.base_image):
                raise ValueError(f"base_image: {self.base_image!r} is not an AMI id (ami-...)")
        else:
            match = AZURE_SIZE_PATTERN.match(size)
            if not match or int(match.group(1)) < 4:
                raise ValueError(f"builder_size: {size!r} is not an Azure size with nested virtualization for WAA; "
                                 "use the Dv5 / Ddsv5 families (v3/v4 also work) with 4+ vCPUs, e.g. Standard_D8ds_v5")
            if self.base_image is not None and len(self.base_image.split(":")) != 4 \
                    and not self.base_image.lower().startswith("/subscriptions/"):
                raise ValueError(f"base_image: {self.base_image!r} is neither publisher:offer:sku:version nor an "
                                 "ARM image id")
        return self

    # -- derived -----------------------------------------------------------------------------

    @property
    def size(self) -> str:
        """The builder's instance type / VM size."""
        return self.builder_size or DEFAULT_BUILDER_SIZE[self.provider]

    @property
    def windows_source_kind(self) -> str:
        return "iso" if self.windows_iso_url else "prepared-storage"

    @property
    def windows_source_url(self) -> str:
        return self.windows_iso_url or self.prepared_storage_url or ""

    @property
    def run_id(self) -> str:
        """The run id of the builder's resources (the janitor's and crash hooks' key)."""
        return f"image-{self.name}"

    @property
    def verify_run_id(self) -> str:
        """The run id of the one VM booted from the new image to verify it."""
        return f"image-{self.name}-verify"


def storage_archive_kind(url: str) -> str | None:
    """tar / tar.gz / tar.zst / zip by the URL path's ending (query ignored), or None."""
    path = urlsplit(url).path.lower()
    for suffix in sorted(STORAGE_ARCHIVE_SUFFIXES, key=len, reverse=True):
        if path.endswith(suffix):
            return STORAGE_ARCHIVE_SUFFIXES[suffix]
    return None


def spec_error_text(exc: ValidationError) -> str:
    """One line naming each bad field, for the command line."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)
