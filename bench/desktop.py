"""The real desktop guest (kvm preset `debian-desktop`) measured on this host, with real QEMU.

Prints (asserts nothing; TCG where KVM is not usable, the accelerator is printed):

- the base image: build time (from its manifest), size; the ready state: the template's cold
  boot to an answering server (the desktop up, LibreOffice started once) and its state file;
- a pool of --vms VMs started from the ready state; memory per VM (RSS) after start and after
  the resets;
- snapshot resets (--resets of them, each verified by the provider's check file);
- per-step harness latency on the real screen, Mousepad open: the action (pyautogui through
  /execute), the adaptive settle, the screenshot and the accessibility tree, against WAA's own
  step on the same screen (the action, a fixed 3 s pause, a screenshot and the tree);
- stale observations: after each typed word, whether the observation the agent gets (the
  settled screenshot's successor tree) already shows it in the editor's text;
- the hostile texts of bench/desktop_hostile.py typed through the whole pipeline (the live
  adapter: pyautogui for ASCII, the clipboard for the rest) into the real editor, saved, read
  back with /file: verbatim or not, and whether any of them ran (marker files in the guest).

    python bench/desktop.py [--vms 2] [--resets 10] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkTask  # noqa: E402
from adapters.vms import kvm_image  # noqa: E402
from adapters.vms.base import ResetLevel  # noqa: E402
from adapters.vms.kvm import KVMProvider, KVMSettings  # noqa: E402
from adapters.vms.kvm_desktop import DESKTOP  # noqa: E402
from adapters.waa.accessibility import parse_accessibility_xml  # noqa: E402
from adapters.waa.catalog import WAATaskCatalog  # noqa: E402
from adapters.waa.client import WAAClient  # noqa: E402
from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter  # noqa: E402
from adapters.waa.settle import SettlePolicy  # noqa: E402
from bench.desktop_hostile import MARKER_DIR, hostile_texts  # noqa: E402

SUITE = Path(__file__).resolve().parents[1] / "adapters/waa/desktop_suite"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def line(label: str, value: str) -> None:
    print(f"  {label:<46} {value}", flush=True)


def stats(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"min {min(values):.2f} / median {statistics.median(values):.2f} / max {max(values):.2f} s (n={len(values)})"


def mib(pid: int) -> str:
    return f"{psutil.Process(pid).memory_info().rss / 2**20:.0f} MiB"


def editor_text(tree) -> str:
    node = next((n for n in tree.iter() if n.role == "text" and n.attributes.get("editable") == "true"), None)
    return node.text if node is not None else ""


def wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.5)


def mousepad_task() -> BenchmarkTask:
    return BenchmarkTask(task_id="bench-mousepad", instruction="type", domain="mousepad",
                         raw_config={"config": [{"type": "launch", "parameters": {"command": "mousepad"}},
                                                {"type": "activate_window", "parameters": {"window_name": "Mousepad",
                                                                                           "strict": True}}]},
                         evaluation_spec={"func": "infeasible"})


def step_section(url: str, steps: int) -> None:
    client = WAAClient(url)
    with tempfile.TemporaryDirectory() as cache:
        adapter = WAALiveAdapter(client, WAATaskCatalog(SUITE), Path(cache), LiveAdapterSettings(settle=SettlePolicy()))
        adapter.reset(mousepad_task())
        actions, settles, shots, trees, waa_steps, ours, stale = [], [], [], [], [], [], 0
        for index in range(steps):
            word = WORDS[index % len(WORDS)] + " "
            start = time.monotonic()
            adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=word))
            acted = time.monotonic()
            settled = adapter.settle()
            settled_at = time.monotonic()
            t0 = time.monotonic()
            client.screenshot()
            shots.append(time.monotonic() - t0)
            t0 = time.monotonic()
            tree = parse_accessibility_xml(client.accessibility())
            trees.append(time.monotonic() - t0)
            actions.append(acted - start)
            settles.append(settled_at - acted)
            # The harness's step: action, settle (its last capture is the observation's
            # screenshot), then the tree; WAA's: action, 3 s, screenshot, tree.
            ours.append((acted - start) + (settled_at - acted) + trees[-1])
            waa_steps.append((acted - start) + 3.0 + shots[-1] + trees[-1])
            if not editor_text(tree).endswith(word.strip()):  # the tree's text comes stripped
                stale += 1
            del settled
        line("action (pyautogui.write via /execute)", stats(actions))
        line("settle (adaptive) after typing", stats(settles))
        line("screenshot (GET /screenshot)", stats(shots))
        line("accessibility tree (GET /accessibility)", stats(trees))
        line("harness step: action + settle + tree", stats(ours))
        line("WAA's step: action + 3 s + screenshot + tree", stats(waa_steps))
        line("stale observations after typing", f"{stale} of {steps} (tree text without the typed word)")
        adapter.close()


def hostile_run(url: str) -> None:
    client = WAAClient(url)
    with tempfile.TemporaryDirectory() as cache:
        adapter = WAALiveAdapter(client, WAATaskCatalog(SUITE), Path(cache), LiveAdapterSettings(settle=SettlePolicy()))
        hostile_section(adapter, client)
        adapter.close()


def hostile_section(adapter: WAALiveAdapter, client: WAAClient) -> None:
    texts = hostile_texts()
    ascii_part = "\n".join(t for t in texts if t.isascii())
    other_part = "\n".join(t for t in texts if not t.isascii())
    expected = ascii_part + "\n" + other_part
    adapter.reset(mousepad_task())
    start = time.monotonic()
    adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=ascii_part + "\n"))
    adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=other_part))
    typed = time.monotonic() - start
    target = "/home/user/Documents/hostile.txt"
    adapter.apply(BenchmarkAction(type=ActionType.KEY, key="s", modifiers=["ctrl"]))
    wait_for(lambda: "Save As" in client.obs_winagent().window_title, 60)
    adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=target))
    adapter.apply(BenchmarkAction(type=ActionType.KEY, key="enter"))
    wait_for(lambda: client.get_file(target) is not None, 60)
    saved = (client.get_file(target) or b"").decode("utf-8", "replace")
    ran = client.execute(["sh", "-c", f"ls -A {MARKER_DIR} 2>/dev/null | wc -l"]).output.strip()
    wrong = [t for t in texts if t not in saved]
    line("hostile texts typed into Mousepad", f"{len(texts)} classes in {typed:.1f} s "
         f"({sum(t.isascii() for t in texts)} by pyautogui, {sum(not t.isascii() for t in texts)} by the clipboard)")
    if saved != expected:
        Path("/tmp/bench-desktop-hostile-saved.txt").write_text(saved)
        Path("/tmp/bench-desktop-hostile-expected.txt").write_text(expected)
    line("  arrived verbatim (saved file == typed)", f"{'yes' if saved == expected else 'NO'}; "
         f"{len(texts) - len(wrong)} of {len(texts)} found in the file")
    for text in wrong[:5]:
        line("  missing or changed", repr(text)[:100])
    line("  markers written by injected code", f"{ran} (0 = nothing ran)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vms", type=int, default=2)
    parser.add_argument("--resets", type=int, default=10)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    image = kvm_image.base_image(kvm_image.cache_root(), DESKTOP)
    if not image.exists():
        print("the desktop guest is not built: python -m adapters.vms.kvm_image build --preset debian-desktop")
        return 1
    manifest = json.loads(image.manifest.read_text())
    print("desktop guest (debian-desktop)")
    line("base image build (recorded)", f"{manifest.get('build_seconds')} s, {len(manifest.get('packages', []))} "
         f"packages and wheels; golden {image.golden.stat().st_size / 2**20:.0f} MiB (qcow2)")
    runtime = Path(tempfile.mkdtemp(prefix="bench-desktop-", dir="/tmp"))
    provider = KVMProvider(KVMSettings(preset="debian-desktop", allow_tcg=True, runtime_dir=runtime), "bench-desktop",
                           pool_size=args.vms, log=lambda m: print("  " + m, flush=True))
    try:
        start = time.monotonic()
        provider.create("warm")  # the ready state (a cold boot only when the key is new)
        first = time.monotonic() - start
        info = provider.ready_state_info() or {}
        line("accelerator", provider.accelerator.name)
        line("first VM (ready state made if new, then a clone)", f"{first:.1f} s; template boot "
             f"{info.get('boot_seconds')} s + save {info.get('save_seconds')} s, state "
             f"{(info.get('state_bytes') or 0) / 2**20:.0f} MiB")
        provider.delete(provider._get(type("H", (), {"vm_id": "warm"})()).handle)  # noqa: SLF001
        handles = []
        start = time.monotonic()
        threads = [threading.Thread(target=lambda n=n: handles.append(provider.create(f"vm-{n}"))) for n in range(args.vms)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        line(f"pool of {args.vms} from the ready state", f"{time.monotonic() - start:.1f} s")
        for vm in handles:
            line(f"memory {vm.vm_id} after start", mib(vm.details["pid"]))
        vm = handles[0]
        times = []
        for _ in range(args.resets):
            t0 = time.monotonic()
            provider.reset(vm, ResetLevel.SNAPSHOT)
            times.append(time.monotonic() - t0)
        line("snapshot reset (verified)", stats(times))
        step_section(vm.base_url, args.steps)
        provider.reset(vm, ResetLevel.SNAPSHOT)  # the typing above left an unsaved document
        hostile_run(vm.base_url)
        for handle in handles:
            line(f"memory {handle.vm_id} at the end", mib(handle.details["pid"]))
    finally:
        provider.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
