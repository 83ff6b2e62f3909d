"""caffe2.python.models: model builders (resnet: ResNet-50 and the CIFAR ResNets; seq2seq: the library of Caffe2's
seq2seq programs). Caffe2's download.py (fetching trained models over the network) is not provided."""
