"""Caffe2's layer_model_instantiator: the nets of a LayerModelHelper — prediction, eval, training (forward only,
or with gradients, regularizers, optimizers and net modifiers) — each from the layers whose tags allow it."""
from __future__ import annotations

from . import core, schema
from .layers.layers import InstantiationContext
from .layers.tags import Tags


def _filter_layers(layers, include_tags):
    if include_tags is None:
        return layers
    include_tags = set(include_tags)
    return [layer for layer in layers if not include_tags.isdisjoint(layer.tags)]


def shrink_output_schema(net, out_schema):
    """out_schema without the fields whose blobs net does not define (a schema of one field is kept)."""
    if len(out_schema.field_names()) <= 1:
        return out_schema
    keep = [net.BlobIsDefined(blob) for blob in out_schema.field_blobs()]

    def kept(values):
        return [v for ok, v in zip(keep, values) if ok]
    return schema.from_column_list(kept(out_schema.field_names()), kept(out_schema.field_types()),
                                   kept(out_schema.field_blobs()), kept(out_schema.field_metadata()))


def generate_predict_net(model, include_tags=None):
    predict_net = core.Net("predict_net")
    for layer in _filter_layers(model.layers, include_tags):
        if Tags.EXCLUDE_FROM_PREDICTION not in layer.tags:
            layer.add_operators(predict_net, context=InstantiationContext.PREDICTION)
    predict_net.set_input_record(model.input_feature_schema.clone())
    predict_net.set_output_record(shrink_output_schema(predict_net, model.output_schema.clone()))
    return predict_net


def generate_eval_net(model, include_tags=None):
    eval_net = core.Net("eval_net")
    for layer in _filter_layers(model.layers, include_tags):
        if Tags.EXCLUDE_FROM_EVAL not in layer.tags:
            layer.add_operators(eval_net, context=InstantiationContext.EVAL)
    eval_net.set_input_record(model.input_feature_schema + model.trainer_extra_schema)
    eval_net.set_output_record(shrink_output_schema(eval_net, model.output_schema + model.metrics_schema))
    return eval_net


def _generate_training_net_only(model, include_tags=None):
    train_net = core.Net("train_net")
    train_init_net = model.create_init_net("train_init_net")
    for layer in _filter_layers(model.layers, include_tags):
        if Tags.EXCLUDE_FROM_TRAIN not in layer.tags:
            layer.add_operators(train_net, train_init_net)
    train_net.set_input_record(model.input_feature_schema + model.trainer_extra_schema)
    train_net.set_output_record(shrink_output_schema(train_net, model.output_schema + model.metrics_schema))
    return train_init_net, train_net


def generate_training_nets_forward_only(model, include_tags=None):
    """(train_init_net, train_net) without the backward pass."""
    return _generate_training_net_only(model, include_tags)


def generate_training_nets(model, include_tags=None):
    """(train_init_net, train_net): the forward pass, loss regularizers, then (when the model has a loss) the
    gradients, post-gradient modifiers, optimizers, after-optimizer regularizers and final modifiers."""
    train_init_net, train_net = _generate_training_net_only(model, include_tags)
    model.apply_regularizers_on_loss(train_net, train_init_net)
    if not model.has_loss():
        return train_init_net, train_net
    grad_map = train_net.AddGradientOperators(model.loss.field_blobs())
    model.apply_post_grad_net_modifiers(train_net, train_init_net, grad_map)
    model.apply_optimizers(train_net, train_init_net, grad_map)
    model.apply_regularizers_after_optimizer(train_net, train_init_net, grad_map)
    model.apply_final_net_modifiers(train_net, train_init_net, grad_map)
    return train_init_net, train_net
