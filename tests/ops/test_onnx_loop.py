"""ONNXWhile (onnx_loop.py): loops worked out by hand (Fibonacci below a limit, a running sum with scan outputs,
a loop in a loop), on the CPU and the emulated device, under each scope mode; the body's workspace; bad inputs
and bodies refused with one line; the blob limit on growing scan outputs; the nesting limit; no gradient; a
broken kernel caught by the checks."""
import numpy as np
import pytest
from control_nets import host, net, op_on, run

from stepnet.core.errors import ArgumentError, DTypeError, GradientError, NetError, ResourceError, ShapeError
from stepnet.core.limits import Limits
from stepnet.ops import REGISTRY
from stepnet.passes.gradients import backward_ops
from stepnet.runtime.workspace import Workspace
from stepnet.testing import DEVICES, make_op

INT64, BOOL = 10, 5   # TensorProto data types
SCOPES = {"scopes": {}, "save_scopes": {"save_scopes": 1}, "disable_scopes": {"disable_scopes": 1}}


# ------------------------------------------------------------------------------------------- Fibonacci
def fib_loop(device="cpu", **args):
    """first, second = 1, 1; while i < M and cond: third = first + second, cond = third < 100; scan: third."""
    mk = op_on(device)
    body = net("fib", mk("Add", ["first", "second"], ["third"]),
               mk("ConstantFill", [], ["limit"], shape=[1], value=100.0),
               mk("LT", ["third", "limit"], ["cond_new"]),
               external_input=["i", "cond", "first", "second"],
               external_output=["cond_new", "second", "third", "third"])
    args = {"has_trip_count": 1, "has_cond": 1, **args}
    return net("main", mk("ONNXWhile", ["M", "c", "a", "b"], ["first_a", "second_a", "thirds"], body=body, **args))


def fib_feeds(trips, cond=True):
    return {"M": np.array(trips, np.int64), "c": np.array(cond), "a": np.ones(1, np.float32),
            "b": np.ones(1, np.float32)}


# (M, first condition) -> (final first, final second, the thirds): worked by hand
FIB = {(0, True): (1, 1, []), (3, False): (1, 1, []), (1, True): (1, 2, [2]), (4, True): (5, 8, [2, 3, 5, 8]),
       (50, True): (89, 144, [2, 3, 5, 8, 13, 21, 34, 55, 89, 144])}


def check_fib(device="cpu", **args):
    for (trips, cond), (first, second, thirds) in FIB.items():
        ws = run(fib_loop(device, **args), device, **fib_feeds(trips, cond))
        assert host(ws, "first_a").tolist() == [first] and host(ws, "second_a").tolist() == [second]
        scan = host(ws, "thirds")
        if thirds:
            assert scan.dtype == np.float32 and scan.tolist() == thirds, scan
        else:   # no iteration: Caffe2's empty int32 scan output
            assert scan.dtype == np.int32 and scan.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scopes", sorted(SCOPES))
def test_fibonacci(device, scopes):
    check_fib(device, **SCOPES[scopes])


def test_the_body_runs_in_its_own_workspace_unless_scopes_are_disabled():
    for scopes, leaks in (("scopes", False), ("save_scopes", False), ("disable_scopes", True)):
        ws = run(fib_loop(**SCOPES[scopes]), **fib_feeds(4))
        assert ws.has("cond_new") == leaks and ws.has("third") == leaks, scopes
    ws = run(fib_loop(disable_scopes=1), **fib_feeds(4))
    assert ws.fetch("third").tolist() == [8.0] and ws.fetch("i").tolist() == [3]   # the last iteration's


def test_the_body_sees_none_of_the_outer_blobs():
    body = net("b", make_op("Add", ["x", "outer"], ["y"]), external_input=["i", "c", "x"],
               external_output=["c", "y"])
    loop = net("main", make_op("ONNXWhile", ["M", "c", "x"], ["x_out"], body=body, has_trip_count=1))
    with pytest.raises(NetError, match="source for input 'outer' is unknown"):
        run(loop, M=np.array(2, np.int64), c=np.array(True), x=np.ones(1, np.float32), outer=np.ones(1, np.float32))


