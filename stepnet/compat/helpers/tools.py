"""brew.image_input and brew.video_input (Caffe2's helpers/tools.py). ImageInput writes NHWC; for order NCHW
(the default) the helper names its output `<data>_nhwc` and adds an NHWC2NCHW to `<data>`, unless
use_gpu_transform asks the op for NCHW itself."""
from __future__ import annotations


def image_input(model, blob_in, blob_out, order="NCHW", use_gpu_transform=False, **kwargs):
    if "is_test" not in kwargs:
        raise AssertionError("Argument 'is_test' is required")
    if order != "NCHW":
        return model.net.ImageInput(blob_in, blob_out, **kwargs)
    if use_gpu_transform:
        return model.net.ImageInput(blob_in, blob_out, use_gpu_transform=1, **kwargs)
    outputs = list(model.net.ImageInput(blob_in, [blob_out[0] + "_nhwc"] + list(blob_out[1:]), **kwargs))
    outputs[0] = model.net.NHWC2NCHW(outputs[0], blob_out[0])
    return tuple(outputs)


def video_input(model, blob_in, blob_out, **kwargs):
    return model.net.VideoInput(blob_in, blob_out, **kwargs)
