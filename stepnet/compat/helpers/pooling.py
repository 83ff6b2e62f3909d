"""brew.max_pool, average_pool and max_pool_with_index."""
from __future__ import annotations


def max_pool(model, blob_in, blob_out, use_cudnn=False, order="NCHW", **kwargs):
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.MaxPool(blob_in, blob_out, order=order, **kwargs)


def average_pool(model, blob_in, blob_out, use_cudnn=False, order="NCHW", **kwargs):
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.AveragePool(blob_in, blob_out, order=order, **kwargs)


def max_pool_with_index(model, blob_in, blob_out, order="NCHW", **kwargs):
    """Max pooling with the position of each maximum: MaxPoolWithIndex(blob_in) -> (blob_out, `<out>_index`);
    returns blob_out. Caffe2 has the op on CUDA only; stepnet on every device (stepnet/ops/pool.py)."""
    return model.net.MaxPoolWithIndex(blob_in, [blob_out, blob_out + "_index"], order=order, **kwargs)[0]
