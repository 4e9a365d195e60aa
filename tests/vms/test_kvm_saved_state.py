"""The kvm provider's cached ready state is checked before any VM starts from it: a damaged one
(a file cut short, a changed byte) is named in one line and replaced, never loaded.

The first test needs no QEMU; the second starts a real VM from a cache whose saved state was cut
short (as a full disk leaves a copy), under TCG on these machines.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.vms import kvm_image
from adapters.vms.kvm import KVMProvider, KVMSettings, _Template

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vms has no __init__.py

from kvm_guest import qemu_under, skip_reason  # noqa: E402


def _saved(directory: Path, state: bytes = b"state" * 1000, disk: bytes = b"disk" * 100) -> _Template:
    """A ready state as the provider saves one: its files and a manifest with their SHA-256."""
    directory.mkdir(parents=True)
    template = _Template(directory, "k")
    template.state.write_bytes(state)
    template.disk.write_bytes(disk)
    template.manifest.write_text(json.dumps({"key": "k", "sha256": {
        "state.bin": hashlib.sha256(state).hexdigest(), "ready.qcow2": hashlib.sha256(disk).hexdigest()}}))
    return template


def test_a_damaged_saved_state_is_named_moved_aside_and_never_used(tmp_path: Path) -> None:
    lines: list[str] = []
    provider = KVMProvider(KVMSettings(cache_dir=tmp_path), log=lines.append)
    sound = _saved(tmp_path / "ready-sound")
    assert sound.damaged() is None and provider._sound(sound)  # noqa: SLF001 - the check itself
    damaged = _saved(tmp_path / "ready-k")
    data = bytearray(damaged.state.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, as a disk error leaves it: QEMU would load it
    damaged.state.write_bytes(bytes(data))
    assert damaged.damaged() == damaged.state
    assert not provider._sound(damaged)  # noqa: SLF001
    assert not damaged.directory.exists()  # never used again
    (aside,) = tmp_path.glob("ready-k.damaged-*")
    assert (aside / "state.bin").read_bytes() == bytes(data)
    (line,) = lines
    assert str(damaged.state) in line and "SHA-256" in line and str(aside) in line and "saving a new one" in line


def test_a_manifest_from_before_checksums_gets_them_once(tmp_path: Path) -> None:
    template = _saved(tmp_path / "ready-old")
    template.manifest.write_text(json.dumps({"key": "k"}))
    assert template.damaged() is None
    assert json.loads(template.manifest.read_text())["sha256"] == template.checksums()
    template.disk.write_bytes(b"changed")
    assert template.damaged() == template.disk


def _settings(cache: Path, runtime: Path) -> KVMSettings:
    return KVMSettings(allow_tcg=True, cache_dir=cache, runtime_dir=runtime / "run", start_timeout_seconds=240.0,
                       ready_timeout_seconds=600.0)


@pytest.fixture()
def cut_short_cache(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A cache holding the real guest (linked) and a copy of its ready state whose state file
    was cut in half; the real cache is left alone."""
    if skip_reason() is not None:
        pytest.skip(str(skip_reason()))
    real = kvm_image.cache_root()
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in real.iterdir():
        if entry.name.startswith(("base-", "code-")) and not entry.name.endswith(".lock"):
            (cache / entry.name).symlink_to(entry)
    runtime = Path(tempfile.mkdtemp(prefix="wks-", dir="/tmp"))
    probe = KVMProvider(_settings(cache, runtime))
    key = probe.template_key()
    source, target = real / f"ready-{key}", cache / f"ready-{key}"
    if (source / "state.bin").is_file():
        shutil.copytree(source, target)
    else:  # this code version has none cached yet: save one here (a cold boot)
        probe._prepare()  # noqa: SLF001
        probe.close()
    state = target / "state.bin"
    state.chmod(0o644)
    with state.open("r+b") as f:
        f.truncate(state.stat().st_size // 2)
    yield cache, runtime
    shutil.rmtree(runtime, ignore_errors=True)


def test_a_vm_never_starts_from_a_saved_state_cut_short(cut_short_cache: tuple[Path, Path]) -> None:
    """Before: QEMU loaded the cut state, the VM did not start (exit 3) and the file stayed. Now
    the check names it, moves it aside and saves a new ready state, and the VM starts."""
    cache, runtime = cut_short_cache
    lines: list[str] = []
    provider = KVMProvider(_settings(cache, runtime), "pytest-kvm-state", pool_size=1, log=lines.append)
    try:
        handle = provider.create("vm-0")
        assert handle.base_url.startswith("http://127.0.0.1:")
    finally:
        provider.close()
    assert qemu_under(runtime) == []
    damaged = [line for line in lines if "damaged" in line]
    assert len(damaged) == 1 and "state.bin" in damaged[0] and "moved aside" in damaged[0], lines
    assert list(cache.glob("ready-*.damaged-*"))