# ------------------------------------------------------------------------------------------- scan outputs
def running_sum(device="cpu", **args):
    """for i in range(M): acc += step; scans: acc, 2 acc, i. The body passes its condition through."""
    mk = op_on(device)
    body = net("sum", mk("Add", ["acc", "step"], ["acc_new"]), mk("Scale", ["acc_new"], ["twice"], scale=2.0),
               external_input=["i", "cond", "acc", "step"],
               external_output=["cond", "acc_new", "step", "acc_new", "twice", "i"])
    return net("main", mk("ONNXWhile", ["M", "c", "acc0", "step"], ["acc", "step_out", "accs", "twices", "iters"],
                          body=body, has_trip_count=1, **args))


def check_running_sum(device="cpu", **args):
    feeds = {"M": np.array(3, np.int64), "c": np.array([False]), "acc0": np.array([[1.0, 2.0]], np.float32),
             "step": np.array([[0.5, -1.0]], np.float32)}
    ws = run(running_sum(device, **args), device, **feeds)
    assert host(ws, "acc").tolist() == [[2.5, -1.0]] and host(ws, "step_out").tolist() == [[0.5, -1.0]]
    assert host(ws, "accs").tolist() == [[1.5, 1.0], [2.0, 0.0], [2.5, -1.0]]
    assert host(ws, "twices").tolist() == [[3.0, 2.0], [4.0, 0.0], [5.0, -2.0]]
    iters = host(ws, "iters")
    assert iters.dtype == np.int64 and iters.tolist() == [0, 1, 2]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scopes", sorted(SCOPES))
def test_running_sum_with_scan_outputs(device, scopes):
    check_running_sum(device, **SCOPES[scopes])


def test_one_iteration_keeps_the_value_as_it_is():
    body = net("b", make_op("Copy", ["x"], ["y"]), external_input=["i", "c", "x"], external_output=["c", "x", "y"])
    loop = net("main", make_op("ONNXWhile", ["M", "c", "x"], ["x_out", "ys"], body=body, has_trip_count=1))
    ws = run(loop, M=np.array(1, np.int64), c=np.array(True), x=np.arange(6, dtype=np.float32).reshape(2, 3))
    assert ws.fetch("ys").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_dependencies_are_carried_together():
    """a, b = b, a each iteration (the outputs read before any is carried)."""
    body = net("swap", make_op("Copy", ["a"], ["a2"]), external_input=["i", "c", "a", "b"],
               external_output=["c", "b", "a2"])
    loop = net("main", make_op("ONNXWhile", ["M", "c", "a", "b"], ["a_out", "b_out"], body=body, has_trip_count=1))
    for trips, want in ((1, ([2], [1])), (2, ([1], [2])), (3, ([2], [1]))):
        ws = run(loop, M=np.array(trips, np.int64), c=np.array(True), a=np.array([1]), b=np.array([2]))
        assert (ws.fetch("a_out").tolist(), ws.fetch("b_out").tolist()) == want


def test_a_loop_in_a_loop():
    """total = 0; for i in range(3): for j in range(i + 1): total += 1 (the inner trip count made from i)."""
    inner = net("inner", make_op("Add", ["t", "one"], ["t2"]), external_input=["j", "c", "t", "one"],
                external_output=["c", "t2", "one"])
    outer = net("outer", make_op("ConstantFill", [], ["n1"], shape=[1], value=1, dtype=INT64),
                make_op("Add", ["i", "n1"], ["trips"]),
                make_op("ONNXWhile", ["trips", "c", "t", "one"], ["t_new", "one_out"], body=inner, has_trip_count=1),
                external_input=["i", "c", "t", "one"], external_output=["c", "t_new", "one"])
    loop = net("main", make_op("ONNXWhile", ["M", "c", "total0", "one"], ["total", "one_out"], body=outer,
                               has_trip_count=1))
    ws = run(loop, M=np.array(3, np.int64), c=np.array(True), total0=np.zeros(1, np.float32),
             one=np.ones(1, np.float32))
    assert ws.fetch("total").tolist() == [6.0]


