"""Per-step harness time and settle correctness against a server whose screen changes late.

A real Windows desktop does not draw an action's effect at once: a menu opens in 100 ms, an
application window in seconds. This benchmark starts a small HTTP server (its own process)
that answers WAA's routes like a VM whose screen changes after every action only after a random
delay of 0.1-2 s (seeded), through 2-8 transition frames 0.05-0.3 s apart (a slow repaint), and
after a third of the actions a busy spinner that turns for 0.5-1.5 s more before the final frame.
Every screenshot carries the action number and frame in one corner pixel, so the benchmark knows
whether an observation was taken mid-transition, mid-spinner or before the change began. Each
screenshot costs `--screenshot-seconds` (default 0.25 s: WAA grabs and PNG-encodes the whole
screen on the VM; a cache would make it free), the tree route 0.4 s (real ones take seconds),
and /obs_winagent renders the foreground window, as WAA's.

For each harness configuration it plays the same actions through the product's WAALiveAdapter
(apply, settle, observe: what an episode spends per step outside the model) and prints the
median and mean per-step time, the median settle time, and the share of observations taken
mid-transition:

- before: a fixed 3 s pause, then /screenshot, /accessibility and /obs_winagent one after the
  other (the harness before adaptive settling; WAA's own runner also sleeps 3 s);
- fixed 0.5 s (openadapt-evals' default pause) and fixed 3 s with this harness's reads;
- adaptive (the default on real VMs) for an agent that reads everything, and for a
  screenshot-only agent (Claude computer use: no tree, no window route).

Second part, slow repaint (`--part repaint`): the local WAA environment in its slow-repaint mode
(quirk `repaint_delay`: screen and accessibility tree show an action's effect only N seconds after
it, as an application on a loaded VM without a GPU) and typing steps into Notepad, at repaint
delays of 0, 0.8, 2 and 3 s, for the adaptive settle and WAA's fixed 3 s pause side by side: how
many observations after a typing step did not show the typed text yet (stale: the tree's editor
value, or a screenshot that differs from the screen once repainted) and the median step time.

Third part, live regions (`--part live`): the same environment with its live regions on (quirk
`live_regions`: the caret blinks every 530 ms, a progress ring turns, the taskbar clock shows
seconds, as on a real desktop that never stands still) beside late repaints of 0-3 s, for typing
steps and clicks (Notepad's File menu, opened and closed in turn); and the same steps with the live
regions off (nothing moves but the action's effect). Stale = the observation's screenshot does not
show every action sent so far (the simulation labels each frame with the actions it shows, in a PNG
text chunk no pixel comparison sees). For the adaptive settle only (fixed 3 s is never stale up to
3 s and always takes 3 s).

It prints numbers; it asserts nothing.

    python bench/step_latency.py [--steps 10] [--seed 1] [--part all|transitions|repaint|live] [--typing-steps 6]
                                 [--repaint-delays 0,0.8,2,3] [--live-delays 0,1.5,2,3]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import multiprocessing
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set

import requests  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkTask, ObservationNeeds  # noqa: E402
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir  # noqa: E402
from adapters.waa.client import WAAClient  # noqa: E402
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter  # noqa: E402
from adapters.waa.settle import SettlePolicy  # noqa: E402

WIDTH, HEIGHT = 1280, 800
FRAMES = (2, 8)  # transition frames before the final one, per action
FRAME_GAP = (0.05, 0.3)  # seconds between them, per action
SPINNER_SHARE = 1 / 3  # actions followed by a busy spinner
SPINNER_SECONDS = (0.5, 1.5)
SPINNER_FIRST = 100  # spinner frames are numbered from here in the marker pixel
FINAL = 255
SCREENSHOT_SECONDS = 0.25
TREE_SECONDS = 0.4
TREE = ('<Desktop name="Desktop"><Window name="Timing" screencoord="(200, 120)" size="(880, 560)">'
        '<Button name="OK" screencoord="(600, 600)" size="(80, 30)"/></Window></Desktop>')


class Screen:
    """The server's screen: which action's effect shows, and how far its transition has got."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.action = 0
        self.changes_at = 0.0
        self.frames, self.gap, self.spinner = FRAMES[0], FRAME_GAP[0], 0.0
        self.cache: dict[tuple[int, int], bytes] = {}

    def act(self) -> None:
        with self.lock:
            self.action += 1
            self.changes_at = time.monotonic() + self.rng.uniform(0.1, 2.0)
            self.frames, self.gap = self.rng.randint(*FRAMES), self.rng.uniform(*FRAME_GAP)
            self.spinner = self.rng.uniform(*SPINNER_SECONDS) if self.rng.random() < SPINNER_SHARE else 0.0

    def frame(self) -> tuple[int, int]:
        """(action, frame) now: the previous action's final frame until the change begins, then
        the transition frames, the spinner's turns (if any), the final frame."""
        with self.lock:
            action, elapsed = self.action, time.monotonic() - self.changes_at
            frames, gap, spinner = self.frames, self.gap, self.spinner
        if action == 0:
            return 0, FINAL
        if elapsed < 0:
            return action - 1, FINAL
        step = int(elapsed / gap)
        if step < frames:
            return action, step + 1
        spinning = elapsed - frames * gap
        if spinning < spinner:
            return action, SPINNER_FIRST + int(spinning / 0.1) % 8  # a new frame every 0.1 s
        return action, FINAL

    def png(self, window_only: bool = False) -> bytes:
        action, frame = self.frame()
        key = (action, frame if not window_only else -frame)
        if key not in self.cache:
            self.cache[key] = _render(action, frame, window_only)
        return self.cache[key]


