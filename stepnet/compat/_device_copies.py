"""Caffe2's cross-device copy injection (re-exported by core): InjectCrossDeviceCopies rewrites a net whose ops
run on several devices so that each op reads its inputs on the device it needs them on (_devices.InferOpBlobDevices),
adding a copy op before it where a blob lives elsewhere; InjectDeviceCopiesAmongNets does it for a sequence of
nets that pass blobs to each other.

A blob copied to a CUDA device is named `<blob>_cuda_<id>`, one copied to the CPU `<blob>_cpu`; a copy made once is
reused by every later op that needs the blob on that device (RemapEntry(blob, device) -> the copy's name). The
copy ops are Caffe2's: CopyCPUToGPU and Copy under the destination's device option, CopyGPUToCPU under the
source's.
"""
from __future__ import annotations

from collections import defaultdict

from ..graph.view import copy_op
from ._devices import CPU, CUDA, InferOpBlobDevices, InferOpDeviceAsBlobDevices, device_equal
from ._net import Net
from .blob_reference import BlobReference
from .scope import DeviceScope


def copy_func_between_devices(src, dst):
    """f(net, *args, **kwargs) adding the op that copies a blob from device src to dst (its arguments: the
    op method's), or None when no copy is needed (CPU to CPU, or the same GPU). ValueError for other devices."""
    kinds = (src.device_type, dst.device_type)
    if kinds == (CPU, CPU) or (kinds == (CUDA, CUDA) and src.device_id == dst.device_id):
        return None
    if kinds == (CUDA, CUDA):
        op_type, device = "Copy", dst
    elif kinds == (CUDA, CPU):
        op_type, device = "CopyGPUToCPU", src
    elif kinds == (CPU, CUDA):
        op_type, device = "CopyCPUToGPU", dst
    else:
        raise ValueError(f"Non-supported devices: {src} and {dst}")

    def fun(net, *args, **kwargs):
        with DeviceScope(device):
            return getattr(net, op_type)(*args, **kwargs)
    return fun


def update_placeholder_op_output(op, blob_to_device) -> None:
    """Rename in place each output of a placeholder op (one that runs on the CPU, such as a Recv) whose blob
    lives on another device to `<blob>_cpu`."""
    op.output[:] = [o if blob_to_device[o].device_type == CPU else o + "_cpu" for o in op.output]


class RemapEntry:
    """A key of InjectCrossDeviceCopies' blob_remap: a blob and the device it is wanted on."""

    def __init__(self, blob, device):
        self.blob = blob
        self.device = device

    def __eq__(self, other):
        return self.blob == other.blob and self.device == other.device

    def __hash__(self):
        return hash(self.blob + str(self.device))

    def __repr__(self):
        return f"RemapEntry({self.blob!r}, device_type={self.device.device_type}, id={self.device.device_id})"


def _copy_name(blob: str, device) -> str:
    if device.device_type == CPU:
        return blob + "_cpu"
    if device.device_type == CUDA:
        return f"{blob}_cuda_{device.device_id}"
    raise RuntimeError(f"Unknown device type: {device.device_type}")


def _inputs_on_devices(net, new_net, op, input_dev, blob_to_device, blob_remap, net_option) -> dict:
    """{input: the name of its copy on the device op reads it on}, adding the copies not made yet to new_net."""
    renamed = {}
    for dev, blob in zip(input_dev, op.input):
        assert net.BlobIsDefined(blob), f"input {blob} should be defined in the net."
        if blob not in blob_to_device:
            if not net.is_external_input(blob):
                raise AttributeError(f"No device information found for blob {blob}.")
            blob_to_device[blob] = net_option
        if device_equal(blob_to_device[blob], dev):
            continue
        known = blob_remap.get(RemapEntry(blob, dev))
        if known is not None and blob_to_device[known] == dev:
            renamed[blob] = known
            continue
        copy = copy_func_between_devices(blob_to_device[blob], dev)
        if copy is None:   # two CPU options of different ids: the same memory (Caffe2 failed calling None)
            continue
        name = _copy_name(blob, dev)
        copy(new_net, BlobReference(blob), BlobReference(name))
        blob_remap[RemapEntry(blob, dev)] = name
        renamed[blob] = name
        blob_to_device[name] = dev
    return renamed


