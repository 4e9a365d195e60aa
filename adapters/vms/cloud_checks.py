"""Cloud preflight checks for `arena doctor`: what fails a real run before its first VM.

Per provider: the SDK's credential chain yields an identity; the configured sizes exist in the
configured regions; the vCPU quota holds the pool; the image exists and carries the tags
`arena image build` gives it. For both: the controller's real egress address lies inside
`controller_cidr` (else every VM's firewall drops it), and the VMs of a warm pool answer on the
ports this product uses. Each check is one `Check` with the fix when it fails; nothing is created.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import requests

from adapters.checks import Check
from adapters.vms.base import TAG_MANAGED, VMState
from adapters.vms.defaults import DEFAULT_EGRESS_URL
# Service Quotas codes: EC2 vCPUs of running On-Demand / Spot Standard (A, C, D, H, I, M, R, T, Z)
# instances, the families this product launches.
AWS_VCPU_QUOTA = {False: "L-1216C47A", True: "L-34B43A08"}
IMAGE_BUILD_TAG_PREFIX = "waa-arena-"


def _guarded(name: str, fix: str, check: Callable[[], Check]) -> Check:
    """`check()`, or a failed Check naming the error (an SDK error must not end the doctor)."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - whatever failed is the answer
        return Check(name, False, f"{type(exc).__name__}: {_first_line(exc)}", fix)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


# -- both clouds ------------------------------------------------------------------------------


def check_egress(controller_cidr: str, egress_url: str = DEFAULT_EGRESS_URL, timeout: float = 10.0) -> Check:
    """The address this controller's traffic leaves from (as `egress_url` sees it) is inside
    `controller_cidr`: the VMs' firewalls admit only that range."""
    name = "controller address"
    try:
        response = requests.get(egress_url, timeout=timeout)
        response.raise_for_status()
        text = response.text.strip()
        address = ipaddress.ip_address(text)
    except ValueError:
        return Check(name, False, f"{egress_url} answered {text[:60]!r}, not an IP address",
                     "pass --egress-url a service that answers with your address as plain text")
    except requests.RequestException as exc:
        return Check(name, False, f"could not ask {egress_url} for this host's public address: {type(exc).__name__}",
                     "pass --egress-url a reachable what-is-my-IP service, or check controller_cidr by hand")
    network = ipaddress.ip_network(controller_cidr, strict=False)
    if address in network:
        return Check(name, True, f"this host leaves from {address}, inside controller_cidr {network}")
    return Check(name, False, f"this host leaves from {address}, OUTSIDE controller_cidr {network}: the VMs' "
                 "firewalls will drop every request", f'set controller_cidr = "{address}/32" in the cloud config')


def check_ports(vms: list[VMState], ports: dict[str, int], timeout: float = 3.0) -> list[Check]:
    """Each running VM of a warm pool accepts TCP connections on `ports` (name -> port)."""
    checks = []
    for vm in vms:
        name = f"ports of {vm.vm_id}"
        if vm.state != "running":
            checks.append(Check(name, True, f"not checked: the VM is {vm.state} (arena pool up starts it)"))
            continue
        if not vm.address:
            checks.append(Check(name, True, "not checked: the cloud reports no address for it"))
            continue
        closed = [f"{label} {port}" for label, port in ports.items() if not _accepts(vm.address, port, timeout)]
        if closed:
            checks.append(Check(name, False, f"{vm.address} does not accept {', '.join(closed)}",
                                "check the security group / NSG admits controller_cidr, and that the WAA "
                                "container runs on the VM (ssh in: docker ps)"))
        else:
            checks.append(Check(name, True, f"{vm.address} accepts {', '.join(f'{k} {v}' for k, v in ports.items())}"))
    return checks


