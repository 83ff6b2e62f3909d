"""compat.memonger: every rewrite is checked two ways: by running the original and the rewritten net and
comparing outputs and gradients, and by `reads_same_values`, an independent simulation that follows which
original value every name holds after each op of the rewritten net (so a rename that lets a blob be overwritten
before its last read fails it, as a deliberately broken rewrite shows). Also: fewer distinct blobs, the
original net unchanged, hand-computed assignments, orders and memory estimates."""
import numpy as np
import pytest

from stepnet.compat import brew, core, memonger, model_helper, workspace
from stepnet.io.proto import NetDef, OperatorDef, TensorProto


def reads_same_values(original, optimized) -> bool:
    """Whether each op of `optimized` reads, in every input, the value the same op of `original` reads (ops
    paired by position; external values are named alike in both)."""
    version: dict = {}                  # original name -> writes so far
    holds: dict = {}                    # optimized name -> (original name, version) it holds now
    for a, b in zip(original.op, optimized.op):
        for x, y in zip(a.input, b.input):
            want = (x, version.get(x, 0))
            have = holds.get(y, (y, 0))
            if have != want:
                return False
        for x, y in zip(a.output, b.output):
            version[x] = version.get(x, 0) + 1
            holds[y] = (x, version[x])
    final = {holds.get(y, (y, 0)) for y in holds}
    return all((x, v) in final for x, v in version.items() if x in original.external_output)


def count_blobs(proto) -> int:
    return len({b for op in proto.op for b in list(op.input) + list(op.output)})


def fc_chain(layers=5, dim=3, scope="name_x"):
    m = model_helper.ModelHelper()
    with core.NameScope(scope):
        x = "data"
        for k in range(layers):
            x = brew.fc(m, x, f"fc{k + 1}", dim_in=dim, dim_out=dim)
            x = m.net.Tanh(x, f"tanh{k + 1}")
        xent = m.net.LabelCrossEntropy([m.net.Softmax(x, "pred"), "label"], "xent")
        m.net.AveragedLoss(xent, "loss")
    grads = m.AddGradientOperators([f"{scope}/loss"])
    return m, grads


def run(net, fetch):
    workspace.RunNetOnce(net)
    return [workspace.FetchBlob(str(f)).copy() for f in fetch]


def feed_chain(m, scope="name_x", dim=3):
    workspace.RunNetOnce(m.param_init_net)
    workspace.FeedBlob(f"{scope}/data", np.random.RandomState(0).randn(4, dim).astype(np.float32))
    workspace.FeedBlob(f"{scope}/label", np.array([0, 2, 1, 2], np.int32))


@pytest.mark.parametrize("share_activations", [False, True])
def test_share_grad_blobs_same_values_fewer_blobs(share_activations):
    m, grads = fc_chain()
    before = NetDef()
    before.CopyFrom(m.net.Proto())
    params = set(m.param_to_grad.values())
    optimized = memonger.share_grad_blobs(m.net, ["name_x/loss"], params, "name_x",
                                          share_activations=share_activations)
    assert m.net.Proto() == before                                   # the net given is unchanged
    assert count_blobs(optimized) < count_blobs(before)
    assert reads_same_values(before, optimized)
    feed_chain(m)
    fetch = ["name_x/loss"] + [m.param_to_grad[p] for p in m.params]
    for want, got in zip(run(before, fetch), run(optimized, fetch)):
        np.testing.assert_array_equal(want, got)


def test_share_grad_blobs_respects_dont_share_and_branches():
    m, grads = fc_chain(layers=4)
    keep = str(grads["name_x/fc2"])
    optimized = memonger.share_grad_blobs(m.net, ["name_x/loss"], set(m.param_to_grad.values()), "name_x/",
                                          dont_share_blobs={keep}, share_activations=True)
    kept = NetDef()
    kept.CopyFrom(m.net.Proto())
    kept.external_output.append(keep)       # its value must still be held by some blob after the net
    assert reads_same_values(kept, optimized)
    shared = memonger.share_grad_blobs(m.net, ["name_x/loss"], set(m.param_to_grad.values()), "name_x/",
                                       share_activations=True)
    assert not reads_same_values(kept, shared)    # without dont_share_blobs it is overwritten


