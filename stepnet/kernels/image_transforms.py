"""The pixel arithmetic of Caffe2's ImageInput (caffe2/image/image_input_op.h), once, on H×W×C images in BGR
channel order (what OpenCV decodes to): OpenCV's INTER_AREA resize, the scaled size, Inception-style random
sized crops, crop and mirror, colour jitter, colour lighting and mean/std normalization. Random draws come
from a numpy Generator the caller gives; nothing here checks its inputs."""
from __future__ import annotations

import math

import numpy as np

# OpenCV's BGR -> gray weights for uint8 (cvtColor, fixed point with 14 bits) and the jitter's float ones
GRAY_FIXED = (1868, 9617, 4899)
GRAY_FLOAT = np.array([0.114, 0.587, 0.299], np.float32)
# The PCA of ImageNet's RGB pixels Caffe2 hard-codes for colour lighting: eigvecs[i] is row i (R, G, B)
LIGHTING_EIGVECS = np.array([[-144.7125, 183.396, 102.2295], [-148.104, -1.1475, -207.57],
                             [-148.818, -177.174, 107.1765]], np.float32)
LIGHTING_EIGVALS = np.array([0.2175, 0.0188, 0.0045], np.float32)


def bgr_to_gray(img: np.ndarray) -> np.ndarray:
    """H×W×3 uint8 BGR -> H×W×1 uint8, OpenCV's rounding (B·1868 + G·9617 + R·4899 + 2¹³) >> 14."""
    b, g, r = (img[:, :, c].astype(np.int64) for c in range(3))
    gray = (b * GRAY_FIXED[0] + g * GRAY_FIXED[1] + r * GRAY_FIXED[2] + (1 << 13)) >> 14
    return gray.astype(np.uint8)[:, :, None]


def to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """img (H×W×1 or H×W×3 uint8) with `channels` channels: gray copied to B, G and R, or BGR made gray."""
    if img.shape[2] == channels:
        return img
    return np.repeat(img, 3, axis=2) if channels == 3 else bgr_to_gray(img)


def _area_weights(n_in: int, n_out: int) -> np.ndarray:
    """n_out×n_in: output pixel d averages source interval [d·s, (d+1)·s), s = n_in/n_out >= 1, by overlap."""
    s = n_in / n_out
    w = np.zeros((n_out, n_in))
    for d in range(n_out):
        lo, hi = d * s, (d + 1) * s
        for k in range(int(math.floor(lo)), min(int(math.ceil(hi)), n_in)):
            w[d, k] = (min(hi, k + 1) - max(lo, k)) / s
    return w


def _area_linear_weights(n_in: int, n_out: int) -> np.ndarray:
    """n_out×n_in: OpenCV's INTER_AREA when enlarging (two taps: sx = floor(d·s), fx the fraction by which the
    output pixel's right edge passes source pixel sx's, 0 when it does not)."""
    s, inv = n_in / n_out, n_out / n_in
    w = np.zeros((n_out, n_in))
    for d in range(n_out):
        sx = int(math.floor(d * s))
        fx = (d + 1) - (sx + 1) * inv
        fx = 0.0 if fx <= 0 else fx - math.floor(fx)
        if sx >= n_in - 1:
            sx, fx = n_in - 1, 0.0
        w[d, sx] += 1.0 - fx
        if fx:
            w[d, sx + 1] += fx
    return w


