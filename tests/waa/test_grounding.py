"""Set-of-Marks: mark indices, the /update_computer payload and the labelled screenshot."""

from __future__ import annotations

import base64
import io

from PIL import Image

from adapters.benchmark import UIElement
from adapters.waa.grounding import Marks, draw_marks


def _tree() -> UIElement:
    return UIElement(
        node_id="0",
        role="desktop",
        children=[
            UIElement(node_id="1", role="Window", name="w", bbox=(10, 10, 200, 100)),
            UIElement(node_id="2", role="Button", name="hidden", bbox=(0, 0, 0, 0)),
            UIElement(node_id="3", role="Button", name="ok", bbox=(20, 60, 60, 90), attributes={"visible": "true"}),
            UIElement(node_id="4", role="Button", name="off", bbox=(20, 60, 60, 90), attributes={"visible": "false"}),
        ],
    )


def _png(width: int = 300, height: int = 200) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(out, format="PNG")
    return out.getvalue()


def test_marks_are_visible_elements_in_document_order() -> None:
    marks = Marks.from_tree(_tree())
    assert [e.node_id for e in marks.elements] == ["1", "3"]
    assert marks.index_of("3") == 1 and marks.index_of("2") is None
    payload = marks.update_computer_payload(_png(), 300, 200)
    assert payload["rects"] == [[10, 10, 200, 100], [20, 60, 60, 90]]
    assert payload["window_rect"] == [0, 0, 300, 200]
    assert base64.b64decode(payload["screenshot"]).startswith(b"\x89PNG")
    assert marks.fingerprint() != Marks.from_tree(UIElement(node_id="0", role="desktop")).fingerprint()


def test_draw_marks_outlines_each_mark() -> None:
    plain = _png()
    marked = Image.open(io.BytesIO(draw_marks(plain, Marks.from_tree(_tree())))).convert("RGB")
    assert marked.size == (300, 200)
    assert marked.getpixel((10, 50)) != (255, 255, 255)  # the window's left edge is outlined
    assert marked.getpixel((150, 150)) == (255, 255, 255)  # outside every mark stays untouched
