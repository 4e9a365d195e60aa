"""`arena tasks lint DIR`: task-data problems found before any VM starts.

Each finding names the file, the field (a JSON path such as ``config[2].parameters.files[0].path``),
what is wrong and the fix. Rules (their codes):

- ``unreadable-task``: the index or a task file cannot be read as a WAA task.
- ``duplicate-id``: an id listed twice in the index, or two files claiming one id.
- ``id-mismatch``: a file whose ``id`` is not its file name (results and reports use the name).
- ``non-windows-path``: a VM-side path that cannot exist on Windows (``/home/user/...``).
- ``upload-into-missing-folder``: a download uploads into a folder of the user profile that no
  earlier step created (WAA's ``/setup/upload`` saves without creating folders: it fails).
- ``missing-program``: a launch of a program Windows lacks (``socat``, ``xdotool``, ...).
- ``unknown-setup-type`` / ``unknown-getter`` / ``unknown-metric``: names no implementation has.
- ``unfetchable-file``: a download or ``cloud_file`` URL that does not answer (``check_urls``),
  or, offline, that is missing from the download cache.
- ``infeasible-fail-only``: an infeasible task whose evaluator a bare ``FAIL`` satisfies: an agent
  that always gives up scores it (WAA-V2 removed these tasks).
- ``getter-reads-folder``: a ``vm_file`` getter whose path is a folder, known without a VM (one of
  the user profile's own folders, a folder an earlier step creates, a path ending in a backslash): WAA's
  ``/file`` answers 500 for it every time, so the task's evaluation can never succeed.
- ``path-outside-folder``: a field that names a file on the evaluation host (a getter's ``dest``,
  a ``cache_file`` path, an ``execute`` step's ``stdout``, a download's cached name, a ``rule``
  a file metric would open) leads out of its folder (absolute, ``..``): runs refuse the task
  (adapters/waa/task_paths.py).

A suite may accept rules it knowingly breaks, in ``arena-suite.toml`` beside its index::

    [lint]
    accept = ["infeasible-fail-only"]   # reported apart, not as problems
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any

from adapters.waa.catalog import TaskCatalogError, WAATaskCatalog
from adapters.waa.downloads import cached_download_path
from adapters.waa.suite_settings import SUITE_FILE, read_suite_settings
from adapters.waa.host_fetch import FetchPolicy, FetchRefused
from adapters.waa.task_paths import host_path_problems
from adapters.waa.setup_steps import SetupStepError, check_sleeps, launched_program

INDEX = "test_all.json"
RULES = (
    "unreadable-task", "duplicate-id", "id-mismatch", "non-windows-path", "upload-into-missing-folder", "missing-program",
    "unknown-setup-type", "unknown-getter", "unknown-metric", "unfetchable-file", "infeasible-fail-only",
    "path-outside-folder", "sleep-too-long", "getter-reads-folder",
)
# Programs a Windows VM lacks that real WAA tasks launch or might (Linux tools).
LINUX_PROGRAMS = frozenset({
    "socat", "xdotool", "wmctrl", "gsettings", "gnome-terminal", "nautilus", "gedit", "xdg-open", "apt",
    "apt-get", "sudo", "dpkg", "systemctl", "killall", "pkill", "google-chrome-stable",
})
# The user profile of WAA's VM and the folders Windows gives every profile.
PROFILE = PureWindowsPath(r"C:\Users\Docker")
PROFILE_FOLDERS = ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos", "AppData",
                   r"AppData\Local", r"AppData\Roaming", r"AppData\LocalLow", "Favorites", "Links", "Contacts",
                   "Saved Games", "Searches", "3D Objects")
# Setup step parameters that name a path on the VM.
_PATH_PARAMETERS = {"open": ("path",), "create_folder": ("path",), "recycle_file": ("path",),
                    "create_file": ("path",), "change_wallpaper": ("path",)}
_WINDOWS_ABSOLUTE = re.compile(r"^(?:[A-Za-z]:[\\/]|%[A-Za-z_]+%|\\\\)")


@dataclass(frozen=True)
class Finding:
    """One problem: where, which rule, what is wrong and how to fix it."""

    file: str  # relative to the suite directory
    field: str
    rule: str
    message: str
    fix: str
    task_id: str = ""

    def line(self) -> str:
        return f"{self.file}: {self.field}: [{self.rule}] {self.message}\n    fix: {self.fix}"


@dataclass
class LintReport:
    """Every finding of a suite, split into problems and those the suite accepts."""

    suite: Path
    tasks: int = 0
    problems: list[Finding] = field(default_factory=list)
    accepted: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f.line() for f in self.problems]
        by_rule: dict[str, int] = {}
        for f in self.problems:
            by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
        rules = ", ".join(f"{rule} {count}" for rule, count in sorted(by_rule.items()))
        tasks = len({f.file for f in self.problems})
        out.append(f"{len(self.problems)} problem(s) in {tasks} of {self.tasks} task file(s)"
                   + (f" ({rules})" if rules else "") + f": {self.suite}")
        if self.accepted:
            kinds = ", ".join(sorted({f.rule for f in self.accepted}))
            out.append(f"{len(self.accepted)} finding(s) accepted by {SUITE_FILE} ({kinds})")
        out += [f"note: {n}" for n in self.notes]
        return out


def accepted_rules(suite_dir: Path) -> set[str]:
    """The rules `arena-suite.toml`'s [lint] accept list names (ValueError naming the file when
    it is unreadable or names an unknown rule)."""
    accept = read_suite_settings(suite_dir).lint_accept
    unknown = sorted(accept - set(RULES))
    if unknown:
        raise ValueError(f"{Path(suite_dir) / SUITE_FILE}: [lint] accept names unknown rule(s) {', '.join(unknown)}; "
                         f"known: {', '.join(RULES)}")
    return set(accept)


def lint_suite(suite_dir: Path, *, check_urls: bool = False, offline_cache: Path | None = None,
               difficulty: str = "normal", url_timeout: float = 10.0) -> LintReport:
    """Lint every task of the suite at `suite_dir` (see the module docstring).

    URLs are checked only when asked: online with `check_urls` (one HEAD/GET per distinct URL), or
    against the download cache `offline_cache` (what an offline run would find).
    """
    suite_dir = Path(suite_dir).expanduser().resolve()
    if not suite_dir.is_dir():
        raise ValueError(f"{suite_dir}: not a task suite directory (it should hold {INDEX} and examples/)")
    report = LintReport(suite=suite_dir)
    accept = accepted_rules(suite_dir)
    findings: list[Finding] = []
    with tempfile.TemporaryDirectory(prefix="arena-lint-") as scratch:
        index = _index_without_duplicates(suite_dir, Path(scratch), findings)
        try:
            catalog = WAATaskCatalog(suite_dir, index=index, difficulty=difficulty)  # type: ignore[arg-type]
        except TaskCatalogError as exc:
            findings.append(Finding(INDEX, "(index)", "unreadable-task", str(exc), "fix the index file"))
            _split(report, findings, accept)
            return report
        _lint_tasks(catalog, suite_dir, report, findings, check_urls, offline_cache, url_timeout)
    _split(report, findings, accept)
    return report


def _index_without_duplicates(suite_dir: Path, scratch: Path, findings: list[Finding]) -> str:
    """The index to open: the suite's own, or (when it lists an id twice, which the catalog
    refuses) a copy without the repeats, each repeat a duplicate-id finding."""
    try:
        data = WAATaskCatalog.parse_json(suite_dir / INDEX, (suite_dir / INDEX).read_bytes())
    except (OSError, TaskCatalogError):
        return INDEX  # the catalog says what is wrong with it
    if not isinstance(data, dict):
        return INDEX
    seen: dict[str, str] = {}
    cleaned: dict[str, list[Any]] = {}
    for domain, ids in data.items():
        if not isinstance(ids, list):
            return INDEX
        cleaned[domain] = []
        for position, task_id in enumerate(ids):
            if isinstance(task_id, str) and task_id in seen:
                findings.append(Finding(INDEX, f"{domain}[{position}]", "duplicate-id",
                                        f"task {task_id!r} is listed again (first under {seen[task_id]!r})",
                                        "list each task once", task_id))
                continue
            seen[str(task_id)] = domain
            cleaned[domain].append(task_id)
    if cleaned == data:
        return INDEX
    copy = scratch / INDEX
    copy.write_text(json.dumps(cleaned), encoding="utf-8")
    return str(copy)


def _lint_tasks(catalog: WAATaskCatalog, suite_dir: Path, report: LintReport, findings: list[Finding],
                check_urls: bool, offline_cache: Path | None, url_timeout: float) -> None:
    urls: dict[str, list[tuple[str, str, str, str]]] = {}  # url -> [(file, field, task, cached name)]
    seen_ids: dict[str, str] = {}
    for task_id in catalog.select():
        report.tasks += 1
        path = catalog.task_path(task_id)
        rel = path.relative_to(suite_dir).as_posix()
        escapes: list[tuple[str, str]] = []
        try:
            raw = catalog.parse_json(path, path.read_bytes())  # as the loader reads it (a BOM, nesting)
            escapes = host_path_problems(raw)
            catalog.load(task_id)  # the catalog's own checks (keys, types, host paths)
        except (OSError, ValueError, TaskCatalogError) as exc:
            if not escapes:
                findings.append(Finding(rel, "(file)", "unreadable-task", str(exc).replace(str(suite_dir) + "/", ""),
                                        "make the file a JSON object with id, instruction, config and evaluator"))
                continue
        findings += [
            Finding(rel, field, "path-outside-folder", f"{field.rsplit('.', 1)[-1]} {problem}", "give a plain name "
                    "inside the task's folder, e.g. 'result.xlsx' (runs refuse this task as it is)", task_id)
            for field, problem in escapes
        ]
        file_id = raw.get("id")
        if file_id != task_id:
            findings.append(Finding(rel, "id", "id-mismatch", f"id {file_id!r} is not the file's name {task_id!r}",
                                    f'set "id": "{task_id}" or rename the file', task_id))
        if isinstance(file_id, str) and file_id in seen_ids and seen_ids[file_id] != rel:
            findings.append(Finding(rel, "id", "duplicate-id", f"id {file_id!r} is also claimed by {seen_ids[file_id]}",
                                    "give each task its own id", task_id))
        seen_ids.setdefault(str(file_id), rel)
        findings += _task_findings(rel, task_id, raw, urls)
        findings += _coverage_findings(rel, raw, task_id)
    if check_urls or offline_cache is not None:
        findings += _url_findings(urls, offline_cache, url_timeout)
    elif urls:
        report.notes.append(f"{len(urls)} download/cloud_file URL(s) not checked: pass --check-urls, or --offline "
                            "--cache-dir DIR to check the download cache")


def _split(report: LintReport, findings: list[Finding], accept: set[str]) -> None:
    for finding in findings:
        (report.accepted if finding.rule in accept else report.problems).append(finding)


def _steps(raw: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field prefix, step) for the setup steps and the evaluator's postconfig steps, in run order."""
    for i, step in enumerate(raw.get("config") or []):
        if isinstance(step, dict):
            yield f"config[{i}]", step
    for i, step in enumerate((raw.get("evaluator") or {}).get("postconfig") or []):
        if isinstance(step, dict):
            yield f"evaluator.postconfig[{i}]", step


