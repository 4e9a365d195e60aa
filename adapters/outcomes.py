"""Whose fault was it: the one place that decides how trouble during a task attempt is classified.

A score measures the agent only when the environment did what was asked (DESIGN.md, "Errors and
results"). Every rule below says which WAA server behaviour it answers (notes/waa.md); the
vocabulary is `OutcomeKind` (adapters/benchmark.py) and, for a single failed call, `Fault`.

Rules, by number (the README's outcome table cites them):

R1  Server-side failure of a well-formed request is infrastructure. The server could not be
    reached, dropped the connection (before or in the middle of its answer: a VM or server
    that stops while answering leaves a body shorter than its Content-Length), did not answer
    within the call's deadline, or answered 5xx
    for its own reasons: WAA's `/execute` answers 500 when its 120 s subprocess timeout fires or
    `subprocess.run` raises (Windows refuses a command line over 32,766 characters with
    `[WinError 206]`; the harness types long text in pieces far below both limits,
    adapters/waa/actions.py); any uncaught exception in the Flask app becomes 500. An action
    the harness translated from a checked action (R3) that the VM fails to carry out is R1
    too, even when `/execute` answers 200: a non-zero returncode with an OS error (`OSError:
    [WinError 5] Access is denied` while UAC's secure desktop or a locked session holds the
    input) is the environment's (`classify_command_failure(..., authored_by="harness")`).
R2  An attempt in which any action or observation failed under R1 is never scored: it ends at
    once as `infrastructure_error` naming the route and the server's message, its steps are kept,
    and the task is retried from a fresh reset (bounded by the run's max attempts).
R3  The agent's own mistakes stay the agent's. What the agent asked for is checked before
    anything is sent (adapters/waa/actions.py `check_action`): an unknown key name, a point off
    the screen, an element the observed tree does not have, empty text. Such an action is a
    failed step the agent sees, and the VM is not touched. pyautogui's fail-safe (the agent drove
    the pointer into a screen corner) is one too. Code the agent wrote itself (an agent that
    sends its own Python or shell commands) stays the agent's when it fails
    (`classify_command_failure(..., authored_by="agent")`); no agent built in here sends code:
    model text is data. After several failed steps in a row the episode ends as `agent_failure`.
R4  `computer.*` unset is the harness's duty, not the agent's. WAA's `computer.mouse`,
    `.keyboard` and `.clipboard` are None until `/update_computer` runs in that server process
    (a fresh or restarted server, or a QEMU snapshot taken before any update). The adapter sends
    `/update_computer` before the first `computer.*` call of every attempt; an "'NoneType' object
    has no attribute" answer means the server restarted: it is re-sent and the call retried once,
    and if that fails too the failure is R1.
R5  A tree the agent made unreadable degrades, it does not drop. WAA's `/accessibility`
    serializes with lxml, which refuses control characters: once a window holds one, every tree
    call answers 500 until the text is gone. If the agent typed control characters in this
    episode, the observation goes on without the tree (the step records why) and the episode is
    scored as usual; otherwise the unreadable tree is R1.
R6  Setup: a server-side error (connection, 5xx) on a setup step is infrastructure (R1). A
    problem of the task's own data is `setup_failure` naming the step and carrying the server's
    message: a file to open that does not exist (404), an upload into a folder that does not
    exist (`[Errno 2]`), a window that never appears, a program the VM does not have (`[WinError
    2]`, or a launch that starts no new process or window: WAA's `/setup/launch` answers 200 for
    anything), a parameter the server does not support, a download URL the file host refuses
    (4xx). A download the host's network or the file host failed (5xx) is infrastructure.
    A strict `activate_window` of a window that exists but that the server fails to bring to
    the front (WAA's handler minimises and restores it, then `assert window.isActive`: a 500) is
    not a failure: WAA's setup controller logs any non-200 answer and carries on, and so does
    this one, after the call's retries (R10) and a non-strict check that the window still exists;
    the step's note says so. A window that is gone by then is a `setup_failure`.
R7  Deadlines, and time charged to whoever spent it: one deadline per observation call covers its
    retries (the accessibility tree's 300 s is the total, not per try). An episode's time limit
    counts the agent's time (its model deciding) and the environment's (observations, actions,
    settling: WAA's slow tree, a slow screenshot) separately (`episode_time_outcome`, checked
    between steps): the agent's time past the limit is `timeout`; the environment's time past its
    own limit (by default the same number) is `infrastructure_error`, whatever the agent spent,
    since the server was slow, not the agent. Both reasons give both times. An episode blocked
    in the environment past its hard limit is infrastructure (the server did not answer); an
    agent blocked past it is `timeout`.
R8  The agent's model endpoint failing (connection, 5xx, throttling after the SDK's retries) is
    infrastructure, but of the agent's backend: the attempt is retried on the same VM.
R9  Evaluation: a scored evaluation is `success` when the score is 1 and `agent_failure`
    otherwise; a metric or task-data error during evaluation is `evaluation_error`. A getter
    whose call the server failed for its own reasons (unreachable, dropped connection, past its
    deadline, 5xx such as WAA's "timed out after 120 seconds") makes the attempt an
    `infrastructure_error`: it is retried and never scored, even where WAA's getter would have
    turned the failure into None and scored 0 (`classify_evaluation_call_error`). A 5xx naming a
    file or program the VM does not have (`[WinError 2]`) is the task's data
    (`evaluation_error`); so is a `/file` read of a path that is a folder on the VM, the task's
    fault (`is_folder_read`: the server's open() refused it, "[Errno 21] Is a directory" on
    Linux, "[Errno 13] Permission denied" on Windows, which a file another program locks gives
    too, so the VM is asked whether the path is a folder); every other 5xx stays infrastructure.
    A tree the agent made unreadable (R5) is read as WAA reads it. The scoring option
    `waa-compat` (`SCORING_MODES`, recorded on the run as `runs.scoring`) keeps WAA's own
    handling of a server's error answer during evaluation, for reproducing WAA's numbers; a VM
    out of reach is infrastructure under both.
R10 Retry what is safe to repeat. Reads (observations, files, yes/no checks), WAA's reset and
    clean-up calls (`/setup/close_all`, `/setup/clear_task_files`), the read-only `tasklist`
    that verifies launches, and window activation are retried with back-off on connection
    errors and 5xx within their deadline before R1/R2 apply. Calls that act are not retried: a
    launch, a task's setup commands, every agent action, and each piece of a long text (a
    dropped connection mid-text may have typed part of it, so the attempt ends under R2 and the
    task starts again from a fresh reset).

R11 A fault that repeats is the task's, not the VM's. An evaluation whose getter the server failed
    (R9: a 5xx for what looked like its own reasons) is retried from a fresh reset; if it fails
    again the same way (the same getter, route and server message: `evaluation_fault_signature`)
    on the fresh VM, the fault goes with the task or its data, not with a VM, and the attempt is
    an `evaluation_error` that is not retried again (`RepeatedFaults`). WAA's `/execute` decodes a
    command's output in Windows' ANSI code page, so a getter that prints a file in another code
    page answers 500 every time; so does a `/file` read of a folder (also caught at once, R9). A
    failure another task of the run met too is the server's, and stays infrastructure; a VM out
    of reach never counts as a repeat. Task-data faults knowable without a VM are caught earlier
    by `arena tasks lint` (adapters/waa/lint.py).

R12 The start state is checked, not assumed (adapters/waa/initial_state.py). WAA's reset asks every
    window to close; an application with unsaved work answers with a save prompt that stays on
    screen for the next task. The prompts are answered without saving; a window that still stays
    is `infrastructure_error` (the reset could not make a start state). At reset levels that
    restore nothing of the disk and registry (`setup`, as on an existing server, and `reboot`),
    what the task's evaluator reads (its files and settings) must be what it was when a task of
    the run first read it on that VM; otherwise a task that ran there before left it changed, and
    the task is a `setup_failure` saying what changed and which tasks ran there, before it is
    scored: never the agent's failure, out of the headline rate.

Rates: the headline success rate counts only tasks whose environment was sound
(`OutcomeKind.environment_was_sound`: infrastructure errors and setup failures are left out of
its denominator and shown beside it).
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable
from typing import Literal

import requests

from adapters.benchmark import AgentInfrastructureError, BenchmarkResult, OutcomeKind
from adapters.transfer_errors import BROKEN_TRANSFER
from adapters.waa.errors import WAAConnectionError, WAAError, WAAHTTPError


class Fault(str, enum.Enum):
    """Whose fault one failed call to the WAA server was."""

    AGENT = "agent"  # R3/R5: the agent caused the state; a failed step it can see
    ENVIRONMENT = "environment"  # R1: the server failed; the attempt is not a measurement
    TASK_DATA = "task_data"  # R6: the task's own data cannot be set up


class EnvironmentFault(Exception):
    """The WAA server failed a well-formed request for its own reasons (R1): never scored.

    `route` names the call, `message` carries the server's own words, `phase` says where in the
    attempt it happened (setup, observation, action, evaluation).
    """

    def __init__(self, phase: str, route: str, message: str) -> None:
        super().__init__(f"server failed {route} during {phase}: {message}")
        self.phase = phase
        self.route = route
        self.message = message

    @classmethod
    def from_error(cls, phase: str, error: WAAError) -> "EnvironmentFault":
        return cls(phase, error.endpoint, error.message)


_FAILSAFE_MARKERS = ("fail-safe", "failsafe")
# R4: the message of an AttributeError on WAA's computer.mouse / .keyboard / .clipboard = None.
_COMPUTER_UNSET = re.compile(r"'NoneType' object has no attribute")
# R5: lxml's refusal to serialize a control character.
_XML_INCOMPATIBLE = "XML compatible"
# R6: Windows' "file not found" / "path not found" from subprocess, os or file.save on the VM.
_MISSING_ON_VM = re.compile(
    r"\[WinError (2|3)\]|\[Errno 2\]|cannot find the (file|path) specified|No such file or directory", re.IGNORECASE
)
# R9: the server's open() of a folder, as its 500 message says it (Python's OSError text).
_FOLDER_OPENED = re.compile(r"\[Errno (13|21)\] (Permission denied|Is a directory)")
_UNSUPPORTED_PARAMETER = re.compile(r"not supported", re.IGNORECASE)
# XML 1.0 allows \t \n \r among the C0 controls; lxml refuses the rest (and NUL).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def is_failsafe(error: WAAError) -> bool:
    """pyautogui's fail-safe fired: the pointer is in a screen corner (R3)."""
    return any(marker in error.message.lower() for marker in _FAILSAFE_MARKERS)


