"""The accessibility tree of the simulated desktop, in the XML the WAA server produces.

Format (as the real server builds it for ``backend=uia`` / ``win32`` with pywinauto):

* root element ``<desktop>`` declaring the server's nine namespace prefixes
  (``st``, ``attr``, ``cp``, ``doc``, ``docattr``, ``txt``, ``val``, ``act``, ``win``);
* one child per top-level window in z-order, topmost first: the taskbar (``shell_traywnd``),
  the app windows, and last the desktop itself (``progman``, "Program Manager");
* element tag = the element's class name, lower-cased, every character that is not alphanumeric,
  ``_`` or ``-`` replaced by ``-``, prefixed with ``tag`` when it does not start with a letter
  (so the dialog class ``#32770`` becomes ``tag-32770``). Plain controls use their UIA control
  type as class name (``button``, ``edit``, ``list``, ``listitem``, ``menuitem``, ``combobox``,
  ``text``...), Settings switches use ``toggleswitch`` as real Windows 11 does;
* attributes: ``name``; ``st:enabled``, ``st:visible`` and, where they apply, ``st:active``,
  ``st:minimized``, ``st:maximized``, ``st:normal`` (windows), ``st:focused``,
  ``st:keyboard_focused``, ``st:selected``, ``st:checkable``, ``st:checked``, ``st:expanded``,
  ``st:editable`` (all ``"true"``/``"false"``); ``cp:screencoord="(x, y)"`` and
  ``cp:size="(w, h)"`` in screen pixels; ``val:value`` for edits, combo boxes, switches and
  list items; ``win:class`` with the pywinauto wrapper class repr, as the real server writes;
* the element's text (an edit's contents) as XML text, omitted when equal to the name; any
  Unicode text is kept verbatim (``\r`` as ``&#13;``). A C0 control character other than
  tab/newline/CR anywhere raises :class:`XMLIncompatible` with lxml's own message, as the real
  server's serializer does (its route then answers 500 until the text is gone); lone surrogates
  and U+FFFE/U+FFFF are shown as U+FFFD.

Element ids (a simulation addition; the real server emits none): every element except the
``desktop`` root carries ``id="N"``, its 0-based position in document (pre-)order. That is the
order in which a Set-of-Marks client such as Navi would list the elements, so a client that sends
the elements' boxes in document order as ``/update_computer`` ``rects`` (``[left, top, right,
bottom]``, with ``window_rect=[0, 0, width, height]`` and ``scale=[1, 1]``) can address element N
with ``computer.mouse.move_id(N)``. Ids are deterministic for a given desktop state; they shift
when windows open or close, exactly like Navi's indices. Minimised windows are listed without
children at (-32000, -32000), as Windows places them.
"""

from __future__ import annotations

import re

from .desktop import Control, Desktop

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

_UIA_WRAPPERS = {
    "Button": "uia_controls.ButtonWrapper", "Edit": "uia_controls.EditWrapper",
    "ComboBox": "uia_controls.ComboBoxWrapper", "List": "uia_controls.ListViewWrapper",
    "ListItem": "uia_controls.ListItemWrapper", "MenuItem": "uia_controls.MenuItemWrapper",
    "Menu": "uia_controls.MenuWrapper", "ToolBar": "uia_controls.ToolbarWrapper",
    "Text": "uia_controls.StaticWrapper", "TitleBar": "uia_controls.TitleBarWrapper",
}
_WIN32_WRAPPERS = {
    "Button": "win32_controls.ButtonWrapper", "Edit": "win32_controls.EditWrapper",
    "ComboBox": "win32_controls.ComboBoxWrapper", "List": "common_controls.ListViewWrapper",
    "Text": "win32_controls.StaticWrapper", "ToolBar": "common_controls.ToolbarWrapper",
}


def tag_for(class_name: str) -> str:
    """Element tag for a class name, by the real server's rule."""
    tag = "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in class_name.lower().replace(" ", "-"))
    if not tag.strip():
        tag = "unknown"
    if not tag[0].isalpha():
        tag = "tag" + tag
    return tag


def wrapper_class(role: str, backend: str) -> str:
    """The ``win:class`` value: repr of the pywinauto wrapper type the real server would see."""
    if backend == "uia":
        mod = _UIA_WRAPPERS.get(role, "uiawrapper.UIAWrapper")
    else:
        mod = _WIN32_WRAPPERS.get(role, "hwndwrapper.HwndWrapper")
    return f"<class 'pywinauto.controls.{mod}'>"


