"""The simulated Windows registry: the few keys WAA's evaluator getters read.

Keys are stored under a canonical spelling (``HKCU\\Software\\...``); PowerShell's provider
spellings (``HKCU:\\Software``, ``HKCU:Software``, ``Registry::HKEY_CURRENT_USER\\...``) all map
to it. Key paths and value names are case-insensitive, as on Windows.
"""

from __future__ import annotations

import re

RegValue = int | str

_HIVES = {
    "hkcu": "HKCU",
    "hkey_current_user": "HKCU",
    "hklm": "HKLM",
    "hkey_local_machine": "HKLM",
}

STORAGE_POLICY_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\StorageSense\Parameters\StoragePolicy"
STORAGE_SENSE_ENABLED = "01"
STORAGE_SENSE_FREQUENCY = "2048"
PUSH_NOTIFICATIONS_KEY = r"HKCU\Software\Microsoft\Windows\CurrentVersion\PushNotifications"
TOAST_ENABLED = "ToastEnabled"
DESKTOP_KEY = r"HKCU\Control Panel\Desktop"

# Run-frequency codes as WAA's getter reads them back: days between runs, 0 = low disk space.
STORAGE_SENSE_CHOICES: dict[str, int] = {
    "Every day": 1,
    "Every week": 7,
    "Every month": 30,
    "During low free disk space": 0,
}


def canonical_key(path: str) -> str:
    """Canonical spelling of a registry key path; ValueError for an unknown hive."""
    p = path.strip()
    p = re.sub(r"^(?:Microsoft\.PowerShell\.Core\\)?Registry::", "", p, flags=re.I)
    m = re.match(r"^([A-Za-z_]+):?(?:\\|/|$)?", p)
    if not m or m.group(1).lower() not in _HIVES:
        raise ValueError(f"unknown registry hive in {path!r}")
    rest = p[m.end():]
    parts = [c for c in re.split(r"[\\/]+", rest) if c]
    return "\\".join([_HIVES[m.group(1).lower()], *parts])


class Registry:
    """A dict-backed registry. Deep-copyable, so snapshots capture it exactly."""

    def __init__(self) -> None:
        # lower-cased key -> (spelling, {lower-cased value name -> (spelling, value)})
        self._keys: dict[str, tuple[str, dict[str, tuple[str, RegValue]]]] = {}

    @classmethod
    def fresh(cls) -> "Registry":
        """The values a freshly installed WAA VM would show for the keys we model."""
        reg = cls()
        reg.set(STORAGE_POLICY_KEY, STORAGE_SENSE_ENABLED, 0)
        reg.set(STORAGE_POLICY_KEY, STORAGE_SENSE_FREQUENCY, 0)
        reg.set(PUSH_NOTIFICATIONS_KEY, TOAST_ENABLED, 1)
        reg.set(DESKTOP_KEY, "WallPaper", "C:\\Windows\\web\\wallpaper\\Windows\\img0.jpg")
        return reg

    def has_key(self, path: str) -> bool:
        """True when the key exists."""
        return canonical_key(path).lower() in self._keys

    def get(self, path: str, name: str) -> RegValue | None:
        """A value, or None when the key or the value is missing."""
        entry = self._keys.get(canonical_key(path).lower())
        if entry is None:
            return None
        item = entry[1].get(name.lower())
        return None if item is None else item[1]

    def set(self, path: str, name: str, value: RegValue) -> None:
        """Create or replace a value (creating the key, as the settings UI would)."""
        key = canonical_key(path)
        entry = self._keys.setdefault(key.lower(), (key, {}))
        entry[1][name.lower()] = (name, value)
