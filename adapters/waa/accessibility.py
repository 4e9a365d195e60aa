"""Parse the accessibility tree XML that WAA's /accessibility route returns into UIElements.

The server walks pywinauto's tree and writes one XML element per control: the tag is the
control's window class, `name` its accessible name, `cp:screencoord` "(x, y)" and `cp:size`
"(w, h)" its rectangle, `st:*` its states, `val:value` its value and `win:class` the pywinauto
wrapper type (e.g. "<class '...uia_controls.ButtonWrapper'>"), from which the role is derived.
XML text is parsed with the standard library's parser; entities are not expanded beyond XML's own.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from adapters.benchmark import UIElement

_PAIR = re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$")
_WRAPPER = re.compile(r"(\w+)Wrapper'>?$")
# pywinauto wrapper classes whose name is not the UIA control type they wrap.
_WRAPPER_ROLES = {"ListView": "List", "Static": "Text", "Toolbar": "ToolBar", "Dialog": "Window"}
_GENERIC_WRAPPERS = {"Base", "UIA", "Hwnd", "Element"}
_ID_ATTRIBUTES = ("id", "node_id", "element_id", "runtime_id")


class AccessibilityParseError(ValueError):
    """The accessibility XML could not be parsed."""


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _pair(value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    match = _PAIR.match(value.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def _role(tag: str, attributes: dict[str, str]) -> str:
    """The control type from pywinauto's wrapper class when present, else the XML tag."""
    match = _WRAPPER.search(attributes.get("class", ""))
    if match and match.group(1) not in _GENERIC_WRAPPERS:
        return _WRAPPER_ROLES.get(match.group(1), match.group(1))
    return tag


def parse_accessibility_xml(xml_text: str) -> UIElement:
    """The whole tree as UIElements; node ids come from an id attribute or the tree position."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise AccessibilityParseError(f"accessibility tree is not valid XML: {exc}") from exc
    return _convert(root, "0")


def _convert(node: ET.Element, path: str) -> UIElement:
    attributes = {_local(k): v for k, v in node.attrib.items()}
    position = _pair(attributes.get("screencoord"))
    size = _pair(attributes.get("size"))
    bbox = None
    if position is not None and size is not None:
        bbox = (position[0], position[1], position[0] + size[0], position[1] + size[1])
    node_id = next((attributes[a] for a in _ID_ATTRIBUTES if attributes.get(a)), path)
    tag = _local(node.tag)
    return UIElement(
        node_id=node_id,
        role=_role(tag, attributes),
        name=attributes.get("name", ""),
        bbox=bbox,
        text=(node.text or "").strip(),
        attributes=attributes,
        children=[_convert(child, f"{path}.{i}") for i, child in enumerate(node)],
    )


def focused_element(tree: UIElement) -> UIElement | None:
    """The deepest element whose `focused` (or `keyboard_focused`) state is true."""
    found = None
    for node in tree.iter():
        if node.attributes.get("focused") == "true" or node.attributes.get("keyboard_focused") == "true":
            found = node
    return found


def visible_elements(tree: UIElement) -> list[UIElement]:
    """Elements with a non-empty box that are not marked invisible: what set-of-marks labels."""
    return [
        node
        for node in tree.iter()
        if node.bbox is not None
        and node.bbox[2] > node.bbox[0]
        and node.bbox[3] > node.bbox[1]
        and node.attributes.get("visible", "true") != "false"
    ]
