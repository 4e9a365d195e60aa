"""Episode videos (adapters/results/episode_video.py) of real runs of the bundled suite: an MP4 that
browsers play (H.264, yuv420p, the index first), a frame per step with its action drawn, the
outcome at the end; `arena export --format video`; the extra named in one line when missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from adapters.store.duckdb_store import ResultStore
from tests.results.conftest import BundledRuns

pytest.importorskip("imageio_ffmpeg")


def _probe(video: Path) -> str:
    """What ffmpeg (imageio-ffmpeg's own binary) says of the file's streams."""
    import imageio_ffmpeg

    done = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(video)], capture_output=True,
                          text=True)
    return done.stderr


def test_a_failed_episode_is_a_video_browsers_play(bundled_run_store: ResultStore, bundled_run_db: BundledRuns,
                                                   tmp_path: Path) -> None:
    from adapters.results.episode_video import episode_frames, episode_video

    run, task = bundled_run_db.random, "notepad-append-line"
    frames = episode_frames(bundled_run_store, run, task)
    steps = bundled_run_store.steps(run, task)
    assert len(frames) == len([s for s in steps if s["screenshot_path"]]) + 1  # + the outcome card
    # The last frame is the outcome card, dark; a step's frame is the screen with its caption bar.
    assert frames[-1][0].getpixel((5, 5)) == (31, 35, 40)
    data = episode_video(bundled_run_store, run, task)
    video = tmp_path / "episode.mp4"
    video.write_bytes(data)
    info = _probe(video)
    assert "Video: h264" in info and "yuv420p" in info, info
    assert data[4:8] == b"ftyp" and data.find(b"moov") < data.find(b"mdat")  # the index before the frames


def test_arena_export_video_writes_one_mp4_per_task(bundled_run_db: BundledRuns, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import main

    out = tmp_path / "videos"
    assert main(["export", bundled_run_db.random, "--db", str(bundled_run_db.db), "--format", "video",
                 "--out", str(out), "--domain", "notepad"]) == 0
    written = sorted(p.name for p in out.glob("*.mp4"))
    assert len(written) == 6 and all(p.startswith("notepad-") or p.startswith("INF-notepad") for p in written)
    assert str(out) in capsys.readouterr().out


def test_without_the_video_extra_it_is_one_line_naming_it(bundled_run_db: BundledRuns, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['imageio_ffmpeg'] = None; from flows.cli import main; "
            f"sys.exit(main(['export', {bundled_run_db.random!r}, '--db', {str(bundled_run_db.db)!r}, "
            f"'--format', 'video', '--out', {str(tmp_path / 'v')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert "pip install 'waa-arena[video]'" in done.stderr
