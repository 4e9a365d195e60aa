"""The Debian test guest of the kvm provider: a small VM whose boot starts the product's own
local WAA environment (adapters/waa/localenv), built from Debian packages.

    sudo env ARENA_KVM_CACHE=$HOME/.cache/waa-arena/kvm-guest .venv/bin/python -m adapters.vms.kvm_image build
                                                # the base image (root and mmdebstrap), into your cache
    python -m adapters.vms.kvm_image status     # what is cached, under which keys
    python -m adapters.vms.kvm_image prune      # drop cached ready states of other code versions

Two layers, cached outside the repository ($ARENA_KVM_CACHE, else ~/.cache/waa-arena/kvm-guest):

* **base**: Debian bookworm (`mmdebstrap --variant=minbase`) with python3, python3-flask and
  python3-pil (so the guest needs no pip), the cloud kernel with an initramfs of the virtio
  modules only, and a minimal init instead of systemd (boots in about 10 s instead of 25-55 s
  under TCG). Its file tree goes into an ext4 image (`mke2fs -d`, nothing mounted), converted to
  qcow2: the golden image, never written afterwards. Keyed by the recipe below; building it
  needs root (mmdebstrap) and takes 1-4 minutes, mostly the package mirror.
* **code**: the product's source that the guest runs (adapters/waa/localenv and its package
  files) and the guest's boot script, on a small read-only ext4 disk (`mke2fs -d`, no root).
  Keyed by the hash of those files, so editing the simulation needs a new code disk (a second)
  and a new ready state (one boot), never a new base.

The init in the base mounts the code disk and runs its boot script, which brings the network up
and keeps `python3 -m adapters.waa.localenv` serving on the guest port (restarted if it dies).
The server listens on all guest addresses because QEMU's user-mode network delivers forwarded
connections to the guest's own address; only QEMU's forward on 127.0.0.1 reaches it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_ENV = "ARENA_KVM_CACHE"
GUEST_PORT = 5000  # WAA's own port; the provider forwards it to a free port on 127.0.0.1
_REPO_ROOT = Path(__file__).resolve().parents[2]

# What the guest runs, besides Debian's packages. The simulation imports nothing else from the
# product (tests/test_architecture.py keeps it that way for the local provider too).
CODE_FILES = ("adapters/__init__.py", "adapters/waa/__init__.py")
CODE_TREES = ("adapters/waa/localenv",)

# PID 1 of the base image: mount what Linux needs, then hand over to the code disk's boot script,
# so that what the guest runs is decided by the code layer, not by the slow-to-build base.
BASE_INIT = """#!/bin/sh
# waa-arena guest init (PID 1): kernel file systems, then the code disk's boot script.
mount -t proc proc /proc
mount -t sysfs sysfs /sys 2>/dev/null
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /run /tmp && mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /tmp
mount -o remount,rw /
mkdir -p /opt/waa-arena
if mount -t ext4 -o ro /dev/vdb /opt/waa-arena && [ -x /opt/waa-arena/boot.sh ]; then
    exec /opt/waa-arena/boot.sh
fi
echo "waa-init: no code disk on /dev/vdb; halting" > /dev/console
while true; do sleep 3600; done
"""

# The guests' network, in their boot scripts: QEMU's user-mode network at fixed addresses.
GUEST_NETWORK_SH = """ip link set lo up
for dev in /sys/class/net/*; do
    name="${dev##*/}"
    [ "$name" = lo ] && continue
    ip link set "$name" up
    ip addr add 10.0.2.15/24 dev "$name"
    ip route add default via 10.0.2.2 dev "$name"
    break
