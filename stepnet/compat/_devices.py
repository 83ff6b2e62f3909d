"""Caffe2's device options and device inference (re-exported by core): DeviceOption, the two comparisons
(device_option_equal, device_equal), and where an op's blobs live (InferBlobDevices, InferOpBlobDevices,
InferOpDeviceAsBlobDevices), which the copy injection of _device_copies.py reads.

Where an op's inputs and outputs live is Caffe2's device inference (its OpSchema::DeviceInferenceFunction): every
blob on the op's device (its device_option, or the CPU when it has none), except for the few ops whose schema
declared otherwise. Those are the ops of _DECLARED. For Split (input 1, the split lengths), LearningRate
(input 0, the iteration) and Concat (output 1, split_info) the CPU blobs are read from stepnet's op records
(`host_inputs`, `host_outputs`); what the records do not express is in the table: the copy ops' CPU sides
(CopyGPUToCPU, CopyCPUToGPU, EnsureCPUOutput, CopyFromCPUInput) and the NCCL ops (blob i on GPU i). The records'
host_inputs of other ops
(Reshape's shape, Slice's starts and ends, Adam's iteration, LSTMUnit's lengths, ...) are inputs stepnet reads
from the host or the device alike; Caffe2's inference put them on the op's device, and so does this one, so that
the copies injected and the blob names made are Caffe2's.
"""
from __future__ import annotations

from ..io.proto import DeviceOption as _DeviceOptionProto
from ..ops import REGISTRY

CPU, CUDA = 0, 1   # caffe2_pb2.CPU, caffe2_pb2.CUDA
_ALL = "all"
# op type -> (CPU inputs, CPU outputs): indices, _ALL, or "record" (the op record's host_inputs / host_outputs)
_DECLARED = {
    "Split": ("record", ()),
    "LearningRate": ("record", ()),
    "Concat": ((), "record"),
    "CopyGPUToCPU": ((), _ALL),
    "EnsureCPUOutput": ((), _ALL),
    "CopyCPUToGPU": (_ALL, ()),
    "CopyFromCPUInput": (_ALL, ()),
}
_NEEDS_DEVICE = ("CopyGPUToCPU", "CopyCPUToGPU")   # Caffe2 enforces a (CUDA) device option on them
_NCCL = ("NCCLAllreduce", "NCCLBroadcast", "NCCLReduce", "NCCLAllGather", "NCCLReduceScatter")


def DeviceOption(device_type, cuda_gpu_id: int = 0, random_seed=None, node_name=None, numa_node_id=None,
                 extra_info=None, device_id=None):
    """A caffe2_pb2.DeviceOption; cuda_gpu_id (older Caffe2) and device_id (newer) both set device_id."""
    option = _DeviceOptionProto(device_type=device_type, device_id=cuda_gpu_id if device_id is None else device_id,
                                extra_info=extra_info or [])
    for field, value in (("random_seed", random_seed), ("node_name", node_name), ("numa_node_id", numa_node_id)):
        if value is not None:
            setattr(option, field, value)
    return option


def device_option_equal(opt1, opt2, ignore_node_name=True, ignore_random_seed=True) -> bool:
    """Whether two options name the same device (any two CPU options do; node names and seeds as asked)."""
    if not opt1 or not opt2:
        return opt1 == opt2
    if (not ignore_node_name and opt1.node_name != opt2.node_name) or (
            not ignore_random_seed and opt1.random_seed != opt2.random_seed):
        return False
    if not opt1.device_type or not opt2.device_type:
        return not opt1.device_type and not opt2.device_type
    return opt1.device_id == opt2.device_id


def device_equal(src, dst) -> bool:
    """The same device type and id (the copy injection's test; unset fields read as their defaults)."""
    return src.device_type == dst.device_type and src.device_id == dst.device_id


def InferBlobDevices(net) -> dict:
    """{blob: the DeviceOption of the op that writes it} (an empty option for ops without one)."""
    return {b: op.device_option for op in net.Proto().op for b in op.output}


def _op_device(op) -> _DeviceOptionProto:
    """A copy of the op's device option (the CPU's default option when it has none)."""
    option = _DeviceOptionProto()
    if op.HasField("device_option"):
        option.CopyFrom(op.device_option)
    return option


def _cpu_indices(which, count: int, record_indices) -> set:
    if which == _ALL:
        return set(range(count))
    if which == "record":
        return {i for i in record_indices if i < count}
    return {i for i in which if i < count}


def InferOpBlobDevices(op) -> tuple[list, list]:
    """([the DeviceOption of each input], [that of each output]) where the op reads and writes them: the op's
    device, but for the inputs and outputs Caffe2's schemas put on the CPU (see the module's docstring).
    RuntimeError for an op type without a schema, as Caffe2's."""
    if op.type in _NCCL:   # Caffe2's ncclOpDevInfer: blob i on GPU i, as many outputs as inputs
        options = [DeviceOption(CUDA, i) for i in range(len(op.input))]
        return options, [DeviceOption(CUDA, i) for i in range(len(op.input))]
    if op.type not in REGISTRY:
        raise RuntimeError(f"Device inference failed. No schema for: {op.type}")
    if op.type in _NEEDS_DEVICE and not op.HasField("device_option"):
        raise RuntimeError(f"{op.type} op should have cuda device option.")
    cpu_in, cpu_out = _DECLARED.get(op.type, ((), ()))
    record = REGISTRY.get(op.type)
    cpu_in = _cpu_indices(cpu_in, len(op.input), record.host_inputs)
    cpu_out = _cpu_indices(cpu_out, len(op.output), record.host_outputs)
    return ([_DeviceOptionProto() if i in cpu_in else _op_device(op) for i in range(len(op.input))],
            [_DeviceOptionProto() if i in cpu_out else _op_device(op) for i in range(len(op.output))])


def InferOpDeviceAsBlobDevices(op) -> tuple[list, list]:
    """Every input and output on the op's device (what InjectCrossDeviceCopies assumes of placeholder ops, which
    have no schema)."""
    return [_op_device(op) for _ in op.input], [_op_device(op) for _ in op.output]
