"""Images in and out of blobs (Pillow, the optional `image` extra): uint8 N×H×W×C arrays in a named
channel layout (rgb, bgr, rgba, bgra, gray)."""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np

from ..core.errors import ArgumentError, FileFormatError, StepnetError, did_you_mean
from ..core.limits import check_blob
from ..core.extras import install_hint
from .files import open_regular

SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff"}
LAYOUTS = {"rgb": "RGB", "bgr": "RGB", "rgba": "RGBA", "bgra": "RGBA", "gray": "L"}


def is_image_path(text: str) -> bool:
    return Path(text.rsplit(":", 1)[0] if ":" in text else text).suffix.lower() in SUFFIXES


def split_layout(text: str, default: str = "rgb") -> tuple[str, str]:
    """'photo.png:bgra' -> ('photo.png', 'bgra'); 'photo.png' -> ('photo.png', default)."""
    path, sep, layout = text.rpartition(":")
    if sep and layout.lower() in LAYOUTS:
        return path, layout.lower()
    if sep and Path(path).suffix.lower() in SUFFIXES:
        raise ArgumentError(f"image layout {layout!r} is not one of {', '.join(LAYOUTS)}"
                            f"{did_you_mean(layout.lower(), LAYOUTS)}")
    return text, default


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise StepnetError(f"reading and writing images needs Pillow: {install_hint('image')}") from None
    return Image


def open_as_named(Image, f, path):
    """The image in f, opened by the reader of the format path's suffix names and no other: Pillow guessing by
    content would hand PostScript saved as .png to its EPS reader, which runs Ghostscript."""
    fmt = format_of(path)
    Image.init()
    if fmt not in Image.OPEN:
        raise FileFormatError(f"{path}: this Pillow cannot read {fmt} images")
    try:
        return Image.open(f, formats=[fmt])
    except Image.UnidentifiedImageError:
        raise FileFormatError(f"{path}: not an image Pillow can read as {fmt}, the format its suffix names (stepnet "
                              "opens no other: a file of another format needs that format's suffix)") from None


def read_image(path, layout: str = "rgb", max_blob_bytes: int | None = None, name: str | None = None) -> np.ndarray:
    """The image as a uint8 array 1×H×W×C in the given channel layout. With max_blob_bytes, an image whose header
    gives more is refused before it is decoded (a few KB of PNG may hold a 13000×13000 image); name: its blob."""
    Image = _pil()
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileFormatError(f"{path}: no such image file")
    with open_regular(path, "the image") as f:
        try:
            with warnings.catch_warnings():   # (the limit below is the check; Pillow's bomb warning is noise)
                if max_blob_bytes is not None:
                    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                im = open_as_named(Image, f, path)
            with im:
                if max_blob_bytes is not None:
                    width, height = im.size
                    check_blob(max_blob_bytes, name or str(path), (1, height, width, len(LAYOUTS[layout])),
                               np.uint8, f"--feed {path}")
                im.load()
                arr = np.asarray(im.convert(LAYOUTS[layout]))
        except StepnetError:
            raise
        except Exception as e:  # noqa: BLE001 - Pillow meeting a bad file raises OSError, ValueError, SyntaxError, ...
            raise FileFormatError(f"{path}: not an image Pillow can read ({type(e).__name__}: {e})") from None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if layout in ("bgr", "bgra"):
        arr = arr[:, :, [2, 1, 0, *([3] if layout == "bgra" else [])]]
    return np.ascontiguousarray(arr[None])


def image_bytes(array, layout: str = "rgb", fmt: str = "PNG") -> bytes:
    """Encode a (1×)H×W×C blob (uint8, or float clipped to [0, 255]) as an image file's bytes."""
    Image = _pil()
    arr = np.asarray(array)
    if arr.ndim == 4:
        if arr.shape[0] != 1:
            raise ArgumentError(f"an image blob must hold one image, got a batch of {arr.shape[0]} {arr.shape}")
        arr = arr[0]
    want = {"gray": 1, "rgb": 3, "bgr": 3, "rgba": 4, "bgra": 4}[layout]
    if arr.ndim != 3 or arr.shape[2] != want:
        raise ArgumentError(f"blob of shape {arr.shape} is not an H×W×{want} image for layout {layout!r}; "
                            "images are saved from N×H×W×C (NHWC) blobs")
    if arr.dtype != np.uint8:
        arr = np.clip(np.rint(arr), 0, 255).astype(np.uint8)
    if layout in ("bgr", "bgra"):
        arr = arr[:, :, [2, 1, 0, *([3] if layout == "bgra" else [])]]
    mode = LAYOUTS[layout]
    buf = io.BytesIO()
    try:
        Image.fromarray(np.ascontiguousarray(arr[:, :, 0] if mode == "L" else arr), mode).save(buf, format=fmt)
    except (OSError, ValueError, KeyError) as e:   # Pillow: this format has no writer for this mode
        fix = "; keep the alpha channel with .png, .webp or .tif, or drop it with layout rgb" if want == 4 else ""
        raise ArgumentError(f"cannot save a {layout} image as {fmt} ({e}){fix}") from None
    return buf.getvalue()


def format_of(path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ArgumentError(f"{path}: unknown image type {suffix!r}; use one of {', '.join(sorted(SUFFIXES))}")
    return {".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF", ".pgm": "PPM"}.get(
        suffix, suffix[1:].upper())
