"""Cloud resources: warm pools (`arena pool`), VM images (`arena image`) and `arena janitor`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.cli.common import CLOUD_CONFIG_HELP, EXIT_FAILED, command_line


def _pool(args: argparse.Namespace) -> int:
    from adapters.vms.base import ProviderError
    from adapters.vms.janitor import sweep_run
    from adapters.vms.registry import ProviderSettings, build_provider
    from adapters.vms.warm_pool import PoolPrices, WarmPool, pool_resource_id

    if args.pool_command == "up" and args.size < 1:
        raise ValueError(f"--size must be at least 1, got {args.size}")
    for option in ("vm_hour_price", "disk_gb_month_price", "ttl_hours"):
        value = getattr(args, option, None)
        if value is not None and (value < 0 or (option == "ttl_hours" and value == 0)):
            raise ValueError(f"--{option.replace('_', '-')} must be {'> 0' if option == 'ttl_hours' else '>= 0'}, "
                             f"got {value:g}")
    resource_id = pool_resource_id(args.name)
    provider = build_provider(args.provider, ProviderSettings(run_id=resource_id, cloud_config=args.config,
                                                              ttl_hours=args.ttl_hours))
    pool = WarmPool(provider, args.name, log=print)
    prices = PoolPrices(args.vm_hour_price, args.disk_gb_month_price)
    try:
        if args.pool_command == "up":
            pool.up(args.size)
        elif args.pool_command == "down" and args.delete:
            print(sweep_run(provider, resource_id).summary())
        elif args.pool_command == "down":
            pool.down()
        print("\n".join(pool.status(prices).lines()))
    except ProviderError as exc:
        print(f"arena: pool {args.pool_command} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        provider.close()
    return 0


def _janitor(args: argparse.Namespace) -> int:
    from flows.janitor import janitor

    for line in janitor(providers=args.provider or None, cloud_config=args.config, dry_run=args.dry_run):
        print(line)
    return 0


_IMAGE_SPEC_OPTIONS = ("container_image", "waa_repo", "waa_commit", "windows_iso_url", "prepared_storage_url",
                       "builder_size", "base_image", "disk_gb", "ready_timeout", "gallery")


def _image_spec(args: argparse.Namespace, **fixed: object) -> object:
    """The BuildSpec from `arena image` options; bad input is one line naming the option."""
    from adapters.images.spec import BuildSpec, spec_error_text

    from pydantic import ValidationError

    values = {key: getattr(args, key) for key in _IMAGE_SPEC_OPTIONS if getattr(args, key, None) is not None}
    try:
        return BuildSpec(provider=args.provider, name=args.name, **values, **fixed)
    except ValidationError as exc:
        raise ValueError(f"image build: {spec_error_text(exc)}") from None


def _image_build(args: argparse.Namespace) -> int:
    from adapters.images.stages import BuildError
    from adapters.vms.base import ProviderError
    from flows.image_build import image_build

    spec = _image_spec(args)
    try:
        image_id = image_build(spec=spec, cloud_config=args.config)
    except (BuildError, ProviderError) as exc:
        print(f"arena: image build {args.name} failed: {exc}", file=sys.stderr)
        status = command_line("image", "status", args.name, "--provider", args.provider)
        print(f"arena: rerun the same command to resume; `{status}` shows the stages", file=sys.stderr)
        return EXIT_FAILED
    print(image_id)
    return 0


def _image_status(args: argparse.Namespace) -> int:
    from adapters.images.builders import make_builder
    from adapters.images.stages import BuildError

    # Status needs only the name; a placeholder source satisfies the spec's checks.
    spec = _image_spec(args, container_image="status/only", windows_iso_url="https://status.invalid/only.iso")
    builder = make_builder(spec, args.config)
    try:
        print("\n".join(builder.status().lines()))
    except BuildError as exc:
        print(f"arena: image status {args.name}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        builder.close()
    return 0


def add_janitor(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena janitor`."""
    janitor = sub.add_parser("janitor", help="delete expired cloud resources this product created")
    janitor.add_argument("--provider", action="append", choices=["aws", "azure", "kvm"])
    janitor.add_argument("--config", type=Path, help=CLOUD_CONFIG_HELP)
    janitor.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    janitor.set_defaults(func=_janitor)


