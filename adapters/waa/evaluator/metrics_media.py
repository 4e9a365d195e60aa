"""Media metrics: images (SSIM), audio (MFCC + DTW) and video (perceptual hashes of frames).

Each metric mirrors the WAA function of the same name in
`client/desktop_env/evaluators/metrics/vlc.py`, including its odd inputs and return types (a numpy
float from SSIM, a bool from the video check). WAA computes them with scikit-image, librosa and
imagehash; we compute the same quantities with lighter packages, the 'media' extra:

    numpy, scipy, soundfile, soxr, fastdtw, opencv-python-headless   (and Pillow, a core dependency)

* `compare_images`: scikit-image's `structural_similarity` with its defaults (7x7 uniform window,
  sample covariance, K1=0.01, K2=0.03, data range 255 for 8-bit images, borders cropped), written
  out on `scipy.ndimage.uniform_filter`, which is what scikit-image itself calls.
* `compare_audios`: librosa 0.10's `load` (soundfile decoding, mean of channels, soxr "HQ"
  resampling to 22050 Hz) and `feature.mfcc` defaults (2048-point Hann STFT, hop 512, centred with
  zero padding, 128 Slaney mel bands, power in dB with top_db 80, 20 orthonormal DCT-II
  coefficients), then `util.normalize` per coefficient, reproduced with numpy/scipy in librosa's own
  float32/float64 steps; the DTW is WAA's own package, fastdtw, with scipy's cosine distance.
  librosa itself is not used: it pulls numba/llvmlite and scikit-learn for this one feature.
* `compare_videos`: OpenCV decodes the frames exactly as in WAA; imagehash's `phash` (32x32 Lanczos
  greyscale, 2-D DCT-II, top-left 8x8 against its median) is written out on scipy.fftpack.

Deviations (see `MEDIA_DEVIATIONS`): audio that libsndfile cannot decode raises an error naming the
file, where librosa would fall back to audioread/ffmpeg.
"""

from __future__ import annotations

from typing import Any

from adapters.waa.evaluator.errors import require
from adapters.waa.evaluator.metrics import metric

MEDIA_PACKAGES = "numpy, scipy, soundfile, soxr, fastdtw and opencv-python-headless"

MEDIA_DEVIATIONS: list[str] = [
    "compare_images computes scikit-image's default SSIM with scipy.ndimage.uniform_filter (the "
    "filter scikit-image uses) instead of importing scikit-image.",
    "compare_audios reproduces librosa 0.10's load + mfcc + normalize with numpy/scipy/soundfile/"
    "soxr instead of importing librosa (which needs numba); scores agree with librosa to float32 "
    "rounding. Audio libsndfile cannot decode (e.g. AAC/M4A) raises an error naming the file; "
    "librosa would decode it through audioread/ffmpeg.",
    "compare_videos computes imagehash's phash with scipy.fftpack instead of importing imagehash.",
    "compare_images and compare_audios return WAA's raw values; an SSIM below 0 (very different "
    "images) is outside [0, 1] and the engine reports it as an evaluation error, where WAA would "
    "report the negative score.",
]


def _numpy(what: str) -> Any:
    return _module("numpy", what)


def _module(name: str, what: str) -> Any:
    return require(name, what=what, packages=MEDIA_PACKAGES, extra="media")


# -- images --------------------------------------------------------------------------------------------

SSIM_WINDOW = 7


