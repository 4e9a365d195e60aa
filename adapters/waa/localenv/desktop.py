"""The simulated desktop: windows, controls, focus, mouse, keyboard, clipboard and registry.

Apps are *immediate mode*: a window keeps only plain state (text, current folder, which
control has focus...) and rebuilds its control tree from that state whenever it is drawn,
hit-tested or exported as an accessibility tree. So there is one source of truth for what is
drawn, what a click hits and what the accessibility tree reports, and a snapshot is a deep
copy of plain data.

Mouse semantics: a click lands on the deepest control under the pointer in the topmost window
there; the window decides what that control does (buttons press, edits take focus, list items
select, a double click on a list item opens it, menus open, menu items run).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from .registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from .filesystem import SimFileSystem

Rect = tuple[int, int, int, int]
"""Screen rectangle (left, top, right, bottom), right/bottom exclusive."""

TITLE_H = 32
TASKBAR_H = 48
MODIFIERS = {"ctrl", "shift", "alt", "win"}
# pyautogui's spellings mapped to one canonical key name.
KEY_ALIASES = {
    "control": "ctrl", "ctrlleft": "ctrl", "ctrlright": "ctrl",
    "shiftleft": "shift", "shiftright": "shift",
    "altleft": "alt", "altright": "alt", "option": "alt",
    "winleft": "win", "winright": "win", "command": "win",
    "return": "enter", "esc": "escape", "del": "delete",
    "pgup": "pageup", "pgdn": "pagedown", "space": " ",
}


def norm_key(key: str) -> str:
    """Canonical lower-case key name."""
    k = key.lower() if len(key) > 1 else key
    return KEY_ALIASES.get(k, k)


def contains(rect: Rect, x: int, y: int) -> bool:
    """True when the point lies inside rect."""
    return rect[0] <= x < rect[2] and rect[1] <= y < rect[3]


@dataclass
class Control:
    """One UI element as drawn and as exported to the accessibility tree."""

    role: str
    name: str
    rect: Rect
    key: str = ""  # the app-local handle a click dispatches; "" means inert
    cls: str | None = None  # window class name; controls use their role
    text: str = ""
    value: str | None = None
    checked: bool | None = None
    selected: bool | None = None
    focused: bool = False
    editable: bool = False
    enabled: bool = True
    expanded: bool | None = None
    text_selected: bool = False  # whole text selected (typing replaces it)
    children: list["Control"] = field(default_factory=list)

    @property
    def class_name(self) -> str:
        """The Win32/UIA class name the tree's element tag is derived from."""
        return self.cls or self.role

    def walk(self) -> Iterator["Control"]:
        """Pre-order walk over this control and its descendants."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass
class EditState:
    """Text of a single edit field; ``all_selected`` means typing replaces everything."""

    text: str = ""
    all_selected: bool = False

    def type(self, text: str) -> None:
        """Insert text at the caret (always at the end in this simulation)."""
        if self.all_selected:
            self.text, self.all_selected = "", False
        self.text += text

    def key(self, key: str, mods: frozenset[str] = frozenset()) -> bool:
        """Apply an editing key; True when it was an editing key."""
        if key == "a" and mods == {"ctrl"}:
            self.all_selected = True
        elif key == "backspace":
            self.text = "" if self.all_selected else self.text[:-1]
            self.all_selected = False
        elif key == "delete":
            if self.all_selected:
                self.text, self.all_selected = "", False
        elif key in ("left", "right", "home", "end"):
            self.all_selected = False
        else:
            return False
        return True


class Window:
    """Base class of every top-level window. Subclasses hold only plain, copyable state."""

    cls_name = "Window"

    def __init__(self, wid: int, rect: Rect) -> None:
        self.wid = wid
        self.rect = rect
        self.minimized = False
        self.focus = ""  # key of the control with keyboard focus
        self.owner: int | None = None  # for dialogs: the window they block

    @property
    def title(self) -> str:
        """Window title as Windows shows it."""
        raise NotImplementedError

    @property
    def client_rect(self) -> Rect:
        """The area below the title bar."""
        x0, y0, x1, y1 = self.rect
        return (x0, y0 + TITLE_H, x1, y1)

    def build(self, desk: "Desktop") -> Control:
        """The full control tree of this window, with the frame and title bar."""
        x0, y0, x1, y1 = self.rect
        bar = Control("TitleBar", self.title, (x0, y0, x1, y0 + TITLE_H), cls="TitleBar")
        bar.children = [
            Control("Button", "Minimize", (x1 - 138, y0, x1 - 92, y0 + TITLE_H), key="__minimize"),
            Control("Button", "Close", (x1 - 46, y0, x1, y0 + TITLE_H), key="__close"),
        ]
        root = Control("Window", self.title, self.rect, cls=self.cls_name)
        root.children = [bar, *self.controls(desk)]
        if desk.focused_window() is self:
            for c in root.walk():
                c.focused = bool(c.key) and c.key == self.focus
        return root

    def controls(self, desk: "Desktop") -> list[Control]:
        """The client-area controls (subclasses)."""
        return []

    def on_click(self, desk: "Desktop", key: str, *, double: bool, button: str) -> None:
        """React to a click on the control with this key ("" for empty space)."""

    def on_key(self, desk: "Desktop", key: str, mods: frozenset[str]) -> None:
        """React to a key press (already normalised) with the held modifiers."""

    def on_text(self, desk: "Desktop", text: str) -> None:
        """React to typed printable text."""

    def close(self, desk: "Desktop") -> None:
        """Close this window (apps may veto by overriding)."""
        desk.remove_window(self)


class Desktop:
    """The whole simulated machine state apart from the disk."""

    def __init__(self, fs: "SimFileSystem", width: int = 1280, height: int = 800) -> None:
        self.fs = fs
        self.width = width
        self.height = height
        self.windows: list[Window] = []  # bottom -> top
        self.mouse = (width // 2, height // 2)
        self.clipboard = ""
        self.registry = Registry.fresh()
        self.held: set[str] = set()  # modifiers held by keyDown
        self.next_wid = 1
        # Closing an app with unsaved changes asks to save first (quirks mode's save_prompts).
        self.save_prompts = False

    # -- snapshots -----------------------------------------------------------------------
    _STATE = ("windows", "mouse", "clipboard", "registry", "held", "next_wid")

    def capture(self) -> dict:
        """A deep copy of all desktop state (the disk is captured separately)."""
        return copy.deepcopy({k: getattr(self, k) for k in self._STATE})

    def restore(self, state: dict) -> None:
        """Restore a captured state exactly."""
        for k, v in copy.deepcopy(state).items():
            setattr(self, k, v)

    # -- windows -------------------------------------------------------------------------
    def new_wid(self) -> int:
        """A fresh window id."""
        wid = self.next_wid
        self.next_wid += 1
        return wid

    def cascade_rect(self, w: int, h: int, x: int = 120, y: int = 40) -> Rect:
        """A window rect offset from the others, kept on screen."""
        n = len(self.windows) % 6
        x, y = x + 28 * n, y + 28 * n
        x = max(0, min(x, self.width - w))
        y = max(0, min(y, self.height - TASKBAR_H - h))
        return (x, y, x + w, y + h)

    def add_window(self, win: Window) -> Window:
        """Open a window on top and give it focus."""
        self.windows.append(win)
        return win

    def remove_window(self, win: Window) -> None:
        """Close a window and any dialogs it owns."""
        for w in list(self.windows):
            if w.owner == win.wid:
                self.remove_window(w)
        if win in self.windows:
            self.windows.remove(win)

    def window(self, wid: int) -> Window | None:
        """Window by id."""
        return next((w for w in self.windows if w.wid == wid), None)

    def visible_windows(self) -> list[Window]:
        """Non-minimised windows, bottom -> top."""
        return [w for w in self.windows if not w.minimized]

    def focused_window(self) -> Window | None:
        """The foreground window (topmost non-minimised one)."""
        vis = self.visible_windows()
        return vis[-1] if vis else None

    def activate(self, win: Window) -> None:
        """Restore and raise a window; a window blocked by a dialog raises the dialog instead."""
        win.minimized = False
        if win in self.windows:
            self.windows.remove(win)
            self.windows.append(win)
        for w in list(self.windows):
            if w.owner == win.wid:
                self.activate(w)

    def find_windows(self, title_part: str) -> list[Window]:
        """Windows whose title contains title_part, case-insensitively, topmost first."""
        needle = title_part.upper()
        return [w for w in reversed(self.windows) if needle in w.title.upper()]

    # -- taskbar -------------------------------------------------------------------------
    @property
    def taskbar_rect(self) -> Rect:
        """Rectangle of the taskbar at the bottom of the screen."""
        return (0, self.height - TASKBAR_H, self.width, self.height)

    def build_taskbar(self) -> Control:
        """The taskbar: a Start button and one button per open window."""
        x0, y0, x1, y1 = self.taskbar_rect
        bar = Control("Pane", "Taskbar", self.taskbar_rect, cls="Shell_TrayWnd")
        bar.children.append(Control("Button", "Start", (x0 + 8, y0 + 4, x0 + 72, y1 - 4), key="start"))
        x = x0 + 84
        for w in self.windows:
            if w.owner is not None:
                continue
            bar.children.append(Control("Button", w.title, (x, y0 + 4, x + 160, y1 - 4),
                                        key=f"task:{w.wid}", selected=w is self.focused_window()))
            x += 166
        return bar

    def build_desktop_icons(self) -> Control:
        """The desktop surface with one icon per entry of the Desktop folder."""
        from .filesystem import USER_HOME

        root = Control("Pane", "Program Manager", (0, 0, self.width, self.height - TASKBAR_H), cls="Progman")
        lst = Control("List", "Desktop", root.rect, cls="SysListView32")
        try:
            names = self.fs.listdir(USER_HOME + "\\Desktop")
        except OSError:
            names = []
        for i, name in enumerate(names[:24]):
            col, row = divmod(i, 8)
            x, y = 10 + col * 90, 10 + row * 88
            lst.children.append(Control("ListItem", name, (x, y, x + 80, y + 80), key=f"icon:{name}"))
        root.children.append(lst)
        return root

    # -- input ---------------------------------------------------------------------------
    def window_at(self, x: int, y: int) -> Window | None:
        """Topmost visible window containing the point."""
        for w in reversed(self.visible_windows()):
            if contains(w.rect, x, y):
                return w
        return None

    @staticmethod
    def hit(root: Control, x: int, y: int) -> Control | None:
        """Deepest control with a key under the point; later siblings (popups) win."""
        if not contains(root.rect, x, y):
            return None
        for child in reversed(root.children):
            found = Desktop.hit(child, x, y)
            if found is not None:
                return found
        return root if root.key else None

    def click(self, x: int, y: int, *, button: str = "left", clicks: int = 1) -> None:
        """A mouse click (or double click when clicks >= 2) at the point."""
        self.mouse = (x, y)
        if contains(self.taskbar_rect, x, y):
            target = self.hit(self.build_taskbar(), x, y)
            if target and target.key.startswith("task:") and button == "left":
                win = self.window(int(target.key[5:]))
                if win is not None:
                    if win is self.focused_window() and clicks == 1:
                        win.minimized = True
                    else:
                        self.activate(win)
            return
        win = self.window_at(x, y)
        if win is None:
            target = self.hit(self.build_desktop_icons(), x, y)
            if target and clicks >= 2 and button == "left":
                from . import launch  # late import: launch builds apps on top of this module
                from .filesystem import USER_HOME

                launch.open_path(self, f"{USER_HOME}\\Desktop\\{target.name}")
            return
        blocking = [w for w in self.windows if w.owner == win.wid]
        if blocking:
            # Windows ignores clicks on a window with a modal dialog and flashes the dialog.
            self.activate(blocking[-1])
            return
        self.activate(win)
        target = self.hit(win.build(self), x, y)
        key = target.key if target else ""
        if key == "__close" and button == "left":
            win.close(self)
        elif key == "__minimize" and button == "left":
            win.minimized = True
        else:
            win.on_click(self, key, double=clicks >= 2, button=button)

    def press(self, key: str, extra_mods: frozenset[str] = frozenset()) -> None:
        """One key press, combined with modifiers held by keyDown and any chord modifiers."""
        key = norm_key(key)
        mods = frozenset(self.held) | extra_mods
        if key in MODIFIERS:
            return
        win = self.focused_window()
        if win is None:
            return
        if key == "f4" and mods == {"alt"}:
            win.close(self)
            return
        if len(key) == 1 and not (mods - {"shift"}):
            win.on_text(self, key.upper() if "shift" in mods else key)
            return
        win.on_key(self, key, mods)

    def type_text(self, text: str) -> None:
        """Printable text typed while no modifier other than shift is held."""
        for ch in text:
            if ch == "\n":
                self.press("enter")
            elif ch == "\t":
                self.press("tab")
            elif ch == "\b":
                self.press("backspace")
            else:
                self.press(ch)
