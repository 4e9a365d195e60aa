"""docs/ says what the shipped code and configuration do: the README sections it points to exist,
its links reach files that exist, and docs/deployments.md names the baselines and defaults the
code ships (it named a default model baseline the code no longer had, and README sections that
were gone)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
README = ROOT / "README.md"


def _headings(path: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")}


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_readme_sections_a_doc_names_exist(doc: Path) -> None:
    headings = _headings(README)
    named = re.findall(r"README(?:'s)?,? \"([^\"]+)\"", doc.read_text())
    assert [n for n in named if n not in headings] == [], f"{doc.name} names README sections it does not have"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.name)
def test_links_reach_files_and_headings_that_exist(doc: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check here
            continue
        path, _, anchor = unquote(target).partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in {_slug(h) for h in _headings(file)}:
            broken.append(target)
    assert broken == [], f"{doc.name}: links to what does not exist"


def test_deployments_doc_names_the_shipped_baselines_and_defaults() -> None:
    from deployments.serve import DEFAULT_CRON, DEFAULT_TIMEZONE
    from flows.baselines import DEFAULT_BASELINE, DEFAULT_MODEL_BASELINE

    text = (ROOT / "docs" / "deployments.md").read_text()
    shipped = tomllib.loads((ROOT / "deployments" / "baselines.toml").read_text())["baselines"]
    for baseline in shipped:
        assert f"`{baseline['name']}`" in text, f"docs/deployments.md does not name the shipped {baseline['name']}"
    assert f"`ARENA_MODEL_BASELINE` (default `{DEFAULT_MODEL_BASELINE}`" in text
    assert f'baseline="{DEFAULT_MODEL_BASELINE}")`' in text
    assert f"default of `evaluate-baseline/on-demand`" in text and f"`{DEFAULT_BASELINE}`" in text
    assert f"`ARENA_NIGHTLY_CRON` (default `{DEFAULT_CRON}`)" in text and f"default `{DEFAULT_TIMEZONE}`" in text
    # The model baseline's endpoint is where the docs say to start the plan-replay server.
    model = next(b for b in shipped if b["name"] == DEFAULT_MODEL_BASELINE)
    port = re.search(r":(\d+)/", model["agent_options"]["base_url"]).group(1)
    assert f"plan_model_server --port {port}" in text and "`models` extra" in text
