"""The accessibility tree of the real desktop, read from AT-SPI, as the XML WAA's client parses.

Shape (what adapters/waa/accessibility.py reads; the namespaces are AT-SPI's, as in the Linux
tree format WAA's ancestor OSWorld uses):

* root ``<desktop>`` declaring the prefixes ``st``, ``attr``, ``cp``, ``doc``, ``docattr``,
  ``txt``, ``val``, ``act`` and ``win``;
* one child per top-level window of every application (frames, dialogs, alerts), the active
  window first;
* tag = the AT-SPI role name, lower-cased, other characters than letters, digits, ``_`` and
  ``-`` as ``-`` (``push-button``, ``menu-item``, ``text``, ``frame``, ``table-cell``);
* attributes: ``name``; ``st:enabled``, ``st:visible``, ``st:focused``, ``st:selected``,
  ``st:checked``, ``st:expanded``, ``st:editable``, ``st:active`` as ``"true"``/``"false"`` where
  the element has the state's capability; ``cp:screencoord="(x, y)"`` and ``cp:size="(w, h)"``
  in screen pixels; ``val:value`` from the Value interface; ``id`` = the element's position in
  document order (the Set-of-Marks order the harness numbers ``/update_computer`` rects in);
* an element's text (Text interface, at most ``MAX_TEXT`` characters) as its XML text, when it is
  not its name. Characters XML cannot carry (C0 controls, lone surrogates) are written as
  U+FFFD, so typed control characters never make the tree unreadable (WAA's lxml refuses them
  and its route answers 500 until they are gone).

What is left out, and why: subtrees that are not showing (closed menus: thousands of elements
in LibreOffice), the children of elements that manage their descendants (a Calc sheet claims
over a billion cells), anything past ``MAX_DEPTH`` levels, ``MAX_CHILDREN`` children or
``MAX_ELEMENTS`` elements, and whatever is left when ``deadline_seconds`` runs out (a hung
application answers nothing); the root then says ``truncated="..."``.
"""

from __future__ import annotations

import re
import time
from xml.sax.saxutils import escape, quoteattr

import gi

gi.require_version("Atspi", "2.0")
from gi.repository import Atspi  # noqa: E402 - after require_version, as gi demands

NAMESPACES = {
    "st": "uri:deskat:state.at-spi.gnome.org",
    "attr": "uri:deskat:attributes.at-spi.gnome.org",
    "cp": "uri:deskat:component.at-spi.gnome.org",
    "doc": "uri:deskat:document.at-spi.gnome.org",
    "docattr": "uri:deskat:attributes.document.at-spi.gnome.org",
    "txt": "uri:deskat:text.at-spi.gnome.org",
    "val": "uri:deskat:value.at-spi.gnome.org",
    "act": "uri:deskat:action.at-spi.gnome.org",
    "win": "uri:deskat:uia.windows.microsoft.org",
}
MAX_DEPTH = 50
MAX_CHILDREN = 400
MAX_ELEMENTS = 4000
MAX_TEXT = 4000
# A hung application makes every D-Bus call wait; AT-SPI's own default is 25 s per call.
CALL_TIMEOUT_MS = 1500

_S = Atspi.StateType
# Only these roles have their text or value read: each read is a D-Bus round trip, and under
# TCG a LibreOffice window's hundreds of toolbar buttons and labels made the tree take tens of
# seconds when every element's text and value were asked for.
_TEXT_ROLES = {"text", "entry", "paragraph", "heading", "password-text", "document-text", "table-cell", "label",
               "static", "caption", "terminal", "editbar", "combo-box", "spin-button", "section", "list-item"}
_VALUE_ROLES = {"slider", "spin-button", "progress-bar", "scroll-bar", "dial", "level-bar"}
_WINDOW_ROLES = {"frame", "dialog", "alert", "window", "file-chooser", "color-chooser", "font-chooser"}
# (attribute, state, the state that says the element can have it: None = always written,
# the state itself = written only when true)
_FLAGS = (("enabled", _S.ENABLED, None), ("focused", _S.FOCUSED, _S.FOCUSABLE),
          ("selected", _S.SELECTED, _S.SELECTABLE), ("checked", _S.CHECKED, _S.CHECKABLE),
          ("expanded", _S.EXPANDED, _S.EXPANDABLE), ("editable", _S.EDITABLE, _S.EDITABLE))
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

Atspi.set_timeout(CALL_TIMEOUT_MS, 15000)


def tag_for(role: str) -> str:
    tag = "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in role.lower().replace(" ", "-")) or "unknown"
    return tag if tag[0].isalpha() else "tag" + tag


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


