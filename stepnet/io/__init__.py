"""Files and values: Caffe2's protobuf messages (.pb/.pbtxt) and their checks, opening files, TensorProto <->
ndarray, BlobProtos, minidb, DB readers, checkpoints, --feed values and images, Int8 tensors."""
