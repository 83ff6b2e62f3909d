"""Caffe2's Python API on stepnet, so that Caffe2 scripts run with only their imports changed:
`caffe2.python` -> `stepnet.compat`, `caffe2.proto` -> `stepnet` (`from stepnet import caffe2_pb2`).

Modules carry Caffe2's names: workspace, core, scope, model_helper, brew, helpers, optimizer, rnn_cell, gru_cell,
recurrent, utils, net_drawer, modeling.initializers. Nets are built with stepnet.builders.builder.NetBuilder and run by
stepnet's executor.

Unlike the rest of stepnet, this layer keeps process-wide state, as Caffe2 does: the workspaces `workspace.*`
works on (one current, "default" at first), the name and device scopes (per thread), the names nets were given
(unique per process) and the optimizers' instance counters, and DeviceOption's older field name cuda_gpu_id
(_legacy_fields). The core never reads any of it.
"""
from . import _legacy_fields

_legacy_fields.install()
