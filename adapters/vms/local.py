"""The local provider: each "VM" is a local WAA simulation process on 127.0.0.1.

It gives a new user the whole pipeline with no cloud account. The simulation's snapshot routes
stand in for QEMU's loadvm, and a reboot replaces the process with a fresh one.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import requests

from adapters.process_dirs import process_dir
from adapters.vms.base import ProviderError, ResetLevel, VMHandle, VMProvider, how_it_ended
from adapters.waa.client import WAAClient
from adapters.waa.localenv.launcher import LocalEnvHandle, start_local_env
from adapters.waa.settle import SettlePolicy


class LocalSimulationProvider(VMProvider):
    """Starts one WAA simulation process per VM, each with its own simulated disk."""

    name = "local"
    settle = SettlePolicy.fixed(0.0)  # the simulation applies actions synchronously

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        width: int = 1280,
        height: int = 800,
        quirks: bool = False,
        quirk_settings: dict[str, Any] | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self._own_work_dir = work_dir is None
        self.work_dir = work_dir or process_dir("sim")
        self.width = width
        self.height = height
        # Quirks mode reproduces a real server's slow readiness, slow accessibility tree,
        # server-side fail-safe and slow app start-up (see adapters/waa/localenv/quirks.py).
        self.quirks = quirks
        self.quirk_settings = quirk_settings
        # Quirks model a desktop that takes its time (slow app start-up): the task's waits matter there.
        self.acts_synchronously = not quirks
        self.ready_timeout = ready_timeout
        self._processes: dict[str, LocalEnvHandle] = {}
        self._lock = threading.Lock()

    @property
    def environment(self) -> str:
        return "local-simulation"  # labelled as a simulation wherever a user sees it

    @property
    def image_id(self) -> str | None:
        # The simulated desktop is this code's; the code revision pins it.
        return "local-simulation"

    def supported_reset_levels(self) -> set[ResetLevel]:
        return {ResetLevel.SETUP, ResetLevel.SNAPSHOT, ResetLevel.REBOOT}

    def create(self, vm_id: str) -> VMHandle:
        with self._lock:
            existing = self._processes.get(vm_id)
        if existing is not None and existing.alive():
            return self._handle(vm_id, existing)
        root = self.work_dir / vm_id
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        process: LocalEnvHandle | None = None
        try:
            process = start_local_env(
                root,
                width=self.width,
                height=self.height,
                log_path=root.with_suffix(".log"),
                quirks=self.quirks,
                quirk_settings=self.quirk_settings,
                wait_ready=False,
            )
            # The same readiness wait a real VM gets: poll /probe until a deadline.
            WAAClient(process.base_url).wait_until_ready(self.ready_timeout, poll_seconds=0.1)
        except Exception as exc:
            if process is not None:
                process.stop()  # up but never ready: not left running until the run ends
            raise ProviderError(f"local VM {vm_id}: simulation did not start: {exc}") from exc
        with self._lock:
            self._processes[vm_id] = process
        # A new simulation on an empty disk: the state every reset restores.
        return self._handle(vm_id, process, fresh=True)

    def _handle(self, vm_id: str, process: LocalEnvHandle, fresh: bool = False) -> VMHandle:
        # The simulation has no browser; its DevTools routes refuse with a clear message.
        return VMHandle(
            vm_id=vm_id,
            base_url=process.base_url,
            provider=self.name,
            devtools_url=process.base_url,
            details={"pid": process.pid},
            fresh=fresh,
        )

    def vm_down(self, vm: VMHandle) -> str | None:
        """The simulation's process and how it ended, when it has."""
        with self._lock:
            process = self._processes.get(vm.vm_id)
        if process is None or process.alive():
            return None
        return f"the simulation of local VM {vm.vm_id} (pid {process.pid}) {how_it_ended(process.returncode())}"

    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        if level is ResetLevel.SETUP:
            return  # the adapter closes windows and clears task files itself
        if level is ResetLevel.SNAPSHOT:
            try:
                response = requests.post(vm.base_url + "/sim/snapshot/load", json={"name": "initial"}, timeout=30)
            except requests.RequestException as exc:
                raise ProviderError(f"local VM {vm.vm_id}: snapshot load failed: {exc}") from exc
            if response.status_code != 200:
                raise ProviderError(f"local VM {vm.vm_id}: snapshot load answered HTTP {response.status_code}")
            return
        if level is ResetLevel.REBOOT:
            self.delete(vm)
            fresh = self.create(vm.vm_id)
            vm.base_url, vm.devtools_url, vm.details = fresh.base_url, fresh.devtools_url, fresh.details
            return
        raise ProviderError(f"reset level {level.value!r} is not available for the local provider")

    def delete(self, vm: VMHandle) -> None:
        with self._lock:
            process = self._processes.pop(vm.vm_id, None)
        if process is not None:
            process.stop()

    def close(self) -> None:
        """Stop every process and remove the simulated disks this provider created."""
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
        for process in processes:
            process.stop()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
