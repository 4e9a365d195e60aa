"""Is the VM in the state a task should start from? Three checks:

1. After WAA's reset (`clear_leftovers`): no window is left from an earlier task. WAA's
   `/setup/close_all` asks every window to close (WM_CLOSE); an application with unsaved work
   answers with a prompt ("Do you want to save changes to Untitled?"), which opens after the pass
   and so is still on screen when the next task starts. The prompts are answered without saving
   ("Don't Save", clicked where the accessibility tree says it is) and WAA's close is asked again;
   a window still open after that is a `StartStateError` (the reset could not make the start
   state: infrastructure, adapters/outcomes.py R12).
2. After setup, at reset levels that restore nothing of the disk and registry (`setup`, `reboot`:
   `StartStates`): the state the task's evaluator reads (the VM files and settings its result
   getters read: `state_reads`) is what it was the first time a task of the run read it on that
   VM. A changed value was left by a task that ran there before: the task cannot be isolated at
   this reset level, and it is reported before it is scored, as a setup failure naming what
   changed, never as the agent's failure.
3. WAA-V2's initial-state check (`initial_state_problem`, flavour waa-v2), below.

WAA-V2 looks at the first screenshot after setup and restarts the task (up to three times) when it
is the bare desktop, a white page, Chrome's network error page or a broken VS Code, comparing
against reference screenshots and asking GPT-4o. This product checks without a model or
reference images, from what the WAA server reports:

- the foreground window is the desktop ("Desktop", "Program Manager" or no title): the app the
  task's setup launched never came to the front;
- the screen is blank: at least 98 % of a 64x40 grey thumbnail within 8 levels of its median (a
  white or black page: the app did not draw).

Domains whose tasks start on the desktop or in system windows are not checked (V2's own list:
file_explorer, settings, microsoft_paint, notepad). A failed check is the environment's fault: the
attempt is a setup failure, never an agent failure.
"""

from __future__ import annotations

import hashlib
import io
import re
import statistics
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from adapters.benchmark import BenchmarkTask, UIElement
from adapters.waa.accessibility import parse_accessibility_xml
from adapters.waa.actions import to_execute_command

SKIPPED_DOMAINS = frozenset({"file_explorer", "settings", "microsoft_paint", "notepad"})
DESKTOP_TITLES = frozenset({"", "desktop", "program manager"})
BLANK_SHARE = 0.98
BLANK_LEVELS = 8


def initial_state_problem(domain: str, screenshot_png: bytes | None, window_title: str | None) -> str | None:
    """Why the screen after setup is not a task's starting state, or None when it may be."""
    if domain in SKIPPED_DOMAINS:
        return None
    if (window_title or "").strip().lower() in DESKTOP_TITLES:
        return f"after setup the desktop is in front ({window_title!r}): the {domain} app did not open"
    if screenshot_png and _blank(screenshot_png):
        return "after setup the screen is blank (one colour): the app did not draw its window"
    return None


def _blank(png: bytes) -> bool:
    with Image.open(io.BytesIO(png)) as image:
        pixels = list(image.convert("L").resize((64, 40)).tobytes())
    middle = statistics.median(pixels)
    return sum(abs(p - middle) <= BLANK_LEVELS for p in pixels) >= BLANK_SHARE * len(pixels)



# -- 1. windows left after WAA's reset ---------------------------------------------------------

# What /obs_winagent lists that no task opened: the desktop, and the PowerShell window hosting
# WAA's server, which its close_all leaves alone on purpose.
NOT_LEFTOVERS = frozenset({"", "desktop", "program manager",
                           "administrator: c:\\windows\\system32\\windowspowershell\\v1.0\\powershell.exe"})
# The button of a save prompt that closes without saving (Windows 10's "Don't Save", 11's "Don't
# save", with either apostrophe; a mnemonic's "&" or "_" is left out before comparing).
DONT_SAVE = frozenset({"don't save", "dont save", "do not save", "don\u2019t save"})
CLEAR_ROUNDS = 2


class StartStateError(Exception):
    """The VM is not in a state a task can start from, and the reset cannot make it so."""


