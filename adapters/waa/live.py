"""The WAA live adapter: drives one WAA server (a real VM or the local simulation) over HTTP.

It knows nothing of Prefect or of VM providers: it is given a client for a server that is up,
and offers the pipeline's per-task pieces separately (clean the desktop, run the task's setup,
observe, step, evaluate) so each can be timed and retried on its own, plus the whole
BenchmarkAdapter interface on top of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkAdapter,
    BenchmarkObservation,
    BenchmarkResult,
    BenchmarkTask,
    ObservationNeeds,
    OutcomeKind,
)
from adapters.waa.accessibility import focused_element, parse_accessibility_xml
from adapters.waa.actions import (
    TYPE_PIECE_CHARS,
    ActionTranslationError,
    Screen,
    check_action,
    clamp,
    clipboard_chunks,
    to_clipboard_paste,
    to_computer_click,
    to_execute_command,
    to_pyautogui,
    to_pyautogui_write,
    typing_pieces,
    untypable_characters,
)
from adapters.outcomes import (
    EnvironmentFault,
    Fault,
    Scoring,
    classify_action_error,
    classify_command_failure,
    classify_tree_error,
    evaluation_outcome,
    has_control_characters,
    is_computer_unset,
)
from adapters.waa.catalog import WAATaskCatalog
from adapters.waa.initial_state import StartStateError, clear_leftovers, initial_state_problem
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAError
from adapters.waa.evaluate_client import EvaluateEndpointClient
from adapters.waa.grounding import Marks
from adapters.waa.evaluator import evaluate_task
from adapters.waa.settle import LiveRegions, SettlePolicy, Settled, settle
from adapters.waa.setup_steps import SetupRunner, SetupStepError

T = TypeVar("T")
log = logging.getLogger(__name__)

# Frames taken while the agent thinks, to learn the screen's live regions (`_ScreenWatcher`):
# enough to see a caret blink, a spinner turn and a clock tick, few enough to cost the VM little.
WATCH_FRAMES = 3
WATCH_GAP_SECONDS = 0.5

_POINTER = {ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK}


class ActionRejected(RuntimeError):
    """The VM ran the agent's action and it failed for the agent's reasons (pyautogui's
    fail-safe: the pointer stayed in a screen corner).

    An action the agent asked for that cannot be carried out is refused before it is sent
    (`adapters.waa.actions.ActionTranslationError`, R3); a well-formed action the VM failed to
    carry out raises `adapters.outcomes.EnvironmentFault` (R1).
    """


@dataclass(frozen=True)
class LiveAdapterSettings:
    """Per-environment knobs; the defaults suit a real WAA VM."""

    accessibility_backend: str = "uia"
    # Clicks on an element id go through the server's computer.mouse.move_id (WAA's Set-of-Marks
    # path); "pyautogui" clicks the element's centre instead.
    element_clicks: Literal["computer", "pyautogui"] = "computer"
    # How long a launched program may take to show a window before setup counts as failed.
    launch_verify_seconds: float = 30.0
    # Honour the task's fixed `sleep` setup steps; False where the VM acts synchronously
    # (VMProvider.acts_synchronously), where they wait for nothing.
    setup_waits: bool = True
    # How to wait after an action before observing (adapters/waa/settle.py): adaptive by default;
    # SettlePolicy.fixed(3) is WAA's own runner, fixed(0) suits environments that act at once.
    settle: SettlePolicy = field(default_factory=SettlePolicy)
    # Fetch the screenshot, tree and window information of one observation at once.
    concurrent_reads: bool = True
    offline_evaluation: bool = False
    # Score with the local engine, or through an /evaluate endpoint deployed beside the server.
    evaluator: Literal["local", "endpoint"] = "local"
    evaluate_url: str | None = None
    # The suite's flavour (adapters/waa/suite_settings.py): "waa-v2" scores with WAA-V2's metrics.
    flavor: str = "waa"
    # WAA-V2's initial-state check after setup (adapters/waa/initial_state.py), with this many
    # reruns of the setup before the attempt is a setup failure (V2 restarts up to three times).
    initial_state_check: bool = False
    initial_state_retries: int = 2
    # How a server failure during evaluation counts (adapters/outcomes.py R9): "strict" never
    # scores it; "waa-compat" scores it as WAA's evaluator does, to reproduce WAA's numbers.
    scoring: Scoring = "strict"


class WAALiveAdapter(BenchmarkAdapter):
    """BenchmarkAdapter over one WAA server."""

    def __init__(
        self,
        client: WAAClient,
        catalog: WAATaskCatalog,
        cache_dir: Path,
        settings: LiveAdapterSettings | None = None,
        devtools_url: str | None = None,
        download_dir: Path | None = None,
    ) -> None:
        """`cache_dir` takes files copied from the VM for one task attempt (concurrent attempts
        need their own: tasks name the same files); `download_dir` (default `cache_dir /
        "downloads"`) keeps files downloaded by URL and may be shared."""
        self.client = client
        self.catalog = catalog
        self.cache_dir = cache_dir
        self.settings = settings or LiveAdapterSettings()
        self.setup_runner = SetupRunner(
            client,
            cache_dir,
            launch_verify_seconds=self.settings.launch_verify_seconds,
            fixed_waits=self.settings.setup_waits,
            devtools_url=devtools_url,
            download_dir=download_dir,
        )
        self._screen_size: tuple[int, int] | None = None
        # What the agent playing on this adapter reads (flows/attempt.py sets it per episode).
        self.needs = ObservationNeeds()
        # The last settle's capture, used by the next observation instead of a new screenshot.
        self._settled: Settled | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._last_observation: BenchmarkObservation | None = None
        self._last_action: BenchmarkAction | None = None
        self._marks = Marks(())
        # Fingerprint of the marks the server's computer object holds; None = the server may
        # have no computer object at all (fresh or restarted server, R4).
        self._marks_sent: str | None = None
        self._screenshot: bytes | None = None
        # R5: whether the agent typed text the tree serializer refuses in this episode.
        self._typed_control_characters = False
        # What moves on the screen by itself (adapters/waa/settle.py), learned over an episode;
        # frames taken while the agent thinks feed it (`_watch_screen`).
        self._live = LiveRegions()
        self._watcher: _ScreenWatcher | None = None

    # -- catalog ---------------------------------------------------------------------------

    def list_tasks(self, domain: str | None = None) -> list[BenchmarkTask]:
        return self.catalog.tasks(domains=[domain] if domain else None)

    def load_task(self, task_id: str) -> BenchmarkTask:
        return self.catalog.load(task_id)

    # -- per-task pieces -------------------------------------------------------------------

    def clean_desktop(self) -> None:
        """WAA's own reset: close every window and clear the task files in Downloads; then the
        prompts it leaves are answered without saving (StartStateError if a window stays)."""
        self._stop_watching()
        self._live.clear()
        clean_desktop(self.client, self.settings.accessibility_backend)
        self._last_observation = None
        self._last_action = None
        self._marks, self._marks_sent = Marks(()), None
        self._typed_control_characters = False
        self._settled = None

    def run_setup(self, task: BenchmarkTask) -> None:
        """Run the task's `config` steps; raises SetupStepError naming a failed step. With
        `initial_state_check`, the screen must then look like a starting state, else the steps
        run again (`initial_state_retries` times) before SetupStepError."""
        tries = 1 + (self.settings.initial_state_retries if self.settings.initial_state_check else 0)
        for attempt in range(tries):
            self.setup_runner.run(task.setup_steps)
            if not self.settings.initial_state_check:
                return
            window = self.client.obs_winagent()
            problem = initial_state_problem(task.domain, self.client.screenshot(), window.window_title)
            if problem is None:
                return
            log.warning("initial-state check, try %d of %d: %s", attempt + 1, tries, problem)
        raise SetupStepError(len(task.setup_steps), "initial_state_check", f"{problem} (after {tries} tries)")

    def screen_size(self) -> tuple[int, int]:
        if self._screen_size is None:
            self._screen_size = self.client.screen_size()
        return self._screen_size

    def observe(self) -> BenchmarkObservation:
        """Screenshot, plus the accessibility tree and window information the agent reads.

        The reads run at once (`concurrent_reads`); a screenshot the settle wait just took is
        used as is. A server-side failure raises EnvironmentFault (R1); a tree the agent's own
        typing made unreadable leaves the tree out and says why in
        `raw_observation["tree_error"]` (R5).
        """
        settled, self._settled = self._settled, None
        reads: dict[str, Callable[[], Any]] = {}
        if settled is None or settled.screenshot is None:
            reads["screenshot"] = lambda: self._observation_call(self.client.screenshot)
        if self.needs.accessibility_tree:
            reads["tree"] = self._read_tree
        if self.needs.window:
            reads["window"] = lambda: self._observation_call(self.client.obs_winagent)
        got = self._read_all(reads)
        screenshot = got["screenshot"] if "screenshot" in got else settled.screenshot  # type: ignore[union-attr]
        tree, tree_error = got.get("tree", (None, None))
        window = got.get("window")
        self._marks = Marks.from_tree(tree)
        self._screenshot = screenshot
        raw: dict[str, Any] = {}
        if window is not None:
            raw.update(window_names=window.window_names, window_rect=window.window_rect)
        if tree_error is not None:
            raw["tree_error"] = tree_error
        if settled is not None:
            raw["settle"] = {"seconds": round(settled.seconds, 3), "captures": settled.captures,
                             "changed": settled.changed, "capped": settled.capped, "live_cells": settled.live_cells}
        observation = BenchmarkObservation(
            screenshot=screenshot,
            viewport=self._observation_call(self.screen_size),
            accessibility_tree=tree,
            window_title=window.window_title if window is not None else None,
            focused_element=focused_element(tree) if tree is not None else None,
            raw_observation=raw,
        )
        self._last_observation = observation
        self._watch_screen()
        return observation

    def _watch_screen(self) -> None:
        """While the agent thinks, take a few frames of the unchanged screen: what moves
        between them is a live region (`LiveRegions`), and the last one is a fresher "before"
        for the next settle. Only for the adaptive settle; a frame is used only if it was taken
        before the next action was sent (`_ScreenWatcher`)."""
        self._stop_watching()
        if self.settings.settle.adaptive and self._screenshot is not None:
            self._watcher = _ScreenWatcher(self.client.screenshot, self._screenshot, self._live)

    def _stop_watching(self) -> bytes | None:
        """Stop the frames taken while the agent thinks; the last one taken, if any."""
        watcher, self._watcher = self._watcher, None
        return watcher.stop() if watcher is not None else None

    def _read_tree(self) -> tuple[Any, str | None]:
        """The parsed tree, or None and why when the agent's own typing broke it (R5)."""
        try:
            xml = self.client.accessibility(self.settings.accessibility_backend)
        except WAAError as exc:
            if classify_tree_error(exc, self._typed_control_characters) is not Fault.AGENT:
                raise EnvironmentFault.from_error("observation", exc) from exc
            return None, f"accessibility tree unavailable: {exc.message}"
        return parse_accessibility_xml(xml), None

    def _read_all(self, reads: dict[str, Callable[[], Any]]) -> dict[str, Any]:
        """Run independent reads, at once or in turn; the first failure (in order) is raised."""
        if not self.settings.concurrent_reads or len(reads) < 2:
            return {name: read() for name, read in reads.items()}
        if self._reader is None:
            self._reader = ThreadPoolExecutor(max_workers=3, thread_name_prefix="waa-read")
        futures = {name: self._reader.submit(read) for name, read in reads.items()}
        return {name: future.result() for name, future in futures.items()}

    @staticmethod
    def _observation_call(call: Callable[[], T]) -> T:
        """Run one observation read; any failure of it is the server's (R1)."""
        try:
            return call()
        except WAAError as exc:
            raise EnvironmentFault.from_error("observation", exc) from exc

    def apply(self, action: BenchmarkAction) -> str | None:
        """Run one action on the VM; returns how it was delivered (the step records it), or None
        for actions that touch nothing.

        What the agent asked for is checked first (`check_action`): an unknown key, a point off
        the screen, a missing element or empty text raises ActionTranslationError and nothing is
        sent (R3). Element clicks then go through the server's Set-of-Marks path, text pyautogui
        cannot type (non-ASCII, control characters) through the clipboard, everything else
        through pyautogui, long text in pieces (`typing_pieces`). A well-formed action the VM
        fails to carry out raises EnvironmentFault (R1); the fail-safe corner, ActionRejected.
        """
        self._last_action = action
        fresher = self._stop_watching()
        if fresher is not None:
            self._screenshot = fresher  # the screen just before the action: the settle's "before"
        width, height = self._observation_call(self.screen_size)
        tree = self._last_observation.accessibility_tree if self._last_observation else None
        screen = Screen(width=width, height=height, tree=tree)
        check_action(action, screen)
        if action.type is ActionType.TYPE and action.text and has_control_characters(action.text):
            self._typed_control_characters = True
        if action.type in _POINTER and action.target_node_id is not None and action.x is None:
            index = self._marks.index_of(action.target_node_id)
            if self.settings.element_clicks == "computer" and index is not None and not self._near_corner(index):
                self._execute_windows(to_computer_click(action, index), action, marks_needed=True)
                return f"computer.mouse.move_id({index}) (Set-of-Marks)"
        if action.type is ActionType.TYPE and action.text and untypable_characters(action.text):
            self._execute_windows(to_clipboard_paste(action.text), action, marks_needed=False)
            pieces = len(clipboard_chunks(action.text))
            return f"clipboard paste through /execute_windows: {len(action.text)} characters in {pieces} piece(s)"
        if action.type is ActionType.TYPE and action.text:
            return self._type_in_pieces(action.text)
        code = to_pyautogui(action, screen)
        if code is None:
            return None
        self._run_harness_code(code)
        return "pyautogui through /execute"

    def _type_in_pieces(self, text: str) -> str:
        """Type `text` with pyautogui, one /execute call per piece (actions.py says why the size).

        A piece the server failed, or lost the connection on, may have typed part of itself, so
        nothing is retried: the attempt ends (R2) saying how much had been typed."""
        pieces = typing_pieces(text)
        for number, piece in enumerate(pieces, 1):
            typed = sum(len(p) for p in pieces[: number - 1])
            where = (
                f" (typing piece {number} of {len(pieces)}; {typed} of {len(text)} characters were typed before it)"
                if len(pieces) > 1 else ""
            )
            self._run_harness_code(to_pyautogui_write(piece), where)
        return (
            f"pyautogui.write through /execute: {len(text)} characters in {len(pieces)} piece(s) "
            f"of at most {TYPE_PIECE_CHARS}"
        )

    def _run_harness_code(self, code: str, where: str = "") -> None:
        """Run pyautogui code the harness translated from a checked action. Any failure, a
        server error or a command that ran and failed (an OS error such as `[WinError 5] Access
        is denied`), is the environment's (R1): the code is ours and well formed."""
        try:
            result = self.client.execute(to_execute_command(code))
        except WAAError as exc:
            raise EnvironmentFault("action", exc.endpoint, exc.message + where) from exc
        if not result.ok and classify_command_failure(authored_by="harness") is Fault.ENVIRONMENT:
            detail = (result.error or result.output).strip().splitlines()
            raise EnvironmentFault(
                "action", "/execute",
                f"the VM failed to carry out the action (returncode {result.returncode}): "
                f"{detail[-1] if detail else 'no output'}{where}",
            )

    def _near_corner(self, index: int) -> bool:
        """move_id goes to the element's centre unclamped; near a corner use clamped pyautogui."""
        centre = self._marks.elements[index].center
        width, height = self.screen_size()
        return centre is None or clamp(centre[0], centre[1], Screen(width, height)) != centre

    def _send_marks(self) -> None:
        """Give the server's computer object the current marks (R4: it may have none at all)."""
        screenshot = self._screenshot or self._observation_call(self.client.screenshot)
        width, height = self.screen_size()
        try:
            self.client.update_computer(self._marks.update_computer_payload(screenshot, width, height))
        except WAAError as exc:
            raise EnvironmentFault.from_error("action", exc) from exc
        self._marks_sent = self._marks.fingerprint()

    def _execute_windows(self, code: str, action: BenchmarkAction, *, marks_needed: bool) -> None:
        """Run computer.* code, making sure the server's computer object exists first (R4).

        If pyautogui's fail-safe fired, the pointer is moved away and the code retried once (R3);
        if the server lost its computer object (restarted), it is re-sent and the code retried once.
        """
        retried: set[str] = set()
        while True:
            if self._marks_sent is None or (marks_needed and self._marks_sent != self._marks.fingerprint()):
                self._send_marks()
            try:
                self.client.execute_windows(code)
                return
            except WAAError as exc:
                if is_computer_unset(exc) and "computer" not in retried:
                    retried.add("computer")
                    self._marks_sent = None
                    continue
                if classify_action_error(exc) is Fault.AGENT:
                    if "failsafe" in retried:
                        raise ActionRejected(f"{action.describe()} failed on the VM: {exc.message}") from exc
                    retried.add("failsafe")
                    self.recover_from_failsafe()
                    continue
                raise EnvironmentFault.from_error("action", exc) from exc

    def recover_from_failsafe(self) -> None:
        """Move the pointer to the screen centre with the fail-safe off, so actions work again."""
        width, height = self.screen_size()
        self._run_harness_code(f"pyautogui.moveTo({width // 2}, {height // 2})", " (moving the pointer off the fail-safe corner)")

    @property
    def last_action(self) -> BenchmarkAction | None:
        return self._last_action

    # -- BenchmarkAdapter ------------------------------------------------------------------

    def reset(self, task: BenchmarkTask) -> BenchmarkObservation:
        self.clean_desktop()
        self.run_setup(task)
        return self.observe()

    def step(self, action: BenchmarkAction) -> tuple[BenchmarkObservation, bool, dict[str, Any]]:
        info: dict[str, Any] = {}
        try:
            info["delivery"] = self.apply(action)
        except (ActionTranslationError, ActionRejected) as exc:
            info["error"] = str(exc)
        if action.type.ends_episode:
            return self._last_observation or BenchmarkObservation(), True, info
        self.settle()
        return self.observe(), False, info

    def settle(self) -> Settled:
        """Wait until the screen has settled after the last action (per `settings.settle`), so
        the next observation never sees it half-drawn; that observation reuses the last capture."""
        last = self._last_action
        action = last.type if last is not None else ActionType.WAIT
        self._settled = settle(
            lambda: self._observation_call(self.client.screenshot), self._screenshot, action, self.settings.settle,
            text=last.text if last is not None else None, live=self._live,
        )
        return self._settled

    def evaluate(self, task: BenchmarkTask) -> BenchmarkResult:
        """Run postconfig and the task's evaluator against the VM's current state."""
        last_action = waa_last_action(self._last_action)
        if self.settings.evaluator == "endpoint":
            if not self.settings.evaluate_url:
                raise ValueError("evaluator 'endpoint' needs evaluate_url")
            outcome = EvaluateEndpointClient(self.settings.evaluate_url).evaluate(task.raw_config, last_action)
        else:
            outcome = evaluate_task(
                task.evaluation_spec,
                self.client,
                last_action=last_action,
                cache_dir=self.cache_dir,
                run_postconfig=self.setup_runner.run,
                offline=self.settings.offline_evaluation,
                download_dir=self.setup_runner.download_dir,
                devtools_url=self.setup_runner.devtools_url,
                flavor=self.settings.flavor,
                scoring=self.settings.scoring,
                agent_typed_control_characters=self._typed_control_characters,
            )
        kind = evaluation_outcome(outcome.kind, outcome.score)
        reason = outcome.reason
        if self.setup_runner.notes:
            # What setup and postconfig carried on past (e.g. a strict activation WAA logs, R6).
            reason += " [setup notes: " + "; ".join(dict.fromkeys(self.setup_runner.notes)) + "]"
        return BenchmarkResult(
            task_id=task.task_id,
            domain=task.domain,
            outcome=kind,
            success=kind is OutcomeKind.SUCCESS,
            score=outcome.score if outcome.kind == "scored" else 0.0,
            infeasible=task.infeasible,
            reason=reason,
            error=None if outcome.kind == "scored" else reason,
        )

    def close(self) -> None:
        self._stop_watching()
        # An abandoned episode's read may still be running: do not wait for it.
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
        self.client.close()


