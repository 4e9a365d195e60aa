"""Parsing WAA's accessibility XML into UIElements."""

from __future__ import annotations

import pytest

from adapters.waa.accessibility import AccessibilityParseError, focused_element, parse_accessibility_xml

XML = """<desktop xmlns:st="uri:deskat:state.at-spi.gnome.org" xmlns:cp="uri:deskat:component.at-spi.gnome.org"
 xmlns:win="uri:deskat:uia.windows.microsoft.org">
  <notepad name="Untitled - Notepad" cp:screencoord="(10, 20)" cp:size="(600, 400)"
     win:class="&lt;class 'pywinauto.controls.uia_controls.WindowWrapper'&gt;">
    <edit name="Text Editor" st:focused="true" cp:screencoord="(12, 60)" cp:size="(596, 350)"
       win:class="&lt;class 'pywinauto.controls.uia_controls.EditWrapper'&gt;">hello &amp; bye</edit>
    <button name="Save" cp:screencoord="(0, 0)" cp:size="(0, 0)"/>
  </notepad>
</desktop>"""


def test_parse_roles_boxes_text_and_ids() -> None:
    tree = parse_accessibility_xml(XML)
    assert tree.role == "desktop"
    window = tree.children[0]
    assert window.role == "Window" and window.name == "Untitled - Notepad"
    assert window.bbox == (10, 20, 610, 420)
    edit = tree.find(role="Edit")
    assert edit is not None and edit.text == "hello & bye" and edit.center == (310, 235)
    assert edit.node_id == "0.0.0"
    assert tree.find(name="save").role == "button"
    assert focused_element(tree) is edit


def test_invalid_xml_is_a_clear_error() -> None:
    with pytest.raises(AccessibilityParseError, match="not valid XML"):
        parse_accessibility_xml("<desktop><unclosed></desktop>")
