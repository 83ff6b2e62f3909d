"""caffe2.python.predictor.predictor_exporter: a predict net and its parameters saved to one db (the serialized
MetaNetDef under predictor_constants.META_NET_DEF, then the parameters), and loaded back: the MetaNetDef holds a
global init net (Load of the parameters from the PREDICTOR_DBREADER reader), a predict init net (zero-filled
inputs and outputs) and the predict net."""
from __future__ import annotations

import collections

from ...caffe2_pb2 import CPU, MetaNetDef, NetDef, PlanDef
from .. import core, scope, workspace
from ..predictor_constants import predictor_constants
from . import predictor_py_utils as utils
from . import serde

_FIELDS = "predict_net, parameters, inputs, outputs, shapes, name, extra_init_net, net_type, num_workers"


class PredictorExportMeta(collections.namedtuple("PredictorExportMeta", _FIELDS)):
    """What an export holds: the predict net (core.Net, Plan, NetDef or PlanDef), parameter, input and output names
    (unique inputs; parameters disjoint from both), shapes for the predict init net, a name telling several
    predict nets of one db apart, an extra init net, the net type and its number of workers."""

    def __new__(cls, predict_net, parameters, inputs, outputs, shapes=None, name="", extra_init_net=None,
                net_type=None, num_workers=None):
        inputs, outputs, parameters = ([str(b) for b in blobs] for blobs in (inputs, outputs, parameters))
        assert len(set(inputs)) == len(inputs), "All inputs to the predictor should be unique"
        for kind, others in (("inputs", inputs), ("outputs", outputs)):
            shared = set(parameters).intersection(others)
            assert not shared, f"Parameters and {kind} are required to be disjoint. Intersection: {shared}"
        if isinstance(predict_net, (core.Net, core.Plan)):
            predict_net = predict_net.Proto()
        assert isinstance(predict_net, (NetDef, PlanDef))
        return super().__new__(cls, predict_net, parameters, inputs, outputs, shapes or {}, name, extra_init_net,
                               net_type, num_workers)

    def _named(self, kind):
        return utils.get_comp_name(getattr(predictor_constants, kind), self.name)

    def inputs_name(self):
        return self._named("INPUTS_BLOB_TYPE")

    def outputs_name(self):
        return self._named("OUTPUTS_BLOB_TYPE")

    def parameters_name(self):
        return self._named("PARAMETERS_BLOB_TYPE")

    def global_init_name(self):
        return self._named("GLOBAL_INIT_NET_TYPE")

    def predict_init_name(self):
        return self._named("PREDICT_INIT_NET_TYPE")

    def predict_net_name(self):
        return self._named("PREDICT_NET_TYPE")

    def train_init_plan_name(self):
        return self._named("TRAIN_INIT_PLAN_TYPE")

    def train_plan_name(self):
        return self._named("TRAIN_PLAN_TYPE")


def get_predictor_exporter_helper(submodelNetName):
    """An empty export named submodelNetName (for the names of its parts)."""
    return PredictorExportMeta(predict_net=core.Net(submodelNetName), parameters=[], inputs=[], outputs=[],
                               shapes=None, name=submodelNetName, extra_init_net=None)


def _global_init_net(meta):
    net = core.Net("global-init")
    net.Load([predictor_constants.PREDICTOR_DBREADER], meta.parameters)
    net.Proto().external_input.extend([predictor_constants.PREDICTOR_DBREADER])
    net.Proto().external_output.extend(meta.parameters)
    utils.AddModelIdArg(meta, net.Proto())
    return net.Proto()


def get_meta_net_def(predictor_export_meta, ws=None):
    meta = predictor_export_meta
    meta_net_def = MetaNetDef()
    utils.AddNet(meta_net_def, meta.predict_init_name(), utils.create_predict_init_net(ws, meta))
    utils.AddNet(meta_net_def, meta.global_init_name(), _global_init_net(meta))
    utils.AddNet(meta_net_def, meta.predict_net_name(), utils.create_predict_net(meta))
    utils.AddBlobs(meta_net_def, meta.parameters_name(), meta.parameters)
    utils.AddBlobs(meta_net_def, meta.inputs_name(), meta.inputs)
    utils.AddBlobs(meta_net_def, meta.outputs_name(), meta.outputs)
    return meta_net_def


def set_model_info(meta_net_def, project_str, model_class_str, version):
    assert isinstance(meta_net_def, MetaNetDef)
    meta_net_def.modelInfo.project = project_str
    meta_net_def.modelInfo.modelClass = model_class_str
    meta_net_def.modelInfo.version = version


def save_to_db(db_type, db_destination, predictor_export_meta):
    """Save the MetaNetDef (first) and the parameters to db_destination (an absolute path is kept as given)."""
    meta_net_def = get_meta_net_def(predictor_export_meta)
    with core.DeviceScope(core.DeviceOption(CPU)):
        workspace.FeedBlob(predictor_constants.META_NET_DEF, serde.serialize_protobuf_struct(meta_net_def))
    blobs = [predictor_constants.META_NET_DEF] + predictor_export_meta.parameters
    workspace.RunOperatorOnce(core.CreateOperator("Save", blobs, [], absolute_path=True, db=db_destination,
                                                  db_type=db_type))


def load_from_db(filename, db_type, device_option=None):
    """The MetaNetDef of an export db; the db's reader is left in PREDICTOR_DBREADER for the global init net.
    Every op of its nets gets device_option (default: the current device scope, if any)."""
    reader = core.BlobReference(predictor_constants.PREDICTOR_DBREADER)
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], [reader], db=filename, db_type=db_type))
    workspace.RunOperatorOnce(core.CreateOperator("Load", [reader],
                                                  [core.BlobReference(predictor_constants.META_NET_DEF)]))
    blob = workspace.FetchBlob(predictor_constants.META_NET_DEF)
    meta_net_def = serde.deserialize_protobuf_struct(blob if isinstance(blob, bytes) else str(blob).encode("utf-8"),
                                                     MetaNetDef)
    if device_option is None:
        device_option = scope.CurrentDeviceScope()
    if device_option is not None:
        for entry in meta_net_def.nets:
            for op in entry.value.op:
                op.device_option.CopyFrom(device_option)
    return meta_net_def


def prepare_prediction_net(filename, db_type, device_option=None):
    """Load an export: run its global and predict init nets, create the predict net and return it."""
    meta_net_def = load_from_db(filename, db_type, device_option)
    workspace.RunNetOnce(utils.GetNet(meta_net_def, predictor_constants.GLOBAL_INIT_NET_TYPE))
    workspace.RunNetOnce(utils.GetNet(meta_net_def, predictor_constants.PREDICT_INIT_NET_TYPE))
    predict_net = core.Net(utils.GetNet(meta_net_def, predictor_constants.PREDICT_NET_TYPE))
    workspace.CreateNet(predict_net)
    return predict_net
