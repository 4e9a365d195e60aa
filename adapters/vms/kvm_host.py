"""What the host offers the kvm provider: a usable KVM, QEMU itself, and room for the pool.

Every check here runs before any VM starts and fails with one line that names the problem and
its fix, so `arena run --provider kvm` stops before it has started anything.

A usable KVM (measured on the project's machines, notes/kvm.md): `/dev/kvm` readable and
writable, a `vmx` or `svm` flag in /proc/cpuinfo, and not PVM. PVM (module `kvm_pvm`) is a
software KVM for nested micro-VMs: `KVM_CREATE_VM` succeeds, but a stock guest kernel dies under
it ("KVM internal error: emulation failure"), so it counts as usable only when the operator says
the guest kernel is built for PVM. Without a usable KVM the guests run under QEMU's TCG
emulator, but only when the user allows it: a pool silently running 10x slower than expected
would be a worse surprise than a clear refusal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

KVM_DEVICE = Path("/dev/kvm")
CPUINFO = Path("/proc/cpuinfo")
SYS_MODULES = Path("/sys/module")


class HostCheckError(ValueError):
    """The host cannot run the pool as configured; the message is one line with the fix."""


@dataclass(frozen=True)
class Accelerator:
    """The accelerator the VMs run under, and why it was chosen."""

    name: str  # "kvm" or "tcg"
    reason: str  # one line: why (shown to users, stored with the image's cache key)

    @property
    def is_kvm(self) -> bool:
        return self.name == "kvm"


def kvm_problem(
    *,
    device: Path = KVM_DEVICE,
    cpuinfo: Path = CPUINFO,
    sys_modules: Path = SYS_MODULES,
    pvm_guest_kernel: bool = False,
) -> str | None:
    """None when KVM can run an ordinary guest here; otherwise why not, in a few words."""
    if not device.exists():
        return f"{device} does not exist (no KVM module loaded, or the device is not passed into this container)"
    if not os.access(device, os.R_OK | os.W_OK):
        return f"{device} is not readable and writable by this user (add the user to the 'kvm' group)"
    if (sys_modules / "kvm_pvm").exists():
        if pvm_guest_kernel:
            return None
        return (f"{device} is PVM (module kvm_pvm), a software KVM for nested micro-VMs under which a stock "
                "guest kernel dies; set pvm_guest_kernel = true only for a guest kernel built for PVM")
    try:
        flags = cpuinfo.read_text(errors="replace")
    except OSError as exc:
        return f"cannot read {cpuinfo} to check for vmx/svm: {exc}"
    words = set(flags.split())
    if "vmx" not in words and "svm" not in words:
        return ("the CPU shows no vmx/svm flag (virtualization is off in the firmware, or this machine is a VM "
                "without nested virtualization)")
    return None


def choose_accelerator(setting: str, *, allow_tcg: bool, pvm_guest_kernel: bool = False,
                       problem: str | None | bool = False) -> Accelerator:
    """The accelerator for `setting` ("auto", "kvm" or "tcg"); HostCheckError when none is allowed.

    `problem` is the result of :func:`kvm_problem` when the caller already has it (tests pass
    their own); by default it is checked here.
    """
    if setting not in ("auto", "kvm", "tcg"):
        raise HostCheckError(f"[kvm] accelerator {setting!r} is not one of auto, kvm, tcg")
    if setting == "tcg":
        if not allow_tcg:
            raise HostCheckError("[kvm] accelerator = \"tcg\" needs allow_tcg = true (TCG emulates the CPU: "
                                 "roughly 5-10x slower than KVM)")
        return Accelerator("tcg", "TCG chosen in the settings")
    found = kvm_problem(pvm_guest_kernel=pvm_guest_kernel) if problem is False else problem
    if found is None:
        return Accelerator("kvm", "KVM is usable")
    if setting == "kvm" or not allow_tcg:
        raise HostCheckError(
            f"KVM is not usable here: {found}; to run the VMs under QEMU's TCG emulation instead (slow), "
            "set allow_tcg = true in the [kvm] section or ARENA_KVM__ALLOW_TCG=true"
        )
    return Accelerator("tcg", f"KVM is not usable here ({found}); TCG allowed")


@dataclass(frozen=True)
class HostResources:
    """What the host has for VMs right now."""

    cpus: int
    memory_available_mib: int

    @classmethod
    def measure(cls) -> HostResources:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cpus = os.cpu_count() or 1
        return cls(cpus=cpus, memory_available_mib=psutil.virtual_memory().available // (1024 * 1024))


def admit_pool(pool_size: int, *, memory_mib: int, vcpus: int, overhead_mib: int, vcpu_overcommit: float,
               host: HostResources | None = None) -> None:
    """HostCheckError (one line) when `pool_size` VMs of this size do not fit the host.

    Memory: each VM counts its whole guest memory plus QEMU's own overhead (device models, the
    TCG translation cache), against the memory available now. vCPUs: at most
    `vcpu_overcommit` per host CPU, since an overcommitted guest misses its deadlines.
    """
    host = host or HostResources.measure()
    needed_mib = pool_size * (memory_mib + overhead_mib)
    if needed_mib > host.memory_available_mib:
        raise HostCheckError(
            f"a pool of {pool_size} VMs needs {needed_mib} MiB ({memory_mib} MiB guest + {overhead_mib} MiB QEMU "
            f"each) but the host has {host.memory_available_mib} MiB available; use a smaller --pool-size or "
            "memory_mib"
        )
    limit = host.cpus * vcpu_overcommit
    if pool_size * vcpus > limit:
        raise HostCheckError(
            f"a pool of {pool_size} VMs with {vcpus} vCPUs each needs {pool_size * vcpus} vCPUs but the host's "
            f"{host.cpus} CPUs allow {limit:g} (vcpu_overcommit {vcpu_overcommit:g}); use a smaller --pool-size "
            "or vcpus"
        )


def cpu_identity(cpuinfo: Path = CPUINFO) -> str:
    """The host CPU's model name and feature flags (hashed by the caller): a state saved with
    `-cpu host` loads only on a CPU with the same features."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "unknown"
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "flags") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return f"{fields.get('model name', '')}|{fields.get('flags', '')}"


def find_program(name: str, package: str) -> str:
    """The full path of program `name`; HostCheckError naming the Debian package otherwise."""
    path = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
    if path is None:
        raise HostCheckError(f"{name} not found: install Debian's {package} (apt-get install {package})")
    return path


def qemu_version(binary: str) -> str:
    """The first line of `binary --version` (e.g. "QEMU emulator version 7.2.22 (Debian ...)")."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HostCheckError(f"{binary} --version failed: {exc}") from None
    return done.stdout.splitlines()[0].strip() if done.stdout.strip() else "unknown"
