"""caffe2.python.models: model builders (resnet: ResNet-50 and the CIFAR ResNets; seq2seq: the library of Caffe2's
seq2seq programs) and download (Caffe2's model-zoo downloader). A model installed with
`python -m stepnet.compat.models.download -i NAME` imports as `caffe2.python.models.NAME` (its `init_net` and
`predict_net`): its folder, outside stepnet's package (see _installed), is on this package's __path__."""
from ._installed import add_to_path

add_to_path(__path__)