def InjectCrossDeviceCopies(net, blob_to_device=None, blob_remap=None, placeHolderOps=None) -> tuple:  # noqa: N803
    """(a new net '<net>_cross_device' with the copies between devices its ops need, blob_to_device).

    blob_to_device: {blob: DeviceOption} where blobs already live (updated, and returned); an external input not
    in it lives on the net's device. blob_remap: {RemapEntry(blob, device): name of its copy there} of copies
    made before (by earlier nets: reused, and added to the new net's external inputs), updated.
    placeHolderOps: op types without a schema whose blobs all live on the op's device; their outputs that
    already live elsewhere are renamed `<blob>_cpu` (in the given net's op, as Caffe2 does).
    An output written on another device than a previous op wrote it on (not in place) is a RuntimeError; an
    input with no known device an AttributeError."""
    new_net = net.Clone(net.Proto().name + "_cross_device", keep_schema=True)
    del new_net.Proto().op[:]
    blob_to_device = {} if blob_to_device is None else blob_to_device
    blob_remap = {} if blob_remap is None else blob_remap
    net_option = net.Proto().device_option
    copies = defaultdict(list)
    for entry, name in blob_remap.items():
        copies[entry.blob].append(name)
    new_net.Proto().external_input.extend([c for b in list(new_net.Proto().external_input) for c in copies[b]])

    for op in list(net.Proto().op):
        placeholder = placeHolderOps is not None and op.type in placeHolderOps
        input_dev, output_dev = (InferOpDeviceAsBlobDevices if placeholder else InferOpBlobDevices)(op)
        renamed = _inputs_on_devices(net, new_net, op, input_dev, blob_to_device, blob_remap, net_option)
        if placeholder:
            update_placeholder_op_output(op, blob_to_device)
        for dev, out in zip(output_dev, op.output):
            if out in blob_to_device and out not in op.input and not device_equal(blob_to_device[out], dev):
                raise RuntimeError(f"In-place blob: {out} is not supported between operators with different "
                                   f"device option previous:{blob_to_device[out]} now: {dev}. Failed op:\n {op}")
        new_op = copy_op(op)
        new_op.input[:] = [renamed.get(b, b) for b in op.input]
        originals = list(op.input)
        new_op.output[:] = [new_op.input[originals.index(o)] if o in originals else o for o in op.output]
        blob_to_device.update(zip(new_op.output, output_dev))
        new_net.extend_ops([new_op])
    return new_net, blob_to_device


def InjectDeviceCopiesAmongNets(nets, blob_to_device_init=None) -> tuple:
    """(the nets with the copies between devices they need, blob_to_device), the nets given in the order they
    run (e.g. [init_net, train_net]): a blob one net makes on one device and a later one reads on another is
    copied there, a copy reused by the nets after. blob_to_device_init: {blob: DeviceOption} known beforehand."""
    assert isinstance(nets, list), f"nets {nets} should be a list of nets."
    assert all(isinstance(net, Net) for net in nets), f"nets {nets} should be a list of nets."
    blob_to_device = blob_to_device_init or {}
    blob_remap: dict = {}
    new_nets = []
    for net in nets:
        new_net, blob_to_device = InjectCrossDeviceCopies(net, blob_to_device=blob_to_device,
                                                          blob_remap=blob_remap)
        new_nets.append(new_net)
    return new_nets, blob_to_device


def InjectDeviceCopiesAmongNetsWithoutB2D(nets, blob_to_device_init=None) -> list:
    """InjectDeviceCopiesAmongNets' nets alone."""
    return InjectDeviceCopiesAmongNets(nets, blob_to_device_init)[0]