def is_computer_unset(error: WAAError) -> bool:
    """The server's computer.* objects are None: it restarted or never had /update_computer (R4)."""
    return isinstance(error, WAAHTTPError) and bool(_COMPUTER_UNSET.search(error.message))


def is_unreadable_tree(error: WAAError) -> bool:
    """/accessibility refused a control character in some window's text (R5)."""
    return isinstance(error, WAAHTTPError) and _XML_INCOMPATIBLE in error.message


def has_control_characters(text: str) -> bool:
    """Whether typing `text` would leave characters that WAA's tree serializer refuses (R5)."""
    return bool(_CONTROL.search(text))


def classify_action_error(error: WAAError) -> Fault:
    """A failed action call (/execute, /execute_windows, /update_computer): R1, R3, R4."""
    if isinstance(error, WAAConnectionError):
        return Fault.ENVIRONMENT
    if is_failsafe(error):
        return Fault.AGENT
    # Everything else the server answered with an error status: our request was well formed
    # (the action code is ours, built from a validated action), so the server failed it.
    return Fault.ENVIRONMENT


def classify_command_failure(authored_by: Literal["harness", "agent"]) -> Fault:
    """A command that ran on the VM and failed (`/execute` answered 200 with a non-zero
    returncode): R1 for code the harness translated from a checked action (the VM failed to carry
    out a well-formed action: an OS error, a locked session), R3 for code the agent wrote."""
    return Fault.AGENT if authored_by == "agent" else Fault.ENVIRONMENT


