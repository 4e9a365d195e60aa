"""An episode as a short video: each step's screen with its action drawn on it, then the outcome.

    episode_video(store, run_id, task_id, attempt=None) -> bytes    an MP4 (H.264, yuv420p)
    write_episode_videos(source, run_id, out_dir, ...) -> [paths]    `arena export --format video`

H.264 in MP4 with the `yuv420p` pixel format and the index at the front (`+faststart`) is what every
browser plays, inline in a page too. The frames are drawn with Pillow (a marker where a pointer
action aimed, the action in words, the step's number) and encoded by imageio-ffmpeg, which brings
its own ffmpeg binary: the `video` extra. Without it, a video is one line naming the extra.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from adapters.extras import ExtraMissing
from adapters.results.metrics import click_point, stored_action
from adapters.store.duckdb_store import ResultStore

VIDEO_EXTRA_HINT = "episode videos need imageio-ffmpeg: pip install 'waa-arena[video]'"
FPS = 2
STEP_SECONDS = 1.5  # how long each step's screen is shown
END_SECONDS = 2.5  # the outcome card
MAX_WIDTH = 1280  # larger screens are scaled down: a report embeds the videos of many episodes
BAR = 40  # the caption bar under each screen, in pixels


class VideoExtraMissing(ExtraMissing):
    """imageio-ffmpeg is not installed; the message names the `video` extra."""


class VideoError(ValueError):
    """The episode has nothing to show (no step with a screenshot on disk); the message says which."""


def _writer() -> Any:
    try:
        import imageio_ffmpeg
    except ImportError as exc:
        raise VideoExtraMissing(VIDEO_EXTRA_HINT) from exc
    return imageio_ffmpeg


def _font(size: int) -> Any:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow before 10.1 has one size
        return ImageFont.load_default()


def _caption(step: Mapping[str, Any], total: int) -> str:
    action = stored_action(step)
    words = action.describe() if action is not None else str(step.get("action_type") or "unknown action")
    if step.get("error"):
        words += f"  [failed: {str(step['error'])[:80]}]"
    return f"step {int(step['step_index']) + 1}/{total}: {words}"


def _frame(screen: Image.Image, step: Mapping[str, Any], total: int, size: tuple[int, int]) -> Image.Image:
    """The step's screen at `size` (its width, the screen's height scaled), its action drawn on it."""
    width, height = size
    scale = width / screen.width
    frame = Image.new("RGB", (width, height + BAR), "white")
    frame.paste(screen.convert("RGB").resize((width, height)), (0, 0))
    draw = ImageDraw.Draw(frame)
    action = stored_action(step)
    point = click_point(step, action, (screen.width, screen.height))
    if point is not None:
        x, y = point[0] * scale, point[1] * scale
        for radius, colour in ((16, "#c62828"), (4, "#c62828")):
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), outline=colour, width=3)
    draw.rectangle((0, height, width, height + BAR), fill="#1f2328")
    draw.text((10, height + 10), _caption(step, total), fill="white", font=_font(18))
    return frame


def _end_card(size: tuple[int, int], result: Mapping[str, Any]) -> Image.Image:
    width, height = size
    frame = Image.new("RGB", (width, height + BAR), "#1f2328")
    draw = ImageDraw.Draw(frame)
    outcome = str(result.get("outcome") or "unknown")
    colour = "#1a7f37" if outcome == "success" else "#c62828"
    draw.text((40, height // 2 - 40), f"{result.get('task_id')}: {outcome}", fill=colour, font=_font(36))
    why = str(result.get("reason") or result.get("error") or "")[:160]
    if why:
        draw.text((40, height // 2 + 10), why, fill="white", font=_font(20))
    return frame


def _even(value: int) -> int:
    return value - value % 2  # H.264's 4:2:0 chroma needs even sides


def encode(frames: Sequence[tuple[Image.Image, float]]) -> bytes:
    """An MP4 of `frames` (each shown for its seconds), H.264 yuv420p, index first."""
    ffmpeg = _writer()
    width, height = frames[0][0].size
    size = (_even(width), _even(height))
    fd, name = _temporary_mp4()
    try:
        writer = ffmpeg.write_frames(name, size, fps=FPS, codec="libx264", pix_fmt_in="rgb24",
                                     pix_fmt_out="yuv420p", macro_block_size=2,
                                     output_params=["-movflags", "+faststart"], ffmpeg_log_level="error")
        writer.send(None)
        for image, seconds in frames:
            data = image.resize(size).tobytes() if image.size != size else image.tobytes()
            for _ in range(max(1, round(seconds * FPS))):
                writer.send(data)
        writer.close()
        with open(name, "rb") as handle:
            return handle.read()
    finally:
        os.close(fd)
        os.unlink(name)


def _temporary_mp4() -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix="waa-episode-", suffix=".mp4")


def episode_frames(store: ResultStore, run_id: str, task_id: str, attempt: int | None = None
                   ) -> list[tuple[Image.Image, float]]:
    """The frames of one attempt (its last when `attempt` is None): a frame per step whose
    screenshot is on disk, then the outcome card. VideoError when no step has one."""
    steps = store.steps(run_id, task_id, attempt)
    results = [r for r in store.results(run_id) if r["task_id"] == task_id]
    if not results:
        raise VideoError(f"run {run_id!r} has no attempt of task {task_id!r}")
    result = next((r for r in results if r["attempt"] == attempt), results[-1]) if attempt else results[-1]
    frames: list[tuple[Image.Image, float]] = []
    size: tuple[int, int] | None = None
    for step in steps:
        stored = step.get("screenshot_path")
        if not stored:
            continue
        try:
            with Image.open(store.resolve_path(stored)) as screen:
                screen.load()
        except (OSError, ValueError):
            continue
        if size is None:
            width = min(screen.width, MAX_WIDTH)
            size = (_even(width), _even(round(screen.height * width / screen.width)))
        frames.append((_frame(screen, step, len(steps), size), STEP_SECONDS))
    if size is None:
        raise VideoError(f"task {task_id!r} of run {run_id!r} (attempt {result['attempt']}) has no step with a "
                         "screenshot on disk")
    frames.append((_end_card(size, result), END_SECONDS))
    return frames


def episode_video(store: ResultStore, run_id: str, task_id: str, attempt: int | None = None) -> bytes:
    """One attempt (its last when `attempt` is None) as an MP4."""
    return encode(episode_frames(store, run_id, task_id, attempt))


def write_episode_videos(store: ResultStore, run_id: str, out_dir: Path, *, task_ids: Sequence[str] = (),
                         outcomes: Sequence[str] = (), domains: Sequence[str] = ()) -> list[Path]:
    """The final attempt of each task of `run_id` (those of `task_ids`, `domains`, with `outcomes`
    when given) as `<out_dir>/<task id>.mp4`; tasks without screenshots are skipped."""
    _writer()  # the extra, before any work
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for row in store.latest_attempts(run_id):
        if ((task_ids and row["task_id"] not in task_ids) or (outcomes and row["outcome"] not in outcomes)
                or (domains and row["domain"] not in domains)):
            continue
        try:
            data = episode_video(store, run_id, row["task_id"], row["attempt"])
        except VideoError:
            continue
        name = f"{row['task_id']}.mp4" if int(row.get("trial") or 1) == 1 else f"{row['task_id']}-trial{row['trial']}.mp4"
        if Path(name).name != name or name.startswith("."):
            raise VideoError(f"task id {row['task_id']!r} cannot name a file")
        target = out_dir / name
        partial = target.with_suffix(".mp4.part")
        partial.write_bytes(data)
        partial.replace(target)
        written.append(target)
    return written


def as_data_url(video: bytes) -> str:
    """The video inline in a page (`<video src=...>`): the report stays one file."""
    import base64

    return "data:video/mp4;base64," + base64.b64encode(video).decode()


__all__ = ["VideoError", "VideoExtraMissing", "as_data_url", "episode_video", "write_episode_videos"]
