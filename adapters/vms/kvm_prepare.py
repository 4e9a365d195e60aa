"""Make the kvm provider's ready state before a run, so the run's first VM is a clone, not a boot.

    python -m adapters.vms.kvm_prepare [--config arena.toml]

It builds what the configured ``[kvm]`` section needs that can be built without root (the
Debian guest's code disk), then boots the template VM once and caches its saved state under
the key that names the image, the guest code, the QEMU build, machine type and CPU model. A run
does the same on its first VM when nothing is cached; this only moves that minute out of the
run (CI does it before the tests). Exit 1 with one line when the host or image is not ready.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from adapters.vms.base import ProviderError
from adapters.vms.kvm import KVMProvider, KVMSettings
from adapters.vms.settings import load_cloud_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapters.vms.kvm_prepare", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, help="cloud config TOML with a [kvm] section (default $ARENA_CONFIG)")
    args = parser.parse_args(argv)
    try:
        settings = load_cloud_settings(args.config).kvm or KVMSettings()
        provider = KVMProvider(settings, "prepare", pool_size=1, log=lambda line: print(line, file=sys.stderr))
    except ValueError as exc:
        print(f"kvm_prepare: error: {exc}", file=sys.stderr)
        return 1
    start = time.monotonic()
    try:
        cached = provider.ready_state_info() is not None
        vm = provider.create("waa-prepare-0")  # made from the ready state, which it makes when missing
        provider.delete(vm)
    except ProviderError as exc:
        print(f"kvm_prepare: error: {exc}", file=sys.stderr)
        return 1
    finally:
        provider.close()
    info = provider.ready_state_info() or {}
    how = "cached" if cached else f"made: cold boot {info.get('boot_seconds')} s, saved in {info.get('save_seconds')} s"
    print(f"ready state {info.get('key')} ({info.get('accelerator')}, {info.get('qemu')}, {info.get('machine')}, "
          f"cpu {info.get('cpu')}): {how}; a VM from it came up and went in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