def _accepts(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _image_tag_check(name: str, image: str, tags: dict[str, str], fix_build: str) -> Check:
    if tags.get(TAG_MANAGED) != "true":
        return Check(name, False, f"{image} exists but was not built by arena image build (no {TAG_MANAGED} tag): "
                     "runs cannot say which WAA commit and container it holds", fix_build)
    provenance = sorted(k.removeprefix(IMAGE_BUILD_TAG_PREFIX) for k in tags if k.startswith(IMAGE_BUILD_TAG_PREFIX)
                        and k != TAG_MANAGED)
    return Check(name, True, f"{image} exists with provenance tags ({', '.join(provenance) or 'none'})")


# -- AWS --------------------------------------------------------------------------------------


def aws_checks(provider: Any, pool_size: int) -> list[Check]:
    """Credentials, instance types offered in the region, vCPU quota for the pool, the AMI."""
    s = provider.settings
    checks = [_guarded("AWS credentials", "configure boto3's chain: AWS_PROFILE, `aws sso login`, or an instance "
                       "role; never put keys in arena.toml", lambda: _aws_identity(provider))]
    if not checks[0].ok:
        return checks  # every other call would fail the same way
    offered: list[str] = []
    checks.append(_guarded(f"instance types in {s.region}", "pick instance_types offered in the region",
                           lambda: _aws_offerings(provider, offered)))
    if offered:
        checks.append(_guarded("vCPU quota", "grant the caller servicequotas:GetServiceQuota, or check the quota "
                               "in the Service Quotas console", lambda: _aws_quota(provider, offered[0], pool_size)))
    checks.append(_guarded(f"image {s.ami_id}", "build one: arena image build --provider aws, then set ami_id",
                           lambda: _aws_image(provider)))
    return checks


def _aws_client(provider: Any, service: str) -> Any:
    s = provider.settings
    return provider.session.client(service, region_name=s.region, endpoint_url=s.endpoint_url)


def _aws_identity(provider: Any) -> Check:
    identity = _aws_client(provider, "sts").get_caller_identity()
    return Check("AWS credentials", True, f"boto3's chain gives {identity['Arn']} (account {identity['Account']})")


def _aws_offerings(provider: Any, found: list[str]) -> Check:
    """Which configured types the region offers (appended to `found`, in the configured order)."""
    s = provider.settings
    name = f"instance types in {s.region}"
    offered = {o["InstanceType"] for o in provider.ec2.describe_instance_type_offerings(
        LocationType="region", Filters=[{"Name": "instance-type", "Values": list(s.instance_types)}]
    )["InstanceTypeOfferings"]}
    found.extend(t for t in s.instance_types if t in offered)
    missing = [t for t in s.instance_types if t not in offered]
    if not offered:
        return Check(name, False, f"none of {', '.join(s.instance_types)} is offered in {s.region}",
                     "choose a region that offers m8i/c8i (nested virtualization) or other instance_types")
    if missing:
        return Check(name, True, f"{', '.join(t for t in s.instance_types if t in offered)} offered; "
                     f"{', '.join(missing)} not offered (skipped as fallbacks)")
    return Check(name, True, f"{', '.join(s.instance_types)} offered")


def _aws_quota(provider: Any, first: str, pool_size: int) -> Check:
    """The region's vCPU quota holds `pool_size` instances of `first` (the type launched first)."""
    s = provider.settings
    vcpus = provider.ec2.describe_instance_types(InstanceTypes=[first])["InstanceTypes"][0]["VCpuInfo"]["DefaultVCpus"]
    code = AWS_VCPU_QUOTA[bool(s.spot)]
    quota = _aws_client(provider, "service-quotas").get_service_quota(ServiceCode="ec2", QuotaCode=code)
    limit = float(quota["Quota"]["Value"])
    needed = pool_size * int(vcpus)
    kind = "Spot" if s.spot else "On-Demand"
    if needed > limit:
        fits = int(limit // vcpus)
        return Check("vCPU quota", False, f"a pool of {pool_size} x {first} needs {needed} {kind} vCPUs; the "
                     f"quota ({code}) in {s.region} is {limit:g}",
                     f"request {needed} for {code} in the Service Quotas console, or use --pool-size {fits}")
    return Check("vCPU quota", True, f"{kind} Standard quota {limit:g} vCPUs in {s.region} holds {pool_size} x "
                 f"{first} ({needed} vCPUs; instances already running count against it too)")


def _aws_image(provider: Any) -> Check:
    s = provider.settings
    name = f"image {s.ami_id}"
    images = provider.ec2.describe_images(ImageIds=[s.ami_id])["Images"]
    if not images:
        return Check(name, False, f"not found in {s.region}", "build one: arena image build --provider aws")
    image = images[0]
    if image.get("State") != "available":
        return Check(name, False, f"state {image.get('State')}", "wait for the AMI to become available")
    tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
    return _image_tag_check(name, s.ami_id, tags, "build one with arena image build --provider aws (or keep this "
                            "image knowing runs record only its id)")


# -- Azure ------------------------------------------------------------------------------------

ARM_SCOPE = "https://management.azure.com/.default"


def azure_checks(provider: Any, pool_size: int) -> list[Check]:
    """Credentials, VM sizes available in the locations, regional core quota, the image."""
    checks = [_guarded("Azure credentials", "sign in (az login), or set AZURE_CLIENT_ID / AZURE_TENANT_ID / "
                       "AZURE_CLIENT_SECRET, or use a managed identity", lambda: _azure_token(provider))]
    if not checks[0].ok:
        return checks
    for location in provider.settings.locations:
        checks.append(_guarded(f"VM sizes in {location}", "pick vm_sizes offered in the location",
                               lambda loc=location: _azure_sizes(provider, loc, pool_size)))
    checks.append(_guarded("image", "build one: arena image build --provider azure, then set image_id",
                           lambda: _azure_image(provider)))
    return checks


def _azure_token(provider: Any) -> Check:
    token = provider.credential.get_token(ARM_SCOPE)
    kind = type(provider.credential).__name__
    return Check("Azure credentials", True, f"{kind} gives a management token (valid until "
                 f"{_utc(token.expires_on)}) for subscription {provider.settings.subscription_id}")


def _utc(epoch: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _azure_sizes(provider: Any, location: str, pool_size: int) -> Check:
    """The first configured size offered without restriction in `location`, and its family's
    core quota (limit - current usage) holds the pool."""
    s = provider.settings
    name = f"VM sizes in {location}"
    skus = {}
    for sku in provider.compute.resource_skus.list(filter=f"location eq '{location}'"):
        # The filter narrows the listing, but each entry still names its locations: trust those.
        if sku.resource_type == "virtualMachines" and location.lower() in {x.lower() for x in sku.locations or []}:
            skus[sku.name] = sku
    usable = [size for size in s.vm_sizes if size in skus and not (skus[size].restrictions or [])]
    if not usable:
        restricted = [size for size in s.vm_sizes if size in skus]
        why = f"restricted for this subscription: {', '.join(restricted)}" if restricted else "none offered"
        return Check(name, False, f"{', '.join(s.vm_sizes)}: {why}", "choose other vm_sizes or locations")
    size = usable[0]
    sku = skus[size]
    vcpus = int(next((c.value for c in sku.capabilities or [] if c.name == "vCPUs"), "0"))
    usage = {u.name.value.lower(): u for u in provider.compute.usage.list(location)}
    family = usage.get((sku.family or "").lower())
    if family is None:
        return Check(name, True, f"{size} offered; no quota figure for family {sku.family}")
    free = family.limit - family.current_value
    needed = pool_size * vcpus
    if needed > free:
        return Check(name, False, f"a pool of {pool_size} x {size} needs {needed} cores of {sku.family}; "
                     f"{free} of {family.limit} are free in {location}",
                     f"request a quota increase for {sku.family} in {location}, or use --pool-size "
                     f"{max(0, free // max(vcpus, 1))}")
    return Check(name, True, f"{size} offered; {sku.family}: {free} of {family.limit} cores free "
                 f"(the pool needs {needed})")


def _azure_image(provider: Any) -> Check:
    image_id = provider.settings.image_id
    parts = image_id.strip("/").split("/")
    lower = [p.lower() for p in parts]
    if "galleries" not in lower or "versions" not in lower:
        image = provider.compute.images.get(parts[3], parts[-1])
        return _image_tag_check("image", parts[-1], dict(image.tags or {}),
                                "build a gallery image with arena image build --provider azure")
    rg = parts[lower.index("resourcegroups") + 1]
    gallery = parts[lower.index("galleries") + 1]
    definition = parts[lower.index("images") + 1]
    version = parts[lower.index("versions") + 1]
    found = provider.compute.gallery_image_versions.get(rg, gallery, definition, version)
    state = (found.provisioning_state or "").lower()
    label = f"{gallery}/{definition}/{version}"
    if state and state != "succeeded":
        return Check("image", False, f"{label} is {found.provisioning_state}", "wait for the version to replicate")
    return _image_tag_check("image", label, dict(found.tags or {}), "build one with arena image build --provider "
                            "azure (or keep this image knowing runs record only its id)")
