"""The `debian-desktop` guest of the kvm provider: a REAL Linux desktop under the pipeline.

    sudo env ARENA_KVM_CACHE=$HOME/.cache/waa-arena/kvm-guest \\
        .venv/bin/python -m adapters.vms.kvm_image build --preset debian-desktop

Debian bookworm from Debian's packages (docs/desktop.md): Xvfb as the display, openbox, Mousepad,
PCManFM, LibreOffice Calc and Writer on GTK 3 with the accessibility bridge, AT-SPI, pyautogui's
X11 back end (python3-xlib, xdotool, wmctrl, xclip), fonts, and python3-docx/openpyxl for task
setup steps that write office files. pyautogui itself is not a Debian package: its wheel and
its pure-Python dependencies are fetched on the host with pip (from the package index pip is
set up for) and installed into the tree while it is built; the guest has no network.

Cached and keyed like the `debian-sim` guest (kvm_image.py): the base by the hash of its
recipe (packages, pinned wheels, user, image size), the code disk by the hash of the server it
runs (adapters/waa/desktop_server) and its boot script. The guest boots with the same minimal
init, starts the desktop session as the user `user` (uid 1000, home /home/user) and then keeps
this product's WAA server for the real desktop serving on the guest port. The kvm provider
saves its ready state once the server answers (the desktop up, LibreOffice started once), so a
reset restores a running desktop.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.vms import kvm_image
from adapters.vms.kvm_image import Guest, ImageError, Recipe

# pyautogui and the pure-Python packages it imports on Linux (pymsgbox, pytweening, pyscreeze,
# pygetwindow, pyrect), pinned. mouseinfo is left out: it exits the importing process when
# tkinter is missing, and pyautogui does without it. python3-xlib and Pillow come from Debian.
WHEELS = ("pyautogui==0.9.54", "pymsgbox==2.0.1", "pytweening==1.2.0", "pyscreeze==1.0.1",
          "pygetwindow==0.0.9", "pyrect==0.2.0")

DESKTOP_PACKAGES = (
    "python3", "python3-flask", "python3-pil", "python-is-python3", "linux-image-cloud-amd64", "kmod", "iproute2",
    "usr-is-merged",
    # display, window manager, session bus, accessibility
    "xvfb", "openbox", "dbus", "dbus-x11", "dconf-gsettings-backend", "at-spi2-core", "python3-pyatspi",
    "gir1.2-atspi-2.0",
    # applications
    "mousepad", "pcmanfm", "libreoffice-calc", "libreoffice-writer", "libreoffice-gtk3",
    # input and windows for pyautogui and the server
    "python3-xlib", "xdotool", "wmctrl", "xclip",
    # fonts (Liberation: metric-compatible with Arial/Times/Courier, as office files expect)
    "fonts-dejavu-core", "fonts-liberation2",
    # office files for task setup steps, and process tools
    "python3-docx", "python3-openpyxl", "procps",
)


@dataclass(frozen=True)
class DesktopRecipe(Recipe):
    """The desktop's base image: Debian packages, pinned wheels, the desktop user."""

    version: int = 2
    packages: tuple[str, ...] = DESKTOP_PACKAGES
    image_size_mib: int = 3584
    wheels: tuple[str, ...] = WHEELS
    user: str = "user"
    uid: int = 1000

    def finish_tree(self, tree: Path, work: Path, log: Callable[[str], None]) -> None:
        """The desktop user and pyautogui (wheels fetched on the host, installed into the tree)."""
        _add_user(tree, self.user, self.uid)
        lines = _install_wheels(tree, work / "wheels", self.wheels, log)
        with open(work / "packages.txt", "a") as listing:  # the manifest lists them with the packages
            listing.write("".join(f"{line}\n" for line in lines))


def _add_user(tree: Path, user: str, uid: int) -> None:
    with open(tree / "etc/passwd", "a") as handle:
        handle.write(f"{user}:x:{uid}:{uid}:{user}:/home/{user}:/bin/sh\n")
    with open(tree / "etc/group", "a") as handle:
        handle.write(f"{user}:x:{uid}:\n")
    with open(tree / "etc/shadow", "a") as handle:
        handle.write(f"{user}:*:19000:0:99999:7:::\n")  # no password: nobody logs in
    home = tree / "home" / user
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, uid)


def _install_wheels(tree: Path, wheels: Path, pins: tuple[str, ...], log: Callable[[str], None]) -> list[str]:
    """Fetch (and build, for sdists) the pinned packages as wheels on the host, then install them
    into the tree's site-packages without their dependencies; the listing names each wheel's hash."""
    pythons = sorted((tree / "usr/lib").glob("python3.[0-9]*"))
    if not pythons:
        raise ImageError(f"the guest tree has no Python under {tree / 'usr/lib'}")
    site = tree / "usr/local/lib" / pythons[-1].name / "dist-packages"
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run(pip + ["wheel", "--no-deps", "--quiet", "-w", str(wheels), *pins], "pip wheel (pyautogui)", log)
    built = sorted(wheels.glob("*.whl"))
    # Byte-compiled here (the host's Python 3.11 writes the guest's 3.11 bytecode): under TCG,
    # compiling pyautogui and its dependencies at every `python -c "import pyautogui; ..."`
    # action would cost seconds.
    _run(pip + ["install", "--no-deps", "--no-index", "--quiet", "--target", str(site), *map(str, built)],
         "pip install into the guest tree", log)
    listing = [f"wheel {path.name} sha256={hashlib.sha256(path.read_bytes()).hexdigest()}" for path in built]
    shutil.rmtree(wheels)
    return listing