def structural_similarity(first: Any, second: Any) -> Any:
    """Mean SSIM of two equally shaped 8-bit greyscale arrays, as scikit-image's
    `structural_similarity(first, second)` computes it with every default. Raises ValueError for
    images smaller than the 7x7 window or of different shapes, as scikit-image does."""
    np = _numpy("compare_images")
    ndimage = _module("scipy.ndimage", "compare_images")
    if first.shape != second.shape:
        raise ValueError(f"SSIM needs images of the same shape, got {first.shape} and {second.shape}")
    if any(side < SSIM_WINDOW for side in first.shape):
        raise ValueError(f"an image of shape {first.shape} is smaller than SSIM's {SSIM_WINDOW}x{SSIM_WINDOW} window")
    if np.issubdtype(first.dtype, np.floating) or np.issubdtype(second.dtype, np.floating):
        raise ValueError("SSIM of floating-point images needs an explicit data range")
    info = np.iinfo(first.dtype)
    data_range = int(info.max) - int(info.min)
    x = first.astype(np.float64)
    y = second.astype(np.float64)
    count = SSIM_WINDOW ** x.ndim
    sample = count / (count - 1)

    def mean(values: Any) -> Any:
        return ndimage.uniform_filter(values, size=SSIM_WINDOW)

    mu_x, mu_y = mean(x), mean(y)
    var_x = sample * (mean(x * x) - mu_x * mu_x)
    var_y = sample * (mean(y * y) - mu_y * mu_y)
    cov = sample * (mean(x * y) - mu_x * mu_y)
    c1 = (0.01 * data_range) ** 2
    c2 = (0.03 * data_range) ** 2
    numerator = (2 * mu_x * mu_y + c1) * (2 * cov + c2)
    denominator = (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
    index = numerator / denominator
    border = (SSIM_WINDOW - 1) // 2
    inner = tuple(slice(border, side - border) for side in index.shape)
    return index[inner].mean(dtype=np.float64)


@metric("compare_images", files=2)
def compare_images(image1_path: Any, image2_path: Any) -> Any:
    """WAA `compare_images` (vlc.py): SSIM of the two images in greyscale, in [-1, 1] (1.0 for
    identical pictures); 0 (the int) when either path is empty/None.

    Kept WAA quirk: both images are resized (Lanczos) to `min(size1, size2)`, which compares the
    (width, height) tuples lexicographically, so the smaller *width* wins and its height may be
    larger than the other image's. Missing or unreadable files raise, as do images under 7x7.
    """
    if not image1_path or not image2_path:
        return 0
    np = _numpy("compare_images")
    from PIL import Image

    first = Image.open(image1_path).convert("L")
    second = Image.open(image2_path).convert("L")
    size = min(first.size, second.size)
    first = first.resize(size, Image.Resampling.LANCZOS)
    second = second.resize(size, Image.Resampling.LANCZOS)
    return structural_similarity(np.array(first), np.array(second))


# -- audio ------------------------------------------------------------------------------------------------

AUDIO_RATE = 22050
N_FFT = 2048
HOP = 512
N_MELS = 128
N_MFCC = 20
TOP_DB = 80.0
AMIN = 1e-10


def load_audio(path: Any) -> Any:
    """librosa.load(path) with its defaults: float32 mono at 22050 Hz."""
    np = _numpy("compare_audios")
    soundfile = _module("soundfile", "compare_audios")
    try:
        with soundfile.SoundFile(path) as handle:
            native_rate = handle.samplerate
            samples = handle.read(frames=-1, dtype="float32", always_2d=False).T
    except soundfile.SoundFileRuntimeError as exc:
        raise RuntimeError(
            f"compare_audios: libsndfile cannot decode {path} ({exc}); WAA's librosa would try "
            "audioread/ffmpeg, which this evaluator does not use"
        ) from exc
    if samples.ndim > 1:
        samples = np.mean(samples, axis=tuple(range(samples.ndim - 1)))
    if native_rate == AUDIO_RATE:
        return samples
    soxr = _module("soxr", "compare_audios")
    target_length = int(np.ceil(samples.shape[-1] * (float(AUDIO_RATE) / native_rate)))
    resampled = soxr.resample(samples, native_rate, AUDIO_RATE, quality="soxr_hq")
    if resampled.shape[-1] > target_length:
        resampled = resampled[..., :target_length]
    elif resampled.shape[-1] < target_length:
        resampled = np.pad(resampled, (0, target_length - resampled.shape[-1]), mode="constant")
    return np.asarray(resampled, dtype=samples.dtype)


def _hz_to_mel(hz: Any) -> Any:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    np = _numpy("compare_audios")
    hz = np.asanyarray(hz, dtype=np.float64)
    linear_step = 200.0 / 3
    mels = hz / linear_step
    break_mel = 1000.0 / linear_step
    log_step = np.log(6.4) / 27.0
    if mels.ndim == 0:
        return break_mel + np.log(hz / 1000.0) / log_step if hz >= 1000.0 else mels
    high = hz >= 1000.0
    mels[high] = break_mel + np.log(hz[high] / 1000.0) / log_step
    return mels


def _mel_to_hz(mels: Any) -> Any:
    np = _numpy("compare_audios")
    mels = np.asanyarray(mels, dtype=np.float64)
    linear_step = 200.0 / 3
    hz = linear_step * mels
    break_mel = 1000.0 / linear_step
    log_step = np.log(6.4) / 27.0
    high = mels >= break_mel
    hz[high] = 1000.0 * np.exp(log_step * (mels[high] - break_mel))
    return hz


def mel_filterbank(rate: int = AUDIO_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> Any:
    """Triangular Slaney-normalised mel filters from 0 Hz to rate/2, float32 (n_mels, 1 + n_fft/2)."""
    np = _numpy("compare_audios")
    bins = np.fft.rfftfreq(n=n_fft, d=1.0 / rate)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(rate / 2.0), n_mels + 2))
    widths = np.diff(edges)
    offsets = np.subtract.outer(edges, bins)
    filters = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    for band in range(n_mels):
        rising = -offsets[band] / widths[band]
        falling = offsets[band + 2] / widths[band + 1]
        filters[band] = np.maximum(0, np.minimum(rising, falling))
    filters *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, np.newaxis]
    return filters