def leftover_windows(window_names: str) -> list[str]:
    """The windows /obs_winagent lists (its newline-separated `window_names_str`) that a task
    opened: everything but the desktop and WAA's own server window."""
    return [name for name in (line.strip() for line in window_names.splitlines()) if name.lower() not in NOT_LEFTOVERS]


def dont_save_buttons(tree: UIElement | None) -> list[UIElement]:
    """The "Don't Save" buttons of the save prompts in an accessibility tree, that have a place."""
    if tree is None:
        return []
    return [node for node in tree.iter() if node.role.lower() == "button" and node.center is not None
            and node.name.strip().lower().replace("&", "").replace("_", "") in DONT_SAVE]


def clear_leftovers(client: Any, backend: str = "uia") -> list[str]:
    """After WAA's reset: answer the save prompts it left without saving, ask the rest to close
    again, and return the windows still open (empty when the desktop is clear).

    `client` is a WAAClient. The prompts are found in the accessibility tree and their "Don't
    Save" clicked through pyautogui (/execute), as an agent would; the tree is read only when a
    window is left, so a clean reset costs one /obs_winagent."""
    left = leftover_windows(client.obs_winagent().window_names)
    for _ in range(CLEAR_ROUNDS):
        if not left:
            return []
        for button in dont_save_buttons(parse_accessibility_xml(client.accessibility(backend))):
            x, y = button.center  # type: ignore[misc]
            client.execute(to_execute_command(f"pyautogui.click({int(x)}, {int(y)})"))
        client.setup_close_all()
        left = leftover_windows(client.obs_winagent().window_names)
    return left


# -- 2. the state the evaluator reads, across tasks on one VM ---------------------------------------

# Result getters that only read the VM's files and settings (never the screen, a browser, or
# anything a read could change), and vm_command_line commands that only read.
STATE_GETTERS = frozenset({
    "vm_file", "content_from_vm_file", "vm_file_exists_in_vm_folder", "vm_folder_exists_in_documents",
    "vm_file_exists_in_desktop", "list_directory", "vm_command_line", "vm_command_error",
    "storage_sense_run_frequency", "system_notifications", "night_light_state", "system_timezone",
    "desktop_background", "vlc_config", "vm_library_folders", "is_file_hidden",
})
# One command that only reads (a PowerShell Get-... or Test-Path, cmd's type or dir), with nothing
# chained to it: a command run before the agent acts must not change what it starts from.
_READ_ONLY_COMMAND = re.compile(
    r"^\s*(?:powershell(?:\.exe)?\s+-command\s+\"?\s*(?:get-|test-path)|cmd(?:\.exe)?\s+/c\s+(?:type|dir)\s)"
    r"[^;|&<>`\n\r$]*$", re.IGNORECASE)
# Reset levels that restore the disk and registry: nothing a task leaves survives them.
RESTORING_LEVELS = frozenset({"snapshot", "disk"})


def state_reads(task: BenchmarkTask) -> list[dict[str, Any]]:
    """The result getters of `task`'s evaluator that read its start state (STATE_GETTERS; a
    vm_command_line only when its command reads); none for an infeasible task."""
    spec = task.evaluation_spec or {}
    if spec.get("func") == "infeasible":
        return []
    results = spec.get("result")
    entries = results if isinstance(results, list) else [results]
    reads = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type") not in STATE_GETTERS:
            continue
        if entry["type"] in ("vm_command_line", "vm_command_error"):
            command = entry.get("command")
            text = " ".join(map(str, command)) if isinstance(command, list) else str(command or "")
            if not _READ_ONLY_COMMAND.match(text):
                continue
        reads.append(entry)
    return reads