def _run(command: list[str], step: str, log: Callable[[str], None]) -> None:
    log(f"{step}: {' '.join(command[2:6])} ...")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        output = (done.stderr or done.stdout or "").strip().splitlines()
        raise ImageError(f"{step} failed (exit {done.returncode}): " + " | ".join(output[-6:]))


# The code disk's boot script: the network (fixed addresses, as the simulation guest's), the
# desktop session as the user, then the WAA server, restarted whenever it exits. Runs as PID 1.
BOOT_SCRIPT = """#!/bin/sh
port=5000
for word in $(cat /proc/cmdline); do
    case "$word" in
        waa.port=*) port="${word#waa.port=}" ;;
    esac
done
hostname waa-desktop
""" + kvm_image.GUEST_NETWORK_SH + """mkdir -p /tmp/.X11-unix /run/user/1000 && chmod 1777 /tmp/.X11-unix
chown 1000:1000 /run/user/1000 && chmod 700 /run/user/1000
as_user="setpriv --reuid=1000 --regid=1000 --clear-groups"
cd /opt/waa-arena
echo "waa-desktop: starting the desktop session" > /dev/console
until $as_user env -i PATH=/usr/bin:/bin HOME=/home/user PYTHONDONTWRITEBYTECODE=1 \\
        python3 -m adapters.waa.desktop_server.session > /dev/console 2>&1; do
    echo "waa-desktop: the desktop session did not start; trying again" > /dev/console
    sleep 5
done
echo "waa-desktop: starting the WAA server for the real desktop on port $port" > /dev/console
while true; do
    $as_user env -i PATH=/usr/bin:/bin HOME=/home/user PYTHONDONTWRITEBYTECODE=1 \\
        python3 -m adapters.waa.desktop_server --port "$port" > /dev/console 2>&1
    echo "waa-desktop: the WAA server exited ($?); restarting" > /dev/console
    sleep 1
done
"""

CODE_FILES = ("adapters/__init__.py", "adapters/waa/__init__.py")
CODE_TREES = ("adapters/waa/desktop_server",)

DESKTOP = Guest("debian-desktop", DesktopRecipe(), CODE_FILES, CODE_TREES, BOOT_SCRIPT, prefix="desktop-")


class DesktopPreset(Mapping[str, Any]):
    """The kvm provider's `debian-desktop` preset (adapters/vms/kvm.py PRESETS).

    Read when a `[kvm]` section names the preset, not when the module loads: the values name
    the built image in the cache ($ARENA_KVM_CACHE) and the code disk of the current server,
    which is made then if missing (mke2fs, no root). A base image that is not built is one
    ValueError saying how to build it."""

    _STATIC: dict[str, Any] = {
        **kvm_image.DEBIAN_VM,
        "memory_mib": 1280,
        # The template's cold boot starts LibreOffice for the first time (its profile): minutes under TCG.
        "ready_timeout_seconds": 1200.0,
        "start_timeout_seconds": 180.0,
        "reset_timeout_seconds": 120.0,
        "memory_overhead_mib": 384,
    }
    _KEYS = (*_STATIC, "kernel", "initrd", "append", "disk_image", "extra_args")

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)

    def __getitem__(self, key: str) -> Any:
        if key in self._STATIC:
            return self._STATIC[key]
        if key not in self._KEYS:
            raise KeyError(key)
        image = kvm_image.base_image(kvm_image.cache_root(), DESKTOP)
        if not image.exists():
            raise ValueError(
                f"preset 'debian-desktop': the desktop guest is not built (no {image.golden}); build it once with "
                "`sudo env ARENA_KVM_CACHE=$ARENA_KVM_CACHE .venv/bin/python -m adapters.vms.kvm_image build "
                "--preset debian-desktop` (root, mmdebstrap; docs/desktop.md)")
        if key == "kernel":
            return image.kernel
        if key == "initrd":
            return image.initrd
        if key == "disk_image":
            return image.golden
        if key == "append":
            return f"{kvm_image.KERNEL_APPEND} waa.port={kvm_image.GUEST_PORT}"
        try:
            code = kvm_image.build_code_disk(kvm_image.cache_root(), DESKTOP)
        except (ImageError, OSError) as exc:  # a settings error, one line, like a missing image
            raise ValueError(f"preset 'debian-desktop': {exc}") from None
        # The second virtio disk, /dev/vdb in the guest: what the base's init mounts and runs.
        return ["-drive", f"file={code},format=raw,if=virtio,readonly=on"]


