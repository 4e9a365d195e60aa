"""Injected server faults: the real WAA server's own failures, on demand.

The real server fails well-formed requests for its own reasons: ``/execute`` answers 500 when
its 120 s subprocess timeout fires, any uncaught exception becomes a 500, a VM under load drops
connections or answers late. Tests switch these on with ``POST /sim/faults``; quirks mode's
``action_fault_rate`` uses the same mechanism for a share of ``/execute`` and ``/execute_windows``.

A fault that fires replaces the request: the route's effect never happens (an action the server
failed never reached the screen). It first sleeps ``delay`` seconds (no lock held), then either
drops the connection (``drop``), starts a 200 answer and dies halfway through its body (``cut``:
a VM or server process that stops while answering; the body is shorter than its
Content-Length), serves the request normally (``status`` 200: a pure slowdown, as a hanging
``/accessibility``), answers ``status`` with the real server's error body
``{"status": "error", "message": ...}``, or, with ``returncode`` (``/execute`` only), answers 200
as ``/execute`` does for a command that ran and failed: ``{"status": "success", "output": "",
"error": <a Python traceback ending in message>, "returncode": ...}``. The default message is
pyautogui's ``OSError: [WinError 5] Access is denied``, what its input calls raise on Windows
while UAC's secure desktop or a locked session holds the input.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

ALL_ROUTES = "*"
# subprocess.TimeoutExpired's own words, as WAA's /execute reports them.
EXECUTE_TIMEOUT_MESSAGE = "Command '{command}' timed out after 120 seconds"
INTERNAL_ERROR_MESSAGE = "Internal server error (injected by the WAA simulation)"
# What pyautogui's input calls raise on Windows when the input desktop is not the user's.
OS_ERROR_MESSAGE = "OSError: [WinError 5] Access is denied"
_EXECUTE_ROUTES = ("/execute", "/setup/execute")


class FaultSpecError(ValueError):
    """A fault description that cannot be used; the message names the field."""


# The fields a fault's JSON description may have.
_FIELDS = frozenset({"route", "status", "message", "count", "rate", "delay", "drop", "cut", "returncode"})


@dataclass
class Fault:
    """One injected fault and how often it has fired."""

    route: str
    status: int = 500
    message: str | None = None
    count: int | None = None  # None = unlimited
    rate: float | None = None  # None = every matching request
    delay: float = 0.0
    drop: bool = False
    cut: bool = False  # answer 200 with half of the body its Content-Length promises, then reset
    returncode: int | None = None  # /execute: answer 200 with this returncode (a command that failed)
    hits: int = 0

    @classmethod
    def from_dict(cls, data: Any, index: int) -> "Fault":
        """A fault from its JSON description; FaultSpecError names the bad field."""
        if not isinstance(data, dict):
            raise FaultSpecError(f"faults[{index}] must be an object")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise FaultSpecError(f"faults[{index}] has unknown field(s) {unknown}")
        route = data.get("route")
        if not isinstance(route, str) or not (route == ALL_ROUTES or route.startswith("/")):
            raise FaultSpecError(f"faults[{index}].route must be a path such as '/execute' or '*'")
        status = data.get("status", 500)
        if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
            raise FaultSpecError(f"faults[{index}].status must be an HTTP status code")
        message = data.get("message")
        if message is not None and not isinstance(message, str):
            raise FaultSpecError(f"faults[{index}].message must be a string")
        count = data.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise FaultSpecError(f"faults[{index}].count must be a non-negative integer or null")
        rate = data.get("rate")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1):
            raise FaultSpecError(f"faults[{index}].rate must be a number in [0, 1] or null")
        delay = data.get("delay", 0.0)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 3600:
            raise FaultSpecError(f"faults[{index}].delay must be seconds in [0, 3600]")
        drop = data.get("drop", False)
        if not isinstance(drop, bool):
            raise FaultSpecError(f"faults[{index}].drop must be a boolean")
        cut = data.get("cut", False)
        if not isinstance(cut, bool):
            raise FaultSpecError(f"faults[{index}].cut must be a boolean")
        if cut:
            if drop or "returncode" in data or data.get("status", 200) != 200:
                raise FaultSpecError(f"faults[{index}].cut starts a 200 answer: no drop, status or returncode with it")
            status = 200
        returncode = data.get("returncode")
        if returncode is not None:
            if isinstance(returncode, bool) or not isinstance(returncode, int) or returncode == 0:
                raise FaultSpecError(f"faults[{index}].returncode must be a non-zero integer")
            if route not in _EXECUTE_ROUTES or data.get("status", 200) != 200 or drop:
                raise FaultSpecError(
                    f"faults[{index}].returncode needs route /execute or /setup/execute, status 200 and no drop"
                )
            status = 200
        return cls(route, status, message, count, None if rate is None else float(rate), float(delay), drop, cut,
                   returncode)

    def remaining(self) -> int | None:
        return None if self.count is None else max(0, self.count - self.hits)

    def body_message(self, path: str) -> str:
        """The error message of the answer: the given one, else the real server's usual words."""
        if self.message is not None:
            return self.message
        if path in _EXECUTE_ROUTES:
            return EXECUTE_TIMEOUT_MESSAGE.format(command="python -c ...")
        return INTERNAL_ERROR_MESSAGE

    def execute_answer(self, path: str) -> dict[str, Any]:
        """The 200 answer of /execute for a command that ran and failed (``returncode`` faults)."""
        last = self.message if self.message is not None else OS_ERROR_MESSAGE
        trace = f'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n{last}\n'
        return {"status": "success", "output": "", "error": trace, "returncode": self.returncode}

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "status": self.status, "message": self.message, "count": self.count,
                "rate": self.rate, "delay": self.delay, "drop": self.drop, "cut": self.cut,
                "returncode": self.returncode,
                "hits": self.hits, "remaining": self.remaining()}


class FaultInjector:
    """The faults in force; thread-safe (the HTTP server is threaded)."""

    def __init__(self, faults: list[Fault] | None = None, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._faults = list(faults or [])
        self._rng = random.Random(seed)

    @classmethod
    def for_action_rate(cls, rate: float, seed: int) -> "FaultInjector":
        """Quirks mode's action_fault_rate: a share of /execute and /execute_windows fail."""
        if rate <= 0:
            return cls(seed=seed)
        return cls([Fault("/execute", rate=rate), Fault("/execute_windows", rate=rate)], seed=seed)

    def configure(self, data: Any) -> None:
        """Replace the faults from a ``POST /sim/faults`` body; FaultSpecError when malformed."""
        if not isinstance(data, dict) or not isinstance(data.get("faults"), list):
            raise FaultSpecError('body must be {"faults": [...], "seed": int (optional)}')
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise FaultSpecError("seed must be an integer")
        faults = [Fault.from_dict(f, i) for i, f in enumerate(data["faults"])]
        with self._lock:
            self._faults = faults
            self._rng = random.Random(seed)

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.to_dict() for f in self._faults]

    def match(self, path: str) -> Fault | None:
        """The fault that fires for a request to `path`, counted as a hit; None when none does."""
        if path.startswith("/sim/"):
            return None
        with self._lock:
            for fault in self._faults:
                if fault.route not in (ALL_ROUTES, path) or fault.remaining() == 0:
                    continue
                if fault.rate is not None and self._rng.random() >= fault.rate:
                    continue
                fault.hits += 1
                return fault
        return None
