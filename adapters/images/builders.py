"""A build's cloud settings and its builder, from the same [aws] / [azure] settings runs use.

The region, network, controller address, owner and TTL of the builder come from the provider's
section of the cloud config (adapters/vms/settings.py: TOML file plus ARENA_* variables). That
section normally names the image runs boot from (`ami_id` / `image_id`), which is what a build
produces, so a section without one is accepted here (the build never reads it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_serializer

from adapters.images.spec import BuildSpec
from adapters.images.stages import ImageBuilder
from adapters.vms.aws import AWSSettings
from adapters.vms.azure import AzureSettings
from adapters.vms.base import VMHandle
from adapters.vms.settings import cloud_settings_from, read_config_file

# What stands in for the image id a section may lack before the first build.
_NO_IMAGE = {"aws": "ami-00000000",
             "azure": "/subscriptions/none/providers/Microsoft.Compute/images/waa-arena-image-not-built-yet"}
_IMAGE_FIELD = {"aws": "ami_id", "azure": "image_id"}


def load_build_settings(provider: str, config_file: Path | None = None) -> AWSSettings | AzureSettings:
    """The provider's cloud settings (file and ARENA_* variables, as load_cloud_settings reads
    them), with the image id optional; errors name the file and the field."""
    path, data = read_config_file(config_file)
    env_key = f"ARENA_{provider.upper()}__{_IMAGE_FIELD[provider].upper()}"
    section = data.get(provider)
    if isinstance(section, dict) and _IMAGE_FIELD[provider] not in section and env_key not in os.environ:
        data[provider] = {**section, _IMAGE_FIELD[provider]: _NO_IMAGE[provider]}
    settings = cloud_settings_from(path, data)
    chosen = getattr(settings, provider)
    if chosen is None:
        raise ValueError(f"an {provider} image build needs an [{provider}] section in the cloud config {path} "
                         f"(or ARENA_{provider.upper()}__* variables): region/locations, controller_cidr, owner ...")
    return chosen


class BuilderOptions(BaseModel):
    """What a caller may inject into a builder instead of the defaults: where the WAA servers of
    the builder and of the verification VM answer (a tunnel or port forward you run; tests: a
    local simulation), the cloud SDK session / credential, the digest resolver, the clock.

    A flow parameter: Prefect stores it as the names of what was injected, never the objects.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    waa_url_for: Callable[[VMHandle], str] | None = None
    verify_waa_url_for: Callable[[VMHandle], str] | None = None
    session: Any = None  # aws: a boto3.Session
    credential: Any = None  # azure: an azure-identity credential
    resolver: Callable[[str], Any] | None = None
    clock: Callable[[], Any] | None = None

    @field_serializer("*")
    def _name_only(self, value: Any) -> str | None:
        return None if value is None else type(value).__name__

    def builder_kwargs(self) -> dict[str, Any]:
        return {key: value for key, value in (
            ("waa_url_for", self.waa_url_for), ("verify_waa_url_for", self.verify_waa_url_for),
            ("resolver", self.resolver), ("clock", self.clock)) if value is not None}


def make_builder(
    spec: BuildSpec,
    cloud_config: Path | None = None,
    *,
    settings: AWSSettings | AzureSettings | None = None,
    options: BuilderOptions | None = None,
    warn: Callable[[str], None] | None = None,
) -> ImageBuilder:
    """The builder for `spec` on its provider, from the cloud settings (or `settings`)."""
    chosen = settings or load_build_settings(spec.provider, cloud_config)
    options = options or BuilderOptions()
    extra: dict[str, Any] = options.builder_kwargs()
    if warn is not None:
        extra["warn"] = warn
    if spec.provider == "aws":
        from adapters.images.aws import AWSImageBuilder

        if not isinstance(chosen, AWSSettings):
            raise ValueError("an aws build needs [aws] settings")
        return AWSImageBuilder(spec, chosen, session=options.session, **extra)
    from adapters.images.azure import AzureImageBuilder

    if not isinstance(chosen, AzureSettings):
        raise ValueError("an azure build needs [azure] settings")
    return AzureImageBuilder(spec, chosen, credential=options.credential, **extra)