def area_resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """OpenCV's resize with INTER_AREA of an H×W×C uint8 image to height×width: area averaging when neither
    side grows, else its two-tap rule on both axes; weights in float64, rounded half to even to uint8."""
    h, w = img.shape[:2]
    if (h, w) == (height, width):
        return img
    area = h >= height and w >= width
    wy = (_area_weights if area else _area_linear_weights)(h, height)
    wx = (_area_weights if area else _area_linear_weights)(w, width)
    rows = np.tensordot(wy, img.astype(np.float64), axes=(1, 0))             # height×W×C
    out = np.tensordot(rows, wx, axes=(1, 1)).transpose(0, 2, 1)             # height×width×C
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def scaled_size(height: int, width: int, scale: int, warp: bool) -> tuple[int, int]:
    """Caffe2's target size: scale×scale with warp, else the shorter side to scale and the longer one in
    proportion (float32 arithmetic, truncated)."""
    if warp:
        return scale, scale
    if height > width:
        return int(np.float32(height) * np.float32(scale) / np.float32(width)), scale
    return scale, int(np.float32(width) * np.float32(scale) / np.float32(height))


def inception_crop(img: np.ndarray, crop: int, rng) -> np.ndarray | None:
    """A random crop of 8%-100% of the area with aspect ratio in [3/4, 4/3], resized to crop×crop; None when
    10 draws find none that fits."""
    h, w = img.shape[:2]
    for _ in range(10):
        target = int(math.ceil(rng.uniform(0.08, 1.0) * h * w))
        aspect = np.float32(rng.uniform(3 / 4, 4 / 3))
        nh = int(math.floor(math.sqrt(np.float32(target) / aspect)))
        nw = int(math.floor(math.sqrt(np.float32(target) * aspect)))
        if 1 <= nh <= h and 1 <= nw <= w:
            y = int(rng.integers(0, h - nh + 1))
            x = int(rng.integers(0, w - nw + 1))
            return area_resize(img[y:y + nh, x:x + nw], crop, crop)
    return None


def crop_offsets(height: int, width: int, crop: int, center: bool, rng) -> tuple[int, int]:
    """(row, column) of the crop's top left corner: centred (rounded down), or uniform (column drawn first)."""
    if center:
        return (height - crop) // 2, (width - crop) // 2
    x = int(rng.integers(0, width - crop + 1))
    y = int(rng.integers(0, height - crop + 1))
    return y, x


def crop_mirror(img: np.ndarray, crop: int, y: int, x: int, mirror: bool) -> np.ndarray:
    """The crop×crop window at (y, x), left-right flipped when mirror."""
    window = img[y:y + crop, x:x + crop]
    return window[:, ::-1] if mirror else window


def color_jitter(img: np.ndarray, saturation: float, brightness: float, contrast: float, rng) -> None:
    """Saturation, brightness and contrast changes (in a random order) of a float32 H×W×3 BGR image, in place:
    each scales by alpha = 1 + U(-a, a) towards the pixel's gray (saturation), 0 (brightness) or the image's
    mean gray (contrast)."""
    for kind in rng.permutation(3):
        amount = (saturation, brightness, contrast)[kind]
        alpha = np.float32(1.0 + rng.uniform(-amount, amount))
        if kind == 0:
            gray = img @ GRAY_FLOAT
            img *= alpha
            img += (gray * (np.float32(1) - alpha))[:, :, None]
        elif kind == 1:
            img *= alpha
        else:
            mean = np.float32((img @ GRAY_FLOAT).mean(dtype=np.float64))
            img *= alpha
            img += mean * (np.float32(1) - alpha)


def color_lighting(img: np.ndarray, std: float, rng) -> None:
    """AlexNet's PCA lighting noise on a float32 H×W×3 BGR image, in place: alphas ~ N(0, std); the RGB shift
    Σ_j eigvec[i][j]·eigval[j]·alpha[j] added to channel R, G, B (stored B, G, R)."""
    alphas = rng.normal(0.0, std, 3).astype(np.float32)
    delta_rgb = LIGHTING_EIGVECS @ (LIGHTING_EIGVALS * alphas)
    img += delta_rgb[::-1]


def normalize(img: np.ndarray, mean: np.ndarray, inv_std: np.ndarray) -> np.ndarray:
    """(img - mean[c]) · inv_std[c] over the last axis (c < the image's channels)."""
    c = img.shape[-1]
    return (img - mean[:c]) * inv_std[:c]
