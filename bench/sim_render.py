"""How long the local WAA environment takes to draw one screenshot, and to encode it as PNG.

Every /screenshot and /obs_winagent of the simulation renders the desktop with Pillow and then
encodes a PNG (adapters/waa/localenv/render.py). This renders a 1280x800 desktop with Notepad
open, `--frames` times, and prints min/median/max CPU milliseconds per frame for each part. It
prints numbers; it asserts nothing (target: a frame renders in under 30 ms).

    python bench/sim_render.py [--frames 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.conditions import conditions, spread  # noqa: E402 - after the path is set

TARGET_MS = 30.0


def _cpu_ms(work: Callable[[], object], frames: int) -> list[float]:
    """CPU milliseconds of each of `frames` calls of `work`."""
    samples = []
    for _ in range(frames):
        started = time.process_time()
        work()
        samples.append(1000 * (time.process_time() - started))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=50, help="frames drawn and encoded")
    args = parser.parse_args()
    print(conditions(), flush=True)

    from adapters.waa.localenv.apps.notepad import open_notepad
    from adapters.waa.localenv.desktop import Desktop
    from adapters.waa.localenv.filesystem import SimFileSystem
    from adapters.waa.localenv.render import png_bytes, render

    with tempfile.TemporaryDirectory() as folder:
        fs = SimFileSystem(Path(folder) / "root")
        fs.initialise()
        desk = Desktop(fs, 1280, 800)
        open_notepad(desk)
        frame = render(desk)  # the background and font caches, as a running simulation has them
        drawn = _cpu_ms(lambda: render(desk), args.frames)
        encoded = _cpu_ms(lambda: png_bytes(frame), args.frames)
    print(f"render 1280x800 (Notepad open): {spread(drawn, 'ms', 1)}")
    print(f"PNG encode ({len(png_bytes(frame)):,} bytes): {spread(encoded, 'ms', 1)}")
    verdict = "MET" if statistics.median(drawn) < TARGET_MS else "NOT MET"
    print(f"target: median render under {TARGET_MS:.0f} ms -> {verdict}")


if __name__ == "__main__":
    main()
