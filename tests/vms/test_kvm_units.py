"""The kvm provider's pure logic: host checks, admission, QEMU command lines (the Debian guest and
WAA's Windows 11 preset), settings, run directories and their leftovers, the guest's code disk.
Nothing here starts QEMU; tests/vms/test_kvm.py does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from adapters.vms import kvm_image
from adapters.vms.base import TAG_EXPIRES_AT, TAG_RUN_ID
from adapters.vms.janitor import sweep
from adapters.vms.kvm import PRESETS, KVMProvider, KVMSettings
from adapters.vms.kvm_host import Accelerator, HostCheckError, HostResources, admit_pool, choose_accelerator, kvm_problem
from adapters.vms.kvm_qemu import Disk, MachineSpec, VMPaths, build_command, parse_forwards
from adapters.vms.kvm_runtime import RunDirectory, remove_leftovers_of, run_directories
from adapters.vms.registry import ProviderSettings, build_provider
from adapters.vms.settings import load_cloud_settings

# -- KVM detection and the accelerator ---------------------------------------------------------


def fake_host(tmp_path: Path, *, device: bool = True, pvm: bool = False, flags: str = "fpu vmx sse2") -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    dev = tmp_path / "kvm"
    if device:
        dev.write_text("")
    modules = tmp_path / "module"
    (modules / ("kvm_pvm" if pvm else "kvm_intel")).mkdir(parents=True)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor : 0\nflags : {flags}\n")
    return {"device": dev, "cpuinfo": cpuinfo, "sys_modules": modules}


def test_kvm_usable_with_vmx_and_a_writable_device(tmp_path: Path) -> None:
    assert kvm_problem(**fake_host(tmp_path)) is None


def test_kvm_problems_are_named(tmp_path: Path) -> None:
    assert "does not exist" in str(kvm_problem(**fake_host(tmp_path / "a", device=False)))
    pvm = kvm_problem(**fake_host(tmp_path / "b", pvm=True))
    assert pvm is not None and "PVM" in pvm and "kvm_pvm" in pvm
    assert kvm_problem(**fake_host(tmp_path / "c", pvm=True), pvm_guest_kernel=True) is None
    assert "vmx/svm" in str(kvm_problem(**fake_host(tmp_path / "d", flags="fpu sse2 hypervisor")))


def test_accelerator_choice() -> None:
    assert choose_accelerator("auto", allow_tcg=False, problem=None) == Accelerator("kvm", "KVM is usable")
    with pytest.raises(HostCheckError) as refused:
        choose_accelerator("auto", allow_tcg=False, problem="/dev/kvm is PVM")
    message = str(refused.value)
    assert "\n" not in message and "/dev/kvm is PVM" in message and "allow_tcg = true" in message
    tcg = choose_accelerator("auto", allow_tcg=True, problem="/dev/kvm is PVM")
    assert tcg.name == "tcg" and "PVM" in tcg.reason
    with pytest.raises(HostCheckError, match="KVM is not usable"):
        choose_accelerator("kvm", allow_tcg=True, problem="no vmx")  # asked for KVM: no silent fallback
    with pytest.raises(HostCheckError, match="needs allow_tcg"):
        choose_accelerator("tcg", allow_tcg=False)
    assert choose_accelerator("tcg", allow_tcg=True).name == "tcg"


def test_this_hosts_kvm_is_detected_as_the_notes_describe() -> None:
    # On the project's machines /dev/kvm is PVM; elsewhere the check must at least answer.
    problem = kvm_problem()
    if Path("/sys/module/kvm_pvm").exists():
        assert problem is not None and "PVM" in problem
    else:
        assert problem is None or isinstance(problem, str)


# -- admission --------------------------------------------------------------------------------


def test_admission_counts_guest_memory_plus_overhead() -> None:
    host = HostResources(cpus=2, memory_available_mib=4000)
    admit_pool(4, memory_mib=512, vcpus=1, overhead_mib=256, vcpu_overcommit=2.0, host=host)  # 3072 MiB, 4 vCPUs
    with pytest.raises(HostCheckError) as info:
        admit_pool(4, memory_mib=8192, vcpus=1, overhead_mib=1024, vcpu_overcommit=2.0, host=host)
    message = str(info.value)
    assert "\n" not in message and "36864 MiB" in message and "4000 MiB available" in message


def test_admission_counts_vcpus_against_host_cpus() -> None:
    host = HostResources(cpus=2, memory_available_mib=1_000_000)
    with pytest.raises(HostCheckError, match="needs 5 vCPUs but the host's 2 CPUs allow 4"):
        admit_pool(5, memory_mib=512, vcpus=1, overhead_mib=0, vcpu_overcommit=2.0, host=host)
    with pytest.raises(HostCheckError, match="needs 32 vCPUs"):
        admit_pool(4, memory_mib=512, vcpus=8, overhead_mib=0, vcpu_overcommit=2.0, host=host)


# -- command lines ----------------------------------------------------------------------------


def debian_spec(**overrides) -> MachineSpec:
    values = dict(binary="qemu-system-x86_64", accel="tcg", machine="pc-i440fx-7.2", cpu="max", memory_mib=512,
                  vcpus=1, disks=(Disk(None), Disk(Path("/c/code.img"), "raw", readonly=True)), guest_ports=(5000,),
                  kernel=Path("/c/vmlinuz"), initrd=Path("/c/initrd.img"), append="console=ttyS0 root=/dev/vda")
    values.update(overrides)
    return MachineSpec(**values)


def test_debian_command_reaches_only_this_host(tmp_path: Path) -> None:
    spec = debian_spec()
    paths = VMPaths.in_dir(tmp_path, "vm1", spec)
    cmd = build_command(spec, paths, system_disk=paths.overlay, incoming_fd=7, name="vm1")
    line = " ".join(cmd)
    assert cmd[0] == "qemu-system-x86_64" and "-nodefaults" in cmd
    assert "hostfwd=tcp:127.0.0.1:0-:5000" in line  # the kernel picks the host port, on loopback
    assert cmd[cmd.index("-vnc") + 1] == "127.0.0.1:0,to=99,password=on"  # no viewer in before its password
    # The guest reaches nothing on the host or beyond (tests/vms/test_kvm_isolation.py tries it).
    assert cmd[cmd.index("-netdev") + 1].split(",")[:3] == ["user", "id=net0", "restrict=on"]
    assert cmd[cmd.index("-qmp") + 1] == f"unix:{tmp_path / 'vm1.qmp'},server=on,wait=off"
    assert "0.0.0.0" not in line and "tcp:" not in cmd[cmd.index("-qmp") + 1]
    assert cmd[cmd.index("-accel") + 1] == "tcg,tb-size=64" and cmd[cmd.index("-machine") + 1] == "pc-i440fx-7.2"
    assert cmd[-2:] == ["-incoming", "fd:7"]
    drives = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-drive"]
    assert drives[0].startswith(f"file={paths.overlay},") and "cache=unsafe" in drives[0]
    assert drives[1].startswith("file=/c/code.img,") and drives[1].endswith("readonly=on")


def test_kvm_accel_has_no_tcg_cache(tmp_path: Path) -> None:
    spec = debian_spec(accel="kvm", cpu="host")
    paths = VMPaths.in_dir(tmp_path, "vm1", spec)
    cmd = build_command(spec, paths, system_disk=paths.overlay)
    assert cmd[cmd.index("-accel") + 1] == "kvm" and cmd[cmd.index("-cpu") + 1] == "host"
    assert "-incoming" not in cmd


def test_waa_windows11_preset_command(tmp_path: Path) -> None:
    disk = tmp_path / "data.img"
    disk.write_bytes(b"")
    settings = KVMSettings(preset="waa-windows11", disk_image=disk, uefi_vars=tmp_path / "windows.vars",
                           mac="02:7f:0d:0e:0f:10", accelerator="kvm")
    assert (settings.machine, settings.memory_mib, settings.vcpus, settings.firmware) == ("q35", 8192, 8, "uefi")
    assert settings.disk_format == "raw" and settings.disk_bus == "virtio-scsi" and not settings.tpm
    provider = KVMProvider(settings, "preset-test")
    provider._accelerator = Accelerator("kvm", "test: as on a workstation with KVM")
    spec = provider.machine_spec()
    paths = VMPaths.in_dir(tmp_path, "win", spec)
    cmd = build_command(spec, paths, system_disk=paths.overlay)
    line = " ".join(cmd)
    assert cmd[cmd.index("-machine") + 1] == "q35" and cmd[cmd.index("-accel") + 1] == "kvm"
    assert cmd[cmd.index("-cpu") + 1] == "host,hv-relaxed,hv-vapic,hv-spinlocks=0x1fff,hv-time"
    assert cmd[cmd.index("-m") + 1] == "8192M" and cmd[cmd.index("-smp") + 1] == "8"
    assert "if=pflash,unit=0,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd" in line
    assert f"if=pflash,unit=1,format=qcow2,file={paths.uefi_vars}" in line
    assert "virtio-scsi-pci,id=scsi0" in cmd and "scsi-hd,drive=disk0,bus=scsi0.0,bootindex=0" in cmd
    netdev = cmd[cmd.index("-netdev") + 1]
    assert "net=20.20.20.0/24" in netdev and "dhcpstart=20.20.20.21" in netdev
    assert "hostfwd=tcp:127.0.0.1:0-:5000" in netdev and "hostfwd=tcp:127.0.0.1:0-:9222" in netdev
    assert "virtio-net-pci,netdev=net0,mac=02:7f:0d:0e:0f:10" in cmd
    assert "base=localtime" in cmd and "usb-tablet" in cmd and "tpm-tis,tpmdev=tpm0" not in cmd
    with_tpm = KVMProvider(settings.model_copy(update={"tpm": True}), "preset-test")
    with_tpm._accelerator = provider._accelerator
    tpm_spec = with_tpm.machine_spec()
    tpm_cmd = build_command(tpm_spec, VMPaths.in_dir(tmp_path, "win", tpm_spec), system_disk=paths.overlay)
    assert "tpm-tis,tpmdev=tpm0" in tpm_cmd and f"socket,id=chrtpm,path={tmp_path / 'win.tpm' / 'swtpm.sock'}" in tpm_cmd
    assert provider.environment.startswith("kvm (waa-windows11") and provider.settle.fixed_seconds is None


def test_state_identity_changes_with_what_a_saved_state_depends_on() -> None:
    base = debian_spec().state_identity()
    assert debian_spec(memory_mib=1024).state_identity() != base
    assert debian_spec(cpu="qemu64").state_identity() != base
    assert debian_spec(machine="pc-i440fx-8.0").state_identity() != base
    assert debian_spec(kernel=Path("/elsewhere/vmlinuz")).state_identity() == base  # paths are keyed apart


def test_parse_forwards_real_info_usernet() -> None:
    text = ("Hub -1 (#net017):\r\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\r\n"
            "  TCP[HOST_FORWARD]  13       127.0.0.1 37283       10.0.2.15  5000     0     0\r\n"
            "  TCP[HOST_FORWARD]  14       127.0.0.1 41001       10.0.2.15  9222     0     0\r\n"
            "  TCP[ESTABLISHED]   25       10.0.2.2 40210       10.0.2.15  5000     0     0\r\n")
    assert parse_forwards(text) == {5000: 37283, 9222: 41001}


# -- settings ---------------------------------------------------------------------------------


def test_settings_presets_and_errors(tmp_path: Path) -> None:
    assert KVMSettings().machine == PRESETS["debian-sim"]["machine"] and KVMSettings().simulation
    assert KVMSettings(memory_mib=1024).memory_mib == 1024  # a preset value overridden
    with pytest.raises(ValueError, match="needs disk_image"):
        KVMSettings(preset="waa-windows11")
    with pytest.raises(ValueError, match="invalid snapshot name"):
        KVMSettings(snapshot_name="x; quit")
    with pytest.raises(ValueError):
        KVMSettings(memroy_mib=1024)  # a misspelled setting is an error, not ignored


def test_kvm_section_from_toml_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "arena.toml"
    config.write_text("[kvm]\nmemory_mib = 768\nvcpus = 2\n")
    monkeypatch.setenv("ARENA_KVM__ALLOW_TCG", "true")
    section = load_cloud_settings(config).kvm
    assert section is not None and (section.memory_mib, section.vcpus, section.allow_tcg) == (768, 2, True)
    assert section.machine == "pc-i440fx-7.2"  # the rest from the preset
    config.write_text("[kvm]\nmemory_mib = 'lots'\n")
    with pytest.raises(ValueError, match="kvm.memory_mib"):
        load_cloud_settings(config)


def test_registry_builds_the_provider_and_admission_refuses_in_one_line(tmp_path: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        pytest.skip("QEMU is not installed (apt-get install qemu-system-x86 qemu-utils)")
    config = tmp_path / "arena.toml"
    config.write_text("[kvm]\nallow_tcg = true\nmemory_mib = 100000000\n")
    provider = build_provider("kvm", ProviderSettings(run_id="r1", cloud_config=config))  # no pool: no checks
    assert isinstance(provider, KVMProvider)
    with pytest.raises(ValueError) as info:
        build_provider("kvm", ProviderSettings(run_id="r1", cloud_config=config, pool_size=2))
    assert "\n" not in str(info.value) and "a pool of 2 VMs needs" in str(info.value)


# -- run directories and leftovers ------------------------------------------------------------


@pytest.fixture
def base() -> Iterator[Path]:
    """A short base directory: Unix socket paths in it must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="wk-", dir="/tmp"))
    yield path / "base"
    for directory in run_directories(path / "base"):
        directory.remove()  # and its entry in the index
    shutil.rmtree(path, ignore_errors=True)


