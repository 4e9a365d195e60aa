"""One QEMU machine of the kvm provider: its command line, its process, its saved state.

The command line is built from a :class:`MachineSpec` by a pure function, so a preset (the
Debian test guest, WAA's Windows 11 image) can be checked without starting anything. Every VM
of a pool and the template VM whose ready state the pool starts from get the same devices in
the same order: a saved state loads only into the same machine.

Reachability: the guest's ports are forwarded to 127.0.0.1 only (user-mode networking, the host
port chosen by the kernel and read back from the monitor, so two VMs can never race for one),
the monitor is a Unix socket in the run's private directory, and VNC listens on 127.0.0.1 and
asks for a per-VM password (kept in the run directory, mode 0600). The other way, the guest
reaches nothing on the host or beyond: ``restrict=on``, plus the operator's allowed services
(kvm_net.py).

The ready state is written with QMP ``migrate`` to a pipe whose reading end this process copies
to the file, and loaded with ``-incoming fd:N`` from the open file: no shell, no ``exec:``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from adapters.vms.base import how_it_ended
from adapters.vms.kvm_net import GuestForward, netdev_options
from adapters.vms.qmp import QMPConnectionError, QMPError, qmp_client

DISK_BUSES = ("virtio-blk", "virtio-scsi", "sata", "ide")

# One row of HMP "info usernet" for a forwarded port:
#   TCP[HOST_FORWARD]  13       127.0.0.1 37283       10.0.2.15  5000     0     0
_FORWARD_ROW = re.compile(
    r"TCP\[HOST_FORWARD\]\s+\d+\s+(?P<host>\S+)\s+(?P<hport>\d+)\s+(?P<guest>\S+)\s+(?P<gport>\d+)"
)


class QemuError(RuntimeError):
    """QEMU could not start, exited, or did not do what the monitor asked; the message says which."""


@dataclass(frozen=True)
class Disk:
    """A disk of the machine. `path` None marks the VM's own system disk (its overlay)."""

    path: Path | None
    fmt: str = "qcow2"
    bus: str = "virtio-blk"
    readonly: bool = False


@dataclass(frozen=True)
class MachineSpec:
    """Everything that defines the machine; a saved state loads only into an equal one."""

    binary: str
    accel: str  # "kvm" or "tcg"
    machine: str  # pinned type, e.g. pc-i440fx-7.2
    cpu: str  # "max" under TCG, "host" under KVM, or a named model
    memory_mib: int
    vcpus: int
    disks: tuple[Disk, ...]
    guest_ports: tuple[int, ...]  # forwarded to 127.0.0.1; the first is the WAA server's
    kernel: Path | None = None
    initrd: Path | None = None
    append: str | None = None
    uefi_code: Path | None = None  # read-only firmware; its variables are a per-VM copy
    uefi_vars: Path | None = None  # the template of the variables store
    tpm: bool = False  # a TPM 2.0 from swtpm, one per VM
    nic_model: str = "virtio-net-pci"
    mac: str | None = None
    user_net: str | None = None  # extra -netdev user options, e.g. net=20.20.20.0/24,dhcpstart=20.20.20.21
    vga: str = "none"
    vnc: bool = True  # on 127.0.0.1, behind a per-VM password (set_vnc_password)
    tb_size_mib: int | None = 64  # TCG translation cache: caps QEMU's own memory
    extra_args: tuple[str, ...] = ()
    restrict_net: bool = True  # the guest reaches nothing on the host or beyond (kvm_net.py)
    guest_forwards: tuple[GuestForward, ...] = ()  # ...except these allowed services

    def state_identity(self) -> dict[str, object]:
        """What a saved state depends on (the cache key's machine part); paths excluded."""
        return {
            "accel": self.accel, "machine": self.machine, "cpu": self.cpu, "memory_mib": self.memory_mib,
            "vcpus": self.vcpus, "disks": [(d.path is None, d.fmt, d.bus, d.readonly) for d in self.disks],
            "guest_ports": list(self.guest_ports), "append": self.append, "uefi": self.uefi_code is not None,
            "tpm": self.tpm, "nic": self.nic_model, "mac": self.mac, "user_net": self.user_net, "vga": self.vga,
            "vnc": self.vnc, "tb_size_mib": self.tb_size_mib if self.accel == "tcg" else None,
            "extra_args": list(self.extra_args),
            # Not part of what the guest's state holds (the network's policy is QEMU's, set by
            # the command line of whichever process loads the state), but every option of the
            # command line is named here, so a state is only ever loaded into the machine it
            # was saved from; a changed allow-list costs one cold boot.
            "restrict_net": self.restrict_net,
            "guest_forwards": [(f.guest_ip, f.guest_port, str(f.entry)) for f in self.guest_forwards],
        }