class _ScreenWatcher:
    """Frames of the screen taken while the agent thinks (WATCH_FRAMES, WATCH_GAP_SECONDS
    apart), learned from as live regions. A frame counts only if its capture ended before
    `stop` (called just before the next action is sent), so no frame can show the action."""

    def __init__(self, capture: Callable[[], bytes], last: bytes, live: LiveRegions) -> None:
        self._capture = capture
        self._last = last
        self._taken: bytes | None = None
        self._live = live
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="waa-watch", daemon=True).start()

    def _run(self) -> None:
        for _ in range(WATCH_FRAMES):
            if self._stopped.wait(WATCH_GAP_SECONDS):
                return
            try:
                png = self._capture()
            except WAAError:
                return  # the next observation will say whose fault a failing server is
            with self._lock:
                if self._stopped.is_set():
                    return  # the action may have been sent meanwhile: this frame may show it
                self._live.learn_frames(self._last, png)
                self._last = self._taken = png

    def stop(self) -> bytes | None:
        """Stop; the last frame taken before now, or None."""
        with self._lock:
            self._stopped.set()
            return self._taken


def clean_desktop(client: WAAClient, backend: str = "uia") -> None:
    """WAA's own between-task reset: close every window, clear the files in Downloads. Then what
    WAA's close leaves (an unsaved document's save prompt) is answered without saving; a window
    that still stays raises StartStateError (adapters/waa/initial_state.py `clear_leftovers`)."""
    client.setup_close_all()
    client.setup_clear_task_files()
    left = clear_leftovers(client, backend)
    if left:
        raise StartStateError(
            f"start state: window(s) left from an earlier task that WAA's reset could not close: "
            f"{', '.join(repr(name) for name in left)}")


def waa_last_action(action: BenchmarkAction | None) -> str | None:
    """The last action as WAA's evaluator sees it: the strings "FAIL"/"DONE", else a description."""
    if action is None:
        return None
    if action.type is ActionType.FAIL:
        return "FAIL"
    if action.type is ActionType.DONE:
        return "DONE"
    return action.describe()
