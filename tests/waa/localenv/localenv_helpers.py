"""Helpers shared by the local WAA environment tests (a uniquely named module, so it cannot
clash with other directories' conftest modules)."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

import requests

NS_CP = "{uri:deskat:component.at-spi.gnome.org}"


class Client:
    """A thin test client for the simulation's HTTP API."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url
        self.s = requests.Session()

    def get(self, route: str, **kw) -> requests.Response:
        return self.s.get(self.base + route, timeout=30, **kw)

    def post(self, route: str, **kw) -> requests.Response:
        return self.s.post(self.base + route, timeout=30, **kw)

    def reset(self) -> None:
        assert self.post("/sim/snapshot/load", json={"name": "initial"}).status_code == 200

    def pyautogui(self, code: str) -> dict:
        r = self.post("/execute", json={"command": ["python", "-c", "import pyautogui; import time; pyautogui.FAILSAFE = False; " + code], "shell": False})
        assert r.status_code == 200, r.text
        return r.json()

    def update_computer(self, rects: list | None = None) -> None:
        """Give the server's ``computer`` object the whole screen as its window (needed by /execute_windows)."""
        shot = base64.b64encode(self.get("/screenshot").content).decode()
        r = self.post("/update_computer", json={"rects": rects or [[0, 0, 10, 10]], "window_rect": [0, 0, 1280, 800],
                                                "screenshot": shot, "scale": [1, 1]})
        assert r.json() == {"success": True}, r.text

    def computer(self, code: str) -> requests.Response:
        return self.post("/execute_windows", json={"command": code})

    def title(self) -> str:
        return self.get("/obs_winagent").json()["window_title"]

    def tree(self) -> ET.Element:
        return ET.fromstring(self.get("/accessibility", params={"backend": "uia"}).json()["AT"])

    def read(self, path: str) -> bytes | None:
        r = self.post("/file", data={"file_path": path})
        return r.content if r.status_code == 200 else None

    def registry(self, path: str, name: str) -> dict:
        cmd = f"powershell -Command \"Get-ItemPropertyValue -Path '{path}' -Name '{name}'\""
        return self.post("/execute", json={"command": cmd}).json()


def bbox(el: ET.Element) -> tuple[int, int, int, int]:
    x, y = map(int, re.findall(r"-?\d+", el.get(NS_CP + "screencoord")))
    w, h = map(int, re.findall(r"-?\d+", el.get(NS_CP + "size")))
    return x, y, x + w, y + h


def find(root: ET.Element, role: str, name: str, window: str | None = None) -> ET.Element | None:
    """First element whose tag (the class name) and name match, case-insensitively."""
    scopes = [w for w in root if window is None or window.lower() in (w.get("name") or "").lower()]
    for scope in scopes:
        for el in scope.iter():
            if el.tag.lower() == role.lower() and (el.get("name") or "").lower() == name.lower():
                return el
    return None
