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
FIXED_ONE = 1 << 11                      # OpenCV's INTER_RESIZE_COEF_SCALE: resize weights in 11-bit fixed point
DBL_EPS = float(np.finfo(np.float64).eps)


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


def _area_taps(n_in: int, n_out: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's table for shrinking one axis by `scale` (>= 1, not whole): output pixel d covers [d·scale,
    d·scale + scale) clipped to the image; each source pixel it touches, in order, with its float32 share of the
    cell (a sliver under 1e-3 of a pixel at either end is left out). n_out×k indices and weights, 0-padded."""
    taps = []
    for d in range(n_out):
        lo = d * scale
        hi, cell = lo + scale, min(scale, n_in - lo)
        last = min(math.floor(hi), n_in - 1)
        first = min(math.ceil(lo), last)
        row = [(first - 1, (first - lo) / cell)] if first - lo > 1e-3 else []
        row += [(k, 1.0 / cell) for k in range(first, last)]
        if hi - last > 1e-3:
            row.append((last, min(hi - last, 1.0, cell) / cell))
        taps.append(row)
    index = np.zeros((n_out, max(map(len, taps))), np.intp)
    weight = np.zeros(index.shape, np.float32)
    for d, row in enumerate(taps):
        for k, (s, a) in enumerate(row):
            index[d, k], weight[d, k] = s, a
    return index, weight


def _linear_taps(n_in: int, n_out: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's INTER_AREA rule for an axis that does not only shrink: output d reads source sx = floor(d / r)
    and sx + 1 (r = n_out / n_in, 1 / r in doubles, as OpenCV has it), with fx = the fraction of
    (d + 1) - (sx + 1)·r (0 when that is <= 0) in float32; weights (1 - fx, fx) in 11-bit fixed point, rounded
    half to even. With clamp (the x axis) a source index at the last pixel takes weight 1 on it."""
    ratio = n_out / n_in
    d = np.arange(n_out)
    sx = np.floor(d * (1.0 / ratio)).astype(np.intp)
    fx = ((d + 1) - (sx + 1) * ratio).astype(np.float32)
    fx = np.where(fx <= 0, np.float32(0), fx - np.floor(fx)).astype(np.float32)
    if clamp:
        fx[sx >= n_in - 1] = 0
        sx = np.minimum(sx, n_in - 1)
    one = np.float32(FIXED_ONE)
    return sx, np.rint((np.float32(1) - fx) * one).astype(np.int32), np.rint(fx * one).astype(np.int32)


def area_resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """cv2.resize(img, (width, height), interpolation=INTER_AREA) of an H×W×C uint8 image, bit for bit: shrinking
    both axes by whole factors sums each block in integers (a 2×2 block (sum + 2) >> 2, else the float32 mean
    rounded half to even); shrinking by other factors, float32 area shares accumulated in OpenCV's order; else
    OpenCV's two-tap rule in fixed point (along x: 11-bit weights on the pixels; along y: ((w·(row >> 4)) >> 16)
    for each of the two rows, then (sum + 2) >> 2)."""
    h, w, c = img.shape
    if (h, w) == (height, width):
        return img
    rx, ry = width / w, height / h                  # OpenCV's inverse scales, and its scales 1 / them
    sx, sy = 1.0 / rx, 1.0 / ry
    if sx >= 1 and sy >= 1:
        kx, ky = round(sx), round(sy)
        if abs(sx - kx) < DBL_EPS and abs(sy - ky) < DBL_EPS:
            blocks = img.astype(np.int32).reshape(height, ky, width, kx, c).sum(axis=(1, 3))
            if kx == ky == 2:
                return ((blocks + 2) >> 2).astype(np.uint8)
            return _round_u8(blocks.astype(np.float32) * (np.float32(1) / np.float32(kx * ky)))
        (xi, xw), (yi, yw) = _area_taps(w, width, sx), _area_taps(h, height, sy)
        rows = np.zeros((h, width, c), np.float32)
        for k in range(xi.shape[1]):
            rows += img[:, xi[:, k]] * xw[None, :, k, None]      # (uint8 · float32: float32 products)
        out = np.zeros((height, width, c), np.float32)
        for k in range(yi.shape[1]):
            out += yw[:, k, None, None] * rows[yi[:, k]]
        return _round_u8(out)
    xs, xa, xb = _linear_taps(w, width, clamp=True)
    ys, ya, yb = _linear_taps(h, height, clamp=False)
    src = img.astype(np.int32)
    rows = src[:, xs] * xa[None, :, None]
    rows += src[:, np.minimum(xs + 1, w - 1)] * xb[None, :, None]
    rows >>= 4
    top, bottom = rows[np.minimum(ys, h - 1)], rows[np.minimum(ys + 1, h - 1)]
    top *= ya[:, None, None]
    top >>= 16
    bottom *= yb[:, None, None]
    bottom >>= 16
    top += bottom + 2
    return np.clip(top >> 2, 0, 255).astype(np.uint8)


def _round_u8(x: np.ndarray) -> np.ndarray:
    """float32 -> uint8 as OpenCV's saturate_cast: rounded half to even, clipped to [0, 255]."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


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
    alphas = rng.normal(0.0, abs(std), 3).astype(np.float32)   # (abs: -0.0 as 0, which numpy refuses)
    delta_rgb = LIGHTING_EIGVECS @ (LIGHTING_EIGVALS * alphas)
    img += delta_rgb[::-1]


def normalize(img: np.ndarray, mean: np.ndarray, inv_std: np.ndarray) -> np.ndarray:
    """(img - mean[c]) · inv_std[c] over the last axis (c < the image's channels)."""
    c = img.shape[-1]
    return (img - mean[:c]) * inv_std[:c]
