"""The kvm provider on this host: image build, ready pools, resets and memory, with real QEMU.

Prints, for the Debian test guest (adapters/vms/kvm_image.py):

- the golden image build: first (the time recorded when the cache was built, or measured now
  with --rebuild into a temporary cache: root, mmdebstrap, 1-5 minutes) and cached;
- the ready state: the template VM's cold boot to an answering WAA server plus saving its state
  (measured now, in a temporary cache beside the real one, unless --keep-ready), and cached;
- the time to a ready pool of 1, 2 and 4 VMs started at once from that state, as the pool starts
  them (each VM: a new overlay, `-incoming` of the state, /probe, savevm of its baseline);
- reset times per level (min / median / max over --resets resets; --reboots for the slow
  reboot level), every snapshot and disk reset verified by the provider's check file, and an
  episode's marker written before each reset checked gone after it;
- memory per VM: resident set and unique set of each QEMU process after start and after the
  resets.

It prints numbers; it asserts nothing. TCG is used where KVM is not usable (this project's
machines: PVM); the accelerator is printed.

    python bench/vm_reset.py [--resets 20] [--reboots 3] [--pools 1,2,4] [--rebuild] [--keep-ready]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from adapters.vms import kvm_image  # noqa: E402
from adapters.vms.base import ResetLevel, VMHandle  # noqa: E402
from adapters.vms.kvm import KVMProvider, KVMSettings  # noqa: E402
from adapters.waa.client import WAAClient  # noqa: E402

MARKER = "C:\\Users\\Docker\\Desktop\\bench-marker.txt"


def line(label: str, value: str) -> None:
    print(f"  {label:<44} {value}")


def stats(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (f"min {min(values):.2f} s / median {statistics.median(values):.2f} s / max {max(values):.2f} s "
            f"(n={len(values)})")


def mib(value: int) -> str:
    return f"{value / (1024 * 1024):.0f} MiB"


def memory(vm: VMHandle) -> tuple[int, int]:
    info = psutil.Process(vm.details["pid"]).memory_full_info()
    return info.rss, info.uss


def settings(runtime: Path, cache: Path | None) -> KVMSettings:
    return KVMSettings(allow_tcg=True, runtime_dir=runtime, cache_dir=cache, start_timeout_seconds=600,
                       ready_timeout_seconds=900, reset_timeout_seconds=120)


def image_section(rebuild: bool, scratch: Path) -> None:
    print("golden image (Debian guest, python -m adapters.vms.kvm_image build)")
    if rebuild:
        start = time.monotonic()
        kvm_image.build_base(scratch / "rebuild-cache", log=lambda _: None)
        line("first build (measured now)", f"{time.monotonic() - start:.1f} s")
    image = kvm_image.base_image()
    if not image.exists():
        raise SystemExit("the Debian guest is not built: python -m adapters.vms.kvm_image build (root, mmdebstrap)")
    manifest = json.loads(image.manifest.read_text())
    line("first build (recorded when cached)", f"{manifest.get('build_seconds')} s on {manifest.get('built_at')}")
    start = time.monotonic()
    kvm_image.build_base()
    kvm_image.build_code_disk()
    line("cached (base and code disk present)", f"{time.monotonic() - start:.3f} s")
    line("packages / golden image size", f"{len(manifest.get('packages', []))} / {mib(image.golden.stat().st_size)}")


def ready_section(keep_ready: bool, scratch: Path) -> Path | None:
    """The ready state made fresh in a temporary cache (unless --keep-ready); that cache's path."""
    print("ready state (template VM: cold boot until /probe answers, then its state saved)")
    cache = None
    if not keep_ready:
        cache = scratch / "cache"
        cache.mkdir()
        real = kvm_image.cache_root()
        image = kvm_image.base_image()
        (cache / image.directory.name).symlink_to(image.directory)  # the same golden image, new ready state
        code = kvm_image.build_code_disk()
        (cache / code.name).symlink_to(code)
        print(f"  (fresh, in {cache}; the real cache {real} is left as it is)")
    provider = KVMProvider(settings(scratch / "rt-ready", cache), "bench-ready", pool_size=1)
    start = time.monotonic()
    vm = provider.create("waa-bench-ready")
    first = time.monotonic() - start
    manifest = provider.ready_state_info() or {}
    line("accelerator", f"{provider.accelerator.name} ({provider.accelerator.reason})")
    line("cold boot to /probe (template)", f"{manifest['boot_seconds']} s")
    line("state saved", f"{manifest['save_seconds']} s, {mib(manifest['state_bytes'])}")
    line("first VM incl. the template (first run)", f"{first:.1f} s")
    provider.delete(vm)
    start = time.monotonic()
    vm = provider.create("waa-bench-ready-2")
    line("a VM once the state is cached", f"{time.monotonic() - start:.2f} s")
    provider.close()
    return cache


