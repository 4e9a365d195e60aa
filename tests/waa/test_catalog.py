"""Tests of the WAA task catalog against the real 154 WAA task files and broken copies of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from adapters.benchmark import BenchmarkTask
from adapters.waa.catalog import (
    TaskCatalogError,
    UnknownTaskError,
    WAATaskCatalog,
    bundled_suite_dir,
)

WAA_TASKS = Path(__file__).resolve().parents[3] / "shared" / "waa-tasks"

# WAA's published per-domain counts (test_all.json, upstream commit 6d39ed8).
WAA_COUNTS = {
    "chrome": 17, "clock": 4, "file_explorer": 19, "libreoffice_calc": 24,
    "libreoffice_writer": 19, "microsoft_paint": 3, "msedge": 13, "notepad": 2,
    "settings": 5, "vlc": 21, "vs_code": 24, "windows_calc": 3,
}
NOTEPAD_TASK = "366de66e-cbae-4d72-b042-26390db2b145-WOS"


@pytest.fixture(scope="module")
def waa_root() -> Path:
    """The real WAA task directory; the tests that need it skip when it is absent."""
    if not (WAA_TASKS / "test_all.json").is_file():
        pytest.skip(f"real WAA tasks not found at {WAA_TASKS}")
    return WAA_TASKS


@pytest.fixture(scope="module")
def catalog(waa_root: Path) -> WAATaskCatalog:
    return WAATaskCatalog(waa_root)


@pytest.fixture()
def suite_copy(waa_root: Path, tmp_path: Path) -> Path:
    """A private copy of the real suite that a test may break."""
    target = tmp_path / "suite"
    shutil.copytree(waa_root, target)
    return target


def _notepad_file(root: Path) -> Path:
    return root / "examples" / "notepad" / f"{NOTEPAD_TASK}.json"


def _rewrite(path: Path, edit) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


# --- the real suite ------------------------------------------------------------------------------


def test_loads_all_154_real_tasks(catalog: WAATaskCatalog) -> None:
    tasks = catalog.tasks()
    assert len(tasks) == 154 == len(catalog)
    assert all(isinstance(t, BenchmarkTask) for t in tasks)
    assert len({t.task_id for t in tasks}) == 154
    assert [t.task_id for t in tasks] == catalog.task_ids()


def test_counts_match_waa(catalog: WAATaskCatalog) -> None:
    assert catalog.counts() == WAA_COUNTS
    assert sorted(catalog.domains()) == sorted(WAA_COUNTS)
    assert {d: len(catalog.task_ids(d)) for d in catalog.domains()} == WAA_COUNTS


def test_infeasible_tasks(catalog: WAATaskCatalog) -> None:
    infeasible = [t for t in catalog.tasks() if t.infeasible]
    assert len(infeasible) == 13
    assert all(t.task_id.startswith("INF-") for t in infeasible)
    by_domain: dict[str, int] = {}
    for t in infeasible:
        by_domain[t.domain] = by_domain.get(t.domain, 0) + 1
    assert by_domain == {"vlc": 7, "vs_code": 5, "libreoffice_writer": 1}


def test_conversion_fields(catalog: WAATaskCatalog) -> None:
    task = catalog.load(NOTEPAD_TASK)
    raw = json.loads(_notepad_file(catalog.root).read_text(encoding="utf-8"))
    assert task.task_id == NOTEPAD_TASK
    assert task.domain == "notepad"
    assert task.instruction == raw["instruction"]
    assert task.initial_state_ref == raw["snapshot"]
    assert task.time_limit_steps == 15
    assert task.raw_config == raw
    assert task.evaluation_spec == raw["evaluator"]
    assert task.setup_steps == raw["config"]
    assert catalog.task_path(NOTEPAD_TASK) == _notepad_file(catalog.root)
    assert catalog.task_path(NOTEPAD_TASK).is_absolute()


def test_max_steps_parameter(waa_root: Path) -> None:
    assert WAATaskCatalog(waa_root, max_steps=30).load(NOTEPAD_TASK).time_limit_steps == 30
    with pytest.raises(TaskCatalogError, match="max_steps"):
        WAATaskCatalog(waa_root, max_steps=0)


def test_loaded_tasks_are_cached_and_isolated(catalog: WAATaskCatalog) -> None:
    first = catalog.load(NOTEPAD_TASK)
    first.raw_config["instruction"] = "changed by a caller"
    assert catalog.load(NOTEPAD_TASK).raw_config["instruction"] != "changed by a caller"


def test_file_ids_that_differ_from_file_names(catalog: WAATaskCatalog, waa_root: Path) -> None:
    # Six real WAA files carry an `id` that is not their file name; the index id wins.
    mismatches = catalog.id_mismatches()
    assert len(mismatches) == 6
    assert mismatches["INF-0d95d28a-9587-433b-a805-1fbe5467d598-WOS"] == (
        "INF-5ac2891a-eacd-4954-b339-98abba077adb-WOS"
    )
    strict = WAATaskCatalog(waa_root, strict_ids=True)
    with pytest.raises(TaskCatalogError) as info:
        strict.load("02F10F89-7171-4D37-8550-A00BA8930CDF-2-WOS")
    message = str(info.value)
    assert str(strict.task_path("02F10F89-7171-4D37-8550-A00BA8930CDF-2-WOS")) in message
    assert "id '02F10F89-7171-4D37-8550-A00BA8930CDF-WOS-2' does not match file name" in message
    assert strict.load(NOTEPAD_TASK).task_id == NOTEPAD_TASK


def test_hard_mode(waa_root: Path, catalog: WAATaskCatalog) -> None:
    hard = WAATaskCatalog(waa_root, difficulty="hard")
    hard_tasks = {t.task_id: t for t in hard.tasks()}
    normal_tasks = {t.task_id: t for t in catalog.tasks()}
    assert len(hard_tasks) == 154
    assert hard.counts() == WAA_COUNTS
    differing = [i for i in normal_tasks if normal_tasks[i].raw_config != hard_tasks[i].raw_config]
    assert len(differing) == 44
    reworded = [i for i in differing if normal_tasks[i].instruction != hard_tasks[i].instruction]
    assert len(reworded) == 17
    assert sum(t.infeasible for t in hard_tasks.values()) == 13
    assert "examples_noctxt" in hard.task_path(NOTEPAD_TASK).parts
    # Hard mode drops the steps that open the app for the agent.
    context_steps = {"launch", "open", "activate_window"}
    for task_id in differing:
        normal_types = [s["type"] for s in normal_tasks[task_id].setup_steps]
        hard_types = [s["type"] for s in hard_tasks[task_id].setup_steps]
        assert len(hard_types) <= len(normal_types)
        assert set(normal_types) - set(hard_types) <= context_steps


def test_other_index_files(waa_root: Path) -> None:
    small = WAATaskCatalog(waa_root, index="test_small.json")
    assert small.counts() == {"chrome": 3, "libreoffice_calc": 3}
    assert len(small.tasks()) == 6
    custom = WAATaskCatalog(waa_root, index="test_custom.json")
    assert custom.task_ids() == ["4d34ff3b-5cc8-44b2-a272-fb07927e996e-WOS"]


def test_filters(catalog: WAATaskCatalog) -> None:
    notepad = catalog.tasks(domains=["notepad"])
    assert [t.domain for t in notepad] == ["notepad", "notepad"]
    two = catalog.tasks(domains=["notepad", "clock"])
    assert len(two) == 6
    # A bare string is one domain, not a list of characters.
    assert [t.task_id for t in catalog.tasks(domains="notepad")] == [t.task_id for t in notepad]
    ids = [catalog.task_ids("vlc")[3], catalog.task_ids("chrome")[0]]
    picked = catalog.tasks(ids=ids)
    # Index order, not the order of the filter.
    assert [t.task_id for t in picked] == [i for i in catalog.task_ids() if i in ids]
    assert [t.task_id for t in catalog.tasks(domains=["vlc", "chrome"], ids=ids)] == [
        t.task_id for t in picked
    ]
    assert catalog.tasks(ids=[]) == []


def test_unknown_names_in_filters_are_errors(catalog: WAATaskCatalog) -> None:
    with pytest.raises(UnknownTaskError, match="unknown domain 'notpad'"):
        catalog.tasks(domains=["notepad", "notpad"])
    with pytest.raises(TaskCatalogError, match="no task 'nope'"):
        catalog.tasks(ids=["nope"])
    with pytest.raises(TaskCatalogError, match="which the domain filter"):
        catalog.tasks(domains=["chrome"], ids=[NOTEPAD_TASK])
    with pytest.raises(UnknownTaskError, match="unknown domain"):
        catalog.task_ids("outlook")


def test_unknown_id_is_a_key_error_naming_it(catalog: WAATaskCatalog) -> None:
    with pytest.raises(KeyError) as info:
        catalog.load("does-not-exist")
    assert isinstance(info.value, TaskCatalogError)
    assert "does-not-exist" in str(info.value)
    assert str(catalog.index_path) in str(info.value)
    # A wrong case gets a hint at the real spelling rather than a silent alias.
    with pytest.raises(UnknownTaskError, match=f"did you mean '{NOTEPAD_TASK}'"):
        catalog.load(NOTEPAD_TASK.lower())


def test_content_hash(waa_root: Path, catalog: WAATaskCatalog, suite_copy: Path) -> None:
    digest = catalog.content_hash()
    assert len(digest) == 64
    assert WAATaskCatalog(waa_root).content_hash() == digest
    assert WAATaskCatalog(suite_copy).content_hash() == digest  # location-independent
    assert WAATaskCatalog(waa_root, difficulty="hard").content_hash() != digest
    assert catalog.content_hash(domains=["notepad"]) != digest
    assert catalog.content_hash(domains=["notepad"]) == catalog.content_hash(
        ids=catalog.task_ids("notepad")
    )
    path = _notepad_file(suite_copy)
    path.write_bytes(path.read_bytes() + b"\n")
    assert WAATaskCatalog(suite_copy).content_hash() != digest


def test_bundled_suite_dir() -> None:
    path = bundled_suite_dir()
    assert path.name == "bundled_suite"
    assert path.parent == Path(__file__).resolve().parents[2] / "adapters" / "waa"
    if (path / "test_all.json").is_file():
        # Written by another component; when present it must load cleanly.
        assert WAATaskCatalog(path).tasks()


# --- broken copies: every error names the file and the problem -----------------------------------


def _load_error(root: Path, **kwargs) -> str:
    with pytest.raises(TaskCatalogError) as info:
        WAATaskCatalog(root, **kwargs).load(NOTEPAD_TASK)
    return str(info.value)


def test_invalid_json(suite_copy: Path) -> None:
    path = _notepad_file(suite_copy)
    path.write_text('{\n  "id": "x",\n  "instruction" "no colon"\n}\n', encoding="utf-8")
    message = _load_error(suite_copy)
    assert message.startswith(f"{path}: invalid JSON at line 3 column 17: Expecting ':' delimiter")


def test_not_utf8(suite_copy: Path) -> None:
    path = _notepad_file(suite_copy)
    path.write_bytes(b'{"id": "\xff"}')
    assert _load_error(suite_copy) == f"{path}: not valid UTF-8 at byte 8"


def test_bom_is_refused_as_waa_refuses_it(suite_copy: Path) -> None:
    # WAA's loader (json.load on the file opened as UTF-8) fails on a BOM: a suite that runs here
    # runs there too (tests/waa/test_task_file_reading.py has lint's side).
    path = _notepad_file(suite_copy)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert _load_error(suite_copy).startswith(f"{path}: starts with a UTF-8 byte order mark")


@pytest.mark.parametrize("key", ["id", "instruction", "config", "evaluator"])
def test_missing_required_key(suite_copy: Path, key: str) -> None:
    path = _notepad_file(suite_copy)
    _rewrite(path, lambda d: d.pop(key))
    assert _load_error(suite_copy) == f"{path}: missing required key {key!r}"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(config={"type": "launch"}), "'config' must be a list of steps, got dict"),
        (
            lambda d: d.update(config=[{"type": "sleep", "parameters": {"seconds": 1}}, {"parameters": {}}]),
            "'config' step 2 (index 1) has no 'type'",
        ),
        (lambda d: d["config"].append("sleep"), "must be an object, got str"),
        (
            lambda d: d["config"].append({"type": "sleep", "parameters": [1]}),
            "(sleep) 'parameters' must be an object, got list",
        ),
        (lambda d: d.update(evaluator=[]), "'evaluator' must be an object, got list"),
        (lambda d: d["evaluator"].pop("func"), "'evaluator' has no 'func'"),
        (lambda d: d["evaluator"].update(func=3), "'evaluator.func' must be a string or a list"),
        (
            lambda d: d["evaluator"].update(func=["exact_match", "exact_match", "exact_match"]),
            "'evaluator.func' lists 3 metrics, so 'evaluator.result' must be a list of 3 entries",
        ),
        (
            lambda d: d["evaluator"].update(func="exact_match"),
            "'evaluator.result' must be an object, got list",
        ),
        (lambda d: d["evaluator"].update(conj="xor"), "'evaluator.conj' must be 'and' or 'or'"),
        (
            lambda d: d["evaluator"].update(postconfig=[{"parameters": {}}]),
            "'evaluator.postconfig' step 1 (index 0) has no 'type'",
        ),
        (lambda d: d.update(instruction=""), "'instruction' must be a non-empty string"),
        (lambda d: d.update(id=7), "'id' must be a non-empty string, got 7"),
        (lambda d: d.update(snapshot=["notepad"]), "'snapshot' must be a string, got list"),
    ],
)
def test_malformed_task_file(suite_copy: Path, edit, expected: str) -> None:
    path = _notepad_file(suite_copy)
    _rewrite(path, edit)
    message = _load_error(suite_copy)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_task_file_not_an_object(suite_copy: Path) -> None:
    path = _notepad_file(suite_copy)
    path.write_text("[1, 2]", encoding="utf-8")
    assert _load_error(suite_copy) == f"{path}: a task file must hold a JSON object, got list"


def test_strict_id_mismatch(suite_copy: Path) -> None:
    path = _notepad_file(suite_copy)
    _rewrite(path, lambda d: d.update(id="x"))
    assert _load_error(suite_copy, strict_ids=True) == (
        f"{path}: id 'x' does not match file name '{NOTEPAD_TASK}'"
    )
    # Lenient by default (as WAA's own runner), with the mismatch reported.
    assert WAATaskCatalog(suite_copy).load(NOTEPAD_TASK).raw_config["id"] == "x"


def test_missing_task_file(suite_copy: Path) -> None:
    _notepad_file(suite_copy).unlink()
    with pytest.raises(TaskCatalogError) as info:
        WAATaskCatalog(suite_copy)
    assert str(info.value) == (
        f"{suite_copy / 'test_all.json'}: lists task {NOTEPAD_TASK!r} of domain 'notepad' but "
        f"examples/notepad/{NOTEPAD_TASK}.json does not exist"
    )


def test_missing_hard_mode_directory(suite_copy: Path) -> None:
    shutil.rmtree(suite_copy / "examples_noctxt")
    WAATaskCatalog(suite_copy)  # normal mode does not need it
    with pytest.raises(TaskCatalogError, match=r"examples_noctxt/\w+/.*\.json does not exist"):
        WAATaskCatalog(suite_copy, difficulty="hard")


def test_index_problems(suite_copy: Path, tmp_path: Path) -> None:
    index = suite_copy / "test_all.json"
    with pytest.raises(TaskCatalogError, match="no_such.json: index file does not exist"):
        WAATaskCatalog(suite_copy, index="no_such.json")
    with pytest.raises(TaskCatalogError, match="task suite directory does not exist"):
        WAATaskCatalog(tmp_path / "absent")

    cases = [
        ('{"notepad": ["a",]}', "invalid JSON at line 1 column 18"),
        ('["notepad"]', "index must be an object mapping domain to a list of task ids, got list"),
        ('{"notepad": "abc"}', "domain 'notepad' must list task ids, got str"),
        ('{"notepad": ["../../etc/passwd"]}', "entry 0 is not a plain task id: '../../etc/passwd'"),
        ('{"../x": []}', "domain name '../x' is not a plain directory name"),
        (
            json.dumps({"notepad": [NOTEPAD_TASK], "clock": [NOTEPAD_TASK]}),
            f"task {NOTEPAD_TASK!r} is listed twice (domains 'notepad' and 'clock')",
        ),
    ]
    for text, expected in cases:
        index.write_text(text, encoding="utf-8")
        with pytest.raises(TaskCatalogError) as info:
            WAATaskCatalog(suite_copy)
        assert str(info.value).startswith(f"{index}: "), text
        assert expected in str(info.value), text


def test_bad_difficulty(waa_root: Path) -> None:
    with pytest.raises(TaskCatalogError, match="difficulty must be 'normal' or 'hard'"):
        WAATaskCatalog(waa_root, difficulty="easy")  # type: ignore[arg-type]


def test_one_broken_file_does_not_hide_the_others(suite_copy: Path) -> None:
    _notepad_file(suite_copy).write_text("{", encoding="utf-8")
    catalog = WAATaskCatalog(suite_copy)
    assert len(catalog.tasks(domains=["vlc", "chrome"])) == 38
    with pytest.raises(TaskCatalogError):
        catalog.tasks(domains=["notepad"])


def test_an_unknown_task_id_is_told_what_the_suite_has(waa_tasks_dir: Path) -> None:
    """A misspelt --task got only "no task ... in the index": a small suite now lists its ids, a
    large one the closest ones and the command that lists them all."""
    from adapters.waa.catalog import UnknownTaskError, WAATaskCatalog, bundled_suite_dir

    with pytest.raises(UnknownTaskError, match="its tasks: .*notepad-append-line.*settings-notifications-off"):
        WAATaskCatalog(bundled_suite_dir()).tasks(ids=["notepad-apend-line"])
    catalog = WAATaskCatalog(waa_tasks_dir)
    known = next(iter(catalog.tasks(domains=["vlc"]))).task_id
    with pytest.raises(UnknownTaskError) as raised:
        catalog.tasks(ids=[known[:-2] + "xx"])
    assert f"did you mean {known!r}" in str(raised.value)
    assert f"`arena tasks list --ids --waa-dir {waa_tasks_dir.resolve()}` lists its 154 tasks" in str(raised.value)
