"""The compiled schema carries Caffe2's message names, field names and numbers (spec §1)."""
import pytest

from stepnet import caffe2_pb2 as pb

# (message, field, number) straight from the spec tables, typed in by hand: an independent reference.
FIELDS = {
    "TensorProto": {"dims": 1, "data_type": 2, "float_data": 3, "int32_data": 4, "byte_data": 5, "string_data": 6,
                    "name": 7, "device_detail": 8, "double_data": 9, "int64_data": 10, "segment": 11,
                    "raw_data": 13, "data_format": 15},
    "QTensorProto": {"dims": 1, "precision": 2, "scale": 3, "bias": 4, "is_signed": 5, "data": 6, "name": 7,
                     "data_type": 8, "scales": 9, "biases": 10, "axis": 11, "is_multiparam": 12},
    "TensorProtos": {"protos": 1},
    "TensorShape": {"dims": 1, "data_type": 2, "unknown_dims": 3, "unknown_shape": 4, "name": 5},
    "TensorShapes": {"shapes": 1},
    "TensorBoundShape": {"shape": 1, "dim_type": 2, "name": 3, "shape_is_final": 4},
    "TensorBoundShapes": {"shapes": 1, "max_batch_size": 2, "max_feature_len": 3},
    "AOTConfig": {"max_batch_size": 1, "max_seq_size": 2, "in_batch_broadcast": 3, "onnxifi_blacklist_ops": 4,
                  "onnxifi_min_ops": 5},
    "Argument": {"name": 1, "f": 2, "i": 3, "s": 4, "floats": 5, "ints": 6, "strings": 7, "n": 8, "nets": 9,
                 "t": 10, "tensors": 11, "qtensors": 12},
    "DeviceOption": {"device_type": 1, "device_id": 2, "random_seed": 3, "node_name": 4, "numa_node_id": 5,
                     "extra_info": 6},
    "OperatorDef": {"input": 1, "output": 2, "name": 3, "type": 4, "arg": 5, "device_option": 6, "engine": 7,
                    "control_input": 8, "is_gradient_op": 9, "debug_info": 10, "domain": 11, "op_version": 12},
    "MapFieldEntry": {"key": 1, "val": 2},
    "BackendOptions": {"backend_name": 1, "option": 2},
    "PartitionInfo": {"name": 1, "device_id": 2, "extra_info": 3, "backend_options": 4},
    "NetDef": {"name": 1, "op": 2, "type": 3, "num_workers": 4, "device_option": 5, "arg": 6, "external_input": 7,
               "external_output": 8, "partition_info": 9},
    "ExecutionStep": {"name": 1, "substep": 2, "network": 3, "num_iter": 4, "criteria_network": 5,
                      "concurrent_substeps": 6, "report_net": 7, "report_interval": 8, "should_stop_blob": 9,
                      "only_once": 10, "run_every_ms": 11, "create_workspace": 12, "num_concurrent_instances": 13},
    "PlanDef": {"name": 1, "network": 2, "execution_step": 3},
    "BlobProto": {"name": 1, "type": 2, "tensor": 3, "content": 4, "qtensor": 5, "content_num_chunks": 6,
                  "content_chunk_id": 7},
    "DBReaderProto": {"name": 1, "source": 2, "db_type": 3, "key": 4},
    "BlobSerializationOptions": {"blob_name_regex": 1, "chunk_size": 2, "float_format": 3},
    "SerializationOptions": {"options": 1},
    "MetaNetDef": {"blobs": 1, "nets": 2, "modelInfo": 3, "plans": 4, "applicationSpecificInfo": 5},
    "ModelInfo": {"project": 1, "modelClass": 2, "version": 3, "predictorType": 4, "modelId": 5},
}

ENUMS = {
    "TensorProto.DataType": {"UNDEFINED": 0, "FLOAT": 1, "INT32": 2, "BYTE": 3, "STRING": 4, "BOOL": 5, "UINT8": 6,
                             "INT8": 7, "UINT16": 8, "INT16": 9, "INT64": 10, "FLOAT16": 12, "DOUBLE": 13,
                             "ZERO_COLLISION_HASH": 14, "REBATCHING_BUFFER": 15},
    "DeviceType": {"CPU": 0, "CUDA": 1, "MKLDNN": 2, "OPENGL": 3, "COMPILE_TIME_MAX_DEVICE_TYPES": 4,
                   "ONLY_FOR_TEST": 20901701},
    "DeviceTypeProto": {"PROTO_CPU": 0, "PROTO_CUDA": 1, "PROTO_MKLDNN": 2, "PROTO_OPENGL": 3, "PROTO_OPENCL": 4,
                        "PROTO_IDEEP": 5, "PROTO_HIP": 6, "PROTO_FPGA": 7, "PROTO_MSNPU": 8, "PROTO_XLA": 9,
                        "PROTO_MLC": 10, "PROTO_COMPILE_TIME_MAX_DEVICE_TYPES": 11},
}


@pytest.mark.parametrize("message", sorted(FIELDS))
def test_fields_and_numbers(message):
    desc = getattr(pb, message).DESCRIPTOR
    assert {f.name: f.number for f in desc.fields} == FIELDS[message]


@pytest.mark.parametrize("enum", sorted(ENUMS))
def test_enums(enum):
    owner, _, name = enum.rpartition(".")
    desc = (getattr(pb, owner).DESCRIPTOR.enum_types_by_name[name] if owner
            else pb.DESCRIPTOR.enum_types_by_name[name])
    assert {v.name: v.number for v in desc.values} == ENUMS[enum]


def test_own_package_and_packing():
    assert pb.NetDef.DESCRIPTOR.full_name == "stepnet.caffe2.NetDef"
    tp = pb.TensorProto.DESCRIPTOR.fields_by_name
    assert all(tp[f].is_packed for f in ("float_data", "int32_data", "double_data", "int64_data"))
    arg = pb.Argument.DESCRIPTOR.fields_by_name
    assert not arg["ints"].is_packed and not arg["floats"].is_packed  # Caffe2 writes these unpacked


def test_defaults():
    assert pb.TensorProto().data_type == pb.TensorProto.FLOAT
    assert pb.DeviceOption().device_type == 0
    assert pb.ModelInfo().predictorType == "SINGLE_PREDICTOR"


def test_checker_detects_a_wrong_number():
    wrong = dict(FIELDS["NetDef"], op=3)
    assert {f.name: f.number for f in pb.NetDef.DESCRIPTOR.fields} != wrong
