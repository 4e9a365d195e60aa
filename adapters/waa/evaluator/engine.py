"""Score one WAA task: the counterpart of WAA's `DesktopEnv.evaluate()`.

`evaluate_task` follows WAA's order and arithmetic exactly:

1. the spec's `postconfig` steps run (through the caller's callback);
2. `func == "infeasible"` (the string) scores 1 iff the agent's last action is exactly "FAIL",
   else 0; for any other task a last action of exactly "FAIL" scores 0 without reading state;
3. one metric: the result getter runs (its exceptions score 0, as in WAA), the expected getter
   runs only when the spec has `expected`, and the metric is called as
   `metric(result, expected, **options)`, or `metric(result, **options)` when the expected
   value is None;
4. several metrics (`func` a list; `result`, `expected`, `options` lists of the same length,
   null expected/options entries allowed): in order, with `conj` "and" (default) returning 0 at
   the first metric that scores 0 and otherwise the mean, and "or" returning 1 at the first
   metric that scores 1 and otherwise the max. Only FileNotFoundError from a result getter is
   caught (with "and" it scores 0).

On top of WAA's score, every outcome says what kind it is and why (see `KNOWN_DEVIATIONS`).

Server failures during evaluation (adapters/outcomes.py R9): every call a getter makes to the VM
goes through `_WatchedVM`, which remembers each call the server failed for its own reasons (5xx,
a dropped connection, a deadline), also when the getter swallows the error the way WAA's does.
With `scoring="strict"` (the default) such a getter ends the evaluation as an
`infrastructure_error`: the attempt is retried and never scored. `scoring="waa-compat"` keeps
WAA's handling of a server's error answer (the getter's value, mostly None, scored: mostly 0)
for people who must reproduce WAA's numbers; a VM out of reach is infrastructure in both.

Files the agent made are bounded (adapters/waa/evaluator/archive_limits.py): `/file` stops
reading at MAX_FILE_BYTES, and every host file a metric is given is checked (its size; for an
archive, what its directory says it unpacks to) before the metric opens it.
"""

from __future__ import annotations

import inspect
import math
import ntpath
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from adapters.benchmark import OutcomeKind
from adapters.outcomes import (
    Fault,
    Scoring,
    classify_evaluation_call_error,
    evaluation_error_outcome,
    is_folder_read,
)
from adapters.waa.errors import WAAAnswerTooLarge, WAAConnectionError, WAAError, WAAHTTPError
from adapters.waa.evaluator.archive_limits import MAX_FILE_BYTES, LimitExceeded, check_file, check_size, file_too_large
from adapters.waa.evaluator.getters import GETTERS, GetterContext
from adapters.host_paths import is_inside
from adapters.waa.host_fetch import FetchPolicy
from adapters.waa.evaluator.metrics import FILE_ARGUMENTS, METRICS, metric_for
from adapters.waa.evaluator.vm import VMConnection

OutcomeKindName = Literal["scored", "evaluation_error", "infrastructure_error"]