def add_pool(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena pool up|down|status`."""
    pool = sub.add_parser("pool", help="warm pools: VMs kept between runs, stopped while idle (aws, azure)")
    from adapters.vms.defaults import DEFAULT_POOL_TTL_HOURS

    pool_sub = pool.add_subparsers(dest="pool_command", required=True)
    for command, text in (
        ("up", "create the pool's VMs, or start them when stopped, and wait until each WAA server answers"),
        ("down", "stop (aws) / deallocate (azure) the pool's VMs: only their disks bill until the next up"),
        ("status", "each VM's state, size, expiry, and what the pool costs per hour as it stands"),
    ):
        command_parser = pool_sub.add_parser(command, help=text)
        command_parser.add_argument("--provider", choices=["aws", "azure"], required=True)
        command_parser.add_argument("--name", required=True, help="the pool's name, e.g. nightly (a-z, 0-9, -)")
        command_parser.add_argument("--config", type=Path,
                                    help=CLOUD_CONFIG_HELP)
        command_parser.add_argument("--ttl-hours", type=float, default=DEFAULT_POOL_TTL_HOURS,
                                    help="the janitor deletes a pool not brought up or down for this long "
                                    f"(default {DEFAULT_POOL_TTL_HOURS:g})")
        command_parser.add_argument("--vm-hour-price", type=float,
                                    help="USD per VM-hour for the cost line (default: list price of known sizes)")
        command_parser.add_argument("--disk-gb-month-price", type=float,
                                    help="USD per disk GB-month for the cost line (default: gp3 / Premium SSD)")
        if command == "up":
            command_parser.add_argument("--size", type=int, required=True, help="number of VMs")
        if command == "down":
            command_parser.add_argument("--delete", action="store_true",
                                        help="delete the pool's VMs, disks and network instead of stopping them")
        command_parser.set_defaults(func=_pool)


def add_image(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena image build|status`."""
    image = sub.add_parser("image", help="build the cloud VM image WAA runs from (resumable), and show a build's stages")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    image_build = image_sub.add_parser("build", help="build (or resume building) an image: builder VM -> WAA ready "
                                       "-> capture -> verify -> delete the builder")
    image_build.add_argument("--provider", choices=["aws", "azure"], required=True)
    image_build.add_argument("--name", required=True, help="the build's name (a-z, 0-9, -): rerunning it resumes")
    image_build.add_argument("--container-image", help="the WAA container to pull, e.g. windowsarena/winarena:latest "
                             "(pinned by digest when the registry answers)")
    image_build.add_argument("--waa-repo", help="or build the container from this WAA git repository (https)")
    image_build.add_argument("--waa-commit", help="at this full commit id")
    image_build.add_argument("--windows-iso-url", help="a Windows 11 ISO in your own storage (https; a SAS or "
                             "pre-signed URL is never recorded with its query)")
    image_build.add_argument("--prepared-storage-url", help="or a prepared WAA storage archive (.tar, .tar.gz, "
                             ".tar.zst, .zip), e.g. WAA-V2's VM snapshot copied to your storage")
    image_build.add_argument("--builder-size", help="instance type / VM size with nested virtualization "
                             "(default m8i.2xlarge / Standard_D8ds_v5)")
    image_build.add_argument("--base-image", help="the builder's base image (default Ubuntu 24.04): ami-... or "
                             "publisher:offer:sku:version")
    image_build.add_argument("--disk-gb", type=int, help="the builder's OS disk size (default 256)")
    image_build.add_argument("--ready-timeout", type=float, help="seconds to wait for Windows and the WAA server "
                             "(default 10800)")
    image_build.add_argument("--gallery", help="azure: the compute gallery (default waa_arena)")
    image_build.add_argument("--config", type=Path, help=CLOUD_CONFIG_HELP)
    image_build.set_defaults(func=_image_build)
    image_status = image_sub.add_parser("status", help="which stages of a build are done, read from the cloud")
    image_status.add_argument("name", help="the build's name")
    image_status.add_argument("--provider", choices=["aws", "azure"], required=True)
    image_status.add_argument("--gallery", help="azure: the compute gallery (default waa_arena)")
    image_status.add_argument("--config", type=Path, help=CLOUD_CONFIG_HELP)
    image_status.set_defaults(func=_image_status)
