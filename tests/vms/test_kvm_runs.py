"""`arena run --provider kvm` end to end, as a user runs it: real QEMU VMs of the Debian guest
(tests/vms/test_kvm.py has the provider's own tests). A QEMU killed with `kill -9` in the middle
of an episode is an infrastructure error and a replacement VM finishes the task; after the run,
after Ctrl-C and after SIGKILL of `arena run`, no QEMU process, overlay or socket is left.

The runs share one Prefect home (its local server starts once for the module) and a short
runtime directory whose contents are checked after each run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from machine_pace import scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/vms has no __init__.py

from kvm_guest import arena_world, qemu_under, skip_reason  # noqa: E402
from prefect_home import SEEDED_SERVER_SETTINGS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Path]]:
    # TCG is allowed: these machines' KVM is PVM (on a host with a usable KVM, KVM is used).
    with arena_world("wkr-", 'allow_tcg = true\n') as world:
        yield world


def arena_run(world: dict[str, Path], run_id: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ARENA_"))}
    env.update(PREFECT_HOME=str(world["prefect"]), **SEEDED_SERVER_SETTINGS)
    env["ARENA_LOCAL_SERVER_IDLE_SECONDS"] = "60"  # one local Prefect server for the module's runs
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "--provider", "kvm", "--cloud-config", str(world["config"]),
         "--run-id", run_id, "--db", str(world["root"] / "arena.duckdb"), "--artifacts", str(world["root"] / "art"),
         *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def leftovers(runtime: Path) -> list[str]:
    """QEMU processes of the runs, and any file (overlay, socket, log) under the runtime dir."""
    return [f"qemu pid {p.pid}" for p in qemu_under(runtime)] + _files_under(runtime)


def _files_under(folder: Path) -> list[str]:
    """Every path under `folder`, read again when the clean-up being waited for removes a
    directory while it is being listed."""
    tries = 0
    while True:
        try:
            return [str(p) for p in folder.rglob("*")] if folder.exists() else []
        except FileNotFoundError:
            tries += 1
            if tries == 10:
                raise


def wait_for(predicate, seconds: float, what: str) -> None:
    seconds = scaled(seconds)  # written for a quiet machine (tests/machine_pace.py)
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.1)


def assert_nothing_left(runtime: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + scaled(seconds)
    while leftovers(runtime) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = leftovers(runtime)
    logs = {str(p): p.read_text(errors="replace")[-500:] for p in runtime.rglob("*.log")} if left else {}
    assert left == [], logs


def test_killed_qemu_mid_episode_is_retried_on_a_replacement_vm(world: dict[str, Path]) -> None:
    tasks = ["settings-storage-sense-monthly"]  # five steps: time to kill its VM in the middle
    proc = arena_run(world, "kvm-kill9", "--pool-size", "1", *[a for t in tasks for a in ("--task", t)])
    steps = world["root"] / "art" / "kvm-kill9" / tasks[0] / "attempt-1"
    try:
        # The first step's screenshot is written during the episode; the pool's only VM runs it.
        wait_for(lambda: steps.exists() and any(steps.glob("step_*.png")) or proc.poll() is not None, 300,
                 "the first episode's first step")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        victims = qemu_under(world["runtime"])
        assert len(victims) == 1
        victims[0].send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    with duckdb.connect(str(world["root"] / "arena.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT task_id, attempt, outcome, reason, vm_id FROM task_results WHERE run_id = 'kvm-kill9' "
                           "ORDER BY task_id, attempt").fetchall()
        (status,) = con.execute("SELECT status FROM runs WHERE run_id = 'kvm-kill9'").fetchone()
    assert status == "completed"
    killed = [r for r in rows if r[0] == tasks[0]]
    assert killed[0][2] == "infrastructure_error", rows
    assert "was killed by signal 9" in killed[0][3], killed[0][3]  # the cause, not only the symptom
    print(f"the killed attempt: {killed[0][3]}")
    assert killed[-1][2] == "success" and killed[-1][4] != killed[0][4]  # finished on the replacement VM
    assert [r[2] for r in rows] == ["infrastructure_error", "success"]  # one final result, after one retry
    assert "LOCAL SIMULATION" in out
    assert_nothing_left(world["runtime"], seconds=5)


@pytest.mark.parametrize("signum", ["SIGINT", "SIGKILL"])
def test_no_vm_outlives_ctrl_c_or_sigkill_of_arena_run(world: dict[str, Path], signum: str) -> None:
    run_id = f"kvm-{signum.lower()}"
    proc = arena_run(world, run_id, "--pool-size", "2", "--domain", "notepad")
    try:
        def two_vms() -> bool:
            return len(qemu_under(world["runtime"])) == 2 and len(list(world["runtime"].rglob("*.qmp"))) == 2

        wait_for(lambda: two_vms() or proc.poll() is not None, 300, "two VMs with their overlays and sockets")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert len(list(world["runtime"].rglob("waa-*.qcow2"))) == 2
        proc.send_signal(getattr(signal, signum))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if signum == "SIGINT":
        assert proc.returncode == 130, err[-3000:]
    else:
        assert proc.returncode == -9
    assert_nothing_left(world["runtime"])