# ------------------------------------------------------------------------------------------- refused
def fib_run(feeds=None, **args):
    return run(fib_loop(**args), **{**fib_feeds(5), **(feeds or {})})


@pytest.mark.parametrize("feeds, args, error, message", [
    ({"M": np.array(5, np.int32)}, {}, ArgumentError,
     r"the trip count 'M' must hold one element of type int64, got \(\) int32"),
    ({"M": np.array([5, 6], np.int64)}, {}, ArgumentError,
     r"the trip count 'M' must hold one element of type int64, got \(2,\) int64"),
    ({"c": np.array([1.0], np.float32)}, {}, ArgumentError,
     r"the condition 'c' must hold one element of type bool, int32 or int64, got \(1,\) float32"),
    ({}, {"save_scopes": 1, "disable_scopes": 1}, ArgumentError, "save_scopes and disable_scopes cannot both be set"),
    ({}, {"has_trip_count": 0, "has_cond": 0}, ArgumentError,
     "has_trip_count and has_cond are both 0, so nothing can end the loop"),
])
def test_bad_inputs_and_arguments(feeds, args, error, message):
    with pytest.raises(error, match=r"net 'main', op #0 \(ONNXWhile\): " + message) as info:
        fib_run(feeds, **args)
    assert "\n" not in str(info.value)


def _loop(body, outputs, **args):
    args = {"has_trip_count": 1, **args}
    return net("main", make_op("ONNXWhile", ["M", "c", "x"], outputs, body=body, **args))


LOOP_FEEDS = {"M": np.array(3, np.int64), "c": np.array(True), "x": np.ones((1, 2), np.float32)}


@pytest.mark.parametrize("ins, outs, op_outs, message", [
    (["i", "c"], ["c"], [], r"the body net has 2 external inputs; it needs 2 \+ N = 3"),
    (["i", "c", "x"], ["c"], [], r"the body net has 1 external outputs; it needs 1 \+ N \+ K"),
    (["i", "c", "x"], ["c", "x", "x"], ["a"], r"the op has 1 outputs; the body gives N \+ K = 2"),
])
def test_bodies_that_do_not_fit_the_op(ins, outs, op_outs, message):
    body = net("b", make_op("Copy", ["x"], ["y"]), external_input=ins, external_output=outs)
    with pytest.raises(ArgumentError, match=message):
        run(_loop(body, op_outs), **LOOP_FEEDS)


def test_a_missing_body_is_refused():
    with pytest.raises(ArgumentError, match="required argument 'body' is missing"):
        run(net("main", make_op("ONNXWhile", ["M", "c"], [])), M=np.array(1, np.int64), c=np.array(True))


@pytest.mark.parametrize("op_type, args, error, message", [
    ("Tile", {"tiles": 2, "axis": 1}, ShapeError, r"Size of scan output 'y' changed across iterations: \(1, 4\) in "
                                                  r"the first, \(1, 8\) in iteration 1"),
    ("Cast", {"to": 2}, DTypeError, "scan output 'x' changed its type across iterations: float32 in the first, "
                                   "int32 in iteration 1"),
    ("Transpose", {}, ShapeError, r"scan output 'y' has shape \(2, 1\); over more than one iteration"),
])
def test_scan_outputs_that_cannot_grow(op_type, args, error, message):
    """x doubles in width each iteration, its scan output too (Tile); x turns int32 after the first iteration, and
    is its scan output (Cast); the scan output is x transposed, (2, 1) (Transpose)."""
    outs = {"Tile": ["c", "y", "y"], "Cast": ["c", "y", "x"], "Transpose": ["c", "x", "y"]}[op_type]
    body = net("b", make_op(op_type, ["x"], ["y"], **args), external_input=["i", "c", "x"], external_output=outs)
    with pytest.raises(error, match=message):
        run(_loop(body, ["x_out", "ys"]), **LOOP_FEEDS)