done
"""

# What every Debian guest's VM is, whatever it runs (the kvm provider's presets add memory,
# timeouts and overheads): the kernel booted directly, virtio disks and network, no display.
DEBIAN_VM: dict[str, object] = {
    "machine": "pc-i440fx-7.2",
    "vcpus": 1,
    "firmware": "kernel",
    "disk_format": "qcow2",
    "disk_bus": "virtio-blk",
    "nic_model": "virtio-net-pci",
    "guest_port": GUEST_PORT,
    "devtools_port": None,
    "vga": "none",
}

# The code disk's boot script: the network (QEMU user-mode network, fixed addresses) and the
# WAA environment, restarted whenever it exits, as WAA's own server is inside a Windows VM.
# `waa.probe=vdX` on the kernel command line (which only the host sets) first runs probe.py from
# that read-only disk, its output on the serial console: how tests/vms/test_kvm_isolation.py
# makes this guest's own network stack try what a hostile guest would.
BOOT_SCRIPT = """#!/bin/sh
port=5000
probe=
for word in $(cat /proc/cmdline); do
    case "$word" in
        waa.port=*) port="${word#waa.port=}" ;;
        waa.probe=vd[c-z]) probe="${word#waa.probe=}" ;;
    esac
done
hostname waa-guest
""" + GUEST_NETWORK_SH + """if [ -n "$probe" ]; then
    mkdir -p /run/probe
    mount -t ext4 -o ro "/dev/$probe" /run/probe \\
        && PYTHONDONTWRITEBYTECODE=1 python3 /run/probe/probe.py > /dev/console 2>&1
    echo "waa-probe: end" > /dev/console
fi
mkdir -p /var/lib/waa
cd /opt/waa-arena
echo "waa-guest: starting the WAA environment on port $port" > /dev/console
while true; do
    PYTHONDONTWRITEBYTECODE=1 python3 -m adapters.waa.localenv --host 0.0.0.0 --allow-remote \\
        --port "$port" --root /var/lib/waa/root > /dev/console 2>&1
    echo "waa-guest: the WAA environment exited ($?); restarting" > /dev/console
    sleep 1
done
"""



@dataclass(frozen=True)
class Recipe:
    """Everything the base image is made from; its hash is the base layer's cache key."""

    version: int = 1
    suite: str = "bookworm"
    variant: str = "minbase"
    # usr-is-merged keeps perl and usrmerge out; initramfs-tools comes with the kernel.
    packages: tuple[str, ...] = ("python3", "python3-flask", "python3-pil", "linux-image-cloud-amd64", "kmod",
                                 "iproute2", "usr-is-merged")
    dpkg_excludes: tuple[str, ...] = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*",
                                      "/usr/share/info/*")
    initramfs_modules: tuple[str, ...] = ("virtio_pci", "virtio_blk", "virtio_net")
    image_size_mib: int = 1536
    init: str = BASE_INIT

    def finish_tree(self, tree: Path, work: Path, log: Callable[[str], None]) -> None:
        """More build steps on the installed tree (before the image is made); none here."""

    def key(self) -> str:
        """The base layer's cache key: the hash of every field."""
        return digest(asdict(self))


RECIPE = Recipe()
KERNEL_APPEND = "console=ttyS0 root=/dev/vda rw init=/usr/sbin/waa-init quiet panic=5"


@dataclass(frozen=True)
class Guest:
    """One kind of guest the kvm provider builds: its base recipe and what its code disk holds.

    `debian-sim` (below) runs the simulation; `debian-desktop` (kvm_desktop.py) a real desktop.
    Each has its own cache entries (`<prefix>base-KEY`, `<prefix>code-KEY.img`)."""

    name: str
    recipe: Recipe
    code_files: tuple[str, ...]
    code_trees: tuple[str, ...]
    boot_script: str
    prefix: str = ""

    def base_dir_name(self) -> str:
        return f"{self.prefix}base-{self.recipe.key()}"

    def code_disk_name(self, key: str) -> str:
        return f"{self.prefix}code-{key}.img"


SIM = Guest("debian-sim", RECIPE, CODE_FILES, CODE_TREES, BOOT_SCRIPT)


def guest(name: str = "debian-sim") -> Guest:
    """The guest of a preset name (ImageError for a preset this module does not build)."""
    if name == SIM.name:
        return SIM
    if name == "debian-desktop":
        from adapters.vms import kvm_desktop

        return kvm_desktop.DESKTOP
    raise ImageError(f"no guest image recipe named {name!r} (known: debian-sim, debian-desktop)")


def known_guests() -> list[Guest]:
    return [guest(name) for name in ("debian-sim", "debian-desktop")]


class ImageError(RuntimeError):
    """The guest image could not be built or is not there; the message says what to do."""


