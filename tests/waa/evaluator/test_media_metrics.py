"""compare_images / compare_audios / compare_videos on real PNG, WAV and AVI files built here.

The hard-coded scores were produced by WAA's own libraries (scikit-image 0.26 SSIM, librosa 0.11
MFCC + fastdtw, imagehash 4.3 phash) on these exact files; the `*_matches_reference_library` tests
recompute them with those libraries when they are installed (they are not part of the 'media'
extra, so those tests skip in a normal environment).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("scipy")
from PIL import Image, ImageDraw  # noqa: E402

from adapters.waa.evaluator import METRICS, evaluate_task  # noqa: E402
from adapters.waa.evaluator import metrics_media  # noqa: E402,F401 - registers the metrics
from adapters.waa.evaluator.errors import MissingDependencyError  # noqa: E402
from adapters.waa.evaluator.getters import cloud_cache_path  # noqa: E402


# -- deterministic test media -----------------------------------------------------------------------


def picture(kind: str, size: tuple[int, int] = (64, 48)) -> Image.Image:
    """Deterministic RGB pictures: a gradient with shapes, or variants of it."""
    width, height = size
    xs = np.arange(width)[None, :]
    ys = np.arange(height)[:, None]
    red = (xs * 255 // max(width - 1, 1)) * np.ones_like(ys)
    green = (ys * 255 // max(height - 1, 1)) * np.ones_like(xs)
    blue = ((xs // 8 + ys // 8) % 2) * 200
    image = Image.fromarray(np.stack([red, green, blue], axis=-1).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    if kind == "base":
        draw.ellipse((width // 4, height // 4, width // 2, height // 2), fill=(255, 255, 0))
    elif kind == "moved":
        draw.ellipse((width // 2, height // 2, 3 * width // 4, 3 * height // 4), fill=(255, 255, 0))
    elif kind == "inverted":
        image = Image.eval(image, lambda v: 255 - v)
    return image


def save_png(path: Path, image: Image.Image) -> str:
    image.save(path, format="PNG")
    return str(path)


def tone(frequency: float, rate: int, seconds: float, channels: int = 1) -> "np.ndarray":
    """A tone with a deterministic second partial and a slow amplitude ramp."""
    t = np.arange(int(rate * seconds)) / rate
    signal = 0.4 * np.sin(2 * np.pi * frequency * t) + 0.1 * np.sin(2 * np.pi * 2.5 * frequency * t)
    signal *= 0.5 + 0.5 * t / seconds
    if channels == 2:
        return np.stack([signal, 0.6 * signal], axis=1)
    return signal


def save_wav(path: Path, samples: "np.ndarray", rate: int) -> str:
    """16-bit PCM WAV through the standard library's wave module (no soundfile needed)."""
    import wave

    data = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1 if data.ndim == 1 else data.shape[1])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(data.tobytes())
    return str(path)


