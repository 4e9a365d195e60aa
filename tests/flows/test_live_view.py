"""The live view (flows/live_view.py): a page on 127.0.0.1 with each lane's latest screen, task,
step and last action; screens served by lane only; a non-loopback address only with a token; the
page and its server gone with the block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from PIL import Image

from adapters.benchmark import ActionType, BenchmarkAction, StepRecord
from adapters.episode import EpisodeOutcome
from flows.live_view import LiveBoard, LiveView, current_url


def _screens(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for index in range(count):
        Image.new("RGB", (64, 40), (index * 40, 0, 0)).save(folder / f"step_{index:03d}.png")


def test_the_page_shows_each_lane_and_its_latest_screen(tmp_path: Path) -> None:
    board = LiveBoard()
    episode = EpisodeOutcome()
    action = BenchmarkAction(type=ActionType.TYPE, text="hello <b>")
    episode.steps.append(StepRecord(index=0, action=action))
    episode.last_action, episode.phase = action, "agent"
    _screens(tmp_path / "a" / "attempt-1", 3)
    board.attempt_started("waa-1", "notepad-append-line", 1, 1, episode, tmp_path / "a" / "attempt-1",
                          {"vnc": "127.0.0.1:5901", "vnc_password_file": "/run/x/vm-1.vnc-password"})
    with LiveView(board) as view:
        assert view.url.startswith("http://127.0.0.1:") and current_url() == view.url
        page = requests.get(view.url, timeout=10).text
        assert "notepad-append-line" in page and "step 1" in page and "http-equiv='refresh'" in page
        assert "hello &lt;b&gt;" in page and "<b>'" not in page  # what an agent typed is data
        assert "vncviewer 127.0.0.1:5901 (password in /run/x/vm-1.vnc-password)" in page
        screen = requests.get(view.url.rstrip("/") + "/screen/waa-1", timeout=10)
        assert screen.status_code == 200 and screen.content == (tmp_path / "a" / "attempt-1" / "step_002.png").read_bytes()
        state = requests.get(view.url.rstrip("/") + "/state.json", timeout=10).json()
        assert state[0]["vm"] == "waa-1" and state[0]["last_action"] and state[0]["phase"] == "agent"
        for path in ("/screen/../../etc/passwd", "/screen/nobody", "/anything"):
            assert requests.get(view.url.rstrip("/") + path, timeout=10).status_code == 404
        board.attempt_ended("waa-1")
        assert "No attempt is running now" in requests.get(view.url, timeout=10).text
    assert current_url() is None
    with pytest.raises(requests.ConnectionError):
        requests.get(view.url, timeout=2)


def test_beyond_loopback_only_with_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARENA_LIVE_HOST", "0.0.0.0")
    with pytest.raises(ValueError, match="set ARENA_LIVE_TOKEN"):
        LiveView(LiveBoard())
    monkeypatch.setenv("ARENA_LIVE_TOKEN", "a-token-of-enough-length")
    with LiveView(LiveBoard()) as view:
        assert view.url.endswith("/?token=a-token-of-enough-length")
        bare = view.url.split("?")[0].replace("0.0.0.0", "127.0.0.1")
        assert requests.get(bare, timeout=10).status_code == 401
        assert requests.get(bare + "?token=a-token-of-enough-length", timeout=10).status_code == 200
        assert json.loads(requests.get(bare + "state.json?token=a-token-of-enough-length", timeout=10).text) == []


def test_a_real_run_shows_its_lanes_while_it_goes(prefect_server: None, tmp_path: Path) -> None:
    """The bundled notepad tasks on the local environment (its quirks: a slow start and late
    windows, so each episode lasts a while): the page lists each VM's task and step, and serves
    the screen its agent sees; once the run ends, no lane is left."""
    import threading
    import time

    from flows.evaluate_suite import run_suite
    from flows.live_view import BOARD
    from flows.run_config import SuiteRunConfig

    seen: list[dict] = []
    screens: list[bytes] = []
    config = SuiteRunConfig(domains=["notepad"], pool_size=2, quirks=True, db_path=tmp_path / "arena.duckdb",
                            artifacts_dir=tmp_path / "art", run_id="live-real")
    with LiveView() as view:
        runner = threading.Thread(target=run_suite, args=(config,))
        runner.start()
        deadline = time.monotonic() + 240
        while runner.is_alive() and time.monotonic() < deadline and not screens:
            state = requests.get(view.url.rstrip("/") + "/state.json", timeout=10).json()
            seen += state
            for lane in state:
                screen = requests.get(view.url.rstrip("/") + f"/screen/{lane['vm']}", timeout=10)
                if screen.status_code == 200:
                    screens.append(screen.content)
            time.sleep(0.3)
        runner.join(300)
    assert seen and {lane["task"] for lane in seen} <= {"notepad-append-line", "notepad-draft-documents",
                                                          "notepad-replace-notes", "notepad-save-as-backup",
                                                          "notepad-shopping-list-desktop",
                                                          "INF-notepad-font-comic-papyrus"}
    assert screens and screens[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert BOARD.lanes() == []