def cache_root() -> Path:
    """$ARENA_KVM_CACHE, else $XDG_CACHE_HOME/waa-arena/kvm-guest (~/.cache/...)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "waa-arena" / "kvm-guest"


def digest(value: object) -> str:
    """A short stable hash of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def base_key(kind: Guest | None = None) -> str:
    return (kind or SIM).recipe.key()


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a lock file beside a cache entry): one builder at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class BaseImage:
    """The built base layer: golden disk, kernel and initramfs."""

    directory: Path
    key: str

    @property
    def golden(self) -> Path:
        return self.directory / "golden.qcow2"

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def manifest(self) -> Path:
        return self.directory / "manifest.json"

    def exists(self) -> bool:
        return all(p.is_file() for p in (self.golden, self.kernel, self.initrd, self.manifest))


def base_image(cache: Path | None = None, kind: Guest | None = None) -> BaseImage:
    """Where the base image of the current recipe is (or would be) cached."""
    kind = kind or SIM
    return BaseImage((cache or cache_root()) / kind.base_dir_name(), kind.recipe.key())


def _run(command: list[str], step: str, log: Callable[[str], None], **kwargs: object) -> str:
    log(f"{step}: {' '.join(command[:3])} ...")
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        output = (done.stderr or done.stdout or "").strip().splitlines()
        raise ImageError(f"{step} failed ({' '.join(command[:2])}, exit {done.returncode}): "
                         + " | ".join(output[-8:]))
    return str(done.stdout)


def _mirror() -> str:
    """The Debian mirror apt uses here (its sources' first deb.debian.org-like URI), else deb.debian.org."""
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]:
        try:
            text = sources.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            uri = words[1] if words[:1] == ["URIs:"] and len(words) > 1 else (
                words[1] if words[:1] == ["deb"] and len(words) > 2 and not words[1].startswith("[") else None)
            if uri and "/debian" in uri and "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def build_base(cache: Path | None = None, *, mirror: str | None = None,
               log: Callable[[str], None] = print, kind: Guest | None = None) -> tuple[BaseImage, float | None]:
    """Build the base image of the current recipe unless it is cached; (image, seconds or None)."""
    kind = kind or SIM
    recipe = kind.recipe
    image = base_image(cache, kind)
    if image.exists():
        return image, None
    missing = [tool for tool, package in (("mmdebstrap", "mmdebstrap"), ("mke2fs", "e2fsprogs"),
                                          ("qemu-img", "qemu-utils")) if shutil.which(tool) is None]
    if missing:
        raise ImageError(f"building the guest image needs {', '.join(missing)} "
                         "(apt-get install mmdebstrap e2fsprogs qemu-utils)")
    if os.geteuid() != 0:
        raise ImageError("building the guest image needs root (mmdebstrap installs packages into a directory "
                         "tree); run `python -m adapters.vms.kvm_image build` as root once, the cache is reused")
    with cache_lock(image.directory.with_suffix(".lock")):
        if image.exists():
            return image, None
        start = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix="build-", dir=image.directory.parent))
        try:
            _build_into(work, mirror or _mirror(), log, recipe)
            (work / "manifest.json").write_text(json.dumps({
                "key": image.key, "guest": kind.name, "recipe": asdict(recipe), "mirror": mirror or _mirror(),
                "packages": (work / "packages.txt").read_text().splitlines(),
                "build_seconds": round(time.monotonic() - start, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }, indent=2))
            if image.directory.exists():
                shutil.rmtree(image.directory)
            work.chmod(0o755)  # mkdtemp made it private; the image is for every user of the cache
            os.replace(work, image.directory)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return image, time.monotonic() - start


def _build_into(work: Path, mirror: str, log: Callable[[str], None], recipe: Recipe = RECIPE) -> None:
    tree = work / "tree"
    command = ["mmdebstrap", "--quiet", f"--variant={recipe.variant}", "--include=" + ",".join(recipe.packages)]
    command += [f"--dpkgopt=path-exclude={pattern}" for pattern in recipe.dpkg_excludes]
    command += [recipe.suite, str(tree), mirror]
    _run(command, "mmdebstrap", log, timeout=1800)
    # A small initramfs: only the virtio modules (5 MB instead of 14, and a faster boot).
    conf = tree / "etc/initramfs-tools"
    (conf / "conf.d").mkdir(parents=True, exist_ok=True)
    (conf / "conf.d/waa-arena.conf").write_text("MODULES=list\n")
    with open(conf / "modules", "a") as modules:
        modules.write("\n".join(recipe.initramfs_modules) + "\n")
    _run(["chroot", str(tree), "update-initramfs", "-u", "-k", "all"], "update-initramfs", log, timeout=600)
    init = tree / "usr/sbin/waa-init"  # /sbin is a symlink on merged-/usr systems
    init.write_text(recipe.init)
    init.chmod(0o755)
    (tree / "etc/hostname").write_text("waa-guest\n")
    (tree / "opt/waa-arena").mkdir(parents=True, exist_ok=True)
    packages = _run(["chroot", str(tree), "dpkg-query", "-W", "-f", "${Package} ${Version}\\n"], "dpkg-query", log)
    (work / "packages.txt").write_text(packages)
    recipe.finish_tree(tree, work, log)  # after the listing: it may add its own lines to it
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    initrds = sorted((tree / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ImageError(f"the guest tree has no kernel/initramfs in {tree / 'boot'}")
    shutil.copy2(kernels[-1], work / "vmlinuz")
    shutil.copy2(initrds[-1], work / "initrd.img")
    raw = work / "root.raw"
    _run(["mke2fs", "-q", "-t", "ext4", "-L", "waa-root", "-d", str(tree), str(raw),
          f"{recipe.image_size_mib}M"], "mke2fs", log, timeout=600)
    _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "golden.qcow2")], "qemu-img convert", log,
         timeout=600)
    raw.unlink()
    shutil.rmtree(tree)
    (work / "golden.qcow2").chmod(0o444)  # the golden image is only ever read