@dataclass(frozen=True)
class VMPaths:
    """The files of one VM in the run directory."""

    overlay: Path  # copy-on-write over the ready disk (or the golden image for the template)
    qmp_socket: Path
    serial_log: Path
    qemu_log: Path
    uefi_vars: Path | None = None  # copy-on-write over the variables template
    tpm_dir: Path | None = None
    vnc_password: Path | None = None  # the VNC password (mode 0600), for the operator to read
    relay_dir: Path | None = None  # the slot files of the allowed connections' relays

    @classmethod
    def in_dir(cls, directory: Path, name: str, spec: MachineSpec) -> VMPaths:
        return cls(
            overlay=directory / f"{name}.qcow2",
            qmp_socket=directory / f"{name}.qmp",
            serial_log=directory / f"{name}.serial.log",
            qemu_log=directory / f"{name}.qemu.log",
            uefi_vars=directory / f"{name}.vars.qcow2" if spec.uefi_code is not None else None,
            tpm_dir=directory / f"{name}.tpm" if spec.tpm else None,
            vnc_password=directory / f"{name}.vnc-password" if spec.vnc else None,
            relay_dir=directory / f"{name}.relay" if spec.guest_forwards else None,
        )

    def all(self) -> list[Path]:
        optional = [p for p in (self.uefi_vars, self.tpm_dir, self.vnc_password, self.relay_dir) if p is not None]
        return [self.overlay, self.qmp_socket, self.serial_log, self.qemu_log, *optional]


def _drive_args(index: int, disk: Disk, path: Path, cache: str, boot: bool) -> list[str]:
    drive = f"file={path},if=none,id=disk{index},format={disk.fmt},cache={cache}"
    if disk.readonly:
        drive += ",readonly=on"
    device = {
        "virtio-blk": f"virtio-blk-pci,drive=disk{index}",
        "virtio-scsi": f"scsi-hd,drive=disk{index},bus=scsi0.0",
        "sata": f"ide-hd,drive=disk{index},bus=ahci0.{index}",
        "ide": f"ide-hd,drive=disk{index},bus=ide.{index}",
    }[disk.bus]
    if boot:
        device += ",bootindex=0"
    return ["-drive", drive, "-device", device]


