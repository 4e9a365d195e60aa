"""The X display: screenshots, the screen size, the top-level windows and the clipboard.

Windows are read from the window manager's EWMH properties (openbox keeps ``_NET_CLIENT_LIST``
and ``_NET_ACTIVE_WINDOW``); raising and closing them goes through ``wmctrl``, the clipboard
through ``xclip``. One Xlib connection is shared under a lock (Xlib is not thread-safe and the
HTTP server answers requests on threads).
"""

from __future__ import annotations

import io
import os
import subprocess
import threading
import time
from dataclasses import dataclass

from PIL import Image
from Xlib import XK, X, Xatom, display as xdisplay, error as xerror

# zlib level 1: under TCG a 1280x800 capture compresses several times faster than at level 6 for
# files about a third larger; the settle wait takes many captures per action.
PNG_COMPRESS_LEVEL = 1
TOOL_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Window:
    """A top-level window the window manager manages."""

    xid: int
    title: str
    wm_class: str
    rect: tuple[int, int, int, int]  # left, top, right, bottom in screen pixels
    hidden: bool
    pid: int | None = None  # _NET_WM_PID: the process that draws it

    @property
    def hex_id(self) -> str:
        return f"0x{self.xid:08x}"


class Display:
    """One X display (``:0`` in the guest)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._x = xdisplay.Display(name)
        self._root = self._x.screen().root
        self._atoms = {n: self._x.intern_atom(n) for n in (
            "_NET_CLIENT_LIST", "_NET_ACTIVE_WINDOW", "_NET_WM_NAME", "UTF8_STRING", "_NET_WM_STATE",
            "_NET_WM_STATE_HIDDEN", "_NET_FRAME_EXTENTS", "_NET_WM_PID")}

    # -- the screen -------------------------------------------------------------------------

    def size(self) -> tuple[int, int]:
        screen = self._x.screen()
        return int(screen.width_in_pixels), int(screen.height_in_pixels)

    def capture(self, rect: tuple[int, int, int, int] | None = None) -> Image.Image:
        """The display's pixels (the whole screen, or `rect` clipped to it) as an RGB image."""
        width, height = self.size()
        left, top, right, bottom = rect or (0, 0, width, height)
        left, top = max(0, left), max(0, top)
        right, bottom = min(width, right), min(height, bottom)
        if right <= left or bottom <= top:
            left, top, right, bottom = 0, 0, width, height
        with self._lock:
            raw = self._root.get_image(left, top, right - left, bottom - top, X.ZPixmap, 0xFFFFFFFF)
        return Image.frombytes("RGB", (right - left, bottom - top), raw.data, "raw", "BGRX")

    def png(self, rect: tuple[int, int, int, int] | None = None) -> bytes:
        out = io.BytesIO()
        self.capture(rect).save(out, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        return out.getvalue()

    # -- windows ----------------------------------------------------------------------------

    def use_us_keyboard(self) -> None:
        """Make the keyboard the US 104-key one WAA's Windows has: Xvfb's is the 105-key one, whose
        extra key by the left Shift also gives ``<``. pyautogui types ``<`` as Shift plus the first
        key giving it, which there is that extra key, and Shift makes it ``>`` (every ``<`` an agent
        typed arrived as ``>``, measured). Without the key, ``<`` is Shift+comma, as on Windows."""
        less = XK.string_to_keysym("less")
        with self._lock:
            first = self._x.display.info.min_keycode
            mapping = self._x.get_keyboard_mapping(first, self._x.display.info.max_keycode - first + 1)
            for offset, keysyms in enumerate(mapping):
                if keysyms and keysyms[0] == less:
                    self._x.change_keyboard_mapping(first + offset, [[X.NoSymbol] * len(keysyms)])
            self._x.sync()

    def has_window_manager(self) -> bool:
        """Whether an EWMH window manager runs on the display (it sets _NET_SUPPORTING_WM_CHECK)."""
        with self._lock:
            atom = self._x.intern_atom("_NET_SUPPORTING_WM_CHECK")
            return self._root.get_full_property(atom, X.AnyPropertyType) is not None

    def windows(self) -> list[Window]:
        """Managed top-level windows, the most recently stacked last (EWMH client list order)."""
        with self._lock:
            ids = self._property(self._root, "_NET_CLIENT_LIST") or []
            found = []
            for xid in ids:
                window = self._window(int(xid))
                if window is not None:
                    found.append(window)
            return found

    def active(self) -> Window | None:
        with self._lock:
            ids = self._property(self._root, "_NET_ACTIVE_WINDOW") or []
            xid = int(ids[0]) if ids else 0
            return self._window(xid) if xid else None

    def _property(self, window, name: str) -> list[int] | None:
        try:
            prop = window.get_full_property(self._atoms[name], X.AnyPropertyType)
        except xerror.XError:
            return None
        return list(prop.value) if prop is not None else None

    def _window(self, xid: int) -> Window | None:
        try:
            win = self._x.create_resource_object("window", xid)
            name = win.get_full_property(self._atoms["_NET_WM_NAME"], self._atoms["UTF8_STRING"])
            if name is not None:
                title = bytes(name.value).decode("utf-8", "replace") if not isinstance(name.value, str) else name.value
            else:
                legacy = win.get_full_property(Xatom.WM_NAME, X.AnyPropertyType)
                title = legacy.value.decode("latin-1") if legacy is not None and isinstance(legacy.value, bytes) else (
                    str(legacy.value) if legacy is not None else "")
            wm_class = win.get_wm_class() or ("", "")
            geometry = win.get_geometry()
            origin = win.translate_coords(self._root, 0, 0)
            left, top = -int(origin.x), -int(origin.y)
            states = self._property(win, "_NET_WM_STATE") or []
            hidden = self._atoms["_NET_WM_STATE_HIDDEN"] in states
            pid = (self._property(win, "_NET_WM_PID") or [None])[0]
        except xerror.XError:
            return None  # closed while we looked
        return Window(xid, title, ".".join(part for part in wm_class if part), (
            left, top, left + int(geometry.width), top + int(geometry.height)), hidden,
            int(pid) if pid is not None else None)

    def find(self, needle: str, *, by_class: bool = False) -> list[Window]:
        """Windows whose title (or WM_CLASS) contains `needle`, case-insensitively, front-most first."""
        needle = needle.lower()
        hits = [w for w in self.windows() if needle in (w.wm_class if by_class else w.title).lower()]
        return list(reversed(hits))

    def activate(self, window: Window, wait_seconds: float = 3.0) -> bool:
        """Raise and focus `window` through the window manager; whether it became active."""
        _tool(["wmctrl", "-i", "-a", window.hex_id])
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            current = self.active()
            if current is not None and current.xid == window.xid:
                return True
            time.sleep(0.05)
        return False

    def close(self, window: Window) -> None:
        """Ask the window to close (WM_DELETE_WINDOW through the window manager), as a user would."""
        _tool(["wmctrl", "-i", "-c", window.hex_id])

    # -- the clipboard ----------------------------------------------------------------------

    def clipboard(self) -> str:
        """The CLIPBOARD selection as text ("" when nothing holds it)."""
        done = subprocess.run(["xclip", "-selection", "clipboard", "-o"], capture_output=True,
                              timeout=TOOL_TIMEOUT_SECONDS, env=_env(self.name))
        return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else ""

    def set_clipboard(self, text: str) -> None:
        """Own the CLIPBOARD selection with `text` (xclip stays in the background serving it)."""
        subprocess.run(["xclip", "-selection", "clipboard", "-i"], input=text.encode("utf-8"), check=True,
                       timeout=TOOL_TIMEOUT_SECONDS, env=_env(self.name), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def cpu_ticks(pid: int) -> int | None:
    """CPU time a process has used (utime + stime, in clock ticks); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])


def wait_idle(pid: int | None, quiet_seconds: float, deadline: float) -> bool:
    """Wait until `pid` has used no CPU for `quiet_seconds` (a program done loading what it
    opened), or the monotonic `deadline`; whether it became idle."""
    if pid is None:
        return False
    last, since = cpu_ticks(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = cpu_ticks(pid)
        if now is None:
            return False
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return True
    return False


def _env(display_name: str) -> dict[str, str]:
    return {**os.environ, "DISPLAY": display_name}


def _tool(command: list[str]) -> None:
    subprocess.run(command, capture_output=True, timeout=TOOL_TIMEOUT_SECONDS, check=False)