def video_frames(kind: str, count: int = 12, size: tuple[int, int] = (64, 48)) -> list["np.ndarray"]:
    """BGR frames: a square moving right ("a"), or moving down over a different background ("b")."""
    width, height = size
    frames = []
    for index in range(count):
        frame = np.zeros((height, width, 3), dtype=np.uint8)
        if kind == "a":
            frame[:, :] = (40, 40, 40)
            x = 4 + 3 * index
            frame[10:30, x : x + 16] = (255, 255, 255)
        else:
            frame[:, : width // 2] = (0, 0, 255)
            frame[:, width // 2 :] = (255, 0, 0)
            y = 2 + 2 * index
            frame[y : y + 12, 20:44] = (0, 255, 0)
        frames.append(frame)
    return frames


def save_video(path: Path, frames: list["np.ndarray"]) -> str:
    cv2 = pytest.importorskip("cv2")
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (width, height))
    assert writer.isOpened(), "OpenCV cannot write MJPG/AVI here"
    for frame in frames:
        writer.write(frame)
    writer.release()
    return str(path)


# -- registration -------------------------------------------------------------------------------------


def test_media_metrics_are_registered():
    for name in ("compare_images", "compare_audios", "compare_videos"):
        assert METRICS[name] is getattr(metrics_media, name)


# -- compare_images -------------------------------------------------------------------------------------


def test_compare_images_identical_is_exactly_one(tmp_path):
    first = save_png(tmp_path / "a.png", picture("base"))
    second = save_png(tmp_path / "b.png", picture("base"))
    assert METRICS["compare_images"](first, second) == 1.0


def test_compare_images_ignores_colour_mode_but_not_content(tmp_path):
    rgb = save_png(tmp_path / "rgb.png", picture("base"))
    grey = save_png(tmp_path / "grey.png", picture("base").convert("L"))
    assert METRICS["compare_images"](rgb, grey) == 1.0  # WAA compares in greyscale
    moved = save_png(tmp_path / "moved.png", picture("moved"))
    score = METRICS["compare_images"](rgb, moved)
    assert score == pytest.approx(REFERENCE["ssim_moved"], abs=1e-12)
    assert 0 < score < 1


def test_compare_images_inverted_is_negative_and_engine_rejects_it(tmp_path):
    base = save_png(tmp_path / "a.png", picture("base"))
    inverted = save_png(tmp_path / "inv.png", picture("inverted"))
    score = METRICS["compare_images"](base, inverted)
    assert score == pytest.approx(REFERENCE["ssim_inverted"], abs=1e-12)
    assert score < 0  # WAA reports this raw value; our engine calls it an evaluation error


def test_compare_images_resizes_to_lexicographic_min_size(tmp_path):
    # min((100, 50), (90, 80)) is (90, 80): the width decides, the height is upscaled.
    wide = save_png(tmp_path / "wide.png", picture("base", (100, 50)))
    tall = save_png(tmp_path / "tall.png", picture("base", (90, 80)))
    score = METRICS["compare_images"](wide, tall)
    a = np.array(Image.open(wide).convert("L").resize((90, 80), Image.Resampling.LANCZOS))
    b = np.array(Image.open(tall).convert("L").resize((90, 80), Image.Resampling.LANCZOS))
    assert score == metrics_media.structural_similarity(a, b)
    assert score == pytest.approx(REFERENCE["ssim_resized"], abs=1e-12)


def test_compare_images_odd_inputs(tmp_path):
    image = save_png(tmp_path / "a.png", picture("base"))
    assert METRICS["compare_images"](None, image) == 0 and type(METRICS["compare_images"](None, image)) is int
    assert METRICS["compare_images"](image, "") == 0
    with pytest.raises(FileNotFoundError):
        METRICS["compare_images"](image, str(tmp_path / "missing.png"))
    tiny = save_png(tmp_path / "tiny.png", picture("base", (6, 20)))
    with pytest.raises(ValueError, match="window"):
        METRICS["compare_images"](tiny, image)


def test_compare_images_matches_reference_library(tmp_path):
    skimage_metrics = pytest.importorskip("skimage.metrics")
    for first, second in [(("base", (64, 48)), ("moved", (64, 48))), (("base", (100, 50)), ("inverted", (90, 80)))]:
        p1 = save_png(tmp_path / "1.png", picture(*first))
        p2 = save_png(tmp_path / "2.png", picture(*second))
        i1, i2 = Image.open(p1).convert("L"), Image.open(p2).convert("L")
        size = min(i1.size, i2.size)
        a = np.array(i1.resize(size, Image.Resampling.LANCZOS))
        b = np.array(i2.resize(size, Image.Resampling.LANCZOS))
        assert METRICS["compare_images"](p1, p2) == skimage_metrics.structural_similarity(a, b)


# -- compare_audios --------------------------------------------------------------------------------------


@pytest.fixture
def audio_files(tmp_path) -> dict[str, str]:
    pytest.importorskip("soundfile")
    pytest.importorskip("fastdtw")
    return {
        "a": save_wav(tmp_path / "a.wav", tone(440, 22050, 1.0), 22050),
        "a_copy": save_wav(tmp_path / "a_copy.wav", tone(440, 22050, 1.0), 22050),
        "b": save_wav(tmp_path / "b.wav", tone(660, 22050, 1.2), 22050),
        "a_stereo_44k": save_wav(tmp_path / "a44.wav", tone(440, 44100, 1.0, channels=2), 44100),
    }


def test_compare_audios_identical_is_one(audio_files):
    assert METRICS["compare_audios"](audio_files["a"], audio_files["a_copy"]) == 1.0


def test_compare_audios_different_scores(audio_files):
    different = METRICS["compare_audios"](audio_files["a"], audio_files["b"])
    # 1e-6: the MFCC/DTW pipeline's last digits move with the BLAS kernel in use (seen: 8e-9).
    assert different == pytest.approx(REFERENCE["audio_a_b"], rel=1e-6)
    assert different == METRICS["compare_audios"](audio_files["b"], audio_files["a"])
    resampled = METRICS["compare_audios"](audio_files["a"], audio_files["a_stereo_44k"])
    pytest.importorskip("soxr")
    assert resampled == pytest.approx(REFERENCE["audio_a_a44"], rel=1e-6)
    assert different < resampled < 1.0


def test_compare_audios_odd_inputs(audio_files, tmp_path):
    assert METRICS["compare_audios"](None, audio_files["a"]) == 0
    assert METRICS["compare_audios"](audio_files["a"], "") == 0
    with pytest.raises(Exception):
        METRICS["compare_audios"](audio_files["a"], str(tmp_path / "missing.wav"))
    garbage = tmp_path / "garbage.mp3"
    garbage.write_bytes(b"this is not audio at all" * 10)
    with pytest.raises(RuntimeError, match="libsndfile cannot decode"):
        METRICS["compare_audios"](audio_files["a"], str(garbage))


def test_compare_audios_missing_package_is_a_clear_error(audio_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "soundfile", None)
    with pytest.raises(MissingDependencyError) as info:
        METRICS["compare_audios"](audio_files["a"], audio_files["b"])
    assert info.value.extra == "media" and "soundfile" in str(info.value)


def test_compare_audios_matches_reference_library(audio_files):
    librosa = pytest.importorskip("librosa")
    from fastdtw import fastdtw
    from scipy.spatial.distance import cosine

    def waa(p1: str, p2: str) -> float:
        y1, sr1 = librosa.load(p1)
        y2, sr2 = librosa.load(p2)
        m1 = librosa.util.normalize(librosa.feature.mfcc(y=y1, sr=sr1), axis=1)
        m2 = librosa.util.normalize(librosa.feature.mfcc(y=y2, sr=sr2), axis=1)
        return 1 / (1 + fastdtw(m1.T, m2.T, dist=lambda x, y: cosine(x, y))[0])

    for first, second in [("a", "b"), ("a", "a_stereo_44k"), ("b", "a_stereo_44k")]:
        assert METRICS["compare_audios"](audio_files[first], audio_files[second]) == waa(
            audio_files[first], audio_files[second]
        )
    y, sr = librosa.load(audio_files["a_stereo_44k"])
    ours = metrics_media.load_audio(audio_files["a_stereo_44k"])
    assert np.array_equal(y, ours)
    assert np.array_equal(librosa.feature.mfcc(y=y, sr=sr), metrics_media.mfcc(ours))


# -- compare_videos --------------------------------------------------------------------------------------


@pytest.fixture
def videos(tmp_path) -> dict[str, str]:
    return {
        "a": save_video(tmp_path / "a.avi", video_frames("a")),
        "a_copy": save_video(tmp_path / "a_copy.avi", video_frames("a")),
        "b": save_video(tmp_path / "b.avi", video_frames("b")),
        "a_short": save_video(tmp_path / "a_short.avi", video_frames("a", count=8)),
    }


def test_compare_videos_identical_true_different_false(videos):
    compare = METRICS["compare_videos"]
    assert compare(videos["a"], videos["a_copy"]) is True
    assert compare(videos["a"], videos["b"]) is False


def test_compare_videos_length_and_options(videos):
    compare = METRICS["compare_videos"]
    assert compare(videos["a"], videos["a_short"]) is False  # one ends first
    assert compare(videos["a"], videos["a_short"], max_frames_to_check=8) is True  # stops before the end
    assert compare(videos["a"], videos["b"], threshold=64) is True  # no hash can differ in more than 64 bits


def test_compare_videos_unreadable_paths_quirk(videos, tmp_path):
    compare = METRICS["compare_videos"]
    missing = str(tmp_path / "missing.mp4")
    assert compare(missing, str(tmp_path / "also_missing.mp4")) is True  # both "end" at once, as in WAA
    assert compare(missing, videos["a"]) is False


def test_perceptual_hash_matches_reference_library():
    imagehash = pytest.importorskip("imagehash")
    for kind in ("base", "moved", "inverted"):
        image = picture(kind, (57, 41))
        assert np.array_equal(imagehash.phash(image).hash, metrics_media.perceptual_hash(image))


# -- through the engine ---------------------------------------------------------------------------------


class _Files:
    """The smallest VM the engine needs for vm_file."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def get_file(self, path: str) -> bytes | None:
        return self.files.get(path)


def _offline_gold(tmp_path: Path, url: str, dest: str, content: bytes) -> Path:
    downloads = tmp_path / "downloads"
    target = cloud_cache_path(downloads, url, dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    return downloads


def test_engine_scores_the_vlc_image_task(tmp_path):
    # vlc/fba2c100...: compare_images of a Desktop picture against a cloud gold file.
    url = "https://example.invalid/interstellar.png"
    gold = Path(save_png(tmp_path / "gold.png", picture("base"))).read_bytes()
    downloads = _offline_gold(tmp_path, url, "interstellar_gold.png", gold)
    spec = {
        "func": "compare_images",
        "expected": {"type": "cloud_file", "path": url, "dest": "interstellar_gold.png"},
        "result": {"type": "vm_file", "path": "C:\\Users\\Docker\\Desktop\\interstellar.png", "dest": "interstellar.png"},
    }
    run = dict(last_action="DONE", offline=True, download_dir=downloads)
    same = evaluate_task(spec, _Files({"C:\\Users\\Docker\\Desktop\\interstellar.png": gold}), cache_dir=tmp_path / "c1", **run)
    assert (same.kind, same.score) == ("scored", 1.0)
    moved = Path(save_png(tmp_path / "moved.png", picture("moved"))).read_bytes()
    other = evaluate_task(spec, _Files({"C:\\Users\\Docker\\Desktop\\interstellar.png": moved}), cache_dir=tmp_path / "c2", **run)
    assert other.kind == "scored" and other.score == pytest.approx(REFERENCE["ssim_moved"], abs=1e-12)
    missing = evaluate_task(spec, _Files({}), cache_dir=tmp_path / "c3", **run)
    assert (missing.kind, missing.score) == ("scored", 0.0)  # vm_file gives None, WAA's metric returns 0


def test_engine_scores_the_vlc_audio_task(tmp_path, audio_files):
    url = "https://example.invalid/baby.mp3"
    gold = Path(audio_files["a"]).read_bytes()
    downloads = _offline_gold(tmp_path, url, "baby_gold.wav", gold)
    spec = {
        "func": "compare_audios",
        "expected": {"type": "cloud_file", "path": url, "dest": "baby_gold.wav"},
        "result": {"type": "vm_file", "path": "C:\\Users\\Docker\\Desktop\\baby.wav", "dest": "baby.wav"},
    }
    outcome = evaluate_task(
        spec,
        _Files({"C:\\Users\\Docker\\Desktop\\baby.wav": gold}),
        last_action="DONE",
        cache_dir=tmp_path / "cache",
        offline=True,
        download_dir=downloads,
    )
    assert (outcome.kind, outcome.score) == ("scored", 1.0)


def test_engine_scores_the_vlc_video_task(tmp_path, videos):
    url = "https://example.invalid/1984.avi"
    gold = Path(videos["a"]).read_bytes()
    downloads = _offline_gold(tmp_path, url, "gold.avi", gold)
    spec = {
        "func": "compare_videos",
        "expected": {"type": "cloud_file", "path": url, "dest": "gold.avi"},
        "result": {"type": "vm_file", "path": "C:\\Users\\Docker\\Downloads\\1984.avi", "dest": "1984.avi"},
    }
    run = dict(last_action="DONE", offline=True, download_dir=downloads)
    right = evaluate_task(spec, _Files({"C:\\Users\\Docker\\Downloads\\1984.avi": gold}), cache_dir=tmp_path / "c1", **run)
    assert (right.kind, right.score) == ("scored", 1.0)
    wrong_bytes = Path(videos["b"]).read_bytes()
    wrong = evaluate_task(spec, _Files({"C:\\Users\\Docker\\Downloads\\1984.avi": wrong_bytes}), cache_dir=tmp_path / "c2", **run)
    assert (wrong.kind, wrong.score) == ("scored", 0.0)
    missing = evaluate_task(spec, _Files({}), cache_dir=tmp_path / "c3", **run)
    assert (missing.kind, missing.score) == ("scored", 0.0)  # None vs a real video: lengths differ


# Scores WAA's libraries give on the files above (see the module docstring).
REFERENCE: dict[str, float] = {
    "ssim_moved": 0.737844629755275,
    "ssim_inverted": -0.40691859916797646,
    "ssim_resized": 0.3869749765367597,
    "audio_a_b": 0.021759939222037533,
    "audio_a_a44": 0.9793900331164525,
}