def branching_net():
    """data -> a; a -> b1 -> c1 and a -> b2 -> c2; out = c1 + c2 (two branches a DAG runner may interleave)."""
    ops = [OperatorDef(type="Relu", input=["data"], output=["a"])]
    for k in (1, 2):
        ops += [OperatorDef(type="Sigmoid", input=["a"], output=[f"b{k}"]),
                OperatorDef(type="Tanh", input=[f"b{k}"], output=[f"c{k}"]),
                OperatorDef(type="Scale", input=[f"c{k}"], output=[f"d{k}"])]
    ops.append(OperatorDef(type="Add", input=["d1", "d2"], output=["out"]))
    net = NetDef(name="branches", op=ops, external_input=["data"], external_output=["out"])
    return net


def test_optimize_inference_for_dag_never_shares_across_branches():
    net = branching_net()
    optimized = memonger.optimize_inference_for_dag(net, ["data"])
    assert count_blobs(optimized) < count_blobs(net)
    assert reads_same_values(net, optimized)
    # branch 2 run before branch 1 (another valid order of the DAG) must read the same values too
    order = [0, 4, 5, 6, 1, 2, 3, 7]
    swapped = [NetDef(op=[n.op[i] for i in order], external_output=["out"]) for n in (net, optimized)]
    assert reads_same_values(*swapped)
    x = np.random.RandomState(1).randn(3, 2).astype(np.float32)
    outs = []
    for n in (net, optimized):
        workspace.FeedBlob("data", x)
        outs.append(run(n, ["out"])[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=0)
    np.testing.assert_allclose(outs[0], np.tanh(1 / (1 + np.exp(-np.maximum(x, 0)))) * 2, rtol=1e-6)


def test_checker_fails_on_a_broken_rewrite():
    """Renaming a blob that is still read later onto a new output: the simulation catches it."""
    net = branching_net()
    broken = NetDef()
    broken.CopyFrom(net)
    broken.op[4].output[0] = "b1"     # b2 written over b1, which op 2 (c1) still reads ... in this order:
    broken.op[5].input[0] = "b1"
    order = [0, 1, 4, 5, 2, 3, 6, 7]
    reorder = [NetDef(op=[n.op[i] for i in order], external_output=["out"]) for n in (net, broken)]
    assert not reads_same_values(*reorder)


def test_optimize_inference_fast():
    net = branching_net()
    optimized = memonger.optimize_inference_fast(net, ["data", "out"])
    assert count_blobs(optimized) < count_blobs(net)
    assert reads_same_values(net, optimized)
    assert all(len(op.output) == len(set(op.output)) for op in optimized.op)
    assert any(b.endswith("_shared") for op in optimized.op for b in op.output)


@pytest.mark.parametrize("algo", list(memonger.AssignmentAlgorithm))
def test_optimize_interference(algo):
    m, grads = fc_chain(layers=2, scope="s")
    static = [o for op in m.param_init_net.Proto().op for o in op.output] + ["s/data", "s/label", "s/loss",
                                                                          str(grads["s/fc1_w"])]
    result = memonger.optimize_interference(m.Proto(), static, algo=algo)
    memonger.verify_assignments(result.assignments)
    reordered = NetDef(op=list(result.net.op))
    order = memonger.topological_sort_traversal(memonger.compute_interference_graph(m.Proto().op))
    original = NetDef(op=[m.Proto().op[i] for i in order])
    assert reads_same_values(original, reordered)
    assert len(set(result.blob_assignments.values())) < len(result.blob_assignments)
    feed_chain(m, "s")
    want = run(m.net, ["s/loss", grads["s/fc1_w"]])
    got = run(result.net, ["s/loss", grads["s/fc1_w"]])
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    stats = memonger.compute_statistics(result.assignments)
    assert stats.optimized_nbytes < stats.baseline_nbytes


def test_assignments_hand_computed():
    R = memonger.LiveRange
    ranges = [("b1", R(1, 3, 10)), ("b2", R(3, 4, 1)), ("b3", R(5, 6, 1)), ("b4", R(5, 7, 10))]
    greedy = memonger.compute_assignments_greedy(ranges, None)
    assert greedy == [[ranges[0], ranges[3]], [ranges[1], ranges[2]]]
    assert memonger.get_memory_usage(greedy) == 11
    assert memonger.get_memory_usage(memonger.compute_assignments_dp(ranges, None)) == 11
    # greedy pairs b1 with b2 (first fit by size distance) -> 10 + 10; the optimum pairs b1 with b3 -> 10 + 1
    tricky = [("b1", R(1, 2, 10)), ("b2", R(4, 6, 1)), ("b3", R(5, 6, 10))]
    assert memonger.get_memory_usage(memonger.compute_assignments_dp(tricky, [])) == 11
    assert memonger.compute_blob_assignments([[ranges[0], ranges[3]], [ranges[1]]]) == {"b1": "b4", "b4": "b4"}


def test_topological_orders_and_interference_graph():
    ops = [OperatorDef(type="Copy", input=["w0c"], output=["w0"]),
           OperatorDef(type="Conv", input=["data", "w0", "b0"], output=["c0"]),
           OperatorDef(type="Copy", input=["w2"], output=["w2"]),
           OperatorDef(type="Conv", input=["c0", "w2", "b2"], output=["c2"]),
           OperatorDef(type="Copy", input=["d1"], output=["d2"]),
           OperatorDef(type="Copy", input=["d2"], output=["d3"])]
    g = memonger.compute_interference_graph(ops)
    assert g.edges() == [(0, 1), (1, 3), (2, 3), (4, 5)]
    assert memonger.topological_sort_traversal(g) == [4, 5, 2, 0, 1, 3]
    assert memonger.topological_sort_traversal_longest_path(g) == [0, 1, 2, 3, 4, 5]
    inplace = memonger.compute_interference_graph([OperatorDef(type="Copy", input=["b"], output=["b"])] * 3)
    assert inplace.edges() == [(0, 1), (0, 2), (1, 2)]


def test_release_blobs_when_used():
    ops = [OperatorDef(type="FC", input=["data", "w", "b"], output=["x"]),
           OperatorDef(type="Relu", input=["x"], output=["y"]),
           OperatorDef(type="Relu", input=["x"], output=["z"]),
           OperatorDef(type="Relu", input=["y"], output=["u"]),
           OperatorDef(type="Alias", input=["u"], output=["u_alias"]),
           OperatorDef(type="Add", input=["z", "u"], output=["out"])]
    net = NetDef(op=ops, external_output=["out"])
    freed = memonger.release_blobs_when_used(net, {"data"})
    assert [op.type for op in freed.op] == ["FC", "Relu", "Relu", "Free", "Relu", "Free", "Alias", "Add", "Free"]
    assert [op.input[0] for op in freed.op if op.type == "Free"] == ["x", "y", "z"]
    assert len(net.op) == 6


def test_verify_graph_equality_and_inplace():
    net = branching_net()
    renamed = NetDef()
    renamed.CopyFrom(net)
    for op in renamed.op:
        op.input[:] = ["other_" + b for b in op.input]
        op.output[:] = ["other_" + b for b in op.output]
    assert memonger.verify_graph_equality(net, renamed)
    rewired = NetDef()
    rewired.CopyFrom(net)
    rewired.op[5].input[0] = "a"              # Tanh of branch 2 reads a instead of b2
    assert not memonger.verify_graph_equality(net, rewired)
    inplace = NetDef()
    inplace.CopyFrom(net)
    inplace.op[2].output[0] = "b1"
    assert not memonger.verify_inplace_blobs(net, inplace)


def test_estimate_memory_usage():
    cpu = core.DeviceOption(0)
    ops = [OperatorDef(type="ConstantFill", output=["a"], device_option=cpu),
           OperatorDef(type="Relu", input=["a"], output=["b"], device_option=cpu),
           OperatorDef(type="Free", input=["a"], output=["a"]),
           OperatorDef(type="Relu", input=["b"], output=["c"], device_option=cpu)]
    shapes = {"a": [2, 3], "b": [2, 3], "c": [4]}
    types = {"a": TensorProto.FLOAT, "b": TensorProto.FLOAT, "c": TensorProto.DOUBLE}
    total, high, by_op = memonger.estimate_memory_usage([NetDef(op=ops)], shapes, types, cpu)
    assert (total, high) == (24 + 24 + 32, 24 + 32)
    assert dict(by_op) == {"ConstantFill": 24, "Relu": 56}


def test_share_grad_blobs_through_a_recurrent_network():
    from stepnet.compat import rnn_cell
    model = model_helper.ModelHelper()
    model.net.AddExternalInputs("seq_lengths", "h0", "c0")
    output, _, _, _ = rnn_cell.LSTM(model=model, input_blob="input", seq_lengths="seq_lengths",
                                    initial_states=("h0", "c0"), dim_in=3, dim_out=4, scope="lstm1",
                                    forward_only=False)
    model.net.AveragedLoss(model.net.Sub([output, "target"], "dist"), "loss")
    model.AddGradientOperators(["loss"])
    original = NetDef()
    original.CopyFrom(model.net.Proto())
    optimized = memonger.share_grad_blobs(model.net, ["loss"], set(model.param_to_grad.values()), "")
    assert count_blobs(optimized) < count_blobs(original)
    assert reads_same_values(original, optimized)
    fetch = [str(g) for g in model.param_to_grad.values()]
    workspace.RunNetOnce(model.param_init_net)
    params = {str(p): workspace.FetchBlob(str(p)).copy() for p in model.params}
    results = []
    for net in (original, optimized):
        workspace.ResetWorkspace()
        rng = np.random.RandomState(0)
        workspace.FeedBlob("input", rng.randn(5, 2, 3).astype(np.float32))
        workspace.FeedBlob("target", rng.randn(5, 2, 4).astype(np.float32))
        workspace.FeedBlob("seq_lengths", np.array([5, 4], np.int32))
        for name in ("h0", "c0"):
            workspace.FeedBlob(name, np.zeros((1, 2, 4), np.float32))
        for name, value in params.items():
            workspace.FeedBlob(name, value)
        results.append(run(net, fetch))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_release_blobs_when_used_runs_with_the_same_output_and_empties_the_freed_blobs():
    """The Free ops memonger inserts run (Caffe2's free_op.cc: each blob emptied in place): the net gives the
    output a float64 forward of the same net gives, and the freed intermediates hold nothing afterwards."""
    rng = np.random.default_rng(5)
    data, w, b = rng.standard_normal((4, 3)), rng.standard_normal((2, 3)), rng.standard_normal(2)
    ops = [OperatorDef(type="FC", input=["data", "w", "b"], output=["x"]),
           OperatorDef(type="Relu", input=["x"], output=["y"]),
           OperatorDef(type="Sigmoid", input=["x"], output=["z"]),
           OperatorDef(type="Add", input=["z", "y"], output=["out"])]
    net = memonger.release_blobs_when_used(NetDef(name="freed", op=ops, external_output=["out"]), {"data"})
    assert sorted(op.input[0] for op in net.op if op.type == "Free") == ["x", "y", "z"]
    workspace.ResetWorkspace()
    for name, value in (("data", data), ("w", w), ("b", b)):
        workspace.FeedBlob(name, value.astype(np.float32))
    workspace.RunNetOnce(net)
    x = data @ w.T + b
    np.testing.assert_allclose(workspace.FetchBlob("out"), np.maximum(x, 0) + 1 / (1 + np.exp(-x)), rtol=1e-5)
    for name in ("x", "y", "z"):
        assert workspace.HasBlob(name)
        with pytest.raises(RuntimeError, match="emptied by Free"):
            workspace.FetchBlob(name)
    workspace.ResetWorkspace()
