"""The core install has no model SDKs (they are the `models` extra): the main job runs without
them, and a model agent or the doctor's model check says which extra to install, in one line.

Each check runs in a fresh interpreter in which `import openai` / `import anthropic` fails as it
does where the package is not installed (a `None` entry in `sys.modules` makes the import raise
ImportError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_WITHOUT_SDKS = """
import sys
sys.modules["openai"] = None
sys.modules["anthropic"] = None
from flows.cli import main
code = main({argv!r})
assert "openai" not in sys.modules or sys.modules["openai"] is None
sys.exit(code)
"""


def _arena_without_sdks(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`arena ARGV` run in tmp_path/work, with its own home."""
    (tmp_path / "work").mkdir()
    return subprocess.run([sys.executable, "-c", _WITHOUT_SDKS.format(argv=argv)], cwd=tmp_path / "work",
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), **env})


@pytest.mark.parametrize("argv, env, sdk", [
    (["run", "--agent", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"], {}, "openai"),
    (["run", "--agent", "anthropic", "--model", "m"], {"ANTHROPIC_API_KEY": "k"}, "anthropic"),
    (["run", "--agent", "claude"], {"ANTHROPIC_API_KEY": "k"}, "anthropic"),
])
def test_a_model_agent_without_its_sdk_names_the_extra(argv: list[str], env: dict[str, str], sdk: str,
                                                       tmp_path: Path) -> None:
    done = _arena_without_sdks(argv, tmp_path, **env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"arena: error: the {sdk} SDK is not installed; the model agents need the 'models' extra: "
                           "pip install -e '.[models]'\n")
    assert list((tmp_path / "work").iterdir()) == []  # refused before anything was written


def test_the_doctor_says_which_extra_brings_the_sdk(tmp_path: Path) -> None:
    done = _arena_without_sdks(["doctor", "--agent", "openai", "--base-url", "http://127.0.0.1:9/v1"], tmp_path)
    assert done.returncode == 1
    assert "FAIL  model endpoint (openai): the openai SDK is not installed" in done.stdout
    assert "fix: pip install -e '.[models]'" in done.stdout
