"""Operator kernels by family; importing this package registers them all in REGISTRY, then freezes it."""
import importlib

from .registry import REGISTRY, Arg, op

# ops/<family>.py, each registering its ops (and naming their gradient makers) when imported.
FAMILIES = ("fill", "random_fill", "elementwise", "elementwise_grad", "activation", "activation_grad", "math",
            "sums", "math_grad", "reduce", "reduce_grad", "shape", "layout", "shape_grad", "index", "control", "scopes",
            "segments", "index_grad", "segment_grad", "util", "device", "conv", "pool", "norm", "image",
            "conv_grad", "pool_grad", "norm_grad", "image_grad", "loss", "softmax_loss", "rowwise_loss",
            "optim", "sparse_optim", "lr", "ftrl", "yellowfin", "mixed_sgd", "clipping", "db", "lstm", "gru",
            "rnn_internal", "recurrent",
            "recurrent_grad", "sampling", "metrics",
            "fp16", "fused_rowwise", "fused_sls", "rowwise8", "sparse_dense",
            "detection", "roi_align", "roi_pool", "fpn",
            "int8", "int8_elementwise", "int8_conv", "int8_pool",
            "pointwise", "pointwise_grad", "selection", "composite", "segment_ranges", "packing", "padding", "queue",
            "mpi", "gloo",
            "masks", "lookup", "calibration", "fills_extra",
            "segment_reducers", "lengths_gather", "partition", "sparse_ids",
            "counters", "maps", "dict_index", "stats", "strings", "rebatching", "tensor_vector", "python_op",
            "dataset_ops", "dataset_records", "window_collector",
            "row_mul", "unique", "segment_conversions", "blob_utils", "histogram", "space_batch", "tt_linear",
            "batch_metrics",
            "misc_math", "channel_stats", "criterion", "rank_loss", "im2col", "locally_connected", "retrieval",
            "text_reader", "hsm", "hsm_search",
            "onnx_loop",
            "image_input", "summarize", "quant_decode", "reservoir")

for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
REGISTRY.freeze()

__all__ = ["FAMILIES", "REGISTRY", "Arg", "op"]
