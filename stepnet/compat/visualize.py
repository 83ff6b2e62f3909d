"""Caffe2's visualize module: tensors shown as images with matplotlib (imported when something is shown).

PatchVisualizer tiles patches (H×W gray, H×W×1 or H×W×3 color; a flat row is taken as a square patch) into one
image, `gap` pixels apart on a background of bg_func(patches), and hands it to pyplot.imshow. NHWC and NCHW
show with a default visualizer, NCHW after moving the channel axis last.
"""
from __future__ import annotations

import math

import numpy as np


def _pyplot():
    from matplotlib import cm, pyplot
    return cm, pyplot


def ChannelFirst(arr):
    """An ...HWC array as ...CHW (a view)."""
    return np.moveaxis(arr, -1, -3)


def ChannelLast(arr):
    """An ...CHW array as ...HWC (a view)."""
    return np.moveaxis(arr, -3, -1)


class PatchVisualizer:
    """Shows patches with pyplot; `gap`: the pixels between tiled patches."""

    def __init__(self, gap: int = 1):
        self.gap = gap

    def ShowSingle(self, patch, cmap=None):
        """Show one patch (flat: taken as square; 2-D: gray; 3-D: 3 color channels last) and return it."""
        if patch.ndim == 1:
            patch = patch.reshape(self.get_patch_shape(patch))
        elif patch.ndim > 2 and patch.shape[2] != 3:
            raise ValueError("The input patch shape isn't correct.")
        cm, pyplot = _pyplot()
        if patch.ndim == 2 and cmap is None:
            cmap = cm.gray
        pyplot.imshow(patch, cmap=cmap)
        return patch

    def ShowMultiple(self, patches, ncols=None, cmap=None, bg_func=np.mean):
        """Tile patches (rows of a 2-D array taken as square patches, or N×H×W, N×H×W×1, N×H×W×3) in a grid of
        ncols columns (default: a square grid), show the image and return it."""
        count = patches.shape[0]
        ncols = ncols or int(math.ceil(math.sqrt(count)))
        nrows = int(math.ceil(count / float(ncols)))
        if patches.ndim == 2:
            patches = patches.reshape((count,) + self.get_patch_shape(patches[0]))
        step = np.array(patches.shape[1:3]) + self.gap
        size = tuple(int(v) for v in step * np.array([nrows, ncols]) - self.gap)
        cm, pyplot = _pyplot()
        shape = size
        if patches.ndim == 4:
            if patches.shape[3] == 1:
                patches = patches[..., 0]
            elif patches.shape[3] == 3:
                shape = size + (3,)
            else:
                raise ValueError("The input patch shape isn't expected.")
        if len(shape) == 2 and cmap is None:
            cmap = cm.gray
        image = np.full(shape, bg_func(patches), dtype=np.float64)
        for k in range(count):
            top, left = k // ncols * step[0], k % ncols * step[1]
            image[top:top + patches.shape[1], left:left + patches.shape[2]] = patches[k]
        pyplot.imshow(image, cmap=cmap, interpolation="nearest")
        pyplot.axis("off")
        return image

    def ShowImages(self, patches, *args, **kwargs):
        """ShowMultiple of the patches scaled to [0, 1]."""
        patches = patches - np.min(patches)
        patches = patches / (np.max(patches) + np.finfo(np.float64).eps)
        return self.ShowMultiple(patches, *args, **kwargs)

    def ShowChannels(self, patch, cmap=None, bg_func=np.mean):
        """Each channel of an H×W×C patch as a gray patch of its own."""
        if patch.ndim != 3:
            raise ValueError("The input patch shape isn't correct.")
        return self.ShowMultiple(np.swapaxes(patch.T, 1, 2), cmap=cmap, bg_func=bg_func)

    def get_patch_shape(self, patch) -> tuple:
        """The square (n, n) or color (n, n, 3) shape of a flat patch."""
        side = math.isqrt(patch.size)
        if side * side == patch.size:
            return (side, side)
        if patch.size % 3 == 0 and math.isqrt(patch.size // 3) ** 2 == patch.size // 3:
            side = math.isqrt(patch.size // 3)
            return (side, side, 3)
        raise ValueError("I can't figure out the patch shape.")


_default_visualizer = PatchVisualizer()


class NHWC:
    """The default visualizer's functions for channel-last arrays (they return nothing)."""

    @staticmethod
    def ShowSingle(*args, **kwargs):
        _default_visualizer.ShowSingle(*args, **kwargs)

    @staticmethod
    def ShowMultiple(*args, **kwargs):
        _default_visualizer.ShowMultiple(*args, **kwargs)

    @staticmethod
    def ShowImages(*args, **kwargs):
        _default_visualizer.ShowImages(*args, **kwargs)

    @staticmethod
    def ShowChannels(*args, **kwargs):
        _default_visualizer.ShowChannels(*args, **kwargs)


class NCHW:
    """The default visualizer's functions for channel-first arrays (they return nothing)."""

    @staticmethod
    def ShowSingle(patch, *args, **kwargs):
        _default_visualizer.ShowSingle(ChannelLast(patch), *args, **kwargs)

    @staticmethod
    def ShowMultiple(patch, *args, **kwargs):
        _default_visualizer.ShowMultiple(ChannelLast(patch), *args, **kwargs)

    @staticmethod
    def ShowImages(patch, *args, **kwargs):
        _default_visualizer.ShowImages(ChannelLast(patch), *args, **kwargs)

    @staticmethod
    def ShowChannels(patch, *args, **kwargs):
        _default_visualizer.ShowChannels(ChannelLast(patch), *args, **kwargs)