def test_a_condition_the_body_passes_through_is_refused_without_a_trip_count():
    body = net("b", make_op("Copy", ["x"], ["y"]), external_input=["i", "c", "x"], external_output=["c", "y"])
    with pytest.raises(ArgumentError, match=r"the condition is true and the body passes it through unchanged \('c'\)"):
        run(_loop(body, ["x_out"], has_trip_count=0, has_cond=1), **LOOP_FEEDS)
    ws = run(_loop(body, ["x_out"], has_trip_count=0, has_cond=1), **dict(LOOP_FEEDS, c=np.array(False)))
    assert ws.fetch("x_out").tolist() == [[1.0, 1.0]]


def test_the_body_condition_must_be_a_flag():
    body = net("b", make_op("Copy", ["x"], ["y"]), external_input=["i", "c", "x"], external_output=["y", "y"])
    with pytest.raises(ArgumentError, match=r"the body's condition output 'y' must hold one element of type bool, "
                                            r"int32 or int64, got \(1, 2\) float32"):
        run(_loop(body, ["x_out"], has_cond=1), **LOOP_FEEDS)


def test_growing_scan_outputs_meet_the_blob_limit():
    """Rows of 8 bytes (two float32) under a 64-byte limit: the ninth row is refused, before the loop goes on."""
    ws = Workspace(limits=Limits(max_blob_bytes=64))
    feeds = {"M": np.array(10 ** 9, np.int64), "c": np.array([False]), "acc0": np.zeros((1, 2), np.float32),
             "step": np.ones((1, 2), np.float32)}
    for name, value in feeds.items():
        ws.feed(name, value)
    with pytest.raises(ResourceError, match=r"op #0 \(ONNXWhile\): blob 'acc_new' would be \(9, 2\) float32, 72 "
                                            "bytes, over the limit of 64 bytes per blob"):
        ws.run_net_once(running_sum())


def test_the_nesting_limit_holds_through_bodies():
    def nested(levels):
        top = nd = net("n0")
        for k in range(levels):
            nd.name = f"n{k}"
            nd.external_input.extend(["i", "c"] if k else [])
            nd.external_output.extend(["c"] if k else [])
            nd.op.extend([make_op("ConstantFill", [], ["M"], shape=[1], value=1, dtype=INT64)])
            loop = nd.op.add(type="ONNXWhile", input=["M", "c"])
            loop.arg.add(name="has_trip_count", i=1)
            nd = loop.arg.add(name="body").n
        nd.name = "leaf"
        nd.external_input.extend(["i", "c"])
        nd.external_output.extend(["c"])
        nd.op.extend([make_op("Not", ["c"], ["d"])])
        return top
    run(nested(33), c=np.array(True))   # the leaf body at level 99
    with pytest.raises(NetError, match="messages are nested more than 100 levels deep"):
        run(nested(34), c=np.array(True))


def test_no_gradient_is_registered():
    with pytest.raises(GradientError, match="has no gradient registered"):
        backward_ops(fib_loop().op, {"second_a": "second_a_grad"})


# ------------------------------------------------------------------------------------------- broken kernel
_KERNEL = REGISTRY.get("ONNXWhile").kernel


def _one_iteration_short(ctx, xp, trips, *rest, **args):
    return _KERNEL(ctx, xp, np.maximum(trips - 1, 0), *rest, **args)


@pytest.mark.parametrize("check", [check_fib, check_running_sum])
def test_each_check_catches_a_broken_kernel(check, broken):
    check()
    broken("ONNXWhile", _one_iteration_short)
    with pytest.raises(AssertionError):
        check()