KNOWN_DEVIATIONS: list[str] = [
    # Where our default keeps WAA's score but says more.
    "Single-metric tasks: an exception in the result getter scores 0, as in WAA, but the "
    "outcome's reason names the getter and the exception (WAA only logs it).",
    "Multi-metric tasks with conj 'and': a FileNotFoundError in a result getter scores 0 at once, "
    "as in WAA, with the cause in the reason.",
    "Multi-metric tasks with conj 'or': WAA catches a result getter's FileNotFoundError but then "
    "calls the metric with the previous metric's result state (a WAA bug, kept as the default "
    "and named in the reason); when it is the first metric there is no previous state and WAA "
    "raises UnboundLocalError, which is an evaluation_error here.",
    "Getters that read the VM through routes WAA's controller maps to None/False on any non-200 "
    "answer (/file, /execute, /file_exists, /folder_exists, /desktop_path, /documents_path, "
    "/list_directory, /accessibility) do the same with a WAAHTTPError and record the cause in the "
    "reason.",
    "vm_file_exists_in_vm_folder keeps WAA's quirk that an empty file counts as absent (0.0).",
    "system_notifications keeps WAA's quirk of returning None for a ToastEnabled value other than "
    "0 or empty.",
    # Where we deliberately do not produce WAA's number.
    "A getter call the server failed for its own reasons (5xx such as WAA's /execute 'timed out "
    "after 120 seconds', a dropped connection, a deadline) is an infrastructure_error by default "
    "(scoring 'strict'), even where WAA's getter turns it into None and scores 0; a 5xx naming a "
    "file or program the VM lacks ([WinError 2]) is an evaluation_error. scoring 'waa-compat' "
    "keeps WAA's handling of the server's error answers (adapters/outcomes.py R9).",
    "A WAAConnectionError (VM unreachable or timed out) anywhere is an infrastructure_error, never "
    "a score; WAA scores 0 when it happens in a single-metric result getter and crashes otherwise. "
    "The same holds for a connection error from the postconfig callback, and for a postconfig step "
    "the server failed for its own reasons (5xx; adapters/outcomes.py R6).",
    "cloud_file: a network failure reaching the download URL is an infrastructure_error (WAA "
    "raises); an HTTP error status is an evaluation_error naming the URL; with offline=True a URL "
    "missing from the cache is an evaluation_error naming it. Downloads are cached by sha256 of "
    "the URL (WAA caches by dest file name per task), keeping the dest file name.",
    "A metric value that is not a real number (or is NaN) is an evaluation_error; WAA scores 0 for "
    "a single metric (and crashes or misbehaves for several). A value outside [0, 1] is an "
    "evaluation_error; WAA would report it as is. bool results count as 0.0/1.0, as in WAA.",
    "Unknown getter types and metric names are evaluation_errors found before postconfig runs "
    "(WAA fails at reset with AttributeError, before the episode).",
    "Where WAA's evaluate() raises (metric exceptions, expected-getter exceptions, any exception "
    "in a multi-metric result getter other than FileNotFoundError, malformed specs) the outcome "
    "is an evaluation_error naming the cause; WAA writes no result.txt at all.",
    "Errors of our own (EvaluationConfigError: unknown names, missing optional packages, offline "
    "cache misses) are evaluation_errors even inside a single-metric result getter, where WAA "
    "would have caught an exception and scored 0.",
    "conj values other than 'and'/'or' are an evaluation_error (WAA silently takes the max without "
    "early exit).",
    "postconfig steps present but no run_postconfig callback given is an evaluation_error (the "
    "state would not be what WAA scores); an exception from the callback other than a connection "
    "error is an evaluation_error.",
    "Text files are read as UTF-8 (WAA: the platform's default encoding, UTF-8 in its container).",
    "A getter whose /file read fails because the task names a folder (the server's 500 '[Errno 13] "
    "Permission denied' or '[Errno 21] Is a directory' for a path the VM says is a folder) is an "
    "evaluation_error naming the path (WAA's getter gets None and scores 0; scoring 'waa-compat' does that).",
    "A file over archive_limits' limits (100 MiB; an archive whose directory says it unpacks past 100 MiB, "
    "a member past 32 MiB, more than 10,000 members or more than 100:1) is an evaluation_error naming the "
    "limit and the file, before it is read or unpacked; WAA reads and unpacks it whatever its size.",
]


@dataclass
class EvaluationOutcome:
    """What one evaluation concluded: a score in [0, 1], why, and per-metric details."""

    score: float
    reason: str
    kind: OutcomeKindName
    details: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"score {self.score} outside [0, 1]")

    @property
    def is_error(self) -> bool:
        return self.kind != "scored"