class _Walk:
    def __init__(self, deadline_seconds: float) -> None:
        self.deadline = time.monotonic() + deadline_seconds
        self.next_id = 0
        self.out: list[str] = []
        self.truncated: set[str] = set()

    def budget_left(self) -> bool:
        if self.next_id >= MAX_ELEMENTS:
            self.truncated.add("elements")
            return False
        if time.monotonic() > self.deadline:
            self.truncated.add("deadline")
            return False
        return True

    def element(self, node: Atspi.Accessible, depth: int, *, window: bool = False) -> None:
        if not self.budget_left():
            return
        try:
            role = node.get_role_name() or "unknown"
            name = node.get_name() or ""
            states = node.get_state_set()
        except Exception:  # noqa: BLE001 - an element that went away while we looked
            return
        showing = states.contains(_S.SHOWING) and states.contains(_S.VISIBLE)
        if not showing and not window:
            return
        attrs = [("name", name)]
        for label, state, capability in _FLAGS:
            if capability is None or states.contains(capability) or states.contains(state):
                attrs.append((f"st:{label}", "true" if states.contains(state) else "false"))
        attrs.append(("st:visible", "true" if showing else "false"))
        if window:
            attrs.append(("st:active", "true" if states.contains(_S.ACTIVE) else "false"))
        box = _extents(node)
        if box is not None:
            attrs += [("cp:screencoord", f"({box[0]:d}, {box[1]:d})"), ("cp:size", f"({box[2]:d}, {box[3]:d})")]
        tag = tag_for(role)
        value = _value(node) if tag in _VALUE_ROLES else None
        if value is not None:
            attrs.append(("val:value", value))
        attrs.append(("id", str(self.next_id)))
        self.next_id += 1
        text = _text(node) if tag in _TEXT_ROLES else ""
        head = f"<{tag} " + " ".join(f"{key}={quoteattr(_clean(val))}" for key, val in attrs)
        children = 0
        if depth < MAX_DEPTH and not states.contains(_S.MANAGES_DESCENDANTS):
            try:
                children = min(node.get_child_count(), MAX_CHILDREN)
            except Exception:  # noqa: BLE001
                children = 0
        body = escape(_clean(text)) if text and text != name else ""
        if not body and not children:
            self.out.append(head + "/>")
            return
        self.out.append(head + ">" + body)
        for index in range(children):
            try:
                child = node.get_child_at_index(index)
            except Exception:  # noqa: BLE001
                continue
            if child is not None:
                self.element(child, depth + 1)
        self.out.append(f"</{tag}>")


def _extents(node: Atspi.Accessible) -> tuple[int, int, int, int] | None:
    try:
        component = node.get_component_iface()
        if component is None:
            return None
        rect = component.get_extents(Atspi.CoordType.SCREEN)
    except Exception:  # noqa: BLE001
        return None
    return int(rect.x), int(rect.y), int(rect.width), int(rect.height)


def _value(node: Atspi.Accessible) -> str | None:
    try:
        value = node.get_value_iface()
        return None if value is None else f"{value.get_current_value():g}"
    except Exception:  # noqa: BLE001
        return None


def _text(node: Atspi.Accessible) -> str:
    try:
        text = node.get_text_iface()
        if text is None:
            return ""
        count = min(text.get_character_count(), MAX_TEXT)
        return text.get_text(0, count) if count > 0 else ""
    except Exception:  # noqa: BLE001
        return ""


def top_level_windows() -> list[Atspi.Accessible]:
    """Every application's top-level windows, the active one first."""
    desktop = Atspi.get_desktop(0)
    windows: list[Atspi.Accessible] = []
    for index in range(desktop.get_child_count()):
        try:
            app = desktop.get_child_at_index(index)
            count = app.get_child_count() if app is not None else 0
        except Exception:  # noqa: BLE001 - an application that quit (or hangs) while we looked
            continue
        for child_index in range(count):
            try:
                child = app.get_child_at_index(child_index)
            except Exception:  # noqa: BLE001
                continue
            if child is not None:
                windows.append(child)

    def active(window: Atspi.Accessible) -> bool:
        try:
            return bool(window.get_state_set().contains(_S.ACTIVE))
        except Exception:  # noqa: BLE001
            return False

    return sorted(windows, key=lambda w: not active(w))


def build_xml(deadline_seconds: float = 60.0) -> str:
    """The whole tree as the XML string WAA's /accessibility returns under "AT"."""
    walk = _Walk(deadline_seconds)
    for window in top_level_windows():
        walk.element(window, 0, window=True)
    declarations = " ".join(f'xmlns:{prefix}="{uri}"' for prefix, uri in NAMESPACES.items())
    truncated = f' truncated="{",".join(sorted(walk.truncated))}"' if walk.truncated else ""
    return f"<desktop {declarations}{truncated}>" + "".join(walk.out) + "</desktop>"
