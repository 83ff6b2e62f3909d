"""Caffe2's caffe2.python.onnx: `frontend` (Caffe2 nets to ONNX models) on stepnet's ONNX exporter, and `backend`
(ONNX models run as Caffe2 nets: Caffe2Backend, Caffe2Rep) with its `helper`, `workspace` and `error` modules."""
