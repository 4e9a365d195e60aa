"""VMs that already run a WAA server and that this product neither creates nor deletes.

For pointing the pipeline at machines someone else manages (a WAA container started by hand, a
lab VM). Only the `setup` reset level is possible: nothing here can restore a snapshot.

Servers that are the local simulation with its quirks off (GET /sim/info says so; a real WAA
server has no such route) act on each action before they answer, as the local provider's do: a run
on them waits neither for the screen to settle nor out the tasks' `sleep` setup steps. Anything
else, a real server or the simulation imitating one (quirks on), keeps WAA's waits.

Such servers cannot be replaced, only waited for: a server that failed an attempt is probed
again for up to `server_wait_seconds` and reused when it answers (a WAA server restarted by its
watchdog comes back on the same address); one that stays silent is retired and a spare URL (more
URLs than the pool size) takes its place, if one is left. When none is, the pool goes on smaller.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit, urlunsplit

import requests

from adapters.vms.base import ProviderError, ResetLevel, VMHandle, VMProvider
from adapters.vms.defaults import DEFAULT_SERVER_WAIT_SECONDS
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAError
from adapters.waa.settle import SettlePolicy


class ExistingServersProvider(VMProvider):
    """Hands out a fixed list of WAA server URLs, one per pool slot; the rest are spares."""

    name = "existing"

    def __init__(
        self,
        urls: list[str],
        *,
        devtools_port: int = 9222,
        server_wait_seconds: float = DEFAULT_SERVER_WAIT_SECONDS,
    ) -> None:
        if not urls:
            raise ValueError("at least one WAA server URL is needed")
        bad = [u for u in urls if urlsplit(u).scheme not in ("http", "https") or not urlsplit(u).hostname]
        if bad:
            raise ValueError(f"not an http(s) URL of a WAA server: {', '.join(bad)}")
        if not server_wait_seconds > 0:
            raise ValueError(f"server_wait_seconds must be positive, got {server_wait_seconds}")
        self.urls = [u.rstrip("/") for u in urls]
        self.devtools_port = devtools_port
        self.server_wait_seconds = server_wait_seconds
        self._unused = list(self.urls)
        self._retired: list[str] = []
        self._lock = threading.Lock()
        # What each server said of itself at the run's start (GET /sim/info), asked once: the
        # run's label and its waits both read it.
        self._infos: dict[str, dict | None] = {}

    @property
    def environment(self) -> str:
        """"existing", or "local-simulation (existing server)" when the first server is the simulation:
        runs are labelled by what they ran on, not by how it was reached."""
        return "local-simulation (existing server)" if self._info(self.urls[0]) is not None else self.name

    @property
    def acts_synchronously(self) -> bool:  # type: ignore[override]
        """Whether every server (spares too) is the simulation with its quirks off; a server that
        does not answer now counts as a real one (WAA's waits are the safe side)."""
        infos = (self._info(url) for url in self.urls)  # asked until one is not such a server
        return all(info is not None and info.get("quirks") is False for info in infos)

    @property
    def settle(self) -> SettlePolicy:  # type: ignore[override]
        """No wait after an action on servers that act synchronously; adaptive (as on a real
        desktop) otherwise."""
        return SettlePolicy.fixed(0.0) if self.acts_synchronously else SettlePolicy()

    def _info(self, url: str) -> dict | None:
        if url not in self._infos:
            self._infos[url] = _simulation_info(url)
        return self._infos[url]

    @property
    def retired(self) -> list[str]:
        """URLs of servers that stopped answering and were given up."""
        with self._lock:
            return list(self._retired)

    def create(self, vm_id: str) -> VMHandle:
        """The next unused server, once it answers; a silent one is retired and the next tried."""
        while True:
            with self._lock:
                if not self._unused:
                    retired = f"; retired (not answering): {', '.join(self._retired)}" if self._retired else ""
                    raise ProviderError(
                        f"no WAA server left for {vm_id}: all {len(self.urls)} URL(s) are in use or retired{retired}"
                    )
                url = self._unused.pop(0)
            if self._answers(url):
                return self._handle(vm_id, url)
            self._retire(url)

    def replace(self, vm: VMHandle, new_vm_id: str) -> VMHandle:
        """The same server if it answers again within the wait, else a spare (or ProviderError)."""
        if self._answers(vm.base_url):
            return self._handle(vm.vm_id, vm.base_url)
        self._retire(vm.base_url)
        return self.create(new_vm_id)

    def _answers(self, url: str) -> bool:
        client = WAAClient(url)
        try:
            client.wait_until_ready(self.server_wait_seconds)
        except WAAError:
            return False
        finally:
            client.close()
        return True

    def _retire(self, url: str) -> None:
        with self._lock:
            self._retired.append(url)

    def _handle(self, vm_id: str, url: str) -> VMHandle:
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


def _simulation_info(url: str) -> dict | None:
    """What the local simulation at `url` says of itself (GET /sim/info), or None when the server
    is not the simulation (a real server answers 500 for unknown routes) or does not answer."""
    try:
        response = requests.get(f"{url}/sim/info", timeout=5)
        info = response.json() if response.status_code == 200 else None
    except (requests.RequestException, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("simulation") is True else None
