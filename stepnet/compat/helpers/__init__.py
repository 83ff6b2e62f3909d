"""Caffe2's brew helpers by module (fc, conv, pooling, nonlinearity, normalization, dropout, algebra,
array_helpers, train, db_input, elementwise_linear, arg_scope, tools); brew exposes them with the model's and the
current arg_scope's arguments applied."""
