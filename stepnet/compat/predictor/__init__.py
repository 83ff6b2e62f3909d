"""caffe2.python.predictor: a trained net and its parameters in one db (predictor_exporter), the MetaNetDef
helpers (predictor_py_utils) and serde."""
