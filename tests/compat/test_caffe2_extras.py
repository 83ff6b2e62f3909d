"""Smaller Caffe2 modules on stepnet: dyndep, timeout_guard, build, tt_core, cnn, hsm_pb2, the Python op API
(core.CreatePythonOperator, net.Python), GradientRegistry.RegisterGradient, the mixed-precision SGD optimizers."""
import time

import numpy as np
import pytest

from stepnet.compat import build, cnn, core, dyndep, optimizer, timeout_guard, tt_core, workspace
from stepnet.compat.model_helper import ModelHelper
from stepnet.compat.modeling.initializers import PseudoFP16Initializer


def test_dyndep_records_the_library_and_unknown_ops_name_it(monkeypatch):
    monkeypatch.setattr(dyndep, "_IMPORTED_DYNDEPS", set())
    assert dyndep.unloaded_note() == ""
    dyndep.InitOpsLibrary("@/caffe2/caffe2/fb/my_ops:my_ops")
    assert dyndep.GetImportedOpsLibraries() == {"@/caffe2/caffe2/fb/my_ops:my_ops"}
    with pytest.raises(AttributeError, match="not a registered operator.*'@/caffe2/caffe2/fb/my_ops:my_ops'"):
        core.Net("n").MyCustomOp([], ["y"])


def test_timeout_guard_lets_a_quick_block_finish():
    with timeout_guard.CompleteInTimeOrDie(5.0):
        time.sleep(0.01)
    # the watcher was told: nothing fires afterwards (it would interrupt this process)


def test_timeout_guard_interrupts_a_block_that_hangs(monkeypatch):
    import signal

    monkeypatch.setattr(timeout_guard, "FORCE_AFTER_SECS", 60.0)
    # Python's own SIGINT handler, whatever this process was started with (a background job of a shell without
    # job control starts with SIGINT ignored, and Python then installs none)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with timeout_guard.CompleteInTimeOrDie(0.05):
                time.sleep(5)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_build_reports_a_cpu_build():
    assert build.CAFFE2_NO_OPERATOR_SCHEMA is False
    assert build.build_options["USE_CUDA"] == "OFF" and "BLAS" in build.build_options


def test_tt_cores_rebuild_the_matrix():
    rng = np.random.default_rng(0)
    inp, out, ranks = [2, 3], [3, 2], [1, 6, 1]     # full ranks: the decomposition is exact
    W = rng.standard_normal((6, 6))
    cores = tt_core.matrix_to_tt(W, inp, out, ranks)
    assert cores.dtype == np.float32 and cores.size == 2 * 3 * 6 + 6 * 3 * 2
    # the cores as the TT op reads them: each n x r_next x r x m, last core first; rebuild W by definition
    c1 = cores[:36].reshape(3, 1, 6, 2)     # core 1 (i2, r2=1, r1=6, o2)
    c0 = cores[36:].reshape(2, 6, 1, 3)     # core 0 (i1, r1=6, r0=1, o1)
    rebuilt = np.zeros((2, 3, 3, 2))
    for i1 in range(2):
        for i2 in range(3):
            for o1 in range(3):
                for o2 in range(2):
                    rebuilt[i1, i2, o1, o2] = sum(c0[i1, k, 0, o1] * c1[i2, 0, k, o2] for k in range(6))
    # the TT layer computes X W^T, as FC does with weight W: the cores hold W^T, indexed (input, output)
    np.testing.assert_allclose(rebuilt.reshape(6, 6), W.T, atol=1e-5)


def test_init_tt_cores_sizes_and_checks():
    cores = tt_core.init_tt_cores([2, 2], [3, 3], [1, 2, 1])
    assert cores.dtype == np.float32 and cores.size == 2 * 3 * 2 + 2 * 2 * 3
    with pytest.raises(ValueError, match="one more than"):
        tt_core.init_tt_cores([2, 2], [3, 3], [1, 1])


def test_cnn_model_helper_passes_its_order():
    model = cnn.CNNModelHelper(order="NHWC", name="m")
    assert model.arg_scope["order"] == "NHWC"
    model.Conv("x", "y", 3, 4, 3)
    conv = model.net.Proto().op[-1]
    assert conv.type == "Conv" and any(a.name == "order" and a.s == b"NHWC" for a in conv.arg)
    with pytest.raises(ValueError, match="storage order"):
        cnn.CNNModelHelper(order="CHWN")


def test_hsm_messages_have_caffe2s_field_numbers():
    from stepnet import hsm_pb2

    assert hsm_pb2.NodeProto.DESCRIPTOR.fields_by_name["scores"].number == 5
    assert hsm_pb2.PathNodeProto.DESCRIPTOR.fields_by_name["target"].number == 3
    tree = hsm_pb2.TreeProto()
    tree.root_node.children.add(word_ids=[1, 2])
    assert hsm_pb2.TreeProto.FromString(tree.SerializeToString()) == tree


def test_create_python_operator_and_net_python():
    def plus_one(inputs, outputs):
        outputs[0].feed(inputs[0].data + 1)

    workspace.FeedBlob("x", np.array([1.0, 2.0], np.float32))
    workspace.RunOperatorOnce(core.CreatePythonOperator(plus_one, ["x"], ["y"]))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [2.0, 3.0])

    seen = []
    net = core.Net("py")
    net.Python(lambda inputs, outputs, ws: seen.append(sorted(ws.blobs)), pass_workspace=True)(["x"], [])
    workspace.RunNetOnce(net)
    assert seen == [sorted(workspace.Blobs())]


def test_register_gradient_serves_an_op_type_stepnet_lacks():
    @core.GradientRegistry.RegisterGradient("MyScale")
    def my_scale_grad(op, g_output):
        return core.CreateOperator("Scale", [g_output[0]], [op.input[0] + "_grad"], scale=3.0), \
            [op.input[0] + "_grad"]

    ops, g_input = core.GradientRegistry.GetGradientForOp(core.CreateOperator("MyScale", ["a"], ["b"]), ["b_g"])
    assert [o.type for o in ops] == ["Scale"] and list(ops[0].input) == ["b_g"] and g_input == ["a_grad"]
    ops, grads = core.GradientRegistry.GetBackwardPass(
        [core.CreateOperator("Relu", ["x"], ["a"]), core.CreateOperator("MyScale", ["a"], ["b"])], {"b": "b_g"})
    assert [o.type for o in ops] == ["Scale", "ReluGradient"] and grads["x"] == "x_grad"


def test_multi_precision_sgd_updates_the_float32_copy():
    model = ModelHelper(name="mp")
    w = model.create_param("w", [3], PseudoFP16Initializer("ConstantFill", value=1.0))
    info = model._parameters_info[str(w)] if hasattr(model, "_parameters_info") else None
    assert info is None or core.DataType.FLOAT in info.blob_copy
    model.net.HalfToFloat(w, "w32")
    loss = model.net.SumElements("w32", "loss")
    model.AddGradientOperators([loss])
    optimizer.build_multi_precision_sgd(model, base_learning_rate=0.5)
    types = [op.type for op in model.net.Proto().op]
    assert types[-3:] == ["HalfToFloat", "MomentumSGDUpdate", "FloatToHalf"]
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    # d loss / d w = 1, lr 0.5, no momentum: the float32 copy and the parameter go from 1.0 to 0.5
    np.testing.assert_allclose(workspace.FetchBlob("w_fp32"), [0.5, 0.5, 0.5])
    assert workspace.FetchBlob("w").dtype == np.float16
