"""The kvm provider against real QEMU: the Debian guest built by adapters/vms/kvm_image.py, running
the product's local WAA environment, under TCG on these machines (their /dev/kvm is PVM) and
under KVM where it works. One pool for the whole module: the guest is cached and every VM starts
from its saved ready state, so no test waits for a boot except the reboot test.

Also the QMP client and guest_reset.py (the code that resets the cloud VMs through dockur's
monitor) against a real QEMU monitor instead of the fake one of test_qmp.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from adapters.vms import kvm_image
from adapters.vms.base import ProviderError, ResetLevel, VMHandle
from adapters.vms.guest_reset import snapshot_reset
from adapters.vms.janitor import sweep
from adapters.vms.kvm import RESET_CHECK_PATH, KVMProvider, KVMSettings
from adapters.vms.qmp import HMP_ERROR_CLASS, QMPClient, QMPConnectionError, QMPError, qmp_client
from adapters.waa.client import WAAClient

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vms has no __init__.py

from kvm_guest import qemu_under, skip_reason  # noqa: E402

MARKER = "C:\\Users\\Docker\\Desktop\\episode-marker.txt"
REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def settings(runtime: Path, **overrides) -> KVMSettings:
    # TCG is allowed: these machines' KVM is PVM; on a host with a usable KVM, KVM is used.
    # reset_timeout bounds the hung-guest test's wait; resets here take well under a second.
    values = dict(allow_tcg=True, runtime_dir=runtime, reset_timeout_seconds=8.0, start_timeout_seconds=240.0,
                  ready_timeout_seconds=600.0)
    values.update(overrides)
    return KVMSettings(**values)


@pytest.fixture(scope="module")
def runtime() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="wkq-", dir="/tmp"))
    yield path / "run"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def kvm(runtime: Path) -> Iterator[KVMProvider]:
    provider = KVMProvider(settings(runtime), "pytest-kvm", pool_size=2)  # the host checks run here
    yield provider
    provider.close()
    assert qemu_under(runtime) == []
    assert not runtime.exists() or list(runtime.iterdir()) == []


@pytest.fixture(scope="module")
def pool(kvm: KVMProvider) -> list[VMHandle]:
    """Two VMs started at once from the ready state (the first run of a new code version boots
    the template once)."""
    handles: dict[str, VMHandle] = {}
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            handles[name] = kvm.create(name)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(f"waa-pytest-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return [handles["waa-pytest-0"], handles["waa-pytest-1"]]


def client(vm: VMHandle) -> WAAClient:
    return WAAClient(vm.base_url, read_retries=0)


def write_marker(vm: VMHandle, text: str = "written by an episode") -> None:
    c = client(vm)
    try:
        c.setup_create_file(MARKER, text)
        assert c.get_file(MARKER) == text.encode()
    finally:
        c.close()


def marker(vm: VMHandle) -> bytes | None:
    c = client(vm)
    try:
        return c.get_file(MARKER)
    finally:
        c.close()


def open_windows(vm: VMHandle) -> str:
    c = client(vm)
    try:
        return c.obs_winagent().window_names
    finally:
        c.close()


# -- the pool ---------------------------------------------------------------------------------


def test_vms_answer_only_on_this_host(kvm: KVMProvider, pool: list[VMHandle], runtime: Path) -> None:
    for vm in pool:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", vm.base_url)
        c = client(vm)
        assert c.probe() and c.platform() == "Windows"  # the simulation inside the guest
        c.close()
        process = psutil.Process(vm.details["pid"])
        listening = [conn.laddr for conn in process.net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        assert str(vm.details["vnc"]).startswith("127.0.0.1:59")
        socket_path = Path(vm.details["qmp"])
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert socket_path.parent.stat().st_mode & 0o777 == 0o700 and socket_path.parent.parent == runtime
    assert kvm.environment.startswith("local-simulation")  # labelled as the simulation it is


def vnc_login(address: str, password: str | None) -> tuple[list[int], int | None]:
    """A VNC viewer's handshake (RFB 3.8): the security types offered, and the result of the
    password login (0 = in) when `password` is given and VNC authentication is offered."""
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        reader = sock.makefile("rb")
        assert reader.read(12).startswith(b"RFB 003.")
        sock.sendall(b"RFB 003.008\n")
        count = reader.read(1)[0]
        offered = list(reader.read(count))
        if password is None or 2 not in offered:
            return offered, None
        sock.sendall(bytes([2]))
        challenge = reader.read(16)
        # VNC's DES key is the password's bytes, each with its bits reversed (the protocol's quirk).
        key = bytes(int(f"{b:08b}"[::-1], 2) for b in password.encode().ljust(8, b"\0")[:8])
        encryptor = Cipher(TripleDES(key * 3), modes.ECB()).encryptor()  # 3 x the same key = DES
        sock.sendall(encryptor.update(challenge) + encryptor.finalize())
        return offered, int.from_bytes(reader.read(4), "big")


def test_vnc_asks_for_the_password_kept_in_the_run_directory(pool: list[VMHandle], runtime: Path) -> None:
    passwords = []
    for vm in pool:
        password_file = Path(vm.details["vnc_password_file"])
        assert password_file.parent.parent == runtime and password_file.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        passwords.append(password)
        assert len(password) == 8  # what VNC's password authentication takes
        offered, _ = vnc_login(vm.details["vnc"], None)
        assert offered == [2]  # VNC authentication only: no "None" type for a viewer without it
        assert vnc_login(vm.details["vnc"], password)[1] == 0
        wrong = "x" * 8 if password != "x" * 8 else "y" * 8
        assert vnc_login(vm.details["vnc"], wrong)[1] == 1
        # The password is only in its file: not in the details, QEMU's command line or its logs.
        assert password not in repr(vm.details)
        assert password not in " ".join(psutil.Process(vm.details["pid"]).cmdline())
        for log in Path(vm.details["qmp"]).parent.glob(f"{vm.vm_id}.*.log"):
            assert password not in log.read_text(errors="replace")
    assert passwords[0] != passwords[1]  # one per VM


def test_each_vm_has_its_own_overlay_and_the_golden_image_is_never_written(pool: list[VMHandle]) -> None:
    golden = kvm_image.base_image().golden
    before = golden.stat().st_mtime_ns
    assert not os.access(golden, os.W_OK) or os.geteuid() == 0
    assert golden.stat().st_mode & 0o222 == 0
    chains = []
    for vm in pool:
        info = subprocess.run(["qemu-img", "info", "-U", "--backing-chain", vm.details["overlay"]],
                              capture_output=True, text=True, check=True).stdout
        files = re.findall(r"^image: (.+)$", info, re.M)
        chains.append(files)
        assert files[0] == vm.details["overlay"] and files[1].endswith("ready.qcow2") and files[2] == str(golden)
    assert chains[0][0] != chains[1][0] and chains[0][1:] == chains[1][1:]
    write_marker(pool[0])
    assert golden.stat().st_mtime_ns == before


def test_snapshot_reset_restores_disk_and_memory_and_leaves_other_vms_alone(kvm: KVMProvider,
                                                                            pool: list[VMHandle]) -> None:
    a, b = pool
    for vm in pool:
        write_marker(vm)
        c = client(vm)
        c.setup_launch("notepad")  # a running program: state that lives in memory only
        c.close()
        deadline = time.monotonic() + 30
        while "Notepad" not in open_windows(vm) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Notepad" in open_windows(vm)
    start = time.monotonic()
    kvm.reset(a, ResetLevel.SNAPSHOT)
    took = time.monotonic() - start
    assert marker(a) is None and "Notepad" not in open_windows(a)
    assert marker(b) is not None and "Notepad" in open_windows(b)  # resetting one VM leaves the other alone
    kvm.reset(b, ResetLevel.SNAPSHOT)
    assert marker(b) is None and "Notepad" not in open_windows(b)
    assert took < kvm.settings.reset_timeout_seconds  # a restore, not a boot (timed in bench/vm_reset.py)
    for _ in range(3):  # the snapshot is reusable, task after task
        write_marker(a)
        kvm.reset(a, ResetLevel.SNAPSHOT)
        assert marker(a) is None


def test_a_reset_that_keeps_the_state_is_refused(kvm: KVMProvider, pool: list[VMHandle]) -> None:
    """The verification: a snapshot that captured an episode's state (saved again after the check
    file was written) restores nothing, and the reset fails instead of handing out a dirty VM."""
    a = pool[0]
    c = client(a)
    c.setup_create_file(RESET_CHECK_PATH, "left by an earlier episode")
    c.close()
    with qmp_client(a.details["qmp"], timeout=120) as qmp:
        qmp.savevm(kvm.settings.snapshot_name)  # the baseline now holds the check file
    with pytest.raises(ProviderError, match="did not restore the guest.*still there"):
        kvm.reset(a, ResetLevel.SNAPSHOT)
    # The disk reset replaces the dirtied VM with a clean one under the same name.
    old_pid, old_url = a.details["pid"], a.base_url
    kvm.reset(a, ResetLevel.DISK)
    assert a.details["pid"] != old_pid
    c = client(a)
    assert c.probe() and c.get_file(RESET_CHECK_PATH) is None
    c.close()
    write_marker(a)
    kvm.reset(a, ResetLevel.SNAPSHOT)  # its new snapshot is the ready state again
    assert marker(a) is None
    print(f"disk reset moved {old_url} to {a.base_url}")


def test_reboot_reset_boots_the_guest_again(kvm: KVMProvider, pool: list[VMHandle]) -> None:
    b = pool[1]
    pid = b.details["pid"]
    c = client(b)
    c.setup_launch("notepad")
    c.close()
    start = time.monotonic()
    kvm.reset(b, ResetLevel.REBOOT)
    assert b.details["pid"] == pid and client(b).probe()  # same QEMU process, guest booted again
    assert "Notepad" not in open_windows(b)
    print(f"reboot reset took {time.monotonic() - start:.1f} s")
    kvm.reset(b, ResetLevel.SNAPSHOT)  # back to the ready state for the next test


# -- faults -----------------------------------------------------------------------------------


@pytest.fixture
def spare(kvm: KVMProvider) -> Iterator[VMHandle]:
    """A VM of its own for a test that breaks it."""
    vm = kvm.create(f"waa-pytest-spare-{time.monotonic_ns() % 100000}")
    yield vm
    kvm.delete(vm)
    assert not Path(vm.details["overlay"]).exists() and not Path(vm.details["qmp"]).exists()


def test_killed_qemu_is_a_provider_error_and_a_replacement_serves(kvm: KVMProvider, spare: VMHandle) -> None:
    os.kill(spare.details["pid"], signal.SIGKILL)
    time.sleep(0.3)
    with pytest.raises(ProviderError, match="killed by signal 9"):
        kvm.reset(spare, ResetLevel.SNAPSHOT)
    fresh = kvm.replace(spare, spare.vm_id + "-r1")
    try:
        assert client(fresh).probe() and fresh.details["pid"] != spare.details["pid"]
        assert not Path(spare.details["overlay"]).exists()
    finally:
        kvm.delete(fresh)


def test_hung_guest_is_a_provider_error(kvm: KVMProvider, spare: VMHandle) -> None:
    with qmp_client(spare.details["qmp"]) as qmp:
        qmp.stop()  # the guest stops answering; the forwarded port still accepts connections
    start = time.monotonic()
    with pytest.raises(ProviderError, match="did not take the check file"):
        kvm.reset(spare, ResetLevel.SNAPSHOT)
    assert time.monotonic() - start < kvm.settings.reset_timeout_seconds + 15


def test_monitor_gone_is_a_provider_error(kvm: KVMProvider, spare: VMHandle) -> None:
    Path(spare.details["qmp"]).unlink()  # the socket goes away; QEMU and the guest still run
    with pytest.raises(ProviderError, match="loadvm waa-ready failed.*cannot connect"):
        kvm.reset(spare, ResetLevel.SNAPSHOT)


# -- the QMP client and guest_reset against a real monitor -----------------------------------


def test_qmp_client_speaks_to_real_qemu(pool: list[VMHandle]) -> None:
    vm = pool[0]
    version = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout
    major, minor = map(int, re.search(r"version (\d+)\.(\d+)", version).groups())  # type: ignore[union-attr]
    with QMPClient(vm.details["qmp"], None, timeout=60) as qmp:
        assert qmp.greeting is not None
        assert (qmp.greeting["QMP"]["version"]["qemu"]["major"], qmp.greeting["QMP"]["version"]["qemu"]["minor"]) == (
            major, minor)
        assert qmp.status() == "running"
        assert "waa-ready" in qmp.snapshots()  # real "info snapshots" output parsed
        qmp.savevm("pytest-extra")
        assert {"waa-ready", "pytest-extra"} <= set(qmp.snapshots())
        qmp.delvm("pytest-extra")
        assert "pytest-extra" not in qmp.snapshots()
        with pytest.raises(QMPError) as missing:
            qmp.loadvm("never-saved")
        assert missing.value.error_class == HMP_ERROR_CLASS and "never-saved" in missing.value.desc
        assert qmp.status() in ("running", "restore-vm", "paused")
        if qmp.status() != "running":
            qmp.cont()
        with pytest.raises(QMPError) as unknown:
            qmp.execute("no-such-command")
        assert unknown.value.error_class == "CommandNotFound"
        qmp.system_reset()
        qmp.status()  # reading the next reply collects the RESET event
        assert qmp.events_named("RESET")
    # The reset above rebooted the guest; the cloud providers' snapshot reset brings it back.
    timing = snapshot_reset(vm.details["qmp"], vm.base_url, "waa-ready", ready_deadline=60, poll_seconds=0.05)
    assert timing.level is ResetLevel.SNAPSHOT and client(vm).probe()


def test_qmp_unix_socket_that_is_not_there_is_a_connection_error(runtime: Path) -> None:
    with pytest.raises(QMPConnectionError, match="unix:.*nothing.qmp: connect"):
        with QMPClient(str(runtime / "nothing.qmp"), None, timeout=1):
            pass


# -- leftovers of a run that was killed --------------------------------------------------------


def test_janitor_removes_the_vms_of_a_killed_owner(runtime: Path) -> None:
    """A process that started a VM is SIGKILLed (no teardown): its QEMU keeps running and its
    run directory stays, until `arena janitor --provider kvm` (the same sweep) removes both."""
    base = runtime.parent / "orphans"
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from adapters.vms.kvm import KVMProvider, KVMSettings
        provider = KVMProvider(KVMSettings(allow_tcg=True, runtime_dir={str(base)!r}, start_timeout_seconds=240), "orphan-run")
        vm = provider.create("waa-orphan-0")
        print(vm.details["pid"], flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        qemu_pid = int(owner.stdout.readline())  # type: ignore[union-attr]
        owner.kill()
        owner.wait()
        assert psutil.pid_exists(qemu_pid) and qemu_under(base)
        provider = KVMProvider(KVMSettings(runtime_dir=base), "janitor")
        report = sweep(provider)
        assert sorted(r.kind for r in report.deleted) == ["run_dir", "vm"] and not report.failed
        assert qemu_under(base) == [] and list(base.iterdir()) == []
    finally:
        if owner.poll() is None:
            owner.kill()
        for process in qemu_under(base):
            process.kill()


# -- WAA's Windows 11 preset, without Windows -------------------------------------------------


def test_windows11_preset_machine_starts_and_snapshots_under_real_qemu(runtime: Path, tmp_path: Path) -> None:
    """No Windows image here: the preset's machine (q35, UEFI with a per-VM variables overlay,
    a raw disk on virtio-scsi, dockur's 20.20.20.0/24 network with both forwards, USB tablet,
    local-time clock) is started on a blank disk, sits in the firmware, and can be saved and
    restored: a Windows guest on it could be snapshotted. TCG here, so no Hyper-V flags."""
    code, vars_ = Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
    if not code.exists() or not vars_.exists():
        pytest.skip("OVMF is not installed (apt-get install ovmf)")
    from adapters.vms.kvm_qemu import VMPaths, create_overlay, read_endpoints, start_qemu, wait_for_monitor
    from adapters.vms.kvm_runtime import RunDirectory

    disk = tmp_path / "data.img"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(disk), "64M"], check=True)
    provider = KVMProvider(KVMSettings(preset="waa-windows11", disk_image=disk, uefi_code=code, uefi_vars=vars_,
                                       memory_mib=512, vcpus=1, allow_tcg=True, runtime_dir=runtime), "win-preset")
    spec = provider.machine_spec()
    run_dir = RunDirectory.create(runtime, "win-preset")
    paths = VMPaths.in_dir(run_dir.path, "win", spec)
    create_overlay(disk, "raw", paths.overlay)
    assert paths.uefi_vars is not None
    create_overlay(vars_, "raw", paths.uefi_vars)
    process = start_qemu(spec, paths, name="win", system_disk=paths.overlay)
    try:
        wait_for_monitor(process, 60)
        forwards, vnc = read_endpoints(paths.qmp_socket, spec.guest_ports)
        assert set(forwards) == {5000, 9222} and str(vnc).startswith("127.0.0.1:")
        with QMPClient(str(paths.qmp_socket), None, timeout=120) as qmp:
            assert "20.20.20.21" in qmp.human("info usernet")  # forwards reach dockur's guest address
            qtree = qmp.human("info qtree")
            assert re.search(r'dev: scsi-hd.*?drive = "disk0"', qtree, re.S) and "dev: usb-tablet" in qtree
            assert qmp.status() == "running"
            qmp.savevm("waa-ready")  # the per-VM variables store is qcow2: snapshots work
            qmp.loadvm("waa-ready")
            assert qmp.snapshots() == ["waa-ready"] and qmp.status() == "running"
    finally:
        process.stop()
        run_dir.remove()
