"""Caffe2's caffe2.python.onnx: `frontend` (Caffe2 nets to ONNX models) on stepnet's ONNX exporter."""