def _render(action: int, frame: int, window_only: bool) -> bytes:
    image = Image.new("RGB", (WIDTH, HEIGHT), (20, 50, 100))
    draw = ImageDraw.Draw(image)
    # The window moves and changes colour with each action; transition frames are in between.
    spinning = SPINNER_FIRST <= frame < FINAL
    shift = (action * 37) % 300 + (0 if frame == FINAL or spinning else frame * 20)
    shade = 90 + (action * 53) % 120 if frame == FINAL or spinning else (30 * frame) % 256
    draw.rectangle((200 + shift, 120, 780 + shift, 680), fill=(shade, 200, 255 - shade))
    for row in range(140, 660, 24):  # text lines, so PNGs have realistic content
        draw.line((220 + shift, row, 700 + shift, row), fill=(0, 0, 0), width=2)
    if spinning:  # a small busy wheel whose gap turns: only a few pixels change per frame
        turn = (frame - SPINNER_FIRST) * 45
        draw.pieslice((480 + shift, 380, 520 + shift, 420), turn + 40, turn + 360, fill=(60, 60, 60))
    image.putpixel((0, 0), (action % 256, frame, 0))
    if window_only:
        image = image.crop((200, 120, 1080, 680))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _serve(port: int, seed: int, ready: multiprocessing.synchronize.Event,  # type: ignore[name-defined]
           screenshot_seconds: float = SCREENSHOT_SECONDS) -> None:
    screen = Screen(seed)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: bytes, kind: str = "application/json") -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?")[0]
            if path == "/screenshot":
                png = screen.png()  # what the screen shows when the grab begins
                time.sleep(screenshot_seconds)
                self._send(png, "image/png")
            elif path == "/accessibility":
                time.sleep(TREE_SECONDS)
                self._send(json.dumps({"AT": TREE}).encode())
            elif path == "/obs_winagent":
                image = base64.b64encode(screen.png(window_only=True)).decode()
                self._send(json.dumps({"image": image, "window_title": "Timing", "rect": [200, 120, 1080, 680],
                                       "window_names_str": "Timing", "status": "success"}).encode())
            elif path == "/actions":
                self._send(json.dumps(screen.action).encode())
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            path = self.path.split("?")[0]
            if path in ("/execute", "/setup/execute"):
                screen.act()
                self._send(json.dumps({"status": "success", "output": "", "error": "", "returncode": 0}).encode())
            elif path == "/reseed":  # every configuration meets the same delays
                with screen.lock:
                    screen.rng = random.Random(seed)
                self._send(b"{}")
            elif path == "/screen_size":
                self._send(json.dumps({"width": WIDTH, "height": HEIGHT}).encode())
            else:
                self._send(json.dumps({"status": "success"}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.set()
    server.serve_forever()


@dataclass
class Row:
    name: str
    step_seconds: list[float]
    settle_seconds: list[float]
    mid_transition: int

    def line(self) -> str:
        steps = self.step_seconds
        return (f"{self.name:<44} {statistics.median(steps):7.2f} s {statistics.mean(steps):7.2f} s "
                f"{statistics.median(self.settle_seconds):8.2f} s {self.mid_transition:>4}/{len(steps)}")


def _frame_of(png: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(png)) as image:
        red, green, _ = image.convert("RGB").getpixel((0, 0))
    return red, green


def play(name: str, base_url: str, settings: LiveAdapterSettings, needs: ObservationNeeds, steps: int) -> Row:
    """Play `steps` clicks through the adapter; time apply+settle+observe, check each frame."""
    with tempfile.TemporaryDirectory() as cache:
        adapter = WAALiveAdapter(WAAClient(base_url), WAATaskCatalog(bundled_suite_dir()), Path(cache), settings)
        adapter.needs = needs
        observation = adapter.observe()
        times, settles, mid = [], [], 0
        for i in range(steps):
            action = BenchmarkAction(type=ActionType.CLICK, x=300 + i, y=400)
            t0 = time.monotonic()
            adapter.apply(action)
            settled = adapter.settle()
            observation = adapter.observe()
            times.append(time.monotonic() - t0)
            settles.append(settled.seconds)
            seen_action, seen_frame = _frame_of(observation.screenshot or b"")
            wanted = requests.get(base_url + "/actions", timeout=5).json() % 256
            if seen_frame != FINAL or seen_action != wanted:
                mid += 1
        adapter.close()
    return Row(name, times, settles, mid)


REPAINT_DELAYS = (0.0, 0.8, 2.0, 3.0)
TYPED = ["Dear team, the quarterly ", "report is attached below; ", "please read it before ", "Friday's meeting at ten. ",
         "Numbers: 42, 17 and 3.5% ", "growth (see table 2). Thanks!"]


@dataclass
class RepaintRow:
    step_seconds: list[float]
    stale: int


def play_typing(base_url: str, policy: SettlePolicy, steps: int, delay: float) -> RepaintRow:
    """Type `steps` pieces of text into Notepad through the adapter; count stale observations."""
    task = BenchmarkTask(task_id="bench-notepad", instruction="type", domain="notepad",
                         raw_config={"config": [{"type": "launch", "parameters": {"command": "notepad"}}]})
    requests.post(base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    with tempfile.TemporaryDirectory() as cache:
        adapter = WAALiveAdapter(WAAClient(base_url), WAATaskCatalog(bundled_suite_dir()), Path(cache),
                                 LiveAdapterSettings(settle=policy))
        observation = adapter.reset(task)
        editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
        adapter.apply(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
        time.sleep(delay + 0.3)  # the click's repaint is not what is measured
        adapter.observe()
        typed, times, stale = "", [], 0
        for i in range(steps):
            text = TYPED[i % len(TYPED)]
            typed += text
            t0 = time.monotonic()
            adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=text))
            adapter.settle()
            observation = adapter.observe()
            times.append(time.monotonic() - t0)
            shown = observation.accessibility_tree.find(role="Edit", name="Text Editor").attributes.get("value")
            time.sleep(max(0.0, delay + 0.3 - (time.monotonic() - t0)))  # until the screen has surely caught up
            if shown != typed or observation.screenshot != requests.get(base_url + "/screenshot", timeout=10).content:
                stale += 1
        adapter.close()
    return RepaintRow(times, stale)


def repaint_part(steps: int, delays: tuple[float, ...] = REPAINT_DELAYS) -> None:
    from adapters.waa.localenv.launcher import start_local_env

    print(f"\nslow repaint (local WAA environment, quirk repaint_delay): {steps} typing steps into Notepad per cell")
    print(f"{'repaint delay':<14} {'adaptive: stale':>16} {'median step':>12}   {'fixed 3 s: stale':>16} {'median step':>12}")
    for delay in delays:
        with tempfile.TemporaryDirectory() as root:
            handle = start_local_env(Path(root), quirks=True, quirk_settings={
                "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "failsafe": False,
                "repaint_delay": delay})
            try:
                adaptive = play_typing(handle.base_url, SettlePolicy(), steps, delay)
                fixed = play_typing(handle.base_url, SettlePolicy.fixed(3), steps, delay)
            finally:
                handle.stop()
        print(f"{delay:>11.1f} s {adaptive.stale:>13}/{steps} {statistics.median(adaptive.step_seconds):>10.2f} s   "
              f"{fixed.stale:>13}/{steps} {statistics.median(fixed.step_seconds):>10.2f} s", flush=True)
    print("step = apply + settle + observe (tree and window read); stale = the observation did not show the typed "
          "text yet (target: 0 up to 3 s for adaptive)")


LIVE_DELAYS = (0.0, 1.5, 2.0, 3.0)


def _shown(png: bytes) -> tuple[int, int]:
    """(actions the frame shows, actions run) from the simulation's label on a screenshot; a
    frame without one (no slow repaint) shows every action: (0, 0)."""
    with Image.open(io.BytesIO(png)) as image:
        text = image.text  # type: ignore[attr-defined]
    return int(text.get("sim-actions-shown", 0)), int(text.get("sim-actions-run", 0))


def play_live(base_url: str, kind: str, steps: int, delay: float) -> RepaintRow:
    """`steps` typing steps or clicks on Notepad's File menu through the adapter (adaptive
    settle, an agent that reads the tree); counts observations whose screenshot is stale."""
    task = BenchmarkTask(task_id="bench-notepad", instruction="type", domain="notepad",
                         raw_config={"config": [{"type": "launch", "parameters": {"command": "notepad"}}]})
    requests.post(base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=10)
    with tempfile.TemporaryDirectory() as cache:
        adapter = WAALiveAdapter(WAAClient(base_url), WAATaskCatalog(bundled_suite_dir()), Path(cache),
                                 LiveAdapterSettings(settle=SettlePolicy()))
        observation = adapter.reset(task)
        editor = observation.accessibility_tree.find(role="Edit", name="Text Editor")
        adapter.apply(BenchmarkAction(type=ActionType.CLICK, target_node_id=editor.node_id))
        time.sleep(delay + 0.3)  # the first click's repaint is not what is measured
        observation = adapter.observe()
        times, stale = [], 0
        for i in range(steps):
            if kind == "type":
                action = BenchmarkAction(type=ActionType.TYPE, text=TYPED[i % len(TYPED)])
            else:
                menu = observation.accessibility_tree.find(role="MenuItem", name="File")
                action = BenchmarkAction(type=ActionType.CLICK, target_node_id=menu.node_id)
            t0 = time.monotonic()
            adapter.apply(action)
            adapter.settle()
            observation = adapter.observe()
            times.append(time.monotonic() - t0)
            shown, run = _shown(observation.screenshot or b"")
            stale += shown < run
            time.sleep(max(0.0, delay + 0.3 - (time.monotonic() - t0)))  # the next step starts on a caught-up screen
        adapter.close()
    return RepaintRow(times, stale)


def live_part(steps: int, delays: tuple[float, ...] = LIVE_DELAYS) -> None:
    from adapters.waa.localenv.launcher import start_local_env

    print(f"\nlive regions (local WAA environment, quirks live_regions + repaint_delay; adaptive settle): "
          f"{steps} steps per cell; stale / median step")
    header = "".join(f"{kind + (' live' if live else ' still'):>20}" for live in (True, False) for kind in ("type", "click"))
    print(f"{'repaint delay':<14}{header}")
    for delay in delays:
        cells = []
        for live in (True, False):
            with tempfile.TemporaryDirectory() as root:
                handle = start_local_env(Path(root), quirks=True, quirk_settings={
                    "ready_delay": 0, "accessibility_delay": 0, "launch_delay": 0, "failsafe": False,
                    "repaint_delay": delay, "live_regions": live})
                try:
                    for kind in ("type", "click"):
                        row = play_live(handle.base_url, kind, steps, delay)
                        cells.append(f"{row.stale:>7}/{steps} {statistics.median(row.step_seconds):>7.2f} s")
                finally:
                    handle.stop()
        print(f"{delay:>11.1f} s " + "".join(f"{c:>20}" for c in cells), flush=True)
    print("step = apply + settle + observe; stale = the observation's screenshot did not show every action sent "
          "(target: 0 everywhere up to 3 s, and no slower than before where nothing moves)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="actions per configuration (default 20)")
    parser.add_argument("--screenshot-seconds", type=float, default=SCREENSHOT_SECONDS,
                        help=f"what one /screenshot costs the server (default {SCREENSHOT_SECONDS:g})")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--part", choices=["all", "transitions", "repaint", "live"], default="all")
    parser.add_argument("--typing-steps", type=int, default=6, help="typing steps per repaint delay and settle")
    parser.add_argument("--repaint-delays", type=lambda v: tuple(float(x) for x in v.split(",")),
                        default=REPAINT_DELAYS, help="comma-separated repaint delays in seconds (default 0,0.8,2,3)")
    parser.add_argument("--live-delays", type=lambda v: tuple(float(x) for x in v.split(",")),
                        default=LIVE_DELAYS, help="repaint delays beside live regions (default 0,1.5,2,3)")
    args = parser.parse_args()
    print(conditions(), flush=True)
    if args.part in ("all", "transitions"):
        transitions_part(args)
    if args.part in ("all", "repaint"):
        repaint_part(args.typing_steps, args.repaint_delays)
    if args.part in ("all", "live"):
        live_part(args.typing_steps, args.live_delays)


def transitions_part(args: argparse.Namespace) -> None:
    """The first part: the timing server's late, multi-frame transitions after clicks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(port, args.seed, ready, args.screenshot_seconds), daemon=True)
    server.start()
    ready.wait(10)
    base_url = f"http://127.0.0.1:{port}"
    everything, screenshot_only = ObservationNeeds(), ObservationNeeds(accessibility_tree=False, window=False)
    configs = [
        ("before: fixed 3 s, reads in turn", LiveAdapterSettings(settle=SettlePolicy.fixed(3), concurrent_reads=False), everything),
        ("fixed 0.5 s (openadapt-evals default)", LiveAdapterSettings(settle=SettlePolicy.fixed(0.5)), everything),
        ("fixed 3 s (WAA's runner), reads at once", LiveAdapterSettings(settle=SettlePolicy.fixed(3)), everything),
        ("adaptive (default), tree + window agent", LiveAdapterSettings(), everything),
        ("adaptive (default), screenshot-only agent", LiveAdapterSettings(), screenshot_only),
    ]
    print(f"server: screen changes 0.1-2.0 s after each action, {FRAMES[0]}-{FRAMES[1]} transition frames "
          f"{FRAME_GAP[0]:g}-{FRAME_GAP[1]:g} s apart, a {SPINNER_SECONDS[0]:g}-{SPINNER_SECONDS[1]:g} s spinner after "
          f"{SPINNER_SHARE:.0%} of actions; screenshot {args.screenshot_seconds:g} s, tree route {TREE_SECONDS:g} s; "
          f"{args.steps} actions per row (seed {args.seed})")
    print(f"{'harness':<44} {'median':>9} {'mean':>9} {'settle':>10} {'mid-transition':>14}")
    try:
        for name, settings, needs in configs:
            requests.post(base_url + "/reseed", timeout=5)
            print(play(name, base_url, settings, needs, args.steps).line(), flush=True)
    finally:
        server.terminate()
    print("per step = apply + settle + observe (no model); mid-transition = observations not showing the "
          "last action's final frame, spinner included (target: 0 for adaptive)")


if __name__ == "__main__":
    main()
