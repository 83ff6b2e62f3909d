"""caffe2.python.predictor.mobile_exporter: a net and the current values of its parameters as the pair of NetDefs
Caffe2's model zoo ships (init_net.pb, predict_net.pb), the form `workspace.Predictor` and mobile runtimes load.

The init net holds one GivenTensor*Fill per parameter (by dtype: float32 GivenTensorFill, int32
GivenTensorIntFill, int64 GivenTensorInt64Fill, uint8 GivenTensorStringFill of shape [1] holding the array's bytes,
as this Caffe2 wrote it) and a 1×1 zero GivenTensorFill per input the net reads before writing (so the blob
exists; a caller feeds the real one). The predict net is a copy of the net whose external inputs are those inputs
followed by the net's own external inputs, and whose external outputs are the blobs it writes but never reads.
"""
from __future__ import annotations

import numpy as np

from ...caffe2_pb2 import NetDef
from .. import core, utils

# the fill op that rebuilds a blob of each dtype Caffe2's exporter handles
_FILL_OPS = {
    np.dtype(np.float32): "GivenTensorFill",
    np.dtype(np.int32): "GivenTensorIntFill",
    np.dtype(np.int64): "GivenTensorInt64Fill",
    np.dtype(np.uint8): "GivenTensorStringFill",
}


def add_tensor(net: NetDef, name: str, blob: np.ndarray) -> None:
    """Append to the NetDef `net` the fill op that makes blob `name` hold `blob` (a float32, int32, int64 or
    uint8 array; KeyError for another dtype, as in Caffe2). A uint8 array is stored as one string, its bytes."""
    blob = np.asarray(blob)
    fill = _FILL_OPS[blob.dtype]
    if blob.dtype == np.uint8:
        shape, values = [1], [np.ascontiguousarray(blob).tobytes()]
    else:
        shape, values = list(blob.shape), blob.ravel()
    net.op.extend([core.CreateOperator(fill, [], [name], arg=[utils.MakeArgument("shape", shape),
                                                               utils.MakeArgument("values", values)])])


def Export(workspace, net, params) -> tuple[NetDef, NetDef]:
    """(init_net, predict_net) for `net` (a core.Net or NetDef) with the parameters `params` (names or
    BlobReferences), whose values are fetched through `workspace` (the workspace module, or anything with
    FetchBlob)."""
    proto = net if isinstance(net, NetDef) else net.Proto()
    param_names = [str(p) for p in params]
    ssa, versions = core.get_ssa(proto)
    read_set = {name for inputs, _ in ssa for name, _ in inputs}
    inputs = [b for b, v in versions.items() if v == 0 and b not in param_names]
    outputs = [b for b, v in versions.items() if v != 0 and b not in read_set]

    init_net = NetDef()
    for name in param_names:
        add_tensor(init_net, name, workspace.FetchBlob(name))
    for name in inputs:     # a placeholder, so the blob exists until the caller feeds it
        init_net.op.extend([core.CreateOperator("GivenTensorFill", [], [name], arg=[
            utils.MakeArgument("shape", [1, 1]), utils.MakeArgument("values", [0.0])])])

    predict_net = NetDef()
    predict_net.CopyFrom(proto)
    del predict_net.external_input[:]
    predict_net.external_input.extend(inputs + list(proto.external_input))
    del predict_net.external_output[:]
    predict_net.external_output.extend(outputs)
    return init_net, predict_net
