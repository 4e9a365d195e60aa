"""Is the VM in the state a task's setup should have left it in? (WAA-V2's initial-state check)

WAA-V2 looks at the first screenshot after setup and restarts the task (up to three times) when it
is the bare desktop, a white page, Chrome's network error page or a broken VS Code, comparing
against reference screenshots and asking GPT-4o. This product checks without a model or
reference images, from what the WAA server reports:

- the foreground window is the desktop ("Desktop", "Program Manager" or no title): the app the
  task's setup launched never came to the front;
- the screen is blank: at least 98 % of a 64x40 grey thumbnail within 8 levels of its median (a
  white or black page: the app did not draw).

Domains whose tasks start on the desktop or in system windows are not checked (V2's own list:
file_explorer, settings, microsoft_paint, notepad). A failed check is the environment's fault: the
attempt is a setup failure, never an agent failure.
"""

from __future__ import annotations

import io
import statistics

from PIL import Image

SKIPPED_DOMAINS = frozenset({"file_explorer", "settings", "microsoft_paint", "notepad"})
DESKTOP_TITLES = frozenset({"", "desktop", "program manager"})
BLANK_SHARE = 0.98
BLANK_LEVELS = 8


def initial_state_problem(domain: str, screenshot_png: bytes | None, window_title: str | None) -> str | None:
    """Why the screen after setup is not a task's starting state, or None when it may be."""
    if domain in SKIPPED_DOMAINS:
        return None
    if (window_title or "").strip().lower() in DESKTOP_TITLES:
        return f"after setup the desktop is in front ({window_title!r}): the {domain} app did not open"
    if screenshot_png and _blank(screenshot_png):
        return "after setup the screen is blank (one colour): the app did not draw its window"
    return None


def _blank(png: bytes) -> bool:
    with Image.open(io.BytesIO(png)) as image:
        pixels = list(image.convert("L").resize((64, 40)).tobytes())
    middle = statistics.median(pixels)
    return sum(abs(p - middle) <= BLANK_LEVELS for p in pixels) >= BLANK_SHARE * len(pixels)