def classify_tree_error(error: WAAError, agent_typed_control_characters: bool) -> Fault:
    """A failed /accessibility call: the agent's own doing only under R5, else R1."""
    if is_unreadable_tree(error) and agent_typed_control_characters:
        return Fault.AGENT
    return Fault.ENVIRONMENT


def classify_setup_error(error: WAAError) -> Fault:
    """A failed setup call (R6): server trouble is infrastructure, the task's data is not."""
    if isinstance(error, WAAConnectionError):
        return Fault.ENVIRONMENT
    if isinstance(error, WAAHTTPError) and 400 <= error.status < 500:
        return Fault.TASK_DATA  # the server refused what the task asked for (missing file, window...)
    if _MISSING_ON_VM.search(error.message) or _UNSUPPORTED_PARAMETER.search(error.message):
        return Fault.TASK_DATA
    return Fault.ENVIRONMENT


def classify_download_error(error: requests.RequestException) -> Fault:
    """A host-side download for a setup step (R6): the network or a failing file host is
    infrastructure; a URL the host refuses (4xx) is the task's data."""
    if isinstance(error, BROKEN_TRANSFER):
        return Fault.ENVIRONMENT
    response = getattr(error, "response", None)
    if response is not None and response.status_code >= 500:
        return Fault.ENVIRONMENT
    return Fault.TASK_DATA


