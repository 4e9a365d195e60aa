"""Stage: reset a VM to a clean state before a task."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.benchmark import BenchmarkTask
from adapters.vms.base import ResetLevel, VMHandle, VMProvider
from adapters.waa.client import WAAClient
from adapters.waa.live import clean_desktop


@task(name="reset", task_run_name="reset [{task.task_id}]", cache_policy=NO_CACHE, persist_result=False)
def reset_vm(provider: VMProvider, vm: VMHandle, level: ResetLevel, task: BenchmarkTask) -> None:
    """Provider-level reset at `level` (which may move the server), then WAA's own clean-up."""
    provider.reset(vm, level)
    client = WAAClient(vm.base_url)
    try:
        clean_desktop(client)
    finally:
        client.close()