def build_command(spec: MachineSpec, paths: VMPaths, *, system_disk: Path, incoming_fd: int | None = None,
                  name: str = "waa-vm") -> list[str]:
    """The QEMU command line for one VM; pure (tests check presets with it)."""
    for disk in spec.disks:
        if disk.bus not in DISK_BUSES:
            raise ValueError(f"disk bus {disk.bus!r} is not one of {', '.join(DISK_BUSES)}")
    accel = "kvm" if spec.accel == "kvm" else (
        f"tcg,tb-size={spec.tb_size_mib}" if spec.tb_size_mib else "tcg")
    cmd = [
        spec.binary, "-name", f"{name},debug-threads=on", "-machine", spec.machine, "-accel", accel,
        "-cpu", spec.cpu, "-smp", str(spec.vcpus), "-m", f"{spec.memory_mib}M",
        # Nothing implicit: every device is named below, so template and clones match.
        "-nodefaults", "-no-user-config", "-display", "none", "-vga", spec.vga,
        "-qmp", f"unix:{paths.qmp_socket},server=on,wait=off",
        "-serial", f"file:{paths.serial_log}",
    ]
    if spec.vnc:
        # The first free display from 5900 on, on loopback only; the monitor says which. No
        # viewer gets in until set_vnc_password has given this VM its password.
        cmd += ["-vnc", "127.0.0.1:0,to=99,password=on"]
    if spec.kernel is not None:
        cmd += ["-kernel", str(spec.kernel)]
        if spec.initrd is not None:
            cmd += ["-initrd", str(spec.initrd)]
        if spec.append:
            cmd += ["-append", spec.append]
    if spec.uefi_code is not None:
        if paths.uefi_vars is None:
            raise ValueError("UEFI firmware needs a per-VM variables file")
        cmd += ["-drive", f"if=pflash,unit=0,format=raw,readonly=on,file={spec.uefi_code}",
                "-drive", f"if=pflash,unit=1,format=qcow2,file={paths.uefi_vars}"]
    buses = {d.bus for d in spec.disks}
    if "virtio-scsi" in buses:
        cmd += ["-device", "virtio-scsi-pci,id=scsi0"]
    if "sata" in buses:
        cmd += ["-device", "ahci,id=ahci0"]
    for index, disk in enumerate(spec.disks):
        path = system_disk if disk.path is None else disk.path
        # The VM's own overlay is thrown away after the run: no flushes to the host's disk.
        # The firmware boots the first disk; a direct kernel boot needs no boot order (and owns index 0).
        cmd += _drive_args(index, disk, path, "unsafe" if disk.path is None else "writethrough",
                           boot=index == 0 and spec.kernel is None)
    options = ["user", "id=net0", *([spec.user_net] if spec.user_net else []),
               *netdev_options(spec.guest_forwards, paths.relay_dir, restrict=spec.restrict_net),
               *(f"hostfwd=tcp:127.0.0.1:0-:{port}" for port in spec.guest_ports)]
    netdev = ",".join(options)
    nic = f"{spec.nic_model},netdev=net0" + (f",mac={spec.mac}" if spec.mac else "")
    cmd += ["-netdev", netdev, "-device", nic]
    if spec.tpm:
        if paths.tpm_dir is None:
            raise ValueError("a TPM needs a per-VM state directory")
        cmd += ["-chardev", f"socket,id=chrtpm,path={paths.tpm_dir / 'swtpm.sock'}",
                "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0"]
    if incoming_fd is not None:
        cmd += ["-incoming", f"fd:{incoming_fd}"]
    cmd += list(spec.extra_args)
    return cmd


def create_overlay(backing: Path, backing_format: str, overlay: Path, qemu_img: str = "qemu-img") -> None:
    """A new qcow2 `overlay` over `backing` (which is only ever read through it)."""
    overlay.unlink(missing_ok=True)
    done = subprocess.run(
        [qemu_img, "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", backing_format, str(overlay)],
        capture_output=True, text=True, timeout=60,
    )
    if done.returncode != 0:
        raise QemuError(f"qemu-img create {overlay} over {backing} failed: {done.stderr.strip() or done.returncode}")


