"""Screenshots of the simulated desktop, drawn with Pillow from the same control trees that the
accessibility tree exports, so every box an agent reads is exactly where it is drawn.

Uses Pillow's built-in bitmap font (no font files) and a cached background, so a 1280x800 frame
renders in a few milliseconds. A "SIMULATED" watermark sits in the top-right corner.

Live regions (quirks mode's ``live_regions``): a real Windows desktop always has something moving
whether or not anyone acts. Drawn at the time a frame is rendered (``live_at``, seconds since the
epoch): the focused text field's caret blinks (Windows' default rate, on and off every 530 ms), a
progress ring turns in the taskbar (one turn a second, smoothly), and the taskbar clock shows
seconds. Without ``live_at`` the caret is always drawn and there is no ring or clock, so two
screenshots of the same desktop are identical.
"""

from __future__ import annotations

import io
import time
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from . import SIMULATION_LABEL
from .desktop import Control, Desktop

BG = (32, 78, 120)
FRAME = (120, 120, 120)
FOCUS = (0, 103, 192)
SELECT = (204, 228, 247)
# Windows' default caret blink: on for 530 ms, off for 530 ms (GetCaretBlinkTime).
CARET_BLINK_SECONDS = 0.53
RING_TURN_SECONDS = 1.0  # the progress ring's turn
RING_SIZE = 48  # a WinUI progress ring, as in a loading page
CLOCK_CHARS = 8  # "HH:MM:SS", drawn at twice the bitmap font's size (the taskbar's 12 pt at 150 %)


def _bitmap_font() -> ImageFont.ImageFont:
    try:
        # Pillow >= 10.1 returns a FreeType font from load_default(); ask for the bitmap one.
        return _cached_font()
    except AttributeError:  # pragma: no cover - older Pillow: load_default() is the bitmap font
        return ImageFont.load_default()


@lru_cache(maxsize=1)
def _cached_font() -> ImageFont.ImageFont:
    return ImageFont.load_default_imagefont()  # type: ignore[attr-defined]


CHAR_W = 6  # the bitmap font is fixed-width enough for clipping


@lru_cache(maxsize=4)
def _background(width: int, height: int) -> Image.Image:
    return Image.new("RGB", (width, height), BG)


