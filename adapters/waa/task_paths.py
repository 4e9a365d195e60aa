"""The fields of a WAA task that name files on the evaluation host, checked before anything runs.

A task file is data from outside (a downloaded suite may be hostile), and a few of its fields
become paths on the controller: an evaluator getter's ``dest`` (where a VM file is copied), a
``cache_file`` ``path``, the ``stdout``/``stderr`` file an ``execute`` step saves its output to,
the base name a download is cached under, and a ``rule`` value a file-reading metric would open.
`host_path_problems` lists every such field that would lead out of its folder; the catalog refuses
a task with one when it loads (one line naming the file and the field), `arena tasks lint` reports
them (rule ``path-outside-folder``) and the /evaluate endpoint answers 400. At run time every
write still goes through `adapters/host_paths.inside`.

A ``vm_file`` getter with ``time_suffix`` writes under another name than its ``dest``: WAA puts
today's date, formatted by the task's own ``time_format``, into it (`time_suffixed`). That format
is task data too (``"/../../x"`` is a valid one), so the check looks at the name the getter will
write, made by the same function the getter uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import PureWindowsPath
from typing import Any

from adapters.host_paths import escape_problem

# Setup step parameters naming a file in the task's cache dir (WAA's SetupController joins them
# with its cache dir).
_OUTPUT_PARAMETERS = {"execute": ("stdout", "stderr"), "command": ("stdout", "stderr")}


def host_path_problems(raw: Any) -> list[tuple[str, str]]:
    """(field, problem) for every field of the task `raw` that names a host file outside its
    folder; empty when there is none (or when `raw` is not shaped like a task: the catalog's own
    checks name that)."""
    if not isinstance(raw, dict):
        return []
    found = list(_step_problems(raw.get("config"), "config"))
    evaluator = raw.get("evaluator")
    if isinstance(evaluator, dict):
        found += _step_problems(evaluator.get("postconfig"), "evaluator.postconfig")
        found += _getter_problems(evaluator)
    return found


def _step_problems(steps: Any, where: str) -> Iterator[tuple[str, str]]:
    if not isinstance(steps, list):
        return
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or not isinstance(step.get("parameters"), dict):
            continue
        parameters, kind = step["parameters"], step.get("type")
        for name in _OUTPUT_PARAMETERS.get(kind, ()):  # type: ignore[arg-type]
            value = parameters.get(name)
            if value:  # WAA saves nothing for an empty or missing name
                yield from _problem(f"{where}[{index}].parameters.{name}", value)
        if kind == "download" and isinstance(parameters.get("files"), list):
            for position, entry in enumerate(parameters["files"]):
                path = entry.get("path") if isinstance(entry, dict) else None
                if isinstance(path, str) and path:
                    # The VM path is the VM's business; its base name names the host's cached copy.
                    base = PureWindowsPath(path.replace("/", "\\")).name or path
                    yield from _problem(f"{where}[{index}].parameters.files[{position}].path", base)


def _entries(evaluator: dict[str, Any], key: str) -> Iterator[tuple[str, int | None, Any]]:
    value = evaluator.get(key)
    if isinstance(value, list):
        for index, entry in enumerate(value):
            yield f"evaluator.{key}[{index}]", index, entry
    elif value is not None:
        yield f"evaluator.{key}", None, value


def _getter_problems(evaluator: dict[str, Any]) -> Iterator[tuple[str, str]]:
    funcs = evaluator.get("func")
    names = funcs if isinstance(funcs, list) else [funcs]
    for role, argument in (("result", 0), ("expected", 1)):
        for where, index, entry in _entries(evaluator, role):
            if not isinstance(entry, dict):
                continue
            dests = entry.get("dest")
            if isinstance(dests, list):
                for position, dest in enumerate(dests):
                    yield from _problem(f"{where}.dest[{position}]", dest)
            elif "dest" in entry:
                found = list(_problem(f"{where}.dest", dests))
                yield from found or _suffixed_problem(f"{where}.dest", entry, dests)
            if entry.get("type") == "cache_file" and "path" in entry:
                yield from _problem(f"{where}.path", entry["path"])
            metric = names[index or 0] if index is None or index < len(names) else None
            if entry.get("type") == "rule" and _reads_file(metric, argument):
                for position, value in _strings(entry.get("rules")):
                    yield f"{where}.rules{position}", (
                        f"{value!r:.120} would be opened as a host file by metric {metric}; a rule cannot name a "
                        "file (use cloud_file, vm_file or cache_file)"
                    )


DEFAULT_TIME_FORMAT = "%Y_%m_%d"  # WAA's get_vm_file


def time_suffixed(name: str, stamp: str) -> str:
    """WAA's time_suffix: `stamp` inserted before the first '.' of `name`, of the rest only the
    next '.'-part kept (``report.final.txt`` -> ``report<stamp>.final``); a name without '.' is
    kept as it is."""
    if "." not in name:
        return name
    parts = name.split(".")
    return f"{parts[0]}{stamp}.{parts[1]}"


def time_stamp(config: dict[str, Any], now: datetime | None = None) -> str:
    """The stamp a vm_file getter with `time_suffix` inserts: now in the task's `time_format`."""
    return (now or datetime.now()).strftime(config.get("time_format", DEFAULT_TIME_FORMAT))


def _suffixed_problem(field: str, entry: dict[str, Any], dest: Any) -> Iterator[tuple[str, str]]:
    """The problem of the name a single-file vm_file getter with `time_suffix` writes instead of
    `dest` (today's; the date's own digits cannot lead anywhere, the format's text can)."""
    if entry.get("type") != "vm_file" or entry.get("multi", False) or not entry.get("time_suffix") \
            or not isinstance(dest, str):
        return
    time_format = entry.get("time_format", DEFAULT_TIME_FORMAT)
    if not isinstance(time_format, str):
        yield field, f"time_format must be a strftime format (a string), got {type(time_format).__name__}"
        return
    try:
        final = time_suffixed(dest, time_stamp(entry))
    except ValueError as exc:  # a format strftime refuses
        yield field, f"time_format {time_format!r:.80} is not a date format: {exc}"
        return
    for _, problem in _problem(field, final):
        yield field, f"{problem} (the name time_suffix makes of {dest!r:.60} with time_format {time_format!r:.60})"


def _reads_file(metric: Any, argument: int) -> bool:
    """Whether positional argument `argument` of `metric` is a host file path."""
    from adapters.waa.evaluator.metrics import FILE_ARGUMENTS  # the evaluator's registry, loaded on demand

    return isinstance(metric, str) and FILE_ARGUMENTS.get(metric, 0) > argument


def _strings(value: Any) -> Iterator[tuple[str, str]]:
    """The strings a metric would take as paths: the value itself or the items of a list."""
    if isinstance(value, str):
        yield "", value
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str):
                yield f"[{index}]", item


def _problem(field: str, name: Any) -> Iterator[tuple[str, str]]:
    problem = escape_problem(name)
    if problem is not None:
        yield field, problem
