"""Verification of a new image: the WAA server of a VM booted from it passes `arena probe`'s layers."""

from __future__ import annotations

from adapters.images.stages import BuildError
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
