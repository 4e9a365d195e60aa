"""The real desktop guest (kvm preset `debian-desktop`) end to end, with real QEMU (TCG here).

`arena run` of one real task on it with the scripted agent succeeds, scored by the evaluator on
the file Mousepad wrote, and the run is labelled as this desktop, not a simulation. On a VM of
the provider: the server is the real desktop's; hostile text typed through the live adapter
arrives verbatim in the editor's saved file and runs nothing; a snapshot reset takes the file away.

Skips (saying why) without QEMU or without the built desktop image (.ci/run builds it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vms has no __init__.py

from kvm_guest import arena_world, qemu_under  # noqa: E402
from prefect_home import SEEDED_SERVER_SETTINGS  # noqa: E402

from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkTask  # noqa: E402
from adapters.vms import kvm_image  # noqa: E402
from adapters.vms.base import ResetLevel  # noqa: E402
from adapters.vms.kvm_desktop import DESKTOP  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "adapters/waa/desktop_suite"


def _skip_reason() -> str | None:
    if shutil.which("qemu-system-x86_64") is None or shutil.which("qemu-img") is None:
        return "QEMU is not installed (apt-get install qemu-system-x86 qemu-utils)"
    if not kvm_image.base_image(kvm_image.cache_root(), DESKTOP).exists():
        return ("the desktop guest is not built (python -m adapters.vms.kvm_image build --preset debian-desktop, "
                "as .ci/run does)")
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Path]]:
    with arena_world("wdg-", 'preset = "debian-desktop"\nallow_tcg = true\n') as world:
        yield world


def test_one_real_task_end_to_end(world: dict[str, Path]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ARENA_"))}
    env.update(PREFECT_HOME=str(world["prefect"]), **SEEDED_SERVER_SETTINGS)
    db = world["root"] / "arena.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--provider", "kvm", "--cloud-config", str(world["config"]),
         "--suite", str(SUITE), "--task", "mousepad-type-and-save", "--agent", "scripted", "--pool-size", "1",
         "--run-id", "desktop-e2e", "--db", str(db), "--artifacts", str(world["root"] / "art"), "--no-live"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with duckdb.connect(str(db), read_only=True) as con:
        outcome, reason = con.execute("select outcome, reason from task_results where run_id = 'desktop-e2e'").fetchone()
        environment = con.execute("select environment from runs where run_id = 'desktop-e2e'").fetchone()[0]
    assert outcome == "success", reason
    assert "compare_text_file: 1" in reason
    assert "debian-desktop" in environment and "simulation" not in environment.lower()
    assert "windows" not in environment.lower()
    assert qemu_under(world["runtime"]) == []


def test_typed_text_stays_text_and_a_reset_takes_it_away(world: dict[str, Path]) -> None:
    from adapters.vms.kvm import KVMProvider, KVMSettings
    from adapters.waa.catalog import WAATaskCatalog
    from adapters.waa.client import WAAClient
    from adapters.waa.live import LiveAdapterSettings, WAALiveAdapter

    runtime = world["root"] / "vms-direct"
    provider = KVMProvider(KVMSettings(preset="debian-desktop", allow_tcg=True, runtime_dir=runtime), "desktop-test",
                           pool_size=1)
    try:
        vm = provider.create("vm-0")
        info = requests.get(vm.base_url + "/desktop/info", timeout=30).json()
        assert info["simulation"] is False and info["platform"] == "Linux"
        client = WAAClient(vm.base_url)
        adapter = WAALiveAdapter(client, WAATaskCatalog(SUITE), world["root"] / "cache", LiveAdapterSettings())
        task = BenchmarkTask(task_id="t", instruction="type", domain="mousepad", evaluation_spec={"func": "infeasible"},
                             raw_config={"config": [
                                 {"type": "launch", "parameters": {"command": "mousepad"}},
                                 {"type": "activate_window", "parameters": {"window_name": "Mousepad", "strict": True}}]})
        adapter.reset(task)
        # ASCII goes through pyautogui's keys (`<` arrived as `>` on Xvfb's 105-key keyboard:
        # display.py, use_us_keyboard), the rest through the clipboard.
        typed = "'); import os; os.makedirs('/tmp/ran') #\n$(mkdir /tmp/ran2) \"q\" \\ <b>x</b> {|}~", " Grüße 東京 😀"
        for piece in typed:
            adapter.apply(BenchmarkAction(type=ActionType.TYPE, text=piece))
        text = "".join(typed)
        adapter.apply(BenchmarkAction(type=ActionType.KEY, key="s", modifiers=["ctrl"]))
        time.sleep(3)
        adapter.apply(BenchmarkAction(type=ActionType.TYPE, text="/home/user/Documents/typed.txt"))
        adapter.apply(BenchmarkAction(type=ActionType.KEY, key="enter"))
        deadline = time.monotonic() + 60
        while client.get_file("/home/user/Documents/typed.txt") is None and time.monotonic() < deadline:
            time.sleep(1)
        assert client.get_file("/home/user/Documents/typed.txt") == text.encode()
        ran = client.execute(["sh", "-c", "ls -d /tmp/ran /tmp/ran2 2>/dev/null | wc -l"])
        assert ran.output.strip() == "0"
        provider.reset(vm, ResetLevel.SNAPSHOT)
        assert client.get_file("/home/user/Documents/typed.txt") is None
        adapter.close()
    finally:
        provider.close()
    assert qemu_under(runtime) == []
