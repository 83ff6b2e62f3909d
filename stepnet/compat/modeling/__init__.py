"""Caffe2's caffe2.python.modeling: parameter initializers and information, parameter sharing, and the net
modifiers (NetModifier: gradient clipping, and the norms, statistics and histograms of blobs)."""