def pool_section(pools: list[int], cache: Path | None, scratch: Path) -> None:
    print("ready pools (VMs started at once from the saved state, as the pool starts them)")
    for size in pools:
        provider = KVMProvider(settings(scratch / f"rt-pool{size}", cache), f"bench-pool{size}", pool_size=size)
        handles: list[VMHandle] = []
        each: list[float] = []
        lock = threading.Lock()
        start = time.monotonic()

        def up(name: str) -> None:
            t0 = time.monotonic()
            vm = provider.create(name)
            with lock:
                handles.append(vm)
                each.append(time.monotonic() - t0)

        threads = [threading.Thread(target=up, args=(f"waa-bench-{size}-{i}",)) for i in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - start
        rss = [memory(vm) for vm in handles]
        line(f"pool of {size}: all answering", f"{wall:.2f} s (each VM {stats(each)})")
        line(f"pool of {size}: memory per VM (RSS / USS)",
             f"{mib(int(statistics.mean(r for r, _ in rss)))} / {mib(int(statistics.mean(u for _, u in rss)))}")
        start = time.monotonic()
        provider.close()
        line(f"pool of {size}: teardown", f"{time.monotonic() - start:.2f} s")


def reset_once(provider: KVMProvider, vm: VMHandle, level: ResetLevel) -> tuple[float, bool]:
    """Write an episode's marker, reset, time it; whether the marker is gone."""
    client = WAAClient(vm.base_url, read_retries=0)
    client.setup_create_file(MARKER, "left by an episode")
    client.close()
    start = time.monotonic()
    provider.reset(vm, level)
    took = time.monotonic() - start
    client = WAAClient(vm.base_url, read_retries=0)
    gone = client.get_file(MARKER) is None
    client.close()
    return took, gone


def reset_section(resets: int, reboots: int, cache: Path | None, scratch: Path) -> None:
    print("resets (one VM; an episode's marker written before each reset, checked gone after it;")
    print("        snapshot and disk resets taken in turn, so both see the same load)")
    provider = KVMProvider(settings(scratch / "rt-reset", cache), "bench-reset", pool_size=1)
    vm = provider.create("waa-bench-reset")
    before = memory(vm)
    results: dict[ResetLevel, list[tuple[float, bool]]] = {level: [] for level in ResetLevel}
    try:
        for _ in range(resets):
            for level in (ResetLevel.SNAPSHOT, ResetLevel.DISK):
                results[level].append(reset_once(provider, vm, level))
        for _ in range(reboots):
            results[ResetLevel.REBOOT].append(reset_once(provider, vm, ResetLevel.REBOOT))
            provider.reset(vm, ResetLevel.SNAPSHOT)
        for level in (ResetLevel.SNAPSHOT, ResetLevel.DISK, ResetLevel.REBOOT):
            done = results[level]
            gone = sum(1 for _, ok in done if ok)
            note = " (a reboot keeps the guest's disk; a file still in its cache at the reset button is lost)" * (
                level is ResetLevel.REBOOT)
            line(f"{level.value} reset", f"{stats([t for t, _ in done])}; marker gone {gone}/{len(done)}{note}")
        after = memory(vm)
        line("memory of that VM: start / after resets", f"RSS {mib(before[0])} / {mib(after[0])}, "
                                                        f"USS {mib(before[1])} / {mib(after[1])}")
        line("its overlay (incl. the baseline snapshot)", mib(Path(vm.details["overlay"]).stat().st_size))
    finally:
        provider.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resets", type=int, default=20, help="snapshot and disk resets each (default 20)")
    parser.add_argument("--reboots", type=int, default=3, help="reboot resets (default 3: each boots the guest)")
    parser.add_argument("--pools", default="1,2,4", help="pool sizes to start (default 1,2,4)")
    parser.add_argument("--rebuild", action="store_true", help="also build the golden image from scratch (root)")
    parser.add_argument("--keep-ready", action="store_true", help="use the cached ready state instead of a fresh one")
    args = parser.parse_args()
    print(f"kvm provider on {os.uname().nodename}: {psutil.cpu_count()} CPUs, "
          f"{mib(psutil.virtual_memory().available)} available, load {os.getloadavg()[0]:.1f}")
    scratch = Path(tempfile.mkdtemp(prefix="vmb-", dir="/tmp"))
    try:
        image_section(args.rebuild, scratch)
        cache = ready_section(args.keep_ready, scratch)
        pool_section([int(n) for n in args.pools.split(",") if n.strip()], cache, scratch)
        reset_section(args.resets, args.reboots, cache, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
