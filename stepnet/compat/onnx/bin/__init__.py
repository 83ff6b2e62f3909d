"""Caffe2's caffe2.python.onnx.bin: the conversion command lines."""
