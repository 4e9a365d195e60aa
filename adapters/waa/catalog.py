"""The WAA task catalog: WAA's JSON task files turned into validated `BenchmarkTask`s.

A suite directory uses WAA's own layout (`client/evaluation_examples_windows/` upstream):

    <root>/test_all.json                      index: {"<domain>": ["<task id>", ...], ...}
    <root>/examples/<domain>/<task id>.json    the task files ("normal" difficulty)
    <root>/examples_noctxt/<domain>/<id>.json  the same tasks for WAA's `--diff_lvl hard`

Other index files (`test_small.json`, `test_custom.json`) have the same shape and are chosen with
`index=`. Everything is validated when it is read, so a malformed file fails with a
`TaskCatalogError` that names the file (absolute path) and the problem, never later inside an
episode. Nothing read from a task file is ever evaluated as code.

Task ids: the id in the index (which is also the file name) is the task id. In the real 154 WAA
tasks six files carry an `id` field different from their file name (three differ only in case,
and two pairs of files even share one `id`), and WAA's runner itself locates files and stores
results by the index id. So by default a mismatching `id` field is tolerated and reported by
`id_mismatches()`; `strict_ids=True` turns it into an error.
"""

from __future__ import annotations

import difflib
import codecs
import hashlib
import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from adapters.benchmark import BenchmarkTask
from adapters.waa.task_paths import host_path_problems

Difficulty = Literal["normal", "hard"]

# WAA's default `--max_steps` (client/run.py).
DEFAULT_MAX_STEPS = 15
# Lists and objects inside each other in a task or index file (WAA's own go 7 deep): see parse_json.
MAX_JSON_DEPTH = 64

_EXAMPLE_DIRS: dict[str, str] = {"normal": "examples", "hard": "examples_noctxt"}
_REQUIRED_KEYS: tuple[str, ...] = ("id", "instruction", "config", "evaluator")


class TaskCatalogError(ValueError):
    """A suite directory, index or task file is unusable; the message names the file and why."""


