"""An ONNX graph split as Caffe2's backend split it (with onnx.optimizer's split_init / split_predict passes, which
later onnx releases dropped): the init part computes what depends on initializers (and constants) only, the
predict part the rest. Also the values and shapes known before running (consts, shapes) that the converters use.
"""
from __future__ import annotations

import numpy as np


def split_nodes(graph) -> tuple[list, list]:
    """(init nodes, predict nodes) of graph, each in graph order."""
    static = {t.name for t in graph.initializer}
    init, predict = [], []
    for node in graph.node:
        if all(not name or name in static for name in node.input) and _pure(node):
            init.append(node)
            static.update(node.output)
        else:
            predict.append(node)
    return init, predict


def _pure(node) -> bool:
    """A node that gives the same values on every run (not a random generator)."""
    return not node.op_type.startswith("Random") and node.op_type not in ("Bernoulli", "Multinomial")


def split_model(model, init: bool):
    """A copy of model holding its init part (init=True) or its predict part, with the graph inputs and outputs
    each part reads and writes."""
    part = type(model)()
    part.CopyFrom(model)
    graph = part.graph
    init_nodes, predict_nodes = split_nodes(model.graph)
    nodes = init_nodes if init else predict_nodes
    made_by_init = {o for n in init_nodes for o in n.output}
    read = {i for n in predict_nodes for i in n.input}
    del graph.node[:]
    graph.node.extend(nodes)
    if init:
        used = {i for n in init_nodes for i in n.input}
        inputs = [v for v in model.graph.input if v.name in used]
        outputs = [o for o in dict.fromkeys(o for n in init_nodes for o in n.output)
                   if o in read or o in {v.name for v in model.graph.output}]
        del graph.input[:], graph.output[:], graph.initializer[:]
        graph.input.extend(inputs)
        from onnx import helper
        graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outputs)
    else:
        from onnx import helper
        del graph.initializer[:]
        graph.input.extend(helper.make_empty_tensor_value_info(o) for o in sorted(made_by_init & read))
    return part


def constants(model) -> dict:
    """The values known before running: the initializers and what Constant nodes make."""
    from onnx import numpy_helper
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            value = constant_value(node)
            if value is not None:
                values[node.output[0]] = value
    return values


def constant_value(node):
    """The array a Constant node makes (None for a sparse value)."""
    from onnx import helper, numpy_helper
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if attr.name == "value":
            return numpy_helper.to_array(value)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
        if attr.name in ("value_string", "value_strings"):
            return np.asarray(value, dtype=object)
    return None


def shapes(model) -> dict:
    """{value name: shape} for the values whose rank onnx's shape inference knows (None for an unknown dim)."""
    from onnx import shape_inference
    try:
        inferred = shape_inference.infer_shapes(model).graph
    except Exception:   # a model the installed onnx cannot infer (e.g. an op of Caffe2's days it lacks)
        inferred = model.graph
    known = {}
    for info in [*inferred.input, *inferred.value_info, *inferred.output]:
        tensor = info.type.tensor_type
        if tensor.HasField("shape"):
            known[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    for t in model.graph.initializer:
        known[t.name] = list(t.dims)
    return known