def agent_error_outcome(error: BaseException) -> OutcomeKind:
    """An exception from the agent's `act`: its model endpoint failing is infrastructure of the
    agent's backend (R8); anything else it raised (a crash, an unparseable reply) is its own."""
    if isinstance(error, AgentInfrastructureError):
        return OutcomeKind.INFRASTRUCTURE_ERROR
    return OutcomeKind.AGENT_FAILURE


def episode_time_outcome(agent_seconds: float, env_seconds: float, agent_limit: float,
                         env_limit: float) -> tuple[OutcomeKind, str] | None:
    """R7: whether an episode has run out of time, whose time it was and the reason to store
    (both times in it); None while both are within their limits. The environment's time is
    looked at first: an agent whose turn came late because the server was slow is not charged."""
    spent = f"the agent {agent_seconds:.1f} s, the environment (WAA server) {env_seconds:.1f} s"
    if env_seconds > env_limit:
        return OutcomeKind.INFRASTRUCTURE_ERROR, (
            f"episode ran out of time because the server was slow: the environment's time passed its limit of "
            f"{env_limit:g} s ({spent}; attempt not scored)")
    if agent_seconds > agent_limit:
        return OutcomeKind.TIMEOUT, f"the agent's time ran out: past its limit of {agent_limit:g} s ({spent})"
    return None


def stage_timeout_outcome(stage: str, waiting_on_agent: bool) -> OutcomeKind:
    """A stage past its hard wall-clock limit (R7): blocked on the agent is the agent's timeout;
    blocked on the WAA server (reset, setup, evaluate, or the environment inside an episode)
    is infrastructure."""
    return OutcomeKind.TIMEOUT if stage == "episode" and waiting_on_agent else OutcomeKind.INFRASTRUCTURE_ERROR


Scoring = Literal["strict", "waa-compat"]
"""How a server failure during evaluation counts (R9): "strict" (the default) makes the attempt
an infrastructure error, never scored; "waa-compat" scores it as WAA's own evaluator does."""

SCORING_MODES: dict[str, str] = {
    "strict": "a server failure during evaluation is an infrastructure error, never scored",
    "waa-compat": "a server's error answer during evaluation is scored as WAA scores it (mostly None, so 0)",
}
"""Every scoring mode and what it means, as reports show it beside a rate."""


def scoring_text(mode: str | None) -> str:
    """One line for reports, e.g. "scoring: strict (a server failure during evaluation is ...)";
    runs recorded before the option existed say so (they scored such failures as WAA does)."""
    if mode is None:
        return "scoring: not recorded (run from before schema 7: a server error answer during evaluation was scored as WAA scores it)"
    return f"scoring: {mode} ({SCORING_MODES.get(mode, 'unknown mode')})"


def classify_evaluation_call_error(error: WAAError, agent_typed_control_characters: bool = False) -> Fault | None:
    """A getter's failed call to the VM during evaluation (R9): ENVIRONMENT when the server
    failed it for its own reasons (unreachable, dropped, deadline, 5xx), TASK_DATA when a 5xx
    names a file or program the VM lacks, AGENT for a tree the agent made unreadable (R5), None
    for an answer that carries the server's verdict (4xx: WAA's getter semantics apply)."""
    if isinstance(error, WAAConnectionError):
        return Fault.ENVIRONMENT
    if not isinstance(error, WAAHTTPError) or 400 <= error.status < 500:
        return None
    if error.status < 400:  # a success answer the client could not read (not JSON): garbled
        return Fault.ENVIRONMENT
    if is_unreadable_tree(error) and agent_typed_control_characters:
        return Fault.AGENT
    if _MISSING_ON_VM.search(error.message):
        return Fault.TASK_DATA
    return Fault.ENVIRONMENT


