"""The models the hostile campaign's protobuf surface starts from: the bundled plans, init/predict pairs and
predict nets (with the feeds and shapes they take), and small generated nets, plans and control-flow nets."""
from __future__ import annotations

import random

from stepnet.io import proto
from stepnet.io.proto import NetDef, PlanDef

import hostile_values as hv

XOR = "models/xor"
PLANS = {"models/xor/plan.pbtxt": "xor_done", "models/digits/train.pbtxt": "digits_done",
         "models/binary_adder/binary_adder.pbtxt": "adder_done", "models/char_rnn.pbtxt": None,
         "models/char_rnn_sample.pbtxt": None, "models/char_rnn_dp.pbtxt": None}
PAIRS = [("models/xor/init_net.pbtxt", "models/xor/predict_net.pbtxt", "X=[[1, 0], [0, 1]]", "X=2,2"),
         ("models/style_transfer/crayon_init.pb", "models/style_transfer/crayon_predict.pb",
          "data_int8_bgra=PHOTO:bgra", "data_int8_bgra=1,64,64,4:uint8"),
         ("tests/data/models/style_transfer_crayon_init.pb", "tests/data/models/style_transfer_crayon_predict.pb",
          "data_int8_bgra=PHOTO:bgra", "data_int8_bgra=1,32,48,4:uint8")]
PREDICTS = {"tests/data/models/bvlc_alexnet_predict_net.pbtxt": "data=1,3,227,227",
            "tests/data/models/inception_v1_predict_net.pbtxt": "data=1,3,224,224",
            "tests/data/models/resnet50_predict_net.pbtxt": "gpu_0/data=1,3,224,224",
            "tests/data/models/detectron_e2e_faster_rcnn_R-50-C4_1x_predict_net.pbtxt": "data=1,3,64,64",
            "tests/data/models/maskrcnn2go_fp32_model.pb": "data=1,3,64,64",
            "tests/data/models/maskrcnn2go_fp32_model.pbtxt": "data=1,3,64,64"}
_CACHE: dict = {}
def load(rel: str):
    from hostile_env import ROOT
    if rel not in _CACHE:
        _CACHE[rel] = proto.load(ROOT / rel)
    msg = type(_CACHE[rel])()
    msg.CopyFrom(_CACHE[rel])
    return msg


# ------------------------------------------------------------------------------------------- generated seeds
def gen_net(rng: random.Random) -> NetDef:
    """A small predict net over X (2x3 float) with its weights filled inside."""
    op = hv.op
    ops = [op("GivenTensorFill", [], ["W"], shape=[4, 3], values=[0.5] * 12),
           op("ConstantFill", [], ["b"], shape=[4], value=0.1),
           op("FC", ["X", "W", "b"], ["h"]), op("Relu", ["h"], ["r"]),
           op(rng.choice(["Softmax", "Sigmoid", "Tanh"]), ["r"], ["s"]),
           op("ReduceSum", ["s"], ["t"], axes=[1], keepdims=0),
           op("Concat", ["s", "r"], ["c", "c_split"], axis=1), op("Transpose", ["c"], ["ct"]),
           op("Reshape", ["ct"], ["y", "old_shape"], shape=[-1])]
    return NetDef(name="gen", op=ops[:rng.randint(3, len(ops))], external_input=["X"], external_output=["y", "t"])


def gen_plan(rng: random.Random) -> PlanDef:
    """A plan: an init net, a body that counts, a stop net that turns the stop blob true after `limit`."""
    op = hv.op
    init = NetDef(name="init", op=[op("ConstantFill", [], ["count"], shape=[1], value=0, dtype=10),
                                   op("ConstantFill", [], ["limit"], shape=[1], value=rng.choice([1, 3]), dtype=10),
                                   op("ConstantFill", [], ["one"], shape=[1], value=1, dtype=10),
                                   op("ConstantFill", [], ["stop"], shape=[], value=0, dtype=0),
                                   op("GivenTensorFill", [], ["X"], shape=[2, 2], values=[1.0, 2.0, 3.0, 4.0])])
    body = NetDef(name="body", op=[op("Add", ["count", "one"], ["count"]), op("Relu", ["X"], ["Y"]),
                                   op("Sum", ["Y", "X"], ["Z"])])
    stop = NetDef(name="stop", op=[op("GE", ["count", "limit"], ["stop_v"]),
                                   op("Reshape", ["stop_v"], ["stop", "old"], shape=[])])
    report = NetDef(name="report", op=[op("Print", ["count"], [])])
    inner = proto.ExecutionStep(name="inner", network=["body", "stop"], should_stop_blob="stop", num_iter=1000)
    plan = PlanDef(name="gen_plan", network=[init, body, stop, report])
    plan.execution_step.add(name="init", network=["init"])
    plan.execution_step.add(name="loop", substep=[inner], report_net="report", report_interval=1,
                            num_iter=rng.choice([1, 2]))
    return plan


def gen_control(rng: random.Random) -> NetDef:
    """If / While (counted in its loop net) / Do, two levels of nets."""
    op = hv.op
    cond = NetDef(name="cond", op=[op("LT", ["i", "limit"], ["c"])])
    body = NetDef(name="loop", op=[op("Add", ["i", "one"], ["i"]), op("Tanh", ["X"], ["X"]),
                                   op("LT", ["i", "limit"], ["c"])])
    do = NetDef(name="do", op=[op("If", ["flag", "a"], ["b"], then_net=hv.small_net(rng, "t"),
                                  else_net=NetDef(name="e", op=[op("Copy", ["a"], ["b"])]))])
    net = NetDef(name="control", external_input=["X"], external_output=["X", "out"], op=[
        op("ConstantFill", [], ["i"], shape=[1], value=0, dtype=10),
        op("ConstantFill", [], ["limit"], shape=[1], value=rng.choice([0, 2, 5]), dtype=10),
        op("ConstantFill", [], ["one"], shape=[1], value=1, dtype=10),
        op("ConstantFill", [], ["flag"], shape=[], value=1, dtype=0),
        op("LT", ["i", "limit"], ["c"]),
        op("While", ["c", "i", "limit", "one", "X"], ["X", "i"], loop_net=body,
           **({"cond_net": cond} if rng.random() < 0.5 else {})),
        op("CreateScope", [], ["ws"]),
        op("Do", ["X", "flag", "ws"], ["out", "ws"], net=do, inner_blobs=["a", "flag", "b"],
           outer_blobs_idx=[0, 1, 2])])
    return net


# ------------------------------------------------------------------------------------------- the walker
