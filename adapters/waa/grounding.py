"""Element grounding: Set-of-Marks over the accessibility tree, as WAA's Navi agent does it.

The visible elements of the current tree, in document order, are the marks. Mark i is what the
server's `computer.mouse.move_id(i)` moves to once the marks' rectangles were sent with
/update_computer, so a click on an element id runs through the server's own id path. Agents
see each mark labelled with the element's node_id (the id they use in actions); the index is
an internal detail of the server protocol.
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass

from PIL import Image, ImageDraw

from adapters.benchmark import BBox, UIElement
from adapters.waa.accessibility import visible_elements

_PALETTE = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 140, 140)]


@dataclass(frozen=True)
class Marks:
    """The elements an agent can target by id, in the order the server numbers them."""

    elements: tuple[UIElement, ...]

    @classmethod
    def from_tree(cls, tree: UIElement | None) -> Marks:
        return cls(tuple(visible_elements(tree)) if tree is not None else ())

    def index_of(self, node_id: str) -> int | None:
        """The server-side mark index of an element id, or None when it is not a visible mark."""
        for index, element in enumerate(self.elements):
            if element.node_id == node_id:
                return index
        return None

    def rects(self) -> list[list[int]]:
        return [list(element.bbox) for element in self.elements if element.bbox is not None]

    def fingerprint(self) -> str:
        """Changes whenever the ids or rectangles change; used to skip redundant updates."""
        text = ";".join(f"{e.node_id}:{e.bbox}" for e in self.elements)
        return hashlib.sha256(text.encode()).hexdigest()

    def update_computer_payload(self, screenshot_png: bytes, width: int, height: int) -> dict[str, object]:
        """The /update_computer body: rects in screenshot pixels, the screen as the window rect."""
        return {
            "rects": self.rects(),
            "window_rect": [0, 0, width, height],
            "screenshot": base64.b64encode(screenshot_png).decode("ascii"),
            "scale": [1.0, 1.0],
            "clipboard_content": "",
            "swap_ctrl_alt": False,
        }


def draw_marks(screenshot_png: bytes, marks: Marks) -> bytes:
    """The screenshot with every mark outlined and labelled with its node_id (Set-of-Marks)."""
    image = Image.open(io.BytesIO(screenshot_png)).convert("RGB")
    draw = ImageDraw.Draw(image)
    for index, element in enumerate(marks.elements):
        bbox: BBox | None = element.bbox
        if bbox is None:
            continue
        color = _PALETTE[index % len(_PALETTE)]
        draw.rectangle(bbox, outline=color, width=2)
        label = element.node_id
        left, top = bbox[0], max(0, bbox[1] - 11)
        text_box = draw.textbbox((left, top), label)
        draw.rectangle((text_box[0] - 1, text_box[1] - 1, text_box[2] + 1, text_box[3] + 1), fill=color)
        draw.text((left, top), label, fill=(255, 255, 255))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