def _clip(text: str, width: int, tail: bool = False) -> str:
    n = max(0, (width - 8) // CHAR_W)
    if len(text) <= n:
        return text
    return text[-n:] if tail else text[: max(0, n - 1)] + "~"


def _drawable(text: str) -> str:
    """The bitmap font draws Latin-1 only: show anything else (CJK, emoji, controls) as '?'."""
    return "".join(ch if " " <= ch <= "~" or "\xa0" <= ch <= "\xff" else "?" for ch in text)


class _Painter:
    def __init__(self, img: Image.Image, caret_on: bool = True) -> None:
        self.d = ImageDraw.Draw(img)
        self.font = _bitmap_font()
        self.caret_on = caret_on

    def text(self, xy: tuple[int, int], s: str, fill=(0, 0, 0)) -> None:
        self.d.text(xy, _drawable(s), fill=fill, font=self.font)

    def control(self, c: Control) -> None:
        x0, y0, x1, y1 = c.rect
        box = (x0, y0, x1 - 1, y1 - 1)
        cy = (y0 + y1) // 2 - 5
        role, cls = c.role, c.class_name
        if cls == "ToggleSwitch":
            on = bool(c.checked)
            self.d.rounded_rectangle(box, radius=(y1 - y0) // 2, fill=FOCUS if on else (255, 255, 255),
                                     outline=(60, 60, 60), width=2 if c.focused else 1)
            knob_x = x1 - (y1 - y0) + 4 if on else x0 + 4
            self.d.ellipse((knob_x, y0 + 6, knob_x + (y1 - y0) - 12, y1 - 7), fill=(255, 255, 255) if on else (60, 60, 60))
            self.text((x0 - 40, cy), "On" if on else "Off", fill=(0, 0, 0))
        elif role == "Window":
            self.d.rectangle(box, fill=(250, 250, 250), outline=FRAME)
        elif role == "TitleBar":
            self.d.rectangle(box, fill=(235, 238, 242))
            self.text((x0 + 10, cy), _clip(c.name, x1 - x0 - 160))
        elif role == "Button":
            if c.name == "Close" and c.key == "__close":
                self.text((x0 + 20, cy), "X")
            elif c.name == "Minimize" and c.key == "__minimize":
                self.text((x0 + 20, cy), "_")
            else:
                self.d.rectangle(box, fill=(229, 241, 251) if c.selected else (240, 240, 240),
                                 outline=FOCUS if c.focused else (170, 170, 170))
                self.text((x0 + 8, cy), _clip(c.name, x1 - x0))
        elif role == "Edit":
            self.d.rectangle(box, fill=(255, 255, 255), outline=FOCUS if c.focused else (150, 150, 150),
                             width=2 if c.focused else 1)
            lines = c.text.split("\n")
            max_lines = max(1, (y1 - y0 - 6) // 12)
            shown = lines[-max_lines:]
            for i, line in enumerate(shown):
                line = _clip(line.replace("\t", "    "), x1 - x0, tail=True)
                ty = y0 + 4 + 12 * i if len(lines) > 1 or (y1 - y0) > 40 else cy
                if c.text_selected and line:
                    self.d.rectangle((x0 + 3, ty, x0 + 5 + CHAR_W * len(line), ty + 11), fill=SELECT)
                self.text((x0 + 4, ty), line)
            if c.focused and self.caret_on:  # caret after the last character
                last = _clip(shown[-1].replace("\t", "    "), x1 - x0, tail=True)
                cx = x0 + 4 + CHAR_W * len(last)
                ty = y0 + 4 + 12 * (len(shown) - 1) if len(lines) > 1 or (y1 - y0) > 40 else cy
                self.d.line((cx, ty, cx, ty + 11), fill=(0, 0, 0))
        elif role == "ListItem":
            if c.selected:
                self.d.rectangle(box, fill=SELECT, outline=FOCUS if c.focused else SELECT)
            indent = 8
            if c.value is not None:  # Explorer items: a folder or file icon
                icon = (230, 190, 80) if c.value == "File folder" else (200, 200, 200)
                self.d.rectangle((x0 + 4, y0 + 4, x0 + 18, y1 - 5), fill=icon)
                indent = 26
            self.text((x0 + indent, cy), _clip(c.name, x1 - x0 - indent))
        elif role == "ComboBox":
            self.d.rectangle(box, fill=(255, 255, 255), outline=FOCUS if c.focused else (150, 150, 150))
            self.text((x0 + 8, cy), _clip(c.value or "", x1 - x0 - 20))
            self.text((x1 - 16, cy), "v")
        elif role in ("Menu",) or (role == "List" and c.name == "Run Storage Sense"):
            self.d.rectangle(box, fill=(255, 255, 255), outline=(100, 100, 100))
        elif role == "MenuItem":
            if c.expanded:
                self.d.rectangle(box, fill=SELECT)
            self.text((x0 + 8, cy), _clip(c.name, x1 - x0))
        elif role == "Text":
            self.text((x0 + 2, cy), _clip(c.name, x1 - x0))
        elif role in ("List", "ToolBar", "StatusBar", "MenuBar"):
            self.d.rectangle(box, outline=(225, 225, 225))
        for ch in c.children:
            self.control(ch)


def render(desk: Desktop, *, cursor: bool = True, live_at: float | None = None) -> Image.Image:
    """Draw the whole screen; with `live_at` (seconds since the epoch) its live regions as they
    are at that moment (module docstring)."""
    img = _background(desk.width, desk.height).copy()
    caret_on = live_at is None or int(live_at / CARET_BLINK_SECONDS) % 2 == 0
    p = _Painter(img, caret_on=caret_on)
    for icon in desk.build_desktop_icons().children[0].children:
        x0, y0, x1, y1 = icon.rect
        p.d.rectangle((x0 + 24, y0 + 6, x1 - 24, y0 + 44), fill=(230, 190, 80) if "." not in icon.name else (240, 240, 240))
        p.text((x0 + 2, y0 + 52), _clip(icon.name, x1 - x0), fill=(255, 255, 255))
    for win in desk.visible_windows():
        p.control(win.build(desk))
    bar = desk.build_taskbar()
    p.d.rectangle(bar.rect, fill=(30, 30, 30))
    for b in bar.children:
        x0, y0, x1, y1 = b.rect
        p.d.rectangle((x0, y0, x1 - 1, y1 - 1), fill=(70, 70, 70) if b.selected else (45, 45, 45))
        p.text((x0 + 8, (y0 + y1) // 2 - 5), _clip(b.name, x1 - x0), fill=(255, 255, 255))
    if live_at is not None:
        _live_taskbar(img, bar.rect, live_at)
    # Watermark: this is not a real Windows screen.
    wm = f" {SIMULATION_LABEL} "
    wx = desk.width - CHAR_W * len(wm) - 12
    p.d.rectangle((wx - 4, 4, desk.width - 8, 20), fill=(255, 255, 255), outline=(200, 0, 0))
    p.text((wx, 7), wm, fill=(200, 0, 0))
    if cursor:
        mx, my = desk.mouse
        p.d.polygon([(mx, my), (mx, my + 16), (mx + 4, my + 12), (mx + 8, my + 19), (mx + 10, my + 18),
                     (mx + 7, my + 11), (mx + 12, my + 11)], fill=(255, 255, 255), outline=(0, 0, 0))
    return img


def _live_taskbar(img: Image.Image, bar: tuple[int, int, int, int], live_at: float) -> None:
    """The progress ring (an arc that turns) and the clock with seconds, in the taskbar."""
    x0, y0, x1, y1 = bar
    clock = Image.new("RGB", (CHAR_W * CLOCK_CHARS, 12), (30, 30, 30))
    _Painter(clock).text((0, 0), time.strftime("%H:%M:%S", time.localtime(live_at)), fill=(255, 255, 255))
    clock = clock.resize((clock.width * 2, clock.height * 2), Image.NEAREST)
    clock_x = x1 - 16 - clock.width
    mid = (y0 + y1) // 2
    img.paste(clock, (clock_x, mid - clock.height // 2))
    ring_x = clock_x - 16 - RING_SIZE
    box = (ring_x, mid - RING_SIZE // 2, ring_x + RING_SIZE - 1, mid + RING_SIZE // 2 - 1)
    start = (live_at % RING_TURN_SECONDS) / RING_TURN_SECONDS * 360
    ImageDraw.Draw(img).arc(box, start, start + 100, fill=(120, 190, 255), width=5)


def png_bytes(img: Image.Image, text: dict[str, str] | None = None) -> bytes:
    """Encode as PNG (fast compression: screenshots are taken every step); `text` goes into
    tEXt chunks, which no pixel comparison sees (the simulation labels its frames there)."""
    from PIL import PngImagePlugin

    info = None
    if text:
        info = PngImagePlugin.PngInfo()
        for key, value in text.items():
            info.add_text(key, value)
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1, pnginfo=info)
    return buf.getvalue()
