"""Caffe2's model layers: importing the package imports every layer module and registers each ModelLayer
subclass under its class name (LayerModelHelper's `model.FC(...)` looks them up there). The layers live in
modules by family; Caffe2's one-module-per-layer names (`layers.fc`, `layers.sparse_lookup`, ...) are those
family modules too, so `from caffe2.python.layers.fc import FC` works."""
from __future__ import annotations

import importlib
import pkgutil
import sys

from . import layers


def import_recursive(package) -> None:
    """Import every module under package."""
    for _, name, ispkg in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{name}")
        if ispkg:
            import_recursive(module)


def find_subclasses_recursively(base_cls, sub_cls: set) -> None:
    for cls in base_cls.__subclasses__():
        sub_cls.add(cls)
        find_subclasses_recursively(cls, sub_cls)


import_recursive(importlib.import_module(__name__))

model_layer_subcls: set = set()
find_subclasses_recursively(layers.ModelLayer, model_layer_subcls)
for _cls in sorted(model_layer_subcls, key=lambda c: c.__name__):
    if not _cls.__name__.startswith("_"):
        layers.register_layer(_cls.__name__, _cls)

# Caffe2's module of each layer -> the family module holding it here
CAFFE2_MODULES = {
    "dense": ("fc", "fc_without_bias", "sampling_train", "sampling_trainable_mixin", "add_bias", "conv"),
    "normalization": ("batch_normalization", "dropout"),
    "records": ("concat", "split", "gather_record", "select_record_by_context", "pairwise_dot_product"),
    "sparse": ("sparse_lookup", "position_weighted", "sparse_feature_hash", "merge_id_lists", "build_index"),
    "sparse_to_dense": ("feature_sparse_to_dense",),
    "losses": ("batch_lr_loss", "batch_mse_loss", "batch_sigmoid_cross_entropy_loss", "batch_softmax_loss",
               "margin_rank_loss", "batch_distill_lr_loss"),
    "random_features": ("random_fourier_features", "arc_cosine_feature_map", "semi_random_features"),
    "weights": ("adaptive_weight", "constant_weight", "homotopy_weight", "label_smooth"),
    "sampling": ("last_n_window_collector", "uniform_sampling", "reservoir_sampling"),
}
for _family, _names in CAFFE2_MODULES.items():
    for _name in _names:
        sys.modules.setdefault(f"{__name__}.{_name}", sys.modules[f"{__name__}.{_family}"])
