"""Check a WAA server layer by layer and say plainly which layer fails.

Layers, each needing the one before: the server answers /probe; it reports its platform and
screen; a screenshot decodes at that size; the accessibility tree parses; an action round trip
(/execute of pyautogui code) succeeds; the server's `computer` object works (/update_computer,
then a non-ASCII clipboard round trip through /execute_windows, which is how agents' text that
pyautogui cannot type reaches the VM); a trivial task is set up and scored 1 by the evaluator.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from adapters.waa.accessibility import parse_accessibility_xml, visible_elements
from adapters.waa.actions import to_execute_command
from adapters.waa.client import WAAClient
from adapters.waa.evaluator import evaluate_task
from adapters.waa.grounding import Marks

PROBE_FOLDER = "C:\\Users\\Docker\\Downloads"
PROBE_FILE = "arena-probe.txt"
# Accents, CJK and an emoji: text pyautogui drops, so it must travel through computer.clipboard.
PROBE_TEXT = "arena probe: façade, 東京, ✓ 🙂"


@dataclass(frozen=True)
class LayerResult:
    layer: str
    ok: bool
    seconds: float
    detail: str


def _trivial_task_spec() -> dict[str, object]:
    return {
        "func": "exact_match",
        "result": {"type": "vm_file_exists_in_vm_folder", "folder_name": PROBE_FOLDER, "file_name": PROBE_FILE},
        "expected": {"type": "rule", "rules": {"expected": 1.0}},
    }


def probe_server(client: WAAClient, *, ready_deadline: float = 0.0) -> list[LayerResult]:
    """Run the layers in order, stopping at the first failure; every layer's result is returned."""
    state: dict[str, object] = {}

    def reachable() -> str:
        if ready_deadline > 0:
            waited = client.wait_until_ready(ready_deadline)
            return f"answered /probe after {waited:.1f} s"
        if not client.probe():
            raise RuntimeError(f"GET {client.base_url}/probe did not answer 200")
        return "answered /probe"

    def platform() -> str:
        name = client.platform()
        width, height = client.screen_size()
        state["size"] = (width, height)
        return f"platform {name!r}, screen {width}x{height}"

    def screenshot() -> str:
        png = client.screenshot()
        image = Image.open(io.BytesIO(png))
        if image.size != state["size"]:
            raise RuntimeError(f"screenshot is {image.size[0]}x{image.size[1]}, screen is {state['size']}")
        return f"PNG {image.size[0]}x{image.size[1]}, {len(png)} bytes"

    def accessibility() -> str:
        tree = parse_accessibility_xml(client.accessibility())
        windows = [c.name for c in tree.children]
        return f"{len(visible_elements(tree))} visible elements in {len(windows)} top-level windows"

    def action() -> str:
        width, height = state["size"]  # type: ignore[misc]
        result = client.execute(to_execute_command(f"pyautogui.moveTo({width // 2}, {height // 2})"))
        if not result.ok:
            raise RuntimeError(f"pyautogui moveTo failed (returncode {result.returncode}): {result.error.strip()[-300:]}")
        return "pyautogui moveTo ran"

    def computer() -> str:
        width, height = state["size"]  # type: ignore[misc]
        client.update_computer(Marks(()).update_computer_payload(client.screenshot(), width, height))
        client.execute_windows(f"computer.clipboard.copy_text({PROBE_TEXT!r})")
        seen = client.obs_winagent().clipboard
        if seen != PROBE_TEXT:
            raise RuntimeError(f"clipboard round trip changed the text: sent {PROBE_TEXT!r}, the server holds {seen!r}")
        return "update_computer, then computer.clipboard.copy_text of non-ASCII text arrived verbatim"

    def evaluation() -> str:
        client.setup_upload(f"{PROBE_FOLDER}\\{PROBE_FILE}", b"written by arena probe\n")
        try:
            with tempfile.TemporaryDirectory() as cache:
                outcome = evaluate_task(_trivial_task_spec(), client, last_action="DONE", cache_dir=Path(cache))
        finally:
            client.setup_clear_task_files()
        if outcome.kind != "scored" or outcome.score != 1.0:
            raise RuntimeError(f"trivial task scored {outcome.score} ({outcome.kind}): {outcome.reason}")
        return "uploaded a file and scored a trivial task 1.0"

    layers: list[tuple[str, Callable[[], str]]] = [
        ("reachable", reachable),
        ("platform", platform),
        ("screenshot", screenshot),
        ("accessibility", accessibility),
        ("action", action),
        ("computer", computer),
        ("evaluation", evaluation),
    ]
    results: list[LayerResult] = []
    for name, check in layers:
        started = time.monotonic()
        try:
            detail = check()
            ok = True
        except Exception as exc:  # noqa: BLE001 - every failure is reported, named by its layer
            detail, ok = f"{type(exc).__name__}: {exc}", False
        results.append(LayerResult(name, ok, time.monotonic() - started, detail))
        if not ok:
            break
    return results


def format_probe(base_url: str, results: list[LayerResult]) -> str:
    """One line per layer, then a verdict naming the failing layer."""
    lines = [f"WAA server at {base_url}"]
    for r in results:
        lines.append(f"  {'OK    ' if r.ok else 'FAILED'} {r.layer:<14} {r.seconds * 1000:7.0f} ms  {r.detail}")
    failed = [r for r in results if not r.ok]
    lines.append(f"verdict: layer '{failed[0].layer}' fails" if failed else "verdict: all layers work")
    return "\n".join(lines)