_XML_INVALID = re.compile("[\ud800-\udfff\ufffe\uffff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")
XML_INCOMPATIBLE_MESSAGE = "All strings must be XML compatible: Unicode or ASCII, no NULL bytes or control characters"


class XMLIncompatible(ValueError):
    """A window's text holds a control character, which lxml (the real server's serializer) refuses."""

    def __init__(self) -> None:
        super().__init__(XML_INCOMPATIBLE_MESSAGE)


def _esc(s: str, attr: bool = False) -> str:
    if _CONTROL.search(s):
        raise XMLIncompatible()
    # Other characters XML 1.0 cannot carry at all (lone surrogates) become U+FFFD.
    s = _XML_INVALID.sub("\ufffd", s)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if attr:
        s = s.replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;")
    else:
        s = s.replace("\r", "&#13;")
    return s


def _tf(v: bool) -> str:
    return "true" if v else "false"


class _Writer:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.next_id = 0
        self.out: list[str] = []

    def element(self, c: Control, *, window: dict | None = None, minimized: bool = False) -> None:
        attrs: list[tuple[str, str]] = [("name", c.name), ("st:enabled", _tf(c.enabled)), ("st:visible", _tf(not minimized))]
        if window is not None:
            attrs += [("st:active", _tf(window["active"])), ("st:minimized", _tf(minimized)),
                      ("st:maximized", "false"), ("st:normal", _tf(not minimized))]
        if c.checked is not None:
            attrs += [("st:checkable", "true"), ("st:checked", _tf(c.checked))]
        if c.key or c.editable:
            attrs += [("st:focused", _tf(c.focused)), ("st:keyboard_focused", _tf(c.focused))]
        if c.selected is not None:
            attrs.append(("st:selected", _tf(c.selected)))
        if c.expanded is not None:
            attrs.append(("st:expanded", _tf(c.expanded)))
        if c.editable:
            attrs.append(("st:editable", "true"))
        if minimized:
            left, top, width, height = -32000, -32000, 160, 28
        else:
            left, top, width, height = c.rect[0], c.rect[1], c.rect[2] - c.rect[0], c.rect[3] - c.rect[1]
        attrs += [("cp:screencoord", f"({left:d}, {top:d})"), ("cp:size", f"({width:d}, {height:d})")]
        if c.role in ("List", "ComboBox"):
            attrs.append(("selection", "true"))
        if c.value is not None:
            attrs.append(("val:value", c.value))
        attrs += [("win:class", wrapper_class(c.role, self.backend)), ("id", str(self.next_id))]
        self.next_id += 1
        tag = tag_for(c.class_name)
        head = f"<{tag} " + " ".join(f'{k}="{_esc(v, True)}"' for k, v in attrs)
        text = c.text if c.text and c.text != c.name else ""
        children = [] if minimized else c.children
        if not text and not children:
            self.out.append(head + "/>")
            return
        self.out.append(head + ">" + _esc(text))
        for ch in children:
            self.element(ch)
        self.out.append(f"</{tag}>")


def build_xml(desk: Desktop, backend: str = "uia") -> str:
    """The whole accessibility tree as the XML string the real server returns under "AT"."""
    w = _Writer(backend)
    decl = " ".join(f'xmlns:{p}="{u}"' for p, u in NAMESPACES.items())
    w.out.append(f"<desktop {decl}>")
    w.element(desk.build_taskbar(), window={"active": False})
    focused = desk.focused_window()
    for win in reversed(desk.windows):
        w.element(win.build(desk), window={"active": win is focused}, minimized=win.minimized)
    w.element(desk.build_desktop_icons(), window={"active": focused is None})
    w.out.append("</desktop>")
    return "".join(w.out)


def element_rects(desk: Desktop) -> list[tuple[int, int, int, int]]:
    """Boxes of all elements in id order (what a Navi-style client sends to /update_computer)."""
    rects: list[tuple[int, int, int, int]] = []

    def walk(c: Control, minimized: bool = False) -> None:
        rects.append((-32000, -32000, -31840, -31972) if minimized else c.rect)
        if not minimized:
            for ch in c.children:
                walk(ch)

    walk(desk.build_taskbar())
    for win in reversed(desk.windows):
        walk(win.build(desk), win.minimized)
    walk(desk.build_desktop_icons())
    return rects
