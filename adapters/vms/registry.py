"""VM providers by name: the one table a new provider is added to.

Each entry builds a provider from plain `ProviderSettings`, so flows, the CLI and deployments
never name a provider's class: `build_provider("aws", settings)`. A new provider is a module
under adapters/vms/ with a `VMProvider` subclass, plus one `@PROVIDERS.register(name)` builder
here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.registry import Registry
from adapters.vms.defaults import DEFAULT_SERVER_WAIT_SECONDS

# The table's names are read by `arena run --help`: the providers' modules, their cloud
# settings and SDKs load only when a provider is built.
if TYPE_CHECKING:
    from adapters.vms.base import VMProvider


@dataclass(frozen=True)
class ProviderSettings:
    """Everything any provider may be built from; each provider reads only what it needs."""

    run_id: str  # tags cloud resources (the janitor and crash hooks find them by it)
    cloud_config: Path | None = None  # aws/azure: TOML settings (else $ARENA_CONFIG / ./arena.toml)
    waa_urls: list[str] = field(default_factory=list)  # existing: the servers (extra ones are spares)
    server_wait_seconds: float = DEFAULT_SERVER_WAIT_SECONDS  # existing: wait before retiring a server
    quirks: bool = False  # local: reproduce a real WAA server's quirks
    quirk_settings: dict[str, Any] | None = None  # local with quirks: override the knobs
    ttl_hours: float | None = None  # aws/azure: expiry of created resources (None = the cloud config's)
    pool_size: int | None = None  # kvm: the pool about to start, checked against the host (None: no checks)


PROVIDERS: Registry[Callable[[ProviderSettings], VMProvider]] = Registry("VM provider")


@PROVIDERS.register("local")
def _local(settings: ProviderSettings) -> VMProvider:
    from adapters.vms.local import LocalSimulationProvider

    return LocalSimulationProvider(quirks=settings.quirks, quirk_settings=settings.quirk_settings)


@PROVIDERS.register("existing")
def _existing(settings: ProviderSettings) -> VMProvider:
    from adapters.vms.existing import ExistingServersProvider

    return ExistingServersProvider(settings.waa_urls, server_wait_seconds=settings.server_wait_seconds)


def _cloud_section(settings: ProviderSettings, name: str) -> Any:
    """The provider's section of the cloud settings; a missing one is a clear error."""
    from adapters.vms.settings import load_cloud_settings

    section = getattr(load_cloud_settings(settings.cloud_config), name)
    if section is None:
        raise ValueError(
            f"provider {name!r} needs an [{name}] section in the cloud config (or ARENA_{name.upper()}__* variables)"
        )
    if settings.ttl_hours is not None:
        section = section.model_copy(update={"ttl_hours": settings.ttl_hours})
    return section


@PROVIDERS.register("aws")
def _aws(settings: ProviderSettings) -> VMProvider:
    from adapters.vms.aws import AWSProvider

    return AWSProvider(_cloud_section(settings, "aws"), settings.run_id)


@PROVIDERS.register("azure")
def _azure(settings: ProviderSettings) -> VMProvider:
    from adapters.vms.azure import AzureProvider

    return AzureProvider(_cloud_section(settings, "azure"), settings.run_id)


@PROVIDERS.register("kvm")
def _kvm(settings: ProviderSettings) -> VMProvider:
    from adapters.vms.kvm import KVMProvider, KVMSettings
    from adapters.vms.settings import load_cloud_settings

    # The [kvm] section is optional: without it, the Debian test guest with the defaults.
    section = load_cloud_settings(settings.cloud_config).kvm or KVMSettings()
    return KVMProvider(section, settings.run_id, pool_size=settings.pool_size)


PROVIDER_NAMES: tuple[str, ...] = tuple(PROVIDERS)


def build_provider(name: str, settings: ProviderSettings) -> VMProvider:
    """The provider registered as `name`; unknown names and bad settings raise ValueError."""
    return PROVIDERS.lookup(name)(settings)
