"""Where the kvm provider's VMs live while a run goes, and how their leftovers are found.

Each provider instance that starts VMs gets a private run directory (mode 0700) under one base
directory per user; it holds every VM's copy-on-write overlay, monitor socket and logs, and an
`owner.json` naming the process that owns it. Each running QEMU is recorded in `<vm>.json` with
its pid and start time.

A run ends by deleting its directory. When the owner dies without that (SIGKILL, a crash), the
directory stays and names a dead owner: `arena run`'s watcher (flows/reaper.py) removes it at
once, and `arena janitor --provider kvm` finds it later. A process is only ever signalled when
its pid, its start time and its command line (which names the run directory) all match what was
recorded, so a recycled pid is never touched.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from adapters.vms.base import TAG_EXPIRES_AT, TAG_MANAGED, TAG_OWNER, TAG_RUN_ID
from adapters.whole_files import replace_text

OWNER_FILE = "owner.json"
UNIX_SOCKET_MAX = 107  # sun_path is 108 bytes with its terminating NUL
_NEVER = "9999-12-31T00:00:00Z"
_OUR_PROGRAMS = ("qemu-system", "swtpm")  # the only programs a run directory's VMs start  # a live run's resources never expire while it runs


def default_base_dir() -> Path:
    """The per-user base directory of run directories (in the system's temp directory)."""
    return Path(tempfile.gettempdir()) / f"waa-arena-kvm-{os.getuid()}"


def _index_dir() -> Path:
    """Where every run directory is listed, wherever its `runtime_dir` put it: the watcher of
    `arena run` finds its owner's directories from here."""
    return default_base_dir() / "index"


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _process_start(pid: int) -> float | None:
    """The start time of a live process `pid`; None when it is gone (a zombie has ended too)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.Error:
        return None


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, object]) -> None:
    replace_text(path, json.dumps(data, indent=2))


@dataclass(frozen=True)
class ProcessRecord:
    """A process a run started: enough to recognise it later and never another."""

    pid: int
    start_time: float
    marker: str  # a string its command line contains (the run directory)

    def matching(self) -> psutil.Process | None:
        """The live process this record describes, or None when it is gone or the pid was reused."""
        try:
            process = psutil.Process(self.pid)
            if abs(process.create_time() - self.start_time) > 0.05:
                return None
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            if self.marker not in " ".join(process.cmdline()):
                return None
            return process
        except psutil.Error:
            return None


def end_process(record: ProcessRecord, grace_seconds: float = 3.0) -> bool:
    """SIGTERM, then SIGKILL, the process `record` describes; True when one was signalled."""
    process = record.matching()
    if process is None:
        return False
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(grace_seconds)
    except psutil.TimeoutExpired:
        try:
            process.kill()
            process.wait(grace_seconds)
        except psutil.Error:
            pass
    except psutil.Error:
        pass
    return True


class RunDirectory:
    """One provider instance's private directory of VMs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, base: Path, run_id: str) -> RunDirectory:
        """A new directory for `run_id`, owned by this process."""
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)[:40] or "run"
        path = Path(tempfile.mkdtemp(prefix=f"{safe}.{os.getpid()}.", dir=base)).resolve()
        directory = cls(path)
        probe = directory.path / ("w" * 32 + ".qmp")  # room for the pool's longest VM names
        if len(str(probe)) > UNIX_SOCKET_MAX:
            shutil.rmtree(path, ignore_errors=True)
            raise ValueError(f"[kvm] runtime_dir {base} is too long for Unix socket paths; choose a shorter one")
        _write_json(path / OWNER_FILE, {
            "pid": os.getpid(), "start_time": _process_start(os.getpid()), "run_id": run_id,
            "owner": _user(), "created_at": _now_iso(),
        })
        index = _index_dir()
        index.mkdir(mode=0o700, parents=True, exist_ok=True)
        (index / f"{os.getpid()}.{path.name}").write_text(str(path.resolve()))
        return directory

    def owner(self) -> dict[str, object]:
        return _read_json(self.path / OWNER_FILE) or {}

    def owner_alive(self) -> bool:
        owner = self.owner()
        pid, start = owner.get("pid"), owner.get("start_time")
        if not isinstance(pid, int):
            return False
        actual = _process_start(pid)
        return actual is not None and isinstance(start, (int, float)) and abs(actual - start) <= 0.05

    def record_process(self, vm_id: str, pid: int, extra: dict[str, object] | None = None) -> None:
        """Note QEMU's pid and start time (and what else identifies the VM) in `<vm_id>.json`."""
        _write_json(self.path / f"{vm_id}.json", {
            "vm_id": vm_id, "pid": pid, "start_time": _process_start(pid), "started_at": _now_iso(), **(extra or {}),
        })

    def forget_process(self, vm_id: str) -> None:
        (self.path / f"{vm_id}.json").unlink(missing_ok=True)

    def processes(self) -> dict[str, ProcessRecord]:
        """vm_id -> record of every QEMU this directory lists (alive or not)."""
        records = {}
        for path in sorted(self.path.glob("*.json")):
            if path.name == OWNER_FILE:
                continue
            data = _read_json(path)
            if not data or not isinstance(data.get("pid"), int) or not isinstance(data.get("start_time"), (int, float)):
                continue
            records[str(data.get("vm_id", path.stem))] = ProcessRecord(
                int(data["pid"]), float(data["start_time"]), str(self.path))  # type: ignore[arg-type]
        return records

    def remove(self) -> list[str]:
        """End every process of this directory still running, then delete it; the VMs ended.

        Besides the recorded ones, any process whose command line names this directory is
        ended: a QEMU started in the moment before its owner was killed, not yet recorded.
        """
        ended = [vm_id for vm_id, record in self.processes().items() if end_process(record)]
        for process in _processes_naming(self.path):
            record = ProcessRecord(process.pid, process.create_time(), str(self.path))
            if end_process(record):
                ended.append(f"pid {process.pid}")
        shutil.rmtree(self.path, ignore_errors=True)
        for entry in _index_dir().glob(f"*.{self.path.name}"):
            if _read_index(entry) == self.path.resolve():
                entry.unlink(missing_ok=True)
        return ended

    def tags(self) -> dict[str, str]:
        """This product's ownership tags; a directory whose owner is gone has expired."""
        owner = self.owner()
        return {
            TAG_MANAGED: "true",
            TAG_RUN_ID: str(owner.get("run_id", "")),
            TAG_OWNER: str(owner.get("owner", "")),
            TAG_EXPIRES_AT: _NEVER if self.owner_alive() else str(owner.get("created_at", "1970-01-01T00:00:00Z")),
        }