def is_folder_read(error: WAAError, path: str, is_folder: Callable[[str], bool]) -> bool:
    """R9: whether a failed `/file` read of `path` failed because the task names a folder there.

    Only a 5xx whose message is the server's open() refusing it counts, and only when the VM
    says `path` is a folder (`is_folder`, asked only then): Windows answers a folder with the
    same "[Errno 13] Permission denied" as a file another program holds open, which stays
    infrastructure like every other 5xx."""
    if not isinstance(error, WAAHTTPError) or error.endpoint != "/file" or error.status < 500:
        return False
    return bool(_FOLDER_OPENED.search(error.message)) and is_folder(path)


def evaluation_error_outcome(error: BaseException) -> OutcomeKind | None:
    """R9, for an exception inside the evaluator: the VM or the host's network out of reach is
    infrastructure, a spec the evaluator cannot carry out is an evaluation error; None leaves
    the exception to WAA's own rule for where it happened (score 0, or an evaluation error)."""
    if isinstance(error, (WAAConnectionError, EnvironmentFault)):
        return OutcomeKind.INFRASTRUCTURE_ERROR
    # The evaluator's own errors say which outcome they produce (adapters/waa/evaluator/errors.py).
    outcome = getattr(error, "outcome", None)
    return outcome if isinstance(outcome, OutcomeKind) else None


def evaluation_outcome(kind: str, score: float) -> OutcomeKind:
    """R9: the outcome of an evaluation the evaluator reported as `kind` with `score`."""
    if kind == "scored":
        return OutcomeKind.SUCCESS if score >= 1.0 else OutcomeKind.AGENT_FAILURE
    if kind == "infrastructure_error":
        return OutcomeKind.INFRASTRUCTURE_ERROR
    return OutcomeKind.EVALUATION_ERROR


# R11: an evaluation getter's server failure, as the evaluator words it (adapters/waa/evaluator/
# engine.py `_stop_on_server_failure`): "<getter>: the server failed <route>: <message> (not scored...".
_EVALUATION_SERVER_FAILURE = re.compile(
    r"^(?P<where>[^\n]*?): the server failed (?P<route>/\S+): (?P<message>.*?) \(not scored", re.S)


def evaluation_fault_signature(result: BenchmarkResult) -> str | None:
    """R11: what an attempt's evaluation failed on, as a key two attempts can share (the getter,
    the route and the server's own message); None unless the attempt is an infrastructure error
    a server's answer caused during evaluation (a VM out of reach is never the task's fault)."""
    if result.outcome is not OutcomeKind.INFRASTRUCTURE_ERROR or "evaluate" not in result.timings:
        return None
    found = _EVALUATION_SERVER_FAILURE.match(result.error or "")
    if found is None:
        return None
    return f"{found['where']}: {found['route']} answered {' '.join(found['message'].split())!r}"


class RepeatedFaults:
    """R11 over one run: which evaluation faults repeated for a task, and which other tasks met
    them. Shared by the run's lanes (thread-safe)."""

    def __init__(self) -> None:
        self._tasks: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def judge(self, previous: BenchmarkResult | None, current: BenchmarkResult) -> BenchmarkResult:
        """`current` as it counts: an `evaluation_error` (not retried) when `previous`, the
        task's attempt before it (from its own fresh reset), failed its evaluation the same way
        and no other task of the run did; else `current` unchanged."""
        signature = evaluation_fault_signature(current)
        if signature is None:
            return current
        with self._lock:
            tasks = self._tasks.setdefault(signature, set())
            tasks.add(current.task_id)
            others = sorted(tasks - {current.task_id})
        if previous is None or evaluation_fault_signature(previous) != signature or others:
            return current
        where = (f"twice on VM {current.vm_id}, from a fresh reset each time" if previous.vm_id == current.vm_id
                 else f"on VM {previous.vm_id}, then on a fresh VM {current.vm_id}")
        reason = (f"evaluation error: the evaluation failed the same way {where} ({signature}): a fault that "
                  "repeats goes with the task or its data, not with a VM (R11; not retried again)")
        return current.model_copy(update={"outcome": OutcomeKind.EVALUATION_ERROR, "error": reason, "reason": reason})
