"""Nets out of stepnet: export-predict (a trained plan as an init/predict pair), ONNX, and pictures (Graphviz)."""
