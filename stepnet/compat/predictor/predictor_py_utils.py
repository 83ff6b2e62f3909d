"""caffe2.python.predictor.predictor_py_utils: the MetaNetDef's key/value lists (nets, blobs, plans, info) and the
predict and predict-init nets an export holds."""
from __future__ import annotations

from .. import core, scope, workspace


def create_predict_net(predictor_export_meta):
    """The export's predict net: its ops and args, inputs and parameters as external inputs, outputs as outputs."""
    meta = predictor_export_meta
    net = core.Net(meta.predict_net.name or "predict")
    proto = net.Proto()
    proto.op.extend(meta.predict_net.op)
    proto.external_input.extend(meta.inputs + meta.parameters)
    proto.external_output.extend(meta.outputs)
    proto.arg.extend(meta.predict_net.arg)
    if meta.net_type is not None:
        proto.type = meta.net_type
    if meta.num_workers is not None:
        proto.num_workers = meta.num_workers
    return proto


def create_predict_init_net(ws, predictor_export_meta):
    """A net zero-filling the inputs and outputs, shaped by meta.shapes or else by the blobs in the workspace."""
    meta = predictor_export_meta
    net = core.Net("predict-init")
    blobs = meta.inputs + meta.outputs
    for blob in blobs:
        shape = meta.shapes.get(blob)
        if shape is None:
            if not workspace.HasBlob(blob):
                raise Exception(f"{blob} not in workspace but needed for shape: {workspace.Blobs()}")
            shape = workspace.FetchBlob(blob).shape
        with scope.EmptyDeviceScope():     # the caller sets these fills' device for the whole net
            net.ConstantFill([], blob, shape=shape, value=0.0)
    net.Proto().external_input.extend(blobs)
    if meta.extra_init_net:
        net.AppendNet(meta.extra_init_net)
    AddModelIdArg(meta, net.Proto())
    return net.Proto()


def get_comp_name(string, name):
    return f"{string}_{name}" if name else string


def _ProtoMapGet(field, key):
    """The value under key in a repeated key/value field, or None."""
    return next((entry.value for entry in field if entry.key == key), None)


def GetPlan(meta_net_def, key):
    return _ProtoMapGet(meta_net_def.plans, key)


GetPlanOriginal = GetPlan


def GetBlobs(meta_net_def, key):
    blobs = _ProtoMapGet(meta_net_def.blobs, key)
    return [] if blobs is None else blobs


def GetNet(meta_net_def, key):
    return _ProtoMapGet(meta_net_def.nets, key)


GetNetOriginal = GetNet


def GetApplicationSpecificInfo(meta_net_def, key):
    return _ProtoMapGet(meta_net_def.applicationSpecificInfo, key)


def AddBlobs(meta_net_def, blob_name, blob_def):
    blobs = _ProtoMapGet(meta_net_def.blobs, blob_name)
    if blobs is None:
        blobs = meta_net_def.blobs.add(key=blob_name).value
    blobs.extend(blob_def)


def AddPlan(meta_net_def, plan_name, plan_def):
    meta_net_def.plans.add(key=plan_name, value=plan_def)


def AddNet(meta_net_def, net_name, net_def):
    meta_net_def.nets.add(key=net_name, value=net_def)


def GetArgumentByName(net_def, arg_name):
    return next((arg for arg in net_def.arg if arg.name == arg_name), None)


def AddModelIdArg(meta_net_def, net_def):
    """Copy the predict net's integer model_id argument (if any) onto net_def, replacing one it has."""
    model_id = GetArgumentByName(meta_net_def.predict_net, "model_id")
    if model_id is None:
        return
    old = GetArgumentByName(net_def, "model_id")
    if old is not None:
        old.i = model_id.i
    else:
        net_def.arg.add(name="model_id", i=model_id.i)
