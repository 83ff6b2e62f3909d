"""caffe2.python.predictor_constants: `predictor_constants`, the names predictor-exporter dbs use (the defaults of
Caffe2's PredictorConsts message: the meta net def's blob, the reader blob, the blob and net kinds)."""
from __future__ import annotations

from types import SimpleNamespace

_NAMES = ("PARAMETERS_BLOB_TYPE", "INPUTS_BLOB_TYPE", "OUTPUTS_BLOB_TYPE", "GLOBAL_INIT_NET_TYPE",
          "PREDICT_INIT_NET_TYPE", "PREDICT_NET_TYPE", "SINGLE_PREDICTOR", "MULTI_PREDICTOR", "TRAIN_INIT_PLAN_TYPE",
          "TRAIN_PLAN_TYPE")

predictor_constants = SimpleNamespace(META_NET_DEF="!!META_NET_DEF", PREDICTOR_DBREADER="!!PREDICTOR_DBREADER",
                                      **{name: name for name in _NAMES})