def mfcc(samples: Any, rate: int = AUDIO_RATE) -> Any:
    """librosa.feature.mfcc(y=samples, sr=rate) with every default: float32 (20, frames)."""
    np = _numpy("compare_audios")
    signal = _module("scipy.signal", "compare_audios")
    fftpack = _module("scipy.fftpack", "compare_audios")
    window = signal.get_window("hann", N_FFT, fftbins=True)
    padded = np.pad(samples, N_FFT // 2, mode="constant")
    frame_count = 1 + (padded.shape[-1] - N_FFT) // HOP
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:frame_count]
    spectrum = np.fft.rfft(window * frames, axis=-1).astype(np.complex64).T  # (bins, frames)
    power = np.abs(spectrum) ** 2
    mel = np.einsum("...ft,mf->...mt", power, mel_filterbank(rate), optimize=True)
    decibels = 10.0 * np.log10(np.maximum(AMIN, mel))
    decibels -= 10.0 * np.log10(np.maximum(AMIN, np.abs(1.0)))
    decibels = np.maximum(decibels, decibels.max() - TOP_DB)
    return fftpack.dct(decibels, axis=-2, type=2, norm="ortho")[..., :N_MFCC, :]


def normalize_rows(features: Any) -> Any:
    """librosa.util.normalize(features, axis=1): each row divided by its largest magnitude
    (rows whose largest magnitude is below the dtype's tiny value are left as they are)."""
    np = _numpy("compare_audios")
    if not np.all(np.isfinite(features)):
        raise ValueError("compare_audios: MFCC features are not finite")
    largest = np.max(np.abs(features).astype(float), axis=1, keepdims=True)
    largest[largest < np.finfo(features.dtype).tiny] = 1.0
    result = np.empty_like(features)
    result[:] = features / largest
    return result


@metric("compare_audios", files=2)
def compare_audios(audio_path_1: Any, audio_path_2: Any) -> float:
    """WAA `compare_audios` (vlc.py): 1 / (1 + D), D the fastdtw distance (radius 1, cosine
    distance per frame) between the two files' row-normalised MFCC sequences; 1.0 for the same
    audio, smaller the more they differ. 0 (the int) when either path is empty/None; a missing or
    undecodable file raises."""
    if not audio_path_1 or not audio_path_2:
        return 0
    fastdtw = _module("fastdtw", "compare_audios")
    distance_module = _module("scipy.spatial.distance", "compare_audios")
    first = normalize_rows(mfcc(load_audio(audio_path_1)))
    second = normalize_rows(mfcc(load_audio(audio_path_2)))
    distance, _path = fastdtw.fastdtw(first.T, second.T, dist=lambda a, b: distance_module.cosine(a, b))
    return 1 / (1 + distance)


# -- video -------------------------------------------------------------------------------------------------


def perceptual_hash(image: Any) -> Any:
    """imagehash.phash(image).hash: a 8x8 bool array (32x32 Lanczos greyscale, DCT-II on both
    axes, low 8x8 coefficients above their median)."""
    np = _numpy("compare_videos")
    fftpack = _module("scipy.fftpack", "compare_videos")
    from PIL import Image

    pixels = np.asarray(image.convert("L").resize((32, 32), Image.Resampling.LANCZOS))
    coefficients = fftpack.dct(fftpack.dct(pixels, axis=0), axis=1)[:8, :8]
    return coefficients > np.median(coefficients)


@metric("compare_videos", files=2)
def compare_videos(video_path1: Any, video_path2: Any, max_frames_to_check: int = 100, threshold: int = 5) -> bool:
    """WAA `compare_videos` (vlc.py): reads both videos frame by frame (OpenCV) for at most
    `max_frames_to_check` frames; a frame pair "mismatches" when their perceptual hashes differ in
    more than `threshold` bits, and more than `threshold` mismatches give False. When either video
    ends first, the answer is whether *both* ended (so a shorter or longer video is False).
    True otherwise (bools, as WAA returns).

    Kept WAA quirks: a path OpenCV cannot open reads as an empty video, so two unreadable paths
    (or two empty videos) give True, and one unreadable against a real video gives False.
    """
    cv2 = _module("cv2", "compare_videos")
    from PIL import Image

    first, second = cv2.VideoCapture(video_path1), cv2.VideoCapture(video_path2)
    try:
        checked = 0
        mismatches = 0
        while checked < max_frames_to_check:
            ok1, frame1 = first.read()
            ok2, frame2 = second.read()
            if not ok1 or not ok2:
                return ok1 == ok2
            hash1 = perceptual_hash(Image.fromarray(cv2.cvtColor(frame1, cv2.COLOR_BGR2RGB)))
            hash2 = perceptual_hash(Image.fromarray(cv2.cvtColor(frame2, cv2.COLOR_BGR2RGB)))
            checked += 1
            if int((hash1 != hash2).sum()) > threshold:
                mismatches += 1
                if mismatches > threshold:
                    return False
        return True
    finally:
        first.release()
        second.release()


__all__ = [
    "MEDIA_DEVIATIONS",
    "compare_audios",
    "compare_images",
    "compare_videos",
    "mfcc",
    "perceptual_hash",
    "structural_similarity",
]