# -- the code disk -----------------------------------------------------------------------------


def code_files(repo_root: Path = _REPO_ROOT, kind: Guest | None = None) -> dict[str, bytes]:
    """Relative path -> content of every file the guest's code disk holds (the simulation's
    Python files; for the desktop every file of its server package but bytecode caches)."""
    kind = kind or SIM
    files: dict[str, bytes] = {path: (repo_root / path).read_bytes() for path in kind.code_files}
    for tree in kind.code_trees:
        pattern = "*.py" if kind is SIM else "*"
        for path in sorted((repo_root / tree).rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                files[str(path.relative_to(repo_root))] = path.read_bytes()
    files["boot.sh"] = kind.boot_script.encode()
    return files


def code_key(files: dict[str, bytes] | None = None) -> str:
    files = code_files() if files is None else files
    hasher = hashlib.sha256()
    for name in sorted(files):
        hasher.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return hasher.hexdigest()[:16]


def build_code_disk(cache: Path | None = None, kind: Guest | None = None) -> Path:
    """The read-only code disk of the current source (built when missing: no root needed)."""
    kind = kind or SIM
    files = code_files(kind=kind)
    target = (cache or cache_root()) / kind.code_disk_name(code_key(files))
    if target.is_file():
        return target
    if shutil.which("mke2fs") is None:
        raise ImageError("building the guest's code disk needs mke2fs (apt-get install e2fsprogs)")
    with cache_lock(target.with_suffix(".lock")):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix="code-", dir=target.parent) as work:
            root = Path(work) / "root"
            for name, content in files.items():
                path = root / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            for name in files:  # scripts stay executable (boot.sh, the desktop's bin/)
                if name == "boot.sh" or "/bin/" in name:
                    (root / name).chmod(0o755)
            partial = Path(work) / "code.img"
            _run(["mke2fs", "-q", "-t", "ext4", "-L", "waa-code", "-E", "root_owner=0:0", "-d", str(root),
                  str(partial), "32M"], "mke2fs (code disk)", lambda _: None, timeout=120)
            partial.chmod(0o444)
            os.replace(partial, target)
    return target


# -- command line ------------------------------------------------------------------------------