def sleeper(marker: Path) -> subprocess.Popen[bytes]:
    """A real process whose command line names `marker`, as QEMU's names its run directory."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(marker)],
                            start_new_session=True)


def dead_pid() -> tuple[int, float]:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(process.pid).create_time()
    process.wait()
    return process.pid, start


def orphan_run_dir(base: Path, run_id: str) -> tuple[RunDirectory, subprocess.Popen[bytes]]:
    """A run directory whose owner has died, with one recorded process still running."""
    directory = RunDirectory.create(base, run_id)
    owner = json.loads((directory.path / "owner.json").read_text())
    owner["pid"], owner["start_time"] = dead_pid()
    (directory.path / "owner.json").write_text(json.dumps(owner))
    process = sleeper(directory.path)
    time.sleep(0.2)
    directory.record_process("waa-run-0", process.pid)
    (directory.path / "waa-run-0.qcow2").write_bytes(b"overlay")
    return directory, process


def test_run_directory_is_private_and_tagged_while_its_owner_lives(base: Path, tmp_path: Path) -> None:
    directory = RunDirectory.create(base, "20261125-run")
    assert base.stat().st_mode & 0o777 == 0o700
    assert directory.path.stat().st_mode & 0o777 == 0o700
    tags = directory.tags()
    assert tags[TAG_RUN_ID] == "20261125-run" and tags[TAG_EXPIRES_AT].startswith("9999")
    assert directory.owner_alive()
    with pytest.raises(ValueError, match="too long"):
        RunDirectory.create(tmp_path / ("x" * 90), "run")


def test_leftovers_of_a_dead_owner_are_removed_and_only_its_process_is_ended(base: Path, tmp_path: Path) -> None:
    directory, process = orphan_run_dir(base, "dead-run")
    bystander = sleeper(tmp_path / "not-a-run-dir")  # same program, not recorded: never touched
    live = RunDirectory.create(base, "live-run")
    try:
        assert directory.tags()[TAG_EXPIRES_AT] < "2100"  # its owner is gone: expired
        removed = remove_leftovers_of(json.loads((directory.path / "owner.json").read_text())["pid"], base)
        assert removed == [directory.path] and not directory.path.exists()
        assert process.wait(10) is not None
        assert bystander.poll() is None and live.path.exists()
        assert [d.path for d in run_directories(base)] == [live.path]
    finally:
        for p in (process, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_recycled_pid_is_not_signalled(base: Path) -> None:
    directory, process = orphan_run_dir(base, "dead-run")
    try:
        record = directory.processes()["waa-run-0"]
        data = json.loads((directory.path / "waa-run-0.json").read_text())
        data["start_time"] -= 100  # another process that once had this pid
        (directory.path / "waa-run-0.json").write_text(json.dumps(data))
        assert record.matching() is not None
        assert directory.processes()["waa-run-0"].matching() is None
        directory.remove()
        assert process.poll() is None  # not ours any more: left alone
    finally:
        process.kill()
        process.wait()


def test_janitor_sweeps_expired_kvm_leftovers_and_keeps_live_runs(base: Path, tmp_path: Path) -> None:
    directory, process = orphan_run_dir(base, "crashed-run")
    live = RunDirectory.create(base, "running-run")
    provider = KVMProvider(KVMSettings(runtime_dir=base), "janitor")
    try:
        def here(resources):  # the janitor looks only in its runtime_dir
            assert all(r.resource_id.startswith(str(base)) for r in resources)
            return resources

        kinds = sorted((r.kind, r.tags[TAG_RUN_ID]) for r in here(provider.list_owned()))
        assert kinds == [("run_dir", "crashed-run"), ("run_dir", "running-run"), ("vm", "crashed-run")]
        dry = sweep(provider, dry_run=True)
        assert len(here(dry.deleted)) == 2 and directory.path.exists()
        report = sweep(provider)
        assert [r.kind for r in here(report.deleted)] == ["vm", "run_dir"] and not here([r for r, _ in report.failed])
        assert process.wait(10) is not None and not directory.path.exists() and live.path.exists()
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        from adapters.vms.base import OwnedResource
        with pytest.raises(Exception, match="not a kvm run directory this product made"):
            provider.delete_resource(OwnedResource("kvm", "run_dir", str(outside), {}))
        assert outside.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- the guest's code disk --------------------------------------------------------------------


def test_code_key_follows_the_guest_code(tmp_path: Path) -> None:
    files = kvm_image.code_files()
    assert "adapters/waa/localenv/__main__.py" in files and "boot.sh" in files
    assert not any(name.startswith(("flows/", "tasks/")) for name in files)
    changed = dict(files)
    changed["adapters/waa/localenv/server.py"] = files["adapters/waa/localenv/server.py"] + b"\n# edit\n"
    assert kvm_image.code_key(changed) != kvm_image.code_key(files) == kvm_image.code_key()


def test_base_key_names_the_recipe() -> None:
    import dataclasses

    assert kvm_image.base_key() == kvm_image.digest(dataclasses.asdict(kvm_image.RECIPE))
    other = dataclasses.replace(kvm_image.RECIPE, packages=kvm_image.RECIPE.packages + ("vim",))
    assert kvm_image.digest(dataclasses.asdict(other)) != kvm_image.base_key()


def test_cache_lives_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ARENA_KVM_CACHE", raising=False)
    repo = Path(__file__).resolve().parents[2]
    assert repo not in kvm_image.cache_root().parents
    monkeypatch.setenv("ARENA_KVM_CACHE", str(tmp_path / "c"))
    assert kvm_image.cache_root() == tmp_path / "c"


def test_code_disk_is_a_real_ext4_image(tmp_path: Path) -> None:
    if shutil.which("mke2fs") is None or shutil.which("debugfs") is None:
        pytest.skip("e2fsprogs is not installed")
    disk = kvm_image.build_code_disk(tmp_path)
    assert disk == tmp_path / f"code-{kvm_image.code_key()}.img"
    assert disk.stat().st_mode & 0o222 == 0  # read-only: the VMs attach it read-only too
    listing = subprocess.run(["debugfs", "-R", "ls -p /adapters/waa/localenv", str(disk)], capture_output=True,
                             text=True, check=True).stdout
    assert "__main__.py" in listing and "server.py" in listing
    assert kvm_image.build_code_disk(tmp_path) == disk  # reused, not rebuilt


# -- arena run refuses before anything starts ------------------------------------------------


def run_cli(tmp_path: Path, toml: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    from flows.cli import main

    config = tmp_path / "arena.toml"
    config.write_text(toml)
    code = main(["run", "--provider", "kvm", "--cloud-config", str(config), "--db", str(tmp_path / "a.duckdb"),
                 "--artifacts", str(tmp_path / "art"), *extra])
    return code, capsys.readouterr().err


def test_arena_run_names_an_unusable_kvm_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        pytest.skip("QEMU is not installed")
    problem = kvm_problem()
    if problem is None:
        pytest.skip("KVM is usable on this host: nothing to refuse")
    code, err = run_cli(tmp_path, "[kvm]\nmemory_mib = 512\n", capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("arena: error: KVM is not usable here: ") and problem in err and "allow_tcg = true" in err
    assert not (tmp_path / "a.duckdb").exists()  # nothing started, nothing written


def test_arena_run_refuses_a_pool_the_host_cannot_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        pytest.skip("QEMU is not installed")
    code, err = run_cli(tmp_path, "[kvm]\nallow_tcg = true\nmemory_mib = 4000000\n", capsys, "--pool-size", "3")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("arena: error: a pool of 3 VMs needs 12000768 MiB (4000000 MiB guest + 256 MiB QEMU each)")
