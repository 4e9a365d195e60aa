"""Verification of a new image: the WAA server of a VM booted from it passes `arena probe`'s layers."""

from __future__ import annotations

from adapters.images.stages import BuildError
from adapters.vms.base import ProviderError, VMProvider
from adapters.vms.janitor import sweep_run
from adapters.waa.client import WAAClient
from adapters.waa.probe import format_probe, probe_server


def probe_summary(base_url: str) -> str:
    """Run every probe layer against `base_url`; a one-line summary, or BuildError naming the
    failing layer (with the full layer report)."""
    client = WAAClient(base_url)
    try:
        results = probe_server(client)
    finally:
        client.close()
    failed = [r for r in results if not r.ok]
    if failed:
        raise BuildError(f"the WAA server of the verification VM fails layer '{failed[0].layer}':\n"
                         + format_probe(base_url, results))
    return f"probe passed ({len(results)} layers: {', '.join(r.layer for r in results)})"


def boot_and_probe(provider: VMProvider, run_id: str, build: str, image: str) -> str:
    """Boot one VM of `provider` (built for the verification run `run_id`) from the image, run
    every probe layer on it, then delete it and anything of that run left behind; the probe's
    summary, or BuildError naming build `build` and `image`."""
    try:
        try:
            vm = provider.create("verify")
        except ProviderError as exc:
            raise BuildError(f"image build {build}: a VM from {image} did not come up: {exc}") from exc
        try:
            return probe_summary(vm.base_url)
        finally:
            provider.delete(vm)
    finally:
        sweep_run(provider, run_id)
        provider.close()