def _give_to_sudo_user(cache: Path) -> None:
    """Run with sudo, hand the cache to the user who ran sudo: that user's runs write their code
    disks and ready states into it, without root."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() != 0 or not uid or not gid:
        return
    for path in [cache, *cache.rglob("*")]:
        os.chown(path, int(uid), int(gid), follow_symlinks=False)



def _status(cache: Path, kind: Guest) -> int:
    image = base_image(cache, kind)
    print(f"cache: {cache}")
    if image.exists():
        manifest = json.loads(image.manifest.read_text())
        print(f"{kind.name} base image: {image.golden} (recipe {image.key}, {len(manifest.get('packages', []))} "
              f"packages, built {manifest.get('built_at')} in {manifest.get('build_seconds')} s)")
    else:
        print(f"{kind.name} base image: not built for recipe {image.key} "
              f"(python -m adapters.vms.kvm_image build --preset {kind.name})")
    disk = cache / kind.code_disk_name(code_key(code_files(kind=kind)))
    print(f"code disk: {disk} ({'present' if disk.exists() else 'built on first use'})")
    for ready in sorted(cache.glob("ready-*")):
        if not ready.is_dir() or ready.name.endswith(".partial"):
            continue
        info = ready / "manifest.json"
        detail = json.loads(info.read_text()) if info.exists() else {}
        print(f"ready state: {ready.name} ({detail.get('preset')}, code {detail.get('code_key')}, "
              f"{detail.get('accelerator')}, {detail.get('qemu')}, template boot {detail.get('boot_seconds')} s)")
    return 0 if image.exists() else 1


def _prune(cache: Path) -> int:
    """Remove ready states and code disks of other source versions, and other recipes' bases
    (every guest kind's current ones are kept)."""
    kinds = known_guests()
    keep_bases = {kind.base_dir_name() for kind in kinds}
    keep_codes = {kind.code_disk_name(code_key(code_files(kind=kind))) for kind in kinds}
    keep_ready = {(base_key(SIM), code_key(code_files(kind=SIM)))}
    removed = 0
    newest_other: dict[str, tuple[str, Path]] = {}  # preset -> (saved_at, ready state)
    for path in cache.glob("ready-*"):
        if not path.is_dir():
            continue
        manifest = path / "manifest.json"
        detail = json.loads(manifest.read_text()) if manifest.exists() else {}
        preset = detail.get("preset") or "debian-sim"
        if preset == "debian-sim":
            if (detail.get("base_key"), detail.get("code_key")) not in keep_ready:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
            continue
        # Other presets' manifests do not name their layers: keep each preset's newest state.
        saved = str(detail.get("saved_at") or "")
        previous = newest_other.get(preset)
        if previous is None or saved > previous[0]:
            if previous is not None:
                shutil.rmtree(previous[1], ignore_errors=True)
                removed += 1
            newest_other[preset] = (saved, path)
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    for path in list(cache.glob("code-*.img")) + list(cache.glob("*-code-*.img")):
        if path.name not in keep_codes:
            path.unlink(missing_ok=True)
            removed += 1
    for path in list(cache.glob("base-*")) + list(cache.glob("*-base-*")):
        if path.is_dir() and path.name not in keep_bases:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    print(f"removed {removed} cache entries of other versions from {cache}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapters.vms.kvm_image",
                                     description="the guest images of the kvm provider")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the base image (root, mmdebstrap) and the code disk, or reuse them")
    build.add_argument("--mirror", help="Debian mirror URL (default: the one apt uses here)")
    status = sub.add_parser("status", help="what is cached")
    for command in (build, status):
        command.add_argument("--preset", default="debian-sim", choices=("debian-sim", "debian-desktop"),
                             help="which guest (default debian-sim: the simulation; debian-desktop: a real desktop)")
    sub.add_parser("prune", help="remove cached layers of other recipes and source versions")
    args = parser.parse_args(argv)
    cache = cache_root()
    try:
        if args.command == "prune":
            return _prune(cache)
        kind = guest(args.preset)
        if args.command == "status":
            return _status(cache, kind)
        image, seconds = build_base(cache, mirror=args.mirror, log=lambda line: print(line, file=sys.stderr),
                                    kind=kind)
        code = build_code_disk(cache, kind)
        _give_to_sudo_user(cache)
    except ImageError as exc:
        print(f"kvm_image: error: {exc}", file=sys.stderr)
        return 1
    took = "cached" if seconds is None else f"built in {seconds:.1f} s"
    print(f"{kind.name} base image {image.golden} ({took}); code disk {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
