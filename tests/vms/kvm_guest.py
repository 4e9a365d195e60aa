"""What the kvm tests share: when they can run, and the QEMU processes of a directory."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
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


@contextlib.contextmanager
def arena_world(prefix: str, kvm_settings: str) -> Iterator[dict[str, Path]]:
    """A folder in /tmp for `arena run`s on kvm VMs: the `[kvm]` config (`kvm_settings` lines plus
    the VMs' runtime folder), a seeded Prefect home whose server is stopped at the end."""
    from prefect_home import seeded_home

    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    runtime = root / "vms"
    config = root / "arena.toml"
    config.write_text(f'[kvm]\n{kvm_settings}runtime_dir = "{runtime}"\n')
    try:
        yield {"root": root, "runtime": runtime, "config": config, "prefect": seeded_home(root / "prefect")}
    finally:
        from flows.local_server import stop_server

        stop_server(root / "prefect")
        shutil.rmtree(root, ignore_errors=True)
