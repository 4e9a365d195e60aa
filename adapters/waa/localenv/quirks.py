"""Quirks mode: the real WAA server's slow or awkward behaviours, switched on together.

With ``--quirks`` (``start_local_env(..., quirks=True)``) the simulation behaves like a freshly
booted VM whose WAA server is slow, so the project's client and adapter are tested against it:

* ``ready_delay`` (default 2.0 s): for this long after the port file is written, every
  connection that asks for anything but ``/sim/*`` is reset (TCP RST, no HTTP answer), as a VM
  whose server is not up yet; ``/sim/*`` answers throughout (``/sim/info`` reports ``ready``).
  An app served by other means than ``python -m adapters.waa.localenv`` (e.g. Flask's test client)
  gets 503 with an empty body instead, since only the simulation's own HTTP server can reset.
* ``accessibility_delay`` (default 1.0 s): ``GET /accessibility`` sleeps this long before
  building the tree, without holding the state lock (other routes keep answering meanwhile).
* ``launch_delay`` (default 0.5 s): ``/setup/launch`` of a known program answers 200 at once but
  the window opens only after this delay; unknown programs never open (as without quirks).
* ``failsafe`` (default True): pyautogui's fail-safe is on in the server process, so
  ``/execute_windows`` code that drives the pointer into a screen corner fails with pyautogui's
  fail-safe error (WAA's ``main.py`` sets ``pyautogui.FAILSAFE = False``, but whether deployed
  images keep it off is disputed; quirks mode assumes the awkward case).
* ``action_fault_rate`` (default 0.0) with ``fault_seed`` (default 0): this share of ``/execute``
  and ``/execute_windows`` requests fails server-side with 500 (WAA's own "timed out after 120
  seconds" for ``/execute``), the action not applied; drawn from a generator seeded with
  ``fault_seed``, so a run is repeatable. Same mechanism as ``POST /sim/faults`` (:mod:`.faults`).
* ``repaint_delay`` (default 0.0): slow repaint. After an action (``/execute`` action code,
  ``/execute_windows``) the screen and the accessibility tree (``/screenshot``,
  ``/accessibility``, ``/obs_winagent``) keep showing the desktop as it was before the action
  until this many seconds after the last action, as an application on a loaded VM without a GPU
  repaints late; the action itself has happened (files, later actions and evaluation see it).
* ``strict_activation_fails`` (default False): a strict ``/setup/activate_window`` of a window that
  exists does not bring it to the front and answers 500 with an empty message, as WAA's handler
  does when its ``assert window.isActive`` fails (Windows' foreground lock refused the switch).
* ``live_regions`` (default False): the screen is never still, as a real desktop's: the focused
  text field's caret blinks every 530 ms, a progress ring turns in the taskbar and the taskbar
  clock shows seconds (:mod:`.render`), whether or not anyone acts.
* ``save_prompts`` (default True): closing a Notepad whose text is not saved (``/setup/close_all``,
  ``/setup/close_window``, its Close button) does not close it: Notepad asks "Do you want to save
  changes to ...?" (Save / Don't Save / Cancel) in a dialog of its own, as Windows' Notepad does
  when WAA's reset sends it WM_CLOSE. The prompt opens after ``close_all`` has gone through the
  windows, so it is still on screen after WAA's reset.

Without quirks mode all delays are 0, the server-process fail-safe is off, activation works, the
screen stands still between actions and a window closes when asked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


_BOOLEANS = ("failsafe", "strict_activation_fails", "live_regions", "save_prompts")


@dataclass(frozen=True)
class QuirkSettings:
    """The knobs of quirks mode; defaults are small so tests stay fast."""

    ready_delay: float = 2.0
    accessibility_delay: float = 1.0
    launch_delay: float = 0.5
    failsafe: bool = True
    action_fault_rate: float = 0.0
    fault_seed: int = 0
    repaint_delay: float = 0.0
    strict_activation_fails: bool = False
    live_regions: bool = False
    save_prompts: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "QuirkSettings":
        """Settings from a partial dict; unknown keys or bad values raise ValueError."""
        data = dict(data or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown quirk setting(s) {unknown}; known: {sorted(known)}")
        for name, value in data.items():
            if name in _BOOLEANS:
                if not isinstance(value, bool):
                    raise ValueError(f"quirk setting {name} must be a bool, not {value!r}")
            elif name == "fault_seed":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"quirk setting fault_seed must be an integer, not {value!r}")
            elif name == "action_fault_rate":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                    raise ValueError(f"quirk setting action_fault_rate must be a number in [0, 1], not {value!r}")
                data[name] = float(value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 600:
                raise ValueError(f"quirk setting {name} must be a number of seconds in [0, 600], not {value!r}")
            else:
                data[name] = float(value)
        return cls(**data)

    @classmethod
    def off(cls) -> "QuirkSettings":
        """The effective settings when quirks mode is off: no delays, fail-safe off."""
        return cls(ready_delay=0.0, accessibility_delay=0.0, launch_delay=0.0, failsafe=False,
                   action_fault_rate=0.0, save_prompts=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, as /sim/info reports it."""
        return asdict(self)

    def cli_args(self) -> list[str]:
        """The ``python -m adapters.waa.localenv`` flags that reproduce these settings."""
        return ["--quirks", "--ready-delay", repr(self.ready_delay), "--accessibility-delay",
                repr(self.accessibility_delay), "--launch-delay", repr(self.launch_delay),
                "--failsafe" if self.failsafe else "--no-failsafe",
                "--action-fault-rate", repr(self.action_fault_rate), "--fault-seed", str(self.fault_seed),
                "--repaint-delay", repr(self.repaint_delay),
                "--strict-activation-fails" if self.strict_activation_fails else "--no-strict-activation-fails",
                "--live-regions" if self.live_regions else "--no-live-regions",
                "--save-prompts" if self.save_prompts else "--no-save-prompts"]