def _task_findings(rel: str, task_id: str, raw: dict[str, Any],
                   urls: dict[str, list[tuple[str, str, str, str]]]) -> list[Finding]:
    found: list[Finding] = []
    created: set[str] = set()
    unknowable = False  # an earlier command creates folders somewhere we cannot read
    for where, step in _steps(raw):
        kind, params = step.get("type"), step.get("parameters") or {}
        if kind in ("execute", "command"):
            made, opaque = _folders_made_by(params.get("command", ""))
            created |= made
            unknowable |= opaque
        if kind == "launch":
            program = launched_program(params.get("command", ""))
            if program in LINUX_PROGRAMS:
                found.append(Finding(rel, f"{where}.parameters.command", "missing-program",
                                     f"launches {program!r}, which Windows does not have: the step does nothing",
                                     "remove the step (or launch the Windows equivalent)", task_id))
        for name in _PATH_PARAMETERS.get(str(kind), ()):
            value = params.get(name)
            if isinstance(value, str):
                found += _path_findings(rel, f"{where}.parameters.{name}", value, task_id)
        if kind == "create_folder" and isinstance(params.get("path"), str):
            created.add(_norm(params["path"]))
        if kind == "download":
            for j, entry in enumerate(params.get("files") or []):
                if not isinstance(entry, dict):
                    continue
                target, url = entry.get("path"), entry.get("url")
                field_name = f"{where}.parameters.files[{j}]"
                if isinstance(url, str):
                    urls.setdefault(url, []).append((rel, f"{field_name}.url", task_id, str(target or url)))
                if not isinstance(target, str):
                    continue
                bad = _path_findings(rel, f"{field_name}.path", target, task_id)
                found += bad
                if bad:  # the folder of a Linux path does not exist on Windows either
                    folder = target.rsplit("/", 1)[0] or "/"
                    found.append(Finding(
                        rel, f"{field_name}.path", "upload-into-missing-folder",
                        f"uploads into {folder}, which does not exist on the Windows VM: the upload fails",
                        f"upload into an existing folder, e.g. {PROFILE}\\Downloads", task_id))
                elif not unknowable:
                    missing = _missing_folder(target, created)
                    if missing:
                        found.append(Finding(
                            rel, f"{field_name}.path", "upload-into-missing-folder",
                            f"uploads into {missing}, which no earlier step creates: WAA's upload does not create "
                            "folders, so this step fails", f'add {{"type": "create_folder", "parameters": '
                            f'{{"path": {json.dumps(missing)}}}}} before it', task_id))
    evaluator = raw.get("evaluator") or {}
    for where, steps in (("config", raw.get("config")), ("evaluator.postconfig", evaluator.get("postconfig"))):
        try:  # as a run checks them before its first step: known without a VM
            check_sleeps(steps if isinstance(steps, list) else [])
        except SetupStepError as exc:
            found.append(Finding(rel, f"{where}[{exc.index}].parameters.seconds", "sleep-too-long", str(exc),
                                 "wait for what the step needs (a window, a file), not for a fixed long time",
                                 task_id))
    for where, spec in _evaluator_specs(evaluator):
        if spec.get("type") == "cloud_file":
            paths, dests = spec.get("path"), spec.get("dest")
            many = isinstance(paths, list)
            for k, url in enumerate(paths if many else [paths]):
                dest = (dests[k] if isinstance(dests, list) and k < len(dests) else dests) or url
                if isinstance(url, str):
                    urls.setdefault(url, []).append((rel, f"{where}.path" + (f"[{k}]" if many else ""), task_id,
                                                     str(dest)))
        elif spec.get("type") in ("vm_file", "vm_command_line") and isinstance(spec.get("path"), str):
            found += _path_findings(rel, f"{where}.path", spec["path"], task_id)
        if spec.get("type") == "vm_file":
            found += _folder_read_findings(rel, where, spec.get("path"), created, task_id)
    func = evaluator.get("func")
    if func == "infeasible" or (isinstance(func, list) and "infeasible" in func
                                and (len(func) == 1 or evaluator.get("conj") == "or")):
        found.append(Finding(rel, "evaluator.func", "infeasible-fail-only",
                             "a bare FAIL satisfies this evaluator: an agent that always gives up scores this task",
                             "report infeasible tasks apart from the success rate, or drop the task (WAA-V2 did)",
                             task_id))
    return found


