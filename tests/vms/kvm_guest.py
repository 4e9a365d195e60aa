"""What the kvm tests share: when they can run, and the QEMU processes of a directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from adapters.vms import kvm_image


def skip_reason() -> str | None:
    """Why the kvm tests cannot run here, or None: QEMU and the cached Debian guest are needed."""
    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        return "QEMU is not installed (apt-get install qemu-system-x86 qemu-utils)"
    if shutil.which("mke2fs") is None:
        return "mke2fs is not installed (apt-get install e2fsprogs)"
    if not kvm_image.base_image().exists():
        return ("the kvm provider's Debian guest is not cached (build it with `python -m adapters.vms.kvm_image "
                "build`, as .ci/run does)")
    return None


def qemu_under(path: Path) -> list[psutil.Process]:
    """Running QEMU processes whose command line names `path` (a run directory or its parent)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if ((process.info["name"] or "").startswith("qemu-system") and process.info["status"] != psutil.STATUS_ZOMBIE
                    and str(path) in " ".join(process.info["cmdline"] or [])):
                found.append(process)
        except psutil.Error:
            pass
    return found
