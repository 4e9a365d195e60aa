"""VMs that already run a WAA server and that this product neither creates nor deletes.

For pointing the pipeline at machines someone else manages (a WAA container started by hand, a
lab VM). Only the `setup` reset level is possible: nothing here can restore a snapshot.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from adapters.vms.base import ProviderError, ResetLevel, VMHandle, VMProvider
from adapters.waa.client import WAAClient


class ExistingServersProvider(VMProvider):
    """Hands out a fixed list of WAA server URLs, one per pool slot."""

    name = "existing"

    def __init__(self, urls: list[str], *, devtools_port: int = 9222, ready_timeout: float = 300.0) -> None:
        if not urls:
            raise ValueError("at least one WAA server URL is needed")
        bad = [u for u in urls if urlsplit(u).scheme not in ("http", "https") or not urlsplit(u).hostname]
        if bad:
            raise ValueError(f"not an http(s) URL of a WAA server: {', '.join(bad)}")
        self.urls = [u.rstrip("/") for u in urls]
        self.devtools_port = devtools_port
        self.ready_timeout = ready_timeout
        self._next = 0

    def create(self, vm_id: str) -> VMHandle:
        if self._next >= len(self.urls):
            raise ProviderError(f"no WAA server left for {vm_id}: only {len(self.urls)} URL(s) were given")
        url = self.urls[self._next]
        self._next += 1
        WAAClient(url).wait_until_ready(self.ready_timeout)
        parts = urlsplit(url)
        devtools = urlunsplit(("http", f"{parts.hostname}:{self.devtools_port}", "", "", ""))
        return VMHandle(vm_id=vm_id, base_url=url, provider=self.name, devtools_url=devtools)

    def reset(self, vm: VMHandle, level: ResetLevel) -> None:
        if level is not ResetLevel.SETUP:
            raise ProviderError(
                f"reset level {level.value!r} is not available for existing servers ({vm.base_url}): "
                "use --reset-level setup"
            )

    def delete(self, vm: VMHandle) -> None:
        """Existing servers are not ours to delete."""
