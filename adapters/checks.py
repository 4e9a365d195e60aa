"""A preflight check's answer: what was checked, whether it passed, and the fix when not.

Shared by `arena doctor` (flows/doctor.py) and the providers' cloud checks
(adapters/vms/cloud_checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One preflight check's answer."""

    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        """`ok    name: detail`, or `FAIL  name: detail` and the fix on the next line."""
        text = f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}\n        fix: {self.fix}"
