"""Cloud settings: one typed object from environment variables and an optional TOML file.

    ARENA_CONFIG=arena.toml           # the file (default: ./arena.toml when it exists)
    [aws]
    region = "eu-west-1"
    ami_id = "ami-..."
    controller_cidr = "203.0.113.7/32"
    owner = "eval-team"

Environment variables override the file, nested with "__": ARENA_AWS__REGION=us-east-1.
Credentials are never read from here: boto3's credential chain and DefaultAzureCredential find
them (environment, profiles, managed identity, ...).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from adapters.vms.aws import AWSSettings
from adapters.vms.azure import AzureSettings
from adapters.vms.kvm import KVMSettings

CONFIG_ENV = "ARENA_CONFIG"


class CloudSettings(BaseSettings):
    """The VM providers' settings; a section is None until configured."""

    model_config = SettingsConfigDict(env_prefix="ARENA_", env_nested_delimiter="__", extra="forbid")

    aws: AWSSettings | None = None
    azure: AzureSettings | None = None
    kvm: KVMSettings | None = None  # QEMU/KVM VMs on this host (adapters/vms/kvm.py); optional

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init arguments (see load_cloud_settings); the environment
        # comes first so an ARENA_* variable overrides the file.
        return (env_settings, init_settings)


def read_config_file(config_file: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The TOML file's path (`config_file`, $ARENA_CONFIG, or ./arena.toml) and its contents
    ({} when the default file is absent); ValueError naming a named file that is missing or broken."""
    path = config_file or Path(os.environ.get(CONFIG_ENV, "arena.toml"))
    if path.exists():
        try:
            return path, tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cloud config file {path}: {exc}") from None
    if config_file is not None or CONFIG_ENV in os.environ:
        raise ValueError(f"cloud config file {path} does not exist")
    return path, {}


def cloud_settings_from(path: Path, data: dict[str, Any]) -> CloudSettings:
    """`data` (read from `path`) under the ARENA_* variables; ValueError naming each bad field."""
    try:
        return CloudSettings(**data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"cloud settings ({path} and ARENA_* variables): {problems}") from None


def load_cloud_settings(config_file: Path | None = None) -> CloudSettings:
    """Settings from ARENA_* variables over the TOML file (`config_file`, $ARENA_CONFIG, or
    ./arena.toml when present); errors name the file and the field."""
    return cloud_settings_from(*read_config_file(config_file))
