"""Caffe2's device_checker: run an operator or a net once per device option and check that every device computes
what the first one does (np.allclose with the threshold as both tolerances; string outputs must be equal).

A CUDA device option runs where stepnet's workspaces put it: on the GPU through CuPy when there is one, on the
CPU otherwise (so on a machine without a GPU a check over [CPU, CUDA] compares the CPU with itself). The runs
happen in the workspace "_device_check_", emptied after each device's run; the current workspace is current
again afterwards, even when a run raises. Mismatches are printed as Caffe2 printed them, and the check returns
False.
"""
from __future__ import annotations

import copy

import numpy as np

from ..io.proto import NetDef
from . import workspace

CHECK_WORKSPACE = "_device_check_"


def _agree(x, y, threshold: float) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind in "OSU" or y.dtype.kind in "OSU":
        return x.shape == y.shape and bool(np.all(x == y))
    return x.shape == y.shape and bool(np.allclose(x, y, atol=threshold, rtol=threshold))


def _report(index: int, name, x, y) -> None:
    print(f"Failure in checking device option {index} and output {name}. The outputs are:")
    print(np.asarray(x).flatten())
    print(np.asarray(y).flatten())
    if np.shape(x) == np.shape(y) and np.asarray(x).dtype.kind in "biuf":
        print(np.max(np.abs(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)), initial=0.0))
    else:
        print(f"shapes {np.shape(x)} and {np.shape(y)}")


class DeviceChecker:
    """Checks that an operator (CheckSimple) or a net (CheckNet) gives the same results on every device option.

    threshold: the absolute and relative tolerance; device_options: the DeviceOptions to run on, the first one
    being the reference the others are compared with.
    """

    def __init__(self, threshold, device_options):
        self._threshold = threshold
        self._device_options = device_options

    def _compare(self, results: list, names: list) -> bool:
        success = True
        for i in range(1, len(results)):
            for j, name in enumerate(names):
                if not _agree(results[i][j], results[0][j], self._threshold):
                    _report(i, name, results[i][j], results[0][j])
                    success = False
        return success

    def CheckSimple(self, op, inputs, outputs_to_check, input_device_options=None) -> bool:
        """Run `op` on `inputs` (numpy arrays, one per op input) on each device option and compare the outputs
        whose indices are `outputs_to_check`. input_device_options: {input name: DeviceOption} for inputs that
        live elsewhere than the op (fed there for every run). Returns whether all devices agree."""
        op = copy.deepcopy(op)
        input_device_options = input_device_options or {}
        results = []
        previous = workspace.CurrentWorkspace()
        workspace.SwitchWorkspace(CHECK_WORKSPACE, True)
        try:
            for device_option in self._device_options:
                for name, value in zip(op.input, inputs):
                    workspace.FeedBlob(name, np.array(value), input_device_options.get(name, device_option))
                op.device_option.CopyFrom(device_option)
                workspace.RunOperatorOnce(op)
                results.append([workspace.FetchBlob(op.output[k]) for k in outputs_to_check])
                workspace.ResetWorkspace()
        finally:
            workspace.ResetWorkspace()
            workspace.SwitchWorkspace(previous, True)
        return self._compare(results, [op.output[k] for k in outputs_to_check])

    def CheckNet(self, net, inputs=None, blobs_to_check=None, ignore=None) -> bool:
        """Run `net` (a NetDef or core.Net; its ops are given each device option in turn, on a copy) after feeding
        `inputs` ({name: array}) on that device, and compare `blobs_to_check` (default: every op output) but
        those in `ignore`. Returns whether all devices agree."""
        proto = net.Proto() if hasattr(net, "Proto") else net
        netdef = NetDef()
        netdef.CopyFrom(proto)
        ignore = set(ignore or ())
        if blobs_to_check is None:
            blobs_to_check = [b for op in netdef.op for b in op.output]
        blobs_to_check = [b for b in blobs_to_check if b not in ignore]
        results = []
        previous = workspace.CurrentWorkspace()
        workspace.SwitchWorkspace(CHECK_WORKSPACE, True)
        try:
            for device_option in self._device_options:
                for name, value in (inputs or {}).items():
                    workspace.FeedBlob(name, value, device_option)
                for op in netdef.op:
                    op.device_option.CopyFrom(device_option)
                workspace.RunNetOnce(netdef)
                results.append([workspace.FetchBlob(name) for name in blobs_to_check])
                workspace.ResetWorkspace()
        finally:
            workspace.ResetWorkspace()
            workspace.SwitchWorkspace(previous, True)
        return self._compare(results, blobs_to_check)