_MAKES_FOLDER = re.compile(r"\b(?:mkdir|md|new-item|makedirs|create_folder)\b", re.IGNORECASE)
_WINDOWS_PATH_IN_TEXT = re.compile(r"[A-Za-z]:\\[^\"'\n;|&<>]*")


def _folders_made_by(command: Any) -> tuple[set[str], bool]:
    """(folders a setup command visibly creates, whether it may create others we cannot read).
    A command that makes folders names them (mkdir / New-Item -ItemType Directory ...)."""
    text = " ".join(map(str, command)) if isinstance(command, list) else str(command)
    if not _MAKES_FOLDER.search(text):
        return set(), False
    paths = {_norm(m.group(0).strip()) for m in _WINDOWS_PATH_IN_TEXT.finditer(text)}
    return paths, not paths


def _folder_read_findings(rel: str, where: str, paths: Any, created: set[str], task_id: str) -> list[Finding]:
    """A vm_file getter reading a path that is a folder whatever the VM holds: a folder of the
    profile, one an earlier step made, or a path ending in a separator."""
    many = isinstance(paths, list)
    found = []
    for k, path in enumerate(paths if many else [paths]):
        if not isinstance(path, str) or not path.strip():
            continue
        why = _known_folder(path, created)
        if why:
            found.append(Finding(
                rel, f"{where}.path" + (f"[{k}]" if many else ""), "getter-reads-folder",
                f"reads {path} as a file, but it is {why}: WAA's /file answers 500 for a folder every time, so the "
                "evaluation always fails", "name the file inside it, or check the folder with list_directory or "
                "vm_folder_exists_in_documents", task_id))
    return found


