"""The kvm provider: a pool of real QEMU/KVM virtual machines on this host.

From one golden disk image, each VM of the pool gets its own copy-on-write overlay (the golden
image is never written). The first VM the provider needs makes the **ready state** once: a
template VM cold-boots, its WAA server answers ``/probe``, and its whole state (memory, devices)
is saved to a file with its disk as a read-only layer, all cached by a key naming the image, the
guest code, the QEMU build, machine type, CPU model and the machine's devices (a saved state
loads only into the same ones). Every VM then starts from that state (``-incoming``), not a
boot: 0.5-0.8 s to an answering server on a quiet host, 2-5 s on this project's loaded 2-core
hosts, both under TCG; it saves the ready state once more as an internal snapshot of its own
overlay (``savevm``, 0.1-0.5 s).

Reset levels (measured on this project's 2-core machines under TCG, bench/vm_reset.py):

* ``snapshot``: ``loadvm`` of that internal snapshot through the monitor (guest_reset.py, the
  same code that resets the cloud VMs through dockur's monitor); RAM, devices and disk all go
  back. Chosen over restarting a clone from the saved state because it keeps the QEMU process,
  its port and its warm translation cache: median 0.6 s against 1.2 s, measured interleaved on
  one VM here (docs/kvm.md).
* ``reboot``: ``system_reset``; the guest boots again, disk changes survive.
* ``disk``: the QEMU process is replaced by a new clone on a fresh overlay.

Every snapshot and disk reset is verified: a check file is written into the guest before the
reset and must be gone after it, or the reset fails (and the VM is replaced, never used dirty).

Guests are isolated: their network reaches nothing on the host or beyond except the services
the operator lists in ``guest_allow`` (kvm_net.py), and each VM's VNC display asks for its own
password, kept in the run directory (docs/kvm.md, "What a guest can reach").

Faults are infrastructure errors: a QEMU that exited, a guest that stopped answering or a monitor
that went away surface as ``ProviderError`` from ``reset`` or as WAA connection errors during
the attempt (outcome rule R1); the pool replaces the VM and the task is retried.

Settings come from the ``[kvm]`` section of the cloud config (or ``ARENA_KVM__*`` variables),
starting from a named preset: ``debian-sim`` (the default; the Debian test guest running the
product's local WAA environment, see kvm_image.py) or ``waa-windows11`` (WAA's prepared
Windows 11 image; see docs/kvm.md, not run on this project's machines).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.vms import kvm_desktop, kvm_host, kvm_image, kvm_net
from adapters.vms.base import OwnedResource, ProviderError, ResetLevel, VMHandle, VMProvider
from adapters.vms.guest_reset import reboot_reset, snapshot_reset, take_baseline_snapshot
from adapters.vms.kvm_qemu import (
    Disk,
    MachineSpec,
    QemuError,
    QemuProcess,
    VMPaths,
    create_overlay,
    read_endpoints,
    save_state,
    set_vnc_password,
    start_qemu,
    wait_for_monitor,
    wait_running,
)
from adapters.vms.kvm_runtime import RunDirectory, default_base_dir, end_process, run_directories
from adapters.vms.qmp import validate_snapshot_name
from adapters.waa.client import WAAClient, WAATimeouts
from adapters.waa.errors import WAAError
from adapters.waa.settle import SettlePolicy
from adapters.whole_files import replace_text

# A file written into the guest before each verified reset; the reset must make it disappear.
RESET_CHECK_PATH = "C:\\Users\\Docker\\waa-arena-reset-check.txt"

PRESETS: dict[str, Mapping[str, Any]] = {
    # The Debian guest (kvm_image.py): small, boots in ~10 s under TCG, runs the simulation.
    "debian-sim": {
        **kvm_image.DEBIAN_VM,
        "memory_mib": 512,
        "ready_timeout_seconds": 300.0,
        "start_timeout_seconds": 120.0,
        "reset_timeout_seconds": 120.0,
        "memory_overhead_mib": 256,
    },
    # WAA's prepared Windows 11 image as dockur/windows runs it (WAA's frozen dockur: qemux/qemu
    # 5.18 with BOOT_MODE=windows): q35, UEFI (OVMF 4M, the storage's windows.rom/windows.vars),
    # no TPM (WAA's answer file bypasses Windows 11's TPM check), the raw data.img on virtio-scsi,
    # virtio-net on dockur's 20.20.20.0/24 user network, 8 GB and 8 cores (WAA's defaults),
    # WAA's server on 5000 and its DevTools relay on 9222. See docs/kvm.md. Not run here.
    "waa-windows11": {
        "machine": "q35",
        "memory_mib": 8192,
        "vcpus": 8,
        "firmware": "uefi",
        "uefi_code": "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "disk_format": "raw",
        "disk_bus": "virtio-scsi",
        "nic_model": "virtio-net-pci",
        "user_net": "net=20.20.20.0/24,host=20.20.20.1,dhcpstart=20.20.20.21",
        "guest_port": 5000,
        "devtools_port": 9222,
        "vga": "std",
        # dockur passes hv_passthrough, which blocks saving the state; these Hyper-V enlightenments
        # (libvirt's usual set for Windows) can be saved and restored. KVM only.
        "cpu_flags": "hv-relaxed,hv-vapic,hv-spinlocks=0x1fff,hv-time",
        # Windows expects a local-time RTC and no S3/S4 (dockur's own flags); a USB tablet gives
        # VNC viewers an absolute pointer.
        "extra_args": ["-rtc", "base=localtime", "-global", "ICH9-LPC.disable_s3=1", "-global",
                       "ICH9-LPC.disable_s4=1", "-device", "qemu-xhci,id=xhci", "-device", "usb-tablet"],
        "ready_timeout_seconds": 1800.0,
        "start_timeout_seconds": 600.0,
        "reset_timeout_seconds": 300.0,
        "memory_overhead_mib": 1024,
    },
    # A real Linux desktop (kvm_desktop.py, docs/desktop.md): Xvfb, openbox, Mousepad, PCManFM,
    # LibreOffice and AT-SPI behind this product's WAA server for it; 1280 MiB, one vCPU. Its
    # values name the built image in the cache, so they are read when the preset is used.
    "debian-desktop": kvm_desktop.DesktopPreset(),
}


class KVMSettings(BaseModel):
    """The ``[kvm]`` section: a preset, and any of its settings overridden."""

    model_config = ConfigDict(extra="forbid")

    preset: Literal["debian-sim", "waa-windows11", "debian-desktop"] = "debian-sim"
    accelerator: Literal["auto", "kvm", "tcg"] = "auto"
    allow_tcg: bool = False  # without a usable KVM, run under TCG emulation (slow) instead of refusing
    pvm_guest_kernel: bool = False  # /dev/kvm is PVM and the guest kernel is built for it
    qemu_binary: str = "qemu-system-x86_64"
    machine: str = "pc-i440fx-7.2"
    cpu: str | None = None  # default: "host" under KVM, "max" under TCG
    cpu_flags: str | None = None  # appended to the CPU model under KVM (e.g. Hyper-V enlightenments)
    memory_mib: int = Field(512, ge=128)
    vcpus: int = Field(1, ge=1, le=64)
    firmware: Literal["kernel", "uefi", "bios"] = "kernel"
    kernel: Path | None = None  # firmware "kernel": default the Debian guest's
    initrd: Path | None = None
    append: str | None = None
    uefi_code: Path | None = None
    uefi_vars: Path | None = None  # the variables store to start from (dockur's windows.vars)
    tpm: bool = False  # a TPM 2.0 per VM from swtpm
    disk_image: Path | None = None  # the golden image; None = the Debian test guest
    disk_format: Literal["qcow2", "raw"] = "qcow2"
    disk_bus: Literal["virtio-blk", "virtio-scsi", "sata", "ide"] = "virtio-blk"
    nic_model: str = "virtio-net-pci"
    mac: str | None = None  # keep the MAC the guest was prepared with (dockur's windows.mac)
    user_net: str | None = None  # extra user-mode network options (addresses only: never restrict/hostfwd/guestfwd)
    # HOST:PORT services the guests may connect to (each at its own guest address, kvm_net.py);
    # none by default: the guests reach nothing on the host or beyond. A list in the file, a
    # comma-separated string in ARENA_KVM__GUEST_ALLOW (a str in the type so that the
    # environment's form is not read as JSON).
    guest_allow: list[str] | str = Field(default_factory=list)
    guest_port: int = Field(kvm_image.GUEST_PORT, ge=1, le=65535)  # the WAA server's port in the guest
    devtools_port: int | None = Field(None, ge=1, le=65535)  # the browser's DevTools port in the guest
    vga: str = "none"
    vnc: bool = True  # a VNC display on 127.0.0.1 for people who want to watch
    extra_args: list[str] = Field(default_factory=list)
    tb_size_mib: int = Field(64, ge=16)  # TCG's translation cache per VM
    ready_timeout_seconds: float = Field(300.0, gt=0)  # the template's cold boot until /probe answers
    start_timeout_seconds: float = Field(120.0, gt=0)  # a VM started from the ready state
    reset_timeout_seconds: float = Field(120.0, gt=0)
    memory_overhead_mib: int = Field(256, ge=0)  # QEMU's own memory per VM, for the admission check
    vcpu_overcommit: float = Field(2.0, gt=0)  # vCPUs allowed per host CPU
    verify_resets: bool = True
    snapshot_name: str = "waa-ready"
    runtime_dir: Path | None = None  # run directories (default: the system temp dir)
    cache_dir: Path | None = None  # ready states and the Debian guest (default: $ARENA_KVM_CACHE)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            preset = data.get("preset", "debian-sim")
            if preset in PRESETS:
                return {**PRESETS[preset], **data}
        return data

    @field_validator("guest_allow", mode="before")
    @classmethod
    def _parse_allow(cls, value: Any) -> list[str]:
        return [str(entry) for entry in kvm_net.parse_allow(value)]

    @model_validator(mode="after")
    def _check(self) -> KVMSettings:
        validate_snapshot_name(self.snapshot_name)
        kvm_net.check_user_net(self.user_net)
        self.guest_forwards()  # refuses an allow-list the guest network has no room for
        if self.firmware == "uefi" and self.uefi_code is None:
            raise ValueError("firmware 'uefi' needs uefi_code (e.g. /usr/share/OVMF/OVMF_CODE_4M.fd from ovmf)")
        if self.disk_image is None and self.preset != "debian-sim":
            raise ValueError(f"preset {self.preset!r} needs disk_image (the prepared guest's disk)")
        return self

    @property
    def simulation(self) -> bool:
        """The Debian test guest runs the local simulation, not Windows."""
        return self.disk_image is None

    def guest_forwards(self) -> tuple[kvm_net.GuestForward, ...]:
        """The allowed services, each at the guest address it is reached at."""
        return kvm_net.guest_forwards(kvm_net.parse_allow(self.guest_allow), self.user_net)


@dataclass
class _Template:
    """The cached ready state every VM starts from."""

    directory: Path
    key: str

    @property
    def disk(self) -> Path:
        return self.directory / "ready.qcow2"

    @property
    def uefi_vars(self) -> Path:
        return self.directory / "ready-vars.qcow2"

    @property
    def state(self) -> Path:
        return self.directory / "state.bin"

    @property
    def manifest(self) -> Path:
        return self.directory / "manifest.json"

    def exists(self) -> bool:
        return self.state.is_file() and self.disk.is_file() and self.manifest.is_file()

    def files(self) -> list[Path]:
        """The saved files a VM starts from: the state, the disk layer, the firmware variables."""
        return [self.state, self.disk] + ([self.uefi_vars] if self.uefi_vars.is_file() else [])

    def checksums(self) -> dict[str, str]:
        """SHA-256 of each saved file, by name (what the manifest records when it is saved)."""
        return {path.name: _sha256(path) for path in self.files()}

    def damaged(self) -> Path | None:
        """The first saved file whose SHA-256 is not the one the manifest recorded, or None. A
        manifest from before checksums were recorded gets them now (the files are taken as they
        are, once)."""
        manifest = json.loads(self.manifest.read_text())
        recorded = manifest.get("sha256")
        if not isinstance(recorded, dict):
            manifest["sha256"] = self.checksums()
            replace_text(self.manifest, json.dumps(manifest, indent=2))
            return None
        for path in self.files():
            if recorded.get(path.name) != _sha256(path):
                return path
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class _VM:
    handle: VMHandle
    process: QemuProcess
    paths: VMPaths


class KVMProvider(VMProvider):
    """VMs as QEMU processes on this host, each on its own overlay, started from a saved state."""

    name = "kvm"

    def __init__(self, settings: KVMSettings | None = None, run_id: str = "kvm", *, pool_size: int | None = None,
                 log: Any = None) -> None:
        """Checks nothing without `pool_size` (the janitor only lists leftovers); with it, checks
        before any VM starts that QEMU, the accelerator, the guest image and the host's room for
        `pool_size` VMs are all there (ValueError, one line)."""
        self.settings = settings or KVMSettings()
        self.run_id = run_id
        self._log = log or (lambda message: None)
        self._lock = threading.Lock()
        self._prepare_lock = threading.Lock()
        self._vms: dict[str, _VM] = {}
        # QEMU processes started but not (yet) a VM of the pool: the template, clones still coming
        # up. close() ends them too, so a teardown racing a start leaves nothing behind.
        self._starting: dict[str, QemuProcess] = {}
        self._run_dir: RunDirectory | None = None
        self._template: _Template | None = None
        self._accelerator: kvm_host.Accelerator | None = None
        self._spec: MachineSpec | None = None
        self._closed = False
        self.settle = SettlePolicy.fixed(0.0) if self.settings.simulation else SettlePolicy()
        if pool_size is not None:
            self.check_host(pool_size)

    # -- checks before anything starts ----------------------------------------------------------

    def check_host(self, pool_size: int) -> None:
        """ValueError (one line) when this host cannot run `pool_size` of these VMs."""
        s = self.settings
        kvm_host.find_program(s.qemu_binary, "qemu-system-x86")
        kvm_host.find_program("qemu-img", "qemu-utils")
        kvm_host.admit_pool(pool_size, memory_mib=s.memory_mib, vcpus=s.vcpus, overhead_mib=s.memory_overhead_mib,
                            vcpu_overcommit=s.vcpu_overcommit)
        self.accelerator  # noqa: B018 - raises when no accelerator is allowed
        if s.simulation:
            image = kvm_image.base_image(self._cache())
            if not image.exists():
                raise kvm_host.HostCheckError(
                    f"the kvm provider's Debian guest is not built (no {image.golden}); build it once with "
                    "`python -m adapters.vms.kvm_image build` (root, mmdebstrap)")
            kvm_host.find_program("mke2fs", "e2fsprogs")
        else:
            for label, path in (("disk_image", s.disk_image), ("uefi_code", s.uefi_code), ("uefi_vars", s.uefi_vars),
                                ("kernel", s.kernel), ("initrd", s.initrd)):
                if path is not None and not Path(path).is_file():
                    raise kvm_host.HostCheckError(f"[kvm] {label} {path} does not exist")

    @property
    def accelerator(self) -> kvm_host.Accelerator:
        if self._accelerator is None:
            self._accelerator = kvm_host.choose_accelerator(
                self.settings.accelerator, allow_tcg=self.settings.allow_tcg,
                pvm_guest_kernel=self.settings.pvm_guest_kernel)
        return self._accelerator

    # -- what the provider is -----------------------------------------------------------------

    @property
    def environment(self) -> str:
        accel = self._accelerator.name.upper() if self._accelerator else "KVM/TCG"
        if self.settings.simulation:
            # Labelled as the simulation it is, wherever a user sees it (summary, DuckDB, reports).
            return f"local-simulation (in a Debian VM, QEMU {accel})"
        return f"kvm ({self.settings.preset}, QEMU {accel})"

    @property
    def image_id(self) -> str | None:
        if self.settings.simulation:
            return f"kvm:debian-sim:base-{kvm_image.base_key()}:code-{kvm_image.code_key()}"
        return f"kvm:{self.settings.preset}:{self.settings.disk_image}"

    def supported_reset_levels(self) -> set[ResetLevel]:
        return {ResetLevel.SETUP, ResetLevel.SNAPSHOT, ResetLevel.REBOOT, ResetLevel.DISK}

    def _cache(self) -> Path:
        return self.settings.cache_dir or kvm_image.cache_root()

    # -- the machine and its ready state -------------------------------------------------------

    def machine_spec(self) -> MachineSpec:
        """The machine every VM of this provider is (the Debian guest's paths filled in)."""
        if self._spec is not None:
            return self._spec
        s = self.settings
        accel = self.accelerator
        cpu = s.cpu or ("host" if accel.is_kvm else "max")
        if s.cpu_flags and accel.is_kvm:
            cpu = f"{cpu},{s.cpu_flags}"
        kernel, initrd, append = s.kernel, s.initrd, s.append
        if s.simulation:
            image = kvm_image.base_image(self._cache())
            kernel, initrd = kernel or image.kernel, initrd or image.initrd
            append = append or f"{kvm_image.KERNEL_APPEND} waa.port={s.guest_port}"
            disks: tuple[Disk, ...] = (Disk(None, "qcow2", "virtio-blk"),
                                       Disk(kvm_image.build_code_disk(self._cache()), "raw", "virtio-blk", readonly=True))
        else:
            disks = (Disk(None, "qcow2", s.disk_bus),)
        ports = (s.guest_port,) + ((s.devtools_port,) if s.devtools_port else ())
        self._spec = MachineSpec(
            binary=shutil.which(s.qemu_binary) or s.qemu_binary, accel=accel.name, machine=s.machine,
            cpu=cpu, memory_mib=s.memory_mib, vcpus=s.vcpus, disks=disks, guest_ports=ports,
            kernel=kernel if s.firmware == "kernel" else None, initrd=initrd if s.firmware == "kernel" else None,
            append=append if s.firmware == "kernel" else None,
            uefi_code=s.uefi_code if s.firmware == "uefi" else None,
            uefi_vars=(s.uefi_vars or _ovmf_vars_template(s.uefi_code)) if s.firmware == "uefi" else None,
            tpm=s.tpm, nic_model=s.nic_model, mac=s.mac, user_net=s.user_net, vga=s.vga, vnc=s.vnc,
            tb_size_mib=s.tb_size_mib, extra_args=tuple(s.extra_args), restrict_net=True,
            guest_forwards=s.guest_forwards(),
        )
        return self._spec

    def _golden(self) -> tuple[Path, str]:
        if self.settings.simulation:
            return kvm_image.base_image(self._cache()).golden, "qcow2"
        assert self.settings.disk_image is not None
        return Path(self.settings.disk_image).resolve(), self.settings.disk_format

    def template_key(self) -> str:
        """The ready state's cache key: image, guest code, QEMU build, machine, CPU, devices."""
        spec = self.machine_spec()
        golden, _ = self._golden()
        if self.settings.simulation:
            image = {"base": kvm_image.base_key(), "code": kvm_image.code_key()}
        else:
            stat = golden.stat()
            image = {"disk": str(golden), "size": stat.st_size, "mtime": stat.st_mtime_ns,
                     "vars": str(spec.uefi_vars) if spec.uefi_vars else None}
        files = {"kernel": spec.kernel, "initrd": spec.initrd, "uefi_code": spec.uefi_code}
        identity = {name: [str(path), path.stat().st_size] for name, path in files.items() if path is not None}
        host_cpu = kvm_host.cpu_identity() if spec.cpu.split(",")[0] == "host" else None  # "host" is this CPU
        return kvm_image.digest({"image": image, "files": identity, "qemu": kvm_host.qemu_version(spec.binary),
                                 "machine": spec.state_identity(), "host_cpu": host_cpu})

    def ready_state_info(self) -> dict[str, Any] | None:
        """What the cached ready state's manifest records (boot and save times...), None if not made."""
        manifest = self._cache() / f"ready-{self.template_key()}" / "manifest.json"
        return json.loads(manifest.read_text()) if manifest.is_file() else None

    def _prepare(self) -> tuple[RunDirectory, _Template]:
        """The run directory and the ready state (made once, cached across runs), under a lock."""
        with self._prepare_lock:
            if self._closed:
                raise ProviderError("the kvm provider is closed")
            if self._run_dir is None:
                try:
                    self._run_dir = RunDirectory.create(self.settings.runtime_dir or default_base_dir(), self.run_id)
                except (OSError, ValueError) as exc:
                    raise ProviderError(f"kvm provider: cannot create its run directory: {exc}") from exc
            if self._template is None:
                try:
                    self._template = self._ready_state(self._run_dir)
                except (kvm_host.HostCheckError, kvm_image.ImageError, QemuError, OSError) as exc:
                    raise ProviderError(f"kvm provider: no ready state to start VMs from: {exc}") from exc
            return self._run_dir, self._template

    def _ready_state(self, run_dir: RunDirectory) -> _Template:
        key = self.template_key()
        template = _Template(self._cache() / f"ready-{key}", key)
        with kvm_image.cache_lock(template.directory.with_suffix(".lock")):
            if template.exists() and self._sound(template):
                return template
            self._log(f"kvm: booting the template VM to save its ready state (cache key {key}; once per version)")
            for stale in template.directory.parent.glob(template.directory.name + ".*.partial"):
                shutil.rmtree(stale, ignore_errors=True)  # a builder that was killed; we hold the lock
            work = template.directory.with_name(template.directory.name + f".{os.getpid()}.partial")
            work.mkdir(parents=True)
            try:
                self._boot_and_save(run_dir, work, key)
                if template.directory.exists():
                    shutil.rmtree(template.directory)
                os.replace(work, template.directory)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return template

    def _sound(self, template: _Template) -> bool:
        """Whether the cached ready state is as it was saved (its files' SHA-256 against the
        manifest's), checked before any VM starts from it. A damaged one is moved aside, named
        in one line with what happens next (a new one is saved now), and False returned."""
        try:
            damaged = template.damaged()
            why = f"{damaged} does not have the SHA-256 recorded when it was saved" if damaged else None
        except (OSError, ValueError) as exc:  # an unreadable file or manifest is damaged too
            why = f"{template.directory} cannot be read ({exc})"
        if why is None:
            return True
        aside = template.directory.with_name(f"{template.directory.name}.damaged-{int(time.time())}")
        os.replace(template.directory, aside)
        self._log(f"kvm: the saved ready state is damaged: {why}; moved aside to {aside} (delete it) and saving a "
                  f"new one now (one cold boot of the template VM)")
        return False

    def _launch(self, run_dir: RunDirectory, name: str, spec: MachineSpec, paths: VMPaths, system_disk: Path,
                incoming: Path | None = None) -> QemuProcess:
        """Start QEMU and record it, atomically with respect to close()."""
        with self._lock:
            if self._closed:
                raise ProviderError(f"kvm VM {name}: the provider is closing; not started")
            process = start_qemu(spec, paths, name=name, system_disk=system_disk, incoming_state=incoming)
            self._starting[name] = process
            try:
                run_dir.record_process(name, process.pid)
            except OSError:
                process.stop()
                self._starting.pop(name, None)
                raise
        return process

    def _started(self, name: str) -> None:
        with self._lock:
            self._starting.pop(name, None)

    def _boot_and_save(self, run_dir: RunDirectory, work: Path, key: str) -> None:
        """Cold-boot the template VM, wait for /probe, save its state into `work`."""
        spec = self.machine_spec()
        golden, golden_format = self._golden()
        partial = _Template(work, key)
        create_overlay(golden, golden_format, partial.disk)
        name = "template"
        paths = VMPaths.in_dir(run_dir.path, name, spec)
        if spec.uefi_vars is not None:
            create_overlay(spec.uefi_vars, "raw", partial.uefi_vars)
            paths = dataclasses.replace(paths, uefi_vars=partial.uefi_vars)
        start = time.monotonic()
        process = self._launch(run_dir, name, spec, paths, partial.disk)
        try:
            wait_for_monitor(process, 60)
            forwards, _ = read_endpoints(paths.qmp_socket, spec.guest_ports)
            url = f"http://127.0.0.1:{forwards[spec.guest_ports[0]]}"
            _wait_answering(process, url, self.settings.ready_timeout_seconds, "cold boot of the template VM")
            boot_seconds = time.monotonic() - start
            save_seconds = save_state(paths.qmp_socket, partial.state)
        finally:
            process.stop()
            self._started(name)
            run_dir.forget_process(name)
            for path in (paths.qmp_socket, paths.serial_log, paths.qemu_log):
                path.unlink(missing_ok=True)
            if paths.relay_dir is not None:
                shutil.rmtree(paths.relay_dir, ignore_errors=True)
        # Both layers are only read from now on: every VM writes to its own overlay.
        partial.disk.chmod(0o444)
        if spec.uefi_vars is not None:
            partial.uefi_vars.chmod(0o444)
        partial.manifest.write_text(json.dumps({
            "key": key, "preset": self.settings.preset, "accelerator": spec.accel,
            "qemu": kvm_host.qemu_version(spec.binary), "machine": spec.machine, "cpu": spec.cpu,
            "base_key": kvm_image.base_key() if self.settings.simulation else None,
            "code_key": kvm_image.code_key() if self.settings.simulation else None,
            "boot_seconds": round(boot_seconds, 2), "save_seconds": round(save_seconds, 2),
            "state_bytes": partial.state.stat().st_size,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sha256": partial.checksums(),  # checked before every use (`_sound`)
        }, indent=2))

    # -- VMs --------------------------------------------------------------------------------------

    def create(self, vm_id: str) -> VMHandle:
        run_dir, template = self._prepare()
        with self._lock:
            existing = self._vms.get(vm_id)
        if existing is not None and existing.process.alive():
            return existing.handle
        vm = self._start_clone(vm_id, run_dir, template)
        with self._lock:
            self._starting.pop(vm_id, None)
            closed = self._closed
            if not closed:
                self._vms[vm_id] = vm
        if closed:
            self._dispose(vm)
            raise ProviderError(f"kvm VM {vm_id}: the provider closed while it started")
        return vm.handle

    def _start_clone(self, vm_id: str, run_dir: RunDirectory, template: _Template) -> _VM:
        spec = self.machine_spec()
        paths = VMPaths.in_dir(run_dir.path, vm_id, spec)
        start = time.monotonic()
        process: QemuProcess | None = None
        try:
            create_overlay(template.disk, "qcow2", paths.overlay)
            if paths.uefi_vars is not None:
                create_overlay(template.uefi_vars, "qcow2", paths.uefi_vars)
            process = self._launch(run_dir, vm_id, spec, paths, paths.overlay, template.state)
            wait_for_monitor(process, 60)
            wait_running(process, self.settings.start_timeout_seconds)
            forwards, vnc = read_endpoints(paths.qmp_socket, spec.guest_ports)
            if paths.vnc_password is not None:
                set_vnc_password(paths.qmp_socket, paths.vnc_password)
            base_url = f"http://127.0.0.1:{forwards[spec.guest_ports[0]]}"
            _wait_answering(process, base_url, self.settings.start_timeout_seconds, "start from the ready state")
            started = time.monotonic() - start
            # The ready state again, as an internal snapshot of this VM's own overlay: what
            # every snapshot reset restores (guest_reset.py, as on the cloud VMs).
            baseline = take_baseline_snapshot(str(paths.qmp_socket), base_url, self.settings.snapshot_name,
                                              ready_deadline=self.settings.start_timeout_seconds,
                                              monitor_timeout=120, poll_seconds=0.05)
        except (QemuError, ProviderError, OSError) as exc:
            detail = process.exit_description() if process is not None and not process.alive() else str(exc)
            if process is not None:
                process.stop()
                self._started(vm_id)
            run_dir.forget_process(vm_id)
            _remove(paths)
            raise ProviderError(f"kvm VM {vm_id} did not start: {detail}") from exc
        devtools = (f"http://127.0.0.1:{forwards[spec.guest_ports[1]]}" if len(spec.guest_ports) > 1
                    else base_url)  # the simulation answers DevTools requests with a clear 501
        handle = VMHandle(
            vm_id=vm_id, base_url=base_url, provider=self.name, devtools_url=devtools,
            details={"pid": process.pid, "qmp": str(paths.qmp_socket), "overlay": str(paths.overlay), "vnc": vnc,
                     # where the operator reads the VNC password; never the password itself
                     "vnc_password_file": str(paths.vnc_password) if paths.vnc_password else None,
                     "guest_allow": [forward.describe() for forward in spec.guest_forwards],
                     "accelerator": spec.accel, "start_seconds": round(started, 3),
                     "snapshot_seconds": round(baseline.monitor_seconds, 3)},
            fresh=True,  # started from the ready state, which is also what its snapshot resets restore
        )
        return _VM(handle, process, paths)

    def _get(self, vm: VMHandle) -> _VM:
        with self._lock:
            found = self._vms.get(vm.vm_id)
        if found is None:
            raise ProviderError(f"kvm VM {vm.vm_id} is not one of this provider's VMs (deleted or never created)")
        return found

    def vm_down(self, vm: VMHandle) -> str | None:
        """QEMU's exit (code or signal) with the end of its log and console, when it has ended."""
        with self._lock:
            state = self._vms.get(vm.vm_id)
        if state is None or state.process.alive():
            return None
        return state.process.exit_description()

    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        state = self._get(vm)
        if not state.process.alive():
            raise ProviderError(f"kvm VM {vm.vm_id}: {state.process.exit_description()}")
        if level is ResetLevel.SETUP:
            return
        if level is ResetLevel.REBOOT:
            try:
                reboot_reset(str(state.paths.qmp_socket), vm.base_url,
                             ready_deadline=self.settings.ready_timeout_seconds, poll_seconds=0.2, settle_seconds=0.5)
            except ProviderError as exc:
                raise self._failure(vm, state, exc) from exc
            return
        verify = self.settings.verify_resets
        if verify:
            self._write_check(vm)
        if level is ResetLevel.SNAPSHOT:
            try:
                snapshot_reset(str(state.paths.qmp_socket), vm.base_url, self.settings.snapshot_name,
                               ready_deadline=self.settings.reset_timeout_seconds, monitor_timeout=120,
                               poll_seconds=0.05)
            except ProviderError as exc:
                raise self._failure(vm, state, exc) from exc
        elif level is ResetLevel.DISK:
            self._replace_in_place(vm, state)
        else:  # pragma: no cover - every level is handled above
            raise ProviderError(f"reset level {level.value!r} is not available for the kvm provider")
        if verify:
            self._check_gone(vm, level)

    def _failure(self, vm: VMHandle, state: _VM, exc: Exception) -> ProviderError:
        """The error, with QEMU's own last words when the process is gone."""
        if not state.process.alive():
            return ProviderError(f"kvm VM {vm.vm_id}: {state.process.exit_description()} ({exc})")
        return exc if isinstance(exc, ProviderError) else ProviderError(f"kvm VM {vm.vm_id}: {exc}")

    def _write_check(self, vm: VMHandle) -> None:
        """Write the check file into the guest (the state an episode would leave behind)."""
        token = f"waa-arena reset check {secrets.token_hex(8)}"
        client = WAAClient(vm.base_url, timeouts=self._check_timeouts(), read_retries=0)
        try:
            client.setup_create_file(RESET_CHECK_PATH, token)
        except WAAError as exc:
            raise ProviderError(f"kvm VM {vm.vm_id}: before the reset, the guest did not take the check file: {exc}") from exc
        finally:
            client.close()

    def _check_timeouts(self) -> WAATimeouts:
        limit = min(20.0, self.settings.reset_timeout_seconds)
        return WAATimeouts(connect=limit, default=limit, probe=limit)

    def _check_gone(self, vm: VMHandle, level: ResetLevel) -> None:
        client = WAAClient(vm.base_url, timeouts=self._check_timeouts(), read_retries=1)
        try:
            left = client.get_file(RESET_CHECK_PATH)
        except WAAError as exc:
            raise ProviderError(f"kvm VM {vm.vm_id}: after the {level.value} reset the guest did not answer: {exc}") from exc
        finally:
            client.close()
        if left is not None:
            raise ProviderError(f"kvm VM {vm.vm_id}: the {level.value} reset did not restore the guest: the check file "
                                f"{RESET_CHECK_PATH} written before it is still there")

    def _replace_in_place(self, vm: VMHandle, state: _VM) -> None:
        """The disk reset: a new clone on a fresh overlay under the same name; the handle follows."""
        run_dir, template = self._prepare()
        self._dispose(state)
        with self._lock:
            self._vms.pop(vm.vm_id, None)
        fresh = self._start_clone(vm.vm_id, run_dir, template)
        with self._lock:
            self._starting.pop(vm.vm_id, None)
            self._vms[vm.vm_id] = fresh
        vm.base_url, vm.devtools_url, vm.details = fresh.handle.base_url, fresh.handle.devtools_url, fresh.handle.details
        fresh.handle = vm

    def _dispose(self, state: _VM) -> None:
        state.process.stop()
        if self._run_dir is not None:
            self._run_dir.forget_process(state.handle.vm_id)
        _remove(state.paths)

    def delete(self, vm: VMHandle) -> None:
        with self._lock:
            state = self._vms.pop(vm.vm_id, None)
        if state is not None:
            self._dispose(state)

    def close(self) -> None:
        """Stop every VM and remove the run directory (overlays, sockets, logs); safe to repeat."""
        with self._lock:
            self._closed = True
            states = list(self._vms.values())
            starting = list(self._starting.values())
            self._vms.clear()
        for state in states:
            self._dispose(state)
        for process in starting:  # its starter sees it die and cleans up its own files
            process.stop()
        with self._prepare_lock:  # a run directory being made now is not missed
            if self._run_dir is not None:
                self._run_dir.remove()

    # -- leftovers of earlier runs (the janitor) ---------------------------------------------

    def _base_dir(self) -> Path:
        return self.settings.runtime_dir or default_base_dir()

    def list_owned(self) -> list[OwnedResource]:
        """Run directories and their running QEMU processes (other than this provider's own);
        expired once their owner is gone."""
        owned = []
        mine = self._run_dir.path.resolve() if self._run_dir is not None else None
        for directory in run_directories(self._base_dir()):
            if directory.path == mine:
                continue  # this provider's own VMs, not leftovers: close() removes them
            tags = directory.tags()
            for vm_id, record in directory.processes().items():
                if record.matching() is not None:
                    owned.append(OwnedResource(self.name, "vm", f"{directory.path}::{vm_id}", tags))
            owned.append(OwnedResource(self.name, "run_dir", str(directory.path), tags))
        return owned

    def delete_resource(self, resource: OwnedResource) -> None:
        path_text, _, vm_id = resource.resource_id.partition("::")
        known = {d.path: d for d in run_directories(self._base_dir())}
        directory = known.get(Path(path_text))
        if directory is None:
            raise ProviderError(f"{resource.resource_id} is not a kvm run directory this product made")
        if resource.kind == "vm":
            record = directory.processes().get(vm_id)
            if record is not None:
                end_process(record)
            directory.forget_process(vm_id)
            return
        directory.remove()


def _ovmf_vars_template(code: Path | None) -> Path:
    """OVMF's empty variables store beside its code (OVMF_CODE_4M.fd -> OVMF_VARS_4M.fd)."""
    if code is None:
        raise ValueError("UEFI firmware needs uefi_code")
    return Path(str(code).replace("CODE", "VARS"))


def _remove(paths: VMPaths) -> None:
    for path in paths.all():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _wait_answering(process: QemuProcess, url: str, deadline_seconds: float, what: str) -> float:
    """Poll /probe until it answers; QemuError when QEMU exits first or the deadline passes."""
    client = WAAClient(url, timeouts=WAATimeouts(probe=3.0), read_retries=0)
    start = time.monotonic()
    try:
        while True:
            if not process.alive():
                raise QemuError(f"{what}: {process.exit_description()}")
            if client.probe():
                return time.monotonic() - start
            if time.monotonic() - start > deadline_seconds:
                raise QemuError(f"{what}: the WAA server did not answer /probe within {deadline_seconds:g} s; "
                                f"{process.exit_description()}")
            time.sleep(0.05)
    finally:
        client.close()