class UnknownTaskError(TaskCatalogError, KeyError):
    """A task id or domain that the index does not list.

    It is also a `KeyError` because `BenchmarkAdapter.load_task` promises one for unknown ids.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0]) if self.args else ""


def bundled_suite_dir() -> Path:
    """The directory of the task suite shipped with the package (same layout as WAA's)."""
    return Path(__file__).parent / "bundled_suite"


def _is_safe_component(name: str) -> bool:
    """True if `name` can be used as one path component (no traversal, no separators)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


class WAATaskCatalog:
    """The tasks of one WAA suite directory, one index file and one difficulty.

    The index is read and checked when the catalog is created (every listed task file must
    exist); task files are parsed and validated on first use and cached for the lifetime of the
    catalog, so the content that was loaded is also the content that `content_hash` covers.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        index: str = "test_all.json",
        difficulty: Difficulty = "normal",
        max_steps: int = DEFAULT_MAX_STEPS,
        strict_ids: bool = False,
        require_supported: bool = False,
    ) -> None:
        """Open the suite at `root` and read its index.

        Raises `TaskCatalogError` when the directory or index is missing or malformed, or when
        the index lists a task whose file does not exist. With `require_supported`, loading a
        task whose evaluator names a getter or metric this product does not implement, or whose
        setup uses an unknown step type, fails naming them (so such a task never scores).
        """
        if difficulty not in _EXAMPLE_DIRS:
            raise TaskCatalogError(f"difficulty must be 'normal' or 'hard', got {difficulty!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise TaskCatalogError(f"max_steps must be a positive integer, got {max_steps!r}")
        self._root = Path(root).expanduser().resolve()
        self._index_name = index
        self._difficulty: Difficulty = difficulty
        self._max_steps = max_steps
        self._strict_ids = strict_ids
        self._require_supported = require_supported
        self._lock = threading.Lock()
        self._raw_cache: dict[str, bytes] = {}
        self._task_cache: dict[str, BenchmarkTask] = {}

        if not self._root.is_dir():
            raise TaskCatalogError(f"{self._root}: task suite directory does not exist")
        self._index_path = self._root / index
        self._index_bytes = self._read_bytes(self._index_path, what="index file")
        self._index: dict[str, list[str]] = self._parse_index(self._index_bytes)
        # task id -> domain, for O(1) lookups; the index order lives in self._index.
        self._domain_of: dict[str, str] = {
            task_id: domain for domain, ids in self._index.items() for task_id in ids
        }
        self._check_files_exist()

    # --- properties -------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The suite directory (absolute)."""
        return self._root

    @property
    def index_path(self) -> Path:
        """The index file in use (absolute)."""
        return self._index_path

    @property
    def difficulty(self) -> Difficulty:
        """`normal` (`examples/`) or `hard` (`examples_noctxt/`)."""
        return self._difficulty

    @property
    def max_steps(self) -> int:
        """The step limit given to every task (`BenchmarkTask.time_limit_steps`)."""
        return self._max_steps

    # --- index queries ----------------------------------------------------------------------

    def domains(self) -> list[str]:
        """The domains of the index, in index order."""
        return list(self._index)

    def task_ids(self, domain: str | None = None) -> list[str]:
        """Task ids in index order, all of them or those of one domain (unknown domain: error)."""
        if domain is None:
            return [task_id for ids in self._index.values() for task_id in ids]
        self._check_domain(domain)
        return list(self._index[domain])

    def counts(self) -> dict[str, int]:
        """Number of tasks per domain, in index order."""
        return {domain: len(ids) for domain, ids in self._index.items()}

    def __len__(self) -> int:
        return len(self._domain_of)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._domain_of

    def domain_of(self, task_id: str) -> str:
        """The domain the index files `task_id` under."""
        self._check_task_id(task_id)
        return self._domain_of[task_id]

    def task_path(self, task_id: str) -> Path:
        """The JSON file of `task_id` for this catalog's difficulty."""
        self._check_task_id(task_id)
        return self._path_for(self._domain_of[task_id], task_id)

    # --- loading ----------------------------------------------------------------------------

    def load(self, task_id: str) -> BenchmarkTask:
        """The validated task `task_id`; raises `UnknownTaskError` (a KeyError) if not listed."""
        self._check_task_id(task_id)
        with self._lock:
            cached = self._task_cache.get(task_id)
        if cached is not None:
            # A copy, so a caller mutating raw_config cannot change what others get.
            return cached.model_copy(deep=True)
        task = self._build_task(task_id)
        with self._lock:
            task = self._task_cache.setdefault(task_id, task)
        return task.model_copy(deep=True)

    def tasks(
        self,
        domains: Iterable[str] | None = None,
        ids: Iterable[str] | None = None,
    ) -> list[BenchmarkTask]:
        """Tasks in index order, optionally restricted to some domains and/or some ids.

        Both filters must name only things the index lists, and an id must belong to one of
        the selected domains when both are given: a typo is an error, not an empty result.
        """
        return [self.load(task_id) for task_id in self.select(domains=domains, ids=ids)]

    def select(
        self,
        domains: Iterable[str] | None = None,
        ids: Iterable[str] | None = None,
    ) -> list[str]:
        """The task ids `tasks()` would load for these filters, in index order, without loading."""
        domain_set = None if domains is None else set(_as_names(domains))
        id_set = None if ids is None else set(_as_names(ids))
        for domain in sorted(domain_set or ()):
            self._check_domain(domain)
        for task_id in sorted(id_set or ()):
            self._check_task_id(task_id)
            if domain_set is not None and self._domain_of[task_id] not in domain_set:
                raise TaskCatalogError(
                    f"{self._index_path}: task {task_id!r} is in domain "
                    f"{self._domain_of[task_id]!r}, which the domain filter {sorted(domain_set)} excludes"
                )
        return [
            task_id
            for domain, task_ids in self._index.items()
            if domain_set is None or domain in domain_set
            for task_id in task_ids
            if id_set is None or task_id in id_set
        ]

    def content_hash(
        self,
        domains: Iterable[str] | None = None,
        ids: Iterable[str] | None = None,
    ) -> str:
        """Hex sha256 over the index file and every selected task file, for provenance.

        It covers the exact bytes of each file and its path relative to the root (so the
        difficulty is part of it), in index order; the same suite gives the same hash on any
        machine. With no filters it covers the whole index.
        """
        digest = hashlib.sha256()

        def feed(label: str, payload: bytes) -> None:
            # Length-prefixed framing so that no two different file sets hash the same.
            name = label.encode("utf-8")
            digest.update(len(name).to_bytes(8, "big") + name)
            digest.update(len(payload).to_bytes(8, "big") + payload)

        feed(self._index_name, self._index_bytes)
        for task_id in self.select(domains=domains, ids=ids):
            path = self._path_for(self._domain_of[task_id], task_id)
            feed(path.relative_to(self._root).as_posix(), self._raw(task_id))
        return digest.hexdigest()

    def id_mismatches(self) -> dict[str, str]:
        """Task ids whose file carries a different `id` field: {index id: id in the file}.

        Loads (and so validates) every task of the index.
        """
        mismatches: dict[str, str] = {}
        for task_id in self.task_ids():
            file_id = self.load(task_id).raw_config["id"]
            if file_id != task_id:
                mismatches[task_id] = file_id
        return mismatches

    # --- internals --------------------------------------------------------------------------

    def _path_for(self, domain: str, task_id: str) -> Path:
        return self._root / _EXAMPLE_DIRS[self._difficulty] / domain / f"{task_id}.json"

    def _check_domain(self, domain: str) -> None:
        if domain not in self._index:
            raise UnknownTaskError(
                f"{self._index_path}: unknown domain {domain!r}; the index has {self.domains()}"
            )

    def _check_task_id(self, task_id: str) -> None:
        if task_id in self._domain_of:
            return
        raise UnknownTaskError(f"{self._index_path}: no task {task_id!r} in the index{self._task_hint(task_id)}")

    # A suite this small is listed whole in the refusal; a larger one gets the closest ids.
    _LISTED_WHOLE = 30

    def _task_hint(self, task_id: object) -> str:
        """What to give instead of an unknown task id: its right spelling (WAA ids mix "-WOS" and
        "-wos"), the closest ids, or every id of a small suite, and where to see them all."""
        known = list(self._domain_of)
        if isinstance(task_id, str):
            same = [t for t in known if t.lower() == task_id.lower()]
            if same:
                return f" (did you mean {same[0]!r}?)"
        if len(known) <= self._LISTED_WHOLE:
            return f"; its tasks: {', '.join(known)}"
        close = difflib.get_close_matches(str(task_id), known, n=3, cutoff=0.6)
        guess = f"did you mean {' or '.join(repr(t) for t in close)}? " if close else ""
        return f" ({guess}`arena tasks list --ids --waa-dir {self._root}` lists its {len(known)} tasks)"

    @staticmethod
    def _read_bytes(path: Path, *, what: str) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise TaskCatalogError(f"{path}: {what} does not exist") from None
        except IsADirectoryError:
            raise TaskCatalogError(f"{path}: {what} is a directory, not a file") from None
        except OSError as exc:
            raise TaskCatalogError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None

    @staticmethod
    def parse_json(path: Path, data: bytes) -> Any:
        """The JSON value of the task or index file `path` (its bytes `data`), read as WAA reads
        it; `TaskCatalogError`, one line naming the file, when WAA could not read it either or
        it nests deeper than `MAX_JSON_DEPTH`.

        WAA's loader is `json.load` on the file opened as UTF-8 (not utf-8-sig), so a file that
        starts with a byte order mark fails there: it is refused here too, saying so, rather than
        accepted by a suite that would not run in WAA itself. Nesting is capped well below where
        Python's recursion gives out (the parser near 1,000 levels, copying a task near 500,
        less inside a flow's deeper stack), so a deep file is one line here, never a crash later."""
        if data.startswith(codecs.BOM_UTF8):
            raise TaskCatalogError(
                f"{path}: starts with a UTF-8 byte order mark, which WAA's own loader (json.load on the file read "
                "as UTF-8) refuses; save the file as UTF-8 without a BOM"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TaskCatalogError(f"{path}: not valid UTF-8 at byte {exc.start}") from None
        too_deep = TaskCatalogError(
            f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep (arrays or objects inside each other); "
            "task files need far fewer (WAA's own go 7 deep)"
        )
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskCatalogError(
                f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        except RecursionError:
            raise too_deep from None
        if _depth_exceeds(value, MAX_JSON_DEPTH):
            raise too_deep
        return value

    def _parse_index(self, data: bytes) -> dict[str, list[str]]:
        path = self._index_path
        parsed = self.parse_json(path, data)
        if not isinstance(parsed, dict):
            raise TaskCatalogError(
                f"{path}: index must be an object mapping domain to a list of task ids, "
                f"got {type(parsed).__name__}"
            )
        seen: dict[str, str] = {}
        index: dict[str, list[str]] = {}
        for domain, ids in parsed.items():
            if not _is_safe_component(domain):
                raise TaskCatalogError(f"{path}: domain name {domain!r} is not a plain directory name")
            if not isinstance(ids, list):
                raise TaskCatalogError(
                    f"{path}: domain {domain!r} must list task ids, got {type(ids).__name__}"
                )
            for position, task_id in enumerate(ids):
                if not isinstance(task_id, str) or not _is_safe_component(task_id):
                    raise TaskCatalogError(
                        f"{path}: domain {domain!r} entry {position} is not a plain task id: {task_id!r}"
                    )
                if task_id in seen:
                    # One id in two places would make load(id) ambiguous.
                    raise TaskCatalogError(
                        f"{path}: task {task_id!r} is listed twice (domains {seen[task_id]!r} and {domain!r})"
                    )
                seen[task_id] = domain
            index[domain] = list(ids)
        return index

    def _check_files_exist(self) -> None:
        example_dir = _EXAMPLE_DIRS[self._difficulty]
        for domain, ids in self._index.items():
            for task_id in ids:
                if not self._path_for(domain, task_id).is_file():
                    raise TaskCatalogError(
                        f"{self._index_path}: lists task {task_id!r} of domain {domain!r} but "
                        f"{example_dir}/{domain}/{task_id}.json does not exist"
                    )

    def _raw(self, task_id: str) -> bytes:
        with self._lock:
            data = self._raw_cache.get(task_id)
        if data is None:
            path = self._path_for(self._domain_of[task_id], task_id)
            data = self._read_bytes(path, what="task file")
            with self._lock:
                # First reader wins, so load() and content_hash() always agree on the bytes.
                data = self._raw_cache.setdefault(task_id, data)
        return data

    def _build_task(self, task_id: str) -> BenchmarkTask:
        domain = self._domain_of[task_id]
        path = self._path_for(domain, task_id)
        raw = self.parse_json(path, self._raw(task_id))
        _validate_task(path, raw, expected_id=task_id, strict_ids=self._strict_ids)
        task = BenchmarkTask(
            task_id=task_id,
            instruction=raw["instruction"],
            domain=domain,
            initial_state_ref=raw.get("snapshot"),
            time_limit_steps=self._max_steps,
            raw_config=raw,
            evaluation_spec=raw["evaluator"],
        )
        if self._require_supported:
            from adapters.waa.coverage import task_coverage  # the evaluator registries, loaded on demand

            coverage = task_coverage(task)
            if not coverage.supported:
                raise TaskCatalogError(f"{path}: {coverage.reason}")
        return task


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests lists and dicts more than `limit` deep; iterative, so
    it cannot itself run out of stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return False


def _as_names(values: Iterable[str]) -> list[str]:
    # A bare string is an Iterable[str] of characters; treat it as one name instead.
    if isinstance(values, str):
        return [values]
    return list(values)


def _validate_steps(path: Path, steps: Any, where: str) -> None:
    """Check a list of WAA setup steps (`config` or `evaluator.postconfig`)."""
    if not isinstance(steps, list):
        raise TaskCatalogError(f"{path}: {where} must be a list of steps, got {type(steps).__name__}")
    for position, step in enumerate(steps):
        label = f"{where} step {position + 1} (index {position})"
        if not isinstance(step, dict):
            raise TaskCatalogError(f"{path}: {label} must be an object, got {type(step).__name__}")
        if "type" not in step:
            raise TaskCatalogError(f"{path}: {label} has no 'type'")
        if not isinstance(step["type"], str) or not step["type"]:
            raise TaskCatalogError(f"{path}: {label} has a 'type' that is not a non-empty string: {step['type']!r}")
        if "parameters" in step and not isinstance(step["parameters"], dict):
            raise TaskCatalogError(
                f"{path}: {label} ({step['type']}) 'parameters' must be an object, "
                f"got {type(step['parameters']).__name__}"
            )


def _validate_evaluator(path: Path, evaluator: Any) -> None:
    """Check the evaluator's shape as WAA's DesktopEnv reads it (func, result, expected, ...)."""
    if not isinstance(evaluator, dict):
        raise TaskCatalogError(f"{path}: 'evaluator' must be an object, got {type(evaluator).__name__}")
    if "func" not in evaluator:
        raise TaskCatalogError(f"{path}: 'evaluator' has no 'func'")
    func = evaluator["func"]
    if isinstance(func, str):
        if not func:
            raise TaskCatalogError(f"{path}: 'evaluator.func' is an empty string")
        metric_count = 1
    elif isinstance(func, list):
        if not func or not all(isinstance(f, str) and f for f in func):
            raise TaskCatalogError(
                f"{path}: 'evaluator.func' must be a metric name or a non-empty list of names, got {func!r}"
            )
        metric_count = len(func)
        # WAA indexes result/expected/options by metric position, so lengths must agree.
        for key in ("result", "expected", "options"):
            value = evaluator.get(key)
            if value is not None and not (isinstance(value, list) and len(value) == metric_count):
                raise TaskCatalogError(
                    f"{path}: 'evaluator.func' lists {metric_count} metrics, so 'evaluator.{key}' "
                    f"must be a list of {metric_count} entries, got {value!r:.80}"
                )
    else:
        raise TaskCatalogError(
            f"{path}: 'evaluator.func' must be a string or a list of strings, got {type(func).__name__}"
        )
    if metric_count == 1:
        for key in ("result", "expected"):
            value = evaluator.get(key)
            if value is not None and not isinstance(value, dict):
                raise TaskCatalogError(
                    f"{path}: 'evaluator.{key}' must be an object, got {type(value).__name__}"
                )
        if "options" in evaluator and not isinstance(evaluator["options"], dict):
            raise TaskCatalogError(
                f"{path}: 'evaluator.options' must be an object, got {type(evaluator['options']).__name__}"
            )
    conj = evaluator.get("conj", "and")
    if conj not in ("and", "or"):
        raise TaskCatalogError(f"{path}: 'evaluator.conj' must be 'and' or 'or', got {conj!r}")
    if "postconfig" in evaluator:
        _validate_steps(path, evaluator["postconfig"], "'evaluator.postconfig'")


def _validate_task(path: Path, raw: Any, *, expected_id: str, strict_ids: bool) -> None:
    """Raise `TaskCatalogError` naming `path` unless `raw` is a well-formed WAA task."""
    if not isinstance(raw, dict):
        raise TaskCatalogError(f"{path}: a task file must hold a JSON object, got {type(raw).__name__}")
    for key in _REQUIRED_KEYS:
        if key not in raw:
            raise TaskCatalogError(f"{path}: missing required key {key!r}")
    if not isinstance(raw["id"], str) or not raw["id"]:
        raise TaskCatalogError(f"{path}: 'id' must be a non-empty string, got {raw['id']!r}")
    if strict_ids and raw["id"] != expected_id:
        raise TaskCatalogError(f"{path}: id {raw['id']!r} does not match file name {expected_id!r}")
    instruction = raw["instruction"]
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskCatalogError(f"{path}: 'instruction' must be a non-empty string, got {instruction!r:.80}")
    snapshot = raw.get("snapshot")
    if snapshot is not None and not isinstance(snapshot, str):
        raise TaskCatalogError(f"{path}: 'snapshot' must be a string, got {type(snapshot).__name__}")
    _validate_steps(path, raw["config"], "'config'")
    _validate_evaluator(path, raw["evaluator"])
    escapes = host_path_problems(raw)
    if escapes:
        field, problem = escapes[0]
        more = f" (and {len(escapes) - 1} more such field(s))" if len(escapes) > 1 else ""
        raise TaskCatalogError(f"{path}: {field}: {problem}; refused: a task may not name host files outside its folder{more}")