def _known_folder(path: str, created: set[str]) -> str | None:
    """Why `path` is a folder on any WAA VM (a text for the finding), or None when it may be a file."""
    if path.rstrip() != path.rstrip().rstrip("\\/"):
        return "a folder (it ends in a path separator)"
    norm = _norm(path)
    if norm in {_norm(str(PROFILE))} | {_norm(str(PROFILE / f)) for f in PROFILE_FOLDERS}:
        return "a folder of the user profile"
    if norm in created:
        return "a folder an earlier setup step creates"
    if re.fullmatch(r"[a-z]:", norm):
        return "a drive"
    return None


def _evaluator_specs(evaluator: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in ("result", "expected"):
        value = evaluator.get(key)
        if isinstance(value, dict):
            yield f"evaluator.{key}", value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    yield f"evaluator.{key}[{i}]", item


def _path_findings(rel: str, where: str, value: str, task_id: str) -> list[Finding]:
    text = value.strip()
    if text.startswith("/") or text.startswith("~/"):
        name = text.rstrip("/").rsplit("/", 1)[-1] or "file"
        return [Finding(rel, where, "non-windows-path", f"{value!r} is a Linux path; it cannot exist on the Windows VM",
                        f"use a Windows path, e.g. {PROFILE}\\Downloads\\{name}", task_id)]
    return []


def _norm(path: str) -> str:
    return str(PureWindowsPath(path.replace("/", "\\"))).rstrip("\\").lower()


def _missing_folder(target: str, created: set[str]) -> str | None:
    """The folder `target` is uploaded into when it lies in the user profile, is not a standard
    folder, and no earlier create_folder made it (or a folder under it); else None."""
    if not _WINDOWS_ABSOLUTE.match(target):
        return None
    folder = PureWindowsPath(target.replace("/", "\\")).parent
    try:
        inside = folder.relative_to(PROFILE)
    except ValueError:
        return None  # outside the profile: the task's own business
    known = {_norm(str(PROFILE))} | {_norm(str(PROFILE / f)) for f in PROFILE_FOLDERS}
    made = {c for c in created} | {_norm(str(PureWindowsPath(c).parent)) for c in created}
    for c in created:  # every ancestor of a created folder exists too
        parent = PureWindowsPath(c)
        while str(parent) != str(parent.parent):
            made.add(_norm(str(parent)))
            parent = parent.parent
    if _norm(str(folder)) in known | made or not inside.parts:
        return None
    return str(folder)


def _coverage_findings(rel: str, raw: dict[str, Any], task_id: str) -> list[Finding]:
    """Setup step types, metrics and getters that no implementation has."""
    from adapters.waa.evaluator import GETTERS, METRICS
    from adapters.waa.setup_steps import STEP_HANDLERS

    found = []
    for where, step in _steps(raw):
        kind = step.get("type")
        if isinstance(kind, str) and kind not in STEP_HANDLERS:
            found.append(Finding(rel, f"{where}.type", "unknown-setup-type", f"setup step type {kind!r} does not exist",
                                 f"use one of: {', '.join(sorted(STEP_HANDLERS))}", task_id))
    evaluator = raw.get("evaluator") or {}
    func = evaluator.get("func")
    for i, name in enumerate(func if isinstance(func, list) else [func]):
        if isinstance(name, str) and name not in METRICS:
            where = f"evaluator.func[{i}]" if isinstance(func, list) else "evaluator.func"
            found.append(Finding(rel, where, "unknown-metric", f"metric {name!r} does not exist",
                                 "use a metric WAA defines (arena tasks new --list shows them)", task_id))
    for where, spec in _evaluator_specs(evaluator):
        kind = spec.get("type")
        if isinstance(kind, str) and kind not in GETTERS:
            found.append(Finding(rel, f"{where}.type", "unknown-getter", f"getter {kind!r} does not exist",
                                 "use a getter WAA defines (arena tasks new --list shows them)", task_id))
    return found


def _url_findings(urls: dict[str, list[tuple[str, str, str, str]]], cache: Path | None,
                  timeout: float) -> list[Finding]:
    def problem(url: str) -> str | None:
        if cache is not None:
            names = {name for *_, name in urls[url]}
            if any(cached_download_path(cache, url, name).is_file() for name in names):
                return None
            return f"{url} is not in the download cache {cache}"
        return _fetch_problem(url, timeout)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = dict(zip(urls, pool.map(problem, urls)))
    found = []
    for url, why in answers.items():
        if why is None:
            continue
        fix = ("fetch it once online (any run caches it) or copy it into the cache" if cache is not None
               else "host the file where the evaluation host can reach it, or fix the URL")
        found += [Finding(rel, where, "unfetchable-file", why, fix, task_id) for rel, where, task_id, _ in urls[url]]
    return found


def _fetch_problem(url: str, timeout: float) -> str | None:
    """Why a run could not fetch `url`, asked as a run would (the same fetch policy), or None."""
    import requests

    policy = FetchPolicy.from_env()
    try:
        policy.check_url(url)
        with policy.session() as session:
            response = session.head(url, timeout=timeout, allow_redirects=True)
            if response.status_code in (403, 405):  # some hosts refuse HEAD: ask for the first byte
                response = session.get(url, timeout=timeout, stream=True, headers={"Range": "bytes=0-0"})
                response.close()
    except FetchRefused as exc:
        return f"runs would refuse to fetch it: {exc}"
    except requests.RequestException as exc:
        return f"{url} cannot be fetched: {type(exc).__name__}"
    if response.status_code >= 400:
        return f"{url} answers HTTP {response.status_code}"
    return None


def lint_many(dirs: Iterable[Path], **kwargs: Any) -> list[LintReport]:
    """`lint_suite` for each directory."""
    return [lint_suite(d, **kwargs) for d in dirs]