class _Recording:
    """A WAA client as getters see it, that notes every VM read and a fingerprint of its answer
    (a read the server failed is left out: it says nothing of the state)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.seen: dict[str, str] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            value = target(*args, **kwargs)
            self.seen[_describe_read(name, args, kwargs)] = _fingerprint(value)
            return value

        return call

    def get_file(self, path: str, **_: Any) -> bytes | None:
        from adapters.waa.evaluator.archive_limits import MAX_FILE_BYTES

        content = self._client.get_file(path, max_bytes=MAX_FILE_BYTES)
        self.seen[f"/file {path}"] = "absent" if content is None else _fingerprint(content)
        return content


def _describe_read(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A VM read as the start-state report names it, e.g. "/execute powershell -Command ..."."""
    if name == "execute":
        command = args[0] if args else kwargs.get("command")
        text = command if isinstance(command, str) else " ".join(map(str, command or []))
        shell = kwargs.get("shell", args[1] if len(args) > 1 else False)
        return f"/execute{' (shell)' if shell else ''} {text}"
    return f"{name}({', '.join(map(repr, [*args, *kwargs.values()]))})"


def _fingerprint(value: Any) -> str:
    """A short, comparable form of a VM answer: its text when short, else a SHA-256 of it. A
    command's answer is its output (and its exit code and errors when it failed)."""
    if isinstance(value, (bytes, bytearray)):
        return "sha256:" + hashlib.sha256(value).hexdigest()[:16]
    if hasattr(value, "returncode") and hasattr(value, "output"):
        value = value.output if value.returncode == 0 else f"exit {value.returncode}: {value.output!r} {value.error!r}"
    text = repr(value)
    return text if len(text) <= 80 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def read_state(client: Any, task: BenchmarkTask) -> dict[str, str]:
    """What `task`'s evaluator reads of the VM now: each VM read its state getters make, with a
    fingerprint of the answer. Getter and server errors leave a read out."""
    from adapters.waa.evaluator.getters import GETTERS, GetterContext

    recording = _Recording(client)
    with tempfile.TemporaryDirectory(prefix="waa-start-state-") as scratch:
        ctx = GetterContext(vm=recording, cache_dir=Path(scratch), offline=True)
        for entry in state_reads(task):
            try:
                GETTERS[entry["type"]](ctx, entry)
            except Exception:  # noqa: BLE001 - a getter or server error: that state is not compared
                continue
    return recording.seen


@dataclass
class _VMMemory:
    first: dict[str, tuple[str, str]] = field(default_factory=dict)  # read -> (value, task first seen by)
    ran: list[str] = field(default_factory=list)  # tasks run on the VM since its last clean state


class StartStates:
    """Across one run: what each VM's evaluator-read state was when a task first read it, and
    which tasks ran on the VM since its last clean state (thread-safe; one per run)."""

    def __init__(self) -> None:
        self._vms: dict[str, _VMMemory] = {}
        self._lock = threading.Lock()

    def fresh(self, vm: str) -> None:
        """`vm` is in a clean state (just made, or restored by its reset): forget what it held."""
        with self._lock:
            self._vms.pop(vm, None)

    def check(self, vm: str, task: BenchmarkTask, reset_level: str,
              read: Callable[[], dict[str, str]]) -> str | None:
        """Why `task` cannot start isolated on `vm` at `reset_level`, or None. `read` reads the
        state its evaluator reads (`read_state`), called only at levels that restore nothing."""
        if reset_level in RESTORING_LEVELS:
            self.fresh(vm)  # restored: nothing an earlier task left survives
            return None
        now = read()
        with self._lock:
            memory = self._vms.setdefault(vm, _VMMemory())
            changed = [(key, value, memory.first[key]) for key, value in now.items()
                       if key in memory.first and memory.first[key][0] != value]
            for key, value in now.items():
                memory.first.setdefault(key, (value, task.task_id))
            ran = list(dict.fromkeys(memory.ran))
        if not changed:
            return None
        key, value, (was, first) = changed[0]
        key = key if len(key) <= 240 else key[:237] + "..."
        return (f"start state: the task cannot be isolated at reset level {reset_level}: what its evaluator reads is "
                f"not in its initial state ({key} reads {value}, it read {was} when {first} started on this VM; tasks "
                f"run on it since: {', '.join(ran) or 'none'}); not scored: run with --reset-level snapshot or on a "
                "fresh server")

    def ran(self, vm: str, task_id: str) -> None:
        """`task_id` had an attempt on `vm` (it may have changed what later tasks read)."""
        with self._lock:
            self._vms.setdefault(vm, _VMMemory()).ran.append(task_id)