def tail(path: Path, lines: int = 12) -> str:
    """The last lines of a log, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


@dataclass
class QemuProcess:
    """A running QEMU (and its swtpm when the machine has a TPM)."""

    name: str
    paths: VMPaths
    popen: subprocess.Popen[bytes]
    command: list[str]
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_description(self) -> str:
        """Why it is gone: its exit code and the end of its own log and of the serial console."""
        code = self.popen.poll()
        how = "is running" if code is None else how_it_ended(code)
        details = [f"QEMU of {self.name} {how}"]
        if log := tail(self.paths.qemu_log, 4):
            details.append(f"QEMU said: {log}")
        if serial := tail(self.paths.serial_log, 4):
            details.append(f"console: {serial}")
        return "; ".join(details)

    def stop(self, grace_seconds: float = 3.0) -> None:
        """QMP quit, SIGTERM, then SIGKILL: whichever ends it first. Safe to repeat."""
        if self.alive():
            try:
                with qmp_client(str(self.paths.qmp_socket), timeout=min(2.0, grace_seconds)) as qmp:
                    qmp.execute("quit")
            except (QMPError, QMPConnectionError, OSError):
                pass
            try:
                self.popen.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                _terminate(self.popen, grace_seconds)
        for helper in self.helpers:
            _terminate(helper, grace_seconds)


def _terminate(popen: subprocess.Popen[bytes], grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL after `grace_seconds`; nothing when it has ended."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(grace_seconds)


def start_swtpm(tpm_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """A TPM 2.0 emulator on a Unix socket in `tpm_dir` (swtpm, Debian's swtpm package)."""
    binary = shutil.which("swtpm")
    if binary is None:
        raise QemuError("the machine has a TPM but swtpm is not installed (apt-get install swtpm)")
    tpm_dir.mkdir(parents=True, exist_ok=True)
    socket_path = tpm_dir / "swtpm.sock"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [binary, "socket", "--tpm2", "--tpmstate", f"dir={tpm_dir}", "--ctrl", f"type=unixio,path={socket_path}",
             "--terminate"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise QemuError(f"swtpm did not start: {tail(log)}")
        time.sleep(0.02)
    return process


def start_qemu(spec: MachineSpec, paths: VMPaths, *, name: str, system_disk: Path,
               incoming_state: Path | None = None) -> QemuProcess:
    """Start QEMU for one VM; with `incoming_state`, it resumes from that saved state.

    QEMU runs in its own session: a Ctrl-C in the terminal reaches `arena run`, which tears the
    pool down in order, instead of killing every VM under the attempts still running.
    """
    helpers = [start_swtpm(paths.tpm_dir, paths.qemu_log)] if spec.tpm and paths.tpm_dir else []
    if paths.relay_dir is not None:
        paths.relay_dir.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(incoming_state, os.O_RDONLY) if incoming_state is not None else None
    command = build_command(spec, paths, system_disk=system_disk, incoming_fd=fd, name=name)
    try:
        with open(paths.qemu_log, "ab") as log:
            popen = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(fd,) if fd is not None else (), start_new_session=True,
            )
    except OSError as exc:
        for helper in helpers:
            helper.kill()
        raise QemuError(f"cannot start {spec.binary} for {name}: {exc}") from exc
    finally:
        if fd is not None:
            os.close(fd)
    return QemuProcess(name=name, paths=paths, popen=popen, command=command, helpers=helpers)


def wait_for_monitor(process: QemuProcess, deadline_seconds: float) -> None:
    """Block until the monitor socket accepts a session; QemuError when QEMU dies first."""
    end = time.monotonic() + deadline_seconds
    while True:
        if not process.alive():
            raise QemuError(process.exit_description())
        if process.paths.qmp_socket.exists():
            try:
                with qmp_client(str(process.paths.qmp_socket), timeout=5):
                    return
            except QMPConnectionError:
                pass
        if time.monotonic() > end:
            raise QemuError(f"the monitor of {process.name} did not answer within {deadline_seconds:g} s")
        time.sleep(0.02)


def wait_running(process: QemuProcess, deadline_seconds: float) -> None:
    """Block until the guest runs (a VM started from a saved state is "inmigrate" until it is
    loaded). Probing before that costs seconds: the user network's first connection attempt to a
    guest that is not running yet is only retried after its retransmission timeout."""
    end = time.monotonic() + deadline_seconds
    with qmp_client(str(process.paths.qmp_socket), timeout=30) as qmp:
        while True:
            state = qmp.status()
            if state == "running":
                return
            if state not in ("inmigrate", "prelaunch", "restore-vm"):
                raise QemuError(f"{process.name} is {state!r} after loading its state, not running")
            if not process.alive():
                raise QemuError(process.exit_description())
            if time.monotonic() > end:
                raise QemuError(f"{process.name} did not finish loading its state within {deadline_seconds:g} s")
            time.sleep(0.01)


def parse_forwards(info_usernet: str) -> dict[int, int]:
    """Guest port -> host port of each forwarded TCP port in HMP ``info usernet`` output."""
    return {int(m.group("gport")): int(m.group("hport")) for m in _FORWARD_ROW.finditer(info_usernet)}


def read_endpoints(qmp_socket: Path, guest_ports: Sequence[int]) -> tuple[dict[int, int], str | None]:
    """The host ports forwarded to `guest_ports`, and the VNC address (None without VNC)."""
    with qmp_client(str(qmp_socket), timeout=10) as qmp:
        forwards = parse_forwards(qmp.human("info usernet"))
        vnc = qmp.execute("query-vnc")
    missing = [port for port in guest_ports if port not in forwards]
    if missing:
        raise QemuError(f"the monitor lists no forward for guest port(s) {missing}")
    address = None
    if isinstance(vnc, dict) and vnc.get("enabled"):
        address = f"{vnc.get('host')}:{vnc.get('service')}"
    return forwards, address


def set_vnc_password(qmp_socket: Path, password_file: Path) -> None:
    """Give the VM's VNC display a new random password and write it to `password_file` (mode
    0600, the run directory being 0700): the operator reads it there, nothing logs it.

    VNC's password authentication takes at most 8 characters (a DES challenge): 8 random
    URL-safe characters, 48 bits. The file is written first, so a display never has a password
    nobody can read.
    """
    password = secrets.token_urlsafe(6)  # 8 characters
    partial = password_file.with_name(password_file.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(password + "\n")
    os.replace(partial, password_file)
    try:
        with qmp_client(str(qmp_socket), timeout=10) as qmp:
            qmp.execute("set_password", {"protocol": "vnc", "password": password})
    except (QMPError, QMPConnectionError) as exc:
        raise QemuError(f"setting the VNC password failed: {exc}") from exc


def save_state(qmp_socket: Path, target: Path, *, timeout: float = 300.0) -> float:
    """Write the running VM's whole state to `target` (QMP migrate to a pipe); its seconds.

    The VM ends in QEMU's "postmigrate" state: the caller quits it. The file is written under a
    temporary name and renamed when complete, so a reader never sees half a state.
    """
    partial = target.with_name(target.name + ".partial")
    read_end, write_end = os.pipe()
    copied: list[BaseException] = []

    def copy() -> None:
        try:
            with os.fdopen(read_end, "rb") as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
                sink.flush()
                os.fsync(sink.fileno())
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            copied.append(exc)

    copier = threading.Thread(target=copy, name="qemu-state-copy", daemon=True)
    copier.start()
    start = time.monotonic()
    try:
        with qmp_client(str(qmp_socket), timeout=30) as qmp:
            qmp.execute("getfd", {"fdname": "waa-state"}, fds=[write_end])
            os.close(write_end)
            write_end = -1
            qmp.execute("migrate", {"uri": "fd:waa-state"})
            while True:
                info = qmp.execute("query-migrate")
                status = info.get("status") if isinstance(info, dict) else None
                if status == "completed":
                    break
                if status in ("failed", "cancelled"):
                    raise QemuError(f"saving the VM state failed: {info.get('error-desc', status)}")
                if time.monotonic() - start > timeout:
                    raise QemuError(f"saving the VM state took more than {timeout:g} s")
                time.sleep(0.02)
    except (QMPError, QMPConnectionError) as exc:
        raise QemuError(f"saving the VM state failed: {exc}") from exc
    finally:
        if write_end >= 0:
            os.close(write_end)
        copier.join(60)
    if copied:
        raise QemuError(f"writing the VM state to {partial} failed: {copied[0]}")
    os.replace(partial, target)
    return time.monotonic() - start
