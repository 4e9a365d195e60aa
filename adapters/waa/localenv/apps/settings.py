"""Simulated Settings app: System, Storage and Notifications pages backed by the registry.

State lives only in the simulated registry, at the keys WAA's getters read:
Storage Sense on/off is ``StoragePolicy\\01`` (1/0), its run frequency ``StoragePolicy\\2048``
(1 = every day, 7 = every week, 30 = every month, 0 = during low free disk space), and
notifications ``PushNotifications\\ToastEnabled`` (1 on, 0 off).
"""

from __future__ import annotations

from ..desktop import Control, Desktop, Window
from ..registry import (
    PUSH_NOTIFICATIONS_KEY,
    STORAGE_POLICY_KEY,
    STORAGE_SENSE_CHOICES,
    STORAGE_SENSE_ENABLED,
    STORAGE_SENSE_FREQUENCY,
    TOAST_ENABLED,
)

PAGES = ("System", "Storage", "Notifications")
# ms-settings: URIs that land on a page we simulate; anything else shows System.
URI_PAGES = {"storagesense": "Storage", "storagepolicies": "Storage", "notifications": "Notifications"}


class Settings(Window):
    """The Settings window."""

    cls_name = "ApplicationFrameWindow"

    def __init__(self, wid: int, rect: tuple[int, int, int, int], page: str = "System") -> None:
        super().__init__(wid, rect)
        self.page = page
        self.dropdown_open = False
        self.focus = f"nav:{page}"

    @property
    def title(self) -> str:
        return "Settings"

    @staticmethod
    def storage_sense_on(desk: Desktop) -> bool:
        """Storage Sense switch state from the registry."""
        return desk.registry.get(STORAGE_POLICY_KEY, STORAGE_SENSE_ENABLED) == 1

    @staticmethod
    def frequency_label(desk: Desktop) -> str:
        """Current "Run Storage Sense" choice from the registry."""
        code = desk.registry.get(STORAGE_POLICY_KEY, STORAGE_SENSE_FREQUENCY)
        for label, value in STORAGE_SENSE_CHOICES.items():
            if value == code:
                return label
        return "During low free disk space"

    @staticmethod
    def notifications_on(desk: Desktop) -> bool:
        """Notifications switch state (a missing value means on, as in Windows)."""
        return desk.registry.get(PUSH_NOTIFICATIONS_KEY, TOAST_ENABLED) != 0

    def controls(self, desk: Desktop) -> list[Control]:
        x0, y0, x1, y1 = self.client_rect
        nav = Control("List", "Navigation", (x0 + 8, y0 + 56, x0 + 228, y1 - 8), cls="List")
        for i, page in enumerate(PAGES):
            nav.children.append(Control("ListItem", page, (x0 + 12, y0 + 60 + 40 * i, x0 + 224, y0 + 96 + 40 * i),
                                        key=f"nav:{page}", selected=page == self.page))
        px = x0 + 248
        out = [Control("Text", self.page, (px, y0 + 12, x1 - 16, y0 + 48)), nav]
        if self.page == "System":
            out.append(Control("Text", "Storage, notifications and more", (px, y0 + 60, x1 - 16, y0 + 84)))
            out.append(Control("Button", "Storage", (px, y0 + 96, x1 - 16, y0 + 136), key="nav:Storage"))
            out.append(Control("Button", "Notifications", (px, y0 + 144, x1 - 16, y0 + 184), key="nav:Notifications"))
        elif self.page == "Storage":
            on = self.storage_sense_on(desk)
            out.append(Control("Text", "Automatically free up space, delete temporary files, and manage locally "
                                       "available cloud content", (px, y0 + 60, x1 - 16, y0 + 84)))
            out.append(Control("Text", "Storage Sense", (px, y0 + 100, px + 240, y0 + 124)))
            out.append(Control("Button", "Storage Sense", (x1 - 140, y0 + 96, x1 - 40, y0 + 128), key="toggle:storage",
                               cls="ToggleSwitch", checked=on, value="On" if on else "Off"))
            out.append(Control("Text", "Run Storage Sense", (px, y0 + 150, px + 240, y0 + 176)))
            label = self.frequency_label(desk)
            combo = Control("ComboBox", "Run Storage Sense", (x1 - 340, y0 + 146, x1 - 40, y0 + 178), key="combo",
                            cls="ComboBox", value=label, text=label, expanded=self.dropdown_open)
            out.append(combo)
            if self.dropdown_open:
                lst = Control("List", "Run Storage Sense", (x1 - 340, y0 + 180, x1 - 40, y0 + 182 + 34 * 4), cls="List")
                for i, choice in enumerate(STORAGE_SENSE_CHOICES):
                    lst.children.append(Control("ListItem", choice, (x1 - 338, y0 + 182 + 34 * i, x1 - 42, y0 + 214 + 34 * i),
                                                key=f"choice:{choice}", selected=choice == label))
                out.append(lst)
        elif self.page == "Notifications":
            on = self.notifications_on(desk)
            out.append(Control("Text", "Get notifications from apps and other senders", (px, y0 + 60, x1 - 16, y0 + 84)))
            out.append(Control("Text", "Notifications", (px, y0 + 100, px + 240, y0 + 124)))
            out.append(Control("Button", "Notifications", (x1 - 140, y0 + 96, x1 - 40, y0 + 128), key="toggle:notifications",
                               cls="ToggleSwitch", checked=on, value="On" if on else "Off"))
        return out

    def toggle(self, desk: Desktop, which: str) -> None:
        """Flip a switch by writing the registry value behind it."""
        if which == "storage":
            desk.registry.set(STORAGE_POLICY_KEY, STORAGE_SENSE_ENABLED, 0 if self.storage_sense_on(desk) else 1)
        elif which == "notifications":
            desk.registry.set(PUSH_NOTIFICATIONS_KEY, TOAST_ENABLED, 0 if self.notifications_on(desk) else 1)

    def on_click(self, desk: Desktop, key: str, *, double: bool, button: str) -> None:
        if key.startswith("choice:") and self.dropdown_open:
            desk.registry.set(STORAGE_POLICY_KEY, STORAGE_SENSE_FREQUENCY, STORAGE_SENSE_CHOICES[key[7:]])
            self.dropdown_open, self.focus = False, "combo"
            return
        self.dropdown_open = key == "combo" and not self.dropdown_open
        if key:
            self.focus = key
        if key.startswith("nav:"):
            self.page = key[4:]
        elif key.startswith("toggle:"):
            self.toggle(desk, key[7:])

    def on_key(self, desk: Desktop, key: str, mods: frozenset[str]) -> None:
        if self.dropdown_open and key in ("up", "down"):
            labels = list(STORAGE_SENSE_CHOICES)
            i = labels.index(self.frequency_label(desk))
            i = max(0, i - 1) if key == "up" else min(len(labels) - 1, i + 1)
            desk.registry.set(STORAGE_POLICY_KEY, STORAGE_SENSE_FREQUENCY, STORAGE_SENSE_CHOICES[labels[i]])
        elif key in ("enter", "escape") and self.dropdown_open:
            self.dropdown_open = False
        elif key == "enter" and self.focus.startswith("toggle:"):
            self.toggle(desk, self.focus[7:])
        elif key == "enter" and self.focus == "combo":
            self.dropdown_open = True

    def on_text(self, desk: Desktop, text: str) -> None:
        if text == " " and self.focus.startswith("toggle:"):
            self.toggle(desk, self.focus[7:])


def open_settings(desk: Desktop, page: str = "System") -> Settings:
    """Open Settings on a page, reusing the single Settings window like Windows does."""
    for w in desk.windows:
        if isinstance(w, Settings):
            w.page, w.dropdown_open = page, False
            desk.activate(w)
            return w
    win = Settings(desk.new_wid(), desk.cascade_rect(1000, 680, 80, 30), page)
    desk.add_window(win)
    return win