class _Stop(Exception):
    """Internal: ends the evaluation with an error outcome."""

    def __init__(self, kind: OutcomeKindName, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


_SUMMARY_CHARS = 200


class _WatchedVM:
    """The VM connection as getters see it: every call goes through, and each one the server
    failed (R9: `classify_evaluation_call_error`) is remembered with its fault, even when the
    getter catches the error as WAA's getters do. So is a file over the size limit
    (archive_limits.MAX_FILE_BYTES), which `/file` stops reading at that limit."""

    def __init__(self, vm: VMConnection, scoring: Scoring, agent_typed_control_characters: bool) -> None:
        self._vm = vm
        self.scoring = scoring
        self._agent_typed_control_characters = agent_typed_control_characters
        self.failures: list[tuple[Fault, WAAError]] = []
        self.over_limit: list[LimitExceeded] = []
        # WAAClient stops reading /file at the limit; a connection that cannot (an in-memory
        # test VM) has its answer checked once it is here.
        self._bounded_reads = "max_bytes" in _parameters(getattr(vm, "get_file", None))

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._vm, name)
        if not callable(target):
            return target
        return lambda *args, **kwargs: self._watched(target, *args, **kwargs)

    def _watched(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return target(*args, **kwargs)
        except WAAError as exc:
            self._note(exc)
            raise

    def _note(self, error: WAAError) -> None:
        fault = classify_evaluation_call_error(error, self._agent_typed_control_characters)
        if fault is not None and fault is not Fault.AGENT:
            self.failures.append((fault, error))

    def get_file(self, path: str) -> bytes | None:
        """POST /file, bounded by MAX_FILE_BYTES; a read of a folder is the task's fault (R9)."""
        try:
            if self._bounded_reads:
                content = self._vm.get_file(path, max_bytes=MAX_FILE_BYTES)  # type: ignore[call-arg]
            else:
                content = self._vm.get_file(path)
            if content is not None:
                check_size(path, len(content))
        except WAAAnswerTooLarge as exc:
            self.over_limit.append(file_too_large(path, exc.size))
            raise self.over_limit[-1] from None
        except LimitExceeded as exc:
            self.over_limit.append(exc)
            raise
        except WAAHTTPError as exc:
            if not is_folder_read(exc, path, self._is_folder):
                self._note(exc)
                raise
            said = exc.message.removeprefix(f"HTTP {exc.status}: ")
            self.failures.append((Fault.TASK_DATA, WAAHTTPError(
                "/file", exc.status, f"{path} is a folder on the VM, not a file: the task names a folder where its "
                f"getter reads a file ({said})")))
            raise
        except WAAError as exc:
            self._note(exc)
            raise
        return content

    def _is_folder(self, path: str) -> bool:
        """Whether the VM says `path` is a folder (/folder_exists on its parent); False when it
        cannot say."""
        folder, name = ntpath.split(path)
        exists = getattr(self._vm, "folder_exists", None)
        try:
            return bool(exists(folder, name)) if callable(exists) else False
        except WAAError:
            return False


def _parameters(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _summary(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 3] + "..."


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _raise_if_infrastructure(exc: BaseException, where: str) -> None:
    """End the evaluation when adapters/outcomes.py (rule R9) says the exception decides it."""
    outcome = evaluation_error_outcome(exc)
    if outcome is None:
        return
    detail = f"VM unreachable ({exc})" if isinstance(exc, WAAConnectionError) else str(exc)
    raise _Stop(outcome.value, f"{where}: {detail}") from exc  # type: ignore[arg-type]


# -- spec normalisation (mirrors what WAA's _set_task_info accepts) --------------------------------


@dataclass
class _Plan:
    funcs: list[str]
    results: list[Any]
    expecteds: list[Any]
    options: list[Any]
    multi: bool
    has_expected: bool


def _entry_type(entry: Any, role: str, index: int | None) -> str:
    where = role if index is None else f"{role}[{index}]"
    if not isinstance(entry, dict):
        raise _Stop("evaluation_error", f"evaluator {where} must be an object with a 'type', got {_summary(entry)}")
    if "type" not in entry:
        raise _Stop("evaluation_error", f"evaluator {where} has no 'type'")
    name = entry["type"]
    if not isinstance(name, str) or name not in GETTERS:
        raise _Stop("evaluation_error", f"unknown getter type {name!r} in evaluator {where}")
    return name


def _plan(spec: Any) -> _Plan:
    if not isinstance(spec, dict):
        raise _Stop("evaluation_error", f"evaluator spec must be an object, got {_summary(spec)}")
    if "func" not in spec:
        raise _Stop("evaluation_error", "evaluator spec has no 'func'")
    func = spec["func"]
    multi = isinstance(func, list)
    funcs = func if multi else [func]
    for name in funcs:
        if not isinstance(name, str) or name not in METRICS:
            raise _Stop("evaluation_error", f"unknown metric {name!r} in evaluator func")
    count = len(funcs)

    result = spec.get("result")
    expected = spec.get("expected")
    has_expected = "expected" in spec
    if not multi:
        if result:  # WAA resolves the getter only for a non-empty result spec
            _entry_type(result, "result", None)
        if expected:
            _entry_type(expected, "expected", None)
        return _Plan(funcs, [result], [expected], [spec.get("options", {})], False, has_expected)

    # Several metrics: `result`/`expected` may be absent or empty (WAA then has no getters, which
    # fails later, when they are used); `options` may be absent. Anything present must be a list
    # with one entry per metric (WAA asserts equal lengths).
    def as_list(key: str) -> list[Any] | None:
        if key not in spec:
            return None
        value = spec[key]
        if key != "options" and (value == {} or value == []):
            return None
        if not isinstance(value, list):
            raise _Stop(
                "evaluation_error",
                f"func lists {count} metrics but '{key}' is not a list of {count} entries: {_summary(value)}",
            )
        if len(value) != count:
            raise _Stop(
                "evaluation_error",
                f"func lists {count} metrics but '{key}' has {len(value)} entries; they must be the same length",
            )
        return value

    results = as_list("result")
    expecteds = as_list("expected")
    options = as_list("options")
    if results:
        for index, entry in enumerate(results):
            _entry_type(entry, "result", index)
    if expecteds:
        for index, entry in enumerate(expecteds):
            if entry:
                _entry_type(entry, "expected", index)
    return _Plan(
        funcs,
        results or [None] * count,
        expecteds if expecteds else [None] * count,
        [opt or {} for opt in options] if options is not None else [{}] * count,
        True,
        expecteds is not None,
    )


# -- the evaluation ------------------------------------------------------------------------------


def _get(ctx: GetterContext, entry: dict[str, Any], where: str) -> Any:
    """Run one getter. A call the server failed during it ends the evaluation (R9) unless
    scoring is "waa-compat"; then it is noted and WAA's handling stands."""
    watched = ctx.vm if isinstance(ctx.vm, _WatchedVM) else None
    mark = (len(watched.failures), len(watched.over_limit)) if watched is not None else (0, 0)
    try:
        value = GETTERS[entry["type"]](ctx, entry)
    except Exception:
        _stop_on_server_failure(ctx, watched, mark, where)
        raise
    _stop_on_server_failure(ctx, watched, mark, where)
    return value


def _stop_on_server_failure(ctx: GetterContext, watched: _WatchedVM | None, mark: tuple[int, int], where: str) -> None:
    """R9: an infrastructure_error (an evaluation_error for a file or program the VM lacks, or a
    folder read as a file) when the server failed a call of this getter; under "waa-compat" only
    a VM out of reach is. A file over the size limit ends it as an evaluation_error in both,
    even when the getter swallowed the error."""
    if watched is None:
        return
    if watched.over_limit[mark[1]:]:
        raise _Stop("evaluation_error", f"{where}: {watched.over_limit[mark[1]]}")
    failures = watched.failures[mark[0]:]
    if not failures:
        return
    unreachable = [(f, e) for f, e in failures if isinstance(e, WAAConnectionError)]
    fault, error = (unreachable or failures)[0]
    if watched.scoring == "waa-compat" and not unreachable:
        ctx.notes.append(
            f"{where}: the server failed {error.endpoint} ({error.message}); scored as WAA scores it (scoring waa-compat)"
        )
        return
    if fault is Fault.TASK_DATA:
        raise _Stop("evaluation_error", f"{where}: {error.endpoint} failed on the VM: {error.message}")
    if unreachable:
        raise _Stop("infrastructure_error", f"{where}: VM unreachable ({error}) (not scored; the attempt is retried)")
    raise _Stop(
        "infrastructure_error",
        f"{where}: the server failed {error.endpoint}: {error.message} (not scored; the attempt is retried)",
    )


def _check_host_files(name: str, arguments: tuple[Any, ...], folders: list[Path]) -> None:
    """A metric that reads host files may only be given files inside the evaluation's folders
    (what the file getters wrote); a path from anywhere else (a task's `rule` value) ends the
    evaluation before any file is opened. So does a file over archive_limits' limits (its size,
    or, for an archive such as a docx or xlsx, what its directory says it unpacks to)."""
    for position, value in enumerate(arguments[: FILE_ARGUMENTS.get(name, 0)]):
        paths = value if isinstance(value, (list, tuple)) else [value]
        role = "result" if position == 0 else "expected"
        for path in paths:
            if not isinstance(path, (str, Path)) or not str(path):
                continue
            if not is_inside(path, folders):
                raise _Stop(
                    "evaluation_error",
                    f"metric {name}: its {role} file {str(path)!r:.120} is not one the evaluation's getters "
                    "produced (outside the task's cache and download folders); refused",
                )
            try:
                check_file(path)
            except LimitExceeded as exc:
                raise _Stop("evaluation_error", f"metric {name}: its {role} file {exc}") from exc


def _call_metric(name: str, result: Any, expected: Any, options: Any, flavor: str) -> Any:
    if not isinstance(options, dict):
        raise TypeError(f"options must be an object of keyword arguments, got {_summary(options)}")
    fn = metric_for(name, flavor)
    return fn(result, expected, **options) if expected is not None else fn(result, **options)


def _checked_score(name: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real):
        raise _Stop("evaluation_error", f"{name} returned {_summary(value)}, which is not a number")
    score = float(value)
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        raise _Stop("evaluation_error", f"{name} returned {score}, outside [0, 1]")
    return score


def _explain(name: str, score: float, result: Any, expected: Any) -> str:
    shown_expected = expected["expected"] if isinstance(expected, dict) and "expected" in expected else expected
    if expected is None:
        return f"{name}: {score:g} for result {_summary(result)}"
    if name in ("exact_match", "literal_match"):
        relation = "==" if score == 1.0 else "!="
        return f"{name}: result {_summary(result)} {relation} expected {_summary(shown_expected)}"
    return f"{name}: {score:g} (result {_summary(result)}, expected {_summary(shown_expected)})"


def _detail(name: str, score: float | None, result: Any = None, expected: Any = None, error: str | None = None) -> dict[str, Any]:
    return {
        "func": name,
        "score": score,
        "result_summary": _summary(result),
        "expected_summary": _summary(expected),
        "error": error,
    }


def _with_notes(reason: str, ctx: GetterContext) -> str:
    if not ctx.notes:
        return reason
    return reason + " [" + "; ".join(dict.fromkeys(ctx.notes)) + "]"


def evaluate_task(
    evaluator_spec: dict[str, Any],
    vm: VMConnection,
    *,
    last_action: str | None,
    cache_dir: Path,
    run_postconfig: Callable[[list[dict[str, Any]]], None] | None = None,
    offline: bool = False,
    download_dir: Path | None = None,
    devtools_url: str | None = None,
    flavor: str = "waa",
    scoring: Scoring = "strict",
    agent_typed_control_characters: bool = False,
    fetch_policy: FetchPolicy | None = None,
) -> EvaluationOutcome:
    """Score a task's final state the way WAA's `DesktopEnv.evaluate()` does.

    `last_action` is the agent's last action in WAA's form ("FAIL", "DONE", code...), or None
    when it took none. `cache_dir` receives files copied from the VM (one directory per task
    attempt). `run_postconfig` runs the spec's postconfig steps. `offline` forbids downloads:
    cloud_file must find its URL in `download_dir` (default `cache_dir / "downloads"`). `flavor`
    ("waa", "waa-v2") picks the suite's own version of metrics that differ (METRIC_VARIANTS).
    `scoring` says how a getter call the server failed counts (module docstring; R9), and
    `agent_typed_control_characters` that a tree the server cannot serialize is the agent's (R5).
    `fetch_policy` says what getters may fetch on the host (default: ARENA_FETCH_ALLOW's).
    Never raises for a bad spec, a failing getter/metric or an unreachable VM: those become
    outcomes of kind evaluation_error / infrastructure_error.
    """
    if scoring not in ("strict", "waa-compat"):
        raise ValueError(f"scoring must be 'strict' or 'waa-compat', got {scoring!r}")
    ctx = GetterContext(
        vm=_WatchedVM(vm, scoring, agent_typed_control_characters), cache_dir=Path(cache_dir), offline=offline,
        download_dir=download_dir, devtools_url=devtools_url, flavor=flavor,
        fetch_policy=fetch_policy or FetchPolicy.from_env(),
    )
    details: list[dict[str, Any]] = []
    try:
        plan = _plan(evaluator_spec)
        _postconfig(evaluator_spec, run_postconfig)
        func = evaluator_spec["func"]
        if func == "infeasible":
            declared = last_action == "FAIL"
            score = 1.0 if declared else 0.0
            details.append(_detail("infeasible", score, last_action, "FAIL"))
            verdict = "is" if declared else "is not"
            return EvaluationOutcome(
                score, f"infeasible task: the agent's last action {_summary(last_action)} {verdict} exactly 'FAIL'",
                "scored", details,
            )
        if last_action == "FAIL":
            return EvaluationOutcome(
                0.0, "feasible task but the agent's last action was 'FAIL': scored 0 without reading state",
                "scored", details,
            )
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        if plan.multi:
            score, reason = _evaluate_many(plan, evaluator_spec, ctx, details)
        else:
            score, reason = _evaluate_one(plan, ctx, details)
        return EvaluationOutcome(score, _with_notes(reason, ctx), "scored", details)
    except _Stop as stop:
        return EvaluationOutcome(0.0, _with_notes(stop.reason, ctx), stop.kind, details)


def _postconfig(spec: dict[str, Any], run_postconfig: Callable[[list[dict[str, Any]]], None] | None) -> None:
    steps = spec.get("postconfig", [])
    if not isinstance(steps, list):
        raise _Stop("evaluation_error", f"evaluator postconfig must be a list of steps, got {_summary(steps)}")
    if run_postconfig is None:
        if steps:
            raise _Stop(
                "evaluation_error",
                f"the spec has {len(steps)} postconfig step(s) but no run_postconfig callback was given",
            )
        return
    try:
        run_postconfig(steps)
    except Exception as exc:  # noqa: BLE001 - classified below
        if evaluation_error_outcome(exc) is OutcomeKind.INFRASTRUCTURE_ERROR:  # R6/R9
            _raise_if_infrastructure(exc, "postconfig")
        raise _Stop("evaluation_error", f"postconfig failed: {_describe(exc)}") from exc


def _evaluate_one(plan: _Plan, ctx: GetterContext, details: list[dict[str, Any]]) -> tuple[float, str]:
    name = plan.funcs[0]
    result_spec, expected_spec, options = plan.results[0], plan.expecteds[0], plan.options[0]

    if not result_spec:
        # WAA has no result getter then and calls None(...): TypeError, caught and scored 0.
        details.append(_detail(name, 0.0, error="no result getter"))
        return 0.0, f"{name}: the spec has no result getter; WAA's call fails and it scores 0"
    try:
        result = _get(ctx, result_spec, f"result getter {result_spec['type']}")
    except _Stop:
        raise
    except Exception as exc:  # noqa: BLE001 - WAA catches every exception here and scores 0
        _raise_if_infrastructure(exc, f"result getter {result_spec['type']}")
        details.append(_detail(name, 0.0, error=_describe(exc)))
        return 0.0, f"{name}: result getter {result_spec['type']} raised {_describe(exc)}; WAA scores this 0"

    expected = None
    if plan.has_expected:
        if not expected_spec:
            raise _Stop("evaluation_error", f"{name}: 'expected' is present but empty ({_summary(expected_spec)}); WAA raises")
        try:
            expected = _get(ctx, expected_spec, f"expected getter {expected_spec['type']}")
        except _Stop:
            raise
        except Exception as exc:  # noqa: BLE001 - WAA does not catch this: the evaluation fails
            _raise_if_infrastructure(exc, f"expected getter {expected_spec['type']}")
            details.append(_detail(name, None, result, error=_describe(exc)))
            raise _Stop("evaluation_error", f"expected getter {expected_spec['type']} raised {_describe(exc)}") from exc

    score = _run_metric(name, result, expected, options, details, ctx)
    return score, _explain(name, score, result, expected)


def _run_metric(name: str, result: Any, expected: Any, options: Any, details: list[dict[str, Any]],
                ctx: GetterContext) -> float:
    flavor = ctx.flavor
    _check_host_files(name, (result, expected), [ctx.cache_dir, ctx.downloads])
    try:
        raw = _call_metric(name, result, expected, options, flavor)
    except Exception as exc:  # noqa: BLE001 - WAA does not catch metric exceptions
        _raise_if_infrastructure(exc, f"metric {name}")
        details.append(_detail(name, None, result, expected, _describe(exc)))
        raise _Stop("evaluation_error", f"metric {name} raised {_describe(exc)}") from exc
    try:
        score = _checked_score(name, raw)
    except _Stop as stop:
        details.append(_detail(name, None, result, expected, stop.reason))
        raise
    details.append(_detail(name, score, result, expected))
    return score


_MISSING = object()


def _evaluate_many(
    plan: _Plan, spec: dict[str, Any], ctx: GetterContext, details: list[dict[str, Any]]
) -> tuple[float, str]:
    conj = spec.get("conj", "and")
    if conj not in ("and", "or"):
        raise _Stop("evaluation_error", f"unknown conj {conj!r}: use 'and' or 'or'")
    if not plan.has_expected:
        raise _Stop(
            "evaluation_error",
            "func lists several metrics but the spec has no 'expected' list (WAA raises); "
            "give one entry per metric, null where a metric takes no expected value",
        )
    scores: list[float] = []
    reasons: list[str] = []
    previous_result: Any = _MISSING
    for index, name in enumerate(plan.funcs):
        result_spec = plan.results[index]
        label = f"metric {index + 1}/{len(plan.funcs)} {name}"
        if not result_spec:
            raise _Stop("evaluation_error", f"{label}: no result getter (WAA raises TypeError)")
        try:
            result = _get(ctx, result_spec, f"{label}: result getter {result_spec['type']}")
        except _Stop:
            raise
        except FileNotFoundError as exc:
            if conj == "and":
                details.append(_detail(name, 0.0, error=_describe(exc)))
                return 0.0, f"and: {label}: result getter {result_spec['type']} raised {_describe(exc)}; WAA scores 0"
            if previous_result is _MISSING:
                raise _Stop(
                    "evaluation_error",
                    f"{label}: result getter raised {_describe(exc)} and WAA then raises UnboundLocalError",
                ) from exc
            result = previous_result
            reasons.append(
                f"{label}: result getter raised {_describe(exc)}; WAA reuses the previous metric's result state"
            )
        except Exception as exc:  # noqa: BLE001 - WAA catches only FileNotFoundError here
            _raise_if_infrastructure(exc, f"{label}: result getter {result_spec['type']}")
            details.append(_detail(name, None, error=_describe(exc)))
            raise _Stop("evaluation_error", f"{label}: result getter {result_spec['type']} raised {_describe(exc)}") from exc
        previous_result = result

        expected_spec = plan.expecteds[index]
        expected = None
        if expected_spec:
            try:
                expected = _get(ctx, expected_spec, f"{label}: expected getter {expected_spec['type']}")
            except _Stop:
                raise
            except Exception as exc:  # noqa: BLE001 - not caught by WAA
                _raise_if_infrastructure(exc, f"{label}: expected getter {expected_spec['type']}")
                details.append(_detail(name, None, result, error=_describe(exc)))
                raise _Stop(
                    "evaluation_error", f"{label}: expected getter {expected_spec['type']} raised {_describe(exc)}"
                ) from exc

        score = _run_metric(name, result, expected, plan.options[index], details, ctx)
        reasons.append(_explain(name, score, result, expected))
        if conj == "and" and score == 0.0:
            return 0.0, f"and: stopped at {label} (0): " + "; ".join(reasons)
        if conj == "or" and score == 1.0:
            return 1.0, f"or: stopped at {label} (1): " + "; ".join(reasons)
        scores.append(score)
    if conj == "and":
        return sum(scores) / len(scores), "and: mean of " + "; ".join(reasons)
    return max(scores), "or: max of " + "; ".join(reasons)
