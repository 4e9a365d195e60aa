"""Nothing `arena run` starts outlives it, even when it is killed with SIGKILL.

`arena run` may start local simulations and QEMU VMs. Its own clean-up covers
Ctrl-C and SIGTERM, but SIGKILL (the OOM killer, `kill -9`, a CI job's timeout) ends it with no
chance to clean up. So it starts this small watcher first:

    python -m flows.reaper        (its stdin is a pipe whose only writer is `arena run`)

The watcher notes the descendants of its parent every second; when the pipe reaches end of file,
the parent has ended, however it ended, and the watcher terminates the processes it last saw
(SIGTERM, then SIGKILL after a grace period), removes what the kvm provider's VMs left on disk
(their run directory: overlays, monitor sockets, logs; adapters/vms/kvm_runtime.py, which also
ends any QEMU started after the last look) and the temporary folders `arena run` told it of
through the same pipe (the local simulations' disks, the files fetched for evaluation: it is
the folder guard of adapters/process_dirs.py), then exits. psutil keeps each
process's start time, so a recycled pid is never signalled. (The local Prefect server is not among
them: it is detached, shared with other runs, and stops by itself once none uses it;
flows/local_server.py.)
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

import psutil

from adapters.process_dirs import ToldFolders, guard_with

SNAPSHOT_SECONDS = 1.0
GRACE_SECONDS = 5.0


def start_reaper() -> subprocess.Popen[bytes]:
    """Start the watcher for this process, also its folder guard; keep the returned handle alive
    as long as the process."""
    reaper = subprocess.Popen(
        [sys.executable, "-m", "flows.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C in the terminal reaches arena run, not the watcher
    )
    assert reaper.stdin is not None
    guard_with(reaper.stdin)
    return reaper


def watch(parent_pid: int) -> None:
    """Block until stdin closes, then end the descendants of `parent_pid` seen last and remove the
    folders told on stdin that are still there."""
    me = os.getpid()
    seen: list[psutil.Process] = []
    folders = ToldFolders()
    while True:
        try:
            parent = psutil.Process(parent_pid)
            seen = [p for p in parent.children(recursive=True) if p.pid != me]
        except psutil.Error:
            break  # the parent is gone already
        readable, _, _ = select.select([sys.stdin.buffer], [], [], SNAPSHOT_SECONDS)
        if readable:
            told = sys.stdin.buffer.read1(65536)
            if not told:
                break  # end of file: the parent ended
            folders.feed(told)
    # What the parent told just before it ended may still be in the pipe.
    while select.select([sys.stdin.buffer], [], [], 0.5)[0] and (told := sys.stdin.buffer.read1(65536)):
        folders.feed(told)
    alive = [p for p in seen if p.is_running()]
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, still_alive = psutil.wait_procs(alive, timeout=GRACE_SECONDS)
    for process in still_alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    # Imported only now: the watcher must be watching within moments of its start.
    from adapters.vms.kvm_runtime import remove_leftovers_of

    remove_leftovers_of(parent_pid)
    folders.remove()


if __name__ == "__main__":
    watch(int(sys.argv[1]))