def _processes_naming(path: Path) -> list[psutil.Process]:
    """Live QEMU (and swtpm) processes whose command line names a file under `path`; a shell
    or an editor looking at those files is never among them."""
    marker = str(path) + os.sep
    found = []
    for process in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if not (process.info["name"] or "").startswith(_OUR_PROGRAMS):
                continue
            if process.pid == os.getpid() or process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in arg for arg in process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            pass
    return found


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # pragma: no cover - a uid without a name
        return str(os.getuid())


def _read_index(entry: Path) -> Path | None:
    try:
        return Path(entry.read_text().strip())
    except OSError:
        return None


def run_directories(base: Path | None = None, *, indexed: bool = False) -> list[RunDirectory]:
    """Every run directory under `base` (default: this user's), oldest first; with `indexed`,
    also those the index lists elsewhere (other `runtime_dir`s)."""
    base = base or default_base_dir()
    paths = {p.resolve() for p in base.iterdir() if p.is_dir()} if base.is_dir() else set()
    index = _index_dir()
    for entry in index.iterdir() if index.is_dir() and indexed else []:
        listed = _read_index(entry)
        if listed is None or not (listed / OWNER_FILE).exists():
            entry.unlink(missing_ok=True)  # its directory is gone
            continue
        paths.add(listed)
    found = [RunDirectory(p) for p in paths if (p / OWNER_FILE).exists()]
    return sorted(found, key=lambda d: d.path.stat().st_mtime)


def remove_leftovers_of(owner_pid: int, base: Path | None = None, *, wait_seconds: float = 0.0) -> list[Path]:
    """Remove the run directories (and their QEMU processes) of `owner_pid`, once it has ended.

    Called by `arena run`'s watcher after `arena run` died; `wait_seconds` lets the watcher give
    the owner's own teardown a moment when it is still exiting normally.
    """
    end = time.monotonic() + wait_seconds
    removed = []
    for directory in run_directories(base, indexed=True):
        if directory.owner().get("pid") != owner_pid:
            continue
        while directory.owner_alive() and time.monotonic() < end:
            time.sleep(0.1)
        if directory.owner_alive():
            continue
        directory.remove()
        removed.append(directory.path)
    return removed
