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
    warning: bool = False  # passed, but something a person should change (printed WARN, with the fix)

    def line(self) -> str:
        """`ok    name: detail`, `WARN  name: detail` or `FAIL  name: detail`, the fix on the next
        line for the last two."""
        mark = "FAIL" if not self.ok else "WARN" if self.warning else "ok  "
        text = f"{mark}  {self.name}: {self.detail}"
        return text if (self.ok and not self.warning) or not self.fix else f"{text}\n        fix: {self.fix}"
